/**
 * A real pi0 / pi0.5 fine-tune's output as a base checkpoint again: the Hub layout of
 * `lerobot/pi05_base` (server/models/hub-checkpoint.ts), so a new job, a session or LeRobot can
 * start from it. The folder holds
 *   config.json          the base's, with `type` set and the dataset's state / action shapes in
 *                        input_features / output_features (as LeRobot writes after a fine-tune)
 *   model.safetensors    every weight, LoRA merged in: W + (alpha / r) · (A · B)ᵀ; the
 *                        parameters a LoRA job trained in full (the action / state / time
 *                        projections, PEFT's modules_to_save in the adapter file) replace the base's
 *   tokenizer*.json      the base's tokenizer files (else the PaliGemma tokenizer in use)
 *   norm_stats.json      the dataset's stats (openpi's layout, Vela's file)
 *   vela_dataset.json    what the policy server needs besides: cameras, action space, names, ...
 *
 * Adapters are stored as the trainer keeps them (kernels/lora.ts): `<linear>.lora_a` [in, r] and
 * `<linear>.lora_b` [r, out], applied as x · A · B · scale; the weight is PyTorch's [out, in]
 * (x · Wᵀ), so the merge adds scale · Σ_k A[i, k] · B[k, o] to W[o, i].
 *
 * Memory: the base streams through, tensor by tensor: its reader runs ahead of the writer by at
 * most 256 MiB plus one tensor (more only when the two files order their tensors differently;
 * the largest, PaliGemma's embedding, is 2.1 GB in float32); the job's
 * adapters (or, for a full fine-tune, its weights) are held whole. The merge yields to the event
 * loop every million multiply-adds (p99 loop delay 11 ms, max 33 ms measured exporting a 343 MB
 * model with 56 adapters on this CPU), so the server keeps answering while a full-size model
 * merges.
 */
import fs from 'node:fs';
import path from 'node:path';
import { loadCheckpoint } from '../../kernels/checkpoint.ts';
import { realPiConfigFromHub } from '../../kernels/pi/config.ts';
import { HUB_EXPERT_LM_HEAD_KEY } from '../../kernels/pi/keys.ts';
import { realPiLinears } from '../../kernels/pi/policy.ts';
import { realPiParamSpecs } from '../../kernels/pi/params.ts';
import { HUB_INDEX_FILE, HUB_WEIGHTS_FILE, readHubCheckpoint, readHubConfig, writeHubCheckpoint } from '../models/hub-checkpoint.ts';
import { parseSafetensorsHeader, safetensorsHeaderLength } from '../../kernels/safetensors.ts';
import { tokenizerFileFor } from '../models/layout.ts';
import { VELA_DATASET_FILE } from './base.ts';

/** Multiply-adds between two yields to the event loop. */
const WORK_PER_YIELD = 1_000_000;
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
  /** Base bytes read ahead of the writer before the reader waits (default 256 MiB). */
  bufferBytes?: number;
}

/**
 * Writes the Hub-layout folder of a finished real-model job (see the module comment), into a
 * temporary sibling renamed into place. Returns the folder and the bytes of model.safetensors.
 * @throws CheckpointError from the readers and writer (naming the file), Error for adapters that
 *   do not fit the base.
 */
export async function exportHubModel(o: ExportHubOptions): Promise<{ dir: string; weightBytes: number; merged: number; replaced: number; peakBufferedBytes: number }> {
  const baseConfig = await readHubConfig(o.baseDir);
  const c = realPiConfigFromHub(baseConfig);
  const ck = await loadCheckpoint(o.weightsDir);
  const cfg = ck.config as Record<string, unknown>;
  // Each adapted weight's factors and scale (alpha / r, per expert), by the weight's name.
  const adapters = new Map<string, { a: { shape: number[]; data: Float32Array }; b: { shape: number[]; data: Float32Array }; scale: number; linear: string }>();
  // A LoRA job's parameters trained in full (stored beside the adapters under their own names).
  let trainedFull: Record<string, { shape: number[]; data: Float32Array }> | null = null;
  if (ck.adapter) {
    const rank = Number(cfg.lora_rank);
    const alpha = Number(cfg.lora_alpha);
    const actionRank = Number(cfg.lora_action_rank ?? rank);
    const actionAlpha = Number(cfg.lora_action_alpha ?? alpha);
    const tensors = ck.adapter.tensors;
    for (const s of realPiLinears(c)) {
      const a = tensors[`${s.name}.lora_a`];
      const b = tensors[`${s.name}.lora_b`];
      if (a && b) adapters.set(`${s.name}.weight`, { a, b, scale: s.expert === 'action' ? actionAlpha / actionRank : alpha / rank, linear: s.name });
    }
    const shapes = new Map(realPiParamSpecs(c).map((s) => [s.name, s.shape]));
    trainedFull = {};
    for (const [name, t] of Object.entries(tensors)) {
      if (/\.lora_[ab]$/.test(name)) continue;
      const shape = shapes.get(name);
      if (!shape) continue; // counted below: neither an adapter nor a parameter of the base
      if (shape.join() !== t.shape.join()) throw new Error(`the job's adapter file holds ${name} [${t.shape}]; the base's is [${shape}]`);
      trainedFull[name] = t;
    }
    const used = adapters.size * 2 + Object.keys(trainedFull).length;
    if (used !== Object.keys(tensors).length) throw new Error(`the job's adapter has ${Object.keys(tensors).length} tensors; ${adapters.size} linears of the base took ${adapters.size * 2} of them and ${Object.keys(trainedFull).length} are base parameters trained in full`);
  }
  const full = ck.weights ?? null; // a full fine-tune: its weights replace the base's
  let replaced = 0;

  const features = (v: unknown) => (v && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : {});
  const config = {
    ...baseConfig,
    input_features: { ...features(baseConfig.input_features), 'observation.state': { type: 'STATE', shape: [o.stateDim] } },
    output_features: { ...features(baseConfig.output_features), action: { type: 'ACTION', shape: [o.actionDim] } },
  };
  const lmHead = (await hubKeys(o.baseDir)).has(HUB_EXPERT_LM_HEAD_KEY) ? 'zeros' : 'omit';
  const parent = path.dirname(o.outDir);
  await fs.promises.mkdir(parent, { recursive: true });
  const tmp = path.join(parent, `.${path.basename(o.outDir)}.export-${process.pid}-${Date.now()}`);
  // The base streams in as the writer streams out (both in the safetensors order: dtype, then
  // name), so what waits between them stays small when the orders agree.
  const meet = new Rendezvous(o.bufferBytes ?? BUFFER_BYTES);
  let merged = 0;
  try {
    const reading = readHubCheckpoint(o.baseDir, c, { onTensor: (name, data, shape) => meet.put(name, data, shape) }).then(() => meet.end(), (e) => meet.fail(e));
    const written = await writeHubCheckpoint(tmp, c, async (name) => {
      const w = await meet.take(name);
      const own = full?.[name];
      if (full && (!own || own.data.length !== w.data.length)) throw new Error(`the job's weights lack ${name} [${w.shape}] or give it another shape`);
      const trained = trainedFull?.[name];
      if (trained) replaced++;
      const data = own ? own.data : trained ? trained.data.slice() : w.data;
      const ad = adapters.get(name);
      if (ad) {
        await mergeLora(ad.linear, data, w.shape, ad.a, ad.b, ad.scale);
        merged++;
      }
      return data;
    }, { config, expertLmHead: lmHead }).catch((e) => {
      meet.fail(e); // the reader stops at its next tensor
      throw e;
    });
    await reading;
    if (merged !== adapters.size) throw new Error(`merged ${merged} of the job's ${adapters.size} adapters`);
    const fullCount = Object.keys(trainedFull ?? {}).length;
    if (replaced !== fullCount) throw new Error(`wrote ${replaced} of the job's ${fullCount} parameters trained in full`);
    const own = TOKENIZER_FILES.filter((f) => fs.existsSync(path.join(o.baseDir, f)));
    if (own.length > 0) for (const f of own) await fs.promises.copyFile(path.join(o.baseDir, f), path.join(tmp, f));
    else {
      // No tokenizer.json at the base root (the public bases ship none: PaliGemma's from the HF cache; LeRobot's keep theirs in tokenizer/): the one in use travels with the output.
      const file = tokenizerFileFor(o.baseDir);
      await fs.promises.copyFile(file, path.join(tmp, 'tokenizer.json'));
      const beside = path.join(path.dirname(file), 'tokenizer_config.json');
      if (fs.existsSync(beside)) await fs.promises.copyFile(beside, path.join(tmp, 'tokenizer_config.json'));
    }
    await fs.promises.writeFile(path.join(tmp, 'norm_stats.json'), o.normStats);
    await fs.promises.writeFile(path.join(tmp, VELA_DATASET_FILE), `${JSON.stringify(o.dataset, null, 2)}\n`);
    await fs.promises.rm(o.outDir, { recursive: true, force: true });
    await fs.promises.rename(tmp, o.outDir);
    return { dir: o.outDir, weightBytes: written.bytes, merged, replaced, peakBufferedBytes: meet.peakBytes };
  } catch (e) {
    await fs.promises.rm(tmp, { recursive: true, force: true }).catch(() => undefined);
    throw e;
  }
}

/** Default bytes of base tensors read ahead of the writer before the reader waits for it. */
const BUFFER_BYTES = 256 * 2 ** 20;

type Tensor = { shape: number[]; data: Float32Array };

/**
 * Hands tensors from the base's reader to the output's writer. The reader waits while more than
 * `limit` bytes are buffered and the writer has something buffered to take; it never waits while
 * the writer waits for a tensor not read yet (the orders may differ: then the buffer grows).
 */
class Rendezvous {
  private buffer = new Map<string, Tensor>();
  private bytes = 0;
  peakBytes = 0;
  private wanted: { name: string; wake: () => void } | null = null;
  private readerWake: (() => void) | null = null;
  private ended = false;
  private error: Error | null = null;
  constructor(private limit: number) {}

  async put(name: string, data: Float32Array, shape: number[]): Promise<void> {
    if (this.error) throw this.error;
    this.buffer.set(name, { shape, data });
    this.bytes += data.byteLength;
    this.peakBytes = Math.max(this.peakBytes, this.bytes);
    if (this.wanted?.name === name) this.wanted.wake();
    while (!this.error && this.bytes > this.limit && !(this.wanted && !this.buffer.has(this.wanted.name))) {
      await new Promise<void>((r) => (this.readerWake = r));
    }
    if (this.error) throw this.error;
  }

  async take(name: string): Promise<Tensor> {
    while (!this.buffer.has(name)) {
      if (this.error) throw this.error;
      if (this.ended) throw new Error(`the base has no tensor ${name}`);
      await new Promise<void>((wake) => {
        this.wanted = { name, wake };
        this.wakeReader(); // it may be waiting for room: the writer needs what it has not read
      });
      this.wanted = null;
    }
    const t = this.buffer.get(name)!;
    this.buffer.delete(name);
    this.bytes -= t.data.byteLength;
    this.wakeReader();
    return t;
  }

  end(): void {
    this.ended = true;
    this.wanted?.wake();
  }

  fail(e: Error): void {
    this.error ??= e;
    this.wanted?.wake();
    this.wakeReader();
  }

  private wakeReader(): void {
    const w = this.readerWake;
    this.readerWake = null;
    w?.();
  }
}

/** The tensor keys of a Hub checkpoint folder, from its index or its one file's header. */
async function hubKeys(dir: string): Promise<Set<string>> {
  const index = path.join(dir, HUB_INDEX_FILE);
  if (fs.existsSync(index)) return new Set(Object.keys((JSON.parse(await fs.promises.readFile(index, 'utf8')) as { weight_map?: object }).weight_map ?? {}));
  const fh = await fs.promises.open(path.join(dir, HUB_WEIGHTS_FILE), 'r');
  try {
    const size = (await fh.stat()).size;
    const first = Buffer.alloc(8);
    await fh.read(first, 0, 8, 0);
    const n = safetensorsHeaderLength(first, size);
    const header = Buffer.alloc(n);
    await fh.read(header, 0, n, 8);
    return new Set(parseSafetensorsHeader(header, size - 8 - n).entries.map((e) => e.name));
  } finally {
    await fh.close();
  }
}
