/**
 * kernels/backend/wasm-fast.ts's replacement kernels against plain references on the wasm backend:
 * Pack (tf.stack) on every axis equals concat of expanded inputs, Identity (tf.clone) shares
 * data safely (the clone outlives its source, a variable's assign leaves earlier clones alone),
 * and neither leaks tensors.
 */
import * as tf from '@tensorflow/tfjs';
import { beforeAll, describe, expect, it } from 'vitest';
import { initBackend } from '../kernels/backend/backend.ts';

beforeAll(async () => {
  await initBackend('wasm', () => {});
});

describe('fast wasm kernels', () => {
  it('stack equals concat of expanded inputs on every axis, for float32 and int32', () => {
    expect(tf.getBackend()).toBe('wasm');
    const before = tf.memory().numTensors;
    tf.tidy(() => {
      const xs = [0, 1, 2].map((k) => tf.tensor3d(Array.from({ length: 24 }, (_, i) => i * 10 + k), [2, 3, 4]));
      for (let axis = 0; axis <= 3; axis++) {
        const got = tf.stack(xs, axis);
        const want = tf.concat(xs.map((x) => tf.expandDims(x, axis)), axis);
        expect(got.shape).toEqual(want.shape);
        expect(Array.from(got.dataSync())).toEqual(Array.from(want.dataSync()));
      }
      const ints = [tf.tensor1d([1, 2], 'int32'), tf.tensor1d([3, 4], 'int32')];
      const s = tf.stack(ints, 1);
      expect(s.dtype).toBe('int32');
      expect(Array.from(s.dataSync())).toEqual([1, 3, 2, 4]);
      expect(() => tf.stack([tf.zeros([2]), tf.zeros([3])])).toThrow();
    });
    expect(tf.memory().numTensors).toBe(before);
  });

  it('clone shares data safely: outlives its source and survives a variable assign', () => {
    const before = tf.memory().numTensors;
    const a = tf.tensor1d([1, 2, 3]);
    const c = tf.clone(a);
    a.dispose();
    expect(Array.from(c.dataSync())).toEqual([1, 2, 3]);
    const init = tf.tensor1d([5, 6]);
    const v = tf.variable(init);
    init.dispose();
    const snap = tf.clone(v);
    const next = tf.tensor1d([7, 8]);
    v.assign(next);
    next.dispose();
    expect(Array.from(snap.dataSync())).toEqual([5, 6]);
    expect(Array.from(v.dataSync())).toEqual([7, 8]);
    tf.dispose([c, v, snap]);
    expect(tf.memory().numTensors).toBe(before);
  });
});
