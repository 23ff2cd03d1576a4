import * as tf from '@tensorflow/tfjs';
import { createRequire } from 'node:module';
import { expect, it } from 'vitest';
import { initBackend, backendReport } from '../kernels/backend/backend.ts';
import { visibleGpus } from '../kernels/backend/native.ts';
import { useBackend, TEST_BACKENDS } from './helpers/tf.ts';
import { makeConfig } from '../kernels/small/config.ts';
import { fakeBatch, makeBatch } from '../kernels/small/batch.ts';
import { BaseWeights, TrainingState } from '../kernels/trainer.ts';
import { drawNoiseTime } from '../kernels/flow.ts';
import { Rng } from '../kernels/rng.ts';

it('selects a backend once, reports every faster one not used with its reason, and logs one calm line', async () => {
  const lines: string[] = [];
  const report = await initBackend('auto', (l) => lines.push(l));
  const order = ['node-gpu', 'node', 'wasm', 'cpu'];
  expect(report.fallbacks.map((f) => f.backend)).toEqual(order.slice(0, order.indexOf(report.kind)));
  for (const f of report.fallbacks) expect(f.reason.length).toBeGreaterThan(0);
  expect(tf.getBackend()).toBe(report.name);
  expect(lines).toEqual([`vela kernels: ${report.line}`]);
  expect(report.line).toMatch(new RegExp(`^backend ${report.name}( \\(tfjs-node(-gpu)?\\))? on \\w`));
  for (const f of report.fallbacks) expect(report.line).toContain(`${f.backend} (${f.reason})`);
  expect(report.line).not.toMatch(/Cannot find|fell back|Error/);
  if (report.kind === 'node') {
    // Where the native runtime is set up it is the default; no GPU here, so node-gpu says why.
    expect(report.device).toMatch(/^CPU, libtensorflow \d+\.\d+\.\d+, threads \d+ intra-op, \d+ inter-op, graphs (on|off \(VELA_GRAPHS=\w+\))$/);
    if (visibleGpus().length === 0) expect(report.fallbacks).toEqual([{ backend: 'node-gpu', reason: 'no NVIDIA GPU is visible' }]);
  }
  // CI sets the native runtime up with `npm ci`: a silent fall back to wasm there is a failure.
  if (process.env.CI === 'true') expect(report.name).toBe('tensorflow');
  expect(await initBackend('cpu', (l) => lines.push(l))).toBe(report); // one choice per process
  expect(lines).toHaveLength(1);
  expect(backendReport()).toBe(report);
  await expect(initBackend('tpu')).rejects.toThrow("VELA_BACKEND is 'tpu'; expected one of auto, node-gpu, node, wasm, cpu");
});

it.each(TEST_BACKENDS)('skips an image slot that is empty in every datum without changing the outputs (D13) [%s]', async (kind) => {
  await useBackend(kind);
  const c = makeConfig('flow0-tiny', { imageSize: 32, width: 32, depth: 2, heads: 2, headDim: 16, mlpDim: 64, maxTokenLen: 8, stateDim: 4, actionDim: 3, horizon: 3 });
  const src = fakeBatch(c, 3, 2);
  const frame = (i: number, k: number) => src.images.slice((i * 3 + k) * 32 * 32 * 3, (i * 3 + k + 1) * 32 * 32 * 3);
  const datum = (i: number, slot2: boolean) => ({
    images: [frame(i, 0), null, slot2 ? frame(i, 2) : null],
    state: src.state.slice(i * 4, i * 4 + 4),
    prompt: `task ${i}`,
    actions: { data: src.actions.slice(i * 9, i * 9 + 9), horizon: 3, dim: 3 },
  });
  const skipped = makeBatch(c, [datum(0, false), datum(1, false)]); // slots 1 and 2 empty everywhere
  const computed = makeBatch(c, [datum(0, false), datum(1, false), datum(2, true)]); // slot 2 computed, masked for 0 and 1
  const base = BaseWeights.create(c, 1);
  const s = new TrainingState(base, { finetune: 'full' });
  const { noise, time } = drawNoiseTime(new Rng(4), 3, 3, 3);
  const a = s.forward(skipped, { noise: noise.slice(0, 18), time: time.slice(0, 2) }).velocity;
  const b = s.forward(computed, { noise, time }).velocity;
  for (let i = 0; i < 18; i++) expect(Math.abs(a[i]! - b[i]!)).toBeLessThan(1e-5);
  s.dispose();
  base.dispose();
});

it('the fast wasm Slice/SplitV/Unpack kernels cut exactly the stock pieces', async () => {
  await useBackend('wasm'); // wasm's own kernels (kernels/backend/wasm-fast.ts)
  const shape = [3, 4, 5, 6];
  const data = Float32Array.from({ length: 360 }, (_, i) => i);
  const x = tf.tensor(data, shape);
  const at = (i: number, j: number, k: number, l: number) => ((i * 4 + j) * 5 + k) * 6 + l;
  const expectSlice = (begin: number[], size: number[]) => {
    const got = tf.slice(x, begin, size);
    const want: number[] = [];
    for (let i = 0; i < size[0]!; i++) for (let j = 0; j < size[1]!; j++) for (let k = 0; k < size[2]!; k++) for (let l = 0; l < size[3]!; l++) {
      want.push(at(begin[0]! + i, begin[1]! + j, begin[2]! + k, begin[3]! + l));
    }
    expect([...got.dataSync()]).toEqual(want);
    expect(got.shape).toEqual(size);
    got.dispose();
  };
  expectSlice([1, 0, 0, 0], [2, 4, 5, 6]); // contiguous
  expectSlice([0, 1, 2, 3], [3, 2, 3, 3]); // strided on every axis
  expectSlice([2, 3, 4, 5], [1, 1, 1, 1]);
  expectSlice([0, 0, 1, 0], [3, 4, 2, 6]);
  const parts = tf.split(x, [1, 3, 2], 3);
  expect(parts.map((p) => p.shape)).toEqual([[3, 4, 5, 1], [3, 4, 5, 3], [3, 4, 5, 2]]);
  expect(parts[1]!.dataSync()[0]).toBe(1);
  expect(parts[2]!.dataSync()[1]).toBe(5);
  const rows = tf.unstack(x, 1);
  expect(rows).toHaveLength(4);
  expect(rows[2]!.shape).toEqual([3, 5, 6]);
  expect(rows[2]!.dataSync()[31]).toBe(at(1, 2, 0, 1));
  tf.dispose([x, ...parts, ...rows]);
});

it.each(TEST_BACKENDS)('GELU (sigmoid form) and RMSNorm match their textbook formulas [%s]', async (kind) => {
  await useBackend(kind);
  const { geluTanh, rmsNorm } = await import('../kernels/layers.ts');
  const xs = [-4, -1.5, -0.3, 0, 0.2, 1, 2.5, 6];
  const g = geluTanh(tf.tensor1d(xs));
  const want = xs.map((x) => 0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x ** 3))));
  [...g.dataSync()].forEach((v, i) => expect(v).toBeCloseTo(want[i]!, 6));
  const r = rmsNorm(tf.tensor2d([[1, 2, 3, 4]]), tf.tensor1d([1, 0.5, 2, 1]));
  const rms = Math.sqrt((1 + 4 + 9 + 16) / 4 + 1e-6);
  [...r.dataSync()].forEach((v, i) => expect(v).toBeCloseTo(([1, 2, 3, 4][i]! / rms) * [1, 0.5, 2, 1][i]!, 6));
  tf.dispose([g, r]);
});

it.each(TEST_BACKENDS)('a reshape to the same shape and a cast to the same dtype share data and free it with the last holder; other reshapes and casts compute [%s]', async (kind) => {
  await useBackend(kind);
  const before = tf.memory();
  const x = tf.tensor([1.5, -2, 3.25, 4, 5, 6], [2, 3]);
  const same = tf.reshape(x, [2, 3]);
  const implicit = tf.reshape(x, [-1, 3]);
  const cast = tf.cast(x, 'float32');
  const other = tf.reshape(x, [3, 2]);
  const toInt = tf.cast(x, 'int32');
  x.dispose(); // the shared data stays while a holder is left
  expect(Array.from(same.dataSync())).toEqual([1.5, -2, 3.25, 4, 5, 6]);
  expect(implicit.shape).toEqual([2, 3]);
  expect(Array.from(cast.dataSync())).toEqual([1.5, -2, 3.25, 4, 5, 6]);
  expect(other.shape).toEqual([3, 2]);
  expect(Array.from(other.dataSync())).toEqual([1.5, -2, 3.25, 4, 5, 6]);
  expect(Array.from(toInt.dataSync())).toEqual([1, -2, 3, 4, 5, 6]);
  // A shape seen before (tfjs-node keeps one shape tensor per shape) on other data and dtypes.
  const flat = tf.tensor([6, 5, 4, 3, 2, 1], [6]);
  const int2d = tf.tensor([1, 2, 3, 4, 5, 6], [2, 3], 'int32');
  const again = tf.reshape(flat, [3, 2]);
  const ints = tf.reshape(int2d, [3, 2]);
  expect(again.arraySync()).toEqual([[6, 5], [4, 3], [2, 1]]);
  expect(ints.dtype).toBe('int32');
  expect(ints.arraySync()).toEqual([[1, 2], [3, 4], [5, 6]]);
  tf.dispose([same, implicit, cast, other, toInt, again, ints, flat, int2d]);
  if (kind === 'node') {
    // tfjs-node labels its decoders' uint8 output 'int32' and ends them with a cast to int32,
    // which must still run: the handle's own dtype decides, not the label.
    const tfn = createRequire(import.meta.url)('@tensorflow/tfjs-node') as { node: { encodePng(t: tf.Tensor3D): Promise<Uint8Array>; decodePng(b: Uint8Array, c: number): tf.Tensor3D } };
    const pixels = tf.tensor3d([250, 251, 252, 253, 254, 255], [1, 2, 3], 'int32');
    const img = tfn.node.decodePng(await tfn.node.encodePng(pixels), 3);
    expect(Array.from(img.dataSync())).toEqual([250, 251, 252, 253, 254, 255]);
    tf.dispose([pixels, img]);
  }
  expect(tf.memory().numTensors).toBe(before.numTensors);
  expect(tf.memory().numDataBuffers).toBe(before.numDataBuffers);
  // TF.js's Add gradient reshapes to each input's shape: with a broadcast bias as with a plain add.
  const g = tf.grads((a: tf.Tensor, b: tf.Tensor) => tf.sum(tf.mul(tf.add(a, b), tf.add(a, b))));
  const [da, db] = g([tf.tensor([[1, 2], [3, 4]]), tf.tensor([0.5, -1])]);
  expect(Array.from(da!.dataSync())).toEqual([3, 2, 7, 6]);
  expect(Array.from(db!.dataSync())).toEqual([10, 8]);
  expect(db!.shape).toEqual([2]);
});
