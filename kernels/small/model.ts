/**
 * The flow-matching policy (MODEL.md), top to bottom: parameter table and seeded init, then the
 * prefix encoder (images, prompt, pi0.5 state bins) and the suffix decoder (pi0 state token,
 * action tokens, velocity head) of the mixture of transformers. The prefix never attends to the
 * suffix, so it runs first, layer by layer, leaving its keys/values in a cache; training and the
 * sampler both decode the suffix against that cache (training differentiates through it).
 * Axis legend: see kernels/small/config.ts. Linear weights are stored [in, out] (y = x · W + b).
 */
import * as tf from '@tensorflow/tfjs';
import { holdAtZero } from '../rtc.ts';
import type { PolicyConfig } from './config.ts';
import type { ModelBatch } from './batch.ts';
import { Rng } from '../rng.ts';
import { adaRmsNorm, attention, checkpoint, checkpointSetting, embed, linear, linearParts, mergeHeads, mlp, rmsNorm, splitHeads, splitHeadsT, swish, type LinearParams, type LoraFactors } from '../layers.ts';

// ---------------------------------------------------------------- parameter table

export type Init = 'linear' | 'zeros' | 'ones' | 'normal' | 'zero_linear';

/** One parameter: its name, shape and initialisation (D1, D3, D10). */
export interface ParamSpec {
  name: string;
  shape: number[];
  init: Init;
}

/** Where a linear layer sits, for LoRA targets (MODEL.md "LoRA and targets"). */
export interface LinearSpec {
  name: string; // parameters are `${name}.weight` [in, out] and `${name}.bias` [out]
  inDim: number;
  outDim: number;
  expert: 'prefix' | 'action' | 'other';
  kind: 'attn' | 'mlp' | 'other';
}

/** Every linear layer of the config, in parameter order. */
export function linearSpecs(c: PolicyConfig): LinearSpec[] {
  const w = c.width;
  const hd = c.heads * c.headDim;
  const out: LinearSpec[] = [{ name: 'img.patch', inDim: c.patchDim, outDim: w, expert: 'prefix', kind: 'other' }];
  if (c.variant === 'pi0') out.push({ name: 'state.proj', inDim: c.stateDim, outDim: w, expert: 'other', kind: 'other' });
  out.push({ name: 'act.in', inDim: c.actionDim, outDim: w, expert: 'action', kind: 'other' });
  if (c.variant === 'pi0') {
    out.push({ name: 'act.time1', inDim: 2 * w, outDim: w, expert: 'action', kind: 'other' });
    out.push({ name: 'act.time2', inDim: w, outDim: w, expert: 'action', kind: 'other' });
  } else {
    out.push({ name: 'time.mlp1', inDim: w, outDim: w, expert: 'action', kind: 'other' });
    out.push({ name: 'time.mlp2', inDim: w, outDim: w, expert: 'action', kind: 'other' });
  }
  for (let l = 0; l < c.depth; l++) {
    for (const expert of ['prefix', 'action'] as const) {
      const p = `layers.${l}.${expert}`;
      const ada = expert === 'action' && c.variant === 'pi05';
      if (ada) out.push({ name: `${p}.ada1`, inDim: w, outDim: 3 * w, expert, kind: 'other' });
      out.push({ name: `${p}.qkv`, inDim: w, outDim: 3 * hd, expert, kind: 'attn' });
      out.push({ name: `${p}.o`, inDim: hd, outDim: w, expert, kind: 'attn' });
      if (ada) out.push({ name: `${p}.ada2`, inDim: w, outDim: 3 * w, expert, kind: 'other' });
      out.push({ name: `${p}.mlp1`, inDim: w, outDim: c.mlpDim, expert, kind: 'mlp' });
      out.push({ name: `${p}.mlp2`, inDim: c.mlpDim, outDim: w, expert, kind: 'mlp' });
    }
  }
  out.push({ name: 'act.out', inDim: w, outDim: c.actionDim, expert: 'action', kind: 'other' });
  return out;
}

/** The full parameter table of a config, in a fixed order (the order of seeded init). */
export function paramSpecs(c: PolicyConfig): ParamSpec[] {
  const w = c.width;
  const specs: ParamSpec[] = [];
  const lin = new Map(linearSpecs(c).map((s) => [s.name, s]));
  const addLinear = (name: string) => {
    const s = lin.get(name)!;
    const zero = name.endsWith('.ada1') || name.endsWith('.ada2');
    specs.push({ name: `${name}.weight`, shape: [s.inDim, s.outDim], init: zero ? 'zero_linear' : 'linear' });
    specs.push({ name: `${name}.bias`, shape: [s.outDim], init: 'zeros' });
  };
  addLinear('img.patch');
  specs.push({ name: 'img.pos', shape: [c.patchesPerSlot, w], init: 'normal' });
  specs.push({ name: 'img.slot', shape: [c.slots, w], init: 'normal' });
  specs.push({ name: 'txt.embed', shape: [c.vocab, w], init: 'normal' });
  specs.push({ name: 'txt.pos', shape: [c.maxTokenLen, w], init: 'normal' });
  if (c.variant === 'pi0') {
    addLinear('state.proj');
  } else {
    specs.push({ name: 'state.embed', shape: [256, w], init: 'normal' });
    specs.push({ name: 'state.dim', shape: [c.stateDim, w], init: 'normal' });
  }
  addLinear('act.in');
  specs.push({ name: 'act.pos', shape: [c.horizon, w], init: 'normal' });
  if (c.variant === 'pi0') {
    addLinear('act.time1');
    addLinear('act.time2');
  } else {
    addLinear('time.mlp1');
    addLinear('time.mlp2');
  }
  for (let l = 0; l < c.depth; l++) {
    for (const expert of ['prefix', 'action'] as const) {
      const p = `layers.${l}.${expert}`;
      const ada = expert === 'action' && c.variant === 'pi05';
      if (ada) addLinear(`${p}.ada1`);
      else specs.push({ name: `${p}.norm1.weight`, shape: [w], init: 'ones' });
      addLinear(`${p}.qkv`);
      addLinear(`${p}.o`);
      if (ada) addLinear(`${p}.ada2`);
      else specs.push({ name: `${p}.norm2.weight`, shape: [w], init: 'ones' });
      addLinear(`${p}.mlp1`);
      addLinear(`${p}.mlp2`);
    }
  }
  specs.push({ name: 'final_norm.weight', shape: [w], init: 'ones' });
  addLinear('act.out');
  return specs;
}

/** The number of parameters in the table (equals config.ts's countParams; a test checks). */
export function tableParamCount(c: PolicyConfig): number {
  return paramSpecs(c).reduce((n, s) => n + s.shape.reduce((a, b) => a * b, 1), 0);
}

/**
 * Seeded initial values (D1: linear weights uniform in ±1/sqrt(fan_in), biases 0; D3: norm
 * weights 1, adaptive-norm Linear 0; D10: embeddings N(0, 0.02)). Drawn in JS from one Rng in
 * table order, so every backend gets the same numbers.
 */
export function initialValues(c: PolicyConfig, seed: number): Map<string, Float32Array> {
  const rng = new Rng(seed);
  const out = new Map<string, Float32Array>();
  for (const s of paramSpecs(c)) {
    const n = s.shape.reduce((a, b) => a * b, 1);
    let data: Float32Array;
    switch (s.init) {
      case 'linear': {
        const bound = 1 / Math.sqrt(s.shape[0]!);
        data = new Float32Array(n);
        for (let i = 0; i < n; i++) data[i] = (2 * rng.uniform() - 1) * bound;
        break;
      }
      case 'normal':
        data = rng.normals(n).map((x) => x * 0.02);
        break;
      case 'ones':
        data = new Float32Array(n).fill(1);
        break;
      default:
        data = new Float32Array(n);
    }
    out.set(s.name, data);
  }
  return out;
}

// ---------------------------------------------------------------- weights view

/** What the forward pass reads: every tensor by name, whether it is trained, LoRA factors. */
export interface WeightsView {
  readonly config: PolicyConfig;
  get(name: string): tf.Tensor;
  trainable(name: string): boolean;
  lora(linearName: string): LoraFactors | undefined;
  /** The trainable variables whose names start with `prefix` (enables gradient checkpointing). */
  params?(prefix: string): tf.Variable[];
}

/**
 * Whether to checkpoint the prefix layers: `VELA_CHECKPOINT` = on / off / auto (default: on when
 * b * p * w > 500,000, where the activations TF.js keeps for the backward pass run to GBs).
 */
export function checkpointWanted(elements: number): boolean {
  const mode = checkpointSetting();
  if (mode === 'on') return true;
  if (mode === 'off') return false;
  return elements > 500_000;
}

function lin(W: WeightsView, name: string): LinearParams {
  const lora = W.lora(name);
  return { weight: W.get(`${name}.weight`), bias: W.get(`${name}.bias`), trainable: W.trainable(`${name}.weight`), ...(lora ? { lora } : {}) };
}

// ---------------------------------------------------------------- inputs prepared in JS

/** Image slots that have a frame in at least one datum (D13: the others are not computed). */
export function activeSlots(c: PolicyConfig, batch: ModelBatch): number[] {
  const out: number[] = [];
  for (let k = 0; k < c.slots; k++) {
    for (let i = 0; i < batch.size; i++) {
      if (batch.imageMask[i * c.slots + k]) {
        out.push(k);
        break;
      }
    }
  }
  return out;
}

/** Patch vectors of the active slots, scaled x / 127.5 - 1 (D12), layout (row, column, channel)
 * within a patch, patches row-major, slots in order (D7): [b * ns * pp, patchDim]. */
function patchify(c: PolicyConfig, batch: ModelBatch, slots: number[]): Float32Array {
  const { imageSize: S, patch: P } = c;
  const g = S / P;
  const out = new Float32Array(batch.size * slots.length * c.patchesPerSlot * c.patchDim);
  let o = 0;
  for (let i = 0; i < batch.size; i++) {
    for (const k of slots) {
      const base = (i * c.slots + k) * S * S * 3;
      for (let py = 0; py < g; py++) {
        for (let px = 0; px < g; px++) {
          for (let r = 0; r < P; r++) {
            let src = base + ((py * P + r) * S + px * P) * 3;
            for (let j = 0; j < P * 3; j++) out[o++] = batch.images[src++]! / 127.5 - 1;
          }
        }
      }
    }
  }
  return out;
}

/** D6: bin = clamp(floor((clip(x, -1, 1) + 1) / 2 * 256), 0, 255), [b * s] int32. */
export function stateBins(state: Float32Array): Int32Array {
  const out = new Int32Array(state.length);
  for (let i = 0; i < state.length; i++) {
    const x = Math.min(1, Math.max(-1, state[i]!));
    out[i] = Math.min(255, Math.max(0, Math.floor(((x + 1) / 2) * 256)));
  }
  return out;
}

/** Sine-cosine time embedding [b, w] (MODEL.md "Time embedding"). */
export function timeEmbedding(time: Float32Array, width: number): Float32Array {
  const half = width / 2;
  const out = new Float32Array(time.length * width);
  for (let i = 0; i < time.length; i++) {
    for (let j = 0; j < half; j++) {
      const frac = half === 1 ? 0 : j / (half - 1);
      const period = 4e-3 * Math.pow(4.0 / 4e-3, frac);
      const arg = (2 * Math.PI * time[i]!) / period;
      out[i * width + j] = Math.sin(arg);
      out[i * width + half + j] = Math.cos(arg);
    }
  }
  return out;
}

const MASKED = -1e9;

// ---------------------------------------------------------------- prefix encoder

/** Per layer, the prefix keys (transposed) and values: kT [b, h, hd, p], v [b, h, p, hd];
 * keyBias [b, 1, 1, p] (0 valid, -1e9 padding). */
export interface PrefixCache {
  kT: tf.Tensor[];
  v: tf.Tensor[];
  keyBias: tf.Tensor;
  length: number; // p
}

/**
 * What the prefix needs computed in JS from a batch, each array made into a tensor as it is (so a
 * traced graph can take them as host inputs, kernels/backend/graph.ts): the active slots
 * (structure, not data), the patch vectors [b * ns * pp, patchDim] (null without a slot), pi0.5's
 * state bins [b * s] (null for pi0) and the prefix key bias [b * p] (0 valid, -1e9 padding).
 */
export interface PrefixHost {
  slots: number[];
  patches: Float32Array | null;
  bins: Int32Array | null;
  keyBias: Float32Array;
}

/** The PrefixHost of `batch` (pure JS, no tensors). */
export function prefixHost(c: PolicyConfig, batch: ModelBatch): PrefixHost {
  const B = batch.size;
  const slots = activeSlots(c, batch);
  const pp = c.patchesPerSlot;
  const L = c.maxTokenLen;
  const p = slots.length * pp + L + (c.variant === 'pi05' ? c.stateDim : 0);
  const valid = new Uint8Array(B * p);
  for (let i = 0; i < B; i++) {
    let o = i * p;
    slots.forEach((k) => valid.fill(batch.imageMask[i * c.slots + k]!, o + 0, (o += pp)));
    for (let j = 0; j < L; j++) valid[o++] = batch.tokenMask[i * L + j]!;
    if (c.variant === 'pi05') valid.fill(1, o, o + c.stateDim);
  }
  const keyBias = new Float32Array(B * p);
  for (let i = 0; i < keyBias.length; i++) keyBias[i] = valid[i] ? 0 : MASKED;
  return {
    slots,
    patches: slots.length > 0 ? patchify(c, batch, slots) : null,
    bins: c.variant === 'pi05' ? stateBins(batch.state) : null,
    keyBias,
  };
}

/** The prefix tokens [b, p, w] from the batch's PrefixHost. */
function embedPrefix(W: WeightsView, batch: ModelBatch, host: PrefixHost): tf.Tensor {
  const c = W.config;
  const B = batch.size;
  const w = c.width;
  const { slots } = host;
  const parts: tf.Tensor[] = [];
  const pp = c.patchesPerSlot;
  if (host.patches) {
    const ns = slots.length;
    const patches = tf.tensor2d(host.patches, [B * ns * pp, c.patchDim]);
    const emb = tf.reshape(linear(patches, lin(W, 'img.patch')), [B, ns, pp, w]);
    const slotEmb = tf.reshape(embed(W.get('img.slot'), Int32Array.from(slots)), [1, ns, 1, w]);
    const pos = tf.reshape(W.get('img.pos'), [1, 1, pp, w]);
    parts.push(tf.reshape(tf.add(tf.add(emb, pos), slotEmb), [B, ns * pp, w])); // [b, ns*pp, w]
  }
  const L = c.maxTokenLen;
  const tok = tf.reshape(embed(W.get('txt.embed'), batch.tokens), [B, L, w]);
  parts.push(tf.add(tok, tf.expandDims(W.get('txt.pos'), 0))); // [b, L, w]
  if (host.bins) {
    const st = tf.reshape(embed(W.get('state.embed'), host.bins), [B, c.stateDim, w]);
    parts.push(tf.add(st, tf.expandDims(W.get('state.dim'), 0))); // [b, s, w]
  }
  return parts.length === 1 ? parts[0]! : tf.concat(parts, 1);
}

/**
 * Runs the prefix expert over all layers and returns the cache of its keys/values. Prefix
 * tokens see every valid prefix token (D8). A padding query also sees only valid keys here
 * (not itself): its own output is never read, since padding is masked as a key everywhere, so
 * the valid tokens' outputs are the same. In the last layer only K and V are computed.
 */
export function encodePrefix(W: WeightsView, batch: ModelBatch, host: PrefixHost = prefixHost(W.config, batch)): PrefixCache {
  const c = W.config;
  const B = batch.size;
  let x = embedPrefix(W, batch, host); // [b, p, w]
  const p = x.shape[1]!;
  const keyBias = tf.tensor4d(host.keyBias, [B, 1, 1, p]);
  const kT: tf.Tensor[] = [];
  const v: tf.Tensor[] = [];
  const D = c.heads * c.headDim;
  const w = c.width;
  const remat = W.params !== undefined && checkpointWanted(B * p * w);
  for (let l = 0; l < c.depth; l++) {
    const last = l === c.depth - 1;
    // One output [b, p, (w) + 2D]: the next residual stream (not in the last layer), K and V.
    const layer = (xin: tf.Tensor, [kb]: tf.Tensor[]) => {
      const pre = `layers.${l}.prefix`;
      const [q, k, vv] = linearParts(rmsNorm(xin, W.get(`${pre}.norm1.weight`)), lin(W, `${pre}.qkv`), 3) as [tf.Tensor, tf.Tensor, tf.Tensor]; // [b, p, h*hd] each
      if (last) return tf.concat([k, vv], 2);
      const att = mergeHeads(attention(splitHeads(q, c.heads), splitHeadsT(k, c.heads), splitHeads(vv, c.heads), kb!)); // [b, p, h*hd]
      let y = tf.add(xin, linear(att, lin(W, `${pre}.o`)));
      y = tf.add(y, mlp(rmsNorm(y, W.get(`${pre}.norm2.weight`)), lin(W, `${pre}.mlp1`), lin(W, `${pre}.mlp2`)));
      return tf.concat([y, k, vv], 2);
    };
    const out = remat ? checkpoint(layer, x, [keyBias], W.params!(`layers.${l}.prefix.`)) : layer(x, [keyBias]);
    // (Never mutate the array tf.split returns: the gradient tape holds it as the op's outputs.)
    const parts = tf.split(out, last ? [D, D] : [w, D, D], 2);
    if (!last) x = parts[0]!;
    kT.push(splitHeadsT(parts[last ? 0 : 1]!, c.heads)); // [b, h, hd, p]
    v.push(splitHeads(parts[last ? 1 : 2]!, c.heads)); // [b, h, p, hd]
  }
  return { kT, v, keyBias, length: p };
}

/** Frees a cache made outside a tidy. */
export function disposeCache(cache: PrefixCache): void {
  tf.dispose([...cache.kT, ...cache.v, cache.keyBias]);
}

// ---------------------------------------------------------------- suffix decoder

/**
 * The velocity [b, ah, ad] for noisy actions xT [b, ah, ad] at times `time` [b] (t = 1 is
 * noise; or [b * ah], a time per action: training-time RTC, kernels/rtc.ts; `held` [b, ah, 1]
 * marks actions at flow time 0 instead, RTC's prefix at sampling: holdAtZero), decoding the suffix against the prefix cache; `timeEmb` is timeEmbedding(time, width). pi0: suffix = [state token, actions],
 * the state token sees the prefix and itself; pi0.5: suffix = actions, time conditions the
 * adaptive RMSNorm of every action-expert block. Action tokens see everything (D8).
 */
export function decodeSuffix(W: WeightsView, batch: ModelBatch, cache: PrefixCache, xT: tf.Tensor, time: Float32Array, timeEmb: Float32Array = timeEmbedding(time, W.config.width), held?: tf.Tensor): tf.Tensor {
  const c = W.config;
  const B = batch.size;
  const w = c.width;
  const H = c.horizon;
  // One time per datum [b, w], or per action [b, ah, w] (RTC's prefix at time 0: kernels/rtc.ts).
  const perAction = time.length === B * H;
  const temb = perAction ? tf.tensor3d(timeEmb, [B, H, w]) : tf.tensor2d(timeEmb, [B, w]);
  let act = tf.add(linear(xT, lin(W, 'act.in')), tf.expandDims(W.get('act.pos'), 0)); // [b, ah, w]
  let x: tf.Tensor;
  let cond: tf.Tensor | undefined;
  if (c.variant === 'pi0') {
    const tt = holdAtZero(perAction ? temb : tf.tile(tf.expandDims(temb, 1), [1, H, 1]), held, () => tf.tensor2d(timeEmbedding(new Float32Array(B), w), [B, w])); // [b, ah, w]
    act = linear(swish(linear(tf.concat([act, tt], 2), lin(W, 'act.time1'))), lin(W, 'act.time2'));
    const st = tf.expandDims(linear(tf.tensor2d(batch.state, [B, c.stateDim]), lin(W, 'state.proj')), 1); // [b, 1, w]
    x = tf.concat([st, act], 1); // [b, 1+ah, w]
  } else {
    const mlp = (e: tf.Tensor) => swish(linear(swish(linear(e, lin(W, 'time.mlp1'))), lin(W, 'time.mlp2')));
    cond = mlp(temb); // [b, w] or [b, ah, w]
    if (held) cond = holdAtZero(perAction ? cond : tf.tile(tf.expandDims(cond, 1), [1, H, 1]), held, () => mlp(tf.tensor2d(timeEmbedding(new Float32Array(B), w), [B, w])));
    x = act;
  }
  const ts = x.shape[1]!;
  // Suffix-to-suffix mask: pi0's state token (row 0) sees only itself among the suffix.
  const sBias = new Float32Array(ts * ts);
  if (c.variant === 'pi0') for (let j = 1; j < ts; j++) sBias[j] = MASKED;
  const suffixBias = tf.tensor4d(sBias, [1, 1, ts, ts]);
  const prefixBias = tf.tile(cache.keyBias, [1, 1, ts, 1]); // [b, 1, ts, p]
  const bias = tf.concat([prefixBias, tf.tile(suffixBias, [B, 1, 1, 1])], 3); // [b, 1, ts, p+ts]
  for (let l = 0; l < c.depth; l++) {
    const pre = `layers.${l}.action`;
    let h: tf.Tensor;
    let gate1: tf.Tensor | undefined;
    let gate2: tf.Tensor | undefined;
    if (cond) ({ y: h, gate: gate1 } = adaRmsNorm(x, linear(cond, lin(W, `${pre}.ada1`))));
    else h = rmsNorm(x, W.get(`${pre}.norm1.weight`));
    const [q, k, v] = linearParts(h, lin(W, `${pre}.qkv`), 3) as [tf.Tensor, tf.Tensor, tf.Tensor]; // [b, ts, h*hd] each
    const kT = tf.concat([cache.kT[l]!, splitHeadsT(k, c.heads)], 3); // [b, h, hd, p+ts]
    const vv = tf.concat([cache.v[l]!, splitHeads(v, c.heads)], 2); // [b, h, p+ts, hd]
    let att = linear(mergeHeads(attention(splitHeads(q, c.heads), kT, vv, bias)), lin(W, `${pre}.o`)); // [b, ts, w]
    if (gate1) att = tf.mul(att, gate1);
    x = tf.add(x, att);
    if (cond) ({ y: h, gate: gate2 } = adaRmsNorm(x, linear(cond, lin(W, `${pre}.ada2`))));
    else h = rmsNorm(x, W.get(`${pre}.norm2.weight`));
    let m = mlp(h, lin(W, `${pre}.mlp1`), lin(W, `${pre}.mlp2`));
    if (gate2) m = tf.mul(m, gate2);
    x = tf.add(x, m);
  }
  const actOut = c.variant === 'pi0' ? tf.slice(x, [0, 1, 0], [B, H, w]) : x; // [b, ah, w]
  return linear(rmsNorm(actOut, W.get('final_norm.weight')), lin(W, 'act.out')); // [b, ah, ad]
}

/**
 * The velocity for a whole batch in one pass (prefix and suffix): [b, ah, ad]. `host` and
 * `timeEmb` (timeEmbedding(time, width)) are computed here when not given.
 */
export function velocity(W: WeightsView, batch: ModelBatch, xT: tf.Tensor, time: Float32Array, host?: PrefixHost, timeEmb?: Float32Array, held?: tf.Tensor): tf.Tensor {
  return tf.tidy(() => decodeSuffix(W, batch, encodePrefix(W, batch, host), xT, time, timeEmb, held));
}
