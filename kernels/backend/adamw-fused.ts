/**
 * AdamW as one JavaScript loop per parameter over host memory (kernels/backend/host-memory.ts), for the
 * wasm and cpu backends. The TF.js-op version in kernels/optim.ts runs ~13 kernels per parameter
 * plus ~5 for the norm; on wasm each kernel costs ~20 us of dispatch, so flow05-tiny's 106
 * parameters spent ~28 ms per step there, mostly outside arithmetic. Here every float32 operation
 * of that version is kept, in the same order, each rounded with Math.fround (float64 +, -, *, /
 * and sqrt of float32 operands rounded once to float32 give the float32 result exactly), so both
 * versions give bit-identical parameters and moments (test/optim.test.ts checks it).
 */
import type * as tf from '@tensorflow/tfjs';
import type { HostMemory } from './host-memory.ts';
import { adamwSimd } from './adamw-simd.ts';

/** Per-step constants of the update, as float64; the loop rounds each to float32 as TF.js would. */
export interface AdamWScalars {
  /** G / D: the divisor D of the accumulated gradient (1 for a mean gradient). */
  divisor: number;
  /** Clipping factor clip / norm, or exactly 1 when not clipping (then no multiply happens). */
  clipScale: number;
  /** 1 - lr * wd, or exactly 1 when weight decay is 0 (then no multiply happens). */
  decay: number;
  /** torch lerp weight 1 - beta1. */
  w: number;
  beta2: number;
  /** sqrt(1 - beta2^t). */
  bc2Sqrt: number;
  eps: number;
  /** lr / (1 - beta1^t). */
  stepSize: number;
}

/**
 * Sum over all tensors of (g / divisor)^2, each quotient rounded to float32 as tf.div would, the
 * squares and the sum in float64 (exact squares, no float32 drift over millions of terms).
 * `view` gives a tensor's float32 values (HostMemory.view, or a copy on tfjs-node).
 */
export function sumOfSquares(view: (t: tf.Tensor) => Float32Array, grads: Iterable<tf.Tensor>, divisor: number): number {
  const f = Math.fround;
  const d = f(divisor);
  // Dividing by a power of two is exact (short of subnormal quotients, whose squares below 1e-76
  // cannot move a sum of real gradients), and so is scaling a float64 value by one: every partial
  // sum of g^2 is the partial sum of (g / d)^2 times d^2, so one division at the end gives the
  // same number without a division per value. Unit datum weights make D a power of two whenever
  // the batch size is.
  const pow2 = d > 0 && Number.isFinite(d) && 2 ** Math.round(Math.log2(d)) === d;
  let total = 0;
  for (const t of grads) {
    const g = view(t);
    if (d === 1 || pow2) {
      for (let i = 0; i < g.length; i++) total += g[i]! * g[i]!;
    } else {
      for (let i = 0; i < g.length; i++) {
        const x = f(g[i]! / d);
        total += x * x;
      }
    }
  }
  return pow2 ? total / (d * d) : total;
}

/**
 * New parameter and moments of one tensor: fresh tensors [p', m', v'] (the caller assigns them),
 * and whether every value of them is finite. Inputs are read, never written.
 */
export function adamwFused(host: HostMemory, p: tf.Tensor, g: tf.Tensor, m: tf.Tensor, v: tf.Tensor, s: AdamWScalars): { out: [tf.Tensor, tf.Tensor, tf.Tensor]; finite: boolean } {
  const out: [tf.Tensor, tf.Tensor, tf.Tensor] = [host.alloc(p.shape), host.alloc(p.shape), host.alloc(p.shape)];
  let start = 0;
  let finite = true;
  if (host.heap) {
    // The SIMD loop takes the largest multiple of 4 elements; the loop below the rest.
    const flag = host.alloc([4]);
    try {
      const { memory, offset } = host.heap;
      start = p.size - (p.size % 4);
      const at = [p, g, m, v, ...out].map(offset) as [number, number, number, number, number, number, number];
      runSimd(memory, at, start * 4, offset(flag), s);
      finite = flagFinite(host.view(flag));
    } catch (e) {
      for (const t of out) t.dispose();
      throw e;
    } finally {
      flag.dispose();
    }
  }
  // Views after the last alloc (a growing wasm heap detaches older views).
  const [pv, gv, mv, vv, po, mo, vo] = [p, g, m, v, ...out].map((t) => host.view(t)) as Float32Array[];
  return { out, finite: updateRange(pv!, gv!, mv!, vv!, po!, mo!, vo!, start, s) && finite };
}

/**
 * kernels/backend/adamw-simd.ts's loop over `bytes` of the seven runs at byte offsets `at` of `memory`
 * (p, g, m, v, p', m', v'), leaving its finite flag at byte offset `flag`.
 */
export function runSimd(memory: object, at: readonly [number, number, number, number, number, number, number], bytes: number, flag: number, s: AdamWScalars): void {
  const f = Math.fround;
  const lerpLow = s.w < 0.5; // torch's lerp switches formula at weight 0.5
  const fns = adamwSimd(memory);
  (lerpLow ? fns.low : fns.high)(...at, bytes, flag, f(s.divisor), s.clipScale === 1 ? 1 : f(s.clipScale), s.decay === 1 ? 1 : f(s.decay),
    lerpLow ? f(s.w) : f(1 - s.w), f(s.beta2), f(1 - s.beta2), f(s.bc2Sqrt), f(s.eps), f(-s.stepSize));
}

/** Whether the SIMD loop's flag (4 float32 lanes) says every value it wrote is finite. */
export function flagFinite(lanes: Float32Array): boolean {
  return lanes.length === 4 && lanes.every((x) => !Number.isNaN(x));
}

/**
 * The update of elements [start, n) in plain JavaScript, every operation rounded to float32.
 * Returns whether every value it wrote is finite (their float64 sum is: finite float32 values
 * cannot overflow it).
 */
function updateRange(pv: Float32Array, gv: Float32Array, mv: Float32Array, vv: Float32Array, po: Float32Array, mo: Float32Array, vo: Float32Array, start: number, s: AdamWScalars): boolean {
  const f = Math.fround;
  const d = f(s.divisor);
  const clip = s.clipScale === 1 ? 1 : f(s.clipScale);
  const decay = s.decay === 1 ? 1 : f(s.decay);
  const w = f(s.w);
  const oneMinusW = f(1 - s.w);
  const lerpLow = s.w < 0.5; // torch's lerp switches formula at weight 0.5
  const b2 = f(s.beta2);
  const oneMinusB2 = f(1 - s.beta2);
  const bc2 = f(s.bc2Sqrt);
  const eps = f(s.eps);
  const negStep = f(-s.stepSize);
  let sum = 0;
  for (let i = start; i < pv.length; i++) {
    const gi = f(f(gv[i]! / d) * clip);
    const pi = f(pv[i]! * decay);
    const mi = mv[i]!;
    const diff = f(gi - mi);
    const mNext = lerpLow ? f(mi + f(w * diff)) : f(gi - f(diff * oneMinusW));
    const vNext = f(f(vv[i]! * b2) + f(f(gi * oneMinusB2) * gi));
    const denom = f(f(f(Math.sqrt(vNext)) / bc2) + eps);
    const pNext = f(pi + f(f(mNext * negStep) / denom));
    po[i] = pNext;
    mo[i] = mNext;
    vo[i] = vNext;
    sum += pNext + mNext + vNext;
  }
  return Number.isFinite(sum);
}
