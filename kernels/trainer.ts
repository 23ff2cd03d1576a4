/**
 * Training state of one session (PROTOCOL.md section 3): a frozen, shared BaseWeights; the
 * trainable tensors (LoRA adapters or a full copy); the accumulated gradient G and denominator
 * D; AdamW moments; the seeded generators. Many TrainingStates reference one BaseWeights
 * without copying it (MODEL.md "LoRA and targets").
 */
import * as tf from '@tensorflow/tfjs';
import type { PolicyConfig } from './small/config.ts';
import { ShapeError, type ModelBatch } from './small/batch.ts';
import { Rng, type RngState } from './rng.ts';
import { decodeSuffix, encodePrefix, initialValues, paramSpecs, velocity, disposeCache, type WeightsView } from './small/model.ts';
import { drawNoiseTime, eulerSample, lossPerDatum, noisyActions, type LossFn, type TimeSampling } from './flow.ts';
import { LoraError, initialAdapters, selectTargets, validateLora, zeroGateRule, type LoraTarget } from './lora.ts';
import { AdamWMoments, adamwStep, resolveAdamWOptions, type AdamWOptions, type ExportedTensor } from './optim.ts';
import type { LoraFactors } from './layers.ts';

export type TrainerErrorCode = 'bad_weights' | 'nothing_kept' | 'no_gradients' | 'bad_state' | 'bad_option';

/** Misuse of a training state (backward without a kept forward, optim_step with D == 0, a
 * state or weights that do not fit). */
export class TrainerError extends Error {
  readonly code: TrainerErrorCode;
  constructor(code: TrainerErrorCode, message: string) {
    super(message);
    this.name = 'TrainerError';
    this.code = code;
  }
}

export type NamedTensors = Record<string, ExportedTensor>;

const size = (shape: readonly number[]) => shape.reduce((a, b) => a * b, 1);

// ---------------------------------------------------------------- base weights

/** The frozen base parameters of one preset, built once and shared by reference. */
export class BaseWeights {
  readonly config: PolicyConfig;
  readonly tensors: ReadonlyMap<string, tf.Tensor>;
  readonly paramCount: number;

  private constructor(config: PolicyConfig, tensors: Map<string, tf.Tensor>) {
    this.config = config;
    this.tensors = tensors;
    this.paramCount = [...tensors.values()].reduce((n, t) => n + t.size, 0);
  }

  /** Seeded initialisation (D1, D3, D10), the same on every backend. */
  static create(config: PolicyConfig, seed = 0): BaseWeights {
    const values = initialValues(config, seed);
    const tensors = new Map<string, tf.Tensor>();
    for (const s of paramSpecs(config)) tensors.set(s.name, tf.tensor(values.get(s.name)!, s.shape, 'float32'));
    return new BaseWeights(config, tensors);
  }

  /**
   * Base weights from named tensors (an operator's safetensors file). Every parameter of the
   * table must be present with its shape, and nothing else; throws TrainerError('bad_weights').
   */
  static fromTensors(config: PolicyConfig, named: NamedTensors): BaseWeights {
    checkNamed(named, new Map(paramSpecs(config).map((s) => [s.name, s.shape])), 'base weights');
    const tensors = new Map<string, tf.Tensor>();
    for (const s of paramSpecs(config)) tensors.set(s.name, tf.tensor(named[s.name]!.data, s.shape, 'float32'));
    return new BaseWeights(config, tensors);
  }

  get(name: string): tf.Tensor {
    const t = this.tensors.get(name);
    if (!t) throw new TrainerError('bad_weights', `the model has no parameter '${name}'`);
    return t;
  }

  /** All parameters as named float32 arrays (copies). */
  exportWeights(): NamedTensors {
    const out: NamedTensors = {};
    // slice: dataSync may be the backend's own array (tfjs-node, a tensor no op has used yet).
    for (const [name, t] of this.tensors) out[name] = { shape: [...t.shape], data: (t.dataSync() as Float32Array).slice() };
    return out;
  }

  /** Frees the tensors; only once no TrainingState uses them. */
  dispose(): void {
    for (const t of this.tensors.values()) t.dispose();
  }
}

/** Whether every adaptive-norm Linear of the base (pi0.5's ada1/ada2 weights and biases) is all zero, as seeded. */
function adaGatesClosed(base: BaseWeights): boolean {
  for (const [name, t] of base.tensors) {
    if (/\.ada[12]\.(weight|bias)$/.test(name) && (t.dataSync() as Float32Array).some((x) => x !== 0)) return false;
  }
  return true;
}

function checkNamed(named: NamedTensors, expected: Map<string, number[]>, what: string): void {
  for (const [name, shape] of expected) {
    const t = named[name];
    if (!t) throw new TrainerError('bad_weights', `${what} lack tensor '${name}'`);
    if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
      throw new TrainerError('bad_weights', `${what}: '${name}' has shape [${t.shape}]; this model needs [${shape}]`);
    }
    if (t.data.length !== size(shape)) {
      throw new TrainerError('bad_weights', `${what}: '${name}' holds ${t.data.length} values; shape [${shape}] needs ${size(shape)}`);
    }
  }
  const extra = Object.keys(named).filter((k) => !expected.has(k));
  if (extra.length) throw new TrainerError('bad_weights', `${what} have unknown tensors: ${extra.slice(0, 5).join(', ')}`);
}

// ---------------------------------------------------------------- training state

export interface TrainingOptions {
  /** 'lora' (default): train adapters on the frozen base; 'full': train a copy of every parameter. */
  finetune?: 'lora' | 'full';
  /** LoRA rank, default 16. */
  rank?: number;
  /** LoRA alpha, default 16 (scale alpha / rank). */
  alpha?: number;
  /** LoRA targets, default ['all']. */
  targets?: readonly string[];
  /** Seeds adapter init, training noise/time and unseeded sampling; default 0. */
  seed?: number;
  /**
   * Decay of an exponential moving average of the trainable tensors, in [0, 1); 0 (default)
   * keeps none. Each applied optim_step sets ema = d * ema + (1 - d) * param with
   * d = min(emaDecay, (1 + n) / (10 + n)), n the updates so far (a warm-up, so that short runs
   * are not dominated by the initial weights). openpi evaluates and exports such an average.
   */
  emaDecay?: number;
  /** Training time distribution (kernels/flow.ts), default `beta`. */
  timeSampling?: TimeSampling;
}

/**
 * What save_state / save_weights write (PROTOCOL.md section 4); the engine maps it onto
 * kernels/checkpoint.ts's CheckpointContent. `weights` holds the trainable tensors: every
 * parameter (full) or the adapter, `<linear>.lora_a` [in, r] / `.lora_b` [r, out] (LoRA).
 */
export interface ExportedState {
  config: { preset: string; finetune: 'lora' | 'full'; lora_rank: number; lora_alpha: number; lora_targets: string[]; ema_decay?: number };
  weights: NamedTensors;
  /** exportState only: `<param>.exp_avg` / `.exp_avg_sq`, and `<param>.ema` when an average is kept. */
  optimizer?: NamedTensors;
  /** exportState only. */
  trainerState?: { step: number; rng: RngState; sample_rng: RngState; ema_updates?: number };
}

/** Optional explicit noise [b, ah, ad] and time [b] (tests, exact replays); both or neither. */
export interface NoiseTime {
  noise?: Float32Array;
  time?: Float32Array;
}

interface Kept {
  batch: ModelBatch;
  xT: Float32Array;
  time: Float32Array;
  weightSum: number;
}

export interface ForwardResult {
  velocity: Float32Array; // [b, ah, ad]
  target: Float32Array; // [b, ah, ad]
  xT: Float32Array; // [b, ah, ad]
  noise: Float32Array; // [b, ah, ad]
  time: Float32Array; // [b]
}

/**
 * One session's trainable state on a shared base. Public methods follow PROTOCOL.md section 3's
 * ops; all numerics (G, D, loss) are exactly its rules.
 */
export class TrainingState {
  readonly base: BaseWeights;
  readonly config: PolicyConfig;
  readonly finetune: 'lora' | 'full';
  readonly rank: number;
  readonly alpha: number;
  readonly targets: readonly string[];
  /** The trainable tensors by name (adapters or every parameter). */
  readonly params: Map<string, tf.Variable>;
  readonly emaDecay: number;
  readonly timeSampling: TimeSampling;
  /** The moving average of `params` (same names), or null when emaDecay is 0. */
  private ema: Map<string, tf.Variable> | null = null;
  private emaUpdates = 0;
  private emaView: WeightsView | null = null;
  private moments: AdamWMoments;
  private rng: Rng;
  private sampleRng: Rng;
  /** The noise/time generator's state when the current gradient epoch began (abort rewinds to it). */
  private epochRng: RngState;
  private grads = new Map<string, tf.Tensor>();
  private denominator = 0;
  private pending = 0;
  private kept: Kept | null = null;
  private varNames = new Map<string, string>(); // tf variable name -> param name
  private view: WeightsView;
  private disposed = false;

  constructor(base: BaseWeights, options: TrainingOptions = {}) {
    this.base = base;
    this.config = base.config;
    this.finetune = options.finetune ?? 'lora';
    if (this.finetune !== 'lora' && this.finetune !== 'full') {
      throw new TrainerError('bad_option', `finetune is '${String(this.finetune)}'; expected 'lora' or 'full'`);
    }
    this.rank = options.rank ?? 16;
    this.alpha = options.alpha ?? 16;
    this.targets = [...(options.targets ?? ['all'])];
    this.emaDecay = options.emaDecay ?? 0;
    this.timeSampling = options.timeSampling ?? 'beta';
    if (this.timeSampling !== 'beta' && this.timeSampling !== 'uniform') throw new TrainerError('bad_option', `time_sampling is '${String(this.timeSampling)}'; expected 'beta' or 'uniform'`);
    if (!(this.emaDecay >= 0 && this.emaDecay < 1)) throw new TrainerError('bad_option', `ema_decay is ${this.emaDecay}; it must be in [0, 1)`);
    const seed = options.seed ?? 0;
    const initRng = new Rng(seed);
    this.rng = new Rng(seed + 0x5eed1);
    this.epochRng = this.rng.getState();
    this.sampleRng = new Rng(seed + 0x5eed2);
    this.params = new Map();
    if (this.finetune === 'full') {
      for (const [name, t] of base.tensors) this.params.set(name, tf.variable(t, true));
    } else {
      validateLora(this.rank, this.alpha);
      const specs = selectTargets(this.config, this.targets);
      const gateRule = zeroGateRule(this.config, this.targets);
      if (gateRule && adaGatesClosed(base)) throw new LoraError('bad_target', `targets ${JSON.stringify(this.targets)} ${gateRule}`);
      for (const [name, v] of initialAdapters(specs, this.rank, initRng)) {
        const t = tf.tensor(v.data, v.shape, 'float32');
        this.params.set(name, tf.variable(t, true));
        t.dispose(); // the variable holds its own reference to the data
      }
    }
    for (const [name, v] of this.params) this.varNames.set(v.name, name);
    this.moments = AdamWMoments.create(this.params);
    this.view = this.makeView(this.params);
    if (this.emaDecay > 0) {
      // Non-trainable copies: gradients never flow into the average.
      this.ema = new Map([...this.params].map(([name, v]) => [name, tf.variable(v, false)]));
      this.emaView = this.makeView(this.ema);
    }
  }

  private makeView(params: Map<string, tf.Variable>): WeightsView {
    const scale = this.alpha / this.rank;
    const full = this.finetune === 'full';
    const loras = new Map<string, LoraFactors>();
    if (!full) {
      for (const name of params.keys()) {
        if (!name.endsWith('.lora_a')) continue;
        const layer = name.slice(0, -'.lora_a'.length);
        loras.set(layer, { a: params.get(name)!, b: params.get(`${layer}.lora_b`)!, scale });
      }
    }
    return {
      config: this.config,
      get: (name) => (full ? params.get(name) : undefined) ?? this.base.get(name),
      trainable: () => full,
      lora: (layer) => loras.get(layer),
      params: (prefix) => [...params].filter(([n]) => n.startsWith(prefix)).map(([, v]) => v),
    };
  }

  /** The weights to compute with: the moving average when asked (TrainerError when none is kept). */
  private viewFor(ema: boolean | undefined): WeightsView {
    if (!ema) return this.view;
    if (!this.emaView) throw new TrainerError('bad_option', 'ema: true needs a session created with ema_decay > 0');
    return this.emaView;
  }

  /** ema = d * ema + (1 - d) * param after an applied step (see TrainingOptions.emaDecay). */
  private updateEma(): void {
    if (!this.ema) return;
    const d = Math.min(this.emaDecay, (1 + this.emaUpdates) / (10 + this.emaUpdates));
    this.emaUpdates++;
    for (const [name, e] of this.ema) {
      const p = this.params.get(name)!;
      tf.tidy(() => e.assign(tf.add(tf.mul(e, d), tf.mul(p, 1 - d))));
    }
  }

  /** Number of trainable scalars. */
  get trainableParamCount(): number {
    let n = 0;
    for (const v of this.params.values()) n += v.size;
    return n;
  }

  /** Accumulated calls (forward_backward and backward) since the last optim_step or abort. */
  get pendingGradients(): number {
    return this.pending;
  }

  /** Optimizer steps applied (skipped steps do not count). */
  get step(): number {
    return this.moments.step;
  }

  private checkBatch(batch: ModelBatch): void {
    const c = this.config;
    const B = batch.size;
    const want: [string, { length: number }, number][] = [
      ['images', batch.images, B * c.slots * c.imageSize * c.imageSize * 3],
      ['imageMask', batch.imageMask, B * c.slots],
      ['tokens', batch.tokens, B * c.maxTokenLen],
      ['tokenMask', batch.tokenMask, B * c.maxTokenLen],
      ['state', batch.state, B * c.stateDim],
      ['actions', batch.actions, B * c.horizon * c.actionDim],
      ['actionMask', batch.actionMask, B * c.horizon * c.actionDim],
      ['weight', batch.weight, B],
    ];
    if (!Number.isInteger(B) || B < 1) throw new ShapeError('empty_batch', `batch size is ${B}; at least 1 is needed`);
    for (const [name, arr, n] of want) {
      if (arr.length !== n) throw new ShapeError('shape_mismatch', `batch.${name} has ${arr.length} values; a batch of ${B} for ${c.preset} needs ${n}`);
    }
  }

  /** Adds this call's gradients into G (disposing them). */
  private accumulate(grads: tf.NamedTensorMap): void {
    for (const [varName, g] of Object.entries(grads)) {
      const name = this.varNames.get(varName);
      if (!name) {
        g.dispose();
        continue;
      }
      const prev = this.grads.get(name);
      if (prev) {
        this.grads.set(name, tf.add(prev, g));
        prev.dispose();
        g.dispose();
      } else {
        this.grads.set(name, g);
      }
    }
  }

  /** Noise and time from the state's generator, or the caller's (then the generator does not advance). */
  private draw(batch: ModelBatch, given: NoiseTime) {
    const c = this.config;
    const n = batch.size * c.horizon * c.actionDim;
    let noise: Float32Array;
    let time: Float32Array;
    if (given.noise || given.time) {
      if (!given.noise || !given.time) throw new TrainerError('bad_option', 'noise and time must be given together');
      if (given.noise.length !== n) throw new ShapeError('shape_mismatch', `noise has ${given.noise.length} values; the batch needs ${n}`);
      if (given.time.length !== batch.size) throw new ShapeError('shape_mismatch', `time has ${given.time.length} values; the batch needs ${batch.size}`);
      ({ noise, time } = given as Required<NoiseTime>);
    } else {
      ({ noise, time } = drawNoiseTime(this.rng, batch.size, c.horizon, c.actionDim, this.timeSampling));
    }
    return { noise, time, ...noisyActions(batch.actions, noise, time) };
  }

  /**
   * forward_backward: draws noise and time, adds the gradient of sum_i w_i * loss_i to G and
   * sum_i w_i to D. Returns loss = sum w_i loss_i / sum w_i (0 when every weight is 0) and
   * loss_per_datum [b]. Throws ShapeError for a batch that does not fit the config.
   */
  forwardBackward(batch: ModelBatch, options: { lossFn?: LossFn } & NoiseTime = {}): { loss: number; lossPerDatum: Float32Array } {
    this.checkBatch(batch);
    const lossFn = options.lossFn ?? 'mse';
    if (lossFn !== 'mse' && lossFn !== 'l1') throw new TrainerError('bad_option', `loss_fn is '${String(lossFn)}'; expected 'mse' or 'l1'`);
    const c = this.config;
    const B = batch.size;
    const { xT, target, time } = this.draw(batch, options);
    const shape = [B, c.horizon, c.actionDim];
    let per: tf.Tensor | undefined;
    const { value, grads } = tf.variableGrads(() => {
      const v = velocity(this.view, batch, tf.tensor(xT, shape), time);
      per = tf.keep(lossPerDatum(v, tf.tensor(target, shape), tf.tensor(batch.actionMask, shape), lossFn)); // [b]
      return tf.sum(tf.mul(per, tf.tensor1d(batch.weight)));
    }, [...this.params.values()]);
    value.dispose();
    this.accumulate(grads);
    const lossPerDatum_ = per!.dataSync() as Float32Array;
    per!.dispose();
    let num = 0;
    let den = 0;
    for (let i = 0; i < B; i++) {
      num += batch.weight[i]! * lossPerDatum_[i]!;
      den += batch.weight[i]!;
    }
    this.denominator += den;
    this.pending += 1;
    return { loss: den > 0 ? num / den : 0, lossPerDatum: lossPerDatum_ };
  }

  /**
   * forward: draws noise and time like forward_backward and returns the velocity with its
   * inputs. With keep, remembers the batch (by reference: leave it unchanged until backward), and
   * its own copies of x_t and time, for one backward (a later keep replaces it). The state keeps
   * none of the returned arrays: they are the caller's to change or transfer.
   */
  forward(batch: ModelBatch, options: { keep?: boolean; ema?: boolean } & NoiseTime = {}): ForwardResult {
    this.checkBatch(batch);
    if (options.ema && options.keep) throw new TrainerError('bad_option', 'a forward on the moving average cannot be kept for backward');
    const view = this.viewFor(options.ema);
    const c = this.config;
    const { noise, time, xT, target } = this.draw(batch, options);
    const v = tf.tidy(() => velocity(view, batch, tf.tensor(xT, [batch.size, c.horizon, c.actionDim]), time));
    const vel = v.dataSync() as Float32Array;
    v.dispose();
    if (options.keep) {
      let weightSum = 0;
      for (const w of batch.weight) weightSum += w;
      // Copies: the returned arrays are the caller's (the engine transfers them to another thread).
      this.kept = { batch, xT: xT.slice(), time: time.slice(), weightSum };
    }
    return { velocity: vel, target, xT, noise, time };
  }

  /**
   * backward: adds Jᵀ · velocityGrad (the kept forward's velocity Jacobian, recomputed on the
   * same x_t and time) to G and the kept batch's sum of weights to D, then forgets the capture.
   * velocityGrad [b, ah, ad]. Throws TrainerError('nothing_kept'), ShapeError for a wrong size
   * or non-finite values.
   */
  backward(velocityGrad: Float32Array): void {
    const kept = this.kept;
    if (!kept) throw new TrainerError('nothing_kept', 'backward needs a forward with keep: true since the last optim_step, abort or backward');
    const c = this.config;
    const shape = [kept.batch.size, c.horizon, c.actionDim];
    if (velocityGrad.length !== size(shape)) {
      throw new ShapeError('shape_mismatch', `velocity_grad has ${velocityGrad.length} values; the kept forward needs [${shape}] = ${size(shape)}`);
    }
    for (let i = 0; i < velocityGrad.length; i++) {
      if (!Number.isFinite(velocityGrad[i]!)) throw new ShapeError('bad_value', `velocity_grad[${i}] is ${velocityGrad[i]}; values must be finite`);
    }
    const { value, grads } = tf.variableGrads(() => {
      const v = velocity(this.view, kept.batch, tf.tensor(kept.xT, shape), kept.time);
      return tf.sum(tf.mul(v, tf.tensor(velocityGrad, shape)));
    }, [...this.params.values()]);
    value.dispose();
    this.accumulate(grads);
    this.denominator += kept.weightSum;
    this.pending += 1;
    this.kept = null;
  }

  /**
   * optim_step: applies G / D once with AdamW (kernels/optim.ts, torch.optim.AdamW), global L2
   * clipping, non-finite skip, then clears G, D and any capture. D == 0 or not finite: throws
   * TrainerError('no_gradients') and nothing changes; bad options throw OptimError first; an
   * update that would leave a non-finite parameter throws OptimError('non_finite_update') and
   * changes nothing (G and D stay, so a step with other options may follow).
   * Parameters without a gradient in this epoch (the prefix expert's last O and MLP, which
   * feed nothing) get a zero gradient.
   */
  optimStep(options: Partial<AdamWOptions> = {}): { gradNorm: number; skipped: boolean } {
    const opts = resolveAdamWOptions(options);
    const D = this.denominator;
    if (!(D > 0) || !Number.isFinite(D)) {
      throw new TrainerError('no_gradients', `optim_step needs accumulated gradients with a positive sum of weights; D is ${D} after ${this.pending} calls`);
    }
    const zeros: tf.Tensor[] = [];
    const grads = new Map<string, tf.Tensor>();
    for (const [name, p] of this.params) {
      let g = this.grads.get(name);
      if (!g) zeros.push((g = tf.zeros(p.shape)));
      grads.set(name, g);
    }
    let result: { gradNorm: number; skipped: boolean };
    try {
      result = adamwStep(this.params, grads, this.moments, opts, D);
    } catch (e) {
      tf.dispose(zeros);
      if ((e as { code?: unknown }).code === 'non_finite_update') throw e; // refused, nothing changed: G and D stay
      this.clearEpoch();
      throw e;
    }
    tf.dispose(zeros);
    this.clearEpoch();
    if (!result.skipped) this.updateEma();
    return result;
  }

  private clearEpoch(): void {
    tf.dispose([...this.grads.values()]);
    this.grads.clear();
    this.denominator = 0;
    this.pending = 0;
    this.kept = null;
    this.epochRng = this.rng.getState();
  }

  /**
   * abort_gradient_epoch: discards G, D and the capture, and rewinds the noise/time generator to
   * the epoch's start, so the next step is exactly as if the aborted calls never happened
   * (xorl's abort rule). Idempotent.
   */
  abortGradientEpoch(): { discarded: number } {
    const discarded = this.pending;
    this.rng = Rng.fromState(this.epochRng);
    this.clearEpoch();
    return { discarded };
  }

  /** G (copies) and D, for tests and diagnostics. */
  accumulatedGradients(): { grads: Map<string, Float32Array>; denominator: number } {
    const grads = new Map<string, Float32Array>();
    for (const [name, g] of this.grads) grads.set(name, g.dataSync() as Float32Array);
    return { grads, denominator: this.denominator };
  }

  /**
   * sample: Euler integration from seeded noise (MODEL.md "Sampling"), actions [b, ah, ad].
   * The prefix is encoded once and its keys/values cached; `cache: false` re-encodes it at
   * every step (the reference path of the tests). Without a seed the state's sampling
   * generator is used (and advances).
   */
  sample(batch: ModelBatch, options: { numSteps?: number; seed?: number; cache?: boolean; noise?: Float32Array; ema?: boolean } = {}): Float32Array {
    this.checkBatch(batch);
    const view = this.viewFor(options.ema);
    const numSteps = options.numSteps ?? 10;
    if (!Number.isInteger(numSteps) || numSteps < 1 || numSteps > 1000) {
      throw new TrainerError('bad_option', `num_steps is ${numSteps}; it must be an integer in [1, 1000]`);
    }
    if (options.seed !== undefined && !Number.isFinite(options.seed)) throw new TrainerError('bad_option', `seed is ${options.seed}; it must be a finite number`);
    const c = this.config;
    const B = batch.size;
    const n = B * c.horizon * c.actionDim;
    if (options.noise && options.noise.length !== n) throw new ShapeError('shape_mismatch', `noise has ${options.noise.length} values; the batch needs ${n}`);
    const rng = options.seed !== undefined ? new Rng(options.seed) : this.sampleRng;
    // Given noise (the policy server's per-request streams) draws nothing from the generators.
    const noise = tf.tensor(options.noise ?? rng.normals(n), [B, c.horizon, c.actionDim]);
    const times = (t: number) => new Float32Array(B).fill(t);
    let out: tf.Tensor;
    if (options.cache === false) {
      out = eulerSample(noise, numSteps, (x, t) => velocity(view, batch, x, times(t)));
    } else {
      const cache = tf.tidy(() => {
        const k = encodePrefix(view, batch);
        return { kT: k.kT, v: k.v, keyBias: k.keyBias };
      });
      const full = { ...cache, length: cache.keyBias.shape[3]! };
      try {
        out = eulerSample(noise, numSteps, (x, t) => decodeSuffix(view, batch, full, x, times(t)));
      } finally {
        disposeCache(full);
      }
    }
    noise.dispose();
    const data = out.dataSync() as Float32Array;
    out.dispose();
    return data;
  }

  // ---------------------------------------------------------------- export / import

  private exportConfig(): ExportedState['config'] {
    return {
      finetune: this.finetune, lora_rank: this.rank, lora_alpha: this.alpha, lora_targets: [...this.targets], preset: this.config.preset,
      ...(this.ema ? { ema_decay: this.emaDecay } : {}),
    };
  }

  /** The trainable tensors (copies) by name; `ema`: their moving average instead. */
  trainableTensors(ema = false): NamedTensors {
    const out: NamedTensors = {};
    if (ema && !this.ema) throw new TrainerError('bad_option', 'ema: true needs a session created with ema_decay > 0');
    const source = ema ? this.ema! : this.params;
    // slice: dataSync may be the backend's own array (tfjs-node, a tensor no op has used yet).
    for (const [name, v] of source) out[name] = { shape: [...v.shape], data: (v.dataSync() as Float32Array).slice() };
    return out;
  }

  /** save_weights: the adapter (LoRA) or every parameter (full); `ema`: the moving average of them. */
  exportWeights(options: { ema?: boolean } = {}): ExportedState {
    return { config: this.exportConfig(), weights: this.trainableTensors(options.ema) };
  }

  /** save_state: weights + AdamW moments (+ the moving average as `<param>.ema`) + step and generator states. */
  exportState(): ExportedState {
    const m = this.moments.export();
    const optimizer = m.tensors;
    if (this.ema) for (const [name, t] of Object.entries(this.trainableTensors(true))) optimizer[`${name}.ema`] = t;
    return {
      ...this.exportWeights(),
      optimizer,
      trainerState: { step: m.step, rng: this.rng.getState(), sample_rng: this.sampleRng.getState(), ...(this.ema ? { ema_updates: this.emaUpdates } : {}) },
    };
  }

  /**
   * Loads trainable tensors saved by exportWeights (same finetune mode, targets and rank);
   * `weights`, or a checkpoint's `adapter.tensors`, are accepted. Discards G, D and the
   * capture. All checks run before anything changes. Throws TrainerError('bad_weights').
   */
  importWeights(state: { weights?: NamedTensors; adapter?: { tensors: NamedTensors }; config?: Partial<ExportedState['config']> }): void {
    const finetune = state.config?.finetune ?? this.finetune;
    if (finetune !== this.finetune) {
      throw new TrainerError('bad_weights', `the weights are for finetune '${finetune}'; this session is '${this.finetune}'`);
    }
    const named = state.weights ?? state.adapter?.tensors;
    if (!named) throw new TrainerError('bad_weights', 'the checkpoint has no weights or adapter tensors');
    checkNamed(named, new Map([...this.params].map(([n, v]) => [n, [...v.shape]])), this.finetune === 'full' ? 'weights' : 'adapter');
    for (const [name, v] of this.params) {
      const t = named[name]!;
      tf.tidy(() => v.assign(tf.tensor(t.data, v.shape, 'float32')));
    }
    // The average restarts from the loaded weights (importState then restores a saved one).
    for (const [name, e] of this.ema ?? []) e.assign(this.params.get(name)!);
    this.emaUpdates = 0;
    this.clearEpoch();
  }

  /** Loads a state saved by exportState: weights, moments, step and generators. All checks
   * run before anything changes. Throws TrainerError('bad_state' / 'bad_weights'), OptimError. */
  importState(state: Omit<ExportedState, 'weights'> & { weights?: NamedTensors; adapter?: { tensors: NamedTensors } }): void {
    if (!state.optimizer || !state.trainerState) throw new TrainerError('bad_state', 'the state has no optimizer tensors or trainer state');
    const ts = state.trainerState;
    if (!Array.isArray(ts.rng) || !Array.isArray(ts.sample_rng)) throw new TrainerError('bad_state', 'trainer_state lacks the generator states rng and sample_rng');
    const rng = Rng.fromState(ts.rng);
    const sampleRng = Rng.fromState(ts.sample_rng);
    // The moving average travels with the moments (`<param>.ema`); split it off first.
    const momentTensors: NamedTensors = {};
    const emaTensors: NamedTensors = {};
    for (const [k, t] of Object.entries(state.optimizer)) {
      if (k.endsWith('.ema')) emaTensors[k.slice(0, -'.ema'.length)] = t;
      else momentTensors[k] = t;
    }
    if (this.ema) {
      checkNamed(emaTensors, new Map([...this.params].map(([n, v]) => [n, [...v.shape]])), 'the saved moving average');
    } else if (Object.keys(emaTensors).length > 0) {
      throw new TrainerError('bad_state', 'the state holds a moving average of the weights; create the session with ema_decay > 0 to load it');
    }
    const moments = AdamWMoments.import(this.params, { step: ts.step, tensors: momentTensors });
    try {
      this.importWeights(state);
    } catch (e) {
      moments.dispose();
      throw e;
    }
    this.moments.dispose();
    this.moments = moments;
    if (this.ema) {
      for (const [name, e] of this.ema) tf.tidy(() => e.assign(tf.tensor(emaTensors[name]!.data, e.shape, 'float32')));
      this.emaUpdates = ts.ema_updates ?? 0;
    }
    this.rng = rng;
    this.epochRng = rng.getState();
    this.sampleRng = sampleRng;
  }

  /** Frees the trainable tensors, moments and G (not the shared base). */
  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    this.clearEpoch();
    this.moments.dispose();
    for (const v of this.params.values()) v.dispose();
    for (const v of this.ema?.values() ?? []) v.dispose();
  }
}
