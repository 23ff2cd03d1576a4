/**
 * The Euler time grid of sampling (issue 32 item 1): LeRobot evaluates the velocity at
 * t_k = float32(1 + k * dt) with dt = -1 / num_steps summed in float64 (Python floats), so 10
 * steps see exactly float32(1), float32(0.9), ..., float32(0.1); openpi accumulates t += dt in
 * float32 (1, 0.9, 0.79999995, 0.69999993, ...), which the time embedding's 0.004 period turns
 * into ~1e-4 of velocity. The values below are Python's `float(np.float32(1.0 + k * (-1 / n)))`.
 */
import * as tf from '@tensorflow/tfjs';
import { describe, expect, it } from 'vitest';
import { eulerSample } from '../kernels/flow.ts';

function timesOf(numSteps: number): number[] {
  const seen: number[] = [];
  const x = eulerSample(tf.zeros([2, 3, 4]), numSteps, (xx, time) => {
    expect(Array.from(time)).toEqual([time[0], time[0]]); // one time per datum, all equal
    seen.push(time[0]!);
    return tf.onesLike(xx);
  });
  // x = sum of numSteps steps of dt * 1 in float32: -1 within numSteps float32 roundings.
  const out = x.dataSync();
  x.dispose();
  for (const v of out) expect(Math.abs(v + 1)).toBeLessThanOrEqual(numSteps * 2 ** -24 * 2);
  return seen;
}

describe('Euler sampling grid', () => {
  it("10 steps evaluate at LeRobot's float32(1 + k dt), not a float32 running sum", () => {
    const expected = [1, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1].map(Math.fround);
    // (1 + 3 * -0.1 is 0.7000000000000001 in float64; its float32 is float32(0.7).)
    expect(timesOf(10)).toEqual(expected);
    // openpi's running float32 sum would have reached 0.69999993 at k = 3.
    let t = 1;
    for (let k = 0; k < 3; k++) t = Math.fround(t + Math.fround(-0.1));
    expect(t).not.toBe(expected[3]);
  });

  it('takes exactly num_steps steps for step counts whose float32 sum drifts', () => {
    for (const n of [1, 3, 7, 10, 30, 100]) {
      const got = timesOf(n);
      expect(got).toHaveLength(n);
      expect(got).toEqual(Array.from({ length: n }, (_, k) => Math.fround(1 + k * (-1 / n))));
    }
  });
});
