/**
 * The real pi0 / pi0.5 (docs/MODEL.md "The real pi0 / pi0.5"; FACTS sections 1.1-1.12), top to
 * bottom as openpi's pi0.py reads: small blocks (linear, norms, GeGLU, attention, RoPE), the
 * SigLIP tower, the Gemma stack where the prefix (VLM) and suffix (action expert) streams meet
 * in one attention per layer, the prefix and suffix embeddings, the block mask and positions,
 * then the public methods: velocity, computeLoss, sample.
 *
 * Parameters are read by LeRobot's state-dict names in PyTorch layout (kernels/pi/params.ts):
 * Linear weights are [out, in] and every product is x · Wᵀ (the transpose is the matMul's flag,
 * never a stored copy). Everything runs in float32 (LeRobot's default dtype). Where openpi and
 * LeRobot differ (FACTS section 7), this follows LeRobot.
 *
 * Flow-matching convention (openpi's, opposite to the pi0 paper): t = 1 is pure noise, t = 0 is
 * data; x_t = t * noise + (1 - t) * actions and the model predicts u = noise - actions.
 * Axis legend: see kernels/pi/config.ts.
 */
import * as tf from '@tensorflow/tfjs';
import { ShapeError } from '../errors.ts';
import { drawNoiseTime, eulerSample } from '../flow.ts';
import { holdAtZero, type ChunkTensors } from '../rtc.ts';
import { checkpoint, checkpointBlock, checkpointSetting, geluTanh, rmsNorm, rmsNormalize, swish, untaped, type LoraFactors } from '../layers.ts';
import type { Rng } from '../rng.ts';
import { tokensPerCamera, type GemmaDims, type RealPiConfig } from './config.ts';
import { NAMES } from './params.ts';

/**
 * What the model reads its weights through: a RealPiParams map serves, and so does the trainer's
 * view (kernels/trainer.ts), which adds LoRA: a linear `name` with factors gets
 * y += scale · (x · a) · b, a [in, r], b [r, out] (the adapter's own layout, not PyTorch's).
 */
export interface RealPiWeights {
  get(name: string): tf.Tensor | undefined;
  lora?(linear: string): LoraFactors | undefined;
  /**
   * The trained variables whose names start with `prefix` (the trainer's view; LoRA's factors are
   * `<linear>.lora_a` / `.lora_b`). With it a training pass rematerialises every block gradients
   * pass through and keeps nothing of the parts no trained parameter precedes (rematWanted);
   * without it (a plain parameter map) every op is taped, as TF.js does by default.
   */
  params?(prefix: string): tf.Variable[];
}

/**
 * Whether a pass over weights `P` rematerialises its blocks (docs/MODEL.md "Training"): a
 * training pass (a tape records) through the trainer's view (P.params), with `VELA_CHECKPOINT`
 * not `off` (default on for the real models).
 */
export function rematWanted(P: RealPiWeights): boolean {
  // Only while a tape records: a forward without gradients has nothing to keep.
  return P.params !== undefined && checkpointSetting() !== 'off' && tf.engine().isTapeOn();
}

/** Whether nothing under `prefixes` is trained in `P` (known only for the trainer's view). */
function frozenUnder(P: RealPiWeights, ...prefixes: string[]): boolean {
  return P.params !== undefined && prefixes.every((p) => P.params!(p).length === 0);
}

/** A config and its parameters: what every method reads. */
export interface RealPiModel {
  readonly config: RealPiConfig;
  readonly params: RealPiWeights;
}

/**
 * One batch as the model takes it (LeRobot's layout, after its pre-processing: images resized
 * and scaled, prompt tokenized, state and actions normalised and zero-padded). Row-major arrays.
 */
export interface RealPiBatch {
  readonly size: number; // b
  readonly numCameras: number; // nc (3 in the real models: base, left wrist, right wrist)
  readonly images: Float32Array; // [b, nc, 3, S, S], channels first, values in [-1, 1]
  readonly imageMasks: ArrayLike<number>; // [b, nc], 1 = present; a masked camera's tokens are invisible
  readonly tokens: Int32Array; // [b, L], L <= maxTokenLen; ids < vocabSize
  readonly tokenMasks: ArrayLike<number>; // [b, L], 1 = real token, 0 = padding
  readonly state?: Float32Array; // [b, sd], pi0 only (pi0.5 carries its state in the prompt)
  readonly actions?: Float32Array; // [b, ah, ad], for computeLoss
  /** Leading action dims that are real (LeRobot averages the loss over these only); default ad. */
  readonly lossActionDims?: number;
  /** Datum weights [b] >= 0 for the trainer's weighted loss (kernels/trainer.ts); default 1 each. */
  readonly weight?: Float32Array;
  /**
   * [b, ah, ad], 1 = the entry counts in its datum's mean loss (the shared trainer's loss only;
   * a client's chunk may be shorter than ah or narrower than ad). Wins over lossActionDims there.
   */
  readonly actionMask?: Float32Array;
}

/** The finite "big negative" added to masked attention logits (openpi / LeRobot's value). */
export const MASKED_LOGIT = -2.3819763e38;
const LN_EPS = 1e-6; // SigLIP LayerNorm
const ROPE_BASE = 10000;
const MIN_PERIOD = 4e-3; // time embedding
const MAX_PERIOD = 4.0;

// ---------------------------------------------------------------- small blocks

function param(P: RealPiWeights, name: string): tf.Tensor {
  const t = P.get(name);
  if (!t) throw new Error(`real pi model: parameter ${name} is missing`);
  return t;
}

/** y = x · Wᵀ (+ b) for a PyTorch Linear `name` (weight [out, in]). x [..., in] -> [..., out]. */
function linear(P: RealPiWeights, name: string, x: tf.Tensor, bias = true): tf.Tensor {
  const w = param(P, `${name}.weight`);
  const [outDim, inDim] = w.shape as [number, number];
  const lead = x.shape.slice(0, -1);
  const x2 = tf.reshape(x, [-1, inDim]); // [n, in]
  let y = tf.matMul(x2, w, false, true); // [n, out]
  if (bias) y = tf.add(y, param(P, `${name}.bias`));
  const lora = P.lora?.(name);
  if (lora) y = tf.add(y, tf.mul(tf.matMul(tf.matMul(x2, lora.a), lora.b), lora.scale)); // LoRA, [n, out]
  return tf.reshape(y, [...lead, outDim]);
}

/** LayerNorm with scale and bias over the last axis, eps 1e-6 (SigLIP). */
function layerNorm(P: RealPiWeights, name: string, x: tf.Tensor): tf.Tensor {
  const { mean, variance } = tf.moments(x, -1, true);
  const y = tf.mul(tf.sub(x, mean), tf.rsqrt(tf.add(variance, LN_EPS)));
  return tf.add(tf.mul(y, param(P, `${name}.weight`)), param(P, `${name}.bias`));
}

/**
 * A Gemma norm `name`. Plain: x * rsqrt(mean(x^2) + 1e-6) * (1 + w), w stored as the offset
 * (initialised to 0). Adaptive (pi0.5 expert, `cond` [b, E], or [b, n, E] per token): Linear(E, 3E) of cond split as
 * scale, shift, gate; y = rms(x) * (1 + scale) + shift and the gate multiplies the sub-layer
 * output in the residual (the gate itself, not 1 + gate). x [b, n, w].
 */
function gemmaNorm(P: RealPiWeights, name: string, x: tf.Tensor, cond: tf.Tensor | null): { y: tf.Tensor; gate: tf.Tensor | null } {
  if (!cond) return { y: rmsNorm(x, tf.add(param(P, `${name}.weight`), 1)), gate: null };
  const mod = linear(P, `${name}.dense`, cond);
  const [scale, shift, gate] = tf.split(cond.rank === 2 ? tf.expandDims(mod, 1) : mod, 3, 2) as [tf.Tensor, tf.Tensor, tf.Tensor]; // [b, 1 or s, w] each
  return { y: tf.add(tf.mul(rmsNormalize(x), tf.add(scale, 1)), shift), gate };
}

/** GeGLU, no biases: down(gelu_tanh(gate(x)) * up(x)). x [b, n, w] -> [b, n, w]. */
function geglu(P: RealPiWeights, layer: string, x: tf.Tensor): tf.Tensor {
  const h = tf.mul(geluTanh(linear(P, `${layer}mlp.gate_proj`, x, false)), linear(P, `${layer}mlp.up_proj`, x, false)); // [b, n, F]
  return linear(P, `${layer}mlp.down_proj`, h, false);
}

/**
 * softmax(q kᵀ * hd^-0.5 + bias) v with G key/value heads shared by H query heads (query head
 * j uses kv head floor(j / (H / G)); G = 1 is multi-query attention). The H / G query heads of
 * a group are folded into the rows of one rank-3 matMul, so K and V are never repeated.
 * q [b, n, H*hd], k and v [b, k, G*hd], bias [b, 1, n, k] (0 or MASKED_LOGIT) or null
 * -> [b, n, H*hd].
 */
function attention(q: tf.Tensor, k: tf.Tensor, v: tf.Tensor, bias: tf.Tensor | null, H: number, G: number, hd: number): tf.Tensor {
  const [b, n] = q.shape as [number, number, number];
  const nk = k.shape[1]!;
  const rep = H / G;
  const heads = (x: tf.Tensor, t: number, h: number) => tf.transpose(tf.reshape(x, [b, t, h, hd]), [0, 2, 1, 3]); // [b, h, t, hd]
  const qg = tf.reshape(heads(q, n, H), [b * G, rep * n, hd]);
  const kg = tf.reshape(heads(k, nk, G), [b * G, nk, hd]);
  const vg = tf.reshape(heads(v, nk, G), [b * G, nk, hd]);
  let logits = tf.reshape(tf.mul(tf.matMul(qg, kg, false, true), hd ** -0.5), [b, H, n, nk]);
  if (bias) logits = tf.add(logits, bias);
  const probs = tf.reshape(tf.softmax(logits), [b * G, rep * n, nk]);
  const out = tf.reshape(tf.matMul(probs, vg), [b, H, n, hd]);
  return tf.reshape(tf.transpose(out, [0, 2, 1, 3]), [b, n, H * hd]);
}

/**
 * RoPE tables for integer positions [b * n]: angle_j = pos / 10000^(2j / hd), j < hd / 2,
 * computed in float64 and only cos / sin rounded to float32. (transformers' Gemma rounds the
 * angle itself to float32 first, an error of up to ~1e-5 rad at position 250 and ~1e-4 at 2,000
 * that no checkpoint depends on.) Returns cos and sin [b, n, 1, hd / 2].
 */
export function ropeTables(positions: Int32Array, b: number, n: number, hd: number): { cos: tf.Tensor; sin: tf.Tensor } {
  const { cos, sin } = ropeArrays(positions, b, n, hd);
  return { cos: tf.tensor4d(cos, [b, n, 1, hd / 2]), sin: tf.tensor4d(sin, [b, n, 1, hd / 2]) };
}

/** The values of ropeTables, [b * n * hd / 2] each. */
function ropeArrays(positions: Int32Array, b: number, n: number, hd: number): { cos: Float32Array; sin: Float32Array } {
  const half = hd / 2;
  const invFreq = new Float64Array(half);
  for (let j = 0; j < half; j++) invFreq[j] = Math.pow(ROPE_BASE, (-2 * j) / hd);
  const cos = new Float32Array(b * n * half);
  const sin = new Float32Array(b * n * half);
  for (let i = 0; i < b * n; i++) {
    for (let j = 0; j < half; j++) {
      const angle = positions[i]! * invFreq[j]!;
      cos[i * half + j] = Math.cos(angle);
      sin[i * half + j] = Math.sin(angle);
    }
  }
  return { cos, sin };
}

/** RoPE, half-split: (x_j, x_{j + hd/2}) of every head rotate by angle_j: x [b, n, h*hd], cos/sin [b, n, 1, hd/2]. */
export function applyRope(x: tf.Tensor, cos: tf.Tensor, sin: tf.Tensor, heads: number, hd: number): tf.Tensor {
  const [b, n] = x.shape as [number, number, number];
  const [x1, x2] = tf.split(tf.reshape(x, [b, n, heads, hd]), 2, 3) as [tf.Tensor, tf.Tensor]; // [b, n, h, hd/2]
  const r1 = tf.sub(tf.mul(x1, cos), tf.mul(x2, sin));
  const r2 = tf.add(tf.mul(x2, cos), tf.mul(x1, sin));
  return tf.reshape(tf.concat([r1, r2], 3), [b, n, heads * hd]);
}

/**
 * table[ids] -> [n, w], the token embedding lookup (only ever gathered: FACTS 9). The wasm
 * backend has no kernel for gather's gradient (UnsortedSegmentSum), so there the gradient is a
 * scatter-add of dy's rows in JS into a [V, w] array (a one-hot product would need V x n floats).
 */
function gatherRows(table: tf.Tensor, ids: Int32Array): tf.Tensor {
  const idsT = tf.tensor1d(ids, 'int32');
  if (tf.getBackend() !== 'wasm') return tf.gather(table, idsT);
  const [V, w] = table.shape as [number, number];
  const f = tf.customGrad(((t: tf.Tensor, save: tf.GradSaveFunc) => {
    save([]);
    return {
      value: tf.gather(t, idsT),
      gradFunc: (dy: tf.Tensor) => {
        const d = dy.dataSync();
        const g = new Float32Array(V * w);
        for (let j = 0; j < ids.length; j++) for (let k = 0; k < w; k++) g[ids[j]! * w + k] += d[j * w + k]!;
        return [tf.tensor2d(g, [V, w])];
      },
    };
  }) as unknown as Parameters<typeof tf.customGrad>[0]) as unknown as (t: tf.Tensor) => tf.Tensor;
  return f(table);
}

// ---------------------------------------------------------------- SigLIP vision tower

/**
 * Patches of a stride-p, valid-padding convolution, flattened in the PyTorch kernel's order
 * (channel, row, column) so that patches · reshape(W, [Wv, 3 p p])ᵀ is the conv. Written as
 * reshapes and rank-4 transposes, which every backend differentiates (the conv's filter
 * gradient is not on every backend). images [m, 3, S, S] -> [m * T, 3 p p], T row-major.
 */
function patchify(images: tf.Tensor, p: number): tf.Tensor {
  const [m, ch, S] = images.shape as [number, number, number, number];
  const g = S / p;
  const rows = tf.transpose(tf.reshape(images, [m * ch * g, p, g, p]), [0, 2, 1, 3]); // [(m, c, gy), gx, py, px]
  const perCam = tf.transpose(tf.reshape(rows, [m, ch, g * g, p * p]), [0, 2, 1, 3]); // [m, T, c, p*p]
  return tf.reshape(perCam, [m * g * g, ch * p * p]);
}

/**
 * SigLIP So400m-style tower (FACTS 1.2): conv patch embedding with bias, learned position
 * embedding, pre-LayerNorm blocks (MHA with biases, gelu-tanh MLP), final LayerNorm, no pooling.
 * images [m, 3, S, S] in [-1, 1] -> [m, T, Wv].
 */
export function siglip(model: RealPiModel, images: tf.Tensor): tf.Tensor {
  const { config: c, params: P } = model;
  const v = c.vision;
  const m = images.shape[0]!;
  const T = tokensPerCamera(c);
  const V = NAMES.vision;
  const kernel = tf.reshape(param(P, `${V}embeddings.patch_embedding.weight`), [v.width, 3 * v.patchSize * v.patchSize]);
  let x = tf.add(tf.matMul(patchify(images, v.patchSize), kernel, false, true), param(P, `${V}embeddings.patch_embedding.bias`)); // [m*T, Wv]
  x = tf.add(tf.reshape(x, [m, T, v.width]), param(P, `${V}embeddings.position_embedding.weight`)); // [m, T, Wv]
  const hd = v.width / v.numHeads;
  const remat = rematWanted(P);
  for (let i = 0; i < v.depth; i++) {
    const l = `${V}encoder.layers.${i}.`;
    const block = (xin: tf.Tensor): tf.Tensor => {
      const h = layerNorm(P, `${l}layer_norm1`, xin);
      const q = linear(P, `${l}self_attn.q_proj`, h);
      const k = linear(P, `${l}self_attn.k_proj`, h);
      const vv = linear(P, `${l}self_attn.v_proj`, h);
      const y = tf.add(xin, linear(P, `${l}self_attn.out_proj`, attention(q, k, vv, null, v.numHeads, v.numHeads, hd)));
      return tf.add(y, linear(P, `${l}mlp.fc2`, geluTanh(linear(P, `${l}mlp.fc1`, layerNorm(P, `${l}layer_norm2`, y)))));
    };
    // One tidy per block, as in gemmaStack: its temporaries go when it ends. A trained tower
    // (full fine-tune) is rematerialised block by block (a frozen one is never taped: embedPrefix).
    const next = tf.tidy(() => (remat ? checkpoint((xin) => block(xin), x, [], P.params!(l)) : block(x)));
    x.dispose();
    x = next;
  }
  return layerNorm(P, `${V}post_layernorm`, x);
}

// ---------------------------------------------------------------- the joint Gemma stack

/** One stream's input to a pass of the stack. */
interface Stream {
  x: tf.Tensor; // [b, n_i, width]
  names: string; // parameter prefix, NAMES.vlm or NAMES.expert
  dims: GemmaDims;
  cond: tf.Tensor | null; // pi0.5 expert: the adaRMS conditioning [b, E]
  cos: tf.Tensor; // RoPE tables of its tokens [b, n_i, 1, hd/2]
  sin: tf.Tensor;
  bias: tf.Tensor; // its query rows of the mask [b, 1, n_i, k] over [cached keys; this pass's keys]
  output: boolean; // whether its final-normed output is wanted
  /** Whether x depends on a trained parameter (its gradient is wanted; default true). */
  grad?: boolean;
}

/** Per layer, post-RoPE keys and values of the prefix, [b, p, G*hd] each. */
export interface KvCache {
  k: tf.Tensor[];
  v: tf.Tensor[];
}

/**
 * Runs the Gemma layers over the streams present (FACTS 1.6): per layer, each stream normalises
 * and projects its tokens with its own weights, then ONE attention runs over the concatenated
 * sequence [cache; stream 0; stream 1] with the joint mask, its rows are split back, and each
 * stream applies its own output projection, norm and GeGLU (pi0.5 expert: adaRMS norms and gated
 * residuals). `cache` prepends earlier keys/values (the prefix's, during denoising); `fill`
 * collects this pass's keys/values per layer. A stream whose output is not wanted skips its
 * last layer's queries and everything after (only its keys/values are used there).
 * Returns each wanted stream's final-normed output [b, n_i, width] (null for the others).
 */
function gemmaStack(P: RealPiWeights, streams: Stream[], depth: number, cache: KvCache | null, fill: KvCache | null): (tf.Tensor | null)[] {
  const { numHeads: H, numKvHeads: G, headDim: hd } = streams[0]!.dims;
  // A training pass (the trainer's view, no cache) rematerialises every layer: the tape keeps
  // its inputs only, and the backward pass re-runs it (kernels/layers.ts checkpointBlock).
  const remat = !cache && !fill && rematWanted(P);
  // Whether each stream's input depends on a trained parameter (then its gradient is wanted).
  const wanted = streams.map((s) => s.grad ?? true);
  let xs = streams.map((s) => s.x);
  for (let l = 0; l < depth; l++) {
    const last = l === depth - 1;
    const active = streams.flatMap((s, i) => (last && !s.output ? [] : [i])); // streams whose queries run
    // One layer over inputs xin and conditionings conds (per stream): the next residuals, and
    // this pass's keys and values.
    const layerOf = (xin: tf.Tensor[], conds: (tf.Tensor | null)[], cos: tf.Tensor[], sin: tf.Tensor[], biases: tf.Tensor[]) => {
      const ks: tf.Tensor[] = [];
      const vs: tf.Tensor[] = [];
      const qs: tf.Tensor[] = [];
      const gates: (tf.Tensor | null)[] = [];
      streams.forEach((s, i) => {
        const layer = `${s.names}layers.${l}.`;
        const { y, gate } = gemmaNorm(P, `${layer}input_layernorm`, xin[i]!, conds[i] ?? null);
        ks.push(applyRope(linear(P, `${layer}self_attn.k_proj`, y, false), cos[i]!, sin[i]!, G, hd)); // [b, n_i, G*hd]
        vs.push(linear(P, `${layer}self_attn.v_proj`, y, false));
        if (!active.includes(i)) return;
        qs.push(applyRope(linear(P, `${layer}self_attn.q_proj`, y, false), cos[i]!, sin[i]!, H, hd)); // [b, n_i, H*hd]
        gates.push(gate);
      });
      const kNew = ks.length === 1 ? ks[0]! : tf.concat(ks, 1); // [b, k, G*hd]
      const vNew = vs.length === 1 ? vs[0]! : tf.concat(vs, 1);
      const next = xin.slice();
      if (active.length > 0) {
        const k = cache ? tf.concat([cache.k[l]!, kNew], 1) : kNew;
        const v = cache ? tf.concat([cache.v[l]!, vNew], 1) : vNew;
        const q = qs.length === 1 ? qs[0]! : tf.concat(qs, 1); // [b, n, H*hd]
        const bias = active.length === 1 ? biases[active[0]!]! : tf.concat(active.map((i) => biases[i]!), 2);
        const att = attention(q, k, v, bias, H, G, hd); // [b, n, H*hd]
        let row0 = 0;
        active.forEach((i, j) => {
          const s = streams[i]!;
          const layer = `${s.names}layers.${l}.`;
          const [b, n] = xin[i]!.shape as [number, number, number];
          const rows = active.length === 1 ? att : tf.slice(att, [0, row0, 0], [b, n, -1]); // [b, n_i, H*hd]
          row0 += n;
          const o = linear(P, `${layer}self_attn.o_proj`, rows, false); // [b, n_i, width]
          const x = tf.add(xin[i]!, gates[j] ? tf.mul(o, gates[j]!) : o);
          const { y, gate } = gemmaNorm(P, `${layer}post_attention_layernorm`, x, conds[i] ?? null);
          const m = geglu(P, layer, y);
          next[i] = tf.add(x, gate ? tf.mul(m, gate) : m);
        });
      }
      return { next, kNew, vNew };
    };
    // One tidy per layer keeps a layer's temporaries from piling up over the stack (the prefix's
    // GeGLU alone is [b, p, F] x 4 per layer); a taped gradient keeps what it needs by itself.
    const out = tf.tidy(() => {
      if (!remat) {
        const r = layerOf(xs, streams.map((s) => s.cond), streams.map((s) => s.cos), streams.map((s) => s.sin), streams.map((s) => s.bias));
        return { next: r.next, kv: fill ? [r.kNew, r.vNew] : [] };
      }
      // Differentiable inputs: the residuals whose gradient is wanted and the conditionings; the
      // other residuals, the RoPE tables and the mask rows are constants (kernels/layers.ts).
      const S = streams.length;
      const inX = streams.flatMap((_, i) => (wanted[i] ? [i] : []));
      const constX = streams.flatMap((_, i) => (wanted[i] ? [] : [i]));
      const inCond = streams.flatMap((s, i) => (s.cond ? [i] : []));
      const inputs = [...inX.map((i) => xs[i]!), ...inCond.map((i) => streams[i]!.cond!)];
      const consts = [...constX.map((i) => xs[i]!), ...streams.flatMap((s) => [s.cos, s.sin, s.bias])];
      // The trained variables the layer reads: a stream whose queries do not run (the prefix in
      // the last layer) reads only its input norm and K / V projections.
      const params = streams.flatMap((s, i) => {
        const layer = `${s.names}layers.${l}.`;
        return active.includes(i) ? P.params!(layer) : ['input_layernorm', 'self_attn.k_proj', 'self_attn.v_proj'].flatMap((m) => P.params!(layer + m));
      });
      const ys = checkpointBlock((ins, cs) => {
        const xin = new Array<tf.Tensor>(S);
        const conds = new Array<tf.Tensor | null>(S).fill(null);
        inX.forEach((i, j) => (xin[i] = ins[j]!));
        inCond.forEach((i, j) => (conds[i] = ins[inX.length + j]!));
        constX.forEach((i, j) => (xin[i] = cs[j]!));
        const tables = cs.slice(constX.length);
        const at = (k: number) => streams.map((_, i) => tables[3 * i + k]!);
        const r = layerOf(xin, conds, at(0), at(1), at(2));
        return active.map((i) => r.next[i]!);
      }, inputs, consts, params);
      const next = xs.slice();
      active.forEach((i, j) => (next[i] = ys[j]!));
      return { next, kv: [] as tf.Tensor[] };
    });
    if (remat) streams.forEach((s, i) => (wanted[i] ||= P.params!(`${s.names}layers.${l}.`).length > 0));
    if (fill) {
      fill.k.push(out.kv[0]!);
      fill.v.push(out.kv[1]!);
    }
    // The previous layer's outputs are no longer read (the stream inputs belong to the caller).
    xs.forEach((x, i) => x !== out.next[i] && x !== streams[i]!.x && x.dispose());
    xs = out.next;
    if (active.length === 0) break;
  }
  // The final norm's adaRMS gate (pi0.5) is discarded.
  return streams.map((s, i) => (s.output ? gemmaNorm(P, `${s.names}norm`, xs[i]!, s.cond).y : null));
}

// ---------------------------------------------------------------- embeddings, mask, positions

/**
 * The prefix (FACTS 1.1): per camera in order, its T SigLIP tokens projected to width D (not
 * scaled), then the prompt's token embeddings times sqrt(D) (rounded to float32, as Gemma's
 * scaled embedding). Returns embs [b, p, D] and validity [b * p] (0 for a masked camera's tokens
 * and for prompt padding). Every prefix token has autoregressive flag 0.
 */
export function embedPrefix(model: RealPiModel, batch: RealPiBatch): { embs: tf.Tensor; valid: Uint8Array; siglipOut: tf.Tensor; constant: boolean } {
  const { config: c, params: P } = model;
  const { size: b, numCameras: nc } = batch;
  const S = c.vision.imageSize;
  const T = tokensPerCamera(c);
  const D = c.vlm.width;
  const L = batch.tokens.length / b;
  // No activation kept for frozen parts (docs/MODEL.md "Training"): with the tower, projector and
  // embedding all frozen (LoRA's default) the prefix embedding is a constant of the training
  // pass, computed untaped; a frozen tower before a trained projector, the tower alone.
  const constant = frozenUnder(P, NAMES.vision, NAMES.projector, NAMES.embedding);
  const embed = () => {
    const images = tf.tensor4d(batch.images, [b * nc, 3, S, S]);
    const siglipOut = frozenUnder(P, NAMES.vision) ? untaped(() => siglip(model, images)) : siglip(model, images); // [b*nc, T, Wv]
    const img = tf.reshape(linear(P, NAMES.projector.slice(0, -1), siglipOut), [b, nc * T, D]);
    const rows = gatherRows(param(P, NAMES.embedding), batch.tokens); // [b*L, D]
    const text = tf.mul(tf.reshape(rows, [b, L, D]), Math.fround(Math.sqrt(D))); // [b, L, D]
    return { embs: tf.concat([img, text], 1), siglipOut: tf.reshape(siglipOut, [b, nc, T, c.vision.width]) };
  };
  return { ...(constant ? untaped(embed) : embed()), valid: prefixValid(c, batch), constant };
}

/** The prefix tokens' validity [b * p] (0 for a masked camera's tokens and for prompt padding). */
function prefixValid(c: RealPiConfig, batch: RealPiBatch): Uint8Array {
  const { size: b, numCameras: nc } = batch;
  const T = tokensPerCamera(c);
  const L = batch.tokens.length / b;
  const p = nc * T + L;
  const valid = new Uint8Array(b * p);
  for (let i = 0; i < b; i++) {
    for (let cam = 0; cam < nc; cam++) valid.fill(batch.imageMasks[i * nc + cam] ? 1 : 0, i * p + cam * T, i * p + (cam + 1) * T);
    for (let j = 0; j < L; j++) valid[i * p + nc * T + j] = batch.tokenMasks[i * L + j] ? 1 : 0;
  }
  return valid;
}

/**
 * The sin/cos time embedding (FACTS 1.11) [b, width]: for i < width/2, period_i = 4e-3 *
 * (4 / 4e-3)^(i / (width/2 - 1)), angle = 2 pi t / period_i; sines first, then cosines. Computed in
 * float64 and rounded to float32, as LeRobot does.
 */
export function timeEmbedding(time: Float32Array, width: number): Float32Array {
  const half = width / 2;
  const out = new Float32Array(time.length * width);
  for (let i = 0; i < time.length; i++) {
    for (let j = 0; j < half; j++) {
      const period = MIN_PERIOD * Math.pow(MAX_PERIOD / MIN_PERIOD, half === 1 ? 0 : j / (half - 1));
      const angle = ((1 / period) * 2 * Math.PI) * time[i]!;
      out[i * width + j] = Math.sin(angle);
      out[i * width + half + j] = Math.cos(angle);
    }
  }
  return out;
}

/**
 * The suffix (FACTS 1.8 / 1.9) for noisy actions xT [b, ah, ad] at times [b] (or [b * ah], a
 * time per action: training-time RTC, kernels/rtc.ts). `held` [b, ah, 1] (1 or 0): the actions
 * at flow time 0 instead (RTC's prefix mode at sampling: a tensor, so one traced graph serves
 * every delay).
 * pi0: [state_proj(state); action_time_mlp_out(swish(action_time_mlp_in([action_in_proj(x_t);
 * e(t)])))], flags [1, 1, 0, ...]. pi0.5: action_in_proj(x_t), flags [1, 0, ...], and the
 * conditioning cond = swish(time_mlp_out(swish(time_mlp_in(e(t))))) [b, E] for every expert norm.
 * All suffix tokens are valid. Returns embs [b, s, E], cond (pi0.5) and the flags [s].
 */
export function embedSuffix(model: RealPiModel, state: Float32Array | undefined, xT: tf.Tensor, time: Float32Array, held?: tf.Tensor): { embs: tf.Tensor; cond: tf.Tensor | null; ar: Uint8Array } {
  const { config: c, params: P } = model;
  const [b, ah] = xT.shape as [number, number, number];
  const E = c.expert.width;
  // One time per datum [b, E], or per action [b, ah, E] (RTC's prefix at time 0: kernels/rtc.ts).
  const perAction = time.length === b * ah;
  const temb = perAction ? tf.tensor3d(timeEmbedding(time, E), [b, ah, E]) : tf.tensor2d(timeEmbedding(time, E), [b, E]);
  const act = linear(P, 'model.action_in_proj', xT); // [b, ah, E]
  if (c.variant === 'pi0') {
    if (!state) throw new ShapeError('shape_mismatch', 'pi0 needs batch.state [b, stateDim]; it is missing');
    const tt = holdAtZero(perAction ? temb : tf.tile(tf.expandDims(temb, 1), [1, ah, 1]), held, () => tf.tensor2d(timeEmbedding(new Float32Array(b), E), [b, E])); // [b, ah, E]
    const h = linear(P, 'model.action_time_mlp_out', swish(linear(P, 'model.action_time_mlp_in', tf.concat([act, tt], 2))));
    const st = tf.expandDims(linear(P, 'model.state_proj', tf.tensor2d(state, [b, c.stateDim])), 1); // [b, 1, E]
    const ar = new Uint8Array(1 + ah);
    ar[0] = 1;
    ar[1] = 1;
    return { embs: tf.concat([st, h], 1), cond: null, ar };
  }
  const mlp = (e: tf.Tensor) => swish(linear(P, 'model.time_mlp_out', swish(linear(P, 'model.time_mlp_in', e))));
  let cond = mlp(temb); // [b, E] or [b, ah, E]
  if (held) cond = holdAtZero(perAction ? cond : tf.tile(tf.expandDims(cond, 1), [1, ah, 1]), held, () => mlp(tf.tensor2d(timeEmbedding(new Float32Array(b), E), [b, E])));
  const ar = new Uint8Array(ah);
  ar[0] = 1;
  return { embs: act, cond, ar };
}

/**
 * The prefix-LM block mask and the positions over a whole sequence of N tokens (FACTS 1.7):
 * with c_j the running sum of the autoregressive flags, query i sees key j iff c_j <= c_i and both
 * are valid (so an invalid query sees nothing); position_i = (valid tokens among 0..i) - 1, so
 * padding and masked cameras do not advance it. valid [b * N], ar [N] -> mask [b * N * N] (1 =
 * attend), positions [b * N].
 */
export function attentionLayout(valid: Uint8Array, ar: Uint8Array, b: number): { mask: Uint8Array; positions: Int32Array } {
  const N = ar.length;
  const cum = new Int32Array(N);
  for (let j = 0, s = 0; j < N; j++) cum[j] = s += ar[j]!;
  const mask = new Uint8Array(b * N * N);
  const positions = new Int32Array(b * N);
  for (let i = 0; i < b; i++) {
    let count = 0;
    for (let q = 0; q < N; q++) {
      count += valid[i * N + q]!;
      positions[i * N + q] = count - 1;
      if (!valid[i * N + q]) continue;
      for (let k = 0; k < N; k++) mask[(i * N + q) * N + k] = valid[i * N + k]! && cum[k]! <= cum[q]! ? 1 : 0;
    }
  }
  return { mask, positions };
}

/** Rows [r0, r1) and columns [0, cols) of the mask as an additive bias [b, 1, r1 - r0, cols]. */
function maskBias(mask: Uint8Array, b: number, N: number, r0: number, r1: number, cols: number): tf.Tensor {
  return tf.tensor4d(maskBiasArray(mask, b, N, r0, r1, cols), [b, 1, r1 - r0, cols]);
}

/** The values of maskBias, [b * (r1 - r0) * cols]. */
function maskBiasArray(mask: Uint8Array, b: number, N: number, r0: number, r1: number, cols: number): Float32Array {
  const out = new Float32Array(b * (r1 - r0) * cols);
  let o = 0;
  for (let i = 0; i < b; i++) {
    for (let q = r0; q < r1; q++) for (let k = 0; k < cols; k++) out[o++] = mask[(i * N + q) * N + k] ? 0 : MASKED_LOGIT;
  }
  return out;
}

/** Positions [r0, r1) of every datum: [b * (r1 - r0)]. */
function positionRows(positions: Int32Array, b: number, N: number, r0: number, r1: number): Int32Array {
  const out = new Int32Array(b * (r1 - r0));
  for (let i = 0; i < b; i++) out.set(positions.subarray(i * N + r0, i * N + r1), i * (r1 - r0));
  return out;
}

/**
 * The whole sequence's layout for a batch whose prefix has `p` tokens with validity `prefixValid`
 * [b * p]: N = p + s tokens (s = 1 + ah for pi0, ah for pi0.5), all suffix tokens valid, flags 1 on
 * pi0's state token and on the first action token. Returns the mask [b * N * N] and positions
 * [b * N] of attentionLayout.
 */
export function sequenceLayout(c: RealPiConfig, prefixValid: Uint8Array, b: number): { mask: Uint8Array; positions: Int32Array; p: number; s: number; N: number } {
  const p = prefixValid.length / b;
  const s = c.variant === 'pi0' ? 1 + c.actionHorizon : c.actionHorizon;
  const N = p + s;
  const valid = new Uint8Array(b * N);
  for (let i = 0; i < b; i++) {
    valid.set(prefixValid.subarray(i * p, (i + 1) * p), i * N);
    valid.fill(1, i * N + p, (i + 1) * N);
  }
  const ar = new Uint8Array(N);
  ar[p] = 1;
  if (c.variant === 'pi0') ar[p + 1] = 1;
  return { ...attentionLayout(valid, ar, b), p, s, N };
}

/**
 * Checks a batch against the config. @throws ShapeError('shape_mismatch' / 'bad_value' /
 * 'empty_batch') naming the field, its size and the expected one.
 */
export function checkBatch(c: RealPiConfig, batch: RealPiBatch, needActions = false): void {
  const { size: b, numCameras: nc } = batch;
  if (!Number.isInteger(b) || b < 1) throw new ShapeError('empty_batch', `batch size is ${b}; it must be an integer >= 1`);
  if (!Number.isInteger(nc) || nc < 1) throw new ShapeError('bad_value', `numCameras is ${nc}; it must be an integer >= 1`);
  const S = c.vision.imageSize;
  const expect = (field: string, got: number, want: number, shape: string) => {
    if (got !== want) throw new ShapeError('shape_mismatch', `${field} has ${got} values; expected ${want} (${shape})`);
  };
  expect('images', batch.images.length, b * nc * 3 * S * S, `[${b}, ${nc}, 3, ${S}, ${S}]`);
  expect('imageMasks', batch.imageMasks.length, b * nc, `[${b}, ${nc}]`);
  const L = batch.tokens.length / b;
  if (!Number.isInteger(L) || L < 1 || L > c.maxTokenLen) {
    throw new ShapeError('shape_mismatch', `tokens has ${batch.tokens.length} values for batch ${b}; expected [${b}, L] with 1 <= L <= maxTokenLen ${c.maxTokenLen}`);
  }
  expect('tokenMasks', batch.tokenMasks.length, b * L, `[${b}, ${L}]`);
  for (const id of batch.tokens) {
    if (!(id >= 0 && id < c.vlm.vocabSize)) throw new ShapeError('bad_value', `token id ${id} is outside the vocabulary [0, ${c.vlm.vocabSize})`);
  }
  if (c.variant === 'pi0') {
    if (!batch.state) throw new ShapeError('shape_mismatch', `pi0 needs state [${b}, ${c.stateDim}]; it is missing`);
    expect('state', batch.state.length, b * c.stateDim, `[${b}, ${c.stateDim}]`);
  }
  if (needActions) {
    if (!batch.actions) throw new ShapeError('shape_mismatch', `the loss needs actions [${b}, ${c.actionHorizon}, ${c.actionDim}]; they are missing`);
    expect('actions', batch.actions.length, b * c.actionHorizon * c.actionDim, `[${b}, ${c.actionHorizon}, ${c.actionDim}]`);
  }
  if (batch.actionMask) expect('actionMask', batch.actionMask.length, b * c.actionHorizon * c.actionDim, `[${b}, ${c.actionHorizon}, ${c.actionDim}]`);
  const k = batch.lossActionDims ?? c.actionDim;
  if (!Number.isInteger(k) || k < 1 || k > c.actionDim) throw new ShapeError('bad_value', `lossActionDims is ${k}; it must be an integer in [1, ${c.actionDim}]`);
  if (batch.weight) {
    expect('weight', batch.weight.length, b, `[${b}]`);
    for (let i = 0; i < b; i++) {
      const w = batch.weight[i]!;
      if (!(w >= 0 && Number.isFinite(w))) throw new ShapeError('bad_value', `weight[${i}] is ${w}; datum weights must be finite and >= 0`);
    }
  }
}

// ---------------------------------------------------------------- the model

function asActions(c: RealPiConfig, b: number, x: tf.Tensor | Float32Array, field: string): tf.Tensor {
  const shape = [b, c.actionHorizon, c.actionDim];
  const n = b * c.actionHorizon * c.actionDim;
  if (x instanceof Float32Array ? x.length !== n : x.size !== n) {
    throw new ShapeError('shape_mismatch', `${field} has ${x instanceof Float32Array ? x.length : x.size} values; expected [${shape.join(', ')}]`);
  }
  return x instanceof Float32Array ? tf.tensor3d(x, shape as [number, number, number]) : tf.reshape(x, shape);
}

function checkTime(b: number, time: Float32Array, ah: number): void {
  if (time.length !== b && time.length !== b * ah) throw new ShapeError('shape_mismatch', `time has ${time.length} values; expected one per datum (${b}) or one per action (${b} x ${ah})`);
}

/**
 * The velocity v(x_t, t) [b, ah, ad] for noisy actions xT [b, ah, ad] at times [b] (t = 1 is
 * noise; or [b * ah], one per action; `held` as embedSuffix), in one joint pass of prefix and suffix through the stack (the training forward).
 * @throws ShapeError for a batch or tensor that does not fit the config.
 */
export function velocity(model: RealPiModel, batch: RealPiBatch, xT: tf.Tensor | Float32Array, time: Float32Array, held?: tf.Tensor): tf.Tensor {
  const c = model.config;
  checkBatch(c, batch);
  checkTime(batch.size, time, c.actionHorizon);
  return tf.tidy(() => {
    const b = batch.size;
    const prefix = embedPrefix(model, batch);
    const suffix = embedSuffix(model, batch.state, asActions(c, b, xT, 'xT'), time, held);
    const { mask, positions, p, s, N } = sequenceLayout(c, prefix.valid, b);
    const hd = c.vlm.headDim;
    const pre = ropeTables(positionRows(positions, b, N, 0, p), b, p, hd);
    const suf = ropeTables(positionRows(positions, b, N, p, N), b, s, hd);
    const [, out] = gemmaStack(
      model.params,
      [
        { x: prefix.embs, names: NAMES.vlm, dims: c.vlm, cond: null, ...pre, bias: maskBias(mask, b, N, 0, p, N), output: false, grad: !prefix.constant },
        { x: suffix.embs, names: NAMES.expert, dims: c.expert, cond: suffix.cond, ...suf, bias: maskBias(mask, b, N, p, N, N), output: true },
      ],
      c.vlm.depth,
      null,
      null,
    );
    return actionHead(model, out!);
  });
}

/** The last ah suffix rows through action_out_proj: [b, s, E] -> [b, ah, ad]. */
function actionHead(model: RealPiModel, suffixOut: tf.Tensor): tf.Tensor {
  const [b, s, E] = suffixOut.shape as [number, number, number];
  const ah = model.config.actionHorizon;
  return linear(model.params, 'model.action_out_proj', tf.slice(suffixOut, [0, s - ah, 0], [b, ah, E]));
}

/**
 * The flow-matching loss per datum [b] (openpi's convention): x_t = t * noise + (1 - t) *
 * actions, u = noise - actions, loss_i = mean over ah and the first lossActionDims action dims
 * (default all ad) of (v(x_t, t) - u)^2. Differentiable: call it inside tf.variableGrads with
 * trainable params. noise [b, ah, ad], time [b] in (0, 1] (drawRealPiNoiseTime draws both).
 * @throws ShapeError for a batch without actions or anything that does not fit the config.
 */
export function computeLoss(model: RealPiModel, batch: RealPiBatch, noise: tf.Tensor | Float32Array, time: Float32Array): tf.Tensor {
  const c = model.config;
  checkBatch(c, batch, true);
  checkTime(batch.size, time, 1); // one time per datum here
  return tf.tidy(() => {
    const b = batch.size;
    const eps = asActions(c, b, noise, 'noise');
    const actions = asActions(c, b, batch.actions!, 'actions');
    const t = tf.tensor3d(time, [b, 1, 1]);
    const xT = tf.add(tf.mul(t, eps), tf.mul(tf.sub(1, t), actions));
    const u = tf.sub(eps, actions);
    const err = tf.square(tf.sub(velocity(model, batch, xT, time), u)); // [b, ah, ad]
    const k = batch.lossActionDims ?? c.actionDim;
    return tf.mean(k === c.actionDim ? err : tf.slice(err, [0, 0, 0], [b, c.actionHorizon, k]), [1, 2]);
  });
}

/**
 * Training draws (FACTS 1.12): noise ~ N(0, I) [b, ah, ad] and t = Beta(1.5, 1) * 0.999 + 0.001
 * per datum (biased toward the noisy end), from `rng` in JS so every backend gets the same.
 */
export function drawRealPiNoiseTime(c: RealPiConfig, rng: Rng, b: number): { noise: Float32Array; time: Float32Array } {
  return drawNoiseTime(rng, b, c.actionHorizon, c.actionDim, 'beta');
}

/**
 * What sample() computes in JS from a batch (the attention layout): the prefix's RoPE tables
 * [b * p * hd/2] and mask bias [b * p * p], the suffix's mask bias [b * s * (p + s)] and RoPE
 * tables [b * s * hd/2], with p prefix and s suffix tokens. Each array becomes a tensor as it is,
 * so a traced sampling graph takes them as host inputs (kernels/sample-graph.ts).
 */
export interface SampleHost {
  p: number;
  s: number;
  prefixCos: Float32Array;
  prefixSin: Float32Array;
  prefixBias: Float32Array;
  suffixBias: Float32Array;
  suffixCos: Float32Array;
  suffixSin: Float32Array;
}

/** The SampleHost of a batch (pure JS). */
export function sampleHost(c: RealPiConfig, batch: RealPiBatch): SampleHost {
  const b = batch.size;
  const hd = c.vlm.headDim;
  const { mask, positions, p, s, N } = sequenceLayout(c, prefixValid(c, batch), b);
  const pre = ropeArrays(positionRows(positions, b, N, 0, p), b, p, hd);
  const suf = ropeArrays(positionRows(positions, b, N, p, N), b, s, hd);
  return {
    p,
    s,
    prefixCos: pre.cos,
    prefixSin: pre.sin,
    prefixBias: maskBiasArray(mask, b, N, 0, p, p),
    suffixBias: maskBiasArray(mask, b, N, p, N, N),
    suffixCos: suf.cos,
    suffixSin: suf.sin,
  };
}

/**
 * Samples an action chunk [b, ah, ad] by Euler integration from `noise` at t = 1 to t = 0
 * (dt = -1 / numSteps; v evaluated at t = 1, 1 - 1/N, ..., 1/N). The prefix runs once and leaves
 * its post-RoPE keys/values per layer in a cache; each step runs only the expert over the suffix
 * against that cache (the cache never grows: the suffix's own keys are not stored). `host` is
 * sampleHost(config, batch), computed here when not given.
 * @throws ShapeError for a batch or noise that does not fit the config; RangeError for numSteps < 1.
 */
export function sample(model: RealPiModel, batch: RealPiBatch, noise: tf.Tensor | Float32Array, numSteps = model.config.numSteps, host?: SampleHost, chunk?: ChunkTensors): tf.Tensor {
  const c = model.config;
  checkBatch(c, batch);
  const b = batch.size;
  const h = host ?? sampleHost(c, batch);
  const { p, s } = h;
  const half = c.vlm.headDim / 2;
  // The prefix pass: everything the steps reuse (cache, suffix mask rows, suffix RoPE tables).
  const fixed = tf.tidy(() => {
    const prefix = embedPrefix(model, batch);
    const cache: KvCache = { k: [], v: [] };
    const pre = { cos: tf.tensor4d(h.prefixCos, [b, p, 1, half]), sin: tf.tensor4d(h.prefixSin, [b, p, 1, half]) };
    gemmaStack(model.params, [{ x: prefix.embs, names: NAMES.vlm, dims: c.vlm, cond: null, ...pre, bias: tf.tensor4d(h.prefixBias, [b, 1, p, p]), output: false }], c.vlm.depth, null, cache);
    return { k: cache.k, v: cache.v, bias: tf.tensor4d(h.suffixBias, [b, 1, s, p + s]), cos: tf.tensor4d(h.suffixCos, [b, s, 1, half]), sin: tf.tensor4d(h.suffixSin, [b, s, 1, half]) };
  });
  try {
    const x0 = asActions(c, b, noise, 'noise');
    const out = eulerSample(x0, numSteps, (x, time, held) => {
      const suffix = embedSuffix(model, batch.state, x, time, held);
      const [out] = gemmaStack(
        model.params,
        [{ x: suffix.embs, names: NAMES.expert, dims: c.expert, cond: suffix.cond, cos: fixed.cos, sin: fixed.sin, bias: fixed.bias, output: true }],
        c.expert.depth,
        { k: fixed.k, v: fixed.v },
        null,
      );
      return actionHead(model, out!);
    }, chunk);
    if (x0 !== noise) x0.dispose();
    return out;
  } finally {
    tf.dispose([...fixed.k, ...fixed.v, fixed.bias, fixed.cos, fixed.sin]);
  }
}

