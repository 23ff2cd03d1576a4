/**
 * One fine-tune, start to finish: open the dataset, split episodes, compute norm stats, train on
 * the engine step by step, evaluate on held-out episodes, write resumable checkpoints and the
 * final weights. The server (runner.ts) and `vela finetune` (cli.ts) both run this function; they
 * differ only in where events go and how cancellation is asked for.
 */
import fs from 'node:fs';
import path from 'node:path';
import { batchBuffers, makeBatch, type DatumInput, type ModelBatch } from '../../kernels/batch.ts';
import { makeConfig, type PolicyConfig } from '../../kernels/config.ts';
import { computeNormStats, normalizerFor, normStatsToJson, type NormStatsSet } from '../../kernels/normalize.ts';
import { defaultActionSpace, deltaPairs, gatherNormRows, makeDatum, openDataset, pairsFor, sampleBatch, seededRng, splitEpisodes, type Dataset, type TrainingDatum } from '../datasets/index.ts';
import type { EngineLike } from '../engine/host.ts';
import { JOB_ADAMW, type FineTuneConfig } from './config.ts';

/**
 * Where a run writes: `<workDir>/weights/step-NNNNNNN` at each checkpoint and `<workDir>/weights/final`
 * (weights only, kept: each can be served with `vela policy`), `<workDir>/states/step-NNNNNNN`
 * (weights + optimizer, resumable; only the newest is kept, and none after success).
 */
export interface RunContext {
  jobId: string;
  datasetDir: string;
  workDir: string;
  engine: EngineLike;
  /** Append one event (status, log, progress). */
  emit(type: 'status' | 'log' | 'progress', data: Record<string, unknown>): void;
  /** True once a cancel was asked for (or the job must stop here); checked at step boundaries. */
  isCancelled(): boolean | Promise<boolean>;
  /** Opens the dataset (the server shares opened datasets, and their decoded frames, across jobs). */
  openDataset?: (dir: string) => Promise<Dataset>;
}

export interface RunResult {
  status: 'succeeded' | 'cancelled';
  outputDir: string | null;
  step: number;
  loss: number | null;
  evalLoss: number | null;
}

/** What a resumable checkpoint records besides the engine state (written after the state). */
interface ResumePoint {
  step: number;
  state: string; // saved state name
  samplerSeed: number;
  elapsedSeconds: number;
}

const EVAL_DATUMS = 32;
const EVAL_SEED = 1234;

/** Warmup then cosine decay to 10% (openpi's default schedule shape). */
export function learningRateAt(step: number, steps: number, peak: number): number {
  const warmup = Math.min(100, Math.max(1, Math.floor(steps / 10)));
  if (step <= warmup) return (peak * step) / warmup;
  const progress = (step - warmup) / Math.max(1, steps - warmup);
  return peak * (0.1 + 0.9 * 0.5 * (1 + Math.cos(Math.PI * progress)));
}

/** Normalised datums -> the model's batch. Only valid action rows are given: padding is masked. */
function toBatch(model: PolicyConfig, datums: TrainingDatum[], cameras: string[], norm: NormStatsSet, normalizer: ReturnType<typeof normalizerFor>, ad: number): ModelBatch {
  const inputs: DatumInput[] = datums.map((d) => {
    let valid = 0;
    while (valid < d.horizon && d.actionMask[valid] === 1) valid++;
    const actions = normalizer.normalize(d.actions.subarray(0, valid * ad), ad, norm.actions);
    return {
      images: cameras.map((c) => d.images[c]!.data),
      state: normalizer.normalize(d.state, d.state.length, norm.state),
      prompt: d.prompt,
      actions: { data: actions, horizon: valid, dim: ad },
    };
  });
  return makeBatch(model, inputs);
}


async function call<T>(ctx: RunContext, op: string, args: Record<string, unknown>, transfer: ArrayBuffer[] = []): Promise<T> {
  const a = await ctx.engine.call<{ result: T }>(ctx.jobId, op, args, transfer);
  return a.result;
}

/**
 * Validate everything that can be checked before training: dataset, cameras, dims.
 * @throws DatasetError / Error with a readable message naming what is wrong.
 */
export async function prepareRun(cfg: FineTuneConfig, datasetDir: string, open: (dir: string) => Promise<Dataset> = openDataset) {
  const model = makeConfig(cfg.model);
  const ds = await open(datasetDir);
  const meta = ds.meta;
  if (meta.cameras.length === 0) throw new Error(`dataset ${datasetDir} has no camera (video or image feature)`);
  const cameras = (cfg.cameras ?? meta.cameras.slice(0, model.slots).map((c) => c.name)).map((c) => ds.camera(c).name);
  if (cameras.length > model.slots) throw new Error(`cameras lists ${cameras.length} cameras; ${cfg.model} has ${model.slots} image slots`);
  if (meta.stateDim > model.stateDim) throw new Error(`the dataset's observation.state has ${meta.stateDim} dims; ${cfg.model} takes at most ${model.stateDim}`);
  if (meta.actionDim > model.actionDim) throw new Error(`the dataset's action has ${meta.actionDim} dims; ${cfg.model} takes at most ${model.actionDim}`);
  const actionSpace = cfg.action_space ?? defaultActionSpace(meta);
  pairsFor(meta, actionSpace); // refuses delta without shared names
  const split = splitEpisodes(ds.episodeIndices, { seed: cfg.seed });
  return { model, ds, cameras, actionSpace, split };
}

/** Run (or resume) a fine-tune; resolves when it succeeded or was cancelled, throws when it failed. */
export async function runFineTune(cfg: FineTuneConfig, ctx: RunContext): Promise<RunResult> {
  const started = Date.now();
  const { model, ds, cameras, actionSpace, split } = await prepareRun(cfg, ctx.datasetDir, ctx.openDataset);
  const meta = ds.meta;
  ctx.emit('log', {
    message: `dataset loaded: ${meta.episodes.length} episodes, ${meta.totalFrames} frames, cameras ${cameras.join(', ')}, state ${meta.stateDim}, action ${meta.actionDim}, ${meta.fps} fps; ` +
      `train episodes ${split.train.join(',')}, held-out ${split.heldOut.join(',') || 'none'}; action_space ${actionSpace}`,
  });

  const rows = gatherNormRows(ds, split.train, actionSpace);
  const norm: NormStatsSet = {
    state: computeNormStats({ data: rows.state, dim: rows.stateDim }),
    actions: computeNormStats({ data: rows.action, dim: rows.actionDim }),
  };
  const normalizer = normalizerFor(cfg.model);
  const normJson = normStatsToJson(norm);
  fs.mkdirSync(ctx.workDir, { recursive: true });

  const trainFrames = split.train.reduce((s, e) => s + ds.episode(e).length, 0);
  const ad = meta.actionDim;
  const horizon = model.horizon;
  const datumOpts = { horizon, cameras, imageSize: model.imageSize, actionSpace };
  const checkpointExtra = {
    // state_dim / action_dim are the dataset's: what the policy server takes and returns.
    cameras, action_horizon: horizon, action_space: actionSpace, dataset: cfg.dataset_name, fps: meta.fps,
    state_dim: meta.stateDim, action_dim: ad, state_names: meta.stateNames, action_names: meta.actionNames,
    delta_pairs: pairsFor(meta, actionSpace),
  };

  const created = await call<{ trainableParams: number }>(ctx, 'create_session', {
    finetune: cfg.finetune, rank: cfg.lora_rank, alpha: cfg.lora_alpha, targets: cfg.targets, seed: cfg.seed, dir: ctx.workDir,
  });
  ctx.emit('log', { message: `model built: ${cfg.model}, ${cfg.finetune} (${created.trainableParams.toLocaleString('en-US')} trainable parameters)` });

  // Resume from the last periodic checkpoint, if any.
  const resumeFile = path.join(ctx.workDir, 'resume.json');
  let step = 0;
  let samplerSeed = cfg.seed * 7919 + 17;
  let elapsedBefore = 0;
  if (fs.existsSync(resumeFile)) {
    const r = JSON.parse(fs.readFileSync(resumeFile, 'utf8')) as ResumePoint;
    await call(ctx, 'load_state', { name: r.state });
    step = r.step;
    samplerSeed = r.samplerSeed;
    elapsedBefore = r.elapsedSeconds;
    ctx.emit('log', { message: `resumed from the checkpoint at step ${step}` });
  }

  const evalSet = await buildEvalSet(ds, split.heldOut.length > 0 ? split.heldOut : split.train, datumOpts);
  const meanChunk = trainingMeanChunk(rows.action, ad, horizon);
  let lastLoss: number | null = null;
  let lastEval: number | null = null;
  let rng = seededRng(samplerSeed);
  // The trainer begins: `stage` lets the sidecar view report its `training` status here.
  ctx.emit('log', { message: `training: steps ${step + 1}..${cfg.steps}, batch ${cfg.batch_size}`, stage: 'training', max_steps: cfg.steps });

  while (step < cfg.steps) {
    if (await ctx.isCancelled()) return { status: 'cancelled', outputDir: null, step, loss: lastLoss, evalLoss: lastEval };
    const datums = await sampleBatch(ds, { ...datumOpts, episodes: split.train, batchSize: cfg.batch_size, rng });
    const batch = toBatch(model, datums, cameras, norm, normalizer, ad);
    const fb = await call<{ loss: number }>(ctx, 'forward_backward', { batch, lossFn: 'mse' }, batchBuffers(batch));
    const lr = learningRateAt(step + 1, cfg.steps, cfg.learning_rate);
    const opt = await call<{ gradNorm: number; skipped: boolean }>(ctx, 'optim_step', { ...JOB_ADAMW, learningRate: lr });
    step++;
    lastLoss = Number.isFinite(fb.loss) ? fb.loss : null;
    const record: Record<string, unknown> = {
      step, loss: lastLoss, learning_rate: lr, epoch: (step * cfg.batch_size) / trainFrames,
      grad_norm: Number.isFinite(opt.gradNorm) ? opt.gradNorm : null, skipped: opt.skipped, elapsed_seconds: elapsedBefore + (Date.now() - started) / 1000,
    };
    if ((cfg.eval_every > 0 && step % cfg.eval_every === 0) || step === cfg.steps) {
      Object.assign(record, await evaluate(ctx, model, evalSet, cameras, norm, normalizer, ad, meanChunk, deltaPairs(meta), actionSpace));
      lastEval = record.eval_loss as number;
    }
    ctx.emit('progress', record);
    if (step % cfg.checkpoint_every === 0 && step < cfg.steps) {
      const name = `step-${String(step).padStart(7, '0')}`;
      // Weights first: a resume point never names a step whose weights are not on disk.
      const weightsDir = await call<string>(ctx, 'save_weights', { name, overwrite: true, extraConfig: checkpointExtra, normStats: normJson });
      await call(ctx, 'save_state', { name, overwrite: true, extraConfig: checkpointExtra, normStats: normJson });
      // Draw the next sampler seed now, so a resumed run sees the same batches as an uninterrupted one.
      samplerSeed = Math.floor(rng() * 2 ** 31);
      rng = seededRng(samplerSeed);
      writeJsonAtomic(resumeFile, { step, state: name, samplerSeed, elapsedSeconds: elapsedBefore + (Date.now() - started) / 1000 } satisfies ResumePoint);
      pruneStates(ctx.workDir, name);
      ctx.emit('log', { message: `checkpoint written at step ${step}: weights in ${weightsDir}${record.eval_loss !== undefined ? ` (eval_loss ${(record.eval_loss as number).toFixed(4)})` : ''}` });
    }
  }
  if (await ctx.isCancelled()) return { status: 'cancelled', outputDir: null, step, loss: lastLoss, evalLoss: lastEval };
  const outputDir = await call<string>(ctx, 'save_weights', { name: 'final', overwrite: true, extraConfig: checkpointExtra, normStats: normJson });
  ctx.emit('log', { message: `final weights written to ${outputDir}` });
  // The resumable states (optimizer moments: twice the weights) are superseded by the final
  // weights: free their disk, and make a rerun into the same folder start afresh instead of
  // resuming a finished run. The checkpoints' weights (weights/step-*) stay, as LeRobot's do.
  fs.rmSync(resumeFile, { force: true });
  fs.rmSync(path.join(ctx.workDir, 'states'), { recursive: true, force: true });
  return { status: 'succeeded', outputDir, step, loss: lastLoss, evalLoss: lastEval };
}

interface EvalSet {
  datums: TrainingDatum[];
}

/** A fixed set of held-out frames, evenly spaced through each episode, so evals are comparable. */
async function buildEvalSet(ds: Dataset, episodes: number[], opts: Parameters<typeof makeDatum>[3]): Promise<EvalSet> {
  const per = Math.max(1, Math.ceil(EVAL_DATUMS / episodes.length));
  const picks: [number, number][] = [];
  for (const e of episodes) {
    const len = ds.episode(e).length;
    for (let k = 0; k < per && picks.length < EVAL_DATUMS; k++) picks.push([e, Math.floor(((k + 0.5) * len) / per)]);
  }
  return { datums: await Promise.all(picks.map(([e, t]) => makeDatum(ds, e, t, opts))) };
}

/** The training set's mean action chunk [ah, ad] in the raw action space (mean per dim, all h). */
function trainingMeanChunk(actions: Float32Array, ad: number, horizon: number): Float32Array {
  const n = actions.length / ad;
  const mean = new Float64Array(ad);
  for (let i = 0; i < n; i++) for (let j = 0; j < ad; j++) mean[j]! += actions[i * ad + j]! / n;
  const out = new Float32Array(horizon * ad);
  for (let h = 0; h < horizon; h++) for (let j = 0; j < ad; j++) out[h * ad + j] = mean[j]!;
  return out;
}

/**
 * Held-out evaluation, in the model's normalised action space, on valid (h, a) entries only:
 * - eval_loss: the flow-matching loss (fixed noise and time, seeded).
 * - eval_action_mse: MSE of actions sampled with 10 Euler steps against the true chunk.
 * Baselines computed the same way: a predictor that knows only a fixed chunk a_b has velocity
 * (x_t - a_b) / t at x_t (the straight path to a_b), so its flow loss is mean((a - a_b)^2 / t^2);
 * its sampled chunk is a_b itself. a_b = the training-set mean chunk, or the current state held
 * for the whole chunk (zero in delta space).
 */
async function evaluate(ctx: RunContext, model: PolicyConfig, set: EvalSet, cameras: string[], norm: NormStatsSet, normalizer: ReturnType<typeof normalizerFor>, ad: number, meanChunkRaw: Float32Array, holdPairs: [number, number][], actionSpace: string) {
  const H = model.horizon;
  const A = model.actionDim;
  const b1 = toBatch(model, set.datums, cameras, norm, normalizer, ad);
  const b2 = toBatch(model, set.datums, cameras, norm, normalizer, ad);
  const truth = b1.actions.slice();
  const mask = b1.actionMask.slice();
  const f = await call<{ velocity: Float32Array; target: Float32Array; xT: Float32Array; time: Float32Array }>(ctx, 'forward', { batch: b1, keep: false, seed: EVAL_SEED }, batchBuffers(b1));
  const s = await call<{ actions: Float32Array }>(ctx, 'sample', { batch: b2, numSteps: 10, seed: EVAL_SEED }, batchBuffers(b2));
  const meanChunk = normalizer.normalize(meanChunkRaw, ad, norm.actions);
  const B = set.datums.length;
  // "Hold the current state": on dims that action shares with state by name, the state itself
  // (a zero delta in delta space); elsewhere the training mean, since there is no state to hold.
  const hold = new Float32Array(B * H * A);
  set.datums.forEach((d, i) => {
    const raw = meanChunkRaw.slice(0, H * ad);
    for (const [a, st] of holdPairs) for (let h = 0; h < H; h++) raw[h * ad + a] = actionSpace === 'delta' ? 0 : d.state[st]!;
    const n = normalizer.normalize(raw, ad, norm.actions);
    for (let h = 0; h < H; h++) for (let j = 0; j < ad; j++) hold[(i * H + h) * A + j] = n[h * ad + j]!;
  });
  let flow = 0, flowMean = 0, flowHold = 0, mse = 0, mseMean = 0, mseHold = 0, count = 0;
  for (let i = 0; i < B; i++) {
    const t = f.time[i]!;
    for (let h = 0; h < H; h++) {
      for (let j = 0; j < A; j++) {
        const k = (i * H + h) * A + j;
        if (mask[k] !== 1) continue;
        const a = truth[k]!;
        const m = j < ad ? meanChunk[h * ad + j]! : 0;
        const hd = hold[k]!;
        flow += (f.velocity[k]! - f.target[k]!) ** 2;
        flowMean += ((a - m) / t) ** 2;
        flowHold += ((a - hd) / t) ** 2;
        mse += (s.actions[k]! - a) ** 2;
        mseMean += (m - a) ** 2;
        mseHold += (hd - a) ** 2;
        count++;
      }
    }
  }
  const c = Math.max(1, count);
  return {
    eval_loss: flow / c,
    eval_loss_baseline_mean_chunk: flowMean / c,
    eval_loss_baseline_hold_state: flowHold / c,
    eval_action_mse: mse / c,
    eval_action_mse_baseline_mean_chunk: mseMean / c,
    eval_action_mse_baseline_hold_state: mseHold / c,
    eval_datums: B,
  };
}

function writeJsonAtomic(file: string, value: unknown): void {
  const tmp = `${file}.tmp-${process.pid}`;
  const fd = fs.openSync(tmp, 'w');
  fs.writeSync(fd, JSON.stringify(value, null, 2));
  fs.fsyncSync(fd);
  fs.closeSync(fd);
  fs.renameSync(tmp, file);
}

/** Keep only the newest resumable state (older ones are superseded by resume.json). */
function pruneStates(workDir: string, keep: string): void {
  const dir = path.join(workDir, 'states');
  if (!fs.existsSync(dir)) return;
  for (const name of fs.readdirSync(dir)) {
    if (name !== keep && name.startsWith('step-')) fs.rmSync(path.join(dir, name), { recursive: true, force: true });
  }
}
