/**
 * What the policy server needs to know about a checkpoint, read from the engine's `load_policy`
 * answer (the checkpoint's config.json and norm_stats.json, PROTOCOL.md section 4), laid out for
 * the engine's model (server/models/layout.ts: a small preset's, or the real pi0 / pi0.5's
 * three 224 px slots and PaliGemma prompt).
 *
 * config.json fields read here (others are ignored):
 * - `preset` (required): the model preset; must be the engine's (`pi0` / `pi05` on a real
 *   engine).
 * - `cameras` (required): camera names bound to image slots 0, 1, ... (short `cam_high` or full
 *   `observation.images.cam_high` names).
 * - `action_horizon`: action steps answered (default the model's horizon).
 * - `action_dim` (else `action_names.length`, else the stats' length, else the model's): the
 *   dataset's action dimensions, which the answer is trimmed to.
 * - `state_dim` (else `state_names.length`, else the stats' length): the dataset's state size;
 *   when unknown, any state up to the model's state_dim is accepted.
 * - `action_space`: `delta` or `absolute` (default). For `delta`, `delta_mask` (booleans per
 *   action dimension), else the mask from `state_names` / `action_names` (MODEL.md).
 * - `num_steps`: Euler steps of sampling (default 10).
 * - `rtc_max_delay`: trained with training-time real-time chunking up to this delay (default 0:
 *   not); such a policy serves RTC requests in `prefix` mode (server/policy/rtc.ts).
 */
import { resolveStoredPreset } from '../../kernels/small/config.ts';
import { deltaMaskFromNames, normalizerFor, normalizerOf, parseNormStats, type NormConvention, type NormMode, type NormStatsSet, type Normalizer } from '../../kernels/normalize.ts';
import type { EngineInfo } from '../engine/messages.ts';
import type { ModelLayout } from '../models/layout.ts';

/** A checkpoint that the policy server cannot serve; the message names the field. */
export class PolicyConfigError extends Error {
  readonly code = 'bad_checkpoint';
  constructor(message: string) {
    super(message);
    this.name = 'PolicyConfigError';
  }
}

/** The served policy's shapes and transforms. */
export interface PolicyMeta {
  /** The model's name: a small preset, or `pi0` / `pi05` (the real models). */
  preset: string;
  /** The engine's model layout (sizes, and the real family's prompt encoder), for makeBatch. */
  model: ModelLayout;
  cameras: string[];
  actionHorizon: number; // <= model.horizon
  actionDim: number; // dataset action dims, <= model.actionDim
  stateDim: number | null; // dataset state dims, <= model.stateDim; null = unknown
  stateNames: string[] | null; // the dataset's names of the state dims, when the checkpoint has them
  actionNames: string[] | null;
  actionSpace: 'delta' | 'absolute';
  deltaMask: boolean[]; // length actionDim; all false for absolute
  norm: { normalizer: Normalizer; stats: NormStatsSet } | null;
  numSteps: number;
  /** The checkpoint's training-time RTC delay bound (config.json rtc_max_delay); 0 = trained without. */
  rtcMaxDelay: number;
}

function bad(message: string): never {
  throw new PolicyConfigError(`checkpoint config.json: ${message}`);
}

function count(cfg: Record<string, unknown>, key: string, lo: number, hi: number): number | undefined {
  const v = cfg[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < lo || v > hi) bad(`${key} is ${JSON.stringify(v)}; expected an integer in ${lo}..${hi}`);
  return v;
}

function names(cfg: Record<string, unknown>, key: string): string[] | undefined {
  const v = cfg[key];
  if (v === undefined || v === null) return undefined;
  if (!Array.isArray(v) || !v.every((x) => typeof x === 'string')) bad(`${key} must be a list of strings; got ${JSON.stringify(v)}`);
  return v as string[];
}

/**
 * The base preset of an engine's or checkpoint's preset name (`flow0-tiny+custom` -> `flow0-tiny`);
 * a checkpoint written before issue 23 names the preset by its old name (`flow0-tiny`, or bare `pi0`
 * for flow0-small), which resolves as it did then.
 */
function basePreset(name: string): string {
  return resolveStoredPreset(name.replace(/\+custom$/, ''));
}

/** A small preset's layout, from the engine's sizes (byte prompts need no tokenizer, so no await). */
function smallLayout(info: EngineInfo): ModelLayout {
  return {
    family: 'small', slots: info.imageSlots, imageSize: info.imageSize, maxTokenLen: info.maxTokenLen, stateDim: info.stateDim,
    horizon: info.actionHorizon, actionDim: info.actionDim, padToken: info.padToken, tokenizerFile: null,
  };
}

/** What else shapes a policy's meta besides its config and stats. */
export interface MetaOptions {
  /** The engine's layout (modelLayout(info)); required for the real family, whose prompt needs the tokenizer. */
  layout?: ModelLayout;
  /** The transform the stats were made for; default the family's (pi0 z-score, pi0.5 quantile). */
  normMode?: NormMode | null;
  /** Whose arithmetic applies them (the stats file's: LeRobot's or openpi's) and LeRobot's eps; default openpi's. */
  normConvention?: { convention: NormConvention; eps: number };
}

/**
 * Builds the policy's meta from a checkpoint config and stats, against the engine's model sizes.
 * @throws PolicyConfigError naming the field that is missing or out of range; Error when a real
 *   engine's layout is not given.
 */
export function policyMeta(info: EngineInfo, config: unknown, normStats: unknown, opts: MetaOptions = {}): PolicyMeta {
  if (config === null || typeof config !== 'object' || Array.isArray(config)) bad(`expected an object; got ${JSON.stringify(config)}`);
  const cfg = config as Record<string, unknown>;
  if (typeof cfg.preset !== 'string') bad(`preset is ${JSON.stringify(cfg.preset)}; expected a preset name`);
  const real = (info.family ?? 'small') !== 'small';
  let preset: string;
  if (real) {
    // On a real engine, pi0 / pi05 name the real model (the checkpoint's base_checkpoint chose this engine).
    if (cfg.preset !== info.family) bad(`preset is ${cfg.preset} but the engine runs the real ${info.family}`);
    preset = info.family;
  } else {
    try {
      preset = basePreset(cfg.preset);
    } catch (e) {
      bad((e as Error).message);
    }
    if (preset !== basePreset(info.preset)) bad(`preset is ${cfg.preset} but the engine runs ${info.preset}`);
  }
  if (real && !opts.layout) throw new Error(`policyMeta: the real ${info.family} needs its layout (modelLayout(engine.info))`);
  const model = opts.layout ?? smallLayout(info);
  const cameras = names(cfg, 'cameras') ?? bad('cameras is missing: the checkpoint must bind camera names to image slots');
  if (cameras.length === 0 || cameras.length > model.slots) bad(`cameras has ${cameras.length} names; the model has ${model.slots} image slots`);
  if (new Set(cameras.map(shortCamera)).size !== cameras.length) bad(`cameras ${JSON.stringify(cameras)} has a name twice`);
  const stats = normStats === null || normStats === undefined ? null : parseNormStats(normStats);
  const actionNames = names(cfg, 'action_names');
  const stateNames = names(cfg, 'state_names');
  const actionDim = count(cfg, 'action_dim', 1, model.actionDim) ?? actionNames?.length ?? stats?.actions.mean.length ?? model.actionDim;
  if (actionDim < 1 || actionDim > model.actionDim) bad(`the dataset has ${actionDim} action dims; the model has ${model.actionDim}`);
  const stateDim = count(cfg, 'state_dim', 0, model.stateDim) ?? stateNames?.length ?? stats?.state.mean.length ?? null;
  if (stateDim !== null && stateDim > model.stateDim) bad(`the dataset has ${stateDim} state dims; the model has ${model.stateDim}`);
  if (stats && stats.actions.mean.length < actionDim) bad(`norm_stats.json has ${stats.actions.mean.length} action dims; the dataset has ${actionDim}`);
  if (stats && stateDim !== null && stats.state.mean.length < stateDim) bad(`norm_stats.json has ${stats.state.mean.length} state dims; the dataset has ${stateDim}`);
  const space = cfg.action_space ?? 'absolute';
  if (space !== 'delta' && space !== 'absolute') bad(`action_space is ${JSON.stringify(space)}; expected "delta" or "absolute"`);
  let deltaMask: boolean[] = new Array(actionDim).fill(false);
  if (space === 'delta') {
    const given = cfg.delta_mask;
    if (Array.isArray(given)) {
      if (!given.every((x) => typeof x === 'boolean') || given.length > actionDim) bad(`delta_mask must be at most ${actionDim} booleans; got ${JSON.stringify(given)}`);
      deltaMask = deltaMask.map((_, i) => given[i] === true);
    } else if (stateNames && actionNames) {
      const m = deltaMaskFromNames(stateNames, actionNames);
      deltaMask = deltaMask.map((_, i) => m[i] === true);
    } else bad('action_space is "delta" but neither delta_mask nor state_names and action_names say which dimensions are deltas');
    const last = deltaMask.lastIndexOf(true);
    if (stateDim !== null && last >= stateDim) bad(`delta_mask marks action dim ${last}; the state has ${stateDim} dims`);
  }
  const horizon = count(cfg, 'action_horizon', 1, model.horizon) ?? model.horizon;
  const numSteps = count(cfg, 'num_steps', 1, 1000) ?? 10;
  const rtcMaxDelay = count(cfg, 'rtc_max_delay', 0, model.horizon) ?? 0;
  return {
    preset, model, cameras, actionHorizon: horizon, actionDim, stateDim, stateNames: stateNames ?? null, actionNames: actionNames ?? null, actionSpace: space, deltaMask,
    norm: stats ? { normalizer: normalizerOf(opts.normMode ?? normalizerFor(preset).mode, opts.normConvention?.convention, opts.normConvention?.eps), stats } : null, numSteps, rtcMaxDelay,
  };
}

/** A camera's short name: `observation.images.cam_high` -> `cam_high`. */
export function shortCamera(name: string): string {
  return name.startsWith('observation.images.') ? name.slice('observation.images.'.length) : name;
}
