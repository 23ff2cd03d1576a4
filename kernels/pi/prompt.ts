/**
 * The pi0 / pi0.5 prompt formats (FACTS.md sections 1.10 and 3), as pure functions over a
 * text -> ids encoder (the PaliGemma SentencePiece tokenizer, server/models/tokenizer.ts), so the
 * model family holds its own prompt rules without holding a tokenizer library or a file.
 *
 *   pi0:               [BOS] + encode(task + "\n"), right-padded to 48 (LeRobot's form; openpi's
 *                      cleans the task and encodes the "\n" apart: Pi0PromptStyle)
 *   pi0.5 with state:  [BOS] + encode("Task: <clean(task)>, State: <b1> <b2> ... <bn>;\nAction: "),
 *                      right-padded to 200
 *   pi0.5 without state (openpi's `discrete_state_input=False`, e.g. `pi05_libero`): the pi0 form,
 *                      padded to 200
 *
 * Padding uses id 0
 * (`<pad>`) with mask 0; a longer prompt is cut to the limit (openpi and LeRobot both keep the
 * first tokens), and the result says it was.
 */

/** Encodes text to token ids, with no BOS/EOS added. */
export type TextEncoder = (text: string) => number[];

/** A padded prompt: ids and mask of one length (the token limit). */
export interface PromptTokens {
  /** Token ids, right-padded with 0. [maxLen] */
  tokens: Int32Array;
  /** 1 on real tokens, 0 on padding. [maxLen] */
  mask: Int32Array;
  /** Real tokens kept (<= maxLen). */
  length: number;
  /** Real tokens before the cut; > length when the prompt was truncated. */
  fullLength: number;
}

/** The PaliGemma (Gemma) id of `<bos>`, prepended to every prompt. */
export const PALIGEMMA_BOS_ID = 2;
/** The PaliGemma id of `<pad>`. */
export const PALIGEMMA_PAD_ID = 0;
/** pi0.5's state discretisation: 256 equal bins on [-1, 1]. */
export const STATE_BINS = 256;

/**
 * openpi's task-text cleaning: strip leading/trailing whitespace as Python's `str.strip()` does,
 * then every `_` and every newline becomes a space. No lower-casing; an inner "\r" or tab stays.
 */
export function cleanTaskText(text: string): string {
  return text.replace(PY_STRIP, '').replaceAll('_', ' ').replaceAll('\n', ' ');
}

// Python's str.isspace set (JS's trim differs: it strips U+FEFF and keeps U+001C-U+001F, U+0085).
const PY_SPACE = '\\t\\n\\v\\f\\r\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000';
const PY_STRIP = new RegExp(`^[${PY_SPACE}]+|[${PY_SPACE}]+$`, 'g');

/**
 * pi0.5's state bins: numpy `digitize(x, linspace(-1, 1, 257)[:-1]) - 1`, i.e. the number of left
 * edges -1, -1 + 2/256, ..., 1 - 2/256 that are <= x, minus 1. In [-1, 1) this is
 * floor((x + 1) * 128); x >= 1 - 2/256 gives 255 and x < -1 gives -1 (no clipping, as openpi);
 * +Infinity gives 255, -Infinity -1.
 * @param state normalised state, its native (unpadded) dimension. [s]
 * @returns integer bins in [-1, 255]. [s]
 * @throws RangeError naming the index when a value is NaN (numpy would silently give 255).
 */
export function discretizeState(state: ArrayLike<number>): number[] {
  const out: number[] = [];
  for (let i = 0; i < state.length; i++) {
    const x = state[i]!;
    if (Number.isNaN(x)) throw new RangeError(`state[${i}] is NaN; pi0.5 writes the state into its prompt as 256 bins of [-1, 1] and needs a number`);
    // Edge i is -1 + i/128, exact in float64, so comparing against the edges is numpy's
    // digitize. (x + 1) * 128 alone can round: x = -1e-30 would land in bin 128, not 127.
    const edge = (i: number): number => -1 + i / (STATE_BINS / 2);
    let count = x >= -1 ? Math.min(STATE_BINS, Math.floor((x + 1) * (STATE_BINS / 2)) + 1) : 0;
    while (count > 0 && x < edge(count - 1)) count--;
    while (count < STATE_BINS && x >= edge(count)) count++;
    out.push(count - 1);
  }
  return out;
}

/** The pi0.5 prompt string: `Task: <clean task>, State: <bins>;\nAction: ` (FACTS.md 1.10). */
export function pi05PromptText(task: string, state: ArrayLike<number>): string {
  return `Task: ${cleanTaskText(task)}, State: ${discretizeState(state).join(' ')};\nAction: `;
}

/**
 * Right-pads (id 0, mask 0) or cuts `ids` to `maxLen`.
 * @throws RangeError when maxLen is not a positive integer.
 */
export function padPrompt(ids: readonly number[], maxLen: number): PromptTokens {
  if (!Number.isSafeInteger(maxLen) || maxLen < 1) throw new RangeError(`prompt token limit ${maxLen} is not a positive integer`);
  const length = Math.min(ids.length, maxLen);
  const tokens = new Int32Array(maxLen).fill(PALIGEMMA_PAD_ID);
  const mask = new Int32Array(maxLen);
  for (let i = 0; i < length; i++) {
    tokens[i] = ids[i]!;
    mask[i] = 1;
  }
  return { tokens, mask, length, fullLength: ids.length };
}

/**
 * Whose pi0 prompt: 'lerobot' (the default: where openpi and LeRobot differ, Vela follows
 * LeRobot, whose checkpoints users download; its pi0 processor): the task as given with "\n"
 * appended unless it already ends in one, encoded in one pass; 'openpi' (openpi's data pipeline, which trained the base
 * weights): the cleaned task, then a separately encoded "\n". They differ on `_`, newlines and
 * surrounding whitespace in the task (FACTS.md section 7).
 */
export type Pi0PromptStyle = 'openpi' | 'lerobot';

/**
 * The pi0 prompt (also pi0.5 without state): BOS, the task, "\n" (see Pi0PromptStyle), padded
 * or cut to `maxLen` (48 for pi0, 200 for pi0.5).
 */
export function pi0PromptTokens(encode: TextEncoder, task: string, maxLen: number, bosId = PALIGEMMA_BOS_ID, style: Pi0PromptStyle = 'lerobot'): PromptTokens {
  // LeRobot's newline step appends "\n" only to a task that does not already end in one.
  const ids = style === 'lerobot' ? encode(task.endsWith('\n') ? task : `${task}\n`) : [...encode(cleanTaskText(task)), ...encode('\n')];
  return padPrompt([bosId, ...ids], maxLen);
}

/**
 * The pi0.5 prompt with the discretised state (see discretizeState for the bins and errors),
 * BOS first, padded or cut to `maxLen` (200).
 * @param state normalised state in its native dimension (not padded to 32). [s]
 */
export function pi05PromptTokens(encode: TextEncoder, task: string, state: ArrayLike<number>, maxLen: number, bosId = PALIGEMMA_BOS_ID): PromptTokens {
  return padPrompt([bosId, ...encode(pi05PromptText(task, state))], maxLen);
}
