/**
 * The real pi0 / pi0.5 parameters by name, and the map between the keys of a Hugging Face Hub
 * checkpoint (`lerobot/pi0_base`, `lerobot/pi05_base` and their fine-tunes) and those names
 * (FACTS.md sections 2.2-2.3). Pure data and string rules: the file I/O is
 * server/models/hub-checkpoint.ts.
 *
 * Parameter names are LeRobot's runtime state-dict names (`model.` prefix, transformers-5
 * SigLIP spelling without `vision_model.`), shapes in PyTorch layout (Linear weight [out, in],
 * patch conv [out, in, kh, kw]). The two LM heads are not parameters: the VLM's is the token
 * embedding again (tied), the expert's is unused.
 *
 * Hub key -> parameter, in order (a conversion table kept as rules, read top to bottom):
 *   1. a leading `model.` is dropped (LeRobot-saved fine-tunes carry it; the base repos do not);
 *   2. `paligemma_with_expert.gemma_expert.lm_head.weight` is skipped (unused expert LM head);
 *   3. `paligemma_with_expert.paligemma.lm_head.weight` is the token embedding when the file has
 *      no `...language_model.embed_tokens.weight`, else skipped (a tied copy);
 *   4. `vision_tower.vision_model.` -> `vision_tower.` (the converter's spelling; both accepted);
 *   5. pi0.5: `action_time_mlp_*` -> `time_mlp_*`; pi0: `time_mlp_*` -> `action_time_mlp_*`
 *      (old checkpoints swap them; LeRobot renames by variant);
 *   0. (first) `normalize_inputs.*`, `normalize_targets.*`, `unnormalize_outputs.*` are skipped:
 *      older LeRobot checkpoints keep the normalisation statistics among the weights;
 *   6. pi0.5: a stray `state_proj.*` or plain expert norm weight (`...gemma_expert.model.layers.N.
 *      {input,post_attention}_layernorm.weight`, `...gemma_expert.model.norm.weight`) is skipped, as
 *      LeRobot drops them (the pi0.5 expert's norms are adaptive, with `.dense` weights);
 *   7. `model.` + the key is the parameter name; anything else is unexpected.
 */

/** The sizes the parameter shapes depend on; `RealPiConfig` (kernels/pi/config.ts) has them all. */
export interface PiShapeConfig {
  variant: 'pi0' | 'pi05';
  vlm: { width: number; depth: number; mlpDim: number; numHeads: number; numKvHeads: number; headDim: number; vocabSize: number };
  expert: { width: number; depth: number; mlpDim: number; numHeads: number; numKvHeads: number; headDim: number };
  vision: { width: number; depth: number; mlpDim: number; patchSize: number; imageSize: number };
  /** Action dimension (32). */
  actionDim: number;
  /** pi0 state dimension (LeRobot `max_state_dim`, 32); defaults to 32. */
  stateDim?: number;
}

const PALI = 'model.paligemma_with_expert.paligemma.model';
const EXPERT = 'model.paligemma_with_expert.gemma_expert.model';
const VISION = `${PALI}.vision_tower`;

/** The token embedding's parameter name. */
export const EMBEDDING_PARAM = `${PALI}.language_model.embed_tokens.weight`;
/** Hub key under which the base checkpoints store the token embedding (the tied VLM LM head). */
export const HUB_EMBEDDING_KEY = 'paligemma_with_expert.paligemma.lm_head.weight';
/** Hub key of the action expert's LM head: stored in the base checkpoints, never used. */
export const HUB_EXPERT_LM_HEAD_KEY = 'paligemma_with_expert.gemma_expert.lm_head.weight';

/**
 * Every parameter of the model for `cfg`: [name, shape] in LeRobot's state-dict order, without
 * the two LM heads. At full size this is LeRobot's `PI0Policy` / `PI05Policy` state dict
 * (FACTS.md pi0_state_dict.json / pi05_state_dict.json) less those two heads: 776 / 811 tensors.
 */
export function piParamShapes(cfg: PiShapeConfig): [string, number[]][] {
  const out: [string, number[]][] = [];
  const add = (name: string, shape: number[]): void => void out.push([name, shape]);
  const v = cfg.vision;
  const vw = v.width;
  const grid = Math.floor(v.imageSize / v.patchSize);
  add(`${VISION}.embeddings.patch_embedding.weight`, [vw, 3, v.patchSize, v.patchSize]);
  add(`${VISION}.embeddings.patch_embedding.bias`, [vw]);
  add(`${VISION}.embeddings.position_embedding.weight`, [grid * grid, vw]);
  for (let i = 0; i < v.depth; i++) {
    const l = `${VISION}.encoder.layers.${i}`;
    add(`${l}.layer_norm1.weight`, [vw]);
    add(`${l}.layer_norm1.bias`, [vw]);
    for (const p of ['k_proj', 'v_proj', 'q_proj', 'out_proj']) {
      add(`${l}.self_attn.${p}.weight`, [vw, vw]);
      add(`${l}.self_attn.${p}.bias`, [vw]);
    }
    add(`${l}.layer_norm2.weight`, [vw]);
    add(`${l}.layer_norm2.bias`, [vw]);
    add(`${l}.mlp.fc1.weight`, [v.mlpDim, vw]);
    add(`${l}.mlp.fc1.bias`, [v.mlpDim]);
    add(`${l}.mlp.fc2.weight`, [vw, v.mlpDim]);
    add(`${l}.mlp.fc2.bias`, [vw]);
  }
  add(`${VISION}.post_layernorm.weight`, [vw]);
  add(`${VISION}.post_layernorm.bias`, [vw]);
  const w = cfg.vlm.width;
  add(`${PALI}.multi_modal_projector.linear.weight`, [w, vw]);
  add(`${PALI}.multi_modal_projector.linear.bias`, [w]);
  add(EMBEDDING_PARAM, [cfg.vlm.vocabSize, w]);
  const gemma = (prefix: string, g: PiShapeConfig['expert'], adaptive: boolean): void => {
    const q = g.numHeads * g.headDim;
    const kv = g.numKvHeads * g.headDim;
    const norm = (name: string): void => {
      if (adaptive) {
        add(`${name}.dense.weight`, [3 * g.width, cfg.expert.width]);
        add(`${name}.dense.bias`, [3 * g.width]);
      } else {
        add(`${name}.weight`, [g.width]);
      }
    };
    for (let i = 0; i < g.depth; i++) {
      const l = `${prefix}.layers.${i}`;
      add(`${l}.self_attn.q_proj.weight`, [q, g.width]);
      add(`${l}.self_attn.k_proj.weight`, [kv, g.width]);
      add(`${l}.self_attn.v_proj.weight`, [kv, g.width]);
      add(`${l}.self_attn.o_proj.weight`, [g.width, q]);
      add(`${l}.mlp.gate_proj.weight`, [g.mlpDim, g.width]);
      add(`${l}.mlp.up_proj.weight`, [g.mlpDim, g.width]);
      add(`${l}.mlp.down_proj.weight`, [g.width, g.mlpDim]);
      norm(`${l}.input_layernorm`);
      norm(`${l}.post_attention_layernorm`);
    }
    norm(`${prefix}.norm`);
  };
  gemma(`${PALI}.language_model`, cfg.vlm, false);
  gemma(EXPERT, cfg.expert, cfg.variant === 'pi05');
  const ew = cfg.expert.width;
  const a = cfg.actionDim;
  add('model.action_in_proj.weight', [ew, a]);
  add('model.action_in_proj.bias', [ew]);
  add('model.action_out_proj.weight', [a, ew]);
  add('model.action_out_proj.bias', [a]);
  if (cfg.variant === 'pi0') {
    add('model.state_proj.weight', [ew, cfg.stateDim ?? 32]);
    add('model.state_proj.bias', [ew]);
    add('model.action_time_mlp_in.weight', [ew, 2 * ew]);
    add('model.action_time_mlp_in.bias', [ew]);
    add('model.action_time_mlp_out.weight', [ew, ew]);
    add('model.action_time_mlp_out.bias', [ew]);
  } else {
    add('model.time_mlp_in.weight', [ew, ew]);
    add('model.time_mlp_in.bias', [ew]);
    add('model.time_mlp_out.weight', [ew, ew]);
    add('model.time_mlp_out.bias', [ew]);
  }
  return out;
}

/** What one Hub key is to the model. */
export type HubKeyRole =
  | { kind: 'param'; name: string }
  | { kind: 'skip'; reason: string }
  | { kind: 'unexpected' };

// LeRobot before its processor pipelines kept the dataset statistics as buffers in the weights.
const NORMALIZER_BUFFER = /^(normalize_inputs|normalize_targets|unnormalize_outputs)\./;
const STRAY_PI05 = /^paligemma_with_expert\.gemma_expert\.model\.(layers\.\d+\.(input|post_attention)_layernorm|norm)\.weight$/;

/**
 * Rules 1-7 of the module comment for one key. `fileHasEmbedding`: the file also holds
 * `...language_model.embed_tokens.weight` (then the VLM LM head is a tied copy, skipped).
 * `paramNames`: the model's parameter names (from piParamShapes).
 */
export function hubKeyRole(key: string, variant: PiShapeConfig['variant'], fileHasEmbedding: boolean, paramNames: ReadonlySet<string>): HubKeyRole {
  if (NORMALIZER_BUFFER.test(key)) return { kind: 'skip', reason: 'normalisation statistics of an older LeRobot checkpoint, not a weight' };
  let k = key.startsWith('model.') ? key.slice('model.'.length) : key;
  if (k === HUB_EXPERT_LM_HEAD_KEY) return { kind: 'skip', reason: 'the action expert has no token embedding; its LM head is unused' };
  if (k === HUB_EMBEDDING_KEY) {
    return fileHasEmbedding ? { kind: 'skip', reason: 'a tied copy of the token embedding, which the file also holds' } : { kind: 'param', name: EMBEDDING_PARAM };
  }
  k = k.replace('paligemma_with_expert.paligemma.model.vision_tower.vision_model.', 'paligemma_with_expert.paligemma.model.vision_tower.');
  if (variant === 'pi05') {
    k = k.replace(/^action_time_mlp_(in|out)\./, 'time_mlp_$1.');
    if (k.startsWith('state_proj.') || STRAY_PI05.test(k)) return { kind: 'skip', reason: 'pi0.5 has no state projection and adaptive expert norms; LeRobot drops this key too' };
  } else {
    k = k.replace(/^time_mlp_(in|out)\./, 'action_time_mlp_$1.');
  }
  const name = `model.${k}`;
  return paramNames.has(name) ? { kind: 'param', name } : { kind: 'unexpected' };
}

/** Whether a file's keys include the token embedding under its own name (with or without `model.`). */
export function hasEmbeddingKey(keys: Iterable<string>): boolean {
  const bare = EMBEDDING_PARAM.slice('model.'.length);
  for (const k of keys) if (k === EMBEDDING_PARAM || k === bare) return true;
  return false;
}

/** One file tensor to read into one parameter. */
export interface HubLoadStep {
  key: string;
  name: string;
  shape: number[];
}

/** How a file's tensors meet the model's parameters. */
export interface HubKeyPlan {
  /** Tensors to read, one per parameter. */
  load: HubLoadStep[];
  skipped: { key: string; reason: string }[];
  /** Parameters no file key supplies, with the shape expected. */
  missing: { name: string; shape: number[] }[];
  /** File keys that are no parameter (or a second key for one already supplied). */
  unexpected: { key: string; shape: number[]; why?: string }[];
  /** File keys for a parameter whose shape differs. */
  misshapen: { key: string; name: string; shape: number[]; expected: number[] }[];
}

/**
 * Matches a checkpoint's keys and shapes against the model for `cfg` (hubKeyRole for each key),
 * reporting every missing, unexpected and misshapen tensor at once.
 */
export function planHubLoad(fileShapes: ReadonlyMap<string, number[]>, cfg: PiShapeConfig): HubKeyPlan {
  const params = new Map(piParamShapes(cfg));
  const names = new Set(params.keys());
  const hasEmb = hasEmbeddingKey(fileShapes.keys());
  const plan: HubKeyPlan = { load: [], skipped: [], missing: [], unexpected: [], misshapen: [] };
  const supplied = new Map<string, string>();
  for (const [key, shape] of fileShapes) {
    const role = hubKeyRole(key, cfg.variant, hasEmb, names);
    if (role.kind === 'skip') {
      plan.skipped.push({ key, reason: role.reason });
      continue;
    }
    if (role.kind === 'unexpected') {
      plan.unexpected.push({ key, shape });
      continue;
    }
    const other = supplied.get(role.name);
    if (other !== undefined) {
      plan.unexpected.push({ key, shape, why: `${other} already supplies ${role.name}` });
      continue;
    }
    supplied.set(role.name, key);
    const expected = params.get(role.name)!;
    if (expected.length !== shape.length || expected.some((d, i) => d !== shape[i])) {
      plan.misshapen.push({ key, name: role.name, shape, expected });
      continue;
    }
    plan.load.push({ key, name: role.name, shape });
  }
  for (const [name, shape] of params) if (!supplied.has(name)) plan.missing.push({ name, shape });
  return plan;
}

/** One line naming every mismatch of a plan (the first `limit` of each kind), or null if none. */
export function describeMismatch(plan: HubKeyPlan, limit = 8): string | null {
  const parts: string[] = [];
  const list = <T>(items: T[], what: string, fmt: (t: T) => string): void => {
    if (items.length === 0) return;
    const shown = items.slice(0, limit).map(fmt).join('; ');
    parts.push(`${items.length} ${what}: ${shown}${items.length > limit ? `; and ${items.length - limit} more` : ''}`);
  };
  list(plan.missing, 'missing', (m) => `${m.name} (expected [${m.shape.join(', ')}])`);
  list(plan.misshapen, 'misshapen', (m) => `${m.key} is [${m.shape.join(', ')}], expected [${m.expected.join(', ')}] for ${m.name}`);
  list(plan.unexpected, 'unexpected', (u) => `${u.key} [${u.shape.join(', ')}]${u.why ? ` (${u.why})` : ''}`);
  return parts.length ? parts.join(' | ') : null;
}

/**
 * The Hub key under which a parameter is written back, in the base checkpoints' layout (no
 * `model.` prefix, SigLIP under `vision_model.`, the embedding as the VLM LM head), so LeRobot's
 * and openpi's loaders read a Vela checkpoint as they read `lerobot/pi0_base`.
 */
export function paramToHubKey(name: string): string {
  if (name === EMBEDDING_PARAM) return HUB_EMBEDDING_KEY;
  const bare = name.startsWith('model.') ? name.slice('model.'.length) : name;
  return bare.replace('paligemma_with_expert.paligemma.model.vision_tower.', 'paligemma_with_expert.paligemma.model.vision_tower.vision_model.');
}
