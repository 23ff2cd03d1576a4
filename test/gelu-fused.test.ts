/**
 * kernels/backend/gelu-fused.ts: the SIMD loop (wasm), the JavaScript loop (cpu backend, and the wasm
 * path's last n % 4 elements) and the TF.js ops agree bit for bit, since they do the same float32
 * operations in the same order; the gradient agrees with the float64 derivative of GELU (tanh)
 * and with finite differences of geluTanh; nothing leaks.
 */
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { initBackend } from '../kernels/backend/backend.ts';
import { geluArgument, geluArgumentOps, geluGradient, geluGradientOps } from '../kernels/backend/gelu-fused.ts';
import { geluTanh } from '../kernels/layers.ts';

beforeAll(async () => {
  await initBackend('wasm', () => {});
});
afterAll(async () => {
  await tf.setBackend('wasm');
});

/** n values in [-6, 6] from a fixed LCG, with exact zeros and a few large magnitudes. */
function xs(n: number, seed: number): Float32Array {
  let s = seed;
  return Float32Array.from({ length: n }, (_, i) => {
    s = (s * 1103515245 + 12345) % 2 ** 31;
    if (i % 97 === 0) return 0;
    if (i % 89 === 0) return 30 * Math.sign(s / 2 ** 31 - 0.5);
    return Math.fround((s / 2 ** 31) * 12 - 6);
  });
}

const bits = (t: tf.Tensor) => Buffer.from((t.dataSync() as Float32Array).slice().buffer);

/** Argument and gradient on the active backend, next to the TF.js ops on the same tensors. */
function both(n: number) {
  return tf.tidy(() => {
    const x = tf.tensor1d(xs(n, 7));
    const dy = tf.tensor1d(xs(n, 11));
    // s from the same bytes on both backends (their Sigmoid kernels differ in the last bits).
    const s = tf.tensor1d(Float32Array.from(xs(n, 7), (v) => 1 / (1 + Math.exp(-1.5957691 * (v + 0.044715 * v ** 3)))));
    return {
      z: bits(geluArgument(x)), zOps: bits(geluArgumentOps(x)),
      g: bits(geluGradient(dy, x, s)), gOps: bits(geluGradientOps(dy, x, s)),
    };
  });
}

describe('fused GELU', () => {
  for (const n of [4099, 4096, 3]) {
    it(`wasm SIMD + tail, cpu loop and TF.js ops agree bit for bit (${n} elements)`, async () => {
      await tf.setBackend('wasm');
      const wasm = both(n);
      expect(wasm.z).toEqual(wasm.zOps);
      expect(wasm.g).toEqual(wasm.gOps);
      await tf.setBackend('cpu');
      const cpu = both(n);
      expect(cpu.z).toEqual(wasm.z);
      expect(cpu.g).toEqual(wasm.g);
      await tf.setBackend('wasm');
    });
  }

  it('the gradient is the float64 derivative of GELU (tanh), and finite differences of geluTanh', async () => {
    await tf.setBackend('wasm');
    const x64 = [-5, -2.5, -1, -0.3, 0, 0.1, 0.7, 1.5, 3, 5.5];
    const gelu64 = (x: number) => 0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x ** 3)));
    const before = tf.memory().numTensors;
    const got = tf.tidy(() => tf.grad((t: tf.Tensor) => tf.sum(geluTanh(t)))(tf.tensor1d(x64)).dataSync());
    expect(tf.memory().numTensors).toBe(before);
    x64.forEach((x, i) => {
      const h = 1e-6;
      const fd = (gelu64(x + h) - gelu64(x - h)) / (2 * h); // float64 finite difference of the textbook formula
      expect(Math.abs(got[i]! - fd)).toBeLessThan(2e-6 * Math.max(1, Math.abs(fd)));
    });
    // Finite differences of geluTanh itself (float32): central, h = 1e-2, loose for float32.
    const f32 = (v: number) => tf.tidy(() => geluTanh(tf.tensor1d([v])).dataSync()[0]!);
    x64.forEach((x, i) => expect(Math.abs(got[i]! - (f32(x + 1e-2) - f32(x - 1e-2)) / 2e-2)).toBeLessThan(2e-3));
  });

  it('refuses operands of other dtypes or sizes', () => {
    const x = tf.tensor1d([1, 2, 3]);
    const i = tf.tensor1d([1, 2, 3], 'int32');
    const short = tf.tensor1d([1, 2]);
    expect(() => geluArgument(i)).toThrow(/float32 of one size; got int32\[3\]/);
    expect(() => geluGradient(x, x, short)).toThrow(/float32\[3\], float32\[3\], float32\[2\]/);
    tf.dispose([x, i, short]);
  });
});
