/**
 * The model's building blocks on TF.js ops, with gradients shaped for the wasm backend: its
 * XNNPACK path only covers matMuls without transposed operands (MODEL.md "Backends"), so every
 * matMul here has a custom gradient that transposes explicitly, then multiplies plainly:
 * dA = dY · transpose(B), dB = transpose(A) · dY. Heads use 4-D transposes only.
 * Axis legend: see kernels/small/config.ts.
 */
import * as tf from '@tensorflow/tfjs';
import { geluArgument, geluGradient } from './backend/gelu-fused.ts';
import { softmaxGrad } from './backend/softmax-grad.ts';
import { rmsBackward, rmsForward } from './backend/rms-fused.ts';

function swapLast(x: tf.Tensor): tf.Tensor {
  const r = x.rank;
  const perm = [...Array(r).keys()];
  perm[r - 2] = r - 1;
  perm[r - 1] = r - 2;
  return tf.transpose(x, perm);
}

/**
 * a · transpose(b) and transpose(a) · b. Native TensorFlow's BatchMatMul reads transposed
 * operands in place (adj_x / adj_y), so there the flags save a Transpose kernel and a copy per
 * product; wasm's XNNPACK path covers only plain operands, so it transposes first.
 */
function matMulBT(a: tf.Tensor, b: tf.Tensor): tf.Tensor {
  return tf.getBackend() === 'wasm' ? tf.matMul(a, swapLast(b)) : tf.matMul(a, b, false, true);
}

function matMulAT(a: tf.Tensor, b: tf.Tensor): tf.Tensor {
  return tf.getBackend() === 'wasm' ? tf.matMul(swapLast(a), b) : tf.matMul(a, b, true, false);
}

/**
 * `a · b` for rank-2 (or equal-rank batched) operands, both differentiable; gradients use
 * explicit transposes (see the module comment). a [..., n, k], b [..., k, m] -> [..., n, m].
 */
export const matmul = tf.customGrad(((a: tf.Tensor, b: tf.Tensor, save: tf.GradSaveFunc) => {
  save([a, b]);
  return {
    value: tf.matMul(a, b),
    gradFunc: (dy: tf.Tensor, saved: tf.Tensor[]) => {
      const [sa, sb] = saved as [tf.Tensor, tf.Tensor];
      return [matMulBT(dy, sb), matMulAT(sa, dy)];
    },
  };
}) as unknown as Parameters<typeof tf.customGrad>[0]) as (a: tf.Tensor, b: tf.Tensor) => tf.Tensor;

/**
 * `a · b` where `b` is constant (a frozen base weight): only dA is computed, since the closure
 * keeps `b` off the gradient tape. a [n, k], b [k, m] -> [n, m].
 */
export function matmulConstB(a: tf.Tensor, b: tf.Tensor): tf.Tensor {
  const f = tf.customGrad(((x: tf.Tensor, save: tf.GradSaveFunc) => {
    // b is saved (kept) too: it may be an intermediate (a split weight block) that an
    // enclosing tidy disposes before the backward pass runs.
    save([b]);
    return {
      value: tf.matMul(x, b),
      gradFunc: (dy: tf.Tensor, saved: tf.Tensor[]) => [matMulBT(dy, saved[0]!)],
    };
  }) as unknown as Parameters<typeof tf.customGrad>[0]) as (x: tf.Tensor) => tf.Tensor;
  return f(a);
}

/** LoRA factors of one linear layer: y += scale * (x · a) · b (MODEL.md "LoRA"). */
export interface LoraFactors {
  a: tf.Tensor; // [in, r], Kaiming uniform
  b: tf.Tensor; // [r, out], zero at creation
  scale: number; // alpha / rank
}

/** One linear layer's tensors. `weight` is [in, out] (x · W), so the forward needs no transpose. */
export interface LinearParams {
  weight: tf.Tensor; // [in, out]
  bias: tf.Tensor; // [out]
  /** false for a frozen base weight: its gradient is never computed. */
  trainable: boolean;
  lora?: LoraFactors;
}

/**
 * y = x · W + b (+ LoRA). x [..., in] -> [..., out]; leading axes are flattened into rows for
 * one rank-2 matMul.
 */
export function linear(x: tf.Tensor, p: LinearParams): tf.Tensor {
  const inDim = p.weight.shape[0]!;
  const outDim = p.weight.shape[1]!;
  if (x.shape[x.rank - 1] !== inDim) {
    throw new Error(`linear: x has last axis ${x.shape[x.rank - 1]}; the weight is [${inDim}, ${outDim}]`);
  }
  const lead = x.shape.slice(0, -1);
  const x2 = x.rank === 2 ? x : tf.reshape(x, [-1, inDim]); // [n, in]
  let y = p.trainable ? matmul(x2, p.weight) : matmulConstB(x2, p.weight); // [n, out]
  y = tf.add(y, p.bias);
  if (p.lora) {
    const low = matmul(matmul(x2, p.lora.a), p.lora.b); // [n, out]
    y = tf.add(y, tf.mul(low, p.lora.scale));
  }
  return x.rank === 2 ? y : tf.reshape(y, [...lead, outDim]);
}

/**
 * A fused linear layer whose output splits into `parts` equal column blocks (the fused QKV of
 * D2): returns `parts` tensors [..., out / parts]. On wasm the weight, bias and LoRA B are split
 * instead of the activations, since reading XNNPACK's output in pieces costs copies of it and
 * per-part matMuls stay on its fast path; elsewhere (TensorFlow) one matMul and one split of its
 * output take ~4 kernels where the per-part way takes ~12, and each kernel costs tens of
 * microseconds of dispatch there. Same function as linear + split either way.
 */
export function linearParts(x: tf.Tensor, p: LinearParams, parts: number): tf.Tensor[] {
  const inDim = p.weight.shape[0]!;
  const outDim = p.weight.shape[1]!;
  if (outDim % parts !== 0) throw new Error(`linearParts: ${outDim} outputs do not split into ${parts} parts`);
  if (tf.getBackend() !== 'wasm') return tf.split(linear(x, p), parts, x.rank - 1);
  const lead = x.shape.slice(0, -1);
  const x2 = x.rank === 2 ? x : tf.reshape(x, [-1, inDim]); // [n, in]
  const ws = tf.split(p.weight, parts, 1); // parts x [in, out/parts]
  const bs = tf.split(p.bias, parts, 0);
  const low = p.lora ? matmul(x2, p.lora.a) : undefined; // [n, r]
  const loraBs = p.lora ? tf.split(p.lora.b, parts, 1) : [];
  return ws.map((w, i) => {
    let y = tf.add(p.trainable ? matmul(x2, w) : matmulConstB(x2, w), bs[i]!); // [n, out/parts]
    if (low) y = tf.add(y, tf.mul(matmul(low, loraBs[i]!), p.lora!.scale));
    return x.rank === 2 ? y : tf.reshape(y, [...lead, outDim / parts]);
  });
}

/**
 * x / sqrt(mean(x^2) + 1e-6) * weight over the last axis (D3), with a fused gradient (TF.js
 * would otherwise keep every elementwise temporary until the backward pass ends):
 * with r = rsqrt(mean(x^2) + eps) and g = dy * weight, dx = r g - x r^3 mean(g x),
 * dweight = sum over rows of dy x r; both directions are row passes (kernels/backend/rms-fused.ts).
 * x [..., w], weight [w] (or none: the adaptive norm).
 */
function rmsCore(x: tf.Tensor, weight: tf.Tensor | null): tf.Tensor {
  const body = (xx: tf.Tensor, ww: tf.Tensor | null, save: tf.GradSaveFunc) => {
    const { y, r } = rmsForward(xx, ww);
    save(ww ? [xx, r, ww] : [xx, r]);
    r.dispose(); // save() kept its own reference
    return {
      value: y,
      gradFunc: (dy: tf.Tensor, saved: tf.Tensor[]) => {
        const [sx, sr, sw] = saved as [tf.Tensor, tf.Tensor, tf.Tensor | undefined];
        const { dx, dw } = rmsBackward(dy, sx, sr, sw ?? null);
        return sw ? [dx, dw!] : [dx];
      },
    };
  };
  if (weight) {
    const f = tf.customGrad(((a: tf.Tensor, b: tf.Tensor, save: tf.GradSaveFunc) => body(a, b, save)) as unknown as Parameters<typeof tf.customGrad>[0]);
    return (f as unknown as (a: tf.Tensor, b: tf.Tensor) => tf.Tensor)(x, weight);
  }
  const f = tf.customGrad(((a: tf.Tensor, save: tf.GradSaveFunc) => body(a, null, save)) as unknown as Parameters<typeof tf.customGrad>[0]);
  return (f as unknown as (a: tf.Tensor) => tf.Tensor)(x);
}

/** x / sqrt(mean(x^2) + 1e-6) over the last axis (D3), without weight. */
export function rmsNormalize(x: tf.Tensor): tf.Tensor {
  return rmsCore(x, null);
}

/** RMSNorm with a learnable weight [w] (D3). x [..., w]. */
export function rmsNorm(x: tf.Tensor, weight: tf.Tensor): tf.Tensor {
  return rmsCore(x, weight);
}

/**
 * Adaptive RMSNorm (D3): `mod` [b, 3w] (or [b, t, 3w], a conditioning per token) is the
 * zero-initialised Linear(w, 3w) of the conditioning, split as scale, shift, gate. x [b, t, w] ->
 * normed * (1 + scale) + shift, and the gate [b, 1 or t, w] that multiplies the sub-layer's output.
 */
export function adaRmsNorm(x: tf.Tensor, mod: tf.Tensor): { y: tf.Tensor; gate: tf.Tensor } {
  const w = x.shape[x.rank - 1]!;
  const b = mod.shape[0]!;
  const [scale, shift, gate] = tf.split(tf.reshape(mod, [b, -1, 3 * w]), 3, 2) as [tf.Tensor, tf.Tensor, tf.Tensor]; // [b, 1 or n, w] each
  const y = tf.add(tf.mul(rmsNormalize(x), tf.add(scale, 1)), shift);
  return { y, gate };
}

/**
 * GELU, tanh approximation: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), computed as
 * x * sigmoid(2 u), the same function (0.5 (1 + tanh u) = sigmoid(2 u)); the wasm backend's
 * Sigmoid is about 4x faster than its Tanh. The sigmoid's argument and the gradient
 * d/dx = s (1 + x (1 - s) 2 sqrt(2/pi) (1 + 3 * 0.044715 x^2)), s = sigmoid(2 u), are single
 * passes over memory (kernels/backend/gelu-fused.ts); x and s are kept for the backward pass.
 */
export function geluTanh(x: tf.Tensor): tf.Tensor {
  const f = tf.customGrad(((xx: tf.Tensor, save: tf.GradSaveFunc) => {
    const [y, s] = tf.tidy(() => {
      const sig = tf.sigmoid(geluArgument(xx));
      return [tf.mul(xx, sig), sig];
    });
    save([xx, s!]);
    s!.dispose(); // save() kept its own reference
    return {
      value: y!,
      gradFunc: (dy: tf.Tensor, saved: tf.Tensor[]) => [geluGradient(dy, saved[0]!, saved[1]!)],
    };
  }) as unknown as Parameters<typeof tf.customGrad>[0]) as unknown as (a: tf.Tensor) => tf.Tensor;
  return f(x);
}

/** swish(x) = x * sigmoid(x). */
export function swish(x: tf.Tensor): tf.Tensor {
  return tf.mul(x, tf.sigmoid(x));
}

/** MLP: Linear(w, m), GELU (tanh), Linear(m, w). x [..., w]. */
export function mlp(x: tf.Tensor, up: LinearParams, down: LinearParams): tf.Tensor {
  return linear(geluTanh(linear(x, up)), down);
}

/** [b, t, h*hd] -> [b, h, t, hd] (a 4-D transpose). */
export function splitHeads(x: tf.Tensor, heads: number): tf.Tensor {
  const [b, t, d] = x.shape as [number, number, number];
  return tf.transpose(tf.reshape(x, [b, t, heads, d / heads]), [0, 2, 1, 3]);
}

/** [b, t, h*hd] -> keys transposed for a plain matMul, [b, h, hd, t]. */
export function splitHeadsT(x: tf.Tensor, heads: number): tf.Tensor {
  const [b, t, d] = x.shape as [number, number, number];
  return tf.transpose(tf.reshape(x, [b, t, heads, d / heads]), [0, 2, 3, 1]);
}

/** [b, h, t, hd] -> [b, t, h*hd]. */
export function mergeHeads(x: tf.Tensor): tf.Tensor {
  const [b, h, t, hd] = x.shape as [number, number, number, number];
  return tf.reshape(tf.transpose(x, [0, 2, 1, 3]), [b, t, h * hd]);
}

/**
 * Attention softmax(q kᵀ / sqrt(hd) + bias) v (D9) on pre-split heads.
 * q [b, h, tq, hd], kT [b, h, hd, tk], v [b, h, tk, hd], bias [b, 1, tq or 1, tk] (0 where
 * allowed, -1e9 where masked) -> [b, h, tq, hd].
 * On wasm, batched matMuls miss XNNPACK (a [32, 156, 156] x [32, 156, 32] product ran at ~1
 * GMAC/s), so there the products run per head as 2-D matMuls (fast path, ~10 GMAC/s) inside
 * one op over all heads of a group of datums (attentionHeads). Other backends get one batched
 * matMul.
 */
export function attention(q: tf.Tensor, kT: tf.Tensor, v: tf.Tensor, bias: tf.Tensor): tf.Tensor {
  const [b, h, tq, hd] = q.shape as [number, number, number, number];
  const tk = kT.shape[3]!;
  const qs = tf.mul(q, 1 / Math.sqrt(hd));
  if (tf.getBackend() !== 'wasm' || b * h === 1) {
    const scores = tf.add(matmul(qs, kT), bias); // [b, h, tq, tk]
    return matmul(tf.softmax(scores), v); // [b, h, tq, hd]
  }
  const q3 = tf.reshape(qs, [b * h, tq, hd]);
  const k3 = tf.reshape(kT, [b * h, hd, tk]);
  const v3 = tf.reshape(v, [b * h, tk, hd]);
  // Datums in groups whose probabilities stay under ATTENTION_GROUP_ELEMENTS, which bounds the
  // backward pass's temporaries (a few copies of them) for the larger presets.
  const group = Math.max(1, Math.floor(ATTENTION_GROUP_ELEMENTS / (h * tq * tk)));
  const outs: tf.Tensor[] = [];
  for (let s = 0; s < b; s += group) {
    const e = Math.min(b, s + group);
    const part = (x: tf.Tensor) => (group >= b ? x : tf.slice(x, [s * h, 0, 0], [(e - s) * h, -1, -1]));
    const biasPart = group >= b ? bias : tf.slice(bias, [s, 0, 0, 0], [e - s, -1, -1, -1]);
    outs.push(attentionHeads(part(q3), part(k3), part(v3), biasPart, e - s)); // [(e-s)*h, tq, hd]
  }
  return tf.reshape(outs.length === 1 ? outs[0]! : tf.concat(outs, 0), [b, h, tq, hd]);
}

/** Largest probability tensor [heads, tq, tk] of one attentionHeads call, in elements (32 MB). */
const ATTENTION_GROUP_ELEMENTS = 8 * 1024 * 1024;

/** One 2-D matMul per leading index of two stacks: a n x [r, k], b n x [k, c] -> [n, r, c]. */
function perHead(a: tf.Tensor[], b: tf.Tensor[]): tf.Tensor {
  return tf.stack(a.map((x, i) => tf.matMul(x, b[i]!)));
}

/** [n, r, c] -> n x [c, r]: one 3-D transpose, then pieces of it. */
function unstackT(x: tf.Tensor): tf.Tensor[] {
  return tf.unstack(tf.transpose(x, [0, 2, 1]));
}

/**
 * All heads' attention as one op with a fused gradient: q [n, tq, hd] (already scaled),
 * kT [n, hd, tk], v [n, tk, hd] with n = b * h (datum-major), bias [b, 1, tq or 1, tk]
 * (constant) -> [n, tq, hd]. The products run per head as 2-D matMuls, while the bias, the
 * softmax and the softmax gradient run once over all heads: a third of the kernels of one op per
 * head (each wasm kernel costs ~20 us of overhead; flow05-tiny b8 went from ~9,400 kernels per
 * training step to ~6,000). Only q, kT, v and the probabilities p [n, tq, tk] are kept for the
 * backward pass, which frees its temporaries when it ends (TF.js keeps a taped op's gradients
 * until the whole backward pass ends): dp = do · vᵀ, ds = p (dp - rowsum(dp p)), dq = ds · k,
 * dkT = qᵀ · ds, dv = pᵀ · do (explicit 3-D transposes, plain 2-D matMuls).
 */
export function attentionHeads(q: tf.Tensor, kT: tf.Tensor, v: tf.Tensor, bias: tf.Tensor, b: number): tf.Tensor {
  const [n, tq] = q.shape as [number, number, number];
  const tk = kT.shape[2]!;
  if (n % b !== 0) throw new Error(`attentionHeads: ${n} heads do not split into batch ${b}`);
  const f = tf.customGrad(((qq: tf.Tensor, kk: tf.Tensor, vv: tf.Tensor, save: tf.GradSaveFunc) => {
    const [out, p] = tf.tidy(() => {
      const scores = tf.reshape(perHead(tf.unstack(qq), tf.unstack(kk)), [b, n / b, tq, tk]); // [b, h, tq, tk]
      const probs = tf.reshape(tf.softmax(tf.add(scores, bias)), [n, tq, tk]);
      return [perHead(tf.unstack(probs), tf.unstack(vv)), probs];
    });
    save([qq, kk, vv, p!]);
    p!.dispose(); // save() kept its own reference
    return {
      value: out!,
      gradFunc: (dy: tf.Tensor, saved: tf.Tensor[]) =>
        tf.tidy(() => {
          const [sq, skT, sv, sp] = saved as [tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor];
          const dyList = tf.unstack(dy); // n x [tq, hd]
          const dp = perHead(dyList, unstackT(sv)); // [n, tq, tk]
          const ds = tf.unstack(softmaxGrad(dp, sp)); // n x [tq, tk]: sp (dp - rowsum(dp sp))
          return [perHead(ds, unstackT(skT)), perHead(unstackT(sq), ds), perHead(unstackT(sp), dyList)];
        }),
    };
  }) as unknown as Parameters<typeof tf.customGrad>[0]) as (q: tf.Tensor, kT: tf.Tensor, v: tf.Tensor) => tf.Tensor;
  return f(q, kT, v);
}

/**
 * Embedding lookup table[indices] -> [n, w]. The gradient of TF.js's gather needs
 * UnsortedSegmentSum, which the wasm backend lacks, so there it is written as a plain matMul with
 * a one-hot matrix built in JS: dTable = onehot(indices)ᵀ · dy, onehotᵀ [vocab, n].
 */
export function embed(table: tf.Tensor, indices: Int32Array): tf.Tensor {
  const [vocab] = table.shape as [number, number];
  for (const i of indices) {
    if (!(i >= 0 && i < vocab)) throw new Error(`embed: index ${i} is outside the table of ${vocab} rows`);
  }
  // Elsewhere gather's own gradient runs on the device: no one-hot made in JS per call (which a
  // traced training graph would bake in, kernels/step-graph.ts).
  if (tf.getBackend() !== 'wasm') return tf.gather(table, tf.tensor1d(indices, 'int32'));
  const f = tf.customGrad(((t: tf.Tensor, save: tf.GradSaveFunc) => {
    save([]);
    return {
      value: tf.gather(t, tf.tensor1d(indices, 'int32')),
      gradFunc: (dy: tf.Tensor) => {
        const n = indices.length;
        const oneHotT = new Float32Array(vocab * n);
        for (let j = 0; j < n; j++) oneHotT[indices[j]! * n + j] = 1;
        return [tf.matMul(tf.tensor2d(oneHotT, [vocab, n]), dy)];
      },
    };
  }) as unknown as Parameters<typeof tf.customGrad>[0]) as (t: tf.Tensor) => tf.Tensor;
  return f(table);
}

/**
 * The gradient-checkpointing setting, `VELA_CHECKPOINT`: `on`, `off` or `auto` (the default).
 * What `auto` means is the model's: the small presets checkpoint their prefix layers past a size
 * (kernels/small/model.ts checkpointWanted), the real pi0 / pi0.5 always (kernels/pi/model.ts).
 */
export function checkpointSetting(): 'on' | 'off' | 'auto' {
  const mode = (process.env.VELA_CHECKPOINT ?? 'auto').toLowerCase();
  return mode === 'on' || mode === 'off' ? mode : 'auto';
}

/**
 * Gradient checkpointing: y = fn(x) keeping only x for the backward pass, which re-runs fn
 * under its own tape. `params` are the trainable variables fn reads (its gradients come back
 * for them too). Trades one extra forward for not holding the block's activations and
 * gradients, which TF.js otherwise keeps until the whole backward pass ends. One input and one
 * output: checkpointBlock with one of each.
 */
export function checkpoint(
  fn: (x: tf.Tensor, consts: tf.Tensor[]) => tf.Tensor,
  x: tf.Tensor,
  consts: tf.Tensor[],
  params: readonly tf.Variable[],
): tf.Tensor {
  return checkpointBlock(([xx], cs) => [fn(xx!, cs)], [x], consts, params)[0]!;
}

/**
 * Gradient checkpointing of a block with several inputs and outputs (the real models' joint
 * layer: both streams' residuals and pi0.5's adaRMS conditioning in, both residuals out):
 * ys = fn(xs, consts), keeping only xs and consts for the backward pass, which re-runs fn under
 * its own tape and returns the gradients of every x and of `params` (the trainable variables fn
 * reads; one it does not reach gets a zero gradient). `consts` get no gradient: tensors fn reads
 * that are not differentiable here (masks, RoPE tables, an input no trained parameter
 * precedes); they are passed, not captured, because an enclosing tidy may dispose them before
 * the backward pass. Every tensor fn reads must be an x, a const, a param or a persistent one
 * (a frozen base weight): anything else would be read after it is freed.
 * Each re-run's tape and temporaries are freed when its block's gradients are done; only the
 * xs' and params' gradients stay to the end of the backward pass. (Built on the engine's custom
 * op as tf.customGrad is, which allows one output only.)
 */
export function checkpointBlock(
  fn: (xs: tf.Tensor[], consts: tf.Tensor[]) => tf.Tensor[],
  xs: tf.Tensor[],
  consts: tf.Tensor[],
  params: readonly tf.Variable[],
): tf.Tensor[] {
  const n = xs.length;
  const inputs: tf.NamedTensorMap = {};
  [...xs, ...params].forEach((t, i) => (inputs[i] = t));
  return (tf.engine() as unknown as CustomKernelEngine).runKernelFunc({
    inputs,
    forwardFunc: (_backend, save) => {
      // The constants are saved too: an enclosing tidy may dispose them before the backward pass.
      save([...xs, ...consts]);
      // The tape is off inside a custom op: nothing fn computes is kept.
      return tf.tidy(() => fn(xs, consts));
    },
    backwardsFunc: (dy, saved) => {
      const dys = Array.isArray(dy) ? dy : [dy]; // one per output (zeros where none flowed back)
      const vars = saved.slice(0, n).map((t) => tf.variable(t, true));
      const cs = saved.slice(n);
      // A nested gradients() call ends by setting the engine's activeTape to null, which the
      // outer backward pass (this runs inside it) still reads afterwards: restore it.
      const state = (tf.engine() as unknown as { state: { activeTape: unknown } }).state;
      const outerTape = state.activeTape;
      let value: tf.Tensor;
      let grads: tf.NamedTensorMap;
      try {
        ({ value, grads } = tf.variableGrads(() => {
          const terms = fn(vars, cs).map((y, j) => tf.sum(tf.mul(y, dys[j]!)));
          return (terms.length === 1 ? terms[0]! : tf.addN(terms)) as tf.Scalar;
        }, [...vars, ...params]));
      } finally {
        state.activeTape = outerTape;
      }
      value.dispose();
      const out = [...vars.map((v) => grads[v.name] ?? tf.zerosLike(v)), ...params.map((p) => grads[p.name] ?? tf.zerosLike(p))];
      vars.forEach((v) => v.dispose());
      return Object.fromEntries(out.map((g, i) => [i, () => g]));
    },
  });
}

/**
 * The engine's custom-op entry that tf.customGrad wraps (public in TF.js's JS, private in its
 * types), used directly because it takes several outputs, each with its own gradient: no copy
 * of a block's outputs into one tensor and back.
 */
interface CustomKernelEngine {
  runKernelFunc(p: {
    inputs: tf.NamedTensorMap;
    forwardFunc: (backend: unknown, save: (tensors: tf.Tensor[]) => void) => tf.Tensor[];
    backwardsFunc: (dy: tf.Tensor | tf.Tensor[], saved: tf.Tensor[]) => Record<string, () => tf.Tensor>;
  }): tf.Tensor[];
}

/**
 * Runs `fn` with the gradient tape paused (as TF.js itself does inside a kernel): its ops are
 * not recorded, so nothing they compute is kept for a backward pass and what they return is a
 * constant to it. For the parts of a training pass that no trained parameter precedes (a frozen
 * vision tower): their activations would otherwise stay alive until the backward pass ends,
 * which never reads them. Scopes (tidy) work as usual inside.
 */
export function untaped<T>(fn: () => T): T {
  const state = (tf.engine() as unknown as { state: { kernelDepth: number } }).state;
  state.kernelDepth++;
  try {
    return fn();
  } finally {
    state.kernelDepth--;
  }
}
