import * as tf from '@tensorflow/tfjs';
import { expect, it } from 'vitest';
import { initBackend, backendReport } from '../kernels/backend.ts';
import { makeConfig } from '../kernels/config.ts';
import { fakeBatch, makeBatch } from '../kernels/batch.ts';
import { BaseWeights, TrainingState } from '../kernels/trainer.ts';
import { drawNoiseTime } from '../kernels/flow.ts';
import { Rng } from '../kernels/rng.ts';

it('selects a backend once, reports every fallback with its reason, and logs one line', async () => {
  const lines: string[] = [];
  const report = await initBackend('auto', (l) => lines.push(l));
  const order = ['node-gpu', 'node', 'wasm', 'cpu'];
  expect(report.fallbacks.map((f) => f.backend)).toEqual(order.slice(0, order.indexOf(report.kind)));
  for (const f of report.fallbacks) expect(f.reason.length).toBeGreaterThan(0);
  expect(tf.getBackend()).toBe(report.name);
  expect(lines).toHaveLength(1);
  expect(lines[0]).toContain(`backend ${report.kind}`);
  if (report.fallbacks.length) expect(lines[0]).toContain('fell back from node-gpu');
  expect(await initBackend('cpu', (l) => lines.push(l))).toBe(report); // one choice per process
  expect(lines).toHaveLength(1);
  expect(backendReport()).toBe(report);
  await expect(initBackend('tpu')).rejects.toThrow("VELA_BACKEND is 'tpu'; expected one of auto, node-gpu, node, wasm, cpu");
});

it('skips an image slot that is empty in every datum without changing the outputs (D13)', async () => {
  await initBackend('wasm', null);
  const c = makeConfig('pi0-tiny', { imageSize: 32, width: 32, depth: 2, heads: 2, headDim: 16, mlpDim: 64, maxTokenLen: 8, stateDim: 4, actionDim: 3, horizon: 3 });
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
