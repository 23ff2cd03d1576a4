/**
 * kernels/backend/softmax-grad.ts: ds = p (dp - rowsum(dp p)). The wasm SIMD loop and the JavaScript
 * loop (cpu backend) agree bit for bit; both agree with the TF.js ops to float32 precision and
 * with a float64 reference; bad operands are refused.
 */
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { initBackend } from '../kernels/backend/backend.ts';
import { softmaxGrad, softmaxGradOps } from '../kernels/backend/softmax-grad.ts';

beforeAll(async () => {
  await initBackend('wasm', () => {});
});
afterAll(async () => {
  await tf.setBackend('wasm');
});

/** Rows of softmax probabilities and upstream gradients, [n, tq, tk], from a fixed LCG. */
function inputs(shape: [number, number, number]) {
  const [n, tq, tk] = shape;
  let s = 12345;
  const rnd = () => ((s = (s * 1103515245 + 12345) % 2 ** 31) / 2 ** 31) * 2 - 1;
  const p = new Float32Array(n * tq * tk);
  const dp = Float32Array.from({ length: p.length }, () => Math.fround(rnd() * 3));
  for (let o = 0; o < p.length; o += tk) {
    const e = Array.from({ length: tk }, () => Math.exp(rnd() * 4));
    const z = e.reduce((a, b) => a + b, 0);
    for (let j = 0; j < tk; j++) p[o + j] = Math.fround(e[j]! / z);
  }
  return { p, dp };
}

describe('softmaxGrad', () => {
  for (const shape of [[4, 5, 116], [3, 2, 132], [2, 3, 7]] as [number, number, number][]) {
    it(`wasm and cpu agree bit for bit, and match the ops and float64 ([${shape}])`, async () => {
      const { p, dp } = inputs(shape);
      const run = () => tf.tidy(() => {
        const [a, b] = [tf.tensor3d(dp, shape), tf.tensor3d(p, shape)];
        return { fused: softmaxGrad(a, b).dataSync().slice() as Float32Array, ops: softmaxGradOps(a, b).dataSync().slice() as Float32Array };
      });
      await tf.setBackend('wasm');
      const before = tf.memory().numTensors;
      const wasm = run();
      expect(tf.memory().numTensors).toBe(before);
      await tf.setBackend('cpu');
      const cpu = run();
      await tf.setBackend('wasm');
      expect(Buffer.from(wasm.fused.buffer)).toEqual(Buffer.from(cpu.fused.buffer));
      const tk = shape[2];
      for (let o = 0; o < p.length; o += tk) {
        let dot = 0;
        for (let j = 0; j < tk; j++) dot += dp[o + j]! * p[o + j]!;
        for (let j = 0; j < tk; j++) {
          const want = p[o + j]! * (dp[o + j]! - dot);
          const tol = 1e-6 * (Math.abs(p[o + j]!) * (Math.abs(dp[o + j]!) + Math.abs(dot)) + 1e-30);
          expect(Math.abs(wasm.fused[o + j]! - want)).toBeLessThanOrEqual(2 * tol);
          expect(Math.abs(wasm.fused[o + j]! - wasm.ops[o + j]!)).toBeLessThanOrEqual(2 * tol);
        }
      }
    });
  }

  it('refuses operands of other shapes or dtypes', () => {
    const a = tf.zeros([2, 4]);
    const b = tf.zeros([2, 8]);
    const c = tf.zeros([2, 4], 'int32');
    expect(() => softmaxGrad(a, b)).toThrow(/float32\[2,4\] and float32\[2,8\]/);
    expect(() => softmaxGrad(a, c)).toThrow(/float32\[2,4\] and int32\[2,4\]/);
    tf.dispose([a, b, c]);
  });
});
