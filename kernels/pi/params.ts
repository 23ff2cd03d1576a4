/**
 * The parameter table of the real pi0 / pi0.5: every tensor by the name LeRobot's runtime state
 * dict gives it (with the policy's `model.` prefix; vision tower names as transformers 5
 * spells them, without `vision_model.`), in PyTorch shapes (Linear weight [out, in], patch conv
 * [Wv, 3, p, p]) and in that state dict's order. The model transposes inside its matMuls, so a
 * checkpoint maps onto this table by names alone. The two LM heads of the LeRobot module are not
 * model parameters (π0 / π0.5 never decode text): a loader skips them, a writer adds them.
 * Axis legend: see kernels/pi/config.ts.
 */
import * as tf from '@tensorflow/tfjs';
import { tokensPerCamera, type RealPiConfig } from './config.ts';

/** One parameter: its state-dict name and PyTorch shape. */
export interface RealPiParamSpec {
  readonly name: string;
  readonly shape: readonly number[];
}

/** The model's parameters by name (tf.Variable when trained, any tensor when frozen). */
export type RealPiParams = Map<string, tf.Tensor>;

/** Name prefixes of the parts, as LeRobot's PI0Policy names them. */
export const NAMES = {
  vision: 'model.paligemma_with_expert.paligemma.model.vision_tower.',
  projector: 'model.paligemma_with_expert.paligemma.model.multi_modal_projector.linear.',
  vlm: 'model.paligemma_with_expert.paligemma.model.language_model.',
  expert: 'model.paligemma_with_expert.gemma_expert.model.',
  /** The token embedding [V, D], the only parameter read by gathering rows. */
  embedding: 'model.paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight',
} as const;

/** Every parameter of `c` in LeRobot's state-dict order, without the two unused LM heads. */
export function realPiParamSpecs(c: RealPiConfig): RealPiParamSpec[] {
  const out: RealPiParamSpec[] = [];
  const add = (name: string, shape: number[]) => out.push({ name, shape });
  const linear = (name: string, inDim: number, outDim: number, bias = true) => {
    add(`${name}.weight`, [outDim, inDim]);
    if (bias) add(`${name}.bias`, [outDim]);
  };
  const v = c.vision;
  const V = NAMES.vision;
  add(`${V}embeddings.patch_embedding.weight`, [v.width, 3, v.patchSize, v.patchSize]);
  add(`${V}embeddings.patch_embedding.bias`, [v.width]);
  add(`${V}embeddings.position_embedding.weight`, [tokensPerCamera(c), v.width]);
  for (let i = 0; i < v.depth; i++) {
    const l = `${V}encoder.layers.${i}.`;
    add(`${l}layer_norm1.weight`, [v.width]);
    add(`${l}layer_norm1.bias`, [v.width]);
    for (const p of ['k', 'v', 'q', 'out']) linear(`${l}self_attn.${p}_proj`, v.width, v.width);
    add(`${l}layer_norm2.weight`, [v.width]);
    add(`${l}layer_norm2.bias`, [v.width]);
    linear(`${l}mlp.fc1`, v.width, v.mlpDim);
    linear(`${l}mlp.fc2`, v.mlpDim, v.width);
  }
  add(`${V}post_layernorm.weight`, [v.width]);
  add(`${V}post_layernorm.bias`, [v.width]);
  linear(NAMES.projector.slice(0, -1), v.width, c.vlm.width);
  add(NAMES.embedding, [c.vlm.vocabSize, c.vlm.width]);
  const gemma = (prefix: string, d: RealPiConfig['expert'], ada: boolean) => {
    const q = d.numHeads * d.headDim;
    const kv = d.numKvHeads * d.headDim;
    const norm = (name: string) => (ada ? linear(`${name}.dense`, d.width, 3 * d.width) : add(`${name}.weight`, [d.width]));
    for (let i = 0; i < d.depth; i++) {
      const l = `${prefix}layers.${i}.`;
      linear(`${l}self_attn.q_proj`, d.width, q, false);
      linear(`${l}self_attn.k_proj`, d.width, kv, false);
      linear(`${l}self_attn.v_proj`, d.width, kv, false);
      linear(`${l}self_attn.o_proj`, q, d.width, false);
      linear(`${l}mlp.gate_proj`, d.width, d.mlpDim, false);
      linear(`${l}mlp.up_proj`, d.width, d.mlpDim, false);
      linear(`${l}mlp.down_proj`, d.mlpDim, d.width, false);
      norm(`${l}input_layernorm`);
      norm(`${l}post_attention_layernorm`);
    }
    norm(`${prefix}norm`);
  };
  gemma(NAMES.vlm, c.vlm, false);
  gemma(NAMES.expert, c.expert, c.variant === 'pi05');
  const E = c.expert.width;
  linear('model.action_in_proj', c.actionDim, E);
  linear('model.action_out_proj', E, c.actionDim);
  if (c.variant === 'pi0') {
    linear('model.state_proj', c.stateDim, E);
    linear('model.action_time_mlp_in', 2 * E, E);
    linear('model.action_time_mlp_out', E, E);
  } else {
    linear('model.time_mlp_in', E, E);
    linear('model.time_mlp_out', E, E);
  }
  return out;
}

/** The number of parameters used in a forward pass (REAL_PI0 3,238,048,528; REAL_PI05 3,353,433,872). */
export function realPiParamCount(c: RealPiConfig): number {
  return realPiParamSpecs(c).reduce((n, s) => n + s.shape.reduce((a, b) => a * b, 1), 0);
}

/**
 * The parity vectors' deterministic init rule (pi-common.md contract item 3): seed = FNV-1a
 * 32-bit of the UTF-8 bytes of `name`; u_i from a mulberry32 stream of that seed; value_i =
 * (2 u_i - 1) * 0.05 rounded to float32; row-major over the shape. Not a training init: a
 * reproducible set of weights that both the PyTorch reference and this model can build.
 */
export function contractInitValues(name: string, size: number): Float32Array {
  let h = 2166136261;
  for (const byte of new TextEncoder().encode(name)) h = Math.imul(h ^ byte, 16777619) >>> 0;
  let state = h >>> 0;
  const out = new Float32Array(size);
  for (let i = 0; i < size; i++) {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    const u = ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    out[i] = (2 * u - 1) * 0.05;
  }
  return out;
}

/**
 * contractInitValues as consecutive chunks of at most `chunk` values (the same values, in order),
 * so a tensor of any size is made in bounded memory. With `seed` the FNV-1a hash continues over
 * the UTF-8 bytes of `#<seed>` after the name's, giving another set of values of the same
 * distribution; without it the values are the parity contract's exactly.
 */
export function* contractInitChunks(name: string, size: number, opts: { seed?: number; chunk?: number } = {}): Generator<Float32Array> {
  let h = 2166136261;
  const bytes = new TextEncoder().encode(opts.seed === undefined ? name : `${name}#${opts.seed}`);
  for (const byte of bytes) h = Math.imul(h ^ byte, 16777619) >>> 0;
  let state = h >>> 0;
  const chunk = opts.chunk ?? 1 << 22;
  for (let start = 0; start < size; start += chunk) {
    const out = new Float32Array(Math.min(chunk, size - start));
    for (let i = 0; i < out.length; i++) {
      state = (state + 0x6d2b79f5) >>> 0;
      let t = state;
      t = Math.imul(t ^ (t >>> 15), t | 1);
      t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
      const u = ((t ^ (t >>> 14)) >>> 0) / 4294967296;
      out[i] = (2 * u - 1) * 0.05;
    }
    yield out;
  }
}

export type RealPiParamSource = 'contract-init' | ReadonlyMap<string, Float32Array | tf.Tensor>;

/**
 * Makes the parameters of `c`: from a name -> values map (exactly the table's names, each in its
 * PyTorch shape, e.g. read from a checkpoint by a loader), or by the contract's init rule.
 * `trainable` makes tf.Variables (for tf.variableGrads), otherwise plain tensors. The caller owns
 * the result (dispose with disposeRealPiParams).
 * @throws Error naming every missing, unexpected and misshapen tensor at once (expected shape given).
 */
export function createRealPiParams(c: RealPiConfig, source: RealPiParamSource, opts: { trainable?: boolean } = {}): RealPiParams {
  const specs = realPiParamSpecs(c);
  if (source !== 'contract-init') {
    const problems: string[] = [];
    const known = new Set(specs.map((s) => s.name));
    for (const s of specs) {
      const got = source.get(s.name);
      const n = s.shape.reduce((a, b) => a * b, 1);
      if (!got) problems.push(`missing ${s.name} [${s.shape.join(', ')}]`);
      else if (got instanceof tf.Tensor ? got.shape.join() !== s.shape.join() : got.length !== n) {
        const shape = got instanceof tf.Tensor ? `[${got.shape.join(', ')}]` : `${got.length} values`;
        problems.push(`${s.name} is ${shape}; expected [${s.shape.join(', ')}]`);
      }
    }
    for (const name of source.keys()) if (!known.has(name)) problems.push(`unexpected ${name}`);
    if (problems.length > 0) throw new Error(`real pi parameters: ${problems.join('; ')}`);
  }
  const out: RealPiParams = new Map();
  for (const s of specs) {
    const n = s.shape.reduce((a, b) => a * b, 1);
    const values = source === 'contract-init' ? contractInitValues(s.name, n) : source.get(s.name)!;
    const t = values instanceof tf.Tensor ? tf.reshape(values, s.shape as number[]) : tf.tensor(values, s.shape as number[], 'float32');
    // Unnamed: TF.js variable names are process-wide, and two models may coexist.
    out.set(s.name, opts.trainable ? tf.variable(t, true) : t);
    if (opts.trainable) t.dispose();
  }
  return out;
}

/** Frees every tensor of a parameter map. */
export function disposeRealPiParams(params: RealPiParams): void {
  for (const t of params.values()) t.dispose();
}
