/**
 * The frozen base parameters of one model, built once and shared by reference by every
 * TrainingState on it (MODEL.md "LoRA and targets"), and the trainer's error type.
 */
import * as tf from '@tensorflow/tfjs';
import type { PolicyConfig } from './small/config.ts';
import type { ModelBatch } from './small/batch.ts';
import { isFlowPolicy, type FlowPolicy, type PolicyWeights } from './flow-policy.ts';
import type { ExportedTensor } from './optim.ts';
import { smallPolicy } from './small/flow-policy.ts';

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

/** Elements of a tensor of `shape` (1 for a scalar). */
export const size = (shape: readonly number[]) => shape.reduce((a, b) => a * b, 1);

/**
 * Checks that `named` holds exactly the tensors of `expected` (name -> shape), each with its
 * shape and value count. @throws TrainerError('bad_weights') naming the first problem.
 */
export function checkNamed(named: NamedTensors, expected: ReadonlyMap<string, readonly number[]>, what: string): void {
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

function policyOf<B, C>(spec: FlowPolicy<B, C> | PolicyConfig): FlowPolicy<B, C> {
  return (isFlowPolicy(spec) ? spec : smallPolicy(spec)) as unknown as FlowPolicy<B, C>;
}

/**
 * The frozen base parameters of one model. B is the model's batch type, C its config; the
 * defaults are the small presets' (a PolicyConfig passed where a policy is expected is bound
 * with kernels/small/flow-policy.ts).
 */
export class BaseWeights<B = ModelBatch, C = PolicyConfig> {
  readonly policy: FlowPolicy<B, C>;
  readonly config: C;
  readonly tensors: ReadonlyMap<string, tf.Tensor>;
  readonly paramCount: number;

  private constructor(policy: FlowPolicy<B, C>, tensors: Map<string, tf.Tensor>) {
    this.policy = policy;
    this.config = policy.config;
    this.tensors = tensors;
    this.paramCount = [...tensors.values()].reduce((n, t) => n + t.size, 0);
  }

  /** Seeded initialisation (small presets: D1, D3, D10), the same on every backend. */
  static create(config: PolicyConfig, seed?: number): BaseWeights;
  static create<B, C>(policy: FlowPolicy<B, C>, seed?: number): BaseWeights<B, C>;
  static create<B, C>(spec: FlowPolicy<B, C> | PolicyConfig, seed = 0): BaseWeights<B, C> {
    const policy = policyOf(spec);
    const values = policy.initialValues(seed);
    const tensors = new Map<string, tf.Tensor>();
    for (const s of policy.paramSpecs()) tensors.set(s.name, tf.tensor(values.get(s.name)!, [...s.shape], 'float32'));
    return new BaseWeights(policy, tensors);
  }

  /**
   * Base weights from named tensors (an operator's safetensors file, a checkpoint). Every
   * parameter of the table must be present with its shape, and nothing else; throws
   * TrainerError('bad_weights').
   */
  static fromTensors(config: PolicyConfig, named: NamedTensors): BaseWeights;
  static fromTensors<B, C>(policy: FlowPolicy<B, C>, named: NamedTensors): BaseWeights<B, C>;
  static fromTensors<B, C>(spec: FlowPolicy<B, C> | PolicyConfig, named: NamedTensors): BaseWeights<B, C> {
    const policy = policyOf(spec);
    const specs = policy.paramSpecs();
    checkNamed(named, new Map(specs.map((s) => [s.name, s.shape])), 'base weights');
    const tensors = new Map<string, tf.Tensor>();
    for (const s of specs) tensors.set(s.name, tf.tensor(named[s.name]!.data, [...s.shape], 'float32'));
    return new BaseWeights(policy, tensors);
  }

  /**
   * Base weights that take over tensors already made (no copy: a checkpoint reader's sink makes
   * one tensor per parameter as it streams, so the peak stays near one float32 model). The map
   * must hold exactly the table's names, each in its shape; on success the tensors belong to
   * the BaseWeights (dispose frees them), on error they stay the caller's.
   * @throws TrainerError('bad_weights') naming every missing, unexpected and misshapen tensor.
   */
  static adopt<B, C>(policy: FlowPolicy<B, C>, tensors: ReadonlyMap<string, tf.Tensor>): BaseWeights<B, C> {
    const specs = policy.paramSpecs();
    const problems: string[] = [];
    for (const s of specs) {
      const t = tensors.get(s.name);
      if (!t) problems.push(`missing '${s.name}' [${s.shape.join(', ')}]`);
      else if (t.shape.join() !== s.shape.join() || t.dtype !== 'float32') problems.push(`'${s.name}' is ${t.dtype} [${t.shape.join(', ')}]; expected float32 [${s.shape.join(', ')}]`);
    }
    const known = new Set(specs.map((s) => s.name));
    for (const name of tensors.keys()) if (!known.has(name)) problems.push(`unexpected '${name}'`);
    if (problems.length > 0) throw new TrainerError('bad_weights', `base weights for ${policy.name}: ${problems.join('; ')}`);
    return new BaseWeights(policy, new Map(specs.map((s) => [s.name, tensors.get(s.name)!])));
  }

  get(name: string): tf.Tensor {
    const t = this.tensors.get(name);
    if (!t) throw new TrainerError('bad_weights', `the model has no parameter '${name}'`);
    return t;
  }

  /** The base alone as the weights a forward pass reads: nothing trainable, no adapters (serving a base as it is). */
  view(): PolicyWeights {
    return { get: (name) => this.get(name), trainable: () => false, lora: () => undefined, params: () => [] };
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
