/**
 * Re-scores saved fine-tune weights on split A's held-out G1 frames with other sampling settings
 * (the scorer of the job, in-process on the wasm backend): how much of a recipe's score is the
 * sampler's? Prints one JSON line per setting.
 *
 *   npx tsx bench/rescore.ts /tmp/vela-recipe-X/weights/final --noise-scale 1,0.5,0 --seeds 0,1
 *
 * --noise-scale s: the initial noise of the 10 Euler steps is s * N(0, 1) (1 is the trained
 * sampler; 0 starts every chunk from the noise distribution's mean). --seeds: average the ratio
 * over several noise seeds (the job's evaluation uses one). --average K: score the mean of K
 * sampled chunks (a diagnostic of how much error the sampler's spread adds). --score-space
 * pi0|pi05: score in that family's normalised space (pi0: z-score, pi0.5: quantile).
 */
import path from 'node:path';
import { parseArgs } from 'node:util';
import { initBackend } from '../kernels/backend/backend.ts';
import { loadCheckpoint } from '../kernels/checkpoint.ts';
import { makeConfig } from '../kernels/small/config.ts';
import { normalizerFor } from '../kernels/normalize.ts';
import { Rng } from '../kernels/rng.ts';
import { BaseWeights, TrainingState } from '../kernels/trainer.ts';
import { toExported } from '../server/engine/tenants.ts';
import { openDataset } from '../server/datasets/index.ts';
import { toBatch } from '../server/jobs/datums.ts';
import { buildEvalSet, EVAL_SAMPLE_STEPS, scorePredictions } from '../server/jobs/evaluate.ts';
import { scoringContext, trainingStats } from '../server/jobs/train.ts';
import { G1, HELD_OUT } from './recipe-split.ts';

const { values, positionals } = parseArgs({ allowPositionals: true, options: {
  'noise-scale': { type: 'string', default: '1' }, seeds: { type: 'string', default: '0' }, steps: { type: 'string', default: String(EVAL_SAMPLE_STEPS) },
  average: { type: 'string', default: '1' },
  'score-space': { type: 'string' },
} });
const average = Number(values.average);
const dir = path.resolve(positionals[0] ?? '');
await initBackend((process.env.VELA_BACKEND as 'node' | 'wasm') ?? 'wasm', null);
const ck = await loadCheckpoint(dir);
const c = ck.config as Record<string, any>;
const model = makeConfig(c.preset);
const ds = await openDataset(G1);
const train = [...ds.episodeIndices].filter((e) => !HELD_OUT.includes(e));
const { norm, absStats } = trainingStats(ds, train, c.action_space, model.horizon);
const set = await buildEvalSet(ds, HELD_OUT, 4, { horizon: model.horizon, cameras: c.cameras, imageSize: model.imageSize, actionSpace: c.action_space });
const state = new TrainingState(BaseWeights.create(model, c.base_seed ?? 0), { finetune: c.finetune, rank: c.lora_rank, alpha: c.lora_alpha, targets: c.lora_targets });
state.importWeights(toExported(ck));
const normalizer = normalizerFor(c.preset);
// --score-space pi0|pi05: score in that family's normalised space (z-score or quantile) instead of
// the model's own, to compare pi0 and pi0.5 runs on one scale. The model's inputs keep its own.
const scoreNormalizer = values['score-space'] ? normalizerFor(values['score-space']) : normalizer;
const per = model.horizon * model.actionDim;
for (const steps of values.steps!.split(',').map(Number)) {
  for (const scale of values['noise-scale']!.split(',').map(Number)) {
    const ratios: number[] = [];
    for (const seed of values.seeds!.split(',').map(Number)) {
      const sampled = new Float32Array(set.datums.length * per);
      for (let s = 0; s < set.datums.length; s += 32) {
        const datums = set.datums.slice(s, s + 32);
        const batch = toBatch(model, datums, c.cameras, norm, normalizer, c.action_dim);
        // --average K: the mean of K sampled chunks (a diagnostic: how much of the error is the sampler's spread).
        const mean = new Float32Array(datums.length * per);
        for (let k = 0; k < average; k++) {
          const noise = new Rng(1234 + seed * 7919 + s + k * 104729).normals(datums.length * per).map((x) => x * scale);
          state.sample(batch, { numSteps: steps, noise }).forEach((v, i) => (mean[i] += v / average));
        }
        sampled.set(mean, s * per);
      }
      ratios.push(scorePredictions({ ...scoringContext(ds.meta, c.action_space), model, norm, normalizer: scoreNormalizer, absStats }, set.datums, sampled).ratio_hold_state);
    }
    process.stdout.write(JSON.stringify({ weights: dir, score_space: values['score-space'] ?? c.preset, steps, noise_scale: scale, average, ratio_hold_state: ratios.reduce((a, b) => a + b, 0) / ratios.length, ratios }) + '\n');
  }
}
