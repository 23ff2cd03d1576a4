/**
 * Preset names at the server's boundaries (issue 23): a new request may name a preset or a
 * deprecated alias (one warning line naming the new name), never bare `pi0` / `pi05` (the real
 * models, which a request names as `base_model` with a `base` checkpoint); a stored record's name (jobs, sessions, checkpoints written
 * before the rename) resolves silently to the small preset it meant.
 */
import { LEGACY_BARE_NAMES, PRESET_NAMES, realModelMessage, resolvePreset, resolveStoredPreset } from '../../kernels/small/config.ts';
import { REAL_PI0, REAL_PI05 } from '../../kernels/pi/config.ts';
import { realPiParamCount } from '../../kernels/pi/params.ts';
import { DEFAULT_BASES } from './bases.ts';
import { HttpError } from '../http/http.ts';
import { log } from '../log.ts';

/**
 * The canonical preset of `value`, the request's `field` (e.g. "model_size").
 * @throws HttpError 400: bare pi0 / pi05 ("model_size: pi05 is the real pi0.5 ..."), or a value
 *   that is no preset name (naming the known ones).
 */
export function requestPreset(field: string, value: unknown): string {
  if (typeof value === 'string' && value in LEGACY_BARE_NAMES) throw new HttpError(400, `${field}: ${realModelMessage(value)}`);
  if (typeof value !== 'string' || !PRESET_NAMES.includes(value)) throw new HttpError(400, `${field} must be one of ${PRESET_NAMES.join(', ')}, got ${JSON.stringify(value)}`);
  return resolvePreset(value, (line) => log.warn(`${field}: ${line}`));
}

/** The canonical name of a stored record's preset (`+custom` kept), or `name` itself when it never was a preset. */
export function storedPreset(name: string): string {
  try {
    return resolveStoredPreset(name);
  } catch {
    return name;
  }
}

/**
 * `vela presets`' lines for the real models: each with its parameter count (those used in a
 * forward pass, LeRobot's state dict less its two unused LM heads: pi0 3,238,048,528, pi0.5
 * 3,353,433,872) and the commands that get and use its public checkpoint; then what records stored
 * before the rename meant by the bare names.
 */
export function describeRealModels(): string {
  const row = (name: string, count: number, what: string, repo: string) =>
    `${name.padEnd(12)} ${count.toLocaleString('en-US').padStart(13)} parameters, ${what}; get it: vela models download ${repo}`;
  return [
    row('pi0', realPiParamCount(REAL_PI0), 'the real pi0 (PaliGemma: SigLIP + Gemma 2B, Gemma 300M action expert)', DEFAULT_BASES.pi0),
    row('pi05', realPiParamCount(REAL_PI05), 'the real pi0.5 (the same with adaRMSNorm time conditioning)', DEFAULT_BASES.pi05),
    `the real models are named as "model" of a fine-tune or "base_model" of a session, with "base" (a Hub id, default ${DEFAULT_BASES.pi0} / ${DEFAULT_BASES.pi05}, or a checkpoint folder); vela policy --base ID serves one`,
    `(a job or session stored before the small presets were renamed, whose model reads pi0 / pi05, still loads as ${LEGACY_BARE_NAMES.pi0} / ${LEGACY_BARE_NAMES.pi05})`,
  ].join('\n');
}
