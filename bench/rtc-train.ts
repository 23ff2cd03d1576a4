/**
 * The two policies of the RTC replay (bench/rtc.ts), trained in-process on split A of G1 the way
 * a fine-tune job trains (server/jobs/train.ts: the same batches from sampleBatch and toBatch,
 * the same norm stats, AdamW settings and learning-rate schedule, a moving average served), on
 * kernels' TrainingState directly: that is where training-time RTC (TrainingOptions.rtcMaxDelay)
 * is reachable before `vela finetune` has a flag for it. Each is saved as a checkpoint folder
 * (EMA weights + norm stats, what `vela policy` serves) under a cache folder, and reused.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { saveCheckpoint, loadCheckpoint } from '../kernels/checkpoint.ts';
import { normalizerFor, normStatsToJson, parseNormStats } from '../kernels/normalize.ts';
import { makeConfig } from '../kernels/small/config.ts';
import { BaseWeights, TrainingState } from '../kernels/trainer.ts';
import { toExported } from '../server/engine/tenants.ts';
import { defaultActionSpace, sampleBatch, seededRng, type Dataset } from '../server/datasets/index.ts';
import { toBatch } from '../server/jobs/datums.ts';
import { JOB_ADAMW, RECIPE, defaultWarmupSteps } from '../server/jobs/config.ts';
import { buildEvalSet, scorePredictions } from '../server/jobs/evaluate.ts';
import { learningRateAt, scoringContext, trainingStats } from '../server/jobs/train.ts';
import { G1, HELD_OUT } from './recipe-split.ts';

/** One training recipe of the replay: the job's defaults (RECIPE) but for steps, plus rtcMaxDelay. */
export interface RtcRecipe {
  preset: string;
  steps: number;
  batchSize: number;
  learningRate: number;
  emaDecay: number;
  /** 0: plain (policy P); > 0: training-time RTC with delays 0..rtcMaxDelay (policy R). */
  rtcMaxDelay: number;
  seed: number;
}

/** What a cached policy's folder records besides the checkpoint (rtc-meta.json). */
export interface TrainedMeta {
  recipe: RtcRecipe;
  train_s: number;
  loadavg_start: number[];
  loadavg_end: number[];
  final_loss: number;
  /** The job's held-out score of the EMA weights (every 4th frame of split A's held-out episodes). */
  eval_ratio_hold_state: number;
  eval_mse: number;
}

/** The cache folder's name for a recipe: a change of any field trains anew. */
export function recipeKey(r: RtcRecipe): string {
  return `${r.preset}-s${r.steps}-b${r.batchSize}-lr${r.learningRate}-ema${r.emaDecay}-rtc${r.rtcMaxDelay}-seed${r.seed}`;
}

/** The dataset-side setup shared by training and replay: split, cameras, action space, norm stats. */
export function g1Setup(ds: Dataset, preset: string) {
  const model = makeConfig(preset);
  const meta = ds.meta;
  const train = [...ds.episodeIndices].filter((e) => !HELD_OUT.includes(e)).sort((a, b) => a - b);
  const cameras = meta.cameras.slice(0, model.slots).map((c) => c.name);
  const actionSpace = defaultActionSpace(meta);
  const { norm, absStats } = trainingStats(ds, train, actionSpace, model.horizon);
  return { model, train, cameras, actionSpace, norm, absStats, normalizer: normalizerFor(preset), datumOpts: { horizon: model.horizon, cameras, imageSize: model.imageSize, actionSpace } };
}

/**
 * Trains `recipe` unless `dir` already holds its checkpoint; returns the policy (a TrainingState
 * holding the EMA weights, as served) and its meta. `say` gets progress lines.
 */
export async function trainedPolicy(ds: Dataset, recipe: RtcRecipe, dir: string, say: (line: string) => void): Promise<{ state: TrainingState; meta: TrainedMeta }> {
  const setup = g1Setup(ds, recipe.preset);
  const { model } = setup;
  const weightsDir = path.join(dir, 'weights');
  const metaFile = path.join(dir, 'rtc-meta.json');
  const fresh = () => new TrainingState(BaseWeights.create(model, 0), { finetune: 'full' });
  if (fs.existsSync(metaFile)) {
    const ck = await loadCheckpoint(weightsDir, { preset: model.preset });
    const state = fresh();
    state.importWeights(toExported(ck));
    say(`${path.basename(dir)}: cached (${weightsDir})`);
    return { state, meta: JSON.parse(fs.readFileSync(metaFile, 'utf8')) as TrainedMeta };
  }
  const loadStart = readLoad();
  const state = new TrainingState(BaseWeights.create(model, 0), {
    finetune: 'full', seed: recipe.seed, emaDecay: recipe.emaDecay, timeSampling: RECIPE.time_sampling, rtcMaxDelay: recipe.rtcMaxDelay,
  });
  // The job's sampler seed and order (server/jobs/train.ts), so P sees the batches a job would.
  const rng = seededRng(recipe.seed * 7919 + 17);
  const warmup = defaultWarmupSteps(recipe.steps);
  const t0 = performance.now();
  let loss = NaN;
  for (let step = 1; step <= recipe.steps; step++) {
    const datums = await sampleBatch(ds, { ...setup.datumOpts, episodes: setup.train, batchSize: recipe.batchSize, rng });
    const batch = toBatch(model, datums, setup.cameras, setup.norm, setup.normalizer, ds.meta.actionDim);
    loss = state.forwardBackward(batch, { lossFn: 'mse' }).loss;
    const lr = learningRateAt(step, recipe.steps, recipe.learningRate, warmup, RECIPE.lr_floor);
    state.optimStep({ ...JOB_ADAMW, learningRate: lr });
    if (step % 100 === 0 || step === recipe.steps) say(`${path.basename(dir)}: step ${step}/${recipe.steps}, loss ${loss.toFixed(4)}, ${((performance.now() - t0) / 1000).toFixed(0)} s`);
  }
  const trainS = (performance.now() - t0) / 1000;
  const score = await heldOutScore(ds, setup, (b) => state.sample(b, { numSteps: 10, seed: 0, ema: true }));
  fs.mkdirSync(dir, { recursive: true });
  const ex = state.exportWeights({ ema: true });
  await saveCheckpoint(weightsDir, {
    config: { ...ex.config, preset: model.preset, action_horizon: model.horizon, cameras: setup.cameras, image_size: model.imageSize, image_slots: model.slots, base_seed: 0, session_seed: recipe.seed, action_space: setup.actionSpace, fps: ds.meta.fps, state_dim: ds.meta.stateDim, action_dim: ds.meta.actionDim },
    weights: ex.weights, normStats: parseNormStats(normStatsToJson(setup.norm)),
  }, { overwrite: true });
  const meta: TrainedMeta = { recipe, train_s: trainS, loadavg_start: loadStart, loadavg_end: readLoad(), final_loss: loss, eval_ratio_hold_state: score.ratio, eval_mse: score.mse };
  fs.writeFileSync(metaFile, JSON.stringify(meta, null, 2));
  say(`${path.basename(dir)}: trained in ${trainS.toFixed(0)} s, held-out ratio to hold-state ${score.ratio.toFixed(3)}`);
  // Serve what was saved: a fresh state with the EMA weights (what `vela policy` would load).
  const served = fresh();
  served.importWeights(toExported(await loadCheckpoint(weightsDir, { preset: model.preset })));
  state.dispose();
  return { state: served, meta };
}

/** The job's held-out evaluation (every 4th frame of split A's held-out episodes, 10 Euler steps). */
async function heldOutScore(ds: Dataset, setup: ReturnType<typeof g1Setup>, sample: (batch: ReturnType<typeof toBatch>) => Float32Array): Promise<{ ratio: number; mse: number }> {
  const { model } = setup;
  const set = await buildEvalSet(ds, HELD_OUT, 4, setup.datumOpts);
  const per = model.horizon * model.actionDim;
  const preds = new Float32Array(set.datums.length * per);
  for (let s = 0; s < set.datums.length; s += 32) {
    const datums = set.datums.slice(s, s + 32);
    preds.set(sample(toBatch(model, datums, setup.cameras, setup.norm, setup.normalizer, ds.meta.actionDim)), s * per);
  }
  const r = scorePredictions({ ...scoringContext(ds.meta, setup.actionSpace), model, norm: setup.norm, normalizer: setup.normalizer, absStats: setup.absStats }, set.datums, preds);
  return { ratio: r.ratio_hold_state, mse: r.mse };
}

/** /proc/loadavg's three averages (empty where there is none). */
export function readLoad(): number[] {
  try {
    return fs.readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).map(Number);
  } catch {
    return [];
  }
}

/** The repository's cache of the replay's policies (gitignored). */
export const RTC_CACHE = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../.scratch/rtc');

/** P (plain) and R (training-time RTC, delays 0..8): the job's recipe (RECIPE) for `steps` steps. */
export function rtcRecipes(steps: number): [RtcRecipe, RtcRecipe] {
  const p: RtcRecipe = { preset: 'flow0-tiny', steps, batchSize: RECIPE.batch_size, learningRate: RECIPE.learning_rate, emaDecay: RECIPE.ema_decay, rtcMaxDelay: 0, seed: 0 };
  return [p, { ...p, rtcMaxDelay: 8 }];
}

/** Training steps of the replay's policies unless --steps says otherwise. */
export const RTC_STEPS = 1500;

/** Why `npm run bench -- --quick` leaves the rtc part out. */
export const RTC_QUICK_SKIP = 'not in --quick: the RTC replay needs ../shared/datasets/g1_pick_bottle and two trained policies (npx tsx bench/rtc.ts trains them once, ~15 min on 2 cores)';

/** Why the rtc part of `npm run bench` cannot run here, or null: it replays cached policies only (training them is bench/rtc.ts's first run). */
export function rtcUnavailable(): string | null {
  if (!fs.existsSync(path.join(G1, 'meta/info.json'))) return `no ${G1} (the G1 dataset lives in ../shared)`;
  const missing = rtcRecipes(RTC_STEPS).filter((r) => !fs.existsSync(path.join(RTC_CACHE, recipeKey(r), 'rtc-meta.json')));
  if (missing.length) return `the replay's policies are not trained yet (${missing.map(recipeKey).join(', ')} missing in ${RTC_CACHE}): run npx tsx bench/rtc.ts once (~15 min on 2 cores), then the rtc part replays them`;
  return null;
}

/** Runs `npx tsx bench/rtc.ts` (its table on this process's stdout) and returns the summary of the rtc.json it wrote. @throws Error when it fails. */
export async function runRtcChild(): Promise<Record<string, unknown>> {
  const repo = path.resolve(RTC_CACHE, '../..');
  const code = await new Promise<number>((resolve, reject) => {
    const child = spawn('npx', ['tsx', 'bench/rtc.ts'], { cwd: repo, stdio: ['ignore', 'inherit', 'inherit'] });
    child.on('error', reject);
    child.on('exit', (c) => resolve(c ?? 1));
  });
  if (code !== 0) throw new Error(`bench/rtc.ts exited with ${code}`);
  const out = JSON.parse(fs.readFileSync(path.join(repo, 'bench/results/rtc.json'), 'utf8')) as Record<string, unknown>;
  return { file: 'bench/results/rtc.json', date: out.date, setup: out.setup, rows: out.rows, checks: out.checks, timing: out.timing };
}
