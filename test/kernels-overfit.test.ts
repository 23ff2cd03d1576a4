/**
 * Overfits one small real batch: 8 frames of episode 0 of the shipped G1 sample (AV1 video decoded
 * by server/datasets, 96x96 with padding, z-scored state/actions, flow0-tiny with depth 2 and
 * width 64 to keep the test fast). Noise and time are one fixed draw, so the objective is a
 * fixed regression problem and its loss can fall to ~0; with fresh noise every step the flow-
 * matching loss keeps an irreducible part and falls far more slowly.
 */
import { expect, it } from 'vitest';
import { forEachBackend } from './helpers/tf.ts';
import { openDataset, makeDatum } from '../server/datasets/index.ts';
import { computeNormStats, zscore } from '../kernels/normalize.ts';
import { makeConfig } from '../kernels/small/config.ts';
import { makeBatch } from '../kernels/small/batch.ts';
import { BaseWeights, TrainingState } from '../kernels/trainer.ts';
import { drawNoiseTime } from '../kernels/flow.ts';
import { Rng } from '../kernels/rng.ts';
import { G1_DIR as DATASET } from '../bench/harness/g1.ts';


forEachBackend('kernels: overfit', () => {
  it('overfitting 8 real frames drives the loss down at least 10x within 80 steps', async () => {
    const ds = await openDataset(DATASET);
    const H = 16;
    const datums = [];
    for (let i = 0; i < 8; i++) datums.push(await makeDatum(ds, 0, i * 30, { horizon: H, imageSize: 96, actionSpace: 'absolute' }));
    const sd = ds.meta.stateDim;
    const ad = ds.meta.actionDim;
    const sStats = computeNormStats({ data: Float32Array.from(datums.flatMap((d) => [...d.state])), dim: sd });
    const aStats = computeNormStats({ data: Float32Array.from(datums.flatMap((d) => [...d.actions])), dim: ad });
    const cfg = makeConfig('flow0-tiny', { depth: 2, width: 64, heads: 2, headDim: 32, mlpDim: 256 });
    const batch = makeBatch(
      cfg,
      datums.map((d) => ({
        images: Object.values(d.images).slice(0, cfg.slots).map((f) => f.data),
        state: zscore(d.state, sd, sStats),
        prompt: d.prompt,
        actions: { data: zscore(d.actions, ad, aStats), horizon: H, dim: ad },
      })),
    );
    expect(batch.imageMask[0]).toBe(1);
    const base = BaseWeights.create(cfg, 0);
    const state = new TrainingState(base, { finetune: 'full', seed: 0 });
    const draw = drawNoiseTime(new Rng(123), 8, cfg.horizon, cfg.actionDim);
    const first = state.forwardBackward(batch, draw).loss;
    state.optimStep({ learningRate: 3e-3 });
    let last = first;
    let steps = 1;
    while (steps < 80 && last > first / 10) {
      last = state.forwardBackward(batch, draw).loss;
      state.optimStep({ learningRate: 3e-3 });
      steps++;
    }
    expect(first).toBeGreaterThan(0.5);
    expect(last, `loss ${first} -> ${last} after ${steps} steps`).toBeLessThanOrEqual(first / 10);
    state.dispose();
    base.dispose();
  });
});
