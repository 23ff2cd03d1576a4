/**
 * A fine-tune's model before its engine starts: the shape a dataset must fit (a small preset's
 * sizes, or the real pi0 / pi0.5 read from its base checkpoint's config.json), the base resolved
 * to a local folder, and whether a dataset fits a base that was itself fine-tuned (it carries the
 * dataset's norm stats and feature shapes, and Vela's `vela_dataset.json` its names).
 */
import fs from 'node:fs';
import path from 'node:path';
import { makeConfig } from '../../kernels/small/config.ts';
import { realPiConfigFromHub } from '../../kernels/pi/config.ts';
import { parseNormStats } from '../../kernels/normalize.ts';
import { readHubConfig } from '../models/hub-checkpoint.ts';
import { realModelKey } from '../engine/model-key.ts';
import { isRealModel } from '../models/bases.ts';
import { resolveBase } from '../models/resolve.ts';
import { INSUFFICIENT_MEMORY, planOrRefuse, realConfigOf } from '../models/plan.ts';
import { availableMemory, bytesHuman, checkFits, memoryLedger } from '../models/memory.ts';
import type { MemoryEstimate } from '../../kernels/pi/memory.ts';
import { estimatePassMemory } from '../../kernels/small/memory.ts';
import { HttpError } from '../http/http.ts';
import type { Dataset } from '../datasets/index.ts';
import type { FineTuneConfig, MemoryPlanNote } from './config.ts';

/** What the dataset must fit: image slots, state and action dims (the model pads to them), chunk. */
export interface JobModelShape {
  /** As messages name the model: the preset, or `pi05 (base lerobot/pi05_base)`. */
  name: string;
  slots: number;
  stateDim: number;
  actionDim: number;
  horizon: number;
  imageSize: number;
}

/** The file a Vela fine-tune writes beside a Hub-layout output: the dataset it was trained on. */
export const VELA_DATASET_FILE = 'vela_dataset.json';

/** The engine model of a parsed config: the preset, or the real variant at its resolved base folder. */
export function engineModelOf(cfg: Pick<FineTuneConfig, 'model' | 'engine_model'>): string {
  if (cfg.engine_model) return cfg.engine_model;
  if (isRealModel(cfg.model)) throw new Error(`the base of ${cfg.model} is not resolved to a folder yet`);
  return cfg.model;
}

/**
 * The engine model of a stored job's config, for serving its policy: the one resolved when it
 * was accepted, else (a base the job downloaded) its base looked up again in the cache;
 * `modelsDir` (the server's --models-dir) is what a relative `base` is under (none: the CLI's cwd).
 * @throws ModelError when a real model's base is no longer there.
 */
export async function storedEngineModel(config: Record<string, unknown>, modelsDir?: string): Promise<string> {
  if (typeof config.engine_model === 'string') return config.engine_model;
  if (isRealModel(config.model) && typeof config.base === 'string') return realModelKey(config.model, (await resolveBase(config.base, { modelsDir, cwdRelative: modelsDir === undefined })).dir);
  return String(config.model);
}

/** `realModelKey` of a real config's variant at `dir`. */
export function realEngineModel(cfg: Pick<FineTuneConfig, 'model'>, dir: string): string {
  return realModelKey(cfg.model as 'pi0' | 'pi05', dir);
}

/**
 * The shape of a config's model: a preset's PolicyConfig, or the base folder's config.json
 * (`baseDir`, required for the real models).
 * @throws CheckpointError / ConfigError naming the base's config.json when it cannot be read.
 */
export async function jobModelShape(cfg: Pick<FineTuneConfig, 'model' | 'base'>, baseDir?: string): Promise<JobModelShape> {
  if (!isRealModel(cfg.model) || !cfg.base) {
    const m = makeConfig(cfg.model);
    return { name: cfg.model, slots: m.slots, stateDim: m.stateDim, actionDim: m.actionDim, horizon: m.horizon, imageSize: m.imageSize };
  }
  if (!baseDir) throw new Error(`the base of ${cfg.model} is not resolved to a folder yet`);
  const c = realPiConfigFromHub(await readHubConfig(baseDir));
  return { name: `${cfg.model} (base ${cfg.base})`, slots: 3, stateDim: c.stateDim, actionDim: c.actionDim, horizon: c.actionHorizon, imageSize: c.vision.imageSize };
}

/** What a fine-tuned base says about the data it was trained on (each field where it says it). */
interface BaseData {
  stateDim?: { n: number; from: string };
  actionDim?: { n: number; from: string };
  stateNames?: string[] | null;
  actionNames?: string[] | null;
}

function featureDim(features: unknown, key: string): number | undefined {
  const f = (features as Record<string, { shape?: unknown }> | undefined)?.[key];
  return Array.isArray(f?.shape) && typeof f.shape[0] === 'number' ? f.shape[0] : undefined;
}

/**
 * The data a base folder was fine-tuned on, or null for a pretrained base (no norm stats of its
 * own: its config.json's feature shapes are then the padded maxima, not a dataset's).
 */
function baseData(dir: string, config: Record<string, unknown>): BaseData | null {
  const statsFile = path.join(dir, 'norm_stats.json');
  const dataFile = path.join(dir, VELA_DATASET_FILE);
  const hasStats = fs.existsSync(statsFile);
  if (!hasStats && !fs.existsSync(dataFile)) return null;
  const out: BaseData = {};
  const state = featureDim(config.input_features, 'observation.state');
  const action = featureDim(config.output_features, 'action');
  if (state !== undefined) out.stateDim = { n: state, from: 'config.json input_features' };
  if (action !== undefined) out.actionDim = { n: action, from: 'config.json output_features' };
  if (hasStats) {
    try {
      const s = parseNormStats(fs.readFileSync(statsFile, 'utf8'));
      out.stateDim = { n: s.state.mean.length, from: 'norm_stats.json' };
      out.actionDim = { n: s.actions.mean.length, from: 'norm_stats.json' };
    } catch {
      // Unreadable stats do not decide the fit; the shapes in config.json still do.
    }
  }
  try {
    const d = JSON.parse(fs.readFileSync(dataFile, 'utf8')) as { state_names?: string[] | null; action_names?: string[] | null };
    out.stateNames = d.state_names ?? null;
    out.actionNames = d.action_names ?? null;
  } catch {
    // No names recorded: dims alone decide.
  }
  return out;
}

/**
 * Why dataset `name` cannot fine-tune the model, or null when it fits: more state or action
 * dims than the model takes; on a base that was itself fine-tuned, other dims or names than its
 * data's (its norm stats and the meaning of each dim would not carry over).
 */
export async function datasetMisfit(meta: Dataset['meta'], name: string, shape: JobModelShape, baseDir?: string, baseRef?: string | null): Promise<string | null> {
  if (meta.stateDim > shape.stateDim) {
    return `dataset "${name}" has ${meta.stateDim} state dims (observation.state); ${shape.name} takes at most ${shape.stateDim}: use a dataset (or a copy of it) with at most ${shape.stateDim} state dims`;
  }
  if (meta.actionDim > shape.actionDim) {
    return `dataset "${name}" has ${meta.actionDim} action dims; ${shape.name} takes at most ${shape.actionDim}: use a dataset (or a copy of it) with at most ${shape.actionDim} action dims`;
  }
  if (!baseDir) return null;
  const data = baseData(baseDir, await readHubConfig(baseDir));
  if (!data) return null;
  const fix = `fine-tune from the pretrained base it came from (e.g. lerobot/pi05_base) instead, or on data with the same features`;
  const which = `base ${baseRef ?? baseDir} was fine-tuned on`;
  if (data.stateDim && data.stateDim.n !== meta.stateDim) return `dataset "${name}" has ${meta.stateDim} state dims; ${which} ${data.stateDim.n} (${data.stateDim.from}): ${fix}`;
  if (data.actionDim && data.actionDim.n !== meta.actionDim) return `dataset "${name}" has ${meta.actionDim} action dims; ${which} ${data.actionDim.n} (${data.actionDim.from}): ${fix}`;
  const differ = (a: string[] | null | undefined, b: string[] | null) => a != null && b != null && JSON.stringify(a) !== JSON.stringify(b);
  if (differ(data.stateNames, meta.stateNames)) return `dataset "${name}" names its state dims ${JSON.stringify(meta.stateNames)}; ${which} ${JSON.stringify(data.stateNames)} (${VELA_DATASET_FILE}): ${fix}`;
  if (differ(data.actionNames, meta.actionNames)) return `dataset "${name}" names its action dims ${JSON.stringify(meta.actionNames)}; ${which} ${JSON.stringify(data.actionNames)} (${VELA_DATASET_FILE}): ${fix}`;
  return null;
}

/**
 * Micro-batch sizes to try for a step of `batch` datums, largest first: batch itself, then its
 * divisors and the powers of two below it (a divisor splits evenly; a power of two is what a
 * user would pick), down to 1. Example: 12 -> 12, 8, 6, 4, 3, 2, 1.
 */
export function microBatchCandidates(batch: number): number[] {
  const out = new Set<number>([batch]);
  for (let m = batch - 1; m >= 1; m--) if (batch % m === 0 || (m & (m - 1)) === 0) out.add(m);
  return [...out];
}

/**
 * Memory planning of a fine-tune on a real base (server/models/plan.ts): the base (unless an
 * engine holds it), the job's own state and one taped pass at its cameras (all three slots when
 * the dataset's are not known yet). The pass is one micro-batch (issue 34): micro_batch_size when
 * the request gives it, else the largest of microBatchCandidates(batch_size) whose plan fits:
 * each step then accumulates ceil(batch_size / m) passes into one optimizer step (train.ts), and
 * the memory of a step is that of one pass of m. The choice and why are set on
 * `cfg.memory_plan` (stored with the job; its events report it). The server's submission, the
 * runner (after a base it downloaded) and `vela finetune` call it before anything loads.
 * @throws HttpError 507 with the one-line estimate and fix when even the smallest micro-batch
 *   (1, or micro_batch_size when given) does not fit.
 */
export async function planFineTune(cfg: FineTuneConfig, baseDir: string, opts: { weightsLoaded?: boolean | (() => boolean); maxMemory?: string; capName?: string } = {}): Promise<MemoryPlanNote> {
  const finetune = cfg.finetune === 'full' ? 'full' : 'lora';
  const config = await realConfigOf(baseDir);
  const B = cfg.batch_size;
  const what = (m: number) => `a ${finetune === 'full' ? 'full' : 'LoRA'} fine-tune of ${cfg.model} (${cfg.base}) at batch_size ${B}${m < B ? ` in micro-batches of ${m}` : ''}`;
  const at = (m: number) => planOrRefuse(
    config,
    { use: finetune, batch: m, cameras: Math.min(3, cfg.cameras?.length || 3), loraRank: cfg.lora_rank, loraActionRank: cfg.lora_action_rank ?? cfg.lora_rank, loraTargets: cfg.targets },
    { weights: () => !(typeof opts.weightsLoaded === 'function' ? opts.weightsLoaded() : opts.weightsLoaded), tenant: true, pass: true },
    what(m),
    opts.maxMemory,
    opts.capName,
  );
  const note = await chooseMicroBatch(cfg, async (m) => {
    const r = await at(m);
    return { totalBytes: r.counted.totalBytes, availableBytes: r.available.bytes };
  });
  cfg.memory_plan = note;
  return note;
}

/**
 * The micro-batch of a fine-tune (issue 34): micro_batch_size when given (planned as it is), else
 * the largest of microBatchCandidates(batch_size) for which `fits` resolves, with the reason in
 * words. `fits(m)` resolves the plan of a pass of m (its estimate and what was available) or
 * throws its 507.
 * @throws the 507 of the smallest micro-batch tried (1, or the one given), its fix for a given
 *   one spelled as micro_batch_size; any other error of `fits` at once.
 */
async function chooseMicroBatch(cfg: FineTuneConfig, fits: (m: number) => Promise<{ totalBytes: number; availableBytes: number }>): Promise<MemoryPlanNote> {
  const B = cfg.batch_size;
  const needs = (r: { totalBytes: number; availableBytes: number }) => `needs about ${bytesHuman(r.totalBytes)} of ${bytesHuman(r.availableBytes)} available`;
  if (cfg.micro_batch_size != null) {
    const m = cfg.micro_batch_size;
    const r = await fits(m).catch((e) => {
      // Forced: the fix is a smaller micro-batch (or the plan's own), not a smaller batch.
      if (e instanceof HttpError && e.status === INSUFFICIENT_MEMORY && m > 1) throw new HttpError(e.status, e.message.replace('lower batch_size', 'lower micro_batch_size (or leave it out: the plan chooses one that fits)'));
      throw e;
    });
    return { micro_batch_size: m, reason: `micro_batch_size ${m} as requested: a pass of ${m} ${needs(r)}` };
  }
  let whole: string | null = null;
  for (const m of microBatchCandidates(B)) {
    try {
      const r = await fits(m);
      return { micro_batch_size: m, reason: m === B ? `the whole batch fits at once: a pass of ${B} ${needs(r)}` : `${whole}; a pass of ${m} ${needs(r)}` };
    } catch (e) {
      if (!(e instanceof HttpError) || e.status !== INSUFFICIENT_MEMORY || m === 1) throw e;
      // The whole batch's line, said once: the reason for splitting it.
      whole ??= `batch_size ${B} at once does not fit (${e.message.replace(/^.*? needs about /, 'needs about ').replace(/: [^:]*$/, '')})`;
    }
  }
  throw new Error('unreachable: micro-batch 1 is always tried last');
}

/**
 * Memory planning of a fine-tune on a small preset: one pass's tape at its micro-batch (chosen
 * as on the real models, chooseMicroBatch; batch_size 1 to 1,024) and cameras
 * (kernels/small/memory.ts estimatePassMemory; flow0-small holds ~0.6 GB per datum) against what
 * the process may still use (reservations counted, none taken). Sets `cfg.memory_plan`.
 * @throws HttpError 507 with the one-line estimate and fix when micro-batches of 1 (or the given
 *   micro_batch_size) do not fit.
 */
export async function planPresetFineTune(cfg: FineTuneConfig, opts: { maxMemory?: string; capName?: string } = {}): Promise<MemoryPlanNote> {
  const c = makeConfig(cfg.model);
  const B = cfg.batch_size;
  const available = memoryLedger.less(await availableMemory({ maxMemory: opts.maxMemory, capName: opts.capName ?? '--max-memory' }));
  const note = await chooseMicroBatch(cfg, async (m) => {
    const estimate: MemoryEstimate = estimatePassMemory(c, m, Math.min(c.slots, cfg.cameras?.length || c.slots));
    const why = checkFits(estimate, available, `a fine-tune of ${c.preset} at batch_size ${B}${m < B ? ` in micro-batches of ${m}` : ''}`, { batch: m, use: 'lora' });
    if (why) throw new HttpError(INSUFFICIENT_MEMORY, why);
    return { totalBytes: estimate.totalBytes, availableBytes: available.bytes };
  });
  cfg.memory_plan = note;
  return note;
}
