/**
 * The configuration of the real pi0 / pi0.5 (PaliGemma + Gemma action expert; docs/MODEL.md "The
 * real pi0 / pi0.5"), validated and frozen. The model (kernels/pi/model.ts) and its parameter
 * table (kernels/pi/params.ts) are built from a RealPiConfig and nothing else.
 *
 * Axis legend used in shape comments across kernels/pi/:
 *   `b` batch, `nc` cameras, `c` colour channels (3), `S` image side (pixels), `g` patch grid side,
 *   `T` tokens per camera (g^2), `L` prompt tokens, `p` prefix tokens (nc * T + L), `s` suffix
 *   tokens (pi0: 1 + ah, pi0.5: ah), `n` tokens of a pass (queries), `k` keys, `ah` action
 *   horizon, `ad` action dim, `sd` state dim, `D` VLM width, `E` expert width, `Wv` vision
 *   width, `H` query heads, `G` key/value heads, `hd` head dim, `F` MLP width, `V` vocabulary.
 */
import { ConfigError } from '../errors.ts';

export { ConfigError };

/** pi0: the state is one suffix token, time enters the action tokens through an MLP.
 * pi05: the state is written into the prompt (as text, by the tokenizer), time conditions an
 * adaptive RMSNorm in every norm of the expert. */
export type RealPiVariant = 'pi0' | 'pi05';

/** One Gemma stack (FACTS 1.4 / 1.5). Attention is shared, so both stacks must agree on depth,
 * numHeads, numKvHeads and headDim. */
export interface GemmaDims {
  readonly width: number; // D (VLM) or E (expert)
  readonly depth: number; // layers
  readonly mlpDim: number; // F, GeGLU hidden width
  readonly numHeads: number; // H query heads
  readonly numKvHeads: number; // G key/value heads (1: multi-query attention)
  readonly headDim: number; // hd
}

/** The SigLIP vision tower (FACTS 1.2): conv patches, learned position embedding, pre-LN blocks. */
export interface VisionDims {
  readonly width: number; // Wv
  readonly depth: number;
  readonly mlpDim: number;
  readonly numHeads: number; // head dim = width / numHeads
  readonly patchSize: number; // pixels, square; the conv stride
  readonly imageSize: number; // S, pixels, square; a multiple of patchSize
}

/**
 * One configuration of the real pi0 / pi0.5 (FACTS.md section 1; section 5.2 for the tiny one):
 * the variant, the two Gemma experts' and SigLIP's dimensions, the action chunk and the prompt
 * budget. Built and validated by `makeRealPiConfig`; the presets below are frozen instances.
 */
export interface RealPiConfig {
  readonly variant: RealPiVariant;
  readonly vlm: GemmaDims & { readonly vocabSize: number };
  readonly expert: GemmaDims;
  readonly vision: VisionDims;
  /** ad: action dims the model sees (robot actions are zero-padded to it); 32 in the real models. */
  readonly actionDim: number;
  /** sd: pi0's state_proj input (LeRobot max_state_dim, robot state zero-padded to it); 32. */
  readonly stateDim: number;
  /** ah: actions per chunk (50 base; fine-tunes 10/15/16); no parameter depends on it. */
  readonly actionHorizon: number;
  /** L limit: prompt tokens incl. BOS and padding (48 pi0, 200 pi0.5). */
  readonly maxTokenLen: number;
  /** Euler steps of `sample` (10). */
  readonly numSteps: number;
}

/** What a caller gives: every field but stateDim (default 32). */
export type RealPiConfigInput = Omit<RealPiConfig, 'stateDim'> & { readonly stateDim?: number };

const GEMMA_2B = { width: 2048, depth: 18, mlpDim: 16384, numHeads: 8, numKvHeads: 1, headDim: 256, vocabSize: 257152 };
const GEMMA_300M = { width: 1024, depth: 18, mlpDim: 4096, numHeads: 8, numKvHeads: 1, headDim: 256 };
const SO400M_14 = { width: 1152, depth: 27, mlpDim: 4304, numHeads: 16, patchSize: 14, imageSize: 224 };
// FACTS 5.2: every structural feature at a CPU-friendly size (the parity vectors use horizon 10).
const TINY_VLM = { width: 64, depth: 4, mlpDim: 128, numHeads: 8, numKvHeads: 1, headDim: 16, vocabSize: 257152 };
const TINY_EXPERT = { width: 32, depth: 4, mlpDim: 64, numHeads: 8, numKvHeads: 1, headDim: 16 };
const TINY_VISION = { width: 32, depth: 2, mlpDim: 64, numHeads: 2, patchSize: 14, imageSize: 56 };

/** Upper bounds of each size field (far above the public models: the full pi0.5 is the reference). */
const LIMITS: Record<string, number> = {
  width: 65536, depth: 512, mlpDim: 262144, numHeads: 1024, numKvHeads: 1024, headDim: 4096, vocabSize: 1 << 22,
  patchSize: 1024, imageSize: 4096, actionDim: 4096, stateDim: 4096, actionHorizon: 4096, maxTokenLen: 16384, numSteps: 1000,
};

/**
 * A validated, frozen config (stateDim defaults to 32).
 * @throws ConfigError('bad_config') naming the field and its value: a non-positive size or one
 *   past its bound (LIMITS), an unknown variant, streams that disagree on depth / heads / head dim, heads not divisible by
 *   key/value heads, an odd head dim (RoPE rotates halves) or expert width (sin/cos time
 *   embedding), a patch size that does not divide the image size, vision heads not dividing
 *   the vision width.
 */
export function makeRealPiConfig(input: RealPiConfigInput): RealPiConfig {
  const c: RealPiConfig = {
    ...input,
    vlm: { ...input.vlm },
    expert: { ...input.expert },
    vision: { ...input.vision },
    stateDim: input.stateDim ?? 32,
  };
  if (c.variant !== 'pi0' && c.variant !== 'pi05') {
    throw new ConfigError('bad_config', `variant is '${String(c.variant)}'; expected 'pi0' or 'pi05'`);
  }
  const ints: [string, unknown][] = [
    ...Object.entries(c.vlm).map(([k, v]) => [`vlm.${k}`, v] as [string, unknown]),
    ...Object.entries(c.expert).map(([k, v]) => [`expert.${k}`, v] as [string, unknown]),
    ...Object.entries(c.vision).map(([k, v]) => [`vision.${k}`, v] as [string, unknown]),
    ['actionDim', c.actionDim], ['stateDim', c.stateDim], ['actionHorizon', c.actionHorizon], ['maxTokenLen', c.maxTokenLen], ['numSteps', c.numSteps],
  ];
  for (const [name, v] of ints) {
    if (typeof v !== 'number' || !Number.isInteger(v) || v <= 0) throw new ConfigError('bad_config', `${name} is ${String(v)}; it must be a positive integer`);
    // A config read from a checkpoint folder is data: sizes past these would only exhaust memory
    // (a parameter table of a million layers is built before any plan can refuse it).
    const max = LIMITS[name.split('.').pop()!] ?? 1 << 20;
    if (v > max) throw new ConfigError('bad_config', `${name} is ${v}; at most ${max} for a pi0 / pi0.5 config`);
  }
  for (const k of ['depth', 'numHeads', 'numKvHeads', 'headDim'] as const) {
    if (c.vlm[k] !== c.expert[k]) {
      throw new ConfigError('bad_config', `expert.${k} is ${c.expert[k]} but vlm.${k} is ${c.vlm[k]}; the two streams share one attention per layer, so they must be equal`);
    }
  }
  if (c.vlm.numHeads % c.vlm.numKvHeads !== 0) {
    throw new ConfigError('bad_config', `numHeads ${c.vlm.numHeads} is not a multiple of numKvHeads ${c.vlm.numKvHeads}`);
  }
  if (c.vlm.headDim % 2 !== 0) throw new ConfigError('bad_config', `headDim is ${c.vlm.headDim}; RoPE rotates two halves, so it must be even`);
  if (c.expert.width % 2 !== 0) throw new ConfigError('bad_config', `expert.width is ${c.expert.width}; the sin/cos time embedding needs an even width`);
  if (c.vision.imageSize % c.vision.patchSize !== 0) {
    throw new ConfigError('bad_config', `vision.patchSize ${c.vision.patchSize} does not divide vision.imageSize ${c.vision.imageSize}`);
  }
  if (c.vision.width % c.vision.numHeads !== 0) {
    throw new ConfigError('bad_config', `vision.numHeads ${c.vision.numHeads} does not divide vision.width ${c.vision.width}`);
  }
  Object.freeze(c.vlm);
  Object.freeze(c.expert);
  Object.freeze(c.vision);
  return Object.freeze(c);
}

/** T: SigLIP tokens per camera, (imageSize / patchSize)^2 (256 at 224 px, 16 in the tiny config). */
export function tokensPerCamera(c: RealPiConfig): number {
  const g = c.vision.imageSize / c.vision.patchSize;
  return g * g;
}

/** The full pi0 (lerobot/pi0_base): 3,238,048,528 parameters used in a forward pass. */
export const REAL_PI0: RealPiConfig = makeRealPiConfig({ variant: 'pi0', vlm: GEMMA_2B, expert: GEMMA_300M, vision: SO400M_14, actionDim: 32, actionHorizon: 50, maxTokenLen: 48, numSteps: 10 });
/** The full pi0.5 (lerobot/pi05_base): 3,353,433,872 parameters used in a forward pass. */
export const REAL_PI05: RealPiConfig = makeRealPiConfig({ variant: 'pi05', vlm: GEMMA_2B, expert: GEMMA_300M, vision: SO400M_14, actionDim: 32, actionHorizon: 50, maxTokenLen: 200, numSteps: 10 });
/** FACTS 5.2's tiny pi0 (horizon 10, as the parity vectors). */
export const REAL_PI_TINY_PI0: RealPiConfig = makeRealPiConfig({ variant: 'pi0', vlm: TINY_VLM, expert: TINY_EXPERT, vision: TINY_VISION, actionDim: 32, actionHorizon: 10, maxTokenLen: 48, numSteps: 10 });
/** FACTS 5.2's tiny pi0.5 (horizon 10, as the parity vectors). */
export const REAL_PI_TINY_PI05: RealPiConfig = makeRealPiConfig({ variant: 'pi05', vlm: TINY_VLM, expert: TINY_EXPERT, vision: TINY_VISION, actionDim: 32, actionHorizon: 10, maxTokenLen: 200, numSteps: 10 });

/**
 * The RealPiConfig a Hub checkpoint's config.json describes (LeRobot's PI0Config / PI05Config,
 * FACTS.md 2.1): `type` gives the variant; `paligemma_variant` "gemma_2b" and
 * `action_expert_variant` "gemma_300m" the two Gemmas (the only sizes the public checkpoints
 * have) with SigLIP So400m/14 at `image_resolution`; `chunk_size` the horizon,
 * `tokenizer_max_length`, `num_inference_steps`, `max_state_dim`, `max_action_dim` the rest.
 * A Vela-written checkpoint of another size (the tiny CI configuration) carries the whole
 * RealPiConfig in `vela_real_pi_config`, which then wins.
 * @throws ConfigError('bad_config') naming the field: no or an unknown `type`, a Gemma variant
 *   other than those two, a non-square or non-224 image resolution for SigLIP So400m, or a size
 *   that makeRealPiConfig refuses.
 */
export function realPiConfigFromHub(json: Record<string, unknown>): RealPiConfig {
  const own = json.vela_real_pi_config;
  if (own !== undefined) {
    if (own === null || typeof own !== 'object') throw new ConfigError('bad_config', `vela_real_pi_config is ${JSON.stringify(own)}; expected the RealPiConfig object`);
    return makeRealPiConfig(own as RealPiConfigInput);
  }
  const type = json.type;
  if (type !== 'pi0' && type !== 'pi05') throw new ConfigError('bad_config', `config.json type is ${JSON.stringify(type)}; a pi checkpoint says "pi0" or "pi05"`);
  const vlmName = json.paligemma_variant ?? 'gemma_2b';
  const expertName = json.action_expert_variant ?? 'gemma_300m';
  if (vlmName !== 'gemma_2b') throw new ConfigError('bad_config', `config.json paligemma_variant is ${JSON.stringify(vlmName)}; Vela reads "gemma_2b" (the public pi0 / pi0.5 checkpoints) or, for a checkpoint of another size, the whole RealPiConfig under "vela_real_pi_config" (docs/MODEL.md "Checkpoint config")`);
  if (expertName !== 'gemma_300m') throw new ConfigError('bad_config', `config.json action_expert_variant is ${JSON.stringify(expertName)}; Vela reads "gemma_300m" (the public pi0 / pi0.5 checkpoints) or, for a checkpoint of another size, the whole RealPiConfig under "vela_real_pi_config" (docs/MODEL.md "Checkpoint config")`);
  const res = json.image_resolution ?? [224, 224];
  if (!Array.isArray(res) || res.length !== 2 || res[0] !== 224 || res[1] !== 224) {
    throw new ConfigError('bad_config', `config.json image_resolution is ${JSON.stringify(res)}; SigLIP So400m/14 of the public checkpoints takes [224, 224]`);
  }
  const num = (k: string, def: number): number => {
    const v = json[k] ?? def;
    if (typeof v !== 'number') throw new ConfigError('bad_config', `config.json ${k} is ${JSON.stringify(v)}; expected a positive integer`);
    return v;
  };
  return makeRealPiConfig({
    variant: type, vlm: GEMMA_2B, expert: GEMMA_300M, vision: SO400M_14,
    actionDim: num('max_action_dim', 32), stateDim: num('max_state_dim', 32), actionHorizon: num('chunk_size', 50),
    maxTokenLen: num('tokenizer_max_length', type === 'pi05' ? 200 : 48), numSteps: num('num_inference_steps', 10),
  });
}
