/**
 * The one interface between a flow-matching model family and the shared training machinery
 * (kernels/trainer.ts: full fine-tune and LoRA, AdamW, gradient accumulation, EMA, export and
 * import, sampling). The small presets (kernels/small/flow-policy.ts) and the real pi0 / pi0.5
 * (kernels/pi/policy.ts) both implement it; the trainer knows nothing else about a model.
 *
 * What stays in the shared machinery, the same for every family: the noise/time draws and x_t
 * (kernels/flow.ts, openpi's convention: t = 1 is noise), the per-datum loss and its weighting
 * (PROTOCOL.md section 3), the LoRA adapter tensors `<linear>.lora_a` [in, r] / `.lora_b`
 * [r, out] (y += (alpha / r) · x · A · B whatever the family's weight layout), the Euler sampler.
 * What a family supplies: its parameter table, its LoRA-targetable linears, its batch and how to
 * check it, the velocity, and a sampler that may cache the prefix.
 */
import type * as tf from '@tensorflow/tfjs';
import type { LoraFactors } from './layers.ts';
import type { ChunkTensors } from './rtc.ts';

/** The weights a forward pass reads, as the trainer hands them over. */
export interface PolicyWeights {
  /** The tensor of parameter `name` (a trained tf.Variable or the frozen base's tensor). */
  get(name: string): tf.Tensor;
  /** Whether `name` is trained (its gradient is wanted). */
  trainable(name: string): boolean;
  /** The LoRA factors of linear layer `linear`, when it has an adapter. */
  lora(linear: string): LoraFactors | undefined;
  /** The trainable variables whose names start with `prefix` (enables gradient checkpointing). */
  params?(prefix: string): tf.Variable[];
}

/** One parameter of a family's table: its name and shape (in the family's own layout). */
export interface PolicyParamSpec {
  readonly name: string;
  readonly shape: readonly number[];
}

/** A linear layer LoRA may adapt: its module name, fan-in and fan-out, and which expert it serves. */
export interface PolicyLinear {
  readonly name: string; // adapter tensors are `${name}.lora_a` [in, r] and `${name}.lora_b` [r, out]
  readonly inDim: number;
  readonly outDim: number;
  /** 'prefix' = the VLM (prefix expert), 'action' = the action expert; selects the rank. */
  readonly expert: 'prefix' | 'action' | 'other';
}

/** What the shared loss reads from a batch: the clean actions, which entries count, datum weights. */
export interface LossTargets {
  readonly actions: Float32Array; // [b, ah, ad]
  readonly actionMask: Float32Array; // [b, ah, ad], 1 = counts in the datum's mean
  readonly weight: Float32Array; // [b], >= 0
}

/**
 * A flow-matching policy family bound to one configuration. B is its batch type, C its config.
 * Every tensor-returning method is called inside the trainer's tape or tidy and returns a new
 * tensor the caller owns.
 */
export interface FlowPolicy<B, C> {
  /** The name written into exported configs (`preset`). */
  readonly name: string;
  readonly config: C;
  /** ah: actions per chunk. */
  readonly horizon: number;
  /** ad: action dims the model sees. */
  readonly actionDim: number;
  /** Every parameter, in a fixed order. */
  paramSpecs(): readonly PolicyParamSpec[];
  /** Initial values of every parameter of paramSpecs (a seeded init, the same on every backend). */
  initialValues(seed: number): Map<string, Float32Array>;
  /** The linears a LoRA target list selects, in parameter order. @throws LoraError('bad_target'). */
  loraLinears(targets: readonly string[]): PolicyLinear[];
  /**
   * Parameters that a LoRA fine-tune trains in full beside the adapters (PEFT's
   * `modules_to_save`), e.g. the real models' action / state / time projections, which openpi's
   * LoRA configs leave trainable. Optional: without it LoRA trains adapters only.
   */
  loraFullParams?(): readonly string[];
  /**
   * Why LoRA with `targets` cannot learn on `base` (e.g. pi0.5's closed zero gates), or null.
   * Optional: a family without such a trap leaves it out.
   */
  loraRefusal?(targets: readonly string[], base: ReadonlyMap<string, tf.Tensor>): string | null;
  /** The datum count of a batch. */
  batchSize(batch: B): number;
  /** @throws ShapeError naming the field, its size and the expected one; `needActions` for training. */
  checkBatch(batch: B, needActions: boolean): void;
  /** The loss inputs of a checked training batch. */
  lossTargets(batch: B): LossTargets;
  /** v(x_t, t) [b, ah, ad] for noisy actions xT [b, ah, ad] at times [b], prefix and suffix in one pass. */
  velocity(W: PolicyWeights, batch: B, xT: tf.Tensor, time: Float32Array): tf.Tensor;
  /**
   * Euler integration (kernels/flow.ts eulerSample) from `noise` [b, ah, ad] at t = 1 to t = 0 in
   * numSteps steps: [b, ah, ad]. `cache`: the prefix runs once and its keys/values serve every
   * step; false re-runs velocity at every step (the reference path of tests). `chunk`: real-time
   * chunking against a previous chunk (kernels/rtc.ts), passed on to eulerSample.
   */
  sample(W: PolicyWeights, batch: B, noise: tf.Tensor, numSteps: number, cache: boolean, chunk?: ChunkTensors): tf.Tensor;
  /**
   * The cached sampler of `batch` split for a traced graph (kernels/sample-graph.ts): `key` names
   * everything besides array shapes that decides which ops run (e.g. which camera slots are
   * filled), `host` the arrays computed from the batch in JS that `sample` makes into tensors
   * as they are (by identity), in a fixed order, and `sample` computes what `sample(W, batch,
   * noise, numSteps, true)` does from those very arrays. Optional: without it sampling is eager.
   */
  sampleInputs?(batch: B): SampleInputs;
  /** The velocity split for a traced training graph (VelocityInputs). Optional: without it training is eager. */
  velocityInputs?(batch: B, time: Float32Array): VelocityInputs;
}

/**
 * The velocity of `batch` at times `time` split for a traced training graph (kernels/step-graph.ts),
 * as SampleInputs is for sampling: `velocity(W, xT)` computes velocity(W, batch, xT, time) from
 * the arrays in `host` (made into tensors as they are).
 */
export interface VelocityInputs {
  readonly key: string;
  readonly host: (Float32Array | Int32Array)[];
  velocity(W: PolicyWeights, xT: tf.Tensor): tf.Tensor;
}

/** See FlowPolicy.sampleInputs. */
export interface SampleInputs {
  readonly key: string;
  readonly host: (Float32Array | Int32Array)[];
  sample(W: PolicyWeights, noise: tf.Tensor, numSteps: number, chunk?: ChunkTensors): tf.Tensor;
}

/** Whether `x` is a FlowPolicy (rather than a small preset's PolicyConfig). */
export function isFlowPolicy(x: unknown): x is FlowPolicy<unknown, unknown> {
  return typeof x === 'object' && x !== null && typeof (x as { velocity?: unknown }).velocity === 'function' && typeof (x as { paramSpecs?: unknown }).paramSpecs === 'function';
}
