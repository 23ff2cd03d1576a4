/**
 * OpenPI observations in, the model's datum out (PROTOCOL.md section 6, step 2), and the model's
 * actions back to the robot's units (step 3). The order of the transforms is written once here:
 * raw state -> normalise -> model -> unnormalise actions -> add the state back (delta dims) ->
 * trim to the dataset's action dims.
 *
 * Keys of an observation, mapped to the checkpoint's cameras (`cameras[k]` is image slot k):
 * - `images: {name: frame}`: each name must be one of the cameras, by full name
 *   (`observation.images.cam_high`) or short name (`cam_high`).
 * - `observation/<name>` for a camera name, and OpenPI's positional keys: `observation/image` is
 *   the first camera, `observation/wrist_image` the second (a camera name wins over these).
 *   LeRobot's `observation.images.<name>` is accepted too.
 * - `observation/state`, `state` or `observation.state`: the robot state (1-D numbers).
 * - `prompt`: the task text (UTF-8). `image_codec`: RAW (default; uint8 HWC or CHW arrays),
 *   LOSSLESS, PNG, JPEG, CODEC_JPEG_Q<N>.
 * - Keys starting with `__` are ignored; any other key is an error (usually a typo). A camera
 *   may be left out (its slot is masked); a camera given twice is an error.
 */
import { distance } from 'fastest-levenshtein';
import { ProtocolError } from '../../protocol/errors.ts';
import { decodeFrameResized, parseCodec } from '../../protocol/frames.ts';
import { NDArray, unpackNumpy } from '../../protocol/ndarray.ts';
import { isZstdFrame, zstdDecompress } from '../../protocol/zstd.ts';
import { toAbsoluteActions, toDeltaActions } from '../../kernels/normalize.ts';
import type { DatumInput } from '../../kernels/small/batch.ts';
import { shortCamera, type PolicyMeta } from './meta.ts';

/** Size limits of the policy server (PROTOCOL.md section 8). */
export interface PolicyLimits {
  /** Largest websocket message, compressed or not; default 16 MiB. */
  maxMessageBytes: number;
  /** Largest decompressed observation; default 64 MiB. */
  maxDecompressedBytes: number;
  /** Largest frame, width * height; default 4096 * 4096. */
  maxImagePixels: number;
  /** Largest prompt in UTF-8 bytes; default 1024. */
  maxPromptBytes: number;
  /** Unanswered requests per connection before the connection is closed; default 4. */
  readAhead: number;
}

export const DEFAULT_POLICY_LIMITS: Readonly<PolicyLimits> = Object.freeze({
  maxMessageBytes: 16 * 1024 * 1024,
  maxDecompressedBytes: 64 * 1024 * 1024,
  maxImagePixels: 4096 * 4096,
  maxPromptBytes: 1024,
  readAhead: 4,
});

function bad(message: string): ProtocolError {
  return new ProtocolError('bad_request', message);
}

/**
 * A message's bytes to a plain tree (ndarrays as NDArray): zstd frames (magic 28 B5 2F FD) are
 * decompressed first, with the one of `dict` (the server's dictionary, then the operator's
 * `--zstd-dict` ones) whose id the frame names. Synchronous, so it
 * runs while the websocket's buffer is alive; everything kept is a copy.
 * @throws ProtocolError `bad_zstd`, `too_large`, `dictionary_mismatch`, `bad_msgpack`,
 *   `bad_request` (not a map), or as `unpackNumpy`.
 */
export function decodeMessage(bytes: Uint8Array, dict: Uint8Array | readonly Uint8Array[], maxDecompressedBytes: number): Record<string, unknown> {
  const plain = isZstdFrame(bytes) ? zstdDecompress(bytes, { dict, maxBytes: maxDecompressedBytes }) : bytes;
  const tree = unpackNumpy(plain);
  if (tree === null || typeof tree !== 'object' || Array.isArray(tree) || tree instanceof NDArray || Buffer.isBuffer(tree)) {
    throw bad(`an observation must be a msgpack map; got ${tree === null ? 'nil' : Array.isArray(tree) ? 'an array' : typeof tree === 'object' ? `a ${tree.constructor?.name ?? 'value'}` : typeof tree}`);
  }
  return tree as Record<string, unknown>;
}

/** An observation checked against the policy, frames still encoded. */
export interface ParsedObservation {
  codec: string;
  frames: { slot: number; key: string; frame: NDArray | Buffer }[];
  state: Float32Array; // raw, in the robot's units
  prompt: string;
}

const POSITIONAL: Record<string, number> = { image: 0, wrist_image: 1 };

function slotOf(meta: PolicyMeta, name: string, key: string, positional: boolean): number {
  const short = shortCamera(name);
  const k = meta.cameras.findIndex((c) => c === name || shortCamera(c) === short);
  if (k >= 0) return k;
  const p = positional ? POSITIONAL[name] : undefined;
  if (p !== undefined && p < meta.cameras.length) return p;
  const extra = positional ? ` (observation/image is ${meta.cameras[0]}${meta.cameras.length > 1 ? `, observation/wrist_image is ${meta.cameras[1]}` : ''})` : '';
  // A typo of the state key lands here too (observation/stat): say which key it probably meant.
  const near = ['state', ...meta.cameras.map(shortCamera)].find((k) => distance(k, short) <= Math.max(1, Math.floor(k.length / 4)));
  const hint = near ? ` (did you mean observation/${near}?)` : '';
  throw bad(`${key}: camera "${name}" is not one of this policy's cameras: ${meta.cameras.join(', ')}${extra}${hint}`);
}

function toState(v: unknown, key: string): Float32Array {
  let out: Float32Array;
  if (v instanceof NDArray) {
    if (v.shape.length !== 1) throw new ProtocolError('shape_mismatch', `${key} has shape [${v.shape.join(', ')}]; expected a 1-D array`);
    if (v.data instanceof Uint8Array && v.dtype.endsWith('b1')) throw bad(`${key} has dtype ${v.dtype}; expected numbers`);
    out = v.data instanceof Float32Array ? v.data : Float32Array.from(v.data as ArrayLike<number | bigint>, Number);
  } else if (Array.isArray(v) && v.every((x) => typeof x === 'number')) out = Float32Array.from(v);
  else throw bad(`${key} must be a 1-D numeric array; got ${v === null ? 'nil' : typeof v}`);
  const j = out.findIndex((x) => !Number.isFinite(x));
  if (j >= 0) throw bad(`${key}[${j}] is ${out[j]}; state values must be finite`);
  return out;
}

/**
 * The observation keys a client sends and what each holds, for the handshake metadata
 * (`observation_keys`), written from the same rules parseObservation applies: one
 * `observation/<camera>` per camera (short names), the state, the prompt.
 * Example (G1): {"observation/cam_high": "uint8 [height, width, 3] ...", "observation/state":
 * "float32 [26]", "prompt": "str, at most 1024 UTF-8 bytes"}.
 */
export function observationKeys(meta: PolicyMeta, limits: PolicyLimits): Record<string, string> {
  const out: Record<string, string> = {};
  for (const c of meta.cameras) {
    out[`observation/${shortCamera(c)}`] = 'uint8 [height, width, 3] or [3, height, width] (image_codec RAW, the default), or the bytes of a PNG / JPEG image with image_codec set; any size, resized with padding to image_size';
  }
  out['observation/state'] = meta.stateDim !== null ? `float32 [${meta.stateDim}], the robot's raw state (normalised by the server)` : `float32 [at most ${meta.model.stateDim}], the robot's raw state`;
  out.prompt = `str, at most ${limits.maxPromptBytes} UTF-8 bytes`;
  return out;
}

/**
 * Checks an observation's keys, cameras, state, prompt and codec against the policy
 * (synchronous: no frame is decoded yet).
 * @throws ProtocolError `bad_request` (unknown key, wrong camera, camera twice, missing or wrong
 *   state), `shape_mismatch`, `too_large` (prompt), `unknown_codec`.
 */
export function parseObservation(obs: Record<string, unknown>, meta: PolicyMeta, limits: PolicyLimits): ParsedObservation {
  const frames: ParsedObservation['frames'] = [];
  const bySlot = new Map<number, string>();
  const addFrame = (slot: number, key: string, frame: unknown) => {
    const prev = bySlot.get(slot);
    if (prev !== undefined) throw bad(`${key} and ${prev} are both camera ${meta.cameras[slot]}; send each camera once`);
    if (!(frame instanceof NDArray) && !Buffer.isBuffer(frame)) throw new ProtocolError('bad_frame', `${key} must be an image array or encoded bytes; got ${frame === null ? 'nil' : typeof frame}`);
    bySlot.set(slot, key);
    frames.push({ slot, key, frame });
  };
  let state: Float32Array | null = null;
  let stateKey = '';
  let prompt = '';
  let codec = 'RAW';
  for (const [key, value] of Object.entries(obs)) {
    if (key.startsWith('__')) continue;
    if (key === 'observation/state' || key === 'state' || key === 'observation.state') {
      if (state) throw bad(`${key} and ${stateKey} both give the state; send it once`);
      state = toState(value, key);
      stateKey = key;
    } else if (key === 'prompt') {
      if (typeof value === 'string') prompt = value;
      else if (Buffer.isBuffer(value)) prompt = value.toString('utf8');
      else throw bad(`prompt must be a string; got ${value === null ? 'nil' : typeof value}`);
    } else if (key === 'image_codec') {
      if (typeof value !== 'string') throw new ProtocolError('unknown_codec', `image_codec must be a string; got ${value === null ? 'nil' : typeof value}`);
      parseCodec(value);
      codec = value;
    } else if (key === 'images') {
      if (value === null || typeof value !== 'object' || value instanceof NDArray || Buffer.isBuffer(value) || Array.isArray(value)) {
        throw bad(`images must be a map of camera name -> frame; got ${value === null ? 'nil' : typeof value}`);
      }
      for (const [cam, frame] of Object.entries(value)) addFrame(slotOf(meta, cam, `images.${cam}`, false), `images.${cam}`, frame);
    } else if (key.startsWith('observation/')) {
      addFrame(slotOf(meta, key.slice('observation/'.length), key, true), key, value);
    } else if (key.startsWith('observation.images.')) {
      addFrame(slotOf(meta, key, key, false), key, value);
    } else {
      throw bad(
        `unknown observation key "${key}"; expected observation/image, observation/wrist_image, observation/<camera>, ` +
          `observation/state, images, state, prompt, image_codec (cameras: ${meta.cameras.join(', ')})`,
      );
    }
  }
  const want = meta.stateDim;
  if (!state) {
    if (want) throw bad(`the observation has no state (observation/state or state); this policy needs ${want} values`);
    state = new Float32Array(0);
  } else if (want !== null && state.length !== want) {
    throw new ProtocolError('shape_mismatch', `${stateKey} has ${state.length} values; this policy's state has ${want}`);
  } else if (state.length > meta.model.stateDim) {
    throw new ProtocolError('shape_mismatch', `${stateKey} has ${state.length} values; the model's state_dim is ${meta.model.stateDim}`);
  }
  const deltaNeeds = meta.deltaMask.lastIndexOf(true) + 1;
  if (state.length < deltaNeeds) throw new ProtocolError('shape_mismatch', `${stateKey || 'state'} has ${state.length} values; delta actions need ${deltaNeeds}`);
  const promptBytes = Buffer.byteLength(prompt, 'utf8');
  if (promptBytes > limits.maxPromptBytes) throw new ProtocolError('too_large', `prompt is ${promptBytes} bytes; the limit is ${limits.maxPromptBytes}`);
  return { codec, frames, state, prompt };
}

/**
 * Decodes and resizes the frames (sharp works off the event loop) and normalises the state:
 * the datum the model sees.
 * @throws ProtocolError from frame decoding, its message prefixed with the observation key.
 */
export async function toDatum(p: ParsedObservation, meta: PolicyMeta, limits: PolicyLimits): Promise<DatumInput> {
  const images: (Uint8Array | null)[] = new Array(meta.model.slots).fill(null);
  await Promise.all(
    p.frames.map(async ({ slot, key, frame }) => {
      try {
        images[slot] = (await decodeFrameResized(p.codec, frame, meta.model.imageSize, { maxPixels: limits.maxImagePixels })).data;
      } catch (e) {
        if (e instanceof ProtocolError) throw new ProtocolError(e.code, `${key}: ${e.message}`);
        throw e;
      }
    }),
  );
  const n = p.state.length;
  const state = meta.norm && n > 0 ? meta.norm.normalizer.normalize(p.state, n, meta.norm.stats.state) : p.state;
  return { images, state, prompt: p.prompt };
}

/**
 * One datum's model output to the robot's actions: the first action_horizon steps and the
 * dataset's action dims, unnormalised, with the raw state added back on the delta dims.
 * @param row the model's actions [model.horizon, model.actionDim], normalised.
 * @returns float32 [actionHorizon, actionDim], C order.
 */
export function toRobotActions(row: Float32Array, meta: PolicyMeta, rawState: Float32Array): Float32Array {
  const { horizon: H, actionDim: A } = meta.model;
  if (row.length !== H * A) throw new Error(`the model answered ${row.length} values for one datum; expected ${H} x ${A}`);
  const h = meta.actionHorizon;
  const a = meta.actionDim;
  let out: Float32Array = new Float32Array(h * a); // [ah, a]
  for (let i = 0; i < h; i++) out.set(row.subarray(i * A, i * A + a), i * a);
  if (meta.norm) out = meta.norm.normalizer.unnormalize(out, a, meta.norm.stats.actions);
  const mask = meta.deltaMask.slice(0, meta.deltaMask.lastIndexOf(true) + 1);
  if (mask.length > 0) out = toAbsoluteActions(out, a, rawState, mask);
  return out;
}

/**
 * The inverse of toRobotActions for the chunk a robot was sent: robot actions [h, a] (absolute,
 * robot units) as the model's chunk [H, A] relative to the observation's raw state `rawState`
 * (delta dims made relative to it again), normalised, padded with zeros to the model's horizon
 * and action dims. Used for real-time chunking (server/policy/rtc.ts): the previous chunk as the
 * model must continue it.
 */
export function toModelActions(actions: Float32Array, meta: PolicyMeta, rawState: Float32Array): Float32Array {
  const { horizon: H, actionDim: A } = meta.model;
  const h = meta.actionHorizon;
  const a = meta.actionDim;
  if (actions.length !== h * a) throw new Error(`a chunk of ${actions.length} values; the policy answers ${h} x ${a}`);
  let x: Float32Array = actions;
  const mask = meta.deltaMask.slice(0, meta.deltaMask.lastIndexOf(true) + 1);
  if (mask.length > 0) x = toDeltaActions(x, a, rawState, mask);
  if (meta.norm) x = meta.norm.normalizer.normalize(x, a, meta.norm.stats.actions);
  const out = new Float32Array(H * A);
  for (let i = 0; i < h; i++) out.set(x.subarray(i * a, (i + 1) * a), i * A);
  return out;
}
