/**
 * The fine-tune config of `POST /v1/fine-tunes` (PROTOCOL.md section 1): validation with a 400
 * naming the field, defaults filled in, and the dataset name resolved under the data root.
 */
import path from 'node:path';
import { PRESET_NAMES, makeConfig, resolvePreset, resolveStoredPreset } from '../../kernels/small/config.ts';
import { zeroGateRule } from '../../kernels/lora.ts';
import { RECIPE, defaultFinetune, defaultLora } from './recipes.ts';
import { loraAlphaProblem } from '../models/lora-limits.ts';
import { DEFAULT_BASES, isRealModel } from '../models/bases.ts';
import { validateAdamWOptions, type AdamWOptions } from '../../kernels/optim.ts';
import { HttpError } from '../http/http.ts';
import { log } from '../log.ts';
import { meant } from '../../protocol/resemble.ts';

export interface FineTuneConfig {
  /** A small preset (flow0-tiny, ...), or `pi0` / `pi05`: the real models (kernels/pi) on checkpoint `base`. */
  model: string;
  /** The real model's base checkpoint as the client named it (a Hub id or a folder); null for presets. */
  base: string | null;
  /**
   * The engine that holds the model (server/engine/model-key.ts): the preset, or `pi05@<folder>`
   * once the base is resolved to a local folder (at submission; in the job when it is downloaded
   * there). Absent: not resolved yet.
   */
  engine_model?: string;
  dataset_name: string;
  batch_size: number;
  /**
   * Datums per taped pass (issue 34): each step runs ceil(batch_size / m) forward_backward passes
   * of m datums (the last may be smaller) summed into one optimizer step. null: the memory plan
   * chooses (server/jobs/base.ts planFineTune; batch_size on a preset or when it fits at once).
   */
  micro_batch_size: number | null;
  /** What the memory plan chose at submission (a stored field; absent: not planned, e.g. a preset). */
  memory_plan?: MemoryPlanNote;
  learning_rate: number;
  steps: number;
  finetune: 'lora' | 'full';
  lora_rank: number;
  lora_alpha: number;
  /** The action expert's LoRA rank and alpha where they differ from lora_rank / lora_alpha (openpi's 32 / 32 on the real models); null: the same. */
  lora_action_rank: number | null;
  lora_action_alpha: number | null;
  targets: string[];
  cameras: string[] | null; // null: every camera of the dataset, up to the model's slots
  action_space: 'delta' | 'absolute' | null; // null: the dataset's default (MODEL.md)
  name: string | null;
  seed: number;
  eval_every: number; // steps between evaluations on held-out episodes (0 = only at the end)
  checkpoint_every: number; // steps between checkpoints (weights kept; the resumable state only the newest)
  // The held-out split (train.ts resolveSplit): a share of the episodes, named episodes, or a second dataset.
  eval_fraction: number; // share of episodes held out, in [0, 1); 0 with no eval_dataset = no evaluation
  eval_episodes: number[] | null; // these episodes held out instead of a seeded share
  eval_dataset: string | null; // evaluate on every episode of this dataset (name or path, as dataset_name)
  eval_stride: number; // score every eval_stride-th frame of each held-out episode
  // The optimizer and its schedule: linear warm-up to learning_rate, then cosine down to lr_floor * learning_rate.
  warmup_steps: number;
  lr_floor: number; // fraction of the peak learning rate at the last step, in [0, 1]
  adam_eps: number;
  weight_decay: number; // AdamW's decoupled decay (torch.optim.AdamW), per unit of learning rate
  ema_decay: number; // moving average of the weights, evaluated and exported; 0 = none (kernels/trainer.ts)
  augment: boolean; // random crop, rotation and colour jitter of training frames (datasets/augment.ts)
  time_sampling: 'beta' | 'uniform'; // flow-matching time distribution in training (kernels/flow.ts)
  rtc_max_delay: number; // training-time real-time chunking: a random delay 0..this per datum (kernels/rtc.ts); 0 = off
  /** A Hub model repo `namespace/name` the job uploads its model to once it succeeded (server/models/upload.ts); null: none. */
  push_to_hub: string | null;
}

/** The memory plan's choice of micro-batch for a fine-tune, as the job's events report it. */
export interface MemoryPlanNote {
  /** Datums per taped pass. */
  micro_batch_size: number;
  /** Why, in words: the estimates against what was available (server/jobs/base.ts planFineTune). */
  reason: string;
}

/** The job's AdamW settings besides its learning rate (openpi's defaults for pi0 fine-tunes). */
export const JOB_ADAMW: Omit<AdamWOptions, 'learningRate'> = { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 1e-10, gradClipNorm: 1 };

/** A Hub repo id `namespace/name` (the Hub's own limit: 96 characters a part). */
const HUB_MODEL_REPO = /^[A-Za-z0-9][A-Za-z0-9._-]{0,95}\/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$/;

const TARGETS = ['attn', 'mlp', 'action_expert', 'prefix_expert', 'all'];
/** The fields of a fine-tune request (PROTOCOL.md section 1); the sidecar's job_start takes them too. */
export const FIELDS = [
  'model', 'base', 'dataset_name', 'batch_size', 'micro_batch_size', 'learning_rate', 'steps', 'finetune', 'lora_rank', 'lora_alpha', 'targets', 'cameras', 'action_space', 'name', 'seed',
  'eval_every', 'checkpoint_every', 'eval_fraction', 'eval_episodes', 'eval_dataset', 'eval_stride', 'warmup_steps', 'lr_floor', 'adam_eps', 'weight_decay', 'ema_decay', 'augment', 'time_sampling', 'rtc_max_delay', 'push_to_hub',
];

/** Fields a stored config carries that a request does not give (filled in by this server). */
const STORED_FIELDS = ['engine_model', 'lora_action_rank', 'lora_action_alpha', 'memory_plan'];

/** The default recipe and fine-tune mode live in server/jobs/recipes.ts, one module for every surface. */
export { RECIPE, defaultFinetune } from './recipes.ts';

/** Warm-up when not given: a tenth of the run, at most 100 steps (openpi's shape). */
export function defaultWarmupSteps(steps: number): number {
  return Math.min(100, Math.max(1, Math.floor(steps / 10)));
}

/**
 * A 400 about one field: `${field} ${rule}, got ${value}`. `vela finetune` shows the same rule
 * beside the flag and value as the user typed them.
 */
export class FieldError extends HttpError {
  /** @param hint what to do instead, after the value (`field rule, got value: hint`). */
  constructor(readonly field: string, readonly rule: string, value: unknown, readonly hint?: string) {
    super(400, `${field} ${rule}, got ${showValue(value)}${hint ? `: ${hint}` : ''}`);
  }
}

/**
 * A request value as JSON for an error message: Infinity and NaN as themselves (JSON.stringify
 * would say null: `1e999` parses to Infinity), cut to `max` characters so a huge list cannot make
 * a huge error.
 */
export function showValue(value: unknown, max = 200): string {
  const text = JSON.stringify(value, (_k, v) => (typeof v === 'number' && !Number.isFinite(v) ? `\u0000${v}\u0000` : v)) ?? String(value);
  const shown = text.replace(/"\\u0000(-?Infinity|NaN)\\u0000"/g, '$1');
  return shown.length <= max ? shown : `${shown.slice(0, max)}... (${shown.length} characters)`;
}

/** A training session's (and the sidecar's) names for a fine-tune's fields, for "did you mean". */
const FIELD_ALIASES: Record<string, string> = { base_model: 'model', rank: 'lora_rank', alpha: 'lora_alpha', num_train_steps: 'steps' };

/** The settings of a LoRA fine-tune: refused on a full one. */
const LORA_FIELDS = ['lora_rank', 'lora_alpha', 'targets'] as const;

function bad(msg: string): never {
  throw new HttpError(400, msg);
}

function badField(field: string, rule: string, value: unknown, hint?: string): never {
  throw new FieldError(field, rule, value, hint);
}

function int(body: Record<string, unknown>, k: string, def: number, lo: number, hi: number): number {
  const v = body[k] ?? def;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < lo || v > hi) badField(k, `must be an integer in ${lo}..${hi}`, v);
  return v;
}

/** Default steps between evals and between checkpoints: a quarter of the run, at most 500. */
export function defaultInterval(steps: number): number {
  return Math.max(1, Math.min(500, Math.ceil(steps / 4)));
}

function bool(body: Record<string, unknown>, k: string, def: boolean): boolean {
  const v = body[k] ?? def;
  if (typeof v !== 'boolean') badField(k, 'must be true or false', v);
  return v;
}

/** A finite number in [lo, hi] (hiOpen: [lo, hi)). */
function real(body: Record<string, unknown>, k: string, def: number, lo: number, hi: number, hiOpen = false): number {
  const v = body[k] ?? def;
  if (typeof v !== 'number' || !Number.isFinite(v) || v < lo || v > hi || (hiOpen && v === hi)) badField(k, `must be a number in [${lo}, ${hi}${hiOpen ? ')' : ']'}`, v);
  return v;
}

/**
 * Validate a fine-tune body and fill defaults (RECIPE; `finetune` from defaultFinetune).
 * @param opts.trainedBase whether the engine's base weights are trained (default false: seeded).
 * @param opts.stored the body is a config this server stored (a queued job re-validated before it
 *   runs): its filled-in LoRA defaults on a full fine-tune are not the requester's.
 * @throws HttpError 400 naming the field that is wrong (FieldError for one field's value; a LoRA
 *   setting on a full fine-tune is one).
 */
export function parseFineTuneConfig(body: Record<string, unknown>, opts: { trainedBase?: boolean; stored?: boolean } = {}): FineTuneConfig {
  const known = opts.stored ? [...FIELDS, ...STORED_FIELDS] : FIELDS;
  for (const k of Object.keys(body)) if (!known.includes(k)) bad(`unknown field "${k}"${meant(k, FIELDS, FIELD_ALIASES)}; known fields: ${FIELDS.join(', ')}`);
  const modelName = body.model ?? RECIPE.model;
  // Bare pi0 / pi05 name the real models; a config stored before they did (it has no base) keeps
  // the small preset it meant (resolveStoredPreset: pi05 -> flow05-small).
  const realModel = isRealModel(modelName) && (!opts.stored || body.base != null);
  if (typeof modelName !== 'string' || !(realModel || PRESET_NAMES.includes(modelName) || (opts.stored && isRealModel(modelName)))) {
    badField('model', `must be one of pi0, pi05 (the real models, on a base checkpoint) or the presets ${PRESET_NAMES.join(', ')}`, modelName);
  }
  const model = realModel ? modelName : opts.stored ? resolveStoredPreset(modelName) : resolvePreset(modelName, (line) => log.warn(`fine-tune: ${line}`));
  const baseRef = body.base ?? null;
  if (baseRef !== null && !realModel) badField('base', `applies to model pi0 / pi05 (a checkpoint of the real models); ${model} is a preset with its own seeded weights`, baseRef);
  if (baseRef !== null && (typeof baseRef !== 'string' || baseRef.length === 0 || baseRef.length > 4096)) {
    badField('base', `must be a Hub id (e.g. ${DEFAULT_BASES[modelName as 'pi0' | 'pi05']}) or a checkpoint folder`, baseRef);
  }
  const base = realModel ? ((baseRef as string | null) ?? DEFAULT_BASES[modelName as 'pi0' | 'pi05']) : null;
  // A real model's base is a pretrained checkpoint: LoRA by default, as openpi's and Relay's fine-tunes.
  const trainedBase = realModel || (opts.trainedBase ?? false);
  const ds = body.dataset_name;
  const dsRule = 'a LeRobot dataset folder under the datasets root, e.g. "lerobot/pusht_image"';
  if (ds == null) bad(`dataset_name is required: ${dsRule}`);
  // Given but wrong is not missing: say what was sent.
  if (typeof ds !== 'string' || ds.length === 0 || ds.length > 512) badField('dataset_name', `must be ${dsRule} (a string of 1 to 512 characters)`, ds);
  const lr = body.learning_rate ?? RECIPE.learning_rate;
  if (typeof lr !== 'number' || !(lr > 0) || lr > 1) badField('learning_rate', 'must be > 0 and <= 1', lr);
  const finetune = body.finetune ?? defaultFinetune(trainedBase);
  if (finetune !== 'lora' && finetune !== 'full') badField('finetune', 'must be "lora" or "full"', finetune);
  // A request that names a LoRA setting wants LoRA: a full fine-tune would ignore it silently.
  // A stored config (re-validated before it runs) carries them as filled-in defaults.
  if (finetune === 'full' && !opts.stored) {
    const given = LORA_FIELDS.find((k) => body[k] != null);
    if (given) badField(given, 'applies to finetune "lora" only', body[given], `this fine-tune is "full"${body.finetune == null ? ' (the default on seeded base weights)' : ''}, which trains every weight; leave ${given} out, or add finetune "lora"`);
  }
  // recipes.ts defaultLora: openpi's ranks on the real models, 16 / 32 on a preset.
  const lora = defaultLora(realModel);
  const alpha = body.lora_alpha ?? lora.alpha;
  const alphaProblem = loraAlphaProblem(alpha);
  if (alphaProblem || typeof alpha !== 'number') badField('lora_alpha', alphaProblem ?? '', alpha);
  const targets = body.targets ?? ['all'];
  if (!Array.isArray(targets) || targets.length === 0 || !targets.every((t) => TARGETS.includes(t as string))) badField('targets', `must be a non-empty list of ${TARGETS.join(', ')}`, targets);
  // The engines' base weights are seeded unless trained ones are configured: pi0.5's gates are shut.
  const gateRule = finetune === 'lora' && !trainedBase && !opts.stored ? zeroGateRule(makeConfig(model), targets as string[]) : null;
  if (gateRule) badField('targets', gateRule, targets);
  const cameras = body.cameras ?? null;
  if (cameras !== null && (!Array.isArray(cameras) || cameras.length === 0 || !cameras.every((c) => typeof c === 'string' && c.length > 0))) badField('cameras', 'must be a non-empty list of camera names', cameras);
  const space = body.action_space ?? null;
  if (space !== null && space !== 'delta' && space !== 'absolute') badField('action_space', 'must be "delta" or "absolute"', space);
  const name = body.name ?? null;
  if (name !== null && (typeof name !== 'string' || name.length > 128)) badField('name', 'must be a string of at most 128 characters', name);
  const push = body.push_to_hub ?? null;
  if (push !== null && (typeof push !== 'string' || !HUB_MODEL_REPO.test(push))) badField('push_to_hub', 'must be a Hub model repo "namespace/name" (letters, digits, ".", "_", "-")', push);
  const steps = int(body, 'steps', RECIPE.steps, 1, 1_000_000);
  const timeSampling = body.time_sampling ?? RECIPE.time_sampling;
  if (timeSampling !== 'beta' && timeSampling !== 'uniform') badField('time_sampling', 'must be "beta" or "uniform"', timeSampling);
  const evalEpisodes = body.eval_episodes ?? null;
  if (evalEpisodes !== null && (!Array.isArray(evalEpisodes) || evalEpisodes.length === 0 || !evalEpisodes.every((e) => Number.isInteger(e) && e >= 0) || new Set(evalEpisodes).size !== evalEpisodes.length)) {
    badField('eval_episodes', 'must be a non-empty list of distinct episode indices', evalEpisodes);
  }
  const evalDataset = body.eval_dataset ?? null;
  if (evalDataset !== null && (typeof evalDataset !== 'string' || evalDataset.length === 0 || evalDataset.length > 512)) badField('eval_dataset', 'must be a dataset name or path', evalDataset);
  if (evalDataset !== null && evalEpisodes !== null) bad('give eval_episodes (held out of dataset_name) or eval_dataset (a second dataset), not both');
  if (evalDataset !== null && evalDataset === ds) badField('eval_dataset', 'must be a second dataset, not dataset_name (to score episodes of dataset_name, hold them out with eval_episodes or eval_fraction)', evalDataset);
  // A second dataset to evaluate on: train on every episode of the first unless told otherwise.
  const evalFraction = real(body, 'eval_fraction', evalDataset !== null || evalEpisodes !== null ? 0 : RECIPE.eval_fraction, 0, 1, true);
  if (evalEpisodes !== null && body.eval_fraction != null && evalFraction !== 0) bad(`give eval_episodes or eval_fraction, not both (eval_fraction ${evalFraction})`);
  if (evalDataset !== null && body.eval_fraction != null && evalFraction !== 0) bad(`give eval_dataset or eval_fraction, not both (eval_fraction ${evalFraction}): with eval_dataset every episode of dataset_name trains`);
  // AdamW divides by eps: a float32 above zero (validateAdamWOptions's rule, named as this field).
  const eps = body.adam_eps ?? RECIPE.adam_eps;
  if (typeof eps !== 'number' || !(eps >= 1.4e-45) || eps > 1) badField('adam_eps', 'must be a number in (0, 1], at least 1.4e-45 (the smallest float32)', eps);
  const adamw = { ...JOB_ADAMW, learningRate: lr, eps, weightDecay: real(body, 'weight_decay', RECIPE.weight_decay, 0, 1) };
  try {
    validateAdamWOptions(adamw); // the rules every optim_step follows
  } catch (e) {
    bad((e as Error).message);
  }
  // The expert's rank follows openpi's doubling unless the request set a rank for both (as sessions do).
  const storedInt = (k: string): number | null => {
    const v = body[k];
    if (v == null) return null;
    if (typeof v !== 'number' || !(v > 0) || !Number.isFinite(v)) badField(k, 'must be a number > 0', v);
    return v;
  };
  const actionRank = opts.stored ? storedInt('lora_action_rank') : realModel && finetune === 'lora' && body.lora_rank == null ? lora.action_rank : null;
  const actionAlpha = opts.stored ? storedInt('lora_action_alpha') : realModel && finetune === 'lora' && body.lora_rank == null && body.lora_alpha == null ? lora.action_alpha : null;
  const batchSize = int(body, 'batch_size', RECIPE.batch_size, 1, 1024);
  const micro = body.micro_batch_size == null ? null : int(body, 'micro_batch_size', batchSize, 1, batchSize);
  const plan = opts.stored ? body.memory_plan : undefined;
  if (plan != null && (typeof plan !== 'object' || !Number.isInteger((plan as MemoryPlanNote).micro_batch_size) || typeof (plan as MemoryPlanNote).reason !== 'string')) badField('memory_plan', 'must be {micro_batch_size, reason}', plan);
  const engineModel = body.engine_model;
  if (opts.stored && engineModel != null && typeof engineModel !== 'string') badField('engine_model', 'must be a string', engineModel);
  return {
    model,
    base,
    ...(opts.stored && typeof engineModel === 'string' ? { engine_model: engineModel } : realModel ? {} : { engine_model: model }),
    dataset_name: ds,
    batch_size: batchSize,
    micro_batch_size: micro,
    ...(plan != null ? { memory_plan: plan as MemoryPlanNote } : {}),
    learning_rate: lr,
    steps,
    finetune,
    lora_rank: int(body, 'lora_rank', lora.rank, 1, 256),
    lora_alpha: alpha,
    lora_action_rank: actionRank,
    lora_action_alpha: actionAlpha,
    targets: targets as string[],
    cameras: cameras as string[] | null,
    action_space: space,
    name: name as string | null,
    seed: int(body, 'seed', 0, 0, 2 ** 31 - 1),
    eval_every: int(body, 'eval_every', defaultInterval(steps), 0, 1_000_000),
    // The same default interval: every kept checkpoint has a held-out eval to choose it by.
    checkpoint_every: int(body, 'checkpoint_every', defaultInterval(steps), 1, 1_000_000),
    eval_fraction: evalFraction,
    eval_episodes: evalEpisodes as number[] | null,
    eval_dataset: evalDataset as string | null,
    eval_stride: int(body, 'eval_stride', RECIPE.eval_stride, 1, 10_000),
    // Warm-up reaches learning_rate by the last step at the latest: a longer one would never get there.
    warmup_steps: int(body, 'warmup_steps', defaultWarmupSteps(steps), 0, steps),
    lr_floor: real(body, 'lr_floor', RECIPE.lr_floor, 0, 1),
    adam_eps: adamw.eps,
    weight_decay: adamw.weightDecay,
    ema_decay: real(body, 'ema_decay', RECIPE.ema_decay, 0, 1, true),
    augment: bool(body, 'augment', RECIPE.augment),
    time_sampling: timeSampling as 'beta' | 'uniform',
    // Below the action horizon, which the dataset and model decide: the engine refuses more in one line when the job starts.
    rtc_max_delay: int(body, 'rtc_max_delay', 0, 0, 63),
    push_to_hub: push as string | null,
  };
}

/**
 * Resolve `dataset_name` (or `eval_dataset`, named by `field` in errors) under the datasets root: `lerobot/pusht_image` -> `<root>/lerobot/pusht_image`.
 * @throws HttpError 400 for `..` segments, or an absolute path the operator did not allow.
 */
export function resolveDatasetDir(name: string, root: string, allowAbsolute: boolean, field = 'dataset_name'): string {
  if (path.isAbsolute(name)) {
    if (!allowAbsolute) bad(`${field} "${name}" is an absolute path; the operator has not allowed that (--allow-absolute-datasets)`);
    return path.resolve(name);
  }
  const segments = name.split(/[\\/]/);
  if (segments.some((s) => s === '..' || s === '.' || s === '')) bad(`${field} "${name}" must be plain relative segments (no "..", ".", or empty parts)`);
  return path.resolve(root, ...segments);
}
