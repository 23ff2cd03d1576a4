/**
 * Is a base checkpoint folder the real model the client asked for? Sessions (`base_model`) and
 * fine-tunes (`model`) both refuse a pi0 folder given as pi0.5 (and the reverse) when the
 * request comes, not when the engine loads it or the first step fails.
 */
import { realPiConfigFromHub } from '../../kernels/pi/config.ts';
import { ConfigError } from '../../kernels/errors.ts';
import { CheckpointError } from '../../kernels/safetensors.ts';
import { HttpError } from '../http/http.ts';
import { DEFAULT_BASES, type RealModel } from './bases.ts';
import { readHubConfig } from './hub-checkpoint.ts';

/**
 * Checks that checkpoint folder `dir` (the client's `base`, resolved) holds the real `variant`.
 * @param field the request's name for the model: `base_model` (sessions) or `model` (fine-tunes).
 * @throws HttpError 400 naming both variants and the fix, or the config's own problem (no
 *   config.json, not a pi0 / pi0.5 config).
 */
export async function checkBaseVariant(variant: RealModel, base: string, dir: string, field = 'base_model'): Promise<void> {
  let found: RealModel;
  try {
    found = realPiConfigFromHub(await readHubConfig(dir)).variant;
  } catch (e) {
    if (e instanceof ConfigError || e instanceof CheckpointError) throw new HttpError(400, `base ${base}: ${e.message}`);
    throw e;
  }
  if (found !== variant) {
    throw new HttpError(400, `base ${base} is a ${found} checkpoint and ${field} is ${variant}: use ${field} "${found}" with this base, or a ${variant} base (e.g. ${DEFAULT_BASES[variant]})`);
  }
}
