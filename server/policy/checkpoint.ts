/**
 * What a folder handed to the policy server is, and which engine serves it:
 * - a Vela checkpoint (config.json with `preset`, PROTOCOL.md section 4): a small preset's, on
 *   that preset's engine; or, when `preset` is `pi0` / `pi05` and config.json names the
 *   `base_checkpoint` it was trained on (every checkpoint of a real-model session or job
 *   does), adapters or weights of the real model, on the engine of that base
 *   (`realModelKey(variant, base)`). A bare `pi0` / `pi05` without `base_checkpoint` is a
 *   checkpoint written before issue 23 and means the small preset it meant then.
 * - a base checkpoint in the Hub layout (config.json with LeRobot's `type: "pi0" | "pi05"` and
 *   no `preset`: lerobot/pi05_base and the like): a policy as it is, on its own engine. A real
 *   fine-tune's output (server/jobs/export-hub.ts) is one too, and its vela_dataset.json says
 *   what its own checkpoint's config.json says (cameras, action space, names): served with it.
 * And the norm stats a served folder carries (`servedNormStats`: the one place that looks them up).
 */
import fs from 'node:fs';
import path from 'node:path';
import { readCheckpointNormStats } from '../models/norm-stats.ts';
import { LEROBOT_NORM_EPS, normalizerFor, parseNormStats, type NormConvention, type NormMode, type NormStatsSet } from '../../kernels/normalize.ts';
import { isRealModelKey, realModelKey } from '../engine/model-key.ts';
import { storedPreset } from '../models/presets.ts';
import { VELA_DATASET_FILE } from '../jobs/base.ts';
import { PolicyConfigError } from './meta.ts';

/** A folder the policy server can serve, classified (see the module comment). */
export type ServedFolder =
  | { kind: 'checkpoint'; dir: string; config: Record<string, unknown>; preset: string; baseSeed: number; engineModel: string; baseDir: string | null }
  | {
    kind: 'base'; dir: string; config: Record<string, unknown>; variant: 'pi0' | 'pi05'; engineModel: string; baseDir: string;
    /** vela_dataset.json of a Vela fine-tune's output (server/jobs/export-hub.ts), else null (a pretrained base). */
    dataset: Record<string, unknown> | null;
  };

/**
 * Reads `dir/config.json` and says what the folder is and which engine serves it.
 * @param opts.base the base folder of a real-model checkpoint, overriding its `base_checkpoint`
 *   (`vela policy --base`; an absolute folder); `engineModel` the engine key the caller already
 *   knows (a job's `engine_model`), used for a real checkpoint when it is a real key.
 * @throws PolicyConfigError naming the file and the field: no config.json, not JSON, neither
 *   `preset` nor a pi0 / pi05 `type`, a `type` that its `vela_real_pi_config.variant` contradicts,
 *   a vela_dataset.json that is not a JSON object.
 */
export async function classifyFolder(dir: string, opts: { base?: string | null; engineModel?: string | null } = {}): Promise<ServedFolder> {
  const file = path.join(dir, 'config.json');
  let text: string;
  try {
    text = await fs.promises.readFile(file, 'utf8');
  } catch {
    throw new PolicyConfigError(`${file} is missing: a policy is a Vela checkpoint folder or a pi0 / pi0.5 checkpoint in the Hub layout`);
  }
  let config: unknown;
  try {
    config = JSON.parse(text);
  } catch (e) {
    throw new PolicyConfigError(`${file} is not JSON: ${(e as Error).message}`);
  }
  if (config === null || typeof config !== 'object' || Array.isArray(config)) throw new PolicyConfigError(`${file} is not a JSON object`);
  const cfg = config as Record<string, unknown>;
  if (typeof cfg.preset === 'string') {
    const preset = cfg.preset;
    const baseSeed = typeof cfg.base_seed === 'number' ? cfg.base_seed : 0;
    const real = (preset === 'pi0' || preset === 'pi05') && (typeof cfg.base_checkpoint === 'string' || !!opts.base);
    if (real) {
      const baseDir = opts.base ?? path.resolve(cfg.base_checkpoint as string);
      await checkBaseVariant(baseDir, preset, `${file} "preset"`);
      const engineModel = !opts.base && opts.engineModel && isRealModelKey(opts.engineModel) ? opts.engineModel : realModelKey(preset, baseDir);
      return { kind: 'checkpoint', dir, config: cfg, preset, baseSeed, engineModel, baseDir };
    }
    if (opts.base) throw new PolicyConfigError(`${file} is a checkpoint of preset ${preset}, which has its own seeded base: a base checkpoint applies to the real pi0 / pi0.5 only`);
    // LoRA adapters only make sense on the base weights they were trained on: the same init seed.
    return { kind: 'checkpoint', dir, config: cfg, preset: storedPreset(preset), baseSeed, engineModel: opts.engineModel ?? storedPreset(preset), baseDir: null };
  }
  if (cfg.type === 'pi0' || cfg.type === 'pi05') {
    // The engine is keyed by `type`; a Vela-written config's own RealPiConfig builds the model, so the two must agree.
    variantOf(cfg, file);
    return { kind: 'base', dir, config: cfg, variant: cfg.type, engineModel: realModelKey(cfg.type, dir), baseDir: dir, dataset: await readDatasetFile(dir) };
  }
  throw new PolicyConfigError(`${file} has neither "preset" (a Vela checkpoint) nor "type": "pi0" / "pi05" (a pi0 / pi0.5 checkpoint in the Hub layout)`);
}

/**
 * The variant a Hub-layout config.json builds: its `vela_real_pi_config.variant` when it has
 * one (it wins: kernels/pi/config.ts realPiConfigFromHub), else its `type`; undefined when neither.
 * @throws PolicyConfigError naming both fields when they disagree.
 */
function variantOf(cfg: Record<string, unknown>, file: string): unknown {
  const own = cfg.vela_real_pi_config as { variant?: unknown } | null | undefined;
  const built = own && typeof own === 'object' ? own.variant : undefined;
  if (built !== undefined && cfg.type !== undefined && built !== cfg.type) {
    throw new PolicyConfigError(`${file}: "type" is ${JSON.stringify(cfg.type)} but "vela_real_pi_config.variant" is ${JSON.stringify(built)}; make the two fields agree`);
  }
  return built ?? cfg.type;
}

/**
 * Refuses a real checkpoint's base whose config.json builds another variant than `want` (named
 * by `wantFrom`), naming the fields on both sides. A base that cannot be read is left to the
 * engine's loader, whose error names the file.
 * @throws PolicyConfigError
 */
async function checkBaseVariant(baseDir: string, want: string, wantFrom: string): Promise<void> {
  const file = path.join(baseDir, 'config.json');
  let cfg: unknown;
  try {
    cfg = JSON.parse(await fs.promises.readFile(file, 'utf8'));
  } catch {
    return;
  }
  if (cfg === null || typeof cfg !== 'object' || Array.isArray(cfg)) return;
  const c = cfg as Record<string, unknown>;
  const built = variantOf(c, file);
  if (built !== undefined && built !== want) {
    const field = (c.vela_real_pi_config as { variant?: unknown } | undefined)?.variant !== undefined ? '"vela_real_pi_config.variant"' : '"type"';
    throw new PolicyConfigError(`${wantFrom} is ${JSON.stringify(want)} but its base's ${file} ${field} is ${JSON.stringify(built)}: serve it on a ${want} base (--base), or fix the field`);
  }
}

/**
 * A base folder's vela_dataset.json (the data a Vela fine-tune trained it on), or null when absent.
 * @throws PolicyConfigError naming the file when it is there but not a JSON object.
 */
async function readDatasetFile(dir: string): Promise<Record<string, unknown> | null> {
  const file = path.join(dir, VELA_DATASET_FILE);
  let text: string;
  try {
    text = await fs.promises.readFile(file, 'utf8');
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw new PolicyConfigError(`${file} cannot be read: ${(e as Error).message}`);
  }
  let data: unknown;
  try {
    data = JSON.parse(text);
  } catch (e) {
    throw new PolicyConfigError(`${file} is not JSON: ${(e as Error).message}`);
  }
  if (data === null || typeof data !== 'object' || Array.isArray(data)) throw new PolicyConfigError(`${file} is not a JSON object`);
  return data as Record<string, unknown>;
}

/** The cameras a base checkpoint's config.json declares: LeRobot's `input_features` of type VISUAL. */
export function baseCameras(config: Record<string, unknown>): string[] {
  const features = config.input_features;
  if (!features || typeof features !== 'object') return [];
  return Object.entries(features as Record<string, { type?: unknown }>)
    .filter(([k, v]) => k.startsWith('observation.images.') && v?.type === 'VISUAL')
    .map(([k]) => k.slice('observation.images.'.length));
}

/** openpi's camera names of the public bases, when a base's config.json declares none. */
export const OPENPI_CAMERAS = ['base_0_rgb', 'left_wrist_0_rgb', 'right_wrist_0_rgb'];

/** The fields of vela_dataset.json that the policy server reads (policyMeta's, as the job's own checkpoint config.json has them). */
const DATASET_FIELDS = ['action_horizon', 'action_space', 'delta_mask', 'state_dim', 'action_dim', 'state_names', 'action_names'] as const;

/**
 * What stands in for a Vela checkpoint's config.json when a base is served as it is: the
 * variant, the base's number of denoising steps, and
 * - a pretrained base: the cameras (`--cameras`, else the base's input_features, else openpi's
 *   names); the horizon and dims are the model's;
 * - a Vela fine-tune's output (its vela_dataset.json, `dataset`): what the job's own checkpoint
 *   says: the dataset's cameras in training order (`--cameras` renames them, one name each),
 *   action horizon, state / action dims and names, and action space, so a delta-trained model
 *   answers absolute actions exactly as the job's policy does (the state added back).
 * @throws PolicyConfigError when `--cameras` has another number of names than the dataset's cameras.
 */
export function baseServeConfig(config: Record<string, unknown>, variant: 'pi0' | 'pi05', cameras: string[] | null, dataset: Record<string, unknown> | null = null): Record<string, unknown> {
  const steps = config.num_inference_steps;
  const out: Record<string, unknown> = {
    preset: variant,
    ...(typeof steps === 'number' && Number.isInteger(steps) && steps >= 1 && steps <= 1000 ? { num_steps: steps } : {}),
  };
  if (dataset) {
    for (const k of DATASET_FIELDS) if (dataset[k] !== undefined) out[k] = dataset[k];
    const trained = dataset.cameras;
    if (cameras && Array.isArray(trained) && cameras.length !== trained.length) {
      throw new PolicyConfigError(`--cameras ${cameras.join(',')}: the model was fine-tuned on ${trained.length} camera${trained.length === 1 ? '' : 's'} (${VELA_DATASET_FILE} cameras ${JSON.stringify(trained)}); give ${trained.length} name${trained.length === 1 ? '' : 's'}, in that order, or drop --cameras`);
    }
    // Missing or malformed cameras reach policyMeta, whose error names the field.
    out.cameras = cameras ?? trained;
    return out;
  }
  const declared = baseCameras(config).slice(0, 3);
  out.cameras = cameras ?? (declared.length > 0 ? declared : OPENPI_CAMERAS);
  return out;
}

/**
 * How `vela policy` and the main server serve a base folder as it is (PolicyServerOptions.base):
 * its serve config (baseServeConfig), and for a Vela fine-tune's output the transform its
 * norm_stats.json was made for: the family's (pi0 z-score, pi0.5 quantiles), as the job trained
 * and its own policy serves, whatever `normalization_mapping` the config.json copied from the
 * job's base says.
 * @throws PolicyConfigError from baseServeConfig.
 */
export function baseServing(target: Extract<ServedFolder, { kind: 'base' }>, cameras: string[] | null): { config: Record<string, unknown>; normMode: NormMode | null } {
  return { config: baseServeConfig(target.config, target.variant, cameras, target.dataset), normMode: target.dataset ? normalizerFor(target.variant).mode : null };
}

/** Norm stats a served folder carries, and the transform they were made for (null: the family's). */
export interface ServedNorm {
  stats: NormStatsSet;
  mode: NormMode | null;
  /** Whose arithmetic (kernels/normalize.ts NormConvention) and LeRobot's eps: the file's own. */
  convention: NormConvention;
  eps: number;
  /** Where they came from, for the start-up line. */
  source: string;
}

/**
 * The norm stats the policy server serves `dir` with: the one lookup of the policy server (the
 * standalone, the job policy, HTTP inference and pushed weights all come here). What the engine
 * read from a Vela checkpoint (its norm_stats.json, as `load_policy` answers it), else the
 * folder's own (server/models/norm-stats.ts readCheckpointNormStats: LeRobot's processor files,
 * openpi's assets/<id>/norm_stats.json, Vela's norm_stats.json), else null (served unnormalised;
 * the caller warns once).
 * @param fromEngine `load_policy`'s `normStats` (null or undefined when none).
 * @param mode the transform JSON stats (openpi's, Vela's) were made for, when the caller knows it
 *   (baseServing); else the folder's config.json says.
 * @throws NormError / CheckpointError when stats are there but not valid (one line naming the file).
 */
export async function servedNormStats(dir: string | null, fromEngine: unknown, mode: NormMode | null = null): Promise<ServedNorm | null> {
  if (fromEngine !== null && fromEngine !== undefined) return { stats: parseNormStats(fromEngine), mode: null, source: dir ? path.join(dir, 'norm_stats.json') : 'the checkpoint', convention: 'openpi', eps: LEROBOT_NORM_EPS };
  if (!dir) return null;
  const own = await readCheckpointNormStats(dir, mode ? { mode } : {});
  return own ? { stats: own.stats, mode: own.mode, source: own.source, convention: own.convention, eps: own.eps } : null;
}
