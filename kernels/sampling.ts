/**
 * The one entry to sampling an action chunk from a policy's weights (a training state's, a frozen
 * base's): checks, noise, real-time chunking's tensors, then the traced graph when there is one
 * (kernels/sample-graph.ts) and the family's eager sampler otherwise.
 */
import * as tf from '@tensorflow/tfjs';
import { sampleWithGraph } from './sample-graph.ts';
import { chunkTensors, type ChunkPrefix, type ChunkTensors } from './rtc.ts';
import { ShapeError } from './small/batch.ts';
import type { Rng } from './rng.ts';
import type { FlowPolicy, PolicyWeights } from './flow-policy.ts';
import { TrainerError, size } from './base-weights.ts';

/**
 * Euler sampling (MODEL.md "Sampling") of `policy` computing with `view` (a training state's
 * weights, or a frozen base's: BaseWeights.view): actions [b, ah, ad] float32, the prefix encoded
 * once and its keys / values cached unless `cache: false`. Noise is `options.noise` ([b, ah, ad],
 * the policy server's per-request streams, drawing nothing) or drawn from `rng`. With
 * `options.chunk` each datum's chunk continues its previous one (real-time chunking,
 * kernels/rtc.ts: guided by a vector-Jacobian product per step, or a trained policy's prefix).
 * `options.trace: false`: a layout without a graph yet samples eagerly instead of tracing one
 * (kernels/sample-graph.ts; the policy server's calls while other policies are busy).
 * @throws ShapeError (the batch, or noise of the wrong length), TrainerError('bad_option')
 *   for num_steps outside [1, 1000] or a chunk that does not fit the batch (naming the field).
 */
export function sampleActions<B, C>(policy: FlowPolicy<B, C>, view: PolicyWeights, batch: B, rng: Rng, options: { numSteps?: number; cache?: boolean; noise?: Float32Array; chunk?: ChunkPrefix; trace?: boolean } = {}): Float32Array {
  policy.checkBatch(batch, false);
  const numSteps = options.numSteps ?? 10;
  if (!Number.isInteger(numSteps) || numSteps < 1 || numSteps > 1000) {
    throw new TrainerError('bad_option', `num_steps is ${numSteps}; it must be an integer in [1, 1000]`);
  }
  const shape = [policy.batchSize(batch), policy.horizon, policy.actionDim];
  const n = size(shape);
  if (options.noise && options.noise.length !== n) throw new ShapeError('shape_mismatch', `noise has ${options.noise.length} values; the batch needs ${n}`);
  let chunk: ChunkTensors | undefined;
  if (options.chunk) {
    try {
      chunk = chunkTensors(options.chunk, shape[0]!, shape[1]!, shape[2]!);
    } catch (e) {
      throw new TrainerError('bad_option', (e as Error).message);
    }
  }
  const noise = tf.tensor(options.noise ?? rng.normals(n), shape);
  let out: tf.Tensor;
  try {
    const cache = options.cache !== false;
    out = (cache ? sampleWithGraph(policy, view, batch, noise, numSteps, chunk, options.trace !== false) : null) ?? policy.sample(view, batch, noise, numSteps, cache, chunk);
  } finally {
    tf.dispose([noise, ...(chunk ? [chunk.actions, chunk.weights, chunk.maxGuidance] : [])]);
  }
  const data = out.dataSync() as Float32Array;
  out.dispose();
  return data;
}
