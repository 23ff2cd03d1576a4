/**
 * Test helper: a tiny real pi0 / pi0.5 base checkpoint folder in the Hub layout (config.json with
 * `vela_real_pi_config`, model.safetensors keyed as lerobot/pi0_base, PaliGemma-kind tokenizer
 * files beside them), so every surface that takes a `base` runs the real architecture in CI.
 * Written by `vela models init`'s own function (server/models/init-checkpoint.ts initCheckpoint),
 * in float32 so the weights are the parity contract's exactly (kernels/pi/params.ts
 * contractInitValues). The vocabulary is the shipped test tokenizer's (1,011 ids), which keeps
 * the file near 1 MB.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { makeRealPiConfig, type RealPiConfig } from '../../kernels/pi/config.ts';
import { initCheckpoint, initRealConfig, TEST_TOKENIZER_ASSET_DIR, TEST_TOKENIZER_FILES, TEST_TOKENIZER_VOCAB } from '../../server/models/init-checkpoint.ts';
import { encodeSafetensors } from '../../kernels/safetensors.ts';
import type { NormStatsSet } from '../../kernels/normalize.ts';

/** The test tokenizer `vela models init` ships (the same files as test/vectors/real-pi/tokenizer/). */
export const TEST_TOKENIZER_DIR = TEST_TOKENIZER_ASSET_DIR;
/** Ids of the test tokenizer (1000 pieces + 11 added tokens). */
export const TEST_VOCAB = TEST_TOKENIZER_VOCAB;

/** The tiny configuration of `variant` with the test tokenizer's vocabulary. */
export function tinyRealConfig(variant: 'pi0' | 'pi05', overrides: Partial<RealPiConfig> = {}): RealPiConfig {
  return makeRealPiConfig({ ...initRealConfig(variant, 'tiny'), ...overrides });
}

/**
 * Writes the tiny base of `variant` into `dir` (default: a new temp folder) and returns it.
 * `tokenizer: false` leaves the tokenizer files out (tests of the missing-tokenizer refusal);
 * `'lerobot'` writes them as LeRobot's processor pipeline saves them: in `tokenizer/`, named by
 * `policy_preprocessor.json`'s tokenizer_processor step (lerobot/processor/pipeline.py _save_pretrained).
 */
export async function writeTinyBase(variant: 'pi0' | 'pi05', opts: { dir?: string; tokenizer?: boolean | 'lerobot'; config?: RealPiConfig } = {}): Promise<string> {
  const dir = opts.dir ?? path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'vela-tiny-base-')), `tiny_${variant}_base`);
  const c = opts.config ?? tinyRealConfig(variant);
  await initCheckpoint(dir, { variant, config: c, dtype: 'F32', expertLmHead: 'omit', tokenizer: opts.tokenizer === true || opts.tokenizer === undefined });
  if (opts.tokenizer === 'lerobot') {
    fs.mkdirSync(path.join(dir, 'tokenizer'));
    for (const f of TEST_TOKENIZER_FILES) fs.copyFileSync(path.join(TEST_TOKENIZER_DIR, f), path.join(dir, 'tokenizer', f));
    fs.writeFileSync(path.join(dir, 'policy_preprocessor.json'), JSON.stringify(lerobotPreprocessor(c.maxTokenLen, 'tokenizer'), null, 2));
  }
  return dir;
}

/**
 * A `policy_preprocessor.json` as LeRobot's pi0 / pi0.5 factories save it (lerobot/policies/pi0/
 * processor_pi0.py, pi05/processor_pi05.py; pipeline.py _save_pretrained), whose tokenizer step
 * names `tokenizerName` (LeRobot writes its artifact folder, "tokenizer"). Without `stats` the
 * normalizer has no features and no state_file, as in the public bases.
 */
export function lerobotPreprocessor(maxLength: number, tokenizerName: string, stats?: { mode: 'MEAN_STD' | 'QUANTILES'; stateDim: number; actionDim: number }): Record<string, unknown> {
  const mode = stats?.mode ?? 'QUANTILES';
  const features = stats ? { 'observation.state': { type: 'STATE', shape: [stats.stateDim] }, action: { type: 'ACTION', shape: [stats.actionDim] } } : {};
  return {
    name: 'policy_preprocessor',
    steps: [
      { registry_name: 'rename_observations_processor', config: { rename_map: {} } },
      { registry_name: 'to_batch_processor', config: {} },
      {
        registry_name: 'normalizer_processor',
        config: { eps: 1e-8, features, norm_map: { VISUAL: 'IDENTITY', STATE: mode, ACTION: mode } },
        ...(stats ? { state_file: LEROBOT_NORMALIZER_STEP2 } : {}),
      },
      {
        registry_name: 'tokenizer_processor',
        config: { max_length: maxLength, task_key: 'task', padding_side: 'right', padding: 'max_length', truncation: true, tokenizer_name: tokenizerName },
        artifacts: { tokenizer_name: tokenizerName },
      },
      { registry_name: 'device_processor', config: { device: 'cpu', float_dtype: null } },
    ],
  };
}

/** The normalizer's state file when it is step 2 of the pipeline (pipeline.py _get_state_filename). */
export const LEROBOT_NORMALIZER_STEP2 = 'policy_preprocessor_step_2_normalizer_processor.safetensors';

/**
 * Writes LeRobot's processor files for `stats` into the base folder `dir` (written with
 * `tokenizer: 'lerobot'`): the preprocessor above with its normalizer's state file (float32
 * `observation.state.*` and `action.*`, every stat LeRobot keeps that Vela reads), and the
 * postprocessor's unnormalizer with its own file, as LeRobot saves a fine-tune.
 */
export function writeLerobotStats(dir: string, maxLength: number, mode: 'MEAN_STD' | 'QUANTILES', stats: NormStatsSet): void {
  const f32 = (xs: number[]) => ({ dtype: 'F32' as const, shape: [xs.length], data: Float32Array.from(xs) });
  const tensors = (key: string, st: NormStatsSet['state']) => Object.fromEntries((['mean', 'std', 'q01', 'q99'] as const).map((f) => [`${key}.${f}`, f32(st[f])]));
  const pre = lerobotPreprocessor(maxLength, 'tokenizer', { mode, stateDim: stats.state.mean.length, actionDim: stats.actions.mean.length });
  fs.writeFileSync(path.join(dir, 'policy_preprocessor.json'), JSON.stringify(pre, null, 2));
  fs.writeFileSync(path.join(dir, LEROBOT_NORMALIZER_STEP2), encodeSafetensors({ ...tensors('observation.state', stats.state), ...tensors('action', stats.actions) }));
  const post = 'policy_postprocessor_step_0_unnormalizer_processor.safetensors';
  fs.writeFileSync(path.join(dir, 'policy_postprocessor.json'), JSON.stringify({
    name: 'policy_postprocessor',
    steps: [
      { registry_name: 'unnormalizer_processor', config: { eps: 1e-8, features: { action: { type: 'ACTION', shape: [stats.actions.mean.length] } }, norm_map: { VISUAL: 'IDENTITY', STATE: mode, ACTION: mode } }, state_file: post },
      { registry_name: 'device_processor', config: { device: 'cpu', float_dtype: null } },
    ],
  }, null, 2));
  fs.writeFileSync(path.join(dir, post), encodeSafetensors(tensors('action', stats.actions)));
}
