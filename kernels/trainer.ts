/**
 * Training state of one session (PROTOCOL.md section 3): a frozen, shared BaseWeights; the
 * trainable tensors (LoRA adapters, with the parameters a family trains in full beside them,
 * FlowPolicy.loraFullParams; or a full copy); the accumulated gradient G and denominator
 * D; AdamW moments; the seeded generators. Many TrainingStates reference one BaseWeights
 * without copying it (MODEL.md "LoRA and targets").
 *
 * The state is generic over the model family through kernels/flow-policy.ts: the small presets
 * (a PolicyConfig, ModelBatch) and the real pi0 / pi0.5 (kernels/pi/policy.ts, RealPiBatch) go
 * through the same steps. Split by concern: the base weights (kernels/base-weights.ts), the
 * trained copies or adapters and the view over them (kernels/adapters.ts), AdamW
 * (kernels/optim.ts), flow matching (kernels/flow.ts); this file is the step and the state's
 * export / import.
 */
import type { ChunkPrefix } from './rtc.ts';
import { sampleActions } from './sampling.ts';
import { lossGraphsOf, type LossGraphs } from './step-graph.ts';
import * as tf from '@tensorflow/tfjs';
import type { PolicyConfig } from './small/config.ts';
import { ShapeError, type ModelBatch } from './small/batch.ts';
import { Rng, type RngState } from './rng.ts';
import { drawNoiseTime, heldPrefix, noisyActions, weightedLoss, type LossFn, type TimeSampling } from './flow.ts';
import type { FlowPolicy, PolicyWeights } from './flow-policy.ts';
import { AdamWMoments, adamwStep, resolveAdamWOptions, type AdamWOptions } from './optim.ts';
import { BaseWeights, TrainerError, checkNamed, size, type NamedTensors } from './base-weights.ts';
import { fullCopies, loraAdapters, weightsView, type LoraShape } from './adapters.ts';

export { BaseWeights, TrainerError, type NamedTensors, type TrainerErrorCode } from './base-weights.ts';
export { sampleActions } from './sampling.ts';

// ---------------------------------------------------------------- training state

export interface TrainingOptions {
  /** 'lora' (default): train adapters on the frozen base; 'full': train a copy of every parameter. */
  finetune?: 'lora' | 'full';
  /** LoRA rank, default 16. */
  rank?: number;
  /** LoRA alpha, default 16 (scale alpha / rank). */
  alpha?: number;
  /** Rank of the action expert's adapters (openpi's pi0 / pi0.5: 32 where the VLM has 16); default `rank`. */
  actionRank?: number;
  /** Alpha of the action expert's adapters; default `alpha`. */
  actionAlpha?: number;
  /** LoRA targets, default ['all']. */
  targets?: readonly string[];
  /**
   * Full fine-tune only: parameters kept frozen at the base's values (e.g. the real models'
   * token embedding, 16.5 M values in the tiny config, 527 M in the full one); default none.
   */
  frozen?: readonly string[];
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
  /**
   * Training-time real-time chunking (kernels/rtc.ts, arXiv 2512.05964): forward_backward draws a
   * delay d ~ uniform{0..rtcMaxDelay} per datum after the noise and time, gives the datum's first
   * d actions clean at flow time 0 (x_t = the actions there) and counts the loss on the rest only.
   * A policy so trained is served with RTC's `prefix` mode. An integer in [0, horizon - 1];
   * default 0 (off: the draws and the loss are exactly those without it).
   */
  rtcMaxDelay?: number;
}

/**
 * What save_state / save_weights write (PROTOCOL.md section 4); the engine maps it onto
 * kernels/checkpoint.ts's CheckpointContent. `weights` holds the trainable tensors: every
 * parameter (full) or the adapter, `<linear>.lora_a` [in, r] / `.lora_b` [r, out] (LoRA), then
 * the parameters LoRA trains in full (config.lora_full) under their own names.
 */
export interface ExportedState {
  config: {
    preset: string; finetune: 'lora' | 'full'; lora_rank: number; lora_alpha: number; lora_targets: string[]; ema_decay?: number;
    /** Trained with training-time RTC (TrainingOptions.rtcMaxDelay): policy servers sample it in RTC's prefix mode. */
    rtc_max_delay?: number;
    /** Only when they differ from lora_rank / lora_alpha. */
    lora_action_rank?: number; lora_action_alpha?: number;
    /** Full fine-tune: the parameters left frozen, when any. */
    frozen?: string[];
    /** LoRA: the parameters trained in full beside the adapters (TrainingState.loraFull), when any. */
    lora_full?: string[];
  };
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

interface Kept<B> {
  batch: B;
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
 * ops; all numerics (G, D, loss) are exactly its rules. B, C: the model's batch and config
 * (default: the small presets').
 */
export class TrainingState<B = ModelBatch, C = PolicyConfig> {
  readonly base: BaseWeights<B, C>;
  readonly policy: FlowPolicy<B, C>;
  readonly config: C;
  readonly finetune: 'lora' | 'full';
  readonly rank: number;
  readonly alpha: number;
  readonly actionRank: number;
  readonly actionAlpha: number;
  readonly targets: readonly string[];
  readonly frozen: readonly string[];
  /**
   * LoRA only: the parameters trained in full beside the adapters (the policy's loraFullParams,
   * e.g. the real models' action / state / time projections; PEFT's `modules_to_save`); empty
   * for a full fine-tune and for families that name none (the small presets).
   */
  readonly loraFull: readonly string[];
  /** The trainable tensors by name (adapters, then any loraFull copies; or every parameter). */
  readonly params: Map<string, tf.Variable>;
  readonly emaDecay: number;
  readonly timeSampling: TimeSampling;
  readonly rtcMaxDelay: number;
  /** The moving average of `params` (same names), or null when emaDecay is 0. */
  private ema: Map<string, tf.Variable> | null = null;
  private emaUpdates = 0;
  private emaView: PolicyWeights | null = null;
  private moments: AdamWMoments;
  private rng: Rng;
  private sampleRng: Rng;
  /** The noise/time generator's state when the current gradient epoch began (abort rewinds to it). */
  private epochRng: RngState;
  private grads = new Map<string, tf.Tensor>();
  private denominator = 0;
  private pending = 0;
  private kept: Kept<B> | null = null;
  private varNames = new Map<string, string>(); // tf variable name -> param name
  private loraScales = new Map<string, number>(); // adapted linear -> alpha / rank
  private view: PolicyWeights;
  /** forward_backward as one graph call per batch layout (kernels/step-graph.ts), shared per policy. */
  private get lossGraphs(): LossGraphs {
    return lossGraphsOf(this.policy);
  }
  private disposed = false;

  constructor(base: BaseWeights<B, C>, options: TrainingOptions = {}) {
    this.base = base;
    this.policy = base.policy;
    this.config = base.config;
    this.finetune = options.finetune ?? 'lora';
    if (this.finetune !== 'lora' && this.finetune !== 'full') {
      throw new TrainerError('bad_option', `finetune is '${String(this.finetune)}'; expected 'lora' or 'full'`);
    }
    this.rank = options.rank ?? 16;
    this.alpha = options.alpha ?? 16;
    this.actionRank = options.actionRank ?? this.rank;
    this.actionAlpha = options.actionAlpha ?? this.alpha;
    this.targets = [...(options.targets ?? ['all'])];
    this.frozen = [...(options.frozen ?? [])];
    if (this.frozen.length > 0 && this.finetune !== 'full') throw new TrainerError('bad_option', `frozen lists ${this.frozen.length} parameters; it applies to finetune 'full' only (LoRA freezes the whole base)`);
    this.emaDecay = options.emaDecay ?? 0;
    this.timeSampling = options.timeSampling ?? 'beta';
    if (this.timeSampling !== 'beta' && this.timeSampling !== 'uniform') throw new TrainerError('bad_option', `time_sampling is '${String(this.timeSampling)}'; expected 'beta' or 'uniform'`);
    this.rtcMaxDelay = options.rtcMaxDelay ?? 0;
    const H = this.policy.horizon;
    if (!Number.isInteger(this.rtcMaxDelay) || this.rtcMaxDelay < 0 || this.rtcMaxDelay >= H) throw new TrainerError('bad_option', `rtc_max_delay is ${this.rtcMaxDelay}; it must be an integer in [0, ${H - 1}] (the horizon is ${H})`);
    if (!(this.emaDecay >= 0 && this.emaDecay < 1)) throw new TrainerError('bad_option', `ema_decay is ${this.emaDecay}; it must be in [0, 1)`);
    const seed = options.seed ?? 0;
    const initRng = new Rng(seed);
    this.rng = new Rng(seed + 0x5eed1);
    this.epochRng = this.rng.getState();
    this.sampleRng = new Rng(seed + 0x5eed2);
    if (this.finetune === 'full') {
      this.params = fullCopies(base, this.frozen);
      this.loraFull = [];
    } else {
      const lora: LoraShape = { rank: this.rank, alpha: this.alpha, actionRank: this.actionRank, actionAlpha: this.actionAlpha };
      ({ params: this.params, scales: this.loraScales } = loraAdapters(base, this.targets, lora, initRng));
      // After the adapters, so their seeded init is the same with or without these copies.
      this.loraFull = [...(this.policy.loraFullParams?.() ?? [])];
      for (const name of this.loraFull) this.params.set(name, tf.variable(base.get(name), true));
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

  private makeView(params: Map<string, tf.Variable>): PolicyWeights {
    return weightsView(this.base, params, this.loraScales);
  }

  /** The weights to compute with: the moving average when asked (TrainerError when none is kept). */
  private viewFor(ema: boolean | undefined): PolicyWeights {
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

  /** Adds this call's gradients (by tf.Variable name) into G (disposing them). */
  private accumulate(grads: tf.NamedTensorMap): void {
    const byName = new Map<string, tf.Tensor>();
    for (const [varName, g] of Object.entries(grads)) {
      const name = this.varNames.get(varName);
      if (name) byName.set(name, g);
      else g.dispose();
    }
    this.accumulateByName(byName);
  }

  /** Adds this call's gradients (by parameter name) into G (disposing them). */
  private accumulateByName(grads: ReadonlyMap<string, tf.Tensor>): void {
    for (const [name, g] of grads) {
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
  private draw(batch: B, given: NoiseTime) {
    const { horizon, actionDim } = this.policy;
    const B = this.policy.batchSize(batch);
    const n = B * horizon * actionDim;
    let noise: Float32Array;
    let time: Float32Array;
    if (given.noise || given.time) {
      if (!given.noise || !given.time) throw new TrainerError('bad_option', 'noise and time must be given together');
      if (given.noise.length !== n) throw new ShapeError('shape_mismatch', `noise has ${given.noise.length} values; the batch needs ${n}`);
      if (given.time.length !== B) throw new ShapeError('shape_mismatch', `time has ${given.time.length} values; the batch needs ${B}`);
      ({ noise, time } = given as Required<NoiseTime>);
    } else {
      ({ noise, time } = drawNoiseTime(this.rng, B, horizon, actionDim, this.timeSampling));
    }
    return { noise, time, ...noisyActions(this.policy.lossTargets(batch).actions, noise, time) };
  }

  /**
   * forward_backward: draws noise and time, adds the gradient of sum_i w_i * loss_i to G and
   * sum_i w_i to D. Returns loss = sum w_i loss_i / sum w_i (0 when every weight is 0) and
   * loss_per_datum [b]. Throws ShapeError for a batch that does not fit the config.
   */
  forwardBackward(batch: B, options: { lossFn?: LossFn } & NoiseTime = {}): { loss: number; lossPerDatum: Float32Array } {
    this.policy.checkBatch(batch, true);
    const lossFn = options.lossFn ?? 'mse';
    if (lossFn !== 'mse' && lossFn !== 'l1') throw new TrainerError('bad_option', `loss_fn is '${String(lossFn)}'; expected 'mse' or 'l1'`);
    const B = this.policy.batchSize(batch);
    const { weight } = this.policy.lossTargets(batch);
    const drawn = this.draw(batch, options);
    const { xT, target, time, actionMask } = this.rtcMaxDelay > 0
      ? heldPrefix(this.policy.lossTargets(batch), drawn, this.rng.uniforms(B), this.rtcMaxDelay, this.policy.horizon)
      : { ...drawn, actionMask: this.policy.lossTargets(batch).actionMask };
    const shape = this.actionShape(B);
    let per: tf.Tensor | undefined;
    const vin = this.policy.velocityInputs?.(batch, time);
    const graphed = vin && this.lossGraphs.run(vin, this.view, this.params, { xT, target, actionMask, weight }, shape, lossFn);
    if (graphed) {
      per = graphed.per;
      this.accumulateByName(graphed.grads);
    } else {
      const { value, grads } = tf.variableGrads(() => {
        const l = weightedLoss((x) => this.policy.velocity(this.view, batch, x, time), xT, target, actionMask, weight, shape, lossFn);
        per = l.per;
        return l.total;
      }, [...this.params.values()]);
      value.dispose();
      this.accumulate(grads);
    }
    const lossPerDatum_ = per!.dataSync() as Float32Array;
    per!.dispose();
    let num = 0;
    let den = 0;
    for (let i = 0; i < B; i++) {
      num += weight[i]! * lossPerDatum_[i]!;
      den += weight[i]!;
    }
    this.denominator += den;
    this.pending += 1;
    return { loss: den > 0 ? num / den : 0, lossPerDatum: lossPerDatum_ };
  }

  /**
   * Gradient accumulation (issue 34): forward_backward of one batch given as consecutive
   * micro-batches `parts` (datums 0..b0-1, then b0..b0+b1-1, ...), one taped pass per part, so a
   * pass holds one part's activations. Noise and time are drawn once for the whole batch, in the
   * order one forwardBackward of it would draw them (and RTC's delays after them, part by part:
   * the same sequence), so G, D, the loss and the generator's next state equal one call on the
   * whole batch to float32 rounding of the summation order. loss = sum_i w_i loss_i / sum_i w_i
   * over every datum (0 when every weight is 0); lossPerDatum [b] in datum order.
   * `given` noise / time, when passed, are the whole batch's. Throws as forwardBackward does,
   * and TrainerError('bad_option') for no parts; a part that throws leaves the parts before it
   * accumulated (abort discards them, as after any forward_backward).
   */
  forwardBackwardParts(parts: readonly B[], options: { lossFn?: LossFn } & NoiseTime = {}): { loss: number; lossPerDatum: Float32Array } {
    if (parts.length === 0) throw new TrainerError('bad_option', 'forward_backward in micro-batches needs at least one part');
    if (parts.length === 1) return this.forwardBackward(parts[0]!, options);
    const { horizon, actionDim } = this.policy;
    const sizes = parts.map((p) => this.policy.batchSize(p));
    const total = sizes.reduce((a, b) => a + b, 0);
    let { noise, time } = options;
    if (noise || time) {
      if (!noise || !time) throw new TrainerError('bad_option', 'noise and time must be given together');
      if (noise.length !== total * horizon * actionDim || time.length !== total) throw new ShapeError('shape_mismatch', `noise / time have ${noise.length} / ${time.length} values; the batch of ${total} needs ${total * horizon * actionDim} / ${total}`);
    } else ({ noise, time } = drawNoiseTime(this.rng, total, horizon, actionDim, this.timeSampling));
    const per = horizon * actionDim;
    const lossPerDatum = new Float32Array(total);
    let num = 0;
    let den = 0;
    let at = 0;
    for (const [k, part] of parts.entries()) {
      const n = sizes[k]!;
      const r = this.forwardBackward(part, { lossFn: options.lossFn, noise: noise.subarray(at * per, (at + n) * per), time: time.subarray(at, at + n) });
      const { weight } = this.policy.lossTargets(part);
      for (let i = 0; i < n; i++) {
        num += weight[i]! * r.lossPerDatum[i]!;
        den += weight[i]!;
      }
      lossPerDatum.set(r.lossPerDatum, at);
      at += n;
    }
    return { loss: den > 0 ? num / den : 0, lossPerDatum };
  }

  /**
   * forward: draws noise and time like forward_backward and returns the velocity with its
   * inputs. With keep, remembers the batch (by reference: leave it unchanged until backward), and
   * its own copies of x_t and time, for one backward (a later keep replaces it). The state keeps
   * none of the returned arrays: they are the caller's to change or transfer.
   */
  forward(batch: B, options: { keep?: boolean; ema?: boolean } & NoiseTime = {}): ForwardResult {
    this.policy.checkBatch(batch, true);
    if (options.ema && options.keep) throw new TrainerError('bad_option', 'a forward on the moving average cannot be kept for backward');
    const view = this.viewFor(options.ema);
    const { noise, time, xT, target } = this.draw(batch, options);
    const v = tf.tidy(() => this.policy.velocity(view, batch, tf.tensor(xT, this.actionShape(this.policy.batchSize(batch))), time));
    const vel = v.dataSync() as Float32Array;
    v.dispose();
    if (options.keep) {
      let weightSum = 0;
      for (const w of this.policy.lossTargets(batch).weight) weightSum += w;
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
    const shape = this.actionShape(this.policy.batchSize(kept.batch));
    if (velocityGrad.length !== size(shape)) {
      throw new ShapeError('shape_mismatch', `velocity_grad has ${velocityGrad.length} values; the kept forward needs [${shape}] = ${size(shape)}`);
    }
    for (let i = 0; i < velocityGrad.length; i++) {
      if (!Number.isFinite(velocityGrad[i]!)) throw new ShapeError('bad_value', `velocity_grad[${i}] is ${velocityGrad[i]}; values must be finite`);
    }
    const { value, grads } = tf.variableGrads(() => {
      const v = this.policy.velocity(this.view, kept.batch, tf.tensor(kept.xT, shape), kept.time);
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
   * generator is used (and advances). `chunk`: real-time chunking against the previous chunk
   * (kernels/rtc.ts).
   */
  sample(batch: B, options: { numSteps?: number; seed?: number; cache?: boolean; noise?: Float32Array; ema?: boolean; chunk?: ChunkPrefix; trace?: boolean } = {}): Float32Array {
    const view = this.viewFor(options.ema);
    if (options.seed !== undefined && !Number.isFinite(options.seed)) throw new TrainerError('bad_option', `seed is ${options.seed}; it must be a finite number`);
    return sampleActions(this.policy, view, batch, options.seed !== undefined ? new Rng(options.seed) : this.sampleRng, options);
  }

  /** [b, ah, ad] for a batch of b. */
  private actionShape(b: number): number[] {
    return [b, this.policy.horizon, this.policy.actionDim];
  }

  // ---------------------------------------------------------------- export / import

  private exportConfig(): ExportedState['config'] {
    return {
      finetune: this.finetune, lora_rank: this.rank, lora_alpha: this.alpha, lora_targets: [...this.targets], preset: this.policy.name,
      ...(this.ema ? { ema_decay: this.emaDecay } : {}),
      ...(this.rtcMaxDelay > 0 ? { rtc_max_delay: this.rtcMaxDelay } : {}),
      ...(this.actionRank !== this.rank ? { lora_action_rank: this.actionRank } : {}),
      ...(this.actionAlpha !== this.alpha ? { lora_action_alpha: this.actionAlpha } : {}),
      ...(this.frozen.length > 0 ? { frozen: [...this.frozen] } : {}),
      ...(this.loraFull.length > 0 ? { lora_full: [...this.loraFull] } : {}),
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
    const given = state.weights ?? state.adapter?.tensors;
    if (!given) throw new TrainerError('bad_weights', 'the checkpoint has no weights or adapter tensors');
    const named = this.withLoraFullDefaults(given);
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

  /**
   * `named` with the base's values for every loraFull parameter it lacks: an adapter saved before
   * its family trained them in full (or by PEFT without modules_to_save) still loads, on the base's
   * projections. Returns `named` itself when nothing is missing.
   */
  private withLoraFullDefaults(named: NamedTensors): NamedTensors {
    const missing = this.loraFull.filter((n) => !Object.hasOwn(named, n));
    if (missing.length === 0) return named;
    const out: NamedTensors = { ...named };
    for (const n of missing) {
      const t = this.base.get(n);
      out[n] = { shape: [...t.shape], data: t.dataSync() as Float32Array };
    }
    return out;
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
    // A state saved before the family trained its loraFull parameters: they start from the base
    // (importWeights), with zero moments and an average equal to them.
    const savedWeights = state.weights ?? state.adapter?.tensors ?? {};
    for (const name of this.loraFull) {
      if (Object.hasOwn(savedWeights, name)) continue;
      const shape = [...this.params.get(name)!.shape];
      for (const k of [`${name}.exp_avg`, `${name}.exp_avg_sq`]) momentTensors[k] ??= { shape, data: new Float32Array(size(shape)) };
      if (this.ema) emaTensors[name] ??= { shape, data: this.base.get(name).dataSync() as Float32Array };
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
