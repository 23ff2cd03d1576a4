/**
 * Test helper: a tiny real pi0 / pi0.5 base checkpoint folder in the Hub layout (config.json with
 * `vela_real_pi_config`, model.safetensors keyed as lerobot/pi0_base, PaliGemma-kind tokenizer
 * files beside them), so every surface that takes a `base` runs the real architecture in CI.
 * The vocabulary is the committed test tokenizer's (1,011 ids), which keeps the file near 1 MB;
 * weights follow the parity contract's init (kernels/pi/params.ts contractInitValues).
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { makeRealPiConfig, REAL_PI_TINY_PI0, REAL_PI_TINY_PI05, type RealPiConfig } from '../../kernels/pi/config.ts';
import { contractInitValues } from '../../kernels/pi/params.ts';
import { defaultHubConfig, writeHubCheckpoint } from '../../server/models/hub-checkpoint.ts';

export const TEST_TOKENIZER_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../vectors/real-pi/tokenizer');
/** Ids of the test tokenizer (1000 pieces + 11 added tokens). */
export const TEST_VOCAB = 1011;

/** The tiny configuration of `variant` with the test tokenizer's vocabulary. */
export function tinyRealConfig(variant: 'pi0' | 'pi05', overrides: Partial<RealPiConfig> = {}): RealPiConfig {
  const c = variant === 'pi0' ? REAL_PI_TINY_PI0 : REAL_PI_TINY_PI05;
  return makeRealPiConfig({ ...c, vlm: { ...c.vlm, vocabSize: TEST_VOCAB }, ...overrides });
}

/**
 * Writes the tiny base of `variant` into `dir` (default: a new temp folder) and returns it.
 * `tokenizer: false` leaves the tokenizer files out (tests of the missing-tokenizer refusal).
 */
export async function writeTinyBase(variant: 'pi0' | 'pi05', opts: { dir?: string; tokenizer?: boolean; config?: RealPiConfig } = {}): Promise<string> {
  const dir = opts.dir ?? path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'vela-tiny-base-')), `tiny_${variant}_base`);
  const c = opts.config ?? tinyRealConfig(variant);
  const config = { ...defaultHubConfig({ ...c, numSteps: c.numSteps }), chunk_size: c.actionHorizon, n_action_steps: c.actionHorizon, tokenizer_max_length: c.maxTokenLen, vela_real_pi_config: c };
  await writeHubCheckpoint(dir, c, (name, shape) => contractInitValues(name, shape.reduce((a, b) => a * b, 1)), { config, expertLmHead: 'omit' });
  if (opts.tokenizer !== false) {
    for (const f of ['tokenizer.json', 'tokenizer_config.json']) fs.copyFileSync(path.join(TEST_TOKENIZER_DIR, f), path.join(dir, f));
  }
  return dir;
}
