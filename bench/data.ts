/**
 * Bench inputs from the real G1 dataset (episode 0 of datasets/g1_pick_bottle_sample, one camera at 480x640):
 * datums as a robot client sends them (frames encoded with a codec) and the same datums as the
 * engine's ModelBatch (decoded and resized the way server/sessions/ops.ts does). G1 has one camera;
 * 2 or 3 cameras reuse cam_high at other times of the episode under the names cam_left_wrist
 * and cam_right_wrist, so every frame is still a real, distinct picture.
 */
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { decodeFrame, encodeFrame, resizeWithPad } from '../protocol/frames.ts';
import { ndarray } from '../protocol/ndarray.ts';
import type { Datum } from '../protocol/client.ts';
import { makeBatch, type DatumInput, type ModelBatch } from '../kernels/small/batch.ts';
import type { PolicyConfig } from '../kernels/small/config.ts';
import { openDataset, type Dataset, type Frame } from '../server/datasets/index.ts';

export const G1_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../datasets/g1_pick_bottle_sample');
export const CAMERA_NAMES = ['cam_high', 'cam_left_wrist', 'cam_right_wrist'];

let ds: Promise<Dataset> | undefined;
function g1(): Promise<Dataset> {
  return (ds ??= openDataset(G1_DIR));
}

/** One G1 sample: raw frames per camera (full size), state, actions [horizon, A], prompt. */
export interface RawSample {
  frames: Frame[]; // one per camera, uint8 [480, 640, 3]
  state: Float32Array; // [S]
  actions: Float32Array; // [horizon, A] C order
  actionDim: number;
  prompt: string;
}

/** `count` samples of episode 0 at evenly spaced times, `cameras` frames each. */
export async function g1Samples(count: number, cameras: number, horizon: number): Promise<RawSample[]> {
  const d = await g1();
  const len = d.episode(0).length;
  const table = d.table(0);
  const A = d.meta.actionDim;
  const S = d.meta.stateDim;
  const out: RawSample[] = [];
  for (let i = 0; i < count; i++) {
    const t = Math.floor(((i + 0.5) * (len - horizon)) / count);
    const frames: Frame[] = [];
    for (let k = 0; k < cameras; k++) frames.push(await d.frame(0, 'cam_high', (t + k * 37) % len, null));
    out.push({
      frames,
      state: table.state.slice(t * S, (t + 1) * S),
      actions: table.action.slice(t * A, (t + horizon) * A),
      actionDim: A,
      prompt: d.prompt(0, t),
    });
  }
  return out;
}

/** The samples as session datums with frames encoded by `codec` (JPEG, LOSSLESS, PNG, RAW). */
export async function toDatums(samples: readonly RawSample[], codec: string): Promise<Datum[]> {
  return Promise.all(samples.map(async (s) => {
    const image: Record<string, any> = {};
    for (let k = 0; k < s.frames.length; k++) {
      const enc = await encodeFrame(codec, s.frames[k]!);
      image[CAMERA_NAMES[k]!] = enc instanceof Uint8Array ? enc : ndarray(enc.data as Uint8Array, enc.shape, enc.dtype);
    }
    return {
      observation: { image, state: ndarray(s.state, [s.state.length]), prompt: s.prompt },
      actions: ndarray(s.actions, [s.actions.length / s.actionDim, s.actionDim]),
    };
  }));
}

/**
 * The datums as the engine gets them from the server: every frame decoded with `codec`,
 * resized with padding to the model's image size, camera k in slot k.
 */
export async function toModelBatch(config: PolicyConfig, datums: readonly Datum[], codec: string): Promise<ModelBatch> {
  const inputs = await Promise.all(datums.map(async (d): Promise<DatumInput> => {
    const images: (Uint8Array | null)[] = new Array(config.slots).fill(null);
    const cams = Object.entries(d.observation.image ?? {});
    await Promise.all(cams.map(async ([, frame], k) => {
      images[k] = (await resizeWithPad(await decodeFrame(codec, frame as any), config.imageSize)).data;
    }));
    const a = d.actions!;
    return {
      images, state: d.observation.state!.data as Float32Array, prompt: d.observation.prompt ?? '',
      actions: { data: a.data as Float32Array, horizon: a.shape[0]!, dim: a.shape[1]! },
    };
  }));
  return makeBatch(config, inputs);
}

/** A deep copy of a batch (the engine takes its buffers by transfer). */
export function cloneBatch(b: ModelBatch): ModelBatch {
  return {
    size: b.size, images: b.images.slice(), imageMask: b.imageMask.slice(), tokens: b.tokens.slice(), tokenMask: b.tokenMask.slice(),
    state: b.state.slice(), actions: b.actions.slice(), actionMask: b.actionMask.slice(), weight: b.weight.slice(),
  };
}

