/**
 * Reads and writes the real pi0 / pi0.5 in the Hugging Face Hub layout of `lerobot/pi0_base` /
 * `lerobot/pi05_base` (FACTS.md section 2): a folder with `config.json` (LeRobot's policy
 * config) and `model.safetensors`, or shards `model-0000i-of-0000n.safetensors` listed in
 * `model.safetensors.index.json`; tensors F32 or BF16 (F16 read too). The key rules are
 * kernels/pi/keys.ts.
 *
 * Streaming: a 14 GB file never sits in memory. Headers are read first and every key checked
 * against the model before any data (all mismatches reported at once); then each tensor's bytes
 * are read by positioned reads, in chunks, straight into one Float32Array (BF16 widened chunk
 * by chunk through a 16 MiB scratch buffer) and handed to the caller, so peak memory is the
 * float32 parameters the caller keeps plus the scratch. The unused expert LM head is never read.
 * Writing streams the same way, tensor by tensor, into a temporary folder renamed into place.
 */
import { open, readFile, stat } from 'node:fs/promises';
import path from 'node:path';
import { writeCheckpointDir } from '../../kernels/checkpoint.ts';
import {
  describeMismatch,
  HUB_EXPERT_LM_HEAD_KEY,
  paramToHubKey,
  piParamShapes,
  planHubLoad,
  type HubKeyPlan,
  type PiShapeConfig,
} from '../../kernels/pi/keys.ts';
import {
  CheckpointError,
  parseSafetensorsHeader,
  safetensorsHeaderLength,
  safetensorsLayout,
  f16BitsToF32,
  type SafetensorsDtype,
  type SafetensorsEntry,
  type SafetensorsSpec,
} from '../../kernels/safetensors.ts';

/** Bytes moved per read or write call (and the BF16 scratch size). */
const CHUNK_BYTES = 16 * 1024 * 1024;
export const HUB_WEIGHTS_FILE = 'model.safetensors';
export const HUB_INDEX_FILE = 'model.safetensors.index.json';
export const HUB_CONFIG_FILE = 'config.json';

/** A checkpoint whose tensors do not match the model; `plan` lists every mismatch. */
export class HubCheckpointError extends CheckpointError {
  readonly plan: HubKeyPlan;
  constructor(message: string, plan: HubKeyPlan) {
    super('tensor_mismatch', message);
    this.plan = plan;
  }
}

/** Receives each parameter once: float32, row-major, in the PyTorch-layout shape. */
export type TensorSink = (name: string, data: Float32Array, shape: number[]) => void | Promise<void>;

export interface ReadHubOptions {
  /** Called per parameter as it is read; without it the parameters are collected and returned. */
  onTensor?: TensorSink;
}

export interface HubCheckpoint {
  /** config.json as read. */
  config: Record<string, unknown>;
  /** The parameters, when no onTensor was given. */
  params: Map<string, { shape: number[]; data: Float32Array }> | null;
  /** File keys not read, with why (the expert LM head, a tied copy, LeRobot's strays). */
  skipped: { key: string; reason: string }[];
  /** Tensors read, by on-disk dtype. */
  dtypes: Partial<Record<SafetensorsDtype, number>>;
  /** Weight files read (one, or the shards). */
  files: string[];
}

interface FileTensor {
  file: string;
  entry: SafetensorsEntry;
  dataStart: number;
}

/** The weight files of a checkpoint folder: the single file, else the index's shards. */
async function weightFiles(dir: string): Promise<{ files: string[]; weightMap: Map<string, string> | null }> {
  const single = path.join(dir, HUB_WEIGHTS_FILE);
  if (await isFile(single)) return { files: [single], weightMap: null };
  const indexPath = path.join(dir, HUB_INDEX_FILE);
  if (!(await isFile(indexPath))) {
    throw new CheckpointError('missing_file', `${dir} has neither ${HUB_WEIGHTS_FILE} nor ${HUB_INDEX_FILE}`);
  }
  const index = parseJsonObject(await readFile(indexPath, 'utf8'), indexPath);
  const map = index.weight_map;
  if (map === null || typeof map !== 'object' || Array.isArray(map)) {
    throw new CheckpointError('bad_config', `${indexPath}: weight_map is ${JSON.stringify(map)}; expected an object of key -> shard file`);
  }
  const weightMap = new Map<string, string>();
  for (const [key, file] of Object.entries(map as Record<string, unknown>)) {
    if (typeof file !== 'string' || !/^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\.safetensors$/.test(file)) {
      throw new CheckpointError('bad_config', `${indexPath}: ${key} maps to ${JSON.stringify(file)}; expected a .safetensors file name in the folder`);
    }
    weightMap.set(key, file);
  }
  const files = [...new Set(weightMap.values())].sort().map((f) => path.join(dir, f));
  for (const f of files) if (!(await isFile(f))) throw new CheckpointError('missing_file', `${indexPath} lists ${path.basename(f)}, which is not in ${dir}`);
  return { files, weightMap };
}

/** Every tensor's location, from the headers only. */
async function indexTensors(dir: string): Promise<{ tensors: Map<string, FileTensor>; files: string[] }> {
  const { files, weightMap } = await weightFiles(dir);
  const tensors = new Map<string, FileTensor>();
  for (const file of files) {
    const fh = await open(file, 'r');
    try {
      const size = (await fh.stat()).size;
      const first = Buffer.alloc(8);
      await readFully(fh, first, 0, Math.min(8, size), file);
      const headerLen = safetensorsHeaderLength(first, size);
      const headerBytes = Buffer.alloc(headerLen);
      await readFully(fh, headerBytes, 8, headerLen, file);
      const header = parseSafetensorsHeader(headerBytes, size - 8 - headerLen);
      for (const entry of header.entries) {
        const prev = tensors.get(entry.name);
        if (prev) throw new CheckpointError('bad_header', `tensor ${entry.name} is in both ${path.basename(prev.file)} and ${path.basename(file)}`);
        if (weightMap && weightMap.get(entry.name) !== path.basename(file)) {
          throw new CheckpointError('bad_header', `tensor ${entry.name} is in ${path.basename(file)}; ${HUB_INDEX_FILE} puts it in ${weightMap.get(entry.name) ?? 'no shard'}`);
        }
        tensors.set(entry.name, { file, entry, dataStart: header.dataStart });
      }
    } finally {
      await fh.close();
    }
  }
  if (weightMap) {
    for (const [key, file] of weightMap) if (!tensors.has(key)) throw new CheckpointError('bad_header', `${HUB_INDEX_FILE} lists ${key} in ${file}, whose header does not have it`);
  }
  return { tensors, files };
}

/**
 * The tensors of a checkpoint folder (the single file or the index's shards) from the
 * safetensors headers only: no tensor data is read, so this is cheap at any size.
 * @throws CheckpointError 'missing_file' (no weights, a listed shard absent), 'bad_config' (index
 *   not a JSON object), 'bad_header' / 'bad_offsets' / 'too_large' (a bad header), 'io'.
 */
export async function readCheckpointHeaders(dir: string): Promise<{ files: string[]; tensors: { name: string; dtype: SafetensorsDtype; shape: number[]; file: string }[] }> {
  const { tensors, files } = await indexTensors(dir);
  return { files, tensors: [...tensors].map(([name, t]) => ({ name, dtype: t.entry.dtype, shape: t.entry.shape, file: t.file })) };
}

/**
 * Reads a Hub-layout checkpoint folder into float32 parameters for the model `cfg`, tensor by
 * tensor (see the module comment). Checks config.json's `type` against cfg.variant.
 * @throws HubCheckpointError ('tensor_mismatch') naming every missing, unexpected or misshapen
 *   tensor with its expected shape, before reading any data; CheckpointError 'missing_file'
 *   (no config.json, no weights, a listed shard absent), 'bad_config' (config.json or the index
 *   not JSON objects), 'wrong_preset' (config.json `type` is the other variant), 'bad_header' /
 *   'bad_offsets' / 'shape_mismatch' / 'too_large' (a bad safetensors header), 'bad_dtype' (a
 *   tensor neither F32, BF16 nor F16), 'io' (a read fails or the file is truncated).
 */
export async function readHubCheckpoint(dir: string, cfg: PiShapeConfig, opts: ReadHubOptions = {}): Promise<HubCheckpoint> {
  const config = await readHubConfig(dir);
  const type = config.type;
  if (type !== undefined && type !== cfg.variant) {
    throw new CheckpointError('wrong_preset', `${path.join(dir, HUB_CONFIG_FILE)} says type ${JSON.stringify(type)}; this model is ${cfg.variant}`);
  }
  const { tensors, files } = await indexTensors(dir);
  const plan = planHubLoad(new Map([...tensors].map(([k, t]) => [k, t.entry.shape])), cfg);
  const problem = describeMismatch(plan);
  if (problem) throw new HubCheckpointError(`checkpoint ${dir} does not fit ${cfg.variant}: ${problem}`, plan);
  for (const step of plan.load) {
    const dtype = tensors.get(step.key)!.entry.dtype;
    if (dtype !== 'F32' && dtype !== 'BF16' && dtype !== 'F16') {
      throw new CheckpointError('bad_dtype', `tensor ${step.key} is ${dtype}; a pi checkpoint holds F32, BF16 or F16`);
    }
  }

  const params = opts.onTensor ? null : new Map<string, { shape: number[]; data: Float32Array }>();
  const sink: TensorSink = opts.onTensor ?? ((name, data, shape) => void params!.set(name, { shape, data }));
  const dtypes: Partial<Record<SafetensorsDtype, number>> = {};
  const scratch = Buffer.allocUnsafe(CHUNK_BYTES);
  // Read in file order within each file: sequential reads are what a disk does best.
  const order = [...plan.load].sort((a, b) => {
    const ta = tensors.get(a.key)!;
    const tb = tensors.get(b.key)!;
    return ta.file.localeCompare(tb.file) || ta.entry.begin - tb.entry.begin;
  });
  let fh: Awaited<ReturnType<typeof open>> | null = null;
  let openFile = '';
  try {
    for (const step of order) {
      const t = tensors.get(step.key)!;
      if (t.file !== openFile) {
        await fh?.close();
        fh = null;
        fh = await open(t.file, 'r');
        openFile = t.file;
      }
      const data = await readTensor(fh!, t, scratch);
      dtypes[t.entry.dtype] = (dtypes[t.entry.dtype] ?? 0) + 1;
      await sink(step.name, data, step.shape);
    }
  } finally {
    await fh?.close();
  }
  return { config, params, skipped: plan.skipped, dtypes, files };
}

/** One tensor's data as float32: F32 read straight into the array, BF16/F16 widened per chunk. */
async function readTensor(fh: Awaited<ReturnType<typeof open>>, t: FileTensor, scratch: Buffer): Promise<Float32Array> {
  const n = t.entry.shape.reduce((a, b) => a * b, 1);
  const out = new Float32Array(n);
  const at = t.dataStart + t.entry.begin;
  if (t.entry.dtype === 'F32') {
    const bytes = new Uint8Array(out.buffer);
    for (let off = 0; off < bytes.length; off += CHUNK_BYTES) {
      await readFully(fh, bytes.subarray(off, Math.min(bytes.length, off + CHUNK_BYTES)), at + off, Math.min(CHUNK_BYTES, bytes.length - off), t.entry.name);
    }
    return out;
  }
  const out32 = new Uint32Array(out.buffer);
  const half = new Uint16Array(scratch.buffer, scratch.byteOffset, scratch.length / 2);
  const total = n * 2;
  for (let off = 0; off < total; off += CHUNK_BYTES) {
    const len = Math.min(CHUNK_BYTES, total - off);
    await readFully(fh, scratch, at + off, len, t.entry.name);
    const base = off / 2;
    const m = len / 2;
    if (t.entry.dtype === 'BF16') {
      for (let i = 0; i < m; i++) out32[base + i] = half[i]! << 16; // exact: bf16 is the top half of f32
    } else {
      for (let i = 0; i < m; i++) out[base + i] = f16BitsToF32(half[i]!);
    }
  }
  return out;
}

async function readFully(fh: Awaited<ReturnType<typeof open>>, into: Uint8Array, position: number, length: number, what: string): Promise<void> {
  let done = 0;
  while (done < length) {
    let r;
    try {
      r = await fh.read(into, done, length - done, position + done);
    } catch (e) {
      throw new CheckpointError('io', `reading ${what}: ${(e as Error).message}`);
    }
    if (r.bytesRead === 0) throw new CheckpointError('io', `reading ${what}: the file ends ${length - done} bytes early (truncated?)`);
    done += r.bytesRead;
  }
}

/**
 * config.json of a checkpoint folder.
 * @throws CheckpointError 'missing_file', 'bad_config' (not a JSON object).
 */
export async function readHubConfig(dir: string): Promise<Record<string, unknown>> {
  const file = path.join(dir, HUB_CONFIG_FILE);
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ENOENT' || code === 'ENOTDIR') throw new CheckpointError('missing_file', `${file} does not exist; a Hub checkpoint folder has config.json beside model.safetensors`);
    throw new CheckpointError('io', `reading ${file}: ${(e as Error).message}`);
  }
  return parseJsonObject(text, file);
}

/** Sizes and settings a written config.json records, beyond the shapes. */
export interface HubWriteConfig extends PiShapeConfig {
  /** Actions per chunk, LeRobot `chunk_size` (50). */
  actionHorizon?: number;
  /** Prompt token limit, LeRobot `tokenizer_max_length` (48 pi0 / 200 pi0.5). */
  maxTokenLen?: number;
  /** Denoising steps, LeRobot `num_inference_steps` (10). */
  numSteps?: number;
}

export interface WriteHubOptions {
  /** On-disk dtype (default 'F32', LeRobot's default; 'BF16' rounds to nearest even). */
  dtype?: 'F32' | 'BF16';
  /**
   * config.json to write, e.g. the one read from the base checkpoint (its fields are kept, and
   * `type` is set to the variant); default: LeRobot's PI0Config / PI05Config defaults.
   */
  config?: Record<string, unknown>;
  /** Split into shards of at most this many bytes (one tensor may exceed it alone) plus the index. */
  maxShardBytes?: number;
  /**
   * The expert's unused LM head [vocab, expert width]: 'zeros' (default) writes it, as the base
   * checkpoints hold it and openpi's strict loader wants it; 'omit' leaves it out.
   */
  expertLmHead?: 'zeros' | 'omit';
  /** Replace an existing folder (default false: CheckpointError 'exists'). */
  overwrite?: boolean;
}

/**
 * Gives a parameter's float32 values (row-major, PyTorch-layout shape), e.g. from a tf.Variable:
 * all at once, or as consecutive chunks (an iterable, e.g. a generator) so that a tensor larger
 * than memory allows (the full-size embedding, 526 M values) never exists whole.
 */
export type TensorSource = (name: string, shape: number[]) => TensorValues | Promise<TensorValues>;
export type TensorValues = Float32Array | Iterable<Float32Array> | AsyncIterable<Float32Array>;

/**
 * LeRobot's policy config for `cfg` with the dataclass defaults of FACTS.md 2.1 (what
 * `lerobot/pi0_base` / `pi05_base` carry, as far as the code defaults tell).
 */
export function defaultHubConfig(cfg: HubWriteConfig): Record<string, unknown> {
  const pi05 = cfg.variant === 'pi05';
  const horizon = cfg.actionHorizon ?? 50;
  const image = cfg.vision.imageSize;
  const camera = { type: 'VISUAL', shape: [3, image, image] };
  return {
    type: cfg.variant,
    paligemma_variant: 'gemma_2b',
    action_expert_variant: 'gemma_300m',
    dtype: 'float32',
    chunk_size: horizon,
    n_action_steps: horizon,
    max_state_dim: cfg.stateDim ?? 32,
    max_action_dim: cfg.actionDim,
    num_inference_steps: cfg.numSteps ?? 10,
    time_sampling_beta_alpha: 1.5,
    time_sampling_beta_beta: 1.0,
    time_sampling_scale: 0.999,
    time_sampling_offset: 0.001,
    min_period: 0.004,
    max_period: 4.0,
    image_resolution: [image, image],
    empty_cameras: 0,
    tokenizer_max_length: cfg.maxTokenLen ?? (pi05 ? 200 : 48),
    normalization_mapping: pi05
      ? { VISUAL: 'IDENTITY', STATE: 'QUANTILES', ACTION: 'QUANTILES' }
      : { VISUAL: 'IDENTITY', STATE: 'MEAN_STD', ACTION: 'MEAN_STD' },
    input_features: {
      'observation.images.base_0_rgb': camera,
      'observation.images.left_wrist_0_rgb': camera,
      'observation.images.right_wrist_0_rgb': camera,
      'observation.state': { type: 'STATE', shape: [cfg.stateDim ?? 32] },
    },
    output_features: { action: { type: 'ACTION', shape: [cfg.actionDim] } },
  };
}

/**
 * The tensors writeHubCheckpoint writes for `cfg`, in its order: Hub key, on-disk dtype, shape and
 * the parameter it holds (null: the expert's unused LM head, zeros). No values are made.
 */
export function hubCheckpointSpecs(cfg: PiShapeConfig, opts: Pick<WriteHubOptions, 'dtype' | 'expertLmHead'> = {}): (SafetensorsSpec & { param: string | null })[] {
  const dtype = opts.dtype ?? 'F32';
  const specs: (SafetensorsSpec & { param: string | null })[] = piParamShapes(cfg).map(([name, shape]) => ({ name: paramToHubKey(name), dtype, shape, param: name }));
  if ((opts.expertLmHead ?? 'zeros') === 'zeros') specs.push({ name: HUB_EXPERT_LM_HEAD_KEY, dtype, shape: [cfg.vlm.vocabSize, cfg.expert.width], param: null });
  return specs;
}

/** Bytes of the single model.safetensors writeHubCheckpoint writes for `specs` (header included). */
export function hubCheckpointFileBytes(specs: SafetensorsSpec[]): number {
  return safetensorsLayout(specs, { format: 'pt' }).fileBytes;
}

/**
 * Writes the model's parameters as a Hub-layout checkpoint folder `dir` (config.json plus
 * model.safetensors, or shards and the index), streaming tensor by tensor from `source`, into a
 * temporary folder renamed into place. Keys follow the base checkpoints (kernels/pi/keys.ts
 * paramToHubKey), so LeRobot and openpi load it as they load `lerobot/pi0_base`.
 * @throws CheckpointError 'shape_mismatch' (source gives the wrong number of values for a
 *   parameter, naming it and the shape), 'exists' (dir exists, overwrite off), 'bad_config'
 *   (maxShardBytes not a positive integer), 'io'.
 */
export async function writeHubCheckpoint(dir: string, cfg: HubWriteConfig, source: TensorSource, opts: WriteHubOptions = {}): Promise<{ files: string[]; bytes: number }> {
  const dtype = opts.dtype ?? 'F32';
  const item = dtype === 'F32' ? 4 : 2;
  const specs = hubCheckpointSpecs(cfg, opts);
  const shards: (typeof specs)[] = [];
  if (opts.maxShardBytes !== undefined) {
    if (!Number.isSafeInteger(opts.maxShardBytes) || opts.maxShardBytes < 1) throw new CheckpointError('bad_config', `maxShardBytes ${opts.maxShardBytes} is not a positive integer`);
    let cur: typeof specs = [];
    let curBytes = 0;
    for (const s of specs) {
      const b = s.shape.reduce((a, d) => a * d, 1) * item;
      if (cur.length > 0 && curBytes + b > opts.maxShardBytes) {
        shards.push(cur);
        cur = [];
        curBytes = 0;
      }
      cur.push(s);
      curBytes += b;
    }
    if (cur.length) shards.push(cur);
  } else {
    shards.push(specs);
  }
  const names = shards.length === 1 && opts.maxShardBytes === undefined
    ? [HUB_WEIGHTS_FILE]
    : shards.map((_, i) => `model-${String(i + 1).padStart(5, '0')}-of-${String(shards.length).padStart(5, '0')}.safetensors`);
  const config = { ...(opts.config ?? defaultHubConfig(cfg)), type: cfg.variant };
  const files: Record<string, string | ((file: string) => Promise<void>)> = { [HUB_CONFIG_FILE]: `${JSON.stringify(config, null, 2)}\n` };
  let bytes = 0;
  const weightMap: Record<string, string> = {};
  shards.forEach((shard, i) => {
    const layout = safetensorsLayout(shard, { format: 'pt' });
    bytes += layout.fileBytes;
    const params = new Map(shard.map((s) => [s.name, s.param]));
    for (const s of shard) weightMap[s.name] = names[i]!;
    files[names[i]!] = (file) => writeShard(file, layout, params, source, dtype);
  });
  if (names.length > 1 || opts.maxShardBytes !== undefined) {
    const dataBytes = shards.flat().reduce((a, s) => a + s.shape.reduce((x, d) => x * d, 1) * item, 0);
    files[HUB_INDEX_FILE] = `${JSON.stringify({ metadata: { total_size: dataBytes }, weight_map: weightMap }, null, 2)}\n`;
  }
  await writeCheckpointDir(dir, files, { overwrite: opts.overwrite });
  return { files: Object.keys(files), bytes };
}

async function writeShard(file: string, layout: ReturnType<typeof safetensorsLayout>, params: Map<string, string | null>, source: TensorSource, dtype: 'F32' | 'BF16'): Promise<void> {
  const fh = await open(file, 'wx');
  try {
    await writeFully(fh, layout.head, 0);
    const scratch = Buffer.alloc(CHUNK_BYTES);
    const half = new Uint16Array(scratch.buffer, scratch.byteOffset, scratch.length / 2);
    let pos = layout.head.length;
    for (const e of layout.entries) {
      const n = e.shape.reduce((a, b) => a * b, 1);
      const param = params.get(e.name)!;
      if (param === null) {
        // The unused expert LM head: zeros, from a zeroed scratch that is never reused for data.
        const zeros = Buffer.alloc(Math.min(CHUNK_BYTES, e.end - e.begin));
        for (let off = 0; off < e.end - e.begin; off += zeros.length) await writeFully(fh, zeros.subarray(0, Math.min(zeros.length, e.end - e.begin - off)), pos + off);
        pos += e.end - e.begin;
        continue;
      }
      const data = await source(param, e.shape);
      const mismatch = (got: number | string) => new CheckpointError('shape_mismatch', `parameter ${param} has ${got} values; its shape [${e.shape.join(', ')}] needs ${n} float32 values`);
      if (data instanceof Float32Array) {
        if (data.length !== n) throw mismatch(data.length);
        await writeValues(fh, data, pos, dtype, scratch, half);
      } else if (data !== null && typeof data === 'object' && (Symbol.iterator in data || Symbol.asyncIterator in data)) {
        let done = 0;
        for await (const chunk of data as AsyncIterable<Float32Array>) {
          if (!(chunk instanceof Float32Array)) throw mismatch('non-float32');
          if (done + chunk.length > n) throw mismatch(`more than ${done + chunk.length}`);
          await writeValues(fh, chunk, pos + done * (dtype === 'F32' ? 4 : 2), dtype, scratch, half);
          done += chunk.length;
        }
        if (done !== n) throw mismatch(done);
      } else {
        throw mismatch((data as { length?: unknown } | null)?.length as number);
      }
      pos += e.end - e.begin;
    }
    await fh.sync();
  } finally {
    await fh.close();
  }
}

/** Writes float32 `data` at byte `pos` of `fh` as `dtype` (BF16: rounded to nearest even, as torch does). */
async function writeValues(fh: Awaited<ReturnType<typeof open>>, data: Float32Array, pos: number, dtype: 'F32' | 'BF16', scratch: Buffer, half: Uint16Array): Promise<void> {
  const n = data.length;
  if (dtype === 'F32') {
    const b = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    for (let off = 0; off < b.length; off += CHUNK_BYTES) await writeFully(fh, b.subarray(off, Math.min(b.length, off + CHUNK_BYTES)), pos + off);
    return;
  }
  const u32 = new Uint32Array(data.buffer, data.byteOffset, data.length);
  for (let start = 0; start < n; start += half.length) {
    const m = Math.min(half.length, n - start);
    for (let i = 0; i < m; i++) {
      const x = u32[start + i]!;
      // Round to nearest even, as torch does; NaN stays a (quiet) NaN.
      half[i] = (x & 0x7fffffff) > 0x7f800000 ? ((x >>> 16) & 0x8000) | 0x7fc0 : ((x + 0x7fff + ((x >>> 16) & 1)) >>> 16) & 0xffff;
    }
    await writeFully(fh, scratch.subarray(0, m * 2), pos + start * 2);
  }
}

async function writeFully(fh: Awaited<ReturnType<typeof open>>, data: Uint8Array, position: number): Promise<void> {
  let done = 0;
  while (done < data.length) {
    const r = await fh.write(data, done, data.length - done, position + done);
    done += r.bytesWritten;
  }
}

async function isFile(p: string): Promise<boolean> {
  try {
    return (await stat(p)).isFile();
  } catch {
    return false;
  }
}

function parseJsonObject(text: string, file: string): Record<string, unknown> {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch (e) {
    throw new CheckpointError('bad_config', `${file} is not JSON: ${(e as Error).message}`);
  }
  if (v === null || typeof v !== 'object' || Array.isArray(v)) throw new CheckpointError('bad_config', `${file} is not a JSON object`);
  return v as Record<string, unknown>;
}
