/**
 * LoRA (Hu et al. 2021) as MODEL.md "LoRA and targets" fixes it: a frozen linear W becomes
 * `W x + (alpha / rank) * B A x`, A Kaiming uniform (PEFT's kaiming_uniform_(a = sqrt(5)),
 * i.e. ±1/sqrt(in)), B zero, so a new adapter changes nothing until trained. Stored [in, r]
 * (`<linear>.lora_a`) and [r, out] (`<linear>.lora_b`), matching the [in, out] weights.
 */
import type { PolicyConfig } from './small/config.ts';
import { linearSpecs, type LinearSpec } from './small/model.ts';
import type { Rng } from './rng.ts';

export type LoraTarget = 'attn' | 'mlp' | 'action_expert' | 'prefix_expert' | 'all';
export const LORA_TARGETS: readonly LoraTarget[] = ['attn', 'mlp', 'action_expert', 'prefix_expert', 'all'];

export type LoraErrorCode = 'bad_rank' | 'bad_alpha' | 'bad_target';

/** Bad LoRA settings; messages quote the values. */
export class LoraError extends Error {
  readonly code: LoraErrorCode;
  constructor(code: LoraErrorCode, message: string) {
    super(message);
    this.name = 'LoraError';
    this.code = code;
  }
}

function matches(s: LinearSpec, t: LoraTarget): boolean {
  switch (t) {
    case 'all':
      return true;
    case 'attn':
      return s.kind === 'attn';
    case 'mlp':
      return s.kind === 'mlp';
    case 'action_expert':
      return s.expert === 'action';
    case 'prefix_expert':
      // The prefix expert's layers and its input projection (the patch embedding).
      return s.expert === 'prefix';
  }
}

/**
 * The linear layers a target list selects, in parameter order. `attn`: Q, K, V (fused) and O
 * of both experts; `mlp`: both experts' MLPs; `action_expert`: every linear layer of the action
 * expert (incl. pi0.5's adaptive-norm Linear), the action input, time MLP and output head;
 * `prefix_expert`: the prefix expert's layers and the patch embedding; `all`: every linear
 * layer (incl. pi0's state projection). Throws LoraError('bad_target') for an empty or unknown list.
 */
export function selectTargets(config: PolicyConfig, targets: readonly string[]): LinearSpec[] {
  if (targets.length === 0) throw new LoraError('bad_target', `targets is empty; choose from ${LORA_TARGETS.join(', ')}`);
  for (const t of targets) {
    if (!LORA_TARGETS.includes(t as LoraTarget)) {
      throw new LoraError('bad_target', `unknown LoRA target '${t}'; choose from ${LORA_TARGETS.join(', ')}`);
    }
  }
  return linearSpecs(config).filter((s) => targets.some((t) => matches(s, t as LoraTarget)));
}

/** What a LoRA target list must say about pi0.5's zero gates, as a field rule (see zeroGateRule). */
export const ZERO_GATE_RULE =
  "must include action_expert or all for LoRA on pi0.5 with seeded base weights: its adaptive-norm gates (the action expert's ada1/ada2 Linears) start at zero (adaLN-Zero), so adapters anywhere else get exactly zero gradient; or train in full";

/**
 * pi0.5's action-expert blocks scale their attention and MLP outputs by gates from the
 * adaptive-norm Linears (ada1, ada2), which the seeded base starts at zero (MODEL.md D3, as
 * DiT's adaLN-Zero). While those gates are zero nothing upstream of them reaches the velocity,
 * so adapters that leave the ada Linears frozen get exactly zero gradient, forever. A trained
 * base has open gates; callers that know the base is seeded (or read its ada weights) refuse.
 * @returns ZERO_GATE_RULE when `targets` on `config` leave every ada Linear out; null when they
 *   include them (action_expert, all) or the variant has none (pi0).
 */
export function zeroGateRule(config: PolicyConfig, targets: readonly string[]): string | null {
  if (config.variant !== 'pi05') return null;
  return selectTargets(config, targets).some((s) => /\.ada[12]$/.test(s.name)) ? null : ZERO_GATE_RULE;
}

/** Validates rank (integer >= 1) and alpha (finite > 0); throws LoraError. */
export function validateLora(rank: number, alpha: number): void {
  if (!Number.isInteger(rank) || rank < 1) throw new LoraError('bad_rank', `rank is ${rank}; it must be an integer >= 1`);
  if (!Number.isFinite(alpha) || alpha <= 0) throw new LoraError('bad_alpha', `alpha is ${alpha}; it must be a finite number > 0`);
}

/** Initial adapter values for the selected layers: `<name>.lora_a` [in, r] uniform ±1/sqrt(in),
 * `<name>.lora_b` [r, out] zeros. Drawn from `rng` in layer order. */
export function initialAdapters(specs: readonly LinearSpec[], rank: number, rng: Rng): Map<string, { shape: number[]; data: Float32Array }> {
  const out = new Map<string, { shape: number[]; data: Float32Array }>();
  for (const s of specs) {
    const bound = 1 / Math.sqrt(s.inDim);
    const a = new Float32Array(s.inDim * rank);
    for (let i = 0; i < a.length; i++) a[i] = (2 * rng.uniform() - 1) * bound;
    out.set(`${s.name}.lora_a`, { shape: [s.inDim, rank], data: a });
    out.set(`${s.name}.lora_b`, { shape: [rank, s.outDim], data: new Float32Array(rank * s.outDim) });
  }
  return out;
}
