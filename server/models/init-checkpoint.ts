/**
 * `vela models init`: a random-weight pi0 / pi0.5 checkpoint folder in the Hub base layout
 * (config.json, model.safetensors keyed as lerobot/pi05_base, a tokenizer beside them), so every
 * real-model path (`vela policy --base`, fine-tunes, sessions, the benches) runs offline, without
 * the Hub, the gated PaliGemma tokenizer or torch. The tests' tiny bases are written by the same
 * function (test/helpers/real-pi-base.ts writeTinyBase).
 *
 * Weights follow the parity contract's name-seeded init (kernels/pi/params.ts contractInitChunks;
 * uniform in [-0.05, 0.05)), made and written tensor by tensor in chunks of 4 M values, so the
 * full size (3.6 G values, 7.2 GB in BF16) never holds more than one chunk (~16 MB) of values.
 * The tokenizer is the small test tokenizer shipped in server/models/assets/test-tokenizer/ (1,011
 * ids), NOT PaliGemma's; tokenizer_config.json, a README.txt and the folder's README.md say so.
 */
import fs from 'node:fs';
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { makeRealPiConfig, REAL_PI0, REAL_PI05, REAL_PI_TINY_PI0, REAL_PI_TINY_PI05, type RealPiConfig } from '../../kernels/pi/config.ts';
import { contractInitChunks, realPiParamCount } from '../../kernels/pi/params.ts';
import { ModelError } from './errors.ts';
import { INIT_SEED_MAX } from './init-seed.ts';
import { defaultHubConfig, HUB_WEIGHTS_FILE, hubCheckpointFileBytes, hubCheckpointSpecs, writeHubCheckpoint } from './hub-checkpoint.ts';

/** The shipped test tokenizer (tokenizer.json, tokenizer_config.json, README.txt): NOT PaliGemma's. */
export const TEST_TOKENIZER_ASSET_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), 'assets/test-tokenizer');
/** Ids of the test tokenizer (1000 pieces + 11 added tokens): the tiny size's vocabulary. */
export const TEST_TOKENIZER_VOCAB = 1011;
/** The files of the test tokenizer a checkpoint gets. */
export const TEST_TOKENIZER_FILES = ['tokenizer.json', 'tokenizer_config.json'] as const;
export { INIT_SEED_MAX };

export interface InitCheckpointOptions {
  variant: 'pi0' | 'pi05';
  /**
   * 'tiny': the parity config of FACTS 5.2 (kernels/pi/config.ts REAL_PI_TINY_*) with the test
   * tokenizer's vocabulary, ~0.4 M parameters, config.json carrying `vela_real_pi_config`;
   * 'full': lerobot/pi0_base / pi05_base's shapes and LeRobot's config defaults. Default 'tiny'.
   */
  size?: 'tiny' | 'full';
  /** A config to write instead of the size's (tests: other horizons, widths). */
  config?: RealPiConfig;
  /** Another set of random values (default: the parity contract's exactly). 0..2^32-1. */
  seed?: number;
  /** On-disk dtype, default 'BF16' (as the public bases ship); 'F32' keeps the values exact. */
  dtype?: 'BF16' | 'F32';
  /** The expert's unused LM head: 'zeros' (default, as the base checkpoints hold it) or 'omit'. */
  expertLmHead?: 'zeros' | 'omit';
  /** Copy the test tokenizer into the folder (default true). */
  tokenizer?: boolean;
  /** Replace a non-empty folder (default false: ModelError 'bad_argument'). */
  force?: boolean;
  /** Called as values are written: bytes of tensor data done, and the total. */
  onProgress?: (doneBytes: number, totalBytes: number) => void;
}

/** What initCheckpoint writes (initCheckpointPlan computes it without writing anything). */
export interface InitCheckpointPlan {
  config: RealPiConfig;
  /** config.json as written. */
  hubConfig: Record<string, unknown>;
  dtype: 'BF16' | 'F32';
  /** Tensors in model.safetensors (the expert's LM head included unless omitted). */
  tensors: number;
  /** Values in model.safetensors. */
  values: number;
  /** Model parameters (the expert's LM head, unused, not counted). */
  parameters: number;
  /** Bytes of tensor data in model.safetensors, and of the whole file (header included). */
  dataBytes: number;
  fileBytes: number;
  /** Files of the folder, in writing order. */
  files: string[];
}

/** The RealPiConfig `vela models init` writes for a variant and size. */
export function initRealConfig(variant: 'pi0' | 'pi05', size: 'tiny' | 'full'): RealPiConfig {
  if (size === 'full') return variant === 'pi0' ? REAL_PI0 : REAL_PI05;
  const c = variant === 'pi0' ? REAL_PI_TINY_PI0 : REAL_PI_TINY_PI05;
  return makeRealPiConfig({ ...c, vlm: { ...c.vlm, vocabSize: TEST_TOKENIZER_VOCAB } });
}

/** Sizes and files of the checkpoint `opts` describes; nothing is written or made. */
export function initCheckpointPlan(opts: InitCheckpointOptions): InitCheckpointPlan {
  const size = opts.size ?? 'tiny';
  const c = opts.config ?? initRealConfig(opts.variant, size);
  if (c.variant !== opts.variant) throw new ModelError('bad_argument', `the config is ${c.variant}, not ${opts.variant}`);
  const dtype = opts.dtype ?? 'BF16';
  const specs = hubCheckpointSpecs(c, { dtype, expertLmHead: opts.expertLmHead });
  const values = specs.reduce((a, s) => a + s.shape.reduce((x, d) => x * d, 1), 0);
  // The full sizes are what LeRobot's config names (gemma_2b / gemma_300m); any other carries
  // the whole RealPiConfig, which Vela's reader prefers (kernels/pi/config.ts).
  const full = opts.config === undefined && size === 'full';
  const hubConfig: Record<string, unknown> = {
    ...defaultHubConfig(c),
    dtype: dtype === 'BF16' ? 'bfloat16' : 'float32',
    ...(full ? {} : { vela_real_pi_config: c }),
  };
  const files = ['config.json', HUB_WEIGHTS_FILE, ...(opts.tokenizer === false ? [] : [...TEST_TOKENIZER_FILES]), 'README.md'];
  return {
    config: c,
    hubConfig,
    dtype,
    tensors: specs.length,
    values,
    parameters: realPiParamCount(c),
    dataBytes: values * (dtype === 'BF16' ? 2 : 4),
    fileBytes: hubCheckpointFileBytes(specs),
    files,
  };
}

function checkSeed(seed: number | undefined): void {
  if (seed !== undefined && (!Number.isSafeInteger(seed) || seed < 0 || seed > INIT_SEED_MAX)) {
    throw new ModelError('bad_argument', `seed ${seed}: must be an integer in 0..${INIT_SEED_MAX}`);
  }
}

/**
 * Whether initCheckpoint may write `dir`: absent, an empty folder, or a non-empty one with `force`.
 * @throws ModelError 'bad_argument' otherwise, saying what to do.
 */
export function checkInitTarget(dir: string, force: boolean): void {
  const existing = fs.statSync(dir, { throwIfNoEntry: false });
  if (existing && !existing.isDirectory()) throw new ModelError('bad_argument', `${dir} exists and is not a folder; pick a new folder`);
  if (existing && !force && fs.readdirSync(dir).length > 0) {
    throw new ModelError('bad_argument', `${dir} is not empty; pick a new folder, or pass --force to replace what is there`);
  }
}

/**
 * Writes the checkpoint `opts` describes into `dir`, built in a temporary folder beside it and
 * renamed into place once complete (an interrupted run leaves no half folder under `dir`).
 * An existing empty folder is replaced; a non-empty one only with `force`.
 * @returns the plan, as written.
 * @throws ModelError 'bad_argument' (a non-empty `dir` without force, `dir` a file, a bad seed);
 *   CheckpointError 'io' (the disk).
 */
export async function initCheckpoint(dir: string, opts: InitCheckpointOptions): Promise<InitCheckpointPlan> {
  checkSeed(opts.seed);
  const plan = initCheckpointPlan(opts);
  checkInitTarget(dir, opts.force ?? false);
  const target = path.resolve(dir);
  const parent = path.dirname(target);
  fs.mkdirSync(parent, { recursive: true });
  const work = path.join(parent, `.${path.basename(target)}.init-${process.pid}-${randomBytes(4).toString('hex')}`);
  const built = path.join(work, 'checkpoint');
  try {
    let done = 0;
    const item = plan.dtype === 'BF16' ? 2 : 4;
    const seed = opts.seed;
    await writeHubCheckpoint(built, plan.config, (name, shape) => {
      const chunks = contractInitChunks(name, shape.reduce((a, b) => a * b, 1), { seed });
      return (function* () {
        for (const chunk of chunks) {
          yield chunk;
          done += chunk.length * item;
          opts.onProgress?.(done, plan.dataBytes);
        }
      })();
    }, { config: plan.hubConfig, dtype: plan.dtype, expertLmHead: opts.expertLmHead });
    if (opts.tokenizer !== false) for (const f of TEST_TOKENIZER_FILES) fs.copyFileSync(path.join(TEST_TOKENIZER_ASSET_DIR, f), path.join(built, f));
    fs.writeFileSync(path.join(built, 'README.md'), modelCard(plan, opts));
    opts.onProgress?.(plan.dataBytes, plan.dataBytes);
    // Swap in: an existing folder (empty, or replaced with force) moves aside first, then goes.
    let old: string | null = null;
    if (fs.existsSync(target)) {
      old = path.join(work, 'old');
      fs.renameSync(target, old);
    }
    try {
      fs.renameSync(built, target);
    } catch (e) {
      if (old) fs.renameSync(old, target);
      throw e;
    }
  } finally {
    fs.rmSync(work, { recursive: true, force: true });
  }
  return plan;
}

/** The folder's README.md: what it is, and that neither weights nor tokenizer are real. */
function modelCard(plan: InitCheckpointPlan, opts: InitCheckpointOptions): string {
  const c = plan.config;
  const size = opts.config ? 'custom' : (opts.size ?? 'tiny');
  return [
    `# Random-weight ${c.variant === 'pi05' ? 'pi0.5' : 'pi0'} (${size}), written by \`vela models init\``,
    '',
    'NOT a trained model: every weight comes from a name-seeded uniform rule in [-0.05, 0.05)',
    `(Vela's parity-contract init${opts.seed === undefined ? '' : `, seed ${opts.seed}`}). Its actions are noise; it exists to run`,
    'the real pi0 / pi0.5 code paths (serving, fine-tuning, sessions, benchmarks) offline.',
    '',
    `- layout: the Hub base layout of lerobot/${c.variant}_base (config.json, ${HUB_WEIGHTS_FILE}, ${plan.tensors} tensors, ${plan.dtype})`,
    `- parameters: ${plan.parameters}`,
    opts.tokenizer === false
      ? '- tokenizer: none (serving and training use PaliGemma\'s from the Hugging Face cache)'
      : `- tokenizer: a small test tokenizer (${TEST_TOKENIZER_VOCAB} ids), NOT PaliGemma's; with real weights use google/paligemma-3b-pt-224's`,
    '',
  ].join('\n');
}
