/**
 * A real pi0 / pi0.5 fine-tune's output as a base checkpoint again: the Hub layout of
 * `lerobot/pi05_base` (server/models/hub-checkpoint.ts), so a new job, a session or LeRobot can
 * start from it. The folder holds
 *   config.json          the base's, with `type` set and the dataset's state / action shapes in
 *                        input_features / output_features (as LeRobot writes after a fine-tune)
 *   model.safetensors    every weight, LoRA merged in: W + (alpha / r) · (A · B)ᵀ
 *   tokenizer*.json      the base's tokenizer files (else the PaliGemma tokenizer in use)
 *   norm_stats.json      the dataset's stats (openpi's layout, Vela's file)
 *   vela_dataset.json    what the policy server needs besides: cameras, action space, names, ...
 *
 * Adapters are stored as the trainer keeps them (kernels/lora.ts): `<linear>.lora_a` [in, r] and
 * `<linear>.lora_b` [r, out], applied as x · A · B · scale; the weight is PyTorch's [out, in]
 * (x · Wᵀ), so the merge adds scale · Σ_k A[i, k] · B[k, o] to W[o, i].
 *
 * Memory: the base's float32 weights are read once on this thread (one model's worth, freed
 * tensor by tensor as they are written). The merge yields to the event loop every few million
 * multiply-adds, so the server keeps answering while a full-size model merges.
 */
import fs from 'node:fs';
import path from 'node:path';
import { loadCheckpoint } from '../../kernels/checkpoint.ts';
import { realPiConfigFromHub } from '../../kernels/pi/config.ts';
import { HUB_EXPERT_LM_HEAD_KEY } from '../../kernels/pi/keys.ts';
import { realPiLinears } from '../../kernels/pi/policy.ts';
import { readHubCheckpoint, readHubConfig, writeHubCheckpoint } from '../models/hub-checkpoint.ts';
import { tokenizerFileFor } from '../models/layout.ts';
import { VELA_DATASET_FILE } from './base.ts';

/** Multiply-adds between two yields to the event loop. */
const WORK_PER_YIELD = 4_000_000;
/** Tokenizer files copied from the base when it has them. */
const TOKENIZER_FILES = ['tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json', 'tokenizer.model'];

const yieldNow = () => new Promise<void>((r) => setImmediate(r));

/**
 * W [out, in] += scale · (A [in, r] · B [r, out])ᵀ, in place, yielding between row blocks.
 * @throws Error naming `name` when the shapes do not agree.
 */
export async function mergeLora(name: string, w: Float32Array, shape: readonly number[], a: { shape: number[]; data: Float32Array }, b: { shape: number[]; data: Float32Array }, scale: number): Promise<void> {
  const [out, inDim] = shape as [number, number];
  const [ai, r] = a.shape as [number, number];
  const [br, bo] = b.shape as [number, number];
  if (shape.length !== 2 || ai !== inDim || br !== r || bo !== out || w.length !== out * inDim) {
    throw new Error(`LoRA of ${name}: A [${a.shape}] and B [${b.shape}] do not fit the weight [${shape}]`);
  }
  const at = new Float32Array(r * inDim); // Aᵀ [r, in]: each rank's column of A made contiguous
  for (let i = 0; i < inDim; i++) for (let k = 0; k < r; k++) at[k * inDim + i] = a.data[i * r + k]!;
  let work = 0;
  for (let o = 0; o < out; o++) {
    const row = o * inDim;
    for (let k = 0; k < r; k++) {
      const coef = scale * b.data[k * out + o]!;
      if (coef === 0) continue;
      const ak = k * inDim;
      for (let i = 0; i < inDim; i++) w[row + i]! += coef * at[ak + i]!;
    }
    work += r * inDim;
    if (work >= WORK_PER_YIELD) {
      work = 0;
      await yieldNow();
    }
  }
}

export interface ExportHubOptions {
  /** The base checkpoint folder the job trained on (Hub layout). */
  baseDir: string;
  /** The job's final weights in Vela's layout (adapters, or every weight of a full fine-tune). */
  weightsDir: string;
  /** The folder to write (replaced when it exists: a resumed job writes it again). */
  outDir: string;
  /** The dataset's state and action dims, written into config.json's features. */
  stateDim: number;
  actionDim: number;
  /** norm_stats.json's text. */
  normStats: string;
  /** vela_dataset.json's content (the job's checkpointExtra). */
  dataset: Record<string, unknown>;
}

/**
 * Writes the Hub-layout folder of a finished real-model job (see the module comment), into a
 * temporary sibling renamed into place. Returns the folder and the bytes of model.safetensors.
 * @throws CheckpointError from the readers and writer (naming the file), Error for adapters that
 *   do not fit the base.
 */
export async function exportHubModel(o: ExportHubOptions): Promise<{ dir: string; weightBytes: number; merged: number }> {
  const baseConfig = await readHubConfig(o.baseDir);
  const c = realPiConfigFromHub(baseConfig);
  const base = await readHubCheckpoint(o.baseDir, c);
  const params = base.params!;
  const ck = await loadCheckpoint(o.weightsDir);
  const cfg = ck.config as Record<string, unknown>;
  let merged = 0;
  if (ck.weights) {
    // A full fine-tune: its weights replace the base's.
    for (const [name, t] of Object.entries(ck.weights)) {
      const p = params.get(name);
      if (!p || p.data.length !== t.data.length) throw new Error(`the job's weight ${name} [${t.shape}] is not a weight of the base [${p?.shape ?? 'absent'}]`);
      p.data = t.data;
    }
  }
  if (ck.adapter) {
    const rank = Number(cfg.lora_rank);
    const alpha = Number(cfg.lora_alpha);
    const actionRank = Number(cfg.lora_action_rank ?? rank);
    const actionAlpha = Number(cfg.lora_action_alpha ?? alpha);
    const tensors = ck.adapter.tensors;
    for (const s of realPiLinears(c)) {
      const a = tensors[`${s.name}.lora_a`];
      const b = tensors[`${s.name}.lora_b`];
      if (!a || !b) continue;
      const scale = s.expert === 'action' ? actionAlpha / actionRank : alpha / rank;
      const w = params.get(`${s.name}.weight`);
      if (!w) throw new Error(`the job adapts ${s.name}, whose weight the base lacks`);
      await mergeLora(s.name, w.data, w.shape, a, b, scale);
      merged++;
    }
    if (merged * 2 !== Object.keys(tensors).length) throw new Error(`the job's adapter has ${Object.keys(tensors).length} tensors; ${merged} linears of the base took ${merged * 2} of them`);
  }

  const features = (v: unknown) => (v && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : {});
  const config = {
    ...baseConfig,
    input_features: { ...features(baseConfig.input_features), 'observation.state': { type: 'STATE', shape: [o.stateDim] } },
    output_features: { ...features(baseConfig.output_features), action: { type: 'ACTION', shape: [o.actionDim] } },
  };
  const parent = path.dirname(o.outDir);
  await fs.promises.mkdir(parent, { recursive: true });
  const tmp = path.join(parent, `.${path.basename(o.outDir)}.export-${process.pid}-${Date.now()}`);
  try {
    const written = await writeHubCheckpoint(tmp, c, (name) => {
      const p = params.get(name)!;
      params.delete(name); // written once: its memory goes with it
      return p.data;
    }, { config, expertLmHead: base.skipped.some((s) => s.key === HUB_EXPERT_LM_HEAD_KEY) ? 'zeros' : 'omit' });
    const own = TOKENIZER_FILES.filter((f) => fs.existsSync(path.join(o.baseDir, f)));
    if (own.length > 0) for (const f of own) await fs.promises.copyFile(path.join(o.baseDir, f), path.join(tmp, f));
    else {
      // The public bases ship no tokenizer: the one in use (PaliGemma's, from the HF cache) travels with the output.
      const file = tokenizerFileFor(o.baseDir);
      await fs.promises.copyFile(file, path.join(tmp, 'tokenizer.json'));
      const beside = path.join(path.dirname(file), 'tokenizer_config.json');
      if (fs.existsSync(beside)) await fs.promises.copyFile(beside, path.join(tmp, 'tokenizer_config.json'));
    }
    await fs.promises.writeFile(path.join(tmp, 'norm_stats.json'), o.normStats);
    await fs.promises.writeFile(path.join(tmp, VELA_DATASET_FILE), `${JSON.stringify(o.dataset, null, 2)}\n`);
    await fs.promises.rm(o.outDir, { recursive: true, force: true });
    await fs.promises.rename(tmp, o.outDir);
    return { dir: o.outDir, weightBytes: written.bytes, merged };
  } catch (e) {
    await fs.promises.rm(tmp, { recursive: true, force: true }).catch(() => undefined);
    throw e;
  }
}
