/**
 * kernels/backend/rms-fused.ts: RMSNorm forward and backward as row passes. The wasm SIMD loop and the
 * JavaScript loop (cpu backend) agree bit for bit, with and without a weight; both agree with the
 * TF.js ops to float32 precision; bad operands are refused; nothing leaks.
 */
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { initBackend } from '../kernels/backend/backend.ts';
import { rmsBackward, rmsForward } from '../kernels/backend/rms-fused.ts';

beforeAll(async () => {
  await initBackend('wasm', () => {});
});
afterAll(async () => {
  await tf.setBackend('wasm');
});

function values(n: number, seed: number, scale: number): Float32Array {
  let s = seed;
  return Float32Array.from({ length: n }, () => Math.fround((((s = (s * 1103515245 + 12345) % 2 ** 31) / 2 ** 31) * 2 - 1) * scale));
}

/** Forward and backward outputs on the active backend: fused, and the TF.js ops' reference. */
function run(shape: number[], weighted: boolean) {
  const w = shape[shape.length - 1]!;
  const n = shape.reduce((a, b) => a * b, 1);
  return tf.tidy(() => {
    const x = tf.tensor(values(n, 3, 2), shape);
    const dy = tf.tensor(values(n, 5, 1), shape);
    const wt = weighted ? tf.tensor1d(values(w, 7, 1.5)) : null;
    const { y, r } = rmsForward(x, wt);
    const { dx, dw } = rmsBackward(dy, x, r, wt);
    const ref = (() => {
      const rr = tf.rsqrt(tf.add(tf.mean(tf.square(x), -1, true), 1e-6));
      const g = wt ? tf.mul(dy, wt) : dy;
      const k = tf.mul(tf.pow(rr, 3), tf.mean(tf.mul(g, x), -1, true));
      return {
        y: tf.mul(tf.mul(x, rr), wt ?? 1), dx: tf.sub(tf.mul(g, rr), tf.mul(x, k)),
        dw: wt ? tf.sum(tf.reshape(tf.mul(dy, tf.mul(x, rr)), [-1, w]), 0) : null,
      };
    })();
    const get = (t: tf.Tensor | null) => (t ? (t.dataSync() as Float32Array).slice() : new Float32Array(0));
    return { y: get(y), r: get(r), dx: get(dx), dw: get(dw), ref: { y: get(ref.y), dx: get(ref.dx), dw: get(ref.dw) } };
  });
}

function close(got: Float32Array, want: Float32Array, scale: number): void {
  expect(got.length).toBe(want.length);
  let worst = 0;
  for (let i = 0; i < got.length; i++) worst = Math.max(worst, Math.abs(got[i]! - want[i]!));
  expect(worst).toBeLessThan(3e-6 * scale);
}

describe('fused RMSNorm', () => {
  for (const [shape, weighted] of [[[8, 29, 128], true], [[8, 29, 128], false], [[5, 12], true], [[3, 4, 6], true], [[3, 6], false]] as [number[], boolean][]) {
    it(`wasm and cpu agree bit for bit; the ops agree to float32 ([${shape}], ${weighted ? 'weight' : 'no weight'})`, async () => {
      await tf.setBackend('wasm');
      const before = tf.memory().numTensors;
      const a = run(shape, weighted);
      expect(tf.memory().numTensors).toBe(before);
      await tf.setBackend('cpu');
      const b = run(shape, weighted);
      await tf.setBackend('wasm');
      for (const k of ['y', 'r', 'dx', 'dw'] as const) expect(Buffer.from(a[k].buffer)).toEqual(Buffer.from(b[k].buffer));
      close(a.y, a.ref.y, 4);
      close(a.dx, a.ref.dx, 8);
      close(a.dw, a.ref.dw, 8 * shape.slice(0, -1).reduce((x, y) => x * y, 1));
    });
  }

  it('refuses a weight of the wrong size and operands of other sizes', () => {
    tf.tidy(() => {
      const x = tf.zeros([2, 8]);
      expect(() => rmsForward(x, tf.zeros([4]))).toThrow(/weight is float32\[4\]; expected float32 \[8\]/);
      expect(() => rmsBackward(tf.zeros([2, 4]), x, tf.zeros([2, 1]), null)).toThrow(/float32 of x's size/);
      expect(() => rmsBackward(x, x, tf.zeros([3, 1]), null)).toThrow(/r has 3 rows; x \[2,8\] has 2/);
    });
  });
});
