/**
 * What a TrainingState trains on its shared base: a full copy of the parameters (less any the
 * caller freezes) or LoRA adapters (kernels/lora.ts's init and layout) on a model's linears,
 * and the PolicyWeights view through which the model reads base, copies and adapters.
 */
import * as tf from '@tensorflow/tfjs';
import { TrainerError, type BaseWeights } from './base-weights.ts';
import type { PolicyLinear, PolicyWeights } from './flow-policy.ts';
import type { LoraFactors } from './layers.ts';
import { LoraError, initialAdapters, validateLora } from './lora.ts';
import type { Rng } from './rng.ts';

/** LoRA settings: rank and alpha of the prefix (VLM) side, and of the action expert. */
export interface LoraShape {
  rank: number;
  alpha: number;
  /** Rank of the action expert's adapters (openpi: 32 where the VLM has 16); default `rank`. */
  actionRank: number;
  /** Alpha of the action expert's adapters; default `alpha`. */
  actionAlpha: number;
}

/** The rank and scale (alpha / rank) of the adapter on linear `s`. */
function rankOf(s: PolicyLinear, lora: LoraShape): { rank: number; scale: number } {
  return s.expert === 'action' ? { rank: lora.actionRank, scale: lora.actionAlpha / lora.actionRank } : { rank: lora.rank, scale: lora.alpha / lora.rank };
}

/**
 * Full fine-tune: a trainable copy of every base parameter but the `frozen` ones (which the
 * model then reads from the base). @throws TrainerError('bad_option') for a name the model lacks.
 */
export function fullCopies(base: BaseWeights<unknown, unknown>, frozen: readonly string[]): Map<string, tf.Variable> {
  for (const name of frozen) if (!base.tensors.has(name)) throw new TrainerError('bad_option', `frozen names '${name}'; the model has no such parameter`);
  const skip = new Set(frozen);
  const out = new Map<string, tf.Variable>();
  for (const [name, t] of base.tensors) if (!skip.has(name)) out.set(name, tf.variable(t, true));
  return out;
}

/**
 * LoRA: adapters on the linears `targets` select, drawn from `rng` in layer order (A uniform
 * ±1/sqrt(in), B zero). Returns the variables and each adapted linear's scale.
 * @throws LoraError for a bad rank, alpha or target, or when the model refuses the targets.
 */
export function loraAdapters(base: BaseWeights<unknown, unknown>, targets: readonly string[], lora: LoraShape, rng: Rng): { params: Map<string, tf.Variable>; scales: Map<string, number> } {
  validateLora(lora.rank, lora.alpha);
  validateLora(lora.actionRank, lora.actionAlpha);
  const specs = base.policy.loraLinears(targets);
  const refusal = base.policy.loraRefusal?.(targets, base.tensors) ?? null;
  if (refusal) throw new LoraError('bad_target', refusal);
  const params = new Map<string, tf.Variable>();
  const scales = new Map<string, number>();
  for (const s of specs) {
    const { rank, scale } = rankOf(s, lora);
    scales.set(s.name, scale);
    for (const [name, v] of initialAdapters([{ name: s.name, inDim: s.inDim, outDim: s.outDim, expert: 'other', kind: 'other' }], rank, rng)) {
      const t = tf.tensor(v.data, v.shape, 'float32');
      params.set(name, tf.variable(t, true));
      t.dispose(); // the variable holds its own reference to the data
    }
  }
  return { params, scales };
}

/**
 * The view a forward pass reads: `params` (trained copies or adapters) over the base. A
 * parameter not in `params` is the base's, frozen; LoRA factors come from `<linear>.lora_a/_b`.
 */
export function weightsView(base: BaseWeights<unknown, unknown>, params: ReadonlyMap<string, tf.Variable>, scales: ReadonlyMap<string, number>): PolicyWeights {
  const loras = new Map<string, LoraFactors>();
  for (const [layer, scale] of scales) loras.set(layer, { a: params.get(`${layer}.lora_a`)!, b: params.get(`${layer}.lora_b`)!, scale });
  return {
    get: (name) => params.get(name) ?? base.get(name),
    trainable: (name) => params.has(name),
    lora: (layer) => loras.get(layer),
    params: (prefix) => [...params].filter(([n]) => n.startsWith(prefix)).map(([, v]) => v),
  };
}
