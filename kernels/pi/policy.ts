/**
 * The real pi0 / pi0.5 as a FlowPolicy (kernels/flow-policy.ts), so the shared trainer
 * (kernels/trainer.ts) fine-tunes it exactly as it does the small presets: full or LoRA, AdamW,
 * accumulation, EMA, export / import, sampling with the prefix's keys/values cached.
 *
 * LoRA targets are the Gemma projections of either stream (FACTS 1.4 / 1.5): per layer
 * `self_attn.{q,k,v,o}_proj` and `mlp.{gate,up,down}_proj` of the VLM (`prefix_expert`) and of
 * the action expert (`action_expert`); `attn` / `mlp` pick those kinds in both, `all` every one.
 * The vision tower, projector, embedding and the action/time/state projections are never adapted
 * (openpi's gemma_2b_lora / gemma_300m_lora variants adapt the same set: attention and FFN
 * einsums of the two Gemmas). openpi's ranks are 16 (alpha 16) on the VLM and 32 (alpha 32) on
 * the expert: OPENPI_LORA gives them as TrainingOptions.
 *
 * Beside the adapters, LoRA trains the projections around the Gemmas in full (realPiLoraFull):
 * openpi's freeze filter for these variants freezes only the Gemmas' own weights, so the action
 * in / out, state and time projections train; without them the model cannot re-scale its output
 * to a new robot's actions. The SigLIP tower and projector, which openpi also trains, stay frozen
 * here on purpose (412 M parameters whose AdamW moments alone would be 6.6 GB; docs/MODEL.md).
 */
import { eulerSample } from '../flow.ts';
import type { FlowPolicy, LossTargets, PolicyLinear, PolicyParamSpec, PolicyWeights } from '../flow-policy.ts';
import { LORA_TARGETS, LoraError, type LoraTarget } from '../lora.ts';
import type { RealPiConfig } from './config.ts';
import { checkBatch, sample, sampleHost, velocity, type RealPiBatch, type RealPiModel } from './model.ts';
import { NAMES, contractInitValues, realPiParamSpecs } from './params.ts';

/** Graph keys round prompt lengths up to a multiple of this (kernels/sample-graph.ts). */
const PROMPT_BUCKET = 32;

/** `batch` with its prompts padded (token 0, mask 0) to `L` tokens each; the batch itself when they are. */
function padPrompt(batch: RealPiBatch, L: number): RealPiBatch {
  const b = batch.size;
  const have = batch.tokens.length / b;
  if (have >= L) return batch;
  const tokens = new Int32Array(b * L);
  const tokenMasks = new Uint8Array(b * L);
  for (let i = 0; i < b; i++) {
    tokens.set(batch.tokens.subarray(i * have, (i + 1) * have), i * L);
    for (let j = 0; j < have; j++) tokenMasks[i * L + j] = batch.tokenMasks[i * have + j]!;
  }
  return { ...batch, tokens, tokenMasks };
}

/** openpi's LoRA settings for pi0 / pi0.5 (gemma_2b_lora on the VLM, gemma_300m_lora on the expert). */
export const OPENPI_LORA = Object.freeze({ rank: 16, alpha: 16, actionRank: 32, actionAlpha: 32 });

type Kind = 'attn' | 'mlp';
interface PiLinear extends PolicyLinear {
  readonly kind: Kind;
}

/** The Gemma projections of both streams, VLM first, layer by layer (LoRA's candidates). */
export function realPiLinears(c: RealPiConfig): PiLinear[] {
  const out: PiLinear[] = [];
  for (const [names, d, expert] of [[NAMES.vlm, c.vlm, 'prefix'], [NAMES.expert, c.expert, 'action']] as const) {
    const q = d.numHeads * d.headDim;
    const kv = d.numKvHeads * d.headDim;
    for (let l = 0; l < d.depth; l++) {
      const p = `${names}layers.${l}.`;
      const add = (name: string, inDim: number, outDim: number, kind: Kind) => out.push({ name: p + name, inDim, outDim, expert, kind });
      add('self_attn.q_proj', d.width, q, 'attn');
      add('self_attn.k_proj', d.width, kv, 'attn');
      add('self_attn.v_proj', d.width, kv, 'attn');
      add('self_attn.o_proj', q, d.width, 'attn');
      add('mlp.gate_proj', d.width, d.mlpDim, 'mlp');
      add('mlp.up_proj', d.width, d.mlpDim, 'mlp');
      add('mlp.down_proj', d.mlpDim, d.width, 'mlp');
    }
  }
  return out;
}

/**
 * The parameters LoRA trains in full on the real models (FlowPolicy.loraFullParams), every weight
 * and bias: action_in_proj, action_out_proj, and pi0's state_proj and action-time MLP
 * (action_time_mlp_in / _out) or pi0.5's time MLP (time_mlp_in / _out).
 */
export function realPiLoraFull(c: RealPiConfig): string[] {
  const modules = ['model.action_in_proj', 'model.action_out_proj', ...(c.variant === 'pi0' ? ['model.state_proj', 'model.action_time_mlp_in', 'model.action_time_mlp_out'] : ['model.time_mlp_in', 'model.time_mlp_out'])];
  return modules.flatMap((m) => [`${m}.weight`, `${m}.bias`]);
}

function matches(s: PiLinear, t: LoraTarget): boolean {
  if (t === 'all') return true;
  if (t === 'attn' || t === 'mlp') return s.kind === t;
  return s.expert === (t === 'action_expert' ? 'action' : 'prefix');
}

/**
 * The real pi0 / pi0.5 of config `c` as a FlowPolicy over RealPiBatch. `name` is what exported
 * configs call it (default 'real-pi0' / 'real-pi05': plain 'pi0' / 'pi05' are still aliases of
 * the small presets in kernels/config.ts, so stored jobs that used them keep loading).
 */
export function realPiPolicy(c: RealPiConfig, name = `real-${c.variant}`): FlowPolicy<RealPiBatch, RealPiConfig> {
  const model = (W: PolicyWeights): RealPiModel => ({ config: c, params: W });
  return {
    name,
    config: c,
    horizon: c.actionHorizon,
    actionDim: c.actionDim,
    paramSpecs: (): readonly PolicyParamSpec[] => realPiParamSpecs(c),
    /**
     * The parity contract's rule (kernels/pi/params.ts contractInitValues); `seed` is not used. The
     * real models are fine-tuned from a checkpoint (BaseWeights.fromTensors), never trained from
     * an init, so this serves tests and benches only.
     */
    initialValues: () => new Map(realPiParamSpecs(c).map((s) => [s.name, contractInitValues(s.name, s.shape.reduce((a, b) => a * b, 1))])),
    loraLinears(targets) {
      if (targets.length === 0) throw new LoraError('bad_target', `targets is empty; choose from ${LORA_TARGETS.join(', ')}`);
      for (const t of targets) {
        if (!LORA_TARGETS.includes(t as LoraTarget)) throw new LoraError('bad_target', `unknown LoRA target '${t}'; choose from ${LORA_TARGETS.join(', ')}`);
      }
      return realPiLinears(c).filter((s) => targets.some((t) => matches(s, t as LoraTarget)));
    },
    loraFullParams: () => realPiLoraFull(c),
    batchSize: (batch) => batch.size,
    checkBatch: (batch, needActions) => checkBatch(c, batch, needActions),
    lossTargets(batch): LossTargets {
      const { size: b } = batch;
      const ad = c.actionDim;
      const k = batch.lossActionDims ?? ad;
      // LeRobot's loss: the mean over ah and the first lossActionDims dims (the real ones).
      const actionMask = batch.actionMask ?? new Float32Array(b * c.actionHorizon * ad).map((_, i) => (i % ad < k ? 1 : 0));
      return { actions: batch.actions!, actionMask, weight: batch.weight ?? new Float32Array(b).fill(1) };
    },
    velocity: (W, batch, xT, time) => velocity(model(W), batch, xT, time),
    sample(W, batch, noise, numSteps, cache, chunk) {
      if (cache) return sample(model(W), batch, noise, numSteps, undefined, chunk);
      return eulerSample(noise, numSteps, (x, time, held) => velocity(model(W), batch, x, time, held), chunk);
    },
    sampleInputs(given) {
      checkBatch(c, given);
      // Prompts vary in length (pi0.5's carries its state as text), and each length would be a
      // graph of its own: pad to a multiple of PROMPT_BUCKET (masked padding: the same answer).
      const batch = padPrompt(given, Math.min(c.maxTokenLen, Math.ceil(given.tokens.length / given.size / PROMPT_BUCKET) * PROMPT_BUCKET));
      const host = sampleHost(c, batch);
      const arrays = [batch.images, batch.tokens, host.prefixCos, host.prefixSin, host.prefixBias, host.suffixBias, host.suffixCos, host.suffixSin];
      if (c.variant === 'pi0') arrays.push(batch.state!);
      return {
        key: `${batch.size}|${batch.numCameras}|${batch.tokens.length}`,
        host: arrays,
        sample: (W, noise, numSteps, chunk) => sample(model(W), batch, noise, numSteps, host, chunk),
      };
    },
  };
}

