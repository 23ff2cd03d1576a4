/**
 * Memory planning for the real pi0 / pi0.5: what serving, a LoRA fine-tune or a full fine-tune
 * of a RealPiConfig will hold, from its sizes alone (pure arithmetic, nothing is allocated), so
 * that the server refuses what would not fit before it loads anything.
 *
 * Parts, bytes (everything float32, as Vela holds it; a BF16 checkpoint is widened on load):
 * - weights: every parameter a forward pass uses (realPiParamCount), shared by every tenant.
 * - trainable: LoRA: each tenant's adapters, rank x (in + out) per adapted projection (the
 *   action expert's at its own rank; serving a LoRA checkpoint holds them too), and its copies
 *   of the projections LoRA trains in full (kernels/pi/policy.ts realPiLoraFull); full: a
 *   trainable copy of every parameter (the frozen base stays loaded next to it).
 * - optimizer: AdamW's two moments per trainable value (per tenant).
 * - gradients: the accumulated gradient of the tenant that steps (one copy at the peak: a
 *   second forward_backward adds into it after its tape is freed, measured).
 * - activations: serve: the prefix's keys/values of every layer (the cache), plus one layer's
 *   working set of the prefix pass. lora / full, rematerialised (the default, kernels/pi/model.ts
 *   rematWanted): every block's inputs, the residual streams [p, D] + [s, E] per Gemma layer (and
 *   [nc T, Wv] per SigLIP block in full), with their gradients, kept to the end of the backward
 *   pass; plus ONE block's re-run in the backward pass, its tape and gradients. LoRA's frozen
 *   tower, projector and embedding keep nothing (computed untaped). Without rematerialisation
 *   (`VELA_CHECKPOINT=off`): the whole forward + backward tape, which keeps per layer what the
 *   gradient needs: per token a multiple of the widths (norms, projections, RoPE, GeGLU,
 *   residuals; the LoRA path adds its own) and per head the attention logits and probabilities
 *   over all n = p + s tokens of the joint pass, p = nc * T + L (cameras x patches + prompt),
 *   s = ah (pi0.5) or 1 + ah (pi0). One layer's tape is that per-layer amount either way. The
 *   per-token and per-logit multiples are calibrated on measurement (below).
 * - workspace: the process around the tensors: Node and TF.js runtimes, the loader's buffers,
 *   allocator slack: 256 MiB + 6% of the weights (fitted to the full-size bench below).
 *
 * Calibration (test/memory-plan.test.ts): tf.profile's peak numBytes of sample() (serve) and
 * forward_backward + optim_step (lora, full) against `tensorBytes` (the total less workspace),
 * on REAL_PI_TINY_PI0 / PI05 (widths 64 / 32, MLP 2x) at batch 1 and 4, 1 and 3 cameras,
 * prompts of 12, 48 and 200 tokens, and on a mid-size config with the real models' width
 * ratios (VLM MLP 8x its width, expert 4x, vision 3.7x) that separates the per-width from the
 * per-MLP multiple: measured 0.90x..1.19x of the peak (60 tiny and 18 mid cases); the part above
 * the weights 0.69x..1.20x (the low end: serving at batch 1, a few MB). The test holds it to
 * 0.85x..1.25x and 0.6x..1.35x. Rematerialised (issue 34; wasm, 21 training cases): tiny LoRA
 * 1.00x..1.11x, tiny full 1.01x..1.16x (the full estimate is high at batch 4: its peak is the
 * optimizer step's, not the pass's), mid-size LoRA 0.96x (depth 2, batch 1) and, at depth 4,
 * 0.95x / 0.97x / 0.98x at batch 1 / 2 / 4 (pi0: 0.96x / 0.98x at 1 / 4), mid-size full 1.03x
 * (depth 2) and 1.02x / 1.03x (depth 4, batch 1 / 2). Taped whole: tiny 0.93x..0.99x, mid depth 2 1.10x; the per-layer
 * multiples underestimate a mid-size layer (depth 4: 0.81x..0.83x), which is why a
 * rematerialised block is 1.55 of them.
 *
 * Full size (bench/results/README.md, the run of record): pi0.5's float32 weights are
 * 13,413,735,488 bytes (12.49 GiB); Vela's sample() peaked at 1.13x that in RSS (14.1 GiB:
 * ~1 GiB of runtime and loader after load, ~0.6 GiB more while sampling). The estimate for
 * serve at batch 1: 13.96 GiB (1.12x) with 1 camera, 14.61 GiB (1.17x) with 3. A LoRA step at
 * batch 1 with 3 cameras and a 200-token prompt (n = 1,018 tokens per layer), taped whole
 * (`VELA_CHECKPOINT=off`), keeps ~34 GiB of activations (per token and layer ~34 values per
 * width and 6 per MLP unit, and the attention logits 18 x 8 x 1,018^2 several times): ~48 GiB in
 * all (~66 GiB while the frozen tower was taped too). Rematerialised: 3.4 GiB of activations,
 * ~17.5 GiB in all; 15.6 GiB with 1 camera, 20.2 GiB at batch 4, 63 GiB at batch 32 (the block
 * inputs grow with the batch: 49 GiB of them). pi0: 16.4 GiB (3 cameras). A full fine-tune holds
 * 5x the weights (base, copy, two moments, gradient, ~62 GiB) before activations: ~65 GiB at
 * batch 1 rematerialised (1 camera), ~80 GiB taped. None of these full-size training passes has
 * been measured yet.
 */
import { checkpointSetting } from '../layers.ts';
import { tokensPerCamera, type RealPiConfig } from './config.ts';
import { realPiParamCount, realPiParamSpecs } from './params.ts';
import { realPiLinears, realPiLoraFull } from './policy.ts';

const F32 = 4;
const MIB = 1024 * 1024;

/** What is planned. */
export interface MemoryPlan {
  /** serve: sample() only; lora: adapters on the frozen base; full: every parameter trained. */
  use: 'serve' | 'lora' | 'full';
  /**
   * Datums per forward pass (serve: per sample() call). >= 1. A fine-tune accumulating
   * micro-batches (server/jobs/base.ts planFineTune, issue 34) is planned at its micro-batch:
   * every pass of a step adds into the one accumulated gradient counted here, and each pass's
   * activations are freed before the next.
   */
  batch: number;
  /** Cameras per datum (nc), >= 1. */
  cameras: number;
  /** Prompt tokens L (default the config's maxTokenLen: 48 pi0, 200 pi0.5). */
  promptTokens?: number;
  /**
   * LoRA rank of the VLM's projections (default 16, openpi's). For serve: give it when the
   * served checkpoint is a LoRA adapter (the engine holds it as a TrainingState: adapters and
   * their AdamW moments); leave it out for merged or full weights.
   */
  loraRank?: number;
  /** LoRA rank of the action expert's projections (default 32, openpi's). */
  loraActionRank?: number;
  /** LoRA targets (kernels/lora.ts: all, attn, mlp, action_expert, prefix_expert); default ['all']. */
  loraTargets?: readonly string[];
  /** LoRA tenants sharing the base (each holds its adapters and moments); default 1. */
  tenants?: number;
  /** Full fine-tune with the token embedding frozen (TrainingOptions.frozen); default false. */
  freezeEmbedding?: boolean;
  /**
   * lora / full: whether the training pass rematerialises its blocks (kernels/pi/model.ts); default
   * on unless `VELA_CHECKPOINT=off` (kernels/layers.ts checkpointSetting), as the model does.
   */
  remat?: boolean;
}

/** An estimate, bytes. */
export interface MemoryEstimate {
  totalBytes: number;
  /** totalBytes less workspace: what tf.memory().numBytes should peak at. */
  tensorBytes: number;
  parts: { weights: number; trainable: number; optimizer: number; gradients: number; activations: number; workspace: number };
}

// Floats kept per token per layer as multiples of the widths (w: the stream's width, F: its MLP
// width, Q / K: query / key-value heads x head dim) and per attention logit. The terms follow
// kernels/pi/model.ts's ops (norms, projections, RoPE, GeGLU, residuals, logits and softmax);
// the multiples are fitted to the measurements of the module comment: the tiny configs (MLP
// 2x the width) fix perWidth + 2 perMlp, the mid-size one (MLP 8x) splits them.
const TAPE = { perWidth: 34, perMlp: 6, perQuery: 12, perKv: 13, perLogit: 5, scale: 1.7 } as const; // floats per value
const LORA_TAPE = 1.25; // LoRA's x·A·B path keeps three more [n, out] values per adapted projection
// Rematerialised: floats per residual value of every block (its input, kept, and the gradients
// of its input and output, kept to the end of the backward pass; measured 4.01 on tfjs-node and
// wasm from the peak of 8 vs 16 layers of a narrow config), and one block's re-run (its
// tape, its gradients, the forward it repeats) as a multiple of a taped layer's: fitted to the
// measurements of the module comment (the mid-size LoRA pass, where the block dominates: 1.37x
// on the tiny configs .. 1.70x at mid size; 1.39x in full).
const REMAT = { perResidual: 4, block: 1.55 } as const;
const SERVE = { perWidth: 12, perMlp: 12, perLogit: 9 } as const; // one layer live at a time, no tape

/** Tokens of one joint pass: prefix p, suffix s, n = p + s. */
export function passTokens(c: RealPiConfig, cameras: number, promptTokens = c.maxTokenLen): { p: number; s: number; n: number } {
  const p = cameras * tokensPerCamera(c) + promptTokens;
  const s = c.variant === 'pi0' ? 1 + c.actionHorizon : c.actionHorizon;
  return { p, s, n: p + s };
}

/**
 * Trainable values of one LoRA tenant: rank x (in + out) per adapted projection, plus the
 * projections trained in full beside them (realPiLoraFull: 3,248,160 values on pi0, 2,165,792
 * on pi0.5 at full size).
 */
export function loraParamCount(c: RealPiConfig, rank = 16, actionRank = 32, targets: readonly string[] = ['all']): number {
  const picked = realPiLinears(c).filter((l) => targets.some((t) => t === 'all' || t === l.kind || (t === 'action_expert' && l.expert === 'action') || (t === 'prefix_expert' && l.expert === 'prefix')));
  const full = new Set(realPiLoraFull(c));
  const fullValues = realPiParamSpecs(c).filter((s) => full.has(s.name)).reduce((n, s) => n + s.shape.reduce((a, b) => a * b, 1), 0);
  return picked.reduce((n, l) => n + (l.expert === 'action' ? actionRank : rank) * (l.inDim + l.outDim), 0) + fullValues;
}

function check(name: string, v: number | undefined, min: number): void {
  if (v !== undefined && (!Number.isInteger(v) || v < min)) throw new RangeError(`${name} is ${v}; it must be an integer >= ${min}`);
}

/**
 * Estimates the memory of `plan` on config `c` (see the module comment for each part and its
 * calibration). Pure arithmetic.
 * @throws RangeError naming a plan field that is not a positive integer (batch, cameras,
 *   promptTokens, ranks, tenants) or an unknown use.
 * @example estimateMemory(REAL_PI05, { use: 'serve', batch: 1, cameras: 3 }).totalBytes  // 15.7e9 (14.61 GiB)
 */
export function estimateMemory(c: RealPiConfig, plan: MemoryPlan): MemoryEstimate {
  if (plan.use !== 'serve' && plan.use !== 'lora' && plan.use !== 'full') throw new RangeError(`use is ${JSON.stringify(plan.use)}; expected serve, lora or full`);
  check('batch', plan.batch, 1);
  check('cameras', plan.cameras, 1);
  check('promptTokens', plan.promptTokens, 1);
  check('loraRank', plan.loraRank, 1);
  check('loraActionRank', plan.loraActionRank, 1);
  check('tenants', plan.tenants, 1);
  const b = plan.batch;
  const params = realPiParamCount(c);
  const weights = params * F32;
  let trainableValues = 0;
  // A served LoRA checkpoint is a TrainingState too: its adapters and (unused) AdamW moments.
  if (plan.use === 'lora' || (plan.use === 'serve' && plan.loraRank !== undefined)) trainableValues = loraParamCount(c, plan.loraRank, plan.loraActionRank, plan.loraTargets) * (plan.tenants ?? 1);
  if (plan.use === 'full') trainableValues = params - (plan.freezeEmbedding ? c.vlm.vocabSize * c.vlm.width : 0);
  const trainable = trainableValues * F32;
  const optimizer = 2 * trainable;
  // One tenant steps at a time. One gradient copy at the peak: measured, a second
  // forward_backward adds its gradients into the accumulated ones after its tape is freed.
  const gradients = plan.use === 'serve' ? 0 : plan.use === 'lora' ? trainable / (plan.tenants ?? 1) : trainable;

  const { p, s, n } = passTokens(c, plan.cameras, plan.promptTokens);
  const T = tokensPerCamera(c);
  const v = c.vision;
  const g = c.vlm; // depth, heads and head dims are shared by both streams
  const e = c.expert;
  const Q = g.numHeads * g.headDim;
  const K = g.numKvHeads * g.headDim;
  let floats: number;
  if (plan.use === 'serve') {
    // The cache of every layer, plus the largest layer's working set (the prefix pass).
    const cache = g.depth * 2 * p * K;
    const vlmLayer = p * (SERVE.perWidth * g.width + SERVE.perMlp * g.mlpDim + Q) + SERVE.perLogit * g.numHeads * p * p;
    const visionLayer = plan.cameras * (T * (SERVE.perWidth * v.width + SERVE.perMlp * v.mlpDim) + SERVE.perLogit * v.numHeads * T * T);
    const expertStep = s * (SERVE.perWidth * e.width + SERVE.perMlp * e.mlpDim) + SERVE.perLogit * g.numHeads * s * n;
    floats = b * (cache + Math.max(vlmLayer, visionLayer) + expertStep + p * g.width);
  } else {
    const perToken = (w: number, f: number) => TAPE.perWidth * w + TAPE.perMlp * f + TAPE.perQuery * Q + TAPE.perKv * K;
    // One layer's tape (its saved tensors and its gradients), of the Gemma stack and of SigLIP.
    const gemmaLayer = p * perToken(g.width, g.mlpDim) + s * perToken(e.width, e.mlpDim) + TAPE.perLogit * g.numHeads * n * n;
    const visionLayer = plan.cameras * (T * ((TAPE.perWidth + TAPE.perQuery + TAPE.perKv) * v.width + TAPE.perMlp * v.mlpDim) + TAPE.perLogit * v.numHeads * T * T);
    const lora = plan.use === 'lora' ? LORA_TAPE : 1;
    // LoRA's tower, projector and embedding are frozen: computed untaped, nothing of them is kept.
    const visionDepth = plan.use === 'lora' ? 0 : v.depth;
    if (plan.remat ?? checkpointSetting() !== 'off') {
      // Every block keeps its inputs (the residual streams) and, to the end of the backward
      // pass, their gradients; one block at a time is re-run with its tape and gradients.
      const streams = g.depth * (p * g.width + s * e.width) + visionDepth * plan.cameras * T * v.width;
      floats = b * (REMAT.perResidual * streams + REMAT.block * TAPE.scale * lora * Math.max(gemmaLayer, visionDepth > 0 ? visionLayer : 0));
    } else {
      floats = b * TAPE.scale * (g.depth * gemmaLayer + visionDepth * visionLayer) * lora;
    }
  }
  const activations = Math.round(floats * F32);
  const workspace = 256 * MIB + Math.round(0.06 * weights);
  const tensorBytes = weights + trainable + optimizer + gradients + activations;
  return { totalBytes: tensorBytes + workspace, tensorBytes, parts: { weights, trainable, optimizer, gradients, activations, workspace } };
}
