/**
 * One fine-tune, start to finish: open the dataset, split episodes, compute norm stats, train on
 * the engine step by step, evaluate on held-out episodes, write resumable checkpoints and the
 * final weights. The server (runner.ts) and `vela finetune` (cli.ts) both run this function; they
 * differ only in where events go and how cancellation is asked for.
 */
import fs from 'node:fs';
import path from 'node:path';
import { batchBuffers } from '../../kernels/small/batch.ts';
import { computeNormStats, normalizerFor, normStatsToJson, type NormStats, type NormStatsSet } from '../../kernels/normalize.ts';
import { augmentFrame, drawAugment } from '../datasets/augment.ts';
import { actionGroups, defaultActionSpace, deltaPairs, gatherNormRows, openDataset, pairsFor, sampleBatch, seededRng, splitEpisodes, type ActionSpace, type Dataset, type EpisodeSplit } from '../datasets/index.ts';
import type { EngineLike } from '../engine/host.ts';
import { FieldError, JOB_ADAMW, type FineTuneConfig } from './config.ts';
import { toBatch } from './datums.ts';
import { buildEvalSet, evaluate, type EvalContext } from './evaluate.ts';
import { recordJobStep } from '../metrics/training.ts';
import { HttpError } from '../http/http.ts';
import { modelLayout } from '../models/layout.ts';
import { datasetMisfit, jobModelShape } from './base.ts';
import { exportHubModel } from './export-hub.ts';

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
  /** The folder of `eval_dataset`, resolved as dataset_name is (required when the config names one). */
  evalDatasetDir?: string;
  /** The real model's base checkpoint folder (required for model pi0 / pi05): the dataset's fit is checked against it. */
  baseDir?: string;
}

export interface RunResult {
  status: 'succeeded' | 'cancelled';
  outputDir: string | null;
  /** The real models: the output in the Hub layout (`<workDir>/model`), a base for a new job or session. */
  modelDir?: string;
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

/**
 * The learning rate at `step` (1-based) of `steps`: linear warm-up from 0 to `peak` over
 * `warmupSteps`, then cosine decay to `floor * peak` at the last step (openpi's shape).
 * Example: steps 1000, warm-up 100, floor 0.1: step 50 -> peak / 2, step 100 -> peak, step 1000 -> peak / 10.
 */
export function learningRateAt(step: number, steps: number, peak: number, warmupSteps: number, floor: number): number {
  if (step <= warmupSteps) return (peak * step) / warmupSteps;
  const progress = (step - warmupSteps) / Math.max(1, steps - warmupSteps);
  return peak * (floor + (1 - floor) * 0.5 * (1 + Math.cos(Math.PI * Math.min(1, progress))));
}


async function call<T>(ctx: RunContext, op: string, args: Record<string, unknown>, transfer: ArrayBuffer[] = []): Promise<T> {
  const a = await ctx.engine.call<{ result: T }>(ctx.jobId, op, args, transfer);
  return a.result;
}

/**
 * Validate everything that can be checked before training: dataset, cameras, dims (against the
 * preset, or the real model's base checkpoint folder `baseDir`, which a fine-tuned base's data
 * must match too: base.ts datasetMisfit).
 * @throws DatasetError / Error with a readable message naming what is wrong; HttpError 400 (one
 *   line naming the dataset, the cause and the fix) for a dataset that does not fit the model.
 */
export async function prepareRun(cfg: FineTuneConfig, datasetDir: string, open: (dir: string) => Promise<Dataset> = openDataset, evalDatasetDir?: string, baseDir?: string) {
  const model = await jobModelShape(cfg, baseDir);
  const ds = await open(datasetDir);
  const meta = ds.meta;
  if (meta.cameras.length === 0) throw new Error(`dataset ${datasetDir} has no camera (video or image feature)`);
  const cameras = (cfg.cameras ?? meta.cameras.slice(0, model.slots).map((c) => c.name)).map((c) => ds.camera(c).name);
  if (cameras.length > model.slots) throw new Error(`cameras lists ${cameras.length} cameras; ${model.name} has ${model.slots} image slots`);
  const misfit = await datasetMisfit(meta, cfg.dataset_name, model, baseDir, cfg.base);
  if (misfit) throw new HttpError(400, misfit);
  const actionSpace = cfg.action_space ?? defaultActionSpace(meta);
  const pairs = pairsFor(meta, actionSpace); // refuses delta without shared names
  let evalDs = ds;
  if (cfg.eval_dataset !== null) {
    if (!evalDatasetDir) throw new Error(`eval_dataset "${cfg.eval_dataset}" was not resolved to a folder`);
    // Errors about the second dataset name it (as the client spelled it), not the training one.
    const refuse = (rule: string): never => {
      throw new FieldError('eval_dataset', rule.split(evalDatasetDir).join(cfg.eval_dataset!), cfg.eval_dataset);
    };
    if (path.resolve(evalDatasetDir) === path.resolve(datasetDir)) refuse('must be a second dataset, not dataset_name (to score episodes of dataset_name, hold them out with eval_episodes or eval_fraction)');
    try {
      evalDs = await open(evalDatasetDir);
    } catch (e) {
      refuse(`is not a usable dataset: ${(e as Error).message}`);
    }
    const mismatch = shapeMismatch(ds, evalDs, cameras, actionSpace);
    if (mismatch) refuse(mismatch);
  }
  const split = resolveSplit(cfg, ds);
  return { model, ds, evalDs, cameras, actionSpace, split };
}

/**
 * Train and held-out episodes (issue 16): every episode of dataset_name trains when eval_dataset
 * names a second dataset (all of whose episodes are scored); else eval_episodes are held out, or
 * a seeded share eval_fraction (0: nothing held out and nothing evaluated).
 * @throws FieldError (eval_episodes, a 400) naming episodes the dataset does not have, or a split
 *   that leaves nothing to train on.
 */
export function resolveSplit(cfg: Pick<FineTuneConfig, 'eval_fraction' | 'eval_episodes' | 'eval_dataset' | 'seed'>, ds: Dataset): EpisodeSplit {
  const all = [...ds.episodeIndices].sort((a, b) => a - b);
  if (cfg.eval_dataset !== null) return { train: all, heldOut: [] };
  if (cfg.eval_episodes !== null) {
    const missing = cfg.eval_episodes.filter((e) => !all.includes(e));
    if (missing.length) throw new FieldError('eval_episodes', `must be episodes of the dataset (episodes ${all[0]}..${all.at(-1)}, ${all.length} of them); not in it`, missing);
    const held = new Set(cfg.eval_episodes);
    const train = all.filter((e) => !held.has(e));
    if (train.length === 0) throw new FieldError('eval_episodes', `must leave an episode to train on: the dataset has ${all.length}`, cfg.eval_episodes);
    return { train, heldOut: [...held].sort((a, b) => a - b) };
  }
  return splitEpisodes(all, { evalFraction: cfg.eval_fraction, seed: cfg.seed });
}

/** Why a run with this split scores nothing (for the log and the CLI summary). */
export function noEvaluationReason(cfg: Pick<FineTuneConfig, 'eval_fraction'>, split: EpisodeSplit): string {
  if (cfg.eval_fraction === 0) return 'no evaluation: eval_fraction 0 and no eval_dataset';
  const n = split.train.length + split.heldOut.length;
  return `no evaluation: eval_fraction ${cfg.eval_fraction} holds out no episode of a ${n}-episode dataset (one must train); give eval_dataset to score a second dataset`;
}

/**
 * Why an evaluation dataset cannot score a policy trained on `ds` (it needs the same dims, the
 * training cameras and the same dimension names), or null when it can.
 */
function shapeMismatch(ds: Dataset, evalDs: Dataset, cameras: string[], space: string): string | null {
  const a = ds.meta;
  const b = evalDs.meta;
  if (a.stateDim !== b.stateDim || a.actionDim !== b.actionDim) {
    return `must have the training dataset's dims: it has state ${b.stateDim} / action ${b.actionDim}, the training dataset ${a.stateDim} / ${a.actionDim}`;
  }
  const missing = cameras.filter((c) => !b.cameras.some((x) => x.name === c || x.key === c));
  if (missing.length) return `must have the training cameras: it lacks ${missing.join(', ')} (its cameras: ${b.cameras.map((c) => c.name).join(', ')})`;
  if (JSON.stringify(a.stateNames) !== JSON.stringify(b.stateNames) || JSON.stringify(a.actionNames) !== JSON.stringify(b.actionNames)) {
    return `must name its state and action dimensions as the training dataset does, or ${space} actions would not mean the same`;
  }
  return null;
}

/**
 * The normalisation statistics of a run, from the training episodes: state rows, and every
 * action-chunk entry the model is trained on (horizon, padding excluded) in the training space;
 * plus the absolute actions' chunk statistics that the held-out scores are normalised with.
 */
export function trainingStats(ds: Dataset, train: readonly number[], actionSpace: ActionSpace, horizon: number): { norm: NormStatsSet; absStats: NormStats } {
  const rows = gatherNormRows(ds, train, actionSpace, horizon);
  const norm: NormStatsSet = {
    state: computeNormStats({ data: rows.state, dim: rows.stateDim }),
    actions: computeNormStats({ data: rows.action, dim: rows.actionDim }),
  };
  const absStats = actionSpace === 'absolute' ? norm.actions : computeNormStats({ data: gatherNormRows(ds, train, 'absolute', horizon).action, dim: rows.actionDim });
  return { norm, absStats };
}

/** The dataset's part of an EvalContext: dims, pairs, action groups and names. */
export function scoringContext(meta: Dataset['meta'], actionSpace: ActionSpace) {
  return {
    ad: meta.actionDim, spacePairs: pairsFor(meta, actionSpace), holdPairs: deltaPairs(meta),
    groups: actionGroups(meta.actionNames), actionNames: meta.actionNames,
  };
}

/** Run (or resume) a fine-tune; resolves when it succeeded or was cancelled, throws when it failed. */
export async function runFineTune(cfg: FineTuneConfig, ctx: RunContext): Promise<RunResult> {
  const started = Date.now();
  const { ds, evalDs, cameras, actionSpace, split } = await prepareRun(cfg, ctx.datasetDir, ctx.openDataset, ctx.evalDatasetDir, ctx.baseDir);
  // The engine's own layout: a preset's sizes, or the real model's with its PaliGemma prompt.
  const model = await modelLayout(ctx.engine.info);
  const meta = ds.meta;
  const evalEpisodes = cfg.eval_dataset !== null ? [...evalDs.episodeIndices].sort((a, b) => a - b) : split.heldOut;
  const evalWhere = cfg.eval_dataset !== null ? `evaluated on every episode of ${cfg.eval_dataset}` : `held-out ${split.heldOut.join(',') || `none (${noEvaluationReason(cfg, split)})`}`;
  ctx.emit('log', {
    message: `dataset loaded: ${meta.episodes.length} episodes, ${meta.totalFrames} frames, cameras ${cameras.join(', ')}, state ${meta.stateDim}, action ${meta.actionDim}, ${meta.fps} fps; ` +
      `train episodes ${split.train.join(',')}, ${evalWhere}; action_space ${actionSpace}`,
  });

  const { norm, absStats } = trainingStats(ds, split.train, actionSpace, model.horizon);
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
    finetune: cfg.finetune, rank: cfg.lora_rank, alpha: cfg.lora_alpha, targets: cfg.targets, seed: cfg.seed, dir: ctx.workDir, emaDecay: cfg.ema_decay, timeSampling: cfg.time_sampling, rtcMaxDelay: cfg.rtc_max_delay ?? 0,
    ...(cfg.lora_action_rank != null ? { actionRank: cfg.lora_action_rank } : {}), ...(cfg.lora_action_alpha != null ? { actionAlpha: cfg.lora_action_alpha } : {}),
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

  const evalSet = evalEpisodes.length > 0 ? await buildEvalSet(evalDs, evalEpisodes, cfg.eval_stride, datumOpts) : null;
  const evalCtx: EvalContext = {
    ...scoringContext(meta, actionSpace), model, cameras, norm, normalizer, absStats,
    call: (op, args, transfer) => call(ctx, op, args, transfer),
  };
  if (evalSet) ctx.emit('log', { message: `held-out evaluation: ${evalSet.datums.length} frames (${everyNth(cfg.eval_stride)} of episode${evalEpisodes.length === 1 ? '' : 's'} ${evalEpisodes.join(',')}), ${evalCtx.groups.length ? `groups ${evalCtx.groups.map((g) => g.name).join(', ')}` : 'no action groups'}` });
  let lastLoss: number | null = null;
  let lastEval: number | null = null;
  let rng = seededRng(samplerSeed);
  // The trainer begins: `stage` lets the sidecar view report its `training` status here.
  // Gradient accumulation (issue 34): each step's batch in taped passes of `micro` datums, summed into one optimizer step.
  const micro = Math.min(cfg.batch_size, cfg.micro_batch_size ?? cfg.memory_plan?.micro_batch_size ?? cfg.batch_size);
  const passes = Math.ceil(cfg.batch_size / micro);
  const microWhy = cfg.micro_batch_size != null ? 'micro_batch_size as requested' : cfg.memory_plan ? `the memory plan: ${cfg.memory_plan.reason}` : 'the whole batch at once (memory is planned for real pi0 / pi0.5 bases only)';
  ctx.emit('log', {
    message: `training: steps ${step + 1}..${cfg.steps}, batch ${cfg.batch_size}${passes > 1 ? ` in ${passes} micro-batches of ${micro} (gradients summed into one optimizer step)` : ''}; micro-batch ${micro} by ${microWhy}`,
    stage: 'training', max_steps: cfg.steps, micro_batch_size: micro,
  });

  while (step < cfg.steps) {
    if (await ctx.isCancelled()) return { status: 'cancelled', outputDir: null, step, loss: lastLoss, evalLoss: lastEval };
    const stepStarted = performance.now();
    const datums = await sampleBatch(ds, { ...datumOpts, episodes: split.train, batchSize: cfg.batch_size, rng });
    if (cfg.augment) for (const d of datums) for (const c of cameras) d.images[c] = augmentFrame(d.images[c]!, drawAugment(rng));
    const batch = toBatch(model, datums, cameras, norm, normalizer, ad);
    // One engine call: the engine slices the batch and draws its noise and time once for all of it (trainer.ts forwardBackwardParts).
    const fb = await call<{ loss: number }>(ctx, 'forward_backward', { batch, lossFn: 'mse', ...(passes > 1 ? { microBatch: micro } : {}) }, batchBuffers(batch));
    const lr = learningRateAt(step + 1, cfg.steps, cfg.learning_rate, cfg.warmup_steps, cfg.lr_floor);
    const opt = await call<{ gradNorm: number; skipped: boolean }>(ctx, 'optim_step', { ...JOB_ADAMW, learningRate: lr, eps: cfg.adam_eps, weightDecay: cfg.weight_decay });
    step++;
    recordJobStep((performance.now() - stepStarted) / 1000);
    lastLoss = Number.isFinite(fb.loss) ? fb.loss : null;
    const record: Record<string, unknown> = {
      step, loss: lastLoss, learning_rate: lr, epoch: (step * cfg.batch_size) / trainFrames,
      grad_norm: Number.isFinite(opt.gradNorm) ? opt.gradNorm : null, skipped: opt.skipped, elapsed_seconds: elapsedBefore + (Date.now() - started) / 1000,
    };
    if (evalSet && ((cfg.eval_every > 0 && step % cfg.eval_every === 0) || step === cfg.steps)) {
      Object.assign(record, await evaluate(evalCtx, evalSet, { ema: cfg.ema_decay > 0 }));
      lastEval = record.eval_loss as number;
    }
    ctx.emit('progress', record);
    if (step % cfg.checkpoint_every === 0 && step < cfg.steps) {
      const name = `step-${String(step).padStart(7, '0')}`;
      // Weights first: a resume point never names a step whose weights are not on disk.
      // Each checkpoint's weights can be served: the moving average, as the final ones.
      const weightsDir = await call<string>(ctx, 'save_weights', { name, overwrite: true, extraConfig: checkpointExtra, normStats: normJson, ema: cfg.ema_decay > 0 });
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
  // With a moving average, it is what gets served (and what the evaluation scored).
  const outputDir = await call<string>(ctx, 'save_weights', { name: 'final', overwrite: true, extraConfig: checkpointExtra, normStats: normJson, ema: cfg.ema_decay > 0 });
  ctx.emit('log', { message: `final weights written to ${outputDir}` });
  let modelDir: string | undefined;
  if (ctx.baseDir) {
    // The real models: the output again as a base checkpoint (Hub layout, LoRA merged in).
    const started = Date.now();
    const out = await exportHubModel({
      baseDir: ctx.baseDir, weightsDir: outputDir, outDir: path.join(ctx.workDir, 'model'), stateDim: meta.stateDim, actionDim: ad, normStats: normJson, dataset: checkpointExtra,
    });
    modelDir = out.dir;
    ctx.emit('log', { message: `the output as a base checkpoint (Hub layout${out.merged ? `, LoRA merged into ${out.merged} linears` : ''}${out.replaced ? `, ${out.replaced} parameters trained in full` : ''}, ${(out.weightBytes / 1e6).toFixed(1)} MB) in ${modelDir} after ${((Date.now() - started) / 1000).toFixed(1)} s`, model_dir: modelDir });
  }
  // The resumable states (optimizer moments: twice the weights) are superseded by the final
  // weights: free their disk, and make a rerun into the same folder start afresh instead of
  // resuming a finished run. The checkpoints' weights (weights/step-*) stay, as LeRobot's do.
  fs.rmSync(resumeFile, { force: true });
  fs.rmSync(path.join(ctx.workDir, 'states'), { recursive: true, force: true });
  return { status: 'succeeded', outputDir, ...(modelDir ? { modelDir } : {}), step, loss: lastLoss, evalLoss: lastEval };
}

/** Write `value` as JSON to `file` atomically: a temp file, fsync, rename. */
export function writeJsonAtomic(file: string, value: unknown): void {
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

/** "every frame", "every 2nd frame", "every 4th frame", "every 21st frame": the evaluation stride in words. */
function everyNth(n: number): string {
  if (n === 1) return 'every frame';
  const teen = n % 100 >= 11 && n % 100 <= 13;
  const suffix = teen ? 'th' : ({ 1: 'st', 2: 'nd', 3: 'rd' } as Record<number, string>)[n % 10] ?? 'th';
  return `every ${n}${suffix} frame`;
}
