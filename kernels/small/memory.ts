/**
 * Memory planning of a small preset's passes (issue 33): what one `sample`, or one
 * forward_backward / forward (estimatePassMemory, below), of batch b holds above the resident
 * weights, from the config's sizes alone (pure arithmetic), so that the server refuses a batch
 * that would not fit (507 / insufficient_memory) instead of being OOM-killed: --max-batch is
 * 256, and flow0-small's forward_backward holds ~0.6 GB per datum.
 *
 * What a sample holds: the prefix pass (kernels/small/model.ts encodePrefix) runs inside one
 * tf.tidy, so every layer's working set lives until the prefix's keys / values are cut out of it,
 * unless the layers are checkpointed (checkpointWanted: b * p * w > 500,000; each layer then frees
 * its own); the Euler steps after it are one step's activations each (kernels/flow.ts eulerSample
 * tidies per step), small beside the prefix, and num_steps does not enter (the eager sampler; the
 * graphs a session may trace are bounded apart, kernels/graph-cache.ts). Per datum and layer,
 * floats: 16 p w + 8 p m + 6 h p^2 (p prefix tokens, w width, m MLP width, h heads: norms,
 * projections, MLP, attention logits and probabilities).
 *
 * Calibration: tf.profile's peak numBytes above the resident tensors, flow0-tiny (p 156) at batch
 * 1, 4, 16: 29.1, 116.4, 465.3 MB (the formula, x1.15: 28.3 MB per datum); flow05-tiny (p 188)
 * batch 1 and 16: 35.8 and 572.4 MB (36.9 per datum); flow0-small (p 636) batch 1: 875 MB (968);
 * checkpointed: flow0-tiny batch 64: 676 MB (1.5 layers live, 680 MB), flow0-small batch 4:
 * 728 MB (697). test/memory-plan.test.ts holds it to 0.85x..1.25x.
 */
import type { PolicyConfig } from './config.ts';
import { checkpointWanted } from './model.ts';
import type { MemoryEstimate } from '../pi/memory.ts';

const F32 = 4;
/** The per-layer multiples above fall 4-15% short of the measurements: scaled up by this. */
const SCALE = 1.15;
/** Layers live at once when the prefix is checkpointed: one layer's working set and the kept outputs (measured 1.72 x unscaled). */
const CHECKPOINTED_LAYERS = 1.5;

/** Prefix tokens p and the floats of one prefix layer's working set per datum (the module comment's formula). */
function prefixLayer(c: PolicyConfig, cameras: number): { p: number; layer: number } {
  const p = cameras * c.patchesPerSlot + c.maxTokenLen + (c.variant === 'pi05' ? c.stateDim : 0);
  return { p, layer: 16 * p * c.width + 8 * p * c.mlpDim + 6 * c.heads * p * p };
}

function check(c: PolicyConfig, batch: number, cameras: number): void {
  if (!Number.isInteger(batch) || batch < 1) throw new RangeError(`batch is ${batch}; it must be an integer >= 1`);
  if (!Number.isInteger(cameras) || cameras < 1 || cameras > c.slots) throw new RangeError(`cameras is ${cameras}; it must be an integer in 1..${c.slots}`);
}

function activationsOnly(bytes: number): MemoryEstimate {
  const activations = Math.round(bytes);
  return { totalBytes: activations, tensorBytes: activations, parts: { weights: 0, trainable: 0, optimizer: 0, gradients: 0, activations, workspace: 0 } };
}

/**
 * Per datum, the layers' worth of prefix working sets a forward_backward keeps on its tape: 2.9
 * per layer, or 5.6 in all when the prefix is checkpointed (each layer's input kept, one layer
 * recomputed at a time, the suffix and the backward's own).
 */
const PASS_LAYERS = { perLayer: 2.9, checkpointed: 5.6 } as const;

/**
 * Bytes one eager forward_backward (or forward) of `batch` datums on preset `c` holds above the
 * weights and the tenant's state, with `cameras` filled camera slots: its tape (the graph of a
 * layout holds less; this is the bound). Calibration, tf.profile's peak above the resident
 * tensors (LoRA rank 8, 3 cameras): flow0-tiny batch 8: 565 MB (estimate 572), batch 64
 * (checkpointed): 2,182 MB (2,208), batch 256: 8,712 MB (8,832); flow0-small (checkpointed from
 * 3 datums) batch 8: 4,779 MB (4,713), batch 32: 18,895 MB (18,850). test/memory-plan.test.ts.
 * @throws RangeError as estimateSampleMemory.
 */
export function estimatePassMemory(c: PolicyConfig, batch: number, cameras = c.slots): MemoryEstimate {
  check(c, batch, cameras);
  const { p, layer } = prefixLayer(c, cameras);
  const layers = checkpointWanted(batch * p * c.width) ? PASS_LAYERS.checkpointed : PASS_LAYERS.perLayer * c.depth;
  return activationsOnly(F32 * batch * layers * layer);
}

/**
 * Bytes one eager sample of `batch` datums on preset `c` holds above the weights, with `cameras`
 * filled camera slots (the slots any datum of the batch fills; default all), as a MemoryEstimate
 * whose only part is activations (the weights and the runtime are resident already).
 * @throws RangeError for a batch or cameras that is not an integer >= 1 (cameras also <= c.slots).
 */
export function estimateSampleMemory(c: PolicyConfig, batch: number, cameras = c.slots): MemoryEstimate {
  check(c, batch, cameras);
  const { p, layer } = prefixLayer(c, cameras);
  const live = checkpointWanted(batch * p * c.width) ? CHECKPOINTED_LAYERS : c.depth;
  return activationsOnly(F32 * SCALE * batch * live * layer);
}
