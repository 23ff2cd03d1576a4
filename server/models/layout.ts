/**
 * How the main thread lays out a batch for an engine's model (kernels/small/batch.ts makeBatch):
 * slots, image side, prompt tokens, state, chunk, from the engine's info; for the real pi0 / pi0.5
 * also the PaliGemma prompt (kernels/pi/prompt.ts via server/models/tokenizer.ts), so a datum's
 * task becomes the ids the model was trained on.
 *
 * The tokenizer is the checkpoint folder's own when it carries or names one (Vela's `tokenizer.json`
 * in fine-tune outputs and the tiny CI checkpoints; the `tokenizer/` folder LeRobot's processor
 * pipeline saves; tokenizer.ts checkpointTokenizer), else PaliGemma's from the Hugging Face cache
 * (the public pi0 / pi0.5 repos ship none: it comes from the gated google/paligemma-3b-pt-224).
 */
import type { BatchLayout, MakeBatchOptions } from '../../kernels/small/batch.ts';
import type { RealPiConfig } from '../../kernels/pi/config.ts';
import type { PromptTokens } from '../../kernels/pi/prompt.ts';
import { ShapeError } from '../../kernels/errors.ts';
import type { EngineInfo } from '../engine/messages.ts';
import { realConfigOf } from './plan.ts';
import { checkpointTokenizer, findPaligemmaTokenizer, loadPaligemmaTokenizer, PALIGEMMA_TOKENIZER_REPO, TokenizerError, type PaligemmaTokenizer } from './tokenizer.ts';

/** A batch layout and, for the real family, its prompt encoder. */
export interface ModelLayout extends BatchLayout {
  family: EngineInfo['family'];
  encodePrompt?: MakeBatchOptions['encodePrompt'];
  /** The tokenizer.json in use (real family), for logs and info. */
  tokenizerFile: string | null;
  /** The real model's config (memory planning of each pass); null for presets. */
  real?: RealPiConfig | null;
}

const tokenizers = new Map<string, Promise<PaligemmaTokenizer>>();

/**
 * The tokenizer.json for a real checkpoint folder: its own (checkpointTokenizer), else PaliGemma's
 * in the HF cache.
 * @throws TokenizerError('missing_file') with the fix (the gated repo, HF_TOKEN, the command);
 *   TokenizerError from checkpointTokenizer for a pipeline file naming a bad tokenizer path.
 */
export function tokenizerFileFor(baseDir: string, env: NodeJS.ProcessEnv = process.env): string {
  const own = checkpointTokenizer(baseDir, env);
  if (own) return own.file;
  const cached = findPaligemmaTokenizer(env);
  if (cached) return cached;
  throw new TokenizerError(
    'missing_file',
    `the PaliGemma tokenizer is not in the Hugging Face cache and ${baseDir} has no tokenizer of its own (tokenizer.json, or the tokenizer/ folder LeRobot's processor pipeline saves): ${PALIGEMMA_TOKENIZER_REPO} is gated, so accept its licence on huggingface.co, set HF_TOKEN, and run \`vela models download ${PALIGEMMA_TOKENIZER_REPO} --include 'tokenizer*'\``,
  );
}

/**
 * The layout of `info`'s model. Small presets: byte prompts (makeBatch's default). Real
 * pi0 / pi0.5: the PaliGemma prompt, pi0.5's with the datum's normalised state as 256 bins.
 * The layout's encodePrompt throws ShapeError('too_large') for a prompt over max_token_len
 * tokens (never cuts it: the cut would drop pi0.5's state).
 * @throws TokenizerError when the real model's tokenizer cannot be found or read.
 */
export async function modelLayout(info: EngineInfo, env: NodeJS.ProcessEnv = process.env): Promise<ModelLayout> {
  const layout: ModelLayout = {
    family: info.family, slots: info.imageSlots, imageSize: info.imageSize, maxTokenLen: info.maxTokenLen, stateDim: info.stateDim,
    horizon: info.actionHorizon, actionDim: info.actionDim, padToken: info.padToken, tokenizerFile: null, real: null,
  };
  if (info.family === 'small' || !info.baseDir) return layout;
  const file = tokenizerFileFor(info.baseDir, env);
  let tok = tokenizers.get(file);
  if (!tok) {
    tok = loadPaligemmaTokenizer(file);
    tokenizers.set(file, tok);
    tok.catch(() => tokenizers.delete(file));
  }
  const t = await tok;
  layout.real = await realConfigOf(info.baseDir);
  const L = info.maxTokenLen;
  layout.tokenizerFile = file;
  const fits = (p: PromptTokens): PromptTokens => {
    if (p.fullLength <= L) return p;
    // A cut prompt would lose its end silently: pi0.5's is `Task: ...; State: ...;\nAction: `, so the state goes first.
    const what = info.family === 'pi05' ? 'tokens with its state (pi0.5 writes the state and "Action: " after the task)' : 'tokens';
    throw new ShapeError('too_large', `prompt is ${p.fullLength} ${what}; ${info.family}'s limit is ${L} (max_token_len): shorten the task`);
  };
  layout.encodePrompt = info.family === 'pi05' ? (prompt, state) => fits(t.pi05Prompt(prompt, state, L)) : (prompt) => fits(t.pi0Prompt(prompt, L));
  return layout;
}
