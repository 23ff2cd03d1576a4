/**
 * The real models a request may name, and where their base checkpoints come from: `model:
 * "pi05"` / `"pi0"` (fine-tunes) or `base_model` (sessions) mean the real pi0.5 / pi0, with
 * `base` a Hub id or a folder in the Hub layout; without `base`, the public checkpoints LeRobot
 * publishes (FACTS.md 2.1). And where folder bases are named from: the models folder.
 */
import path from 'node:path';

/** The real variants a request may name. */
export const REAL_MODELS = ['pi0', 'pi05'] as const;
export type RealModel = (typeof REAL_MODELS)[number];

/** The public base checkpoint of each variant (the default `base`). */
export const DEFAULT_BASES: Readonly<Record<RealModel, string>> = Object.freeze({ pi0: 'lerobot/pi0_base', pi05: 'lerobot/pi05_base' });

/** Whether a request's model name is a real variant. */
export function isRealModel(name: unknown): name is RealModel {
  return name === 'pi0' || name === 'pi05';
}

/** What `--models-dir` means for a config: the setting, else `<data dir>/models`. */
export function modelsDirOf(config: { dataDir: string; modelsDir?: string | undefined }): string {
  return path.resolve(config.modelsDir ?? path.join(config.dataDir, 'models'));
}

/**
 * The models folder of a CLI (`vela finetune`, `vela policy`): `--models-dir` as typed, else
 * $VELA_MODELS_DIR, else `$VELA_DATA_DIR/models` (default ./vela-data/models): the server's, when
 * run beside it.
 */
export function cliModelsDir(flag: string | undefined, env: NodeJS.ProcessEnv = process.env): string {
  return path.resolve(flag ?? (env.VELA_MODELS_DIR || path.join(env.VELA_DATA_DIR || './vela-data', 'models')));
}
