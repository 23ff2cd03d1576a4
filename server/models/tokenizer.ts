/**
 * PaliGemma's SentencePiece tokenizer (BPE with byte fallback, 257,152 ids; FACTS.md section 3)
 * read from a Hugging Face `tokenizer.json` by `@huggingface/tokenizers` (tokenizers.js, the
 * Hugging Face port of the Rust library; ids checked against Python `tokenizers` and
 * `sentencepiece` in test/real-pi-tokenizer.test.ts), with the pi0 / pi0.5 prompt formats of
 * kernels/pi/prompt.ts on top.
 *
 * The files come from `google/paligemma-3b-pt-224` (gated on the Hub; not in the pi0 / pi0.5
 * checkpoint repos). findPaligemmaTokenizer looks for them in the Hugging Face cache.
 */
import fs from 'node:fs';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { Tokenizer } from '@huggingface/tokenizers';
import { hubCacheDir } from './hf-cache.ts';
import { pi0PromptTokens, pi05PromptTokens, type Pi0PromptStyle, type PromptTokens } from '../../kernels/pi/prompt.ts';

export type TokenizerErrorCode = 'missing_file' | 'bad_tokenizer';

/** The tokenizer layer's error: a file that is absent or is not a usable tokenizer. */
export class TokenizerError extends Error {
  readonly code: TokenizerErrorCode;
  constructor(code: TokenizerErrorCode, message: string) {
    super(message);
    this.name = 'TokenizerError';
    this.code = code;
  }
}

/** A loaded PaliGemma-style tokenizer. */
export interface PaligemmaTokenizer {
  /** Path of the tokenizer.json it was read from. */
  readonly file: string;
  /** Ids including added tokens. */
  readonly vocabSize: number;
  readonly bosId: number;
  readonly padId: number;
  /** Token ids of `text`, no BOS/EOS added. */
  encode(text: string): number[];
  /** The text of `ids` (byte-fallback pieces joined back into UTF-8). */
  decode(ids: readonly number[]): string;
  /** The pi0 prompt (BOS + cleaned task + "\n", or LeRobot's form), padded/cut to maxLen (48). */
  pi0Prompt(task: string, maxLen: number, style?: Pi0PromptStyle): PromptTokens;
  /**
   * The pi0.5 prompt with the state's 256 bins, padded/cut to maxLen (200).
   * @throws RangeError when a state value is NaN.
   */
  pi05Prompt(task: string, state: ArrayLike<number>, maxLen: number): PromptTokens;
}

/**
 * Reads `tokenizer.json` (and `tokenizer_config.json` beside it, when present) and builds the
 * tokenizer. `file` may be the json itself or the folder holding it. Async: the real file is
 * 34 MB of JSON.
 * @throws TokenizerError 'missing_file' (no tokenizer.json there), 'bad_tokenizer' (not JSON,
 *   not a BPE model with byte fallback, or without the `<bos>` / `<pad>` pieces).
 */
export async function loadPaligemmaTokenizer(file: string): Promise<PaligemmaTokenizer> {
  const jsonPath = fs.existsSync(file) && fs.statSync(file).isDirectory() ? path.join(file, 'tokenizer.json') : file;
  let text: string;
  try {
    text = await readFile(jsonPath, 'utf8');
  } catch (e) {
    throw new TokenizerError('missing_file', `cannot read the tokenizer ${jsonPath}: ${(e as Error).message}; PaliGemma's comes from ${PALIGEMMA_TOKENIZER_REPO} on the Hub: ${PALIGEMMA_TOKENIZER_DOWNLOAD}`);
  }
  const tokenizerJson = parseJson(jsonPath, text);
  const configPath = path.join(path.dirname(jsonPath), 'tokenizer_config.json');
  const config = fs.existsSync(configPath) ? parseJson(configPath, await readFile(configPath, 'utf8')) : {};
  const model = tokenizerJson.model as { type?: unknown; byte_fallback?: unknown } | undefined;
  if (model?.type !== 'BPE' || model.byte_fallback !== true) {
    throw new TokenizerError('bad_tokenizer', `${jsonPath}: model is ${JSON.stringify(model?.type)} with byte_fallback ${JSON.stringify(model?.byte_fallback)}; PaliGemma's is BPE with byte_fallback true`);
  }
  let tok: Tokenizer;
  try {
    tok = new Tokenizer(tokenizerJson, config);
  } catch (e) {
    throw new TokenizerError('bad_tokenizer', `${jsonPath}: tokenizers.js cannot build it: ${(e as Error).message}`);
  }
  const bosId = tok.token_to_id('<bos>');
  const padId = tok.token_to_id('<pad>');
  if (bosId === undefined || padId === undefined) {
    throw new TokenizerError('bad_tokenizer', `${jsonPath}: no ${bosId === undefined ? '<bos>' : '<pad>'} token; a PaliGemma tokenizer has <pad> 0, <eos> 1, <bos> 2`);
  }
  if (padId !== 0) throw new TokenizerError('bad_tokenizer', `${jsonPath}: <pad> is id ${padId}; the prompts pad with id 0, PaliGemma's <pad>`);
  const encode = (s: string): number[] => tok.encode(s, { add_special_tokens: false }).ids;
  return {
    file: jsonPath,
    vocabSize: tok.get_vocab(true).size,
    bosId,
    padId,
    encode,
    decode: (ids) => tok.decode([...ids], { skip_special_tokens: false }),
    pi0Prompt: (task, maxLen, style) => pi0PromptTokens(encode, task, maxLen, bosId, style),
    pi05Prompt: (task, state, maxLen) => pi05PromptTokens(encode, task, state, maxLen, bosId),
  };
}

function parseJson(file: string, text: string): Record<string, unknown> {
  try {
    const v = JSON.parse(text) as unknown;
    if (v === null || typeof v !== 'object' || Array.isArray(v)) throw new Error('not a JSON object');
    return v as Record<string, unknown>;
  } catch (e) {
    throw new TokenizerError('bad_tokenizer', `${file} is not a JSON object: ${(e as Error).message}`);
  }
}

/** The Hub repo PaliGemma's tokenizer files come from (pi0 / pi0.5 use its tokenizer). */
export const PALIGEMMA_TOKENIZER_REPO = 'google/paligemma-3b-pt-224';

/** The documented way to fetch it into the Hugging Face cache (gated: accept the licence first). */
export const PALIGEMMA_TOKENIZER_DOWNLOAD = `vela models download ${PALIGEMMA_TOKENIZER_REPO} --include 'tokenizer*'`;

/**
 * The `tokenizer.json` of one Hub repo's snapshot in the Hugging Face cache ($HF_HUB_CACHE, else
 * $HF_HOME/hub, else ~/.cache/huggingface/hub), or null when no snapshot of it holds one.
 */
function cachedRepoTokenizer(repoId: string, env: NodeJS.ProcessEnv): string | null {
  const snapshots = path.join(hubCacheDir(env), `models--${repoId.replace('/', '--')}`, 'snapshots');
  let entries: string[];
  try {
    entries = fs.readdirSync(snapshots);
  } catch {
    return null;
  }
  for (const snap of entries.sort()) {
    const file = path.join(snapshots, snap, 'tokenizer.json');
    if (fs.existsSync(file)) return file;
  }
  return null;
}

/**
 * The path of PaliGemma's `tokenizer.json` in the Hugging Face cache, or null when it is not
 * there: `models--google--paligemma-3b-pt-224/snapshots/<any>/tokenizer.json` (also the -224 `mix`
 * and 448 / 896 variants, which ship the same tokenizer). PALIGEMMA_TOKENIZER_DOWNLOAD puts it there.
 */
export function findPaligemmaTokenizer(env: NodeJS.ProcessEnv = process.env): string | null {
  for (const repo of ['paligemma-3b-pt-224', 'paligemma-3b-mix-224', 'paligemma-3b-pt-448', 'paligemma-3b-pt-896']) {
    const file = cachedRepoTokenizer(`google/${repo}`, env);
    if (file) return file;
  }
  return null;
}

/** A checkpoint's own tokenizer: the file, and where it was named (for logs and `vela models show`). */
export interface CheckpointTokenizer {
  file: string;
  /** `tokenizer.json in the folder`, `tokenizer/ (policy_preprocessor.json's tokenizer_processor)`, ... */
  from: string;
}

/** LeRobot's processor pipeline file, whose `tokenizer_processor` step names the tokenizer. */
const LEROBOT_PREPROCESSOR_FILE = 'policy_preprocessor.json';

/**
 * The tokenizer a checkpoint folder names or carries, or null when it has none of its own (the
 * caller then uses PaliGemma's from the HF cache). In order:
 * 1. `<dir>/tokenizer.json`: Vela's fine-tune outputs and exports.
 * 2. LeRobot's processor pipeline: `policy_preprocessor.json`'s `tokenizer_processor` step has
 *    `config.tokenizer_name`. LeRobot's `save_pretrained` saves the tokenizer it used as an
 *    artifact and writes its folder there, relative to the checkpoint (`"tokenizer"`, holding
 *    tokenizer.json and tokenizer_config.json; lerobot/processor/tokenizer_processor.py
 *    save_artifacts); older pipelines keep the Hub id they loaded (`google/paligemma-3b-pt-224`),
 *    looked up in the HF cache (null when it is not there).
 * 3. `<dir>/tokenizer/tokenizer.json` without a pipeline file naming it.
 * @throws TokenizerError 'bad_tokenizer' when policy_preprocessor.json is not JSON, or its
 *   tokenizer_name is an absolute path, leaves the folder (`..`, a link out of it), or is a
 *   folder of the checkpoint without a tokenizer.json ('missing_file').
 */
export function checkpointTokenizer(dir: string, env: NodeJS.ProcessEnv = process.env): CheckpointTokenizer | null {
  const own = path.join(dir, 'tokenizer.json');
  if (fs.existsSync(own)) return { file: own, from: 'tokenizer.json in the folder' };
  const named = lerobotTokenizerName(dir);
  if (named !== null) {
    const where = `${LEROBOT_PREPROCESSOR_FILE}'s tokenizer_processor step names tokenizer_name ${JSON.stringify(named)}`;
    if (path.isAbsolute(named) || named.split(/[\\/]/).includes('..')) {
      throw new TokenizerError('bad_tokenizer', `${where}: a tokenizer in the checkpoint must be a folder inside it (LeRobot writes "tokenizer")`);
    }
    const folder = path.join(dir, named);
    if (fs.existsSync(folder)) {
      const file = path.join(folder, 'tokenizer.json');
      const inside = path.relative(fs.realpathSync(dir), fs.realpathSync(folder));
      if (inside.startsWith('..') || path.isAbsolute(inside)) throw new TokenizerError('bad_tokenizer', `${where}, a link that leaves the checkpoint folder`);
      if (!fs.existsSync(file)) throw new TokenizerError('missing_file', `${where}, a folder without tokenizer.json (LeRobot saves tokenizer.json and tokenizer_config.json there)`);
      return { file, from: `${named}/ (${LEROBOT_PREPROCESSOR_FILE}'s tokenizer_processor)` };
    }
    if (/^[\w.-]+\/[\w.-]+$/.test(named)) {
      const cached = cachedRepoTokenizer(named, env);
      if (cached) return { file: cached, from: `${named} from the Hugging Face cache (${LEROBOT_PREPROCESSOR_FILE}'s tokenizer_processor)` };
    }
  }
  const folder = path.join(dir, 'tokenizer', 'tokenizer.json');
  if (fs.existsSync(folder)) return { file: folder, from: 'tokenizer/ in the folder' };
  return null;
}

/** policy_preprocessor.json's tokenizer_processor `tokenizer_name`, or null (no file, no step, no name). */
function lerobotTokenizerName(dir: string): string | null {
  const file = path.join(dir, LEROBOT_PREPROCESSOR_FILE);
  if (!fs.existsSync(file)) return null;
  const json = parseJson(file, fs.readFileSync(file, 'utf8'));
  const steps = Array.isArray(json.steps) ? (json.steps as unknown[]) : [];
  for (const s of steps) {
    const step = s as { registry_name?: unknown; config?: { tokenizer_name?: unknown } } | null;
    if (step?.registry_name !== 'tokenizer_processor') continue;
    const name = step.config?.tokenizer_name;
    return typeof name === 'string' && name.length > 0 ? name : null;
  }
  return null;
}
