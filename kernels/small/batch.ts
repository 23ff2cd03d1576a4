/**
 * The model's one structured input (openpi's `Observation` plus the training targets), and the
 * function that builds it from per-datum pieces and rejects bad input. The server decodes and
 * resizes frames (D12) before calling makeBatch; here every image is already image_size square.
 */
import type { PolicyConfig } from './config.ts';
import { Rng } from '../rng.ts';
import { ShapeError } from '../errors.ts';

export { ShapeError, type ShapeErrorCode } from '../errors.ts';

/** A batch in the model's layout. All arrays are C order. */
export interface ModelBatch {
  readonly size: number; // b
  readonly images: Uint8Array; // [b, slots, S, S, 3] uint8 RGB, S = image_size; zeros where masked
  readonly imageMask: Uint8Array; // [b, slots] 1 = the slot has a frame
  readonly tokens: Int32Array; // [b, max_token_len] prompt bytes 0..255, padding 256 (D5)
  readonly tokenMask: Uint8Array; // [b, max_token_len] 1 = a real byte
  readonly state: Float32Array; // [b, s] normalised state, zero-padded to state_dim
  readonly actions: Float32Array; // [b, ah, ad] normalised actions, zero-padded
  readonly actionMask: Float32Array; // [b, ah, ad] 1 = a real (h, a) entry, 0 = padding
  readonly weight: Float32Array; // [b] datum weights >= 0
}

/** One datum as the server hands it over. */
export interface DatumInput {
  /** Per image slot: an S x S x 3 uint8 frame (S = image_size), or null/undefined for an empty slot. */
  images: readonly (Uint8Array | null | undefined)[];
  /** Normalised state, length <= state_dim. */
  state: Float32Array | readonly number[];
  prompt: string;
  /** Normalised actions [h', a'] in C order with h' <= horizon, a' <= action_dim; absent for sampling. */
  actions?: { data: Float32Array | readonly number[]; horizon: number; dim: number };
  /** >= 0, default 1. */
  weight?: number;
}

export interface MakeBatchOptions {
  /** Prompt limit before truncation (PROTOCOL.md section 8), default 1024 bytes. */
  maxPromptBytes?: number;
  /**
   * The model's own prompt tokens (the real pi0 / pi0.5: PaliGemma ids by kernels/pi/prompt.ts,
   * pi0.5's with the datum's state): tokens and mask of length max_token_len. Default: the small
   * presets' UTF-8 bytes (tokenizePrompt). Called after the maxPromptBytes check.
   */
  encodePrompt?: (prompt: string, state: ArrayLike<number>) => { tokens: ArrayLike<number>; mask: ArrayLike<number> };
}

/**
 * What makeBatch needs of a model: image slots and side, prompt tokens, state, action chunk (a
 * small preset's PolicyConfig has these; the server builds one for the real pi0 / pi0.5 from its
 * engine's info).
 */
export type BatchLayout = Pick<PolicyConfig, 'slots' | 'imageSize' | 'maxTokenLen' | 'stateDim' | 'horizon' | 'actionDim' | 'padToken'>;

const encoder = new TextEncoder();

/**
 * The prompt's UTF-8 bytes as tokens, truncated to max_token_len, padded with 256 (D5: no
 * BOS/EOS). Returns tokens [max_token_len] int32 and mask [max_token_len] uint8.
 * Throws ShapeError('too_large') when the prompt is over maxPromptBytes.
 */
export function tokenizePrompt(config: BatchLayout, prompt: string, maxPromptBytes = 1024): { tokens: Int32Array; mask: Uint8Array } {
  const bytes = encoder.encode(prompt);
  if (bytes.length > maxPromptBytes) {
    throw new ShapeError('too_large', `prompt is ${bytes.length} bytes; the limit is ${maxPromptBytes}`);
  }
  const tokens = new Int32Array(config.maxTokenLen).fill(config.padToken);
  const mask = new Uint8Array(config.maxTokenLen);
  const n = Math.min(bytes.length, config.maxTokenLen);
  for (let i = 0; i < n; i++) {
    tokens[i] = bytes[i]!;
    mask[i] = 1;
  }
  return { tokens, mask };
}

/**
 * Builds a ModelBatch from datums, validating every piece against the config.
 * Throws ShapeError: 'empty_batch' (no datum), 'shape_mismatch' (more image slots than the
 * model has, a frame of the wrong byte length, state longer than state_dim, actions larger
 * than horizon x action_dim or with a data length that is not h' x a'), 'too_large' (prompt),
 * 'bad_value' (a negative or non-finite weight, a non-finite state or action value).
 */
export function makeBatch(config: BatchLayout, datums: readonly DatumInput[], options: MakeBatchOptions = {}): ModelBatch {
  const B = datums.length;
  if (B === 0) throw new ShapeError('empty_batch', 'the batch has 0 datums; at least 1 is needed');
  const { slots, imageSize: S, maxTokenLen: L, stateDim, horizon: H, actionDim: A } = config;
  const frameBytes = S * S * 3;
  const images = new Uint8Array(B * slots * frameBytes);
  const imageMask = new Uint8Array(B * slots);
  const tokens = new Int32Array(B * L);
  const tokenMask = new Uint8Array(B * L);
  const state = new Float32Array(B * stateDim);
  const actions = new Float32Array(B * H * A);
  const actionMask = new Float32Array(B * H * A);
  const weight = new Float32Array(B);
  datums.forEach((d, i) => {
    if (d.images.length > slots) {
      throw new ShapeError('shape_mismatch', `datum ${i} has ${d.images.length} images; the model has ${slots} image slots`);
    }
    d.images.forEach((img, k) => {
      if (img == null) return;
      if (img.length !== frameBytes) {
        throw new ShapeError('shape_mismatch', `datum ${i} image ${k} is ${img.length} bytes; expected ${S}x${S}x3 = ${frameBytes}`);
      }
      images.set(img, (i * slots + k) * frameBytes);
      imageMask[i * slots + k] = 1;
    });
    const tok = tokenizePrompt(config, d.prompt, options.maxPromptBytes ?? 1024);
    if (d.state.length > stateDim) {
      throw new ShapeError('shape_mismatch', `datum ${i} state has ${d.state.length} values; the model's state_dim is ${stateDim}`);
    }
    for (let j = 0; j < d.state.length; j++) {
      const v = d.state[j]!;
      if (!Number.isFinite(v)) throw new ShapeError('bad_value', `datum ${i} state[${j}] is ${v}; values must be finite`);
      state[i * stateDim + j] = v;
    }
    // The real family's prompt reads the state (pi0.5's bins), so it is encoded once the state is checked.
    if (options.encodePrompt) {
      const own = options.encodePrompt(d.prompt, d.state);
      if (own.tokens.length !== L || own.mask.length !== L) throw new ShapeError('shape_mismatch', `datum ${i} prompt encodes to ${own.tokens.length} tokens; the model takes ${L}`);
      tok.tokens.set(own.tokens);
      tok.mask.set(own.mask);
    }
    tokens.set(tok.tokens, i * L);
    tokenMask.set(tok.mask, i * L);
    if (d.actions) {
      const { data, horizon: h, dim: a } = d.actions;
      if (h > H || a > A) {
        throw new ShapeError('shape_mismatch', `datum ${i} actions are [${h}, ${a}]; the model takes at most [${H}, ${A}]`);
      }
      if (data.length !== h * a) {
        throw new ShapeError('shape_mismatch', `datum ${i} actions have ${data.length} values; shape [${h}, ${a}] needs ${h * a}`);
      }
      for (let r = 0; r < h; r++) {
        for (let c = 0; c < a; c++) {
          const v = data[r * a + c]!;
          if (!Number.isFinite(v)) throw new ShapeError('bad_value', `datum ${i} actions[${r}, ${c}] is ${v}; values must be finite`);
          actions[(i * H + r) * A + c] = v;
          actionMask[(i * H + r) * A + c] = 1;
        }
      }
    }
    const w = d.weight ?? 1;
    if (!Number.isFinite(w) || w < 0) throw new ShapeError('bad_value', `datum ${i} weight is ${w}; it must be finite and >= 0`);
    weight[i] = w;
  });
  return { size: B, images, imageMask, tokens, tokenMask, state, actions, actionMask, weight };
}

export interface FakeBatchOptions {
  /** Image slots to leave empty in every datum (tests of D13). */
  emptySlots?: readonly number[];
  /** Valid action entries per datum, [h', a'] (default the full horizon x action_dim). */
  actionShape?: readonly [number, number];
}

/** A random but valid batch for tests and the bench: noise images, short prompts, N(0,1)/2
 * state and actions, weight 1. Deterministic in `seed`. */
export function fakeBatch(config: PolicyConfig, size: number, seed = 0, options: FakeBatchOptions = {}): ModelBatch {
  const rng = new Rng(seed);
  const S = config.imageSize;
  const [h, a] = options.actionShape ?? [config.horizon, config.actionDim];
  const datums: DatumInput[] = [];
  for (let i = 0; i < size; i++) {
    const images: (Uint8Array | null)[] = [];
    for (let k = 0; k < config.slots; k++) {
      if (options.emptySlots?.includes(k)) {
        images.push(null);
        continue;
      }
      const img = new Uint8Array(S * S * 3);
      for (let j = 0; j < img.length; j++) img[j] = rng.nextU32() & 255;
      images.push(img);
    }
    const state = rng.normals(config.stateDim).map((x) => x * 0.5);
    const actions = rng.normals(h * a).map((x) => x * 0.5);
    datums.push({ images, state, prompt: `pick up the bottle ${i}`, actions: { data: actions, horizon: h, dim: a }, weight: 1 });
  }
  return makeBatch(config, datums);
}

/** Datums [start, end) of a batch as a new batch (copies). Throws ShapeError for an empty range. */
export function sliceBatch(batch: ModelBatch, start: number, end: number): ModelBatch {
  if (!(start >= 0 && end <= batch.size && start < end)) {
    throw new ShapeError('empty_batch', `slice [${start}, ${end}) of a batch of ${batch.size} is empty or out of range`);
  }
  const B = batch.size;
  const part = <T extends Uint8Array | Int32Array | Float32Array>(a: T): T => {
    const per = a.length / B;
    return a.slice(start * per, end * per) as T;
  };
  return {
    size: end - start,
    images: part(batch.images),
    imageMask: part(batch.imageMask),
    tokens: part(batch.tokens),
    tokenMask: part(batch.tokenMask),
    state: part(batch.state),
    actions: part(batch.actions),
    actionMask: part(batch.actionMask),
    weight: part(batch.weight),
  };
}

/**
 * The ArrayBuffers behind a batch's arrays, to transfer it to a worker without copying (the batch
 * is unusable after: the caller must keep no reference to it). An array that is a view on part of
 * a larger buffer is left out (postMessage copies it), so a transfer never detaches bytes that are
 * not the batch's; a buffer shared by two arrays is listed once.
 */
export function batchBuffers(b: ModelBatch): ArrayBuffer[] {
  const out = new Set<ArrayBuffer>();
  for (const a of [b.images, b.imageMask, b.tokens, b.tokenMask, b.state, b.actions, b.actionMask, b.weight]) {
    if (a.buffer instanceof ArrayBuffer && a.byteOffset === 0 && a.byteLength === a.buffer.byteLength) out.add(a.buffer);
  }
  return [...out];
}
