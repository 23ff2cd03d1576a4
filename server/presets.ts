/**
 * Preset names at the server's boundaries (issue 23): a new request may name a preset or a
 * deprecated alias (one warning line naming the new name), never bare `pi0` / `pi05` (the real
 * models, not served here yet); a stored record's name (jobs, sessions, checkpoints written
 * before the rename) resolves silently to the small preset it meant.
 */
import { LEGACY_BARE_NAMES, PRESET_NAMES, realModelMessage, resolvePreset, resolveStoredPreset } from '../kernels/small/config.ts';
import { HttpError } from './http.ts';
import { log } from './log.ts';

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
