/**
 * The server's batch layout (kernels/small/batch.ts ModelBatch: what sessions, jobs and the policy
 * server build from wire data) as the real model's RealPiBatch. The server decodes each camera's
 * frame to S x S RGB uint8 (S = vision.imageSize), binds cameras to the model's slots, and, for
 * this family, fills `tokens` with PaliGemma ids from the pi0 / pi0.5 prompt rules
 * (kernels/pi/prompt.ts); what is left is the pixel convention (FACTS.md 1.15: channels first,
 * x / 255 * 2 - 1) and the loss mask.
 */
import type { ModelBatch } from '../small/batch.ts';
import { ShapeError } from '../errors.ts';
import type { RealPiConfig } from './config.ts';
import type { RealPiBatch } from './model.ts';

/**
 * RealPiBatch of a ModelBatch laid out for config `c` (slots = cameras, image side
 * c.vision.imageSize, tokens [b, L] with L <= maxTokenLen, state [b, c.stateDim], actions and
 * actionMask [b, ah, ad]).
 * @param mb images uint8 [b, nc, S, S, 3] RGB (zeros and mask 0 for an absent camera),
 *   imageMask [b, nc], tokens int32 [b, L] PaliGemma ids, tokenMask [b, L], state float32
 *   [b, sd] normalised (pi0's state token; pi0.5 reads its state from the prompt), actions /
 *   actionMask float32 [b, ah, ad], weight [b].
 * @returns images float32 [b, nc', 3, S, S] in [-1, 1], nc' the slots some datum fills (at least
 *   one), imageMasks [b, nc']; tokens / tokenMasks [b, L'], L' up to the last real token of the
 *   longest prompt; the other fields as views.
 * @throws ShapeError('shape_mismatch') when images do not split into S x S x 3 frames per slot.
 */
export function toRealPiBatch(c: RealPiConfig, mb: ModelBatch): RealPiBatch {
  const b = mb.size;
  const S = c.vision.imageSize;
  const frame = S * S * 3;
  const nc = mb.imageMask.length / b;
  if (!Number.isInteger(nc) || nc < 1 || mb.images.length !== b * nc * frame) {
    throw new ShapeError('shape_mismatch', `images has ${mb.images.length} bytes for ${b} datums and ${mb.imageMask.length / b} cameras; expected [b, nc, ${S}, ${S}, 3] uint8`);
  }
  // A slot no datum fills is dropped: its tokens would be computed only to be masked out of
  // every attention row and position (FACTS 1.7), so the answer is the same without them and a
  // one-camera robot does not pay for three SigLIP passes and a 3x longer prefix.
  const keep: number[] = [];
  for (let k = 0; k < nc; k++) {
    for (let i = 0; i < b; i++) {
      if (mb.imageMask[i * nc + k]) {
        keep.push(k);
        break;
      }
    }
  }
  if (keep.length === 0) keep.push(0);
  const kc = keep.length;
  const images = new Float32Array(b * kc * frame);
  const imageMasks = new Uint8Array(b * kc);
  const plane = S * S;
  for (let f = 0; f < b * kc; f++) {
    const i = Math.floor(f / kc);
    const k = keep[f % kc]!;
    imageMasks[f] = mb.imageMask[i * nc + k]!;
    const src = (i * nc + k) * frame;
    const dst = f * frame;
    for (let p = 0; p < plane; p++) {
      // HWC uint8 -> CHW in [-1, 1]: x / 255 * 2 - 1 (FACTS 1.15; an absent camera's zeros give -1).
      images[dst + p] = (mb.images[src + p * 3]! / 255) * 2 - 1;
      images[dst + plane + p] = (mb.images[src + p * 3 + 1]! / 255) * 2 - 1;
      images[dst + 2 * plane + p] = (mb.images[src + p * 3 + 2]! / 255) * 2 - 1;
    }
  }
  // Likewise the prompt's padding after the longest real prompt of the batch (pi0.5 pads every
  // prompt to 200 tokens; a task is 10-30 of them): masked keys, no position, no effect.
  const L = mb.tokenMask.length / b;
  let used = 1;
  for (let i = 0; i < b; i++) {
    for (let j = L - 1; j >= used; j--) {
      if (mb.tokenMask[i * L + j]) {
        used = j + 1;
        break;
      }
    }
  }
  const tokens = used === L ? mb.tokens : new Int32Array(b * used);
  const tokenMasks = used === L ? mb.tokenMask : new Uint8Array(b * used);
  if (used !== L) {
    for (let i = 0; i < b; i++) {
      (tokens as Int32Array).set(mb.tokens.subarray(i * L, i * L + used), i * used);
      (tokenMasks as Uint8Array).set(mb.tokenMask.subarray(i * L, i * L + used), i * used);
    }
  }
  const hasActions = mb.actionMask.some((m) => m !== 0);
  return {
    size: b,
    numCameras: kc,
    images,
    imageMasks,
    tokens,
    tokenMasks,
    state: c.variant === 'pi0' ? mb.state : undefined,
    actions: hasActions ? mb.actions : undefined,
    actionMask: hasActions ? mb.actionMask : undefined,
    weight: mb.weight,
  };
}
