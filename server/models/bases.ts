/**
 * The real models a request may name, and where their base checkpoints come from: `model:
 * "pi05"` / `"pi0"` (fine-tunes) or `base_model` (sessions) mean the real pi0.5 / pi0, with
 * `base` a Hub id or a folder in the Hub layout; without `base`, the public checkpoints LeRobot
 * publishes (FACTS.md 2.1).
 */
import fs from 'node:fs';
import os from 'node:os';
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

/** Whether `ref` names a local folder (a path) rather than a Hub id `namespace/name`. */
export function isFolderRef(ref: string): boolean {
  return ref.startsWith('/') || ref.startsWith('.') || ref.startsWith('~') || (fs.existsSync(ref) && fs.statSync(ref).isDirectory());
}

/** The Hugging Face hub cache folder: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub. */
export function hubCacheDir(env: NodeJS.ProcessEnv = process.env): string {
  return env.HF_HUB_CACHE || path.join(env.HF_HOME || path.join(os.homedir(), '.cache', 'huggingface'), 'hub');
}
