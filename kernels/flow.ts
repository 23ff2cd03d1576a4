/**
 * Flow matching, openpi convention: t = 1 is noise. Training draws noise, then one u per
 * datum (D11), t = 0.999 * u^(2/3) + 0.001 (Beta(1.5, 1) by its inverse CDF, pi0's: more
 * weight near the noise end), x_t = t * noise + (1 - t) * actions, target u_t = noise - actions.
 * `uniform` time sampling takes t = 0.999 * u + 0.001 instead. Randomness is drawn in JS
 * (kernels/rng.ts), so it is the same on every backend and can be saved. The loss is PROTOCOL.md
 * section 3's.
 */
import * as tf from '@tensorflow/tfjs';
import type { Rng } from './rng.ts';
import { guidanceGradient, guidanceWeightTensor, type ChunkTensors } from './rtc.ts';

export type LossFn = 'mse' | 'l1';

/** How training draws flow-matching times: `beta` = Beta(1.5, 1) (pi0, D11), or `uniform` on [0.001, 1]. */
export type TimeSampling = 'beta' | 'uniform';

/** One training draw: noise [b, ah, ad] then time [b] (D11 order; the same draws for either time sampling). */
export function drawNoiseTime(rng: Rng, batch: number, horizon: number, actionDim: number, timeSampling: TimeSampling = 'beta'): { noise: Float32Array; time: Float32Array } {
  const noise = rng.normals(batch * horizon * actionDim);
  const u = rng.uniforms(batch);
  const time = timeSampling === 'uniform' ? u.map((x) => 0.999 * x + 0.001) : u.map((x) => 0.999 * Math.pow(x, 2 / 3) + 0.001);
  return { noise, time };
}

/** x_t = t * noise + (1 - t) * actions and target = noise - actions, float32, [b, ah, ad]; `time` [b], or [b * ah] (one per action). */
export function noisyActions(actions: Float32Array, noise: Float32Array, time: Float32Array): { xT: Float32Array; target: Float32Array } {
  const per = actions.length / time.length;
  const xT = new Float32Array(actions.length);
  const target = new Float32Array(actions.length);
  for (let i = 0; i < actions.length; i++) {
    const t = time[Math.floor(i / per)]!;
    xT[i] = t * noise[i]! + (1 - t) * actions[i]!;
    target[i] = noise[i]! - actions[i]!;
  }
  return { xT, target };
}

/**
 * Training-time real-time chunking (kernels/rtc.ts; TrainingOptions.rtcMaxDelay): from one
 * uniform `u_i` per datum a delay d_i = floor(u_i (maxDelay + 1)) in 0..maxDelay; the flow time
 * per action [b * ah] is 0 on datum i's first d_i actions (given clean: x_t = the actions there)
 * and its drawn t_i after, and the loss mask [b, ah, ad] is cleared on those d_i actions. `drawn`
 * holds the datum's noise [b, ah, ad], time [b] and target; actions and mask come from `targets`.
 */
export function heldPrefix(targets: { actions: Float32Array; actionMask: Float32Array }, drawn: { noise: Float32Array; time: Float32Array; target: Float32Array }, u: Float32Array, maxDelay: number, horizon: number): { xT: Float32Array; target: Float32Array; time: Float32Array; actionMask: Float32Array } {
  const H = horizon;
  const A = targets.actions.length / (drawn.time.length * H);
  const delays = Array.from(u, (x) => Math.min(maxDelay, Math.floor(x * (maxDelay + 1))));
  const time = new Float32Array(delays.length * H).map((_, k) => (k % H < delays[Math.floor(k / H)]! ? 0 : drawn.time[Math.floor(k / H)]!));
  const { xT } = noisyActions(targets.actions, drawn.noise, time);
  const actionMask = Float32Array.from(targets.actionMask);
  delays.forEach((d, i) => actionMask.fill(0, i * H * A, (i * H + d) * A));
  return { xT, target: drawn.target, time, actionMask };
}

/**
 * Per-datum loss [b]: the mean over datum i's valid (h, a) entries of (v - u)^2 (mse) or
 * |v - u| (l1); 0 for a datum without valid entries (D11). velocity, target, mask [b, ah, ad].
 */
export function lossPerDatum(velocity: tf.Tensor, target: tf.Tensor, mask: tf.Tensor, lossFn: LossFn): tf.Tensor {
  const diff = tf.sub(velocity, target);
  const err = lossFn === 'l1' ? tf.abs(diff) : tf.square(diff);
  const sum = tf.sum(tf.mul(err, mask), [1, 2]); // [b]
  const count = tf.maximum(tf.sum(mask, [1, 2]), 1); // [b]
  return tf.div(sum, count);
}

/**
 * forward_backward's objective (PROTOCOL.md section 3): the velocity v = velocity(x_t) [b, ah, ad]
 * against `target` with `actionMask` (both [b, ah, ad] float32), per-datum losses `per` [b] (kept:
 * it outlives the caller's tidy or tape) and total = sum_i weight_i * per_i (a scalar) to
 * differentiate. One definition for the eager pass (kernels/trainer.ts) and its traced graph
 * (kernels/step-graph.ts).
 */
export function weightedLoss(velocity: (xT: tf.Tensor) => tf.Tensor, xT: Float32Array, target: Float32Array, actionMask: Float32Array, weight: Float32Array, shape: number[], lossFn: LossFn): { per: tf.Tensor; total: tf.Scalar } {
  const v = velocity(tf.tensor(xT, shape));
  const per = tf.keep(lossPerDatum(v, tf.tensor(target, shape), tf.tensor(actionMask, shape), lossFn));
  return { per, total: tf.sum(tf.mul(per, tf.tensor1d(weight))) as tf.Scalar };
}

/** d/dvelocity of sum_i w_i * loss_i for mse: 2 w_i (v - u) mask / n_i, as Float32Array [b, ah, ad]. */
export function mseVelocityGrad(velocity: Float32Array, target: Float32Array, mask: Float32Array, weight: Float32Array): Float32Array {
  const B = weight.length;
  const per = velocity.length / B;
  const out = new Float32Array(velocity.length);
  for (let i = 0; i < B; i++) {
    let n = 0;
    for (let j = 0; j < per; j++) n += mask[i * per + j]!;
    if (n === 0) continue;
    for (let j = 0; j < per; j++) {
      const k = i * per + j;
      out[k] = (2 * weight[i]! * (velocity[k]! - target[k]!) * mask[k]!) / n;
    }
  }
  return out;
}

/**
 * Euler integration from noise (t = 1) to t = 0 in exactly numSteps steps, `x += dt * v(x, t_k)`
 * with dt = float32(-1 / numSteps) and t_k = float32(1 + k * (-1 / numSteps)) (k = 0 .. numSteps-1,
 * the sum in float64), LeRobot's grid (policies/common/flow_matching.py `euler_integrate`:
 * 1, 0.9, 0.8, ...). openpi instead accumulates t += dt in float32 (1, 0.9, 0.79999995, ...);
 * MODEL.md "Sampling" says why LeRobot's is followed.
 * `velocityAt(x, time, held)` returns a new tensor [b, ah, ad] for x [b, ah, ad] at flow times
 * `time` [b]; `held` [b, ah, 1] (RTC's prefix mode) marks the actions that are at flow time 0
 * instead. x starts as `noise` [b, ah, ad]. With `chunk` (kernels/rtc.ts) the chunk is made to
 * continue a previous one: `guided` adds c(t) ∇_x L to the velocity (one backward pass per step),
 * `prefix` holds each datum's first d actions at the previous chunk's. Returns the final x (the
 * caller owns it).
 * @throws RangeError for numSteps that is not an integer >= 1.
 */
export function eulerSample(noise: tf.Tensor, numSteps: number, velocityAt: (x: tf.Tensor, time: Float32Array, held?: tf.Tensor) => tf.Tensor, chunk?: ChunkTensors): tf.Tensor {
  if (!Number.isInteger(numSteps) || numSteps < 1) throw new RangeError(`num_steps is ${numSteps}; it must be an integer >= 1`);
  const dt = Math.fround(-1 / numSteps);
  const [b, ah] = noise.shape as [number, number, number];
  const prefix = chunk?.mode === 'prefix' ? chunk : null;
  // prefix: x = keep * x + weights * prev holds the first d actions (weights 1 there, 0 elsewhere),
  // and `held` (the weights' first dim) puts them at time 0: tensors, so a traced graph serves every delay.
  const keep = prefix ? tf.sub(1, prefix.weights) : null;
  const held = prefix ? tf.slice(prefix.weights, [0, 0, 0], [b, ah, 1]) : undefined;
  const hold = (x: tf.Tensor) => (prefix ? tf.add(tf.mul(keep!, x), tf.mul(prefix.weights, prefix.actions)) : x);
  const dt64 = -1 / numSteps;
  let x = prefix ? tf.tidy(() => hold(noise)) : tf.clone(noise);
  try {
    for (let k = 0; k < numSteps; k++) {
      // LeRobot: time = 1.0 + step * dt in Python floats, cast to float32 for the model; its RTC
      // guidance weight reads the float64 time.
      const t64 = 1 + k * dt64;
      const t = Math.fround(t64);
      const time = new Float32Array(b).fill(t);
      const tt = t64;
      const next = tf.tidy(() => {
        if (chunk?.mode === 'guided') {
          const { velocity, grad } = guidanceGradient((xx) => velocityAt(xx, time), x, tt, chunk.actions, chunk.weights);
          const v = tf.add(velocity, tf.mul(grad, guidanceWeightTensor(tt, chunk.maxGuidance)));
          tf.dispose([velocity, grad]);
          return tf.add(x, tf.mul(v, dt));
        }
        return hold(tf.add(x, tf.mul(velocityAt(x, time, held), dt)));
      });
      x.dispose();
      x = next;
    }
  } finally {
    tf.dispose([keep, held].filter((z): z is tf.Tensor => !!z));
  }
  return x;
}
