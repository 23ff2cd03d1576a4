/**
 * What the policy server needs to know about a checkpoint, read from the engine's `load_policy`
 * answer (the checkpoint's config.json and norm_stats.json, PROTOCOL.md section 4).
 *
 * config.json fields read here (others are ignored):
 * - `preset` (required): the model preset; must be the engine's.
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
 */
import { makeConfig, resolveStoredPreset, type PolicyConfig } from '../../kernels/small/config.ts';
import { deltaMaskFromNames, normalizerFor, parseNormStats, type NormStatsSet, type Normalizer } from '../../kernels/normalize.ts';
import type { EngineInfo } from '../engine/messages.ts';

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
  preset: string;
  /** The model's config (sizes from the engine), for makeBatch. */
  model: PolicyConfig;
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

/**
 * Builds the policy's meta from a checkpoint config and stats, against the engine's model sizes.
 * @throws PolicyConfigError naming the field that is missing or out of range.
 */
export function policyMeta(info: EngineInfo, config: unknown, normStats: unknown): PolicyMeta {
  if (config === null || typeof config !== 'object' || Array.isArray(config)) bad(`expected an object; got ${JSON.stringify(config)}`);
  const cfg = config as Record<string, unknown>;
  if (typeof cfg.preset !== 'string') bad(`preset is ${JSON.stringify(cfg.preset)}; expected a preset name`);
  let preset: string;
  try {
    preset = basePreset(cfg.preset);
  } catch (e) {
    bad((e as Error).message);
  }
  if (preset !== basePreset(info.preset)) bad(`preset is ${cfg.preset} but the engine runs ${info.preset}`);
  const model = makeConfig(preset, {
    imageSize: info.imageSize, slots: info.imageSlots, stateDim: info.stateDim, actionDim: info.actionDim, horizon: info.actionHorizon, maxTokenLen: info.maxTokenLen,
  });
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
  return {
    preset, model, cameras, actionHorizon: horizon, actionDim, stateDim, stateNames: stateNames ?? null, actionNames: actionNames ?? null, actionSpace: space, deltaMask,
    norm: stats ? { normalizer: normalizerFor(preset), stats } : null, numSteps,
  };
}

/** A camera's short name: `observation.images.cam_high` -> `cam_high`. */
export function shortCamera(name: string): string {
  return name.startsWith('observation.images.') ? name.slice('observation.images.'.length) : name;
}
