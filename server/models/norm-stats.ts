/**
 * A checkpoint folder's own normalisation statistics (FACTS.md sections 2.1 and 4), read from
 * whichever layout the folder has, in this order:
 *
 * 1. LeRobot's processor files: `policy_preprocessor.json` names a `normalizer_processor` step
 *    whose `state_file` (`policy_preprocessor_step_<i>_normalizer_processor.safetensors`; the
 *    index depends on the pipeline, so it is read from the JSON, never guessed) holds float32
 *    tensors `<feature>.<stat>` in the feature's native dims (`observation.state.mean`,
 *    `action.q99`, ...). The step's `norm_map` gives the mode: MEAN_STD -> zscore, QUANTILES ->
 *    quantile. Action stats missing there are read from `policy_postprocessor.json`'s
 *    `unnormalizer_processor` step. A base checkpoint (`lerobot/pi05_base`) has an empty
 *    `features` map and no state file: no stats (null).
 * 2. openpi's `assets/<asset_id>/norm_stats.json` (one asset id, or the one asked for).
 * 3. Vela's `norm_stats.json` at the folder root (openpi's JSON layout, kernels/normalize.ts).
 *
 * openpi's and Vela's JSON do not say which transform they are for: the mode then comes from
 * the caller, else from the folder's `config.json` (LeRobot's `normalization_mapping` or
 * `type`, Vela's `preset`).
 *
 * The transform's arithmetic follows the file (kernels/normalize.ts NormConvention): LeRobot's for
 * LeRobot's processor files (eps from the normalizer step, std + eps one way and std back, no eps
 * on a quantile range), openpi's for openpi's assets and Vela's norm_stats.json. The stats are the
 * same numbers either way, but at a std of 0.08 the two z-scores differ by ~1.2e-5 relative. Vela's
 * own outputs carry both layouts from one set of stats and were trained with openpi's arithmetic:
 * the norm_stats.json beside the LeRobot files marks them.
 */
import { randomBytes } from 'node:crypto';
import { open, readdir, readFile, rename, rm } from 'node:fs/promises';
import path from 'node:path';
import { CheckpointError, decodeSafetensors, encodeSafetensors, type SafeTensor } from '../../kernels/safetensors.ts';
import { LEROBOT_NORM_EPS, NormError, normalizerFor, type NormConvention, normStatsToJson, parseNormStats, validateNormStats, type NormMode, type NormStats, type NormStatsSet } from '../../kernels/normalize.ts';

export const LEROBOT_PREPROCESSOR = 'policy_preprocessor.json';
export const LEROBOT_POSTPROCESSOR = 'policy_postprocessor.json';
/** LeRobot's file name for a step's state: `<pipeline>_step_<index>_<registry name>.safetensors`. */
export const LEROBOT_NORMALIZER_FILE = 'policy_preprocessor_step_0_normalizer_processor.safetensors';
export const LEROBOT_UNNORMALIZER_FILE = 'policy_postprocessor_step_0_unnormalizer_processor.safetensors';
export const VELA_NORM_STATS = 'norm_stats.json';
/** LeRobot's feature keys of the robot state and the actions. */
export const LEROBOT_STATE_KEY = 'observation.state';
export const LEROBOT_ACTION_KEY = 'action';

/** The z-value of the 1% / 99% quantiles of a normal distribution (filling missing stats). */
const Z99 = 2.3263478740408408;
const MODE_OF_LEROBOT: Record<string, NormMode> = { MEAN_STD: 'zscore', QUANTILES: 'quantile' };
const LEROBOT_OF_MODE: Record<NormMode, string> = { zscore: 'MEAN_STD', quantile: 'QUANTILES' };

/** What readCheckpointNormStats found. */
export interface CheckpointNormStats {
  /** Stats in the robot's native dims (not padded to the model's 32). */
  stats: NormStatsSet;
  mode: NormMode;
  /** The file the stats came from, relative to the folder (`assets/droid/norm_stats.json`). */
  source: string;
  /** Stats that the file lacked and were filled (see readCheckpointNormStats), e.g. `state.q01`. */
  filled: string[];
  /** Whose arithmetic applies them: 'lerobot' for LeRobot's processor files, else 'openpi'. */
  convention: NormConvention;
  /** LeRobot's eps (the normalizer step's `eps`, 1e-8 by default); openpi's is fixed (1e-6). */
  eps: number;
}

export interface ReadNormStatsOptions {
  /** openpi's asset id, when the folder has several `assets/<id>/norm_stats.json`. */
  assetId?: string;
  /** The mode for JSON stats (openpi's, Vela's), which do not record it; else from config.json. */
  mode?: NormMode;
}

function badConfig(file: string, problem: string): never {
  throw new CheckpointError('bad_config', `${file}: ${problem}`);
}

async function readIfExists(file: string): Promise<Buffer | null> {
  try {
    return await readFile(file);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT' || code === 'ENOTDIR') return null;
    throw new CheckpointError('io', `reading ${file}: ${(err as Error).message}`);
  }
}

async function readJson(dir: string, rel: string): Promise<unknown | null> {
  const bytes = await readIfExists(path.join(dir, rel));
  if (bytes === null) return null;
  try {
    return JSON.parse(bytes.toString('utf8'));
  } catch (err) {
    return badConfig(rel, `not JSON (${(err as Error).message})`);
  }
}

interface LerobotStep {
  registry_name?: string;
  config?: { eps?: unknown; features?: Record<string, { type?: string; shape?: number[] }>; norm_map?: Record<string, string> };
  state_file?: string;
}

/** The step of a LeRobot pipeline JSON registered as `registry`, or null. */
function findStep(json: unknown, rel: string, registry: string): LerobotStep | null {
  const steps = (json as { steps?: unknown } | null)?.steps;
  if (!Array.isArray(steps)) badConfig(rel, 'has no "steps" list; expected a LeRobot processor pipeline');
  return (steps as LerobotStep[]).find((s) => s && s.registry_name === registry) ?? null;
}

/** The feature key of a type (STATE / ACTION) in a step's `features`, else LeRobot's usual key. */
function featureKey(step: LerobotStep, type: string, fallback: string): string {
  const entries = Object.entries(step.config?.features ?? {});
  return entries.find(([, f]) => f?.type === type)?.[0] ?? fallback;
}

/** The mode of a step's norm_map for STATE and ACTION, which must agree and be one Vela has. */
function stepMode(step: LerobotStep, rel: string): NormMode | null {
  const map = step.config?.norm_map ?? {};
  const state = map.STATE ?? 'IDENTITY';
  const action = map.ACTION ?? 'IDENTITY';
  if (state === 'IDENTITY' && action === 'IDENTITY') return null;
  if (state !== action) badConfig(rel, `norm_map normalises STATE with ${state} and ACTION with ${action}; Vela applies one mode to both (MEAN_STD or QUANTILES)`);
  const mode = MODE_OF_LEROBOT[state];
  if (!mode) badConfig(rel, `norm_map mode ${state} is not supported; Vela serves MEAN_STD (zscore) and QUANTILES (quantile)`);
  return mode;
}

/** Tensors `<key>.<stat>` of a step's state file, as plain number arrays by stat. */
async function readStateFile(dir: string, file: string, rel: string): Promise<Map<string, Record<string, number[]>>> {
  if (path.basename(file) !== file) badConfig(rel, `state_file ${JSON.stringify(file)} is not a plain file name`);
  const bytes = await readIfExists(path.join(dir, file));
  if (bytes === null) throw new CheckpointError('missing_file', `${rel} names state_file ${file}, which is not in the folder`);
  let content;
  try {
    content = decodeSafetensors(new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength));
  } catch (err) {
    throw new CheckpointError((err as CheckpointError).code ?? 'bad_header', `${file}: ${(err as Error).message}`);
  }
  const out = new Map<string, Record<string, number[]>>();
  for (const [name, t] of Object.entries(content.tensors)) {
    const dot = name.lastIndexOf('.');
    if (dot <= 0) continue;
    if (t.dtype !== 'F32' && t.dtype !== 'F64' && t.dtype !== 'BF16' && t.dtype !== 'F16') {
      throw new CheckpointError('bad_dtype', `${file}: tensor ${name} is ${t.dtype}; stats must be floating point`);
    }
    const key = name.slice(0, dot);
    if (!out.has(key)) out.set(key, {});
    out.get(key)![name.slice(dot + 1)] = Array.from(t.data as Float32Array | Float64Array, Number);
  }
  return out;
}

/**
 * Completes stats that lack the pair the mode does not use, with their normal-distribution
 * equivalents: q01/q99 = mean -/+ 2.326 std for zscore, mean = (q01 + q99) / 2 and
 * std = (q99 - q01) / (2 * 2.326) for quantile. The pair the mode uses must be there.
 */
function complete(raw: Record<string, number[]> | undefined, mode: NormMode, key: 'state' | 'actions', file: string, filled: string[]): NormStats {
  const s = { ...(raw ?? {}) } as Partial<NormStats>;
  const need = mode === 'zscore' ? (['mean', 'std'] as const) : (['q01', 'q99'] as const);
  const missing = need.filter((f) => !Array.isArray(s[f]));
  if (missing.length > 0) throw new NormError('bad_stats', `${file}: ${key} has no ${missing.join(', ')}; ${mode} normalisation needs ${need.join(' and ')}`);
  if (mode === 'zscore' && (!s.q01 || !s.q99)) {
    s.q01 = s.mean!.map((m, j) => m - Z99 * s.std![j]!);
    s.q99 = s.mean!.map((m, j) => m + Z99 * s.std![j]!);
    filled.push(`${key}.q01`, `${key}.q99`);
  }
  if (mode === 'quantile' && (!s.mean || !s.std)) {
    s.mean = s.q01!.map((lo, j) => (lo + s.q99![j]!) / 2);
    s.std = s.q01!.map((lo, j) => Math.abs(s.q99![j]! - lo) / (2 * Z99));
    filled.push(`${key}.mean`, `${key}.std`);
  }
  const stats: NormStats = { mean: s.mean!, std: s.std!, q01: s.q01!, q99: s.q99! };
  try {
    validateNormStats(stats, key);
  } catch (err) {
    throw new NormError('bad_stats', `${file}: ${(err as Error).message}`);
  }
  return stats;
}

async function readLerobot(dir: string): Promise<CheckpointNormStats | null> {
  const pre = await readJson(dir, LEROBOT_PREPROCESSOR);
  if (pre === null) return null;
  const step = findStep(pre, LEROBOT_PREPROCESSOR, 'normalizer_processor');
  if (!step) return null;
  if (Object.keys(step.config?.features ?? {}).length === 0 && !step.state_file) return null; // a base checkpoint
  const mode = stepMode(step, LEROBOT_PREPROCESSOR);
  if (mode === null) return null;
  if (!step.state_file) badConfig(LEROBOT_PREPROCESSOR, 'the normalizer_processor step has features but no state_file with their stats');
  const stateKey = featureKey(step, 'STATE', LEROBOT_STATE_KEY);
  let actionKey = featureKey(step, 'ACTION', LEROBOT_ACTION_KEY);
  const tensors = await readStateFile(dir, step.state_file, LEROBOT_PREPROCESSOR);
  let actionRaw = tensors.get(actionKey);
  let actionFile = step.state_file;
  if (!actionRaw) {
    const post = await readJson(dir, LEROBOT_POSTPROCESSOR);
    const un = post === null ? null : findStep(post, LEROBOT_POSTPROCESSOR, 'unnormalizer_processor');
    if (un?.state_file) {
      actionKey = featureKey(un, 'ACTION', actionKey);
      actionRaw = (await readStateFile(dir, un.state_file, LEROBOT_POSTPROCESSOR)).get(actionKey);
      actionFile = un.state_file;
    }
  }
  if (!tensors.get(stateKey)) throw new NormError('bad_stats', `${step.state_file}: no ${stateKey}.* tensors; found ${[...tensors.keys()].join(', ') || 'none'}`);
  if (!actionRaw) throw new NormError('bad_stats', `${actionFile}: no ${actionKey}.* tensors (nor in ${LEROBOT_POSTPROCESSOR}'s unnormalizer)`);
  const filled: string[] = [];
  const stats = { state: complete(tensors.get(stateKey), mode, 'state', step.state_file, filled), actions: complete(actionRaw, mode, 'actions', actionFile, filled) };
  const eps = step.config?.eps ?? LEROBOT_NORM_EPS;
  if (typeof eps !== 'number' || !Number.isFinite(eps) || eps < 0) badConfig(LEROBOT_PREPROCESSOR, `the normalizer_processor step's eps is ${JSON.stringify(eps)}; expected a finite number >= 0`);
  // Vela's own outputs write these files and norm_stats.json from one set of stats, trained with openpi's arithmetic.
  const velaOwn = (await readIfExists(path.join(dir, VELA_NORM_STATS))) !== null;
  return { stats, mode, source: step.state_file, filled, convention: velaOwn ? 'openpi' : 'lerobot', eps };
}

/** The mode recorded by a folder's config.json (LeRobot's or Vela's), else null. */
async function configMode(dir: string): Promise<NormMode | null> {
  const cfg = (await readJson(dir, 'config.json')) as Record<string, unknown> | null;
  if (!cfg || typeof cfg !== 'object') return null;
  const map = cfg.normalization_mapping as Record<string, string> | undefined;
  if (map && typeof map.STATE === 'string' && MODE_OF_LEROBOT[map.STATE]) return MODE_OF_LEROBOT[map.STATE]!;
  for (const k of ['preset', 'type']) {
    if (typeof cfg[k] !== 'string') continue;
    try {
      return normalizerFor(cfg[k] as string).mode;
    } catch {
      // Not a family Vela knows; try the next field.
    }
  }
  return null;
}

function parseJsonStats(bytes: Buffer, rel: string): NormStatsSet {
  try {
    return parseNormStats(bytes.toString('utf8'));
  } catch (err) {
    throw new NormError((err as NormError).code ?? 'bad_json', `${rel}: ${(err as Error).message.replace(/^norm_stats\.json:? ?/, '')}`);
  }
}

async function readJsonLayouts(dir: string, opts: ReadNormStatsOptions): Promise<{ stats: NormStatsSet; source: string } | null> {
  let ids: string[] = [];
  try {
    ids = (await readdir(path.join(dir, 'assets'), { withFileTypes: true })).filter((e) => e.isDirectory()).map((e) => e.name).sort();
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code !== 'ENOENT' && code !== 'ENOTDIR') throw new CheckpointError('io', `reading ${path.join(dir, 'assets')}: ${(err as Error).message}`);
  }
  const withStats: string[] = [];
  for (const id of ids) if ((await readIfExists(path.join(dir, 'assets', id, VELA_NORM_STATS))) !== null) withStats.push(id);
  if (opts.assetId !== undefined) {
    if (!withStats.includes(opts.assetId)) {
      throw new CheckpointError('missing_file', `assets/${opts.assetId}/norm_stats.json is not in the folder; its assets with stats: ${withStats.join(', ') || 'none'}`);
    }
    withStats.splice(0, withStats.length, opts.assetId);
  }
  if (withStats.length > 1) {
    throw new CheckpointError('bad_config', `assets/ has norm stats for ${withStats.length} robots (${withStats.join(', ')}); name the asset id to serve with`);
  }
  if (withStats.length === 1) {
    const rel = `assets/${withStats[0]}/norm_stats.json`;
    return { stats: parseJsonStats((await readIfExists(path.join(dir, rel)))!, rel), source: rel };
  }
  const own = await readIfExists(path.join(dir, VELA_NORM_STATS));
  return own === null ? null : { stats: parseJsonStats(own, VELA_NORM_STATS), source: VELA_NORM_STATS };
}

/**
 * The norm stats a checkpoint folder carries (layouts and their order in the module comment).
 *
 * Missing stats: LeRobot's MEAN_STD checkpoints may hold only mean and std (QUANTILES ones only
 * q01 and q99). The pair the mode does not use is filled with its normal-distribution
 * equivalent (see `filled`), so that validateNormStats passes; the pair the mode needs must be
 * in the file. The filled pair is never used to normalise, only to describe ranges.
 *
 * @returns null when the folder has no stats (a base checkpoint: LeRobot's normalizer with no
 *   features, or no stats file at all).
 * @throws CheckpointError ('bad_config': a processor JSON that is not JSON or not a pipeline, a
 *   mode Vela does not serve, several openpi assets and no `assetId`, JSON stats with no mode
 *   given or recorded; 'missing_file': a named state file or asset that is absent; the
 *   safetensors decoder's codes) or NormError ('bad_stats', 'bad_json'), each one line naming
 *   the file and the problem.
 */
export async function readCheckpointNormStats(dir: string, opts: ReadNormStatsOptions = {}): Promise<CheckpointNormStats | null> {
  const lerobot = await readLerobot(dir);
  if (lerobot) return lerobot;
  // No LeRobot stats (none, or a base's empty normalizer): openpi's or Vela's JSON may still be there.
  const found = await readJsonLayouts(dir, opts);
  return found === null ? null : finishJson(dir, found, opts);
}

async function finishJson(dir: string, found: { stats: NormStatsSet; source: string }, opts: ReadNormStatsOptions): Promise<CheckpointNormStats> {
  const mode = opts.mode ?? (await configMode(dir));
  if (!mode) {
    throw new CheckpointError('bad_config', `${found.source} does not say how to normalise and config.json names no model family: pass the mode (zscore for pi0, quantile for pi0.5)`);
  }
  return { stats: found.stats, mode, source: found.source, filled: [], convention: 'openpi', eps: LEROBOT_NORM_EPS };
}

/**
 * Writes `data` as `dir/name` through a temporary name and a rename, fsynced (a crash leaves the
 * old file or the new one, never a part). @throws CheckpointError `io`, naming the file.
 */
export async function atomicWrite(dir: string, name: string, data: Uint8Array | string): Promise<void> {
  const tmp = path.join(dir, `.${name}.tmp-${process.pid}-${randomBytes(4).toString('hex')}`);
  try {
    const fh = await open(tmp, 'wx');
    try {
      await fh.writeFile(data);
      await fh.sync();
    } finally {
      await fh.close();
    }
    await rename(tmp, path.join(dir, name));
  } catch (err) {
    await rm(tmp, { force: true }).catch(() => undefined);
    throw new CheckpointError('io', `writing ${path.join(dir, name)}: ${(err as Error).message}`);
  }
}

function statTensors(stats: NormStatsSet): Record<string, SafeTensor> {
  const out: Record<string, SafeTensor> = {};
  for (const [key, s] of [[LEROBOT_STATE_KEY, stats.state], [LEROBOT_ACTION_KEY, stats.actions]] as const) {
    for (const f of ['mean', 'std', 'q01', 'q99'] as const) out[`${key}.${f}`] = { dtype: 'F32', shape: [s[f].length], data: Float32Array.from(s[f]) };
  }
  return out;
}

function lerobotStep(registry: string, mode: NormMode, features: Record<string, { type: string; shape: number[] }>, stateFile: string): Record<string, unknown> {
  const m = LEROBOT_OF_MODE[mode];
  return {
    registry_name: registry,
    config: { eps: LEROBOT_NORM_EPS, features, norm_map: { VISUAL: 'IDENTITY', STATE: m, ACTION: m } },
    state_file: stateFile,
  };
}

/**
 * Writes `stats` into the folder `dir` (which must exist) in every layout the field reads:
 * LeRobot's `policy_preprocessor.json` (one `normalizer_processor` step over
 * `observation.state` and `action`) and `policy_postprocessor.json` (one
 * `unnormalizer_processor` step over `action`), each with its
 * `<pipeline>_step_0_<registry name>.safetensors` (float32 `<feature>.<mean|std|q01|q99>`),
 * and Vela's / openpi's `norm_stats.json`. The pipelines hold only the (un)normalisation: a
 * LeRobot user adds the policy's other steps (tokenizer, device) as its factory makes them.
 * Each file is written under a temporary name, fsynced and renamed; the caller writes the whole
 * folder as a temporary one and renames it into place.
 * @returns the file names written.
 * @throws NormError('bad_stats') for stats that do not validate; CheckpointError('io').
 */
export async function writeCheckpointNormStats(dir: string, stats: NormStatsSet, mode: NormMode): Promise<string[]> {
  if (mode !== 'zscore' && mode !== 'quantile') throw new NormError('bad_input', `mode is ${JSON.stringify(mode)}; expected zscore or quantile`);
  const json = normStatsToJson(stats); // validates
  const st = encodeSafetensors(statTensors(stats));
  const features = {
    [LEROBOT_STATE_KEY]: { type: 'STATE', shape: [stats.state.mean.length] },
    [LEROBOT_ACTION_KEY]: { type: 'ACTION', shape: [stats.actions.mean.length] },
  };
  const pre = { name: 'policy_preprocessor', steps: [lerobotStep('normalizer_processor', mode, features, LEROBOT_NORMALIZER_FILE)] };
  const post = { name: 'policy_postprocessor', steps: [lerobotStep('unnormalizer_processor', mode, { [LEROBOT_ACTION_KEY]: features[LEROBOT_ACTION_KEY] }, LEROBOT_UNNORMALIZER_FILE)] };
  const files: [string, Uint8Array | string][] = [
    [LEROBOT_NORMALIZER_FILE, st],
    [LEROBOT_UNNORMALIZER_FILE, st],
    [LEROBOT_PREPROCESSOR, JSON.stringify(pre, null, 2) + '\n'],
    [LEROBOT_POSTPROCESSOR, JSON.stringify(post, null, 2) + '\n'],
    [VELA_NORM_STATS, json],
  ];
  for (const [name, data] of files) await atomicWrite(dir, name, data);
  return files.map(([name]) => name);
}
