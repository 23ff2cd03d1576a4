/**
 * AdamW with global L2 gradient clipping and a non-finite skip, as PROTOCOL.md section 3
 * (`optim_step`) defines it. The update is `torch.optim.AdamW` (single-tensor path, which torch
 * uses on CPU) with its float32 operation order reproduced, so a float32 run agrees with torch to
 * a few ulps (test/optim.test.ts checks committed torch vectors):
 *
 *   p   <- p * (1 - lr * wd)                       (skipped when wd == 0, as multiplying by 1)
 *   m   <- lerp(m, g, 1 - b1)                      (torch `exp_avg.lerp_`)
 *   v   <- v * b2 + ((1 - b2) * g) * g             (torch `mul_` then `addcmul_`)
 *   t   <- t + 1
 *   den <- sqrt(v) / sqrt(1 - b2^t) + eps
 *   p   <- p + (-(lr / (1 - b1^t)) * m) / den      (torch `addcdiv_`)
 *
 * Scalars (bias corrections, step size) are computed in float64 as torch does in Python, then
 * applied as float32 scalars. The step counter is shared by all parameters (every parameter gets
 * a gradient at every step here, so torch's per-parameter counters would all be equal).
 */
import * as tf from '@tensorflow/tfjs';
import { adamwFused, sumOfSquares, type AdamWScalars } from './backend/adamw-fused.ts';
import { adamwStaged, readFloat32, stagedAdamWApplies } from './backend/adamw-staged.ts';
import { hostMemory } from './backend/host-memory.ts';
import { GraphTraceError, graphsEnabled, traceGraph, type GraphFunction } from './backend/graph.ts';

export type OptimErrorCode =
  | 'bad_option' // an AdamW option outside its range
  | 'grad_mismatch' // gradients whose names or shapes do not match the parameters
  | 'bad_moments' // moments that do not match the parameters (create/import)
  | 'non_finite_update'; // the step would leave a parameter or moment non-finite (nothing changed)

/** The optimizer's one error type; `code` says which check failed. */
export class OptimError extends Error {
  readonly code: OptimErrorCode;
  constructor(code: OptimErrorCode, message: string) {
    super(message);
    this.name = 'OptimError';
    this.code = code;
  }
}

/** Options of one `optim_step`, named as PROTOCOL.md's arguments in camelCase. */
export interface AdamWOptions {
  /** Step size, > 0 and finite. */
  learningRate: number;
  /** First-moment decay, in [0, 1). */
  beta1: number;
  /** Second-moment decay, in [0, 1). */
  beta2: number;
  /** Added to the bias-corrected sqrt of the second moment, >= 0. */
  eps: number;
  /** Decoupled weight decay (multiplies p by 1 - lr * wd), >= 0. */
  weightDecay: number;
  /** Global L2 clipping threshold; 0 turns clipping off. */
  gradClipNorm: number;
}

/** PROTOCOL.md section 3 defaults of `optim_step`. */
export const DEFAULT_ADAMW: Readonly<AdamWOptions> = Object.freeze({
  learningRate: 1e-4,
  beta1: 0.9,
  beta2: 0.95,
  eps: 1e-12,
  weightDecay: 0,
  gradClipNorm: 0,
});

/**
 * Checks every option's range; throws OptimError('bad_option') naming the option and its value.
 */
export function validateAdamWOptions(opts: AdamWOptions): void {
  const bad = (name: string, value: unknown, want: string): never => {
    throw new OptimError('bad_option', `${name} is ${String(value)}; it must be ${want}`);
  };
  const num = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v);
  if (!num(opts.learningRate) || opts.learningRate < 0) bad('learning_rate', opts.learningRate, 'a finite number >= 0');
  if (!num(opts.beta1) || opts.beta1 < 0 || opts.beta1 >= 1) bad('beta1', opts.beta1, 'in [0, 1)');
  if (!num(opts.beta2) || opts.beta2 < 0 || opts.beta2 >= 1) bad('beta2', opts.beta2, 'in [0, 1)');
  // eps = 0 divides 0 by 0 for every parameter whose gradient was zero (NaN weights), and the
  // update runs in float32, so an eps that rounds to 0 there is as bad.
  if (!num(opts.eps) || !(Math.fround(opts.eps) > 0)) bad('eps', opts.eps, 'a finite number > 0 (at least 1.4e-45, the smallest float32)');
  if (!num(opts.weightDecay) || opts.weightDecay < 0) bad('weight_decay', opts.weightDecay, 'a finite number >= 0');
  if (!num(opts.gradClipNorm) || opts.gradClipNorm < 0) bad('grad_clip_norm', opts.gradClipNorm, 'a finite number >= 0 (0 = off)');
}

/** DEFAULT_ADAMW overlaid with the given options (undefined keeps the default), validated. */
export function resolveAdamWOptions(partial: Partial<AdamWOptions> = {}): AdamWOptions {
  const opts = { ...DEFAULT_ADAMW };
  for (const key of Object.keys(DEFAULT_ADAMW) as (keyof AdamWOptions)[]) {
    const value = partial[key];
    if (value !== undefined) opts[key] = value;
  }
  validateAdamWOptions(opts);
  return opts;
}

/** One exported moment tensor: float32 data in row-major order. */
export interface ExportedTensor {
  shape: number[];
  data: Float32Array;
}

/** The moments in a form for `optimizer.safetensors` (tensors) and `trainer_state.json` (step). */
export interface ExportedMoments {
  step: number;
  /** `<param>.exp_avg` and `<param>.exp_avg_sq` for every parameter (torch's state names). */
  tensors: Record<string, ExportedTensor>;
}

function sameShape(a: readonly number[], b: readonly number[]): boolean {
  return a.length === b.length && a.every((d, i) => d === b[i]);
}

/**
 * AdamW state: the step count and float32 first/second moments (`exp_avg`, `exp_avg_sq`) per
 * parameter, held as non-trainable variables so that an update assigns in place.
 */
/** An unnamed variable holding `t`'s values; `t` itself is freed (tf.variable keeps its own reference). */
function variableOf(t: tf.Tensor): tf.Variable {
  const v = tf.variable(t, false);
  t.dispose();
  return v;
}

export class AdamWMoments {
  step: number;
  m: Map<string, tf.Variable>;
  v: Map<string, tf.Variable>;

  private constructor(step: number, m: Map<string, tf.Variable>, v: Map<string, tf.Variable>) {
    this.step = step;
    this.m = m;
    this.v = v;
  }

  /** Zero moments with each parameter's shape; step 0. */
  static create(params: Map<string, tf.Variable>): AdamWMoments {
    const m = new Map<string, tf.Variable>();
    const v = new Map<string, tf.Variable>();
    for (const [name, p] of params) {
      // Unnamed variables: TF.js names must be unique per process and many sessions coexist.
      m.set(name, variableOf(tf.zeros(p.shape, 'float32')));
      v.set(name, variableOf(tf.zeros(p.shape, 'float32')));
    }
    return new AdamWMoments(0, m, v);
  }

  /**
   * Copies the state out. (dataSync alone may hand out a backend's own array: tfjs-node gives a
   * tensor that no op has used yet, which the moments are, as the array it was made from.)
   */
  export(): ExportedMoments {
    const tensors: Record<string, ExportedTensor> = {};
    for (const [name, m] of this.m) {
      const v = this.v.get(name)!;
      tensors[`${name}.exp_avg`] = { shape: [...m.shape], data: (m.dataSync() as Float32Array).slice() };
      tensors[`${name}.exp_avg_sq`] = { shape: [...v.shape], data: (v.dataSync() as Float32Array).slice() };
    }
    return { step: this.step, tensors };
  }

  /**
   * Rebuilds moments for `params` from an export. Every parameter needs both tensors with its
   * shape; extra tensors are refused too, since they mean the state belongs to another model.
   * Throws OptimError('bad_moments').
   */
  static import(params: Map<string, tf.Variable>, state: ExportedMoments): AdamWMoments {
    if (!Number.isInteger(state.step) || state.step < 0) {
      throw new OptimError('bad_moments', `optimizer step is ${state.step}; it must be an integer >= 0`);
    }
    const expected = new Set<string>();
    for (const [name, p] of params) {
      for (const suffix of ['exp_avg', 'exp_avg_sq']) {
        const key = `${name}.${suffix}`;
        expected.add(key);
        const t = state.tensors[key];
        if (!t) throw new OptimError('bad_moments', `optimizer state has no tensor ${key}`);
        if (!sameShape(t.shape, p.shape)) {
          throw new OptimError('bad_moments', `${key} has shape [${t.shape}]; the parameter has [${p.shape}]`);
        }
        const size = p.shape.reduce((a, b) => a * b, 1);
        if (t.data.length !== size) {
          throw new OptimError('bad_moments', `${key} holds ${t.data.length} values; shape [${t.shape}] needs ${size}`);
        }
      }
    }
    const extra = Object.keys(state.tensors).filter((k) => !expected.has(k));
    if (extra.length > 0) {
      throw new OptimError('bad_moments', `optimizer state has tensors for unknown parameters: ${extra.slice(0, 5).join(', ')}`);
    }
    const m = new Map<string, tf.Variable>();
    const v = new Map<string, tf.Variable>();
    for (const [name, p] of params) {
      const a = state.tensors[`${name}.exp_avg`]!;
      const b = state.tensors[`${name}.exp_avg_sq`]!;
      m.set(name, variableOf(tf.tensor(a.data, p.shape, 'float32')));
      v.set(name, variableOf(tf.tensor(b.data, p.shape, 'float32')));
    }
    return new AdamWMoments(state.step, m, v);
  }

  /** Frees every moment variable. */
  dispose(): void {
    for (const t of this.m.values()) t.dispose();
    for (const t of this.v.values()) t.dispose();
    this.m.clear();
    this.v.clear();
  }
}

/**
 * Global L2 norm over all tensors: float32 values squared and summed in float64, in order
 * (exact squares; one float32 sum over millions of elements drifts: 1.4e-3 relative at 4M on
 * wasm). Reads each tensor once (dataSync); the fused path (kernels/backend/adamw-fused.ts) sums the same
 * values in the same order, so both paths clip by the same factor.
 */
export function globalNorm(tensors: Iterable<tf.Tensor>): number {
  let total = 0;
  for (const t of tensors) {
    const data = t.dataSync();
    for (let i = 0; i < data.length; i++) total += data[i]! * data[i]!;
  }
  return Math.sqrt(total);
}

/**
 * One AdamW step on `params` (updated in place) with the mean gradient `grads / divisor`
 * (PROTOCOL.md section 3: G / D; `divisor` defaults to 1 for grads that are already the mean).
 * `grads` must have exactly the parameters' names and shapes (OptimError 'grad_mismatch'); it is
 * not disposed.
 *
 * Returns `gradNorm`, the global L2 norm of the mean gradient before clipping, and `skipped`:
 * true when that norm is not finite, in which case no parameter, moment or step count changes.
 * With `gradClipNorm` > 0 and gradNorm > gradClipNorm every gradient is scaled by clip / gradNorm
 * (exactly that factor; torch's clip_grad_norm_ would use clip / (norm + 1e-6)).
 *
 * On the wasm and cpu backends the update runs as one loop per parameter (kernels/backend/adamw-fused.ts);
 * on native TensorFlow as two graph calls of the TF.js ops below (graphStep; with VELA_GRAPHS=0
 * on tfjs-node (CPU) as the same SIMD loop over copies, kernels/backend/adamw-staged.ts); the
 * loops are bit-identical to the ops.
 */
export function adamwStep(
  params: Map<string, tf.Variable>,
  grads: Map<string, tf.Tensor>,
  moments: AdamWMoments,
  opts: AdamWOptions,
  divisor = 1,
): { gradNorm: number; skipped: boolean } {
  checkStep(params, grads, moments, opts, divisor);
  const graphed = graphStep(params, grads, moments, opts, divisor);
  if (graphed) return graphed;
  const host = hostMemory();
  if (host) return loopStep((x) => host.view(x), (p, g, m, v, s) => adamwFused(host, p, g, m, v, s), params, grads, moments, opts, divisor);
  if (stagedAdamWApplies() && stagingWorks) {
    // Each gradient is copied out once: for the norm, then staged from that copy.
    const copies = new Map<tf.Tensor, Float32Array>();
    const read = (t: tf.Tensor) => copies.get(t) ?? readFloat32(t);
    const readGrad = (t: tf.Tensor) => {
      const c = readFloat32(t);
      copies.set(t, c);
      return c;
    };
    try {
      return loopStep(readGrad, (p, g, m, v, s) => {
        const r = adamwStaged(p, g, m, v, s, read);
        copies.delete(g);
        return r;
      }, params, grads, moments, opts, divisor, read);
    } catch (e) {
      if (e instanceof OptimError) throw e;
      // The staging memory or the SIMD module is not to be had here (a memory limit, no wasm
      // SIMD, a parameter above 4 GiB of staging): nothing was assigned, so the ops take over,
      // now and for the rest of the process.
      stagingWorks = false;
    }
  }
  return opsStep(params, grads, moments, opts, divisor);
}

/**
 * adamwStep as TF.js ops (~13 kernels per parameter), whatever the backend: what tfjs-node runs,
 * and the reference the fused loop must equal bit for bit (test/optim.test.ts). Same contract.
 */
export function adamwStepOps(
  params: Map<string, tf.Variable>,
  grads: Map<string, tf.Tensor>,
  moments: AdamWMoments,
  opts: AdamWOptions,
  divisor = 1,
): { gradNorm: number; skipped: boolean } {
  checkStep(params, grads, moments, opts, divisor);
  return opsStep(params, grads, moments, opts, divisor);
}

function checkStep(params: Map<string, tf.Variable>, grads: Map<string, tf.Tensor>, moments: AdamWMoments, opts: AdamWOptions, divisor: number): void {
  validateAdamWOptions(opts);
  if (!(divisor > 0) || !Number.isFinite(divisor)) throw new OptimError('bad_option', `gradient divisor is ${divisor}; it must be a finite number > 0`);
  if (grads.size !== params.size) {
    throw new OptimError('grad_mismatch', `${grads.size} gradients for ${params.size} parameters`);
  }
  for (const [name, p] of params) {
    const g = grads.get(name);
    if (!g) throw new OptimError('grad_mismatch', `no gradient for parameter ${name}`);
    if (!sameShape(g.shape, p.shape)) {
      throw new OptimError('grad_mismatch', `gradient of ${name} has shape [${g.shape}]; the parameter has [${p.shape}]`);
    }
    if (!moments.m.has(name) || !moments.v.has(name)) {
      throw new OptimError('bad_moments', `optimizer state has no moments for parameter ${name}`);
    }
  }
}

/** The step's float64 constants (torch computes them in Python floats). */
function scalarsOf(opts: AdamWOptions, t: number, divisor: number, clipScale: number): AdamWScalars {
  const { learningRate: lr, beta1: b1, beta2: b2, eps, weightDecay: wd } = opts;
  return {
    divisor, clipScale, decay: wd === 0 ? 1 : 1 - lr * wd, w: 1 - b1, beta2: b2,
    bc2Sqrt: Math.sqrt(1 - b2 ** t), eps, stepSize: lr / (1 - b1 ** t),
  };
}

function clipScaleOf(opts: AdamWOptions, gradNorm: number): number {
  return opts.gradClipNorm > 0 && gradNorm > opts.gradClipNorm ? opts.gradClipNorm / gradNorm : 1;
}

/**
 * Refuse a step that would leave a non-finite parameter or moment (finite options can still
 * overflow float32, e.g. a huge weight_decay): the caller assigns nothing.
 * @throws OptimError 'non_finite_update' naming the tensor and the first bad element.
 */
function checkFinite(name: string, [p, m, v]: Float32Array[], opts: AdamWOptions): void {
  for (const [what, a] of [['', p], [' (exp_avg)', m], [' (exp_avg_sq)', v]] as const) {
    for (let i = 0; i < a!.length; i++) {
      if (!Number.isFinite(a![i]!)) {
        throw new OptimError('non_finite_update', `optim_step would make ${name}${what}[${i}] ${a![i]}; nothing was changed ` +
          `(learning_rate ${opts.learningRate}, weight_decay ${opts.weightDecay}, eps ${opts.eps}): use smaller values`);
      }
    }
  }
}

/** True when the sum of every value is finite, which no NaN or infinity allows (one scalar read). */
function finiteSum(ts: tf.Tensor[]): boolean {
  return tf.tidy(() => Number.isFinite(tf.addN(ts.map((t) => tf.sum(t))).dataSync()[0]!));
}

/** False once the staged path failed for want of memory or SIMD (adamwStep then runs the ops). */
let stagingWorks = true;

/** Frees every tensor of `next` (a refused step) and rethrows. */
function disposeNext(next: Map<string, tf.Tensor[]>, e: unknown): never {
  for (const out of next.values()) tf.dispose(out);
  throw e;
}

function assignAll(p: tf.Variable, m: tf.Variable, v: tf.Variable, next: [tf.Tensor, tf.Tensor, tf.Tensor]): void {
  p.assign(next[0]);
  m.assign(next[1]);
  v.assign(next[2]);
  tf.dispose(next);
}

type TensorUpdate = (p: tf.Tensor, g: tf.Tensor, m: tf.Tensor, v: tf.Tensor, s: AdamWScalars) => { out: [tf.Tensor, tf.Tensor, tf.Tensor]; finite: boolean };

/**
 * adamwStep with one update call per parameter (a loop over host memory or over copies):
 * `readGrad` gives a gradient's float32 values for the norm, `read` any tensor's (for the finite
 * check's message).
 */
function loopStep(
  readGrad: (t: tf.Tensor) => Float32Array, update: TensorUpdate,
  params: Map<string, tf.Variable>, grads: Map<string, tf.Tensor>, moments: AdamWMoments, opts: AdamWOptions, divisor: number,
  read = readGrad,
) {
  const gradNorm = Math.sqrt(sumOfSquares(readGrad, grads.values(), divisor));
  if (!Number.isFinite(gradNorm)) return { gradNorm, skipped: true };
  const t = moments.step + 1;
  const s = scalarsOf(opts, t, divisor, clipScaleOf(opts, gradNorm));
  const next = new Map<string, [tf.Tensor, tf.Tensor, tf.Tensor]>();
  try {
    for (const [name, p] of params) {
      const { out, finite } = update(p, grads.get(name)!, moments.m.get(name)!, moments.v.get(name)!, s);
      next.set(name, out);
      if (!finite) checkFinite(name, out.map(read), opts);
    }
  } catch (e) {
    disposeNext(next, e);
  }
  for (const [name, out] of next) assignAll(params.get(name)!, moments.m.get(name)!, moments.v.get(name)!, out);
  moments.step = t;
  return { gradNorm, skipped: false };
}

/**
 * The step's scalars as the float32 vector the ops read (rounded once, as TF.js rounds a number
 * it multiplies by): [divisor, clipScale, decay, w, 1 - w, beta2, 1 - beta2, bc2Sqrt, eps, -stepSize].
 */
function scalarVector(s: AdamWScalars): Float32Array {
  return Float32Array.from([s.divisor, s.clipScale, s.decay, s.w, 1 - s.w, s.beta2, 1 - s.beta2, s.bc2Sqrt, s.eps, -s.stepSize]);
}

/**
 * One tensor's update as TF.js ops from the accumulated gradient g and the scalars S (the
 * unstacked scalarVector; call inside tf.tidy). Multiplying by a factor of exactly 1 (no clip, no
 * weight decay, divisor 1) changes no bit, so the ops are the same for every step and a traced
 * graph of them serves every step. `lerpLow`: w < 0.5, torch's lerp formula switch.
 */
function opsUpdate(p: tf.Tensor, g: tf.Tensor, m: tf.Tensor, v: tf.Tensor, S: tf.Tensor[], lerpLow: boolean): [tf.Tensor, tf.Tensor, tf.Tensor] {
  const [divisor, clipScale, decay, w, oneMinusW, b2, oneMinusB2, bc2Sqrt, eps, negStep] = S as [tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor];
  const gc = tf.mul(tf.div(g, divisor), clipScale);
  const pDecayed = tf.mul(p, decay);
  // torch's lerp kernel switches formula at weight 0.5 for accuracy; match both branches.
  const mNext = lerpLow ? tf.add(m, tf.mul(w, tf.sub(gc, m))) : tf.sub(gc, tf.mul(tf.sub(gc, m), oneMinusW));
  const vNext = tf.add(tf.mul(v, b2), tf.mul(tf.mul(gc, oneMinusB2), gc));
  const denom = tf.add(tf.div(tf.sqrt(vNext), bc2Sqrt), eps);
  const pNext = tf.add(pDecayed, tf.div(tf.mul(mNext, negStep), denom));
  return [pNext, mNext, vNext];
}

/** An optimizer graph (kernels/backend/graph.ts), made at the first step of a parameter structure. */
interface StepGraph {
  lerpLow: boolean;
  /** p, g, m, v of each tensor, scalars -> p', m', v' of each tensor, then their sums [3n]. */
  update: GraphFunction;
}
/** By parameter names and shapes: states of the same structure share a graph (weights are inputs). */
const stepGraphs = new Map<string, StepGraph | 'eager'>();
const MAX_STEP_GRAPHS = 8;

/**
 * adamwStep on native TensorFlow: the gradient norm on the host from copies (sumOfSquares, as
 * the other paths: float64, the same bits), then every tensor's update as one graph call of
 * opsUpdate (traced once per parameter structure; bit-identical to the eager ops, tested), ~15 ms of a
 * flow05-tiny full step where the SIMD loop over copies took ~40. Returns null where graphs are
 * off or the trace failed (the caller then takes another path).
 */
function graphStep(params: Map<string, tf.Variable>, grads: Map<string, tf.Tensor>, moments: AdamWMoments, opts: AdamWOptions, divisor: number): { gradNorm: number; skipped: boolean } | null {
  if (!graphsEnabled()) return null;
  const lerpLow = 1 - opts.beta1 < 0.5;
  const key = `${lerpLow}|${[...params].map(([n, p]) => `${n}:${p.shape.join('x')}`).join(',')}`;
  let g = stepGraphs.get(key);
  if (g === 'eager') return null;
  const names = [...params.keys()];
  const gs = names.map((n) => grads.get(n)!);
  const probe = scalarVector(scalarsOf(opts, moments.step + 1, divisor, 1));
  if (!g) {
    try {
      const update = traceGraph((input) => {
        const S = tf.unstack(tf.tensor1d(probe));
        const outs = names.map((n, i) => opsUpdate(input(params.get(n)!), input(gs[i]!), input(moments.m.get(n)!), input(moments.v.get(n)!), S, lerpLow));
        return [...outs.flat(), tf.stack(outs.flat().map((t) => tf.sum(t)))];
      }, [probe]);
      tf.dispose(update.outputs);
      g = { lerpLow, update: update.graph };
    } catch (e) {
      if (!(e instanceof GraphTraceError)) throw e;
      stepGraphs.set(key, 'eager');
      return null;
    }
    stepGraphs.set(key, g);
    if (stepGraphs.size > MAX_STEP_GRAPHS) {
      const [oldest, gone] = stepGraphs.entries().next().value as [string, StepGraph | 'eager'];
      stepGraphs.delete(oldest);
      if (gone !== 'eager') gone.update.dispose();
    }
  }
  const gradNorm = Math.sqrt(sumOfSquares(readFloat32, gs, divisor));
  if (!Number.isFinite(gradNorm)) return { gradNorm, skipped: true };
  const t = moments.step + 1;
  const S = scalarVector(scalarsOf(opts, t, divisor, clipScaleOf(opts, gradNorm)));
  const out = g.update.run(names.flatMap((n, i) => [params.get(n)!, gs[i]!, moments.m.get(n)!, moments.v.get(n)!]), [S]);
  const sums = out.pop()!;
  const finite = sums.dataSync() as Float32Array;
  sums.dispose();
  const next = new Map(names.map((n, i) => [n, out.slice(3 * i, 3 * i + 3) as [tf.Tensor, tf.Tensor, tf.Tensor]]));
  try {
    names.forEach((n, i) => {
      if (![0, 1, 2].every((k) => Number.isFinite(finite[3 * i + k]!))) checkFinite(n, next.get(n)!.map((x) => x.dataSync() as Float32Array), opts);
    });
  } catch (e) {
    disposeNext(next, e);
  }
  for (const [n, o] of next) assignAll(params.get(n)!, moments.m.get(n)!, moments.v.get(n)!, o);
  moments.step = t;
  return { gradNorm, skipped: false };
}

function opsStep(params: Map<string, tf.Variable>, grads: Map<string, tf.Tensor>, moments: AdamWMoments, opts: AdamWOptions, divisor: number) {
  const mean = divisor === 1 ? grads : new Map([...grads].map(([k, g]) => [k, tf.div(g, divisor)]));
  try {
    const gradNorm = globalNorm(mean.values());
    if (!Number.isFinite(gradNorm)) return { gradNorm, skipped: true };
    const t = moments.step + 1;
    const s = scalarsOf(opts, t, divisor, clipScaleOf(opts, gradNorm));
    const next = new Map<string, [tf.Tensor, tf.Tensor, tf.Tensor]>();
    // The mean gradient is already divided: divisor 1 here.
    const S = scalarVector({ ...s, divisor: 1 });
    for (const [name, p] of params) {
      const m = moments.m.get(name)!;
      const v = moments.v.get(name)!;
      next.set(name, tf.tidy(() => opsUpdate(p, mean.get(name)!, m, v, tf.unstack(tf.tensor1d(S)), s.w < 0.5)));
    }
    try {
      for (const [name, out] of next) if (!finiteSum(out)) checkFinite(name, out.map((x) => x.dataSync() as Float32Array), opts);
    } catch (e) {
      disposeNext(next, e);
    }
    for (const [name, out] of next) assignAll(params.get(name)!, moments.m.get(name)!, moments.v.get(name)!, out);
    moments.step = t;
    return { gradNorm, skipped: false };
  } finally {
    if (mean !== grads) tf.dispose([...mean.values()]);
  }
}
