/**
 * What a folder handed to the policy server is, and which engine serves it:
 * - a Vela checkpoint (config.json with `preset`, PROTOCOL.md section 4): a small preset's, on
 *   that preset's engine; or, when `preset` is `pi0` / `pi05` and config.json names the
 *   `base_checkpoint` it was trained on (every checkpoint of a real-model session or job
 *   does), adapters or weights of the real model, on the engine of that base
 *   (`realModelKey(variant, base)`). A bare `pi0` / `pi05` without `base_checkpoint` is a
 *   checkpoint written before issue 23 and means the small preset it meant then.
 * - a base checkpoint in the Hub layout (config.json with LeRobot's `type: "pi0" | "pi05"` and
 *   no `preset`: lerobot/pi05_base and the like): a policy as it is, on its own engine.
 * And the norm stats a served folder carries (`servedNormStats`: the one place that looks them up).
 */
import fs from 'node:fs';
import path from 'node:path';
import { readCheckpointNormStats } from '../models/norm-stats.ts';
import { parseNormStats, type NormMode, type NormStatsSet } from '../../kernels/normalize.ts';
import { isRealModelKey, realModelKey } from '../engine/model-key.ts';
import { storedPreset } from '../presets.ts';
import { PolicyConfigError } from './meta.ts';

/** A folder the policy server can serve, classified (see the module comment). */
export type ServedFolder =
  | { kind: 'checkpoint'; dir: string; config: Record<string, unknown>; preset: string; baseSeed: number; engineModel: string; baseDir: string | null }
  | { kind: 'base'; dir: string; config: Record<string, unknown>; variant: 'pi0' | 'pi05'; engineModel: string; baseDir: string };

/**
 * Reads `dir/config.json` and says what the folder is and which engine serves it.
 * @param opts.base the base folder of a real-model checkpoint, overriding its `base_checkpoint`
 *   (`vela policy --base`; an absolute folder); `engineModel` the engine key the caller already
 *   knows (a job's `engine_model`), used for a real checkpoint when it is a real key.
 * @throws PolicyConfigError naming the file and the field: no config.json, not JSON, neither
 *   `preset` nor a pi0 / pi05 `type`.
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
      const engineModel = !opts.base && opts.engineModel && isRealModelKey(opts.engineModel) ? opts.engineModel : realModelKey(preset, baseDir);
      return { kind: 'checkpoint', dir, config: cfg, preset, baseSeed, engineModel, baseDir };
    }
    if (opts.base) throw new PolicyConfigError(`${file} is a checkpoint of preset ${preset}, which has its own seeded base: a base checkpoint applies to the real pi0 / pi0.5 only`);
    // LoRA adapters only make sense on the base weights they were trained on: the same init seed.
    return { kind: 'checkpoint', dir, config: cfg, preset: storedPreset(preset), baseSeed, engineModel: opts.engineModel ?? storedPreset(preset), baseDir: null };
  }
  if (cfg.type === 'pi0' || cfg.type === 'pi05') {
    return { kind: 'base', dir, config: cfg, variant: cfg.type, engineModel: realModelKey(cfg.type, dir), baseDir: dir };
  }
  throw new PolicyConfigError(`${file} has neither "preset" (a Vela checkpoint) nor "type": "pi0" / "pi05" (a pi0 / pi0.5 checkpoint in the Hub layout)`);
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

/**
 * What stands in for a Vela checkpoint's config.json when a base is served as it is: the
 * variant, the cameras (`--cameras`, else the base's input_features, else openpi's names), the
 * base's number of denoising steps; the horizon and dims are the model's.
 */
export function baseServeConfig(config: Record<string, unknown>, variant: 'pi0' | 'pi05', cameras: string[] | null): Record<string, unknown> {
  const declared = baseCameras(config).slice(0, 3);
  const steps = config.num_inference_steps;
  return {
    preset: variant,
    cameras: cameras ?? (declared.length > 0 ? declared : OPENPI_CAMERAS),
    ...(typeof steps === 'number' && Number.isInteger(steps) && steps >= 1 && steps <= 1000 ? { num_steps: steps } : {}),
  };
}

/** Norm stats a served folder carries, and the transform they were made for (null: the family's). */
export interface ServedNorm {
  stats: NormStatsSet;
  mode: NormMode | null;
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
 * @throws NormError / CheckpointError when stats are there but not valid (one line naming the file).
 */
export async function servedNormStats(dir: string | null, fromEngine: unknown): Promise<ServedNorm | null> {
  if (fromEngine !== null && fromEngine !== undefined) return { stats: parseNormStats(fromEngine), mode: null, source: dir ? path.join(dir, 'norm_stats.json') : 'the checkpoint' };
  if (!dir) return null;
  const own = await readCheckpointNormStats(dir);
  return own ? { stats: own.stats, mode: own.mode, source: own.source } : null;
}
