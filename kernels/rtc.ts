/**
 * Real-time chunking (RTC): sampling a new action chunk that agrees with the one a robot is
 * still executing. A robot asks for the next chunk after executing `s` actions of the current
 * one and gets it `d` control steps later (the delay); the new chunk's index i is the action due
 * i steps after the observation, so the old chunk covers new indices 0 .. overlap - 1 (overlap =
 * H_old - s), and its first d actions are what the robot executes before the new chunk arrives.
 *
 * Two ways to make the new chunk continue the old one, in openpi's time convention (t = 1 noise,
 * t = 0 actions; x_t = t * noise + (1 - t) * actions, v = noise - actions):
 *
 * - `guided` (Black, Galliker, Levine 2025, "Real-Time Execution of Action Chunking Flow
 *   Policies", Algorithm 1): inpainting by guidance, for any checkpoint. At each Euler step the
 *   predicted clean chunk is Â(x) = x - t v(x, t); with the weighted error
 *   L(x) = 1/2 sum W ⊙ (Y - Â(x))^2 the velocity becomes v + c(t) ∇_x L, where ∇_x L is a
 *   vector-Jacobian product through the model (one backward pass per step) and
 *   c(t) = min(β, ((1 - t)^2 + t^2) / (t (1 - t))) (the paper's (1 - τ) / (τ r_τ^2) with τ = 1 - t).
 *   The weights W (rtcWeights) are 1 on the first d actions, decay over the rest of the overlap
 *   and are 0 on the free tail.
 * - `prefix` (training-time RTC, arXiv 2512.05964): a policy fine-tuned with random delays
 *   (TrainingOptions.rtcMaxDelay), the first d actions given clean at their own flow time 0 and
 *   the loss on the rest, is sampled with those d actions written into x at every step (time 0
 *   for them, t for the rest): no backward pass.
 *
 * The prefix arrays are in the model's action space (normalised, padded to the model's
 * action_dim); the server turns a robot's chunk into them (server/policy/rtc.ts).
 */
import * as tf from '@tensorflow/tfjs';

/** How a chunk is made to continue the previous one (see the module comment). */
export type RtcMode = 'guided' | 'prefix';

/** The paper's cap β on the guidance weight (its experiments use 5). */
export const DEFAULT_MAX_GUIDANCE = 5;

/**
 * What a new chunk must agree with, per datum of a batch of b, in the model's action space.
 * `actions` [b, ah, ad] float32: the previous chunk at the new chunk's indices (entries past the
 * overlap are ignored: their weight is 0). `weights` [b, ah, ad] float32 in [0, 1]: guided, the
 * guidance weights W (rtcWeights broadcast over the dims that count); prefix, 1 on every dim of
 * the first d_i actions of datum i (its delay) and 0 elsewhere.
 */
export interface ChunkPrefix {
  readonly mode: RtcMode;
  readonly actions: Float32Array;
  readonly weights: Float32Array;
  /**
   * guided: β, the cap on the guidance weight (DEFAULT_MAX_GUIDANCE): one for the whole batch, or
   * one per datum ([b]: the policy server batches robots of different `rtc_max_guidance`).
   */
  readonly maxGuidance?: number | ArrayLike<number>;
}

/** How the guidance weights fall over the overlap after the delay: the paper's exponential, or linear. */
export type RtcSchedule = 'exp' | 'linear';

/**
 * The guidance weights [horizon] (the paper's soft mask, eq. 5): 1 for i < delay; for
 * delay <= i < overlap, c_i (e^{c_i} - 1) / (e - 1) (exp) or c_i (linear) with
 * c_i = (overlap - i) / (overlap - delay + 1); 0 for i >= overlap. `delay` is clamped to the
 * overlap, the overlap to the horizon.
 * @throws RangeError for a negative or non-integer delay or overlap.
 */
export function rtcWeights(horizon: number, delay: number, overlap: number, schedule: RtcSchedule = 'exp'): Float32Array {
  for (const [name, v] of [['delay', delay], ['overlap', overlap]] as const) {
    if (!Number.isInteger(v) || v < 0) throw new RangeError(`${name} is ${v}; it must be an integer >= 0`);
  }
  const o = Math.min(overlap, horizon);
  const d = Math.min(delay, o);
  const w = new Float32Array(horizon);
  for (let i = 0; i < o; i++) {
    if (i < d) w[i] = 1;
    else {
      const c = (o - i) / (o - d + 1);
      w[i] = schedule === 'linear' ? c : (c * (Math.exp(c) - 1)) / (Math.E - 1);
    }
  }
  return w;
}

/**
 * The guidance weight c(t) = min(β, ((1 - t)^2 + t^2) / (t (1 - t))) at flow time t (openpi's
 * convention): β at both ends (the expression is infinite there), 2 at t = 0.5.
 */
export function guidanceWeight(t: number, maxGuidance: number): number {
  const c = ((1 - t) * (1 - t) + t * t) / (t * (1 - t));
  return Number.isFinite(c) ? Math.min(maxGuidance, c) : maxGuidance;
}

/**
 * The vector-Jacobian product of the guided step: for x [b, ah, ad] at time t, v = velocityAt(x)
 * and ∇_x L with L = 1/2 sum(weights ⊙ (target - (x - t v))^2), by one backward pass through
 * the model. Returns both (the caller owns them). target, weights [b, ah, ad].
 */
export function guidanceGradient(velocityAt: (x: tf.Tensor) => tf.Tensor, x: tf.Tensor, t: number, target: tf.Tensor, weights: tf.Tensor): { velocity: tf.Tensor; grad: tf.Tensor } {
  let velocity: tf.Tensor | null = null;
  const grad = tf.grad((xx: tf.Tensor) => {
    velocity = tf.keep(velocityAt(xx));
    const err = tf.sub(target, tf.sub(xx, tf.mul(velocity, t)));
    return tf.mul(tf.sum(tf.mul(weights, tf.square(err))), 0.5);
  })(x);
  return { velocity: velocity!, grad };
}

/**
 * guidanceWeight with β a float32 tensor (a graph input; [b, 1, 1], a β per datum):
 * min(β, fround(c(t))), which is fround(guidanceWeight(t, β)) for a float32 β (fround is
 * monotone), so the traced graph's step weight is the eager one's bits. Returns a new tensor of
 * β's shape (the caller owns it).
 */
export function guidanceWeightTensor(t: number, maxGuidance: tf.Tensor): tf.Tensor {
  const c = ((1 - t) * (1 - t) + t * t) / (t * (1 - t));
  return Number.isFinite(c) ? tf.minimum(maxGuidance, c) : tf.clone(maxGuidance);
}

/** A ChunkPrefix as tensors for one sampling call (inputs of a traced graph). */
export interface ChunkTensors {
  readonly mode: RtcMode;
  readonly actions: tf.Tensor; // [b, ah, ad]
  readonly weights: tf.Tensor; // [b, ah, ad]
  /**
   * β per datum, float32 [b, 1, 1]: an input of a traced graph like the chunk itself, so no value
   * a client sends (?rtc_max_guidance=) traces a graph of its own, and robots of different β share
   * one batch and one graph (issue 32 item 7).
   */
  readonly maxGuidance: tf.Tensor;
}

/**
 * Checks `chunk` against a batch of `b` chunks of [horizon, actionDim] and makes its tensors
 * (the caller disposes `actions`, `weights` and `maxGuidance`).
 * @throws RangeError naming the field for a wrong length (β: one, or one per datum), a weight
 *   outside [0, 1] (prefix: not 0 or 1 alike over an action's dims), an action that is not finite,
 *   a β that is not a finite number >= 0, or an unknown mode.
 */
export function chunkTensors(chunk: ChunkPrefix, b: number, horizon: number, actionDim: number): ChunkTensors {
  const n = b * horizon * actionDim;
  if (chunk.mode !== 'guided' && chunk.mode !== 'prefix') throw new RangeError(`rtc mode is ${JSON.stringify(chunk.mode)}; expected 'guided' or 'prefix'`);
  if (chunk.actions.length !== n) throw new RangeError(`rtc actions have ${chunk.actions.length} values; a batch of ${b} needs [${b}, ${horizon}, ${actionDim}] = ${n}`);
  if (chunk.weights.length !== n) throw new RangeError(`rtc weights have ${chunk.weights.length} values; a batch of ${b} needs [${b}, ${horizon}, ${actionDim}] = ${n}`);
  for (let i = 0; i < n; i++) {
    const w = chunk.weights[i]!;
    if (!(w >= 0 && w <= 1)) throw new RangeError(`rtc weights[${i}] is ${w}; weights lie in [0, 1]`);
    if (chunk.mode === 'prefix' && w !== chunk.weights[i - (i % actionDim)]) throw new RangeError(`rtc weights[${i}] is ${w}; prefix weights are 1 on every dim of a held action and 0 elsewhere`);
    if (chunk.mode === 'prefix' && w !== 0 && w !== 1) throw new RangeError(`rtc weights[${i}] is ${w}; prefix weights are 1 on every dim of a held action and 0 elsewhere`);
    if (!Number.isFinite(chunk.actions[i]!)) throw new RangeError(`rtc actions[${i}] is ${chunk.actions[i]}; values must be finite`);
  }
  const given = chunk.maxGuidance ?? DEFAULT_MAX_GUIDANCE;
  if (typeof given !== 'number' && given.length !== b) throw new RangeError(`rtc max_guidance has ${given.length} values; a batch of ${b} needs one, or one per datum`);
  const beta = typeof given === 'number' ? new Float32Array(b).fill(given) : Float32Array.from(given);
  for (let i = 0; i < b; i++) {
    const v = typeof given === 'number' ? given : given[i]!;
    if (!(Number.isFinite(v) && v >= 0)) throw new RangeError(`rtc max_guidance${typeof given === 'number' ? '' : `[${i}]`} is ${v}; it must be a finite number >= 0`);
  }
  const shape = [b, horizon, actionDim];
  return { mode: chunk.mode, actions: tf.tensor(chunk.actions, shape), weights: tf.tensor(chunk.weights, shape), maxGuidance: tf.tensor(beta, [b, 1, 1]) };
}

/**
 * For prefix mode's time embeddings: `perToken` [b, ah, w] with the rows where `held` [b, ah, 1] is 1 replaced by `atZero()` [b, w]
 * (the same per-token computation at flow time 0), selected exactly; `perToken` itself without `held`.
 */
export function holdAtZero(perToken: tf.Tensor, held: tf.Tensor | undefined, atZero: () => tf.Tensor): tf.Tensor {
  if (!held) return perToken;
  const [b, ah, w] = perToken.shape as [number, number, number];
  const zero = tf.tile(tf.expandDims(atZero(), 1), [1, ah, 1]);
  return tf.where(tf.cast(tf.tile(held, [1, 1, w]), 'bool'), zero, perToken);
}


/**
 * The previous chunk `prev` [ah, ad] (model space) moved to the new chunk's indices after
 * `executed` actions: out[i] = prev[i + executed] for i < ah - executed, 0 after. Returns
 * [ah, ad] float32.
 */
export function shiftChunk(prev: Float32Array, horizon: number, executed: number): Float32Array {
  const ad = prev.length / horizon;
  const out = new Float32Array(prev.length);
  if (executed < horizon) out.set(prev.subarray(executed * ad));
  return out;
}
