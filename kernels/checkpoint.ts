/**
 * Checkpoint folders (PROTOCOL.md section 4), written atomically: files go into a temporary
 * sibling folder (`.<name>.tmp-<pid>-<random>`, a name no valid checkpoint name can take), each
 * is fsynced, then the folder, then it is renamed to its final name and the parent is fsynced.
 * A crash at any point leaves either no folder under the final name or a complete one.
 * Overwriting renames the old folder away (`.<name>.old-...`), renames the new one in, then
 * removes the old; a crash between the two renames leaves the old folder under its `.old` name.
 *
 * Layout:
 *   config.json                 preset, sizes, action_horizon, camera slots, finetune, LoRA ...
 *   model.safetensors           full weights (F32), and/or
 *   adapter_model.safetensors   LoRA tensors (F32) + adapter_config.json
 *   norm_stats.json             openpi layout (kernels/normalize.ts), where known
 *   optimizer.safetensors       a saved state: AdamW moments (`<param>.exp_avg`, `.exp_avg_sq`)
 *   trainer_state.json            + step, RNG state, ...
 */
import { randomBytes } from 'node:crypto';
import { mkdir, open, readFile, readdir, rename, rm, stat } from 'node:fs/promises';
import path from 'node:path';
import { normStatsToJson, parseNormStats, type NormStatsSet } from './normalize.ts';
import { CheckpointError, decodeSafetensors, encodeSafetensors, type SafeTensor, type SafetensorsContent } from './safetensors.ts';

export { CheckpointError, type CheckpointErrorCode } from './safetensors.ts';

/** config.json. Only `preset` is required here; the model defines the rest (snake_case). */
export interface CheckpointConfig {
  preset: string;
  [key: string]: unknown;
}

/** Float32 tensors by name, row-major (the form of AdamWMoments.export().tensors). */
export type NamedTensors = Record<string, { shape: number[]; data: Float32Array }>;

/** What a checkpoint holds; see the layout in the module comment. */
export interface CheckpointContent {
  config: CheckpointConfig;
  weights?: NamedTensors;
  adapter?: { tensors: NamedTensors; config: Record<string, unknown> };
  optimizer?: NamedTensors;
  trainerState?: { step: number; [key: string]: unknown };
  normStats?: NormStatsSet;
}

export interface WriteOptions {
  /** Replace an existing folder of that name (default false: CheckpointError 'exists'). */
  overwrite?: boolean;
  /**
   * For tests: replaces the durable write of one file (open, write, fsync, close), e.g. to
   * simulate a crash mid-write.
   */
  writeFile?: (file: string, data: Uint8Array) => Promise<void>;
}

const FILE_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

async function durableWrite(file: string, data: Uint8Array): Promise<void> {
  const fh = await open(file, 'wx');
  try {
    await fh.writeFile(data);
    await fh.sync();
  } finally {
    await fh.close();
  }
}

/** fsync of a folder so that the names in it are durable; platforms without it are skipped. */
async function syncDir(dir: string): Promise<void> {
  let fh;
  try {
    fh = await open(dir, 'r');
    await fh.sync();
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code !== 'EISDIR' && code !== 'EPERM' && code !== 'EINVAL' && code !== 'EBADF') throw err;
  } finally {
    await fh?.close();
  }
}

async function exists(p: string): Promise<boolean> {
  try {
    await stat(p);
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return false;
    throw err;
  }
}

function ioError(what: string, err: unknown): CheckpointError {
  if (err instanceof CheckpointError) return err;
  return new CheckpointError('io', `${what}: ${(err as Error).message}`);
}

/**
 * A file's content for writeCheckpointDir: bytes, a string written as UTF-8, or a function that
 * writes the file itself at the path given (creating it, writing and fsyncing it), for files
 * too large to hold in memory at once.
 */
export type CheckpointFileContent = Uint8Array | string | ((file: string) => Promise<void>);

/**
 * Writes `files` (name -> content, see CheckpointFileContent) as the folder `dir`, atomically
 * (see the module comment). File names are plain (`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`).
 * Throws CheckpointError: 'exists' when `dir` exists and overwrite is off; 'bad_config' for a
 * bad file name; 'io' when the filesystem fails (the temporary folder is then removed).
 */
export async function writeCheckpointDir(dir: string, files: Record<string, CheckpointFileContent>, opts: WriteOptions = {}): Promise<void> {
  const target = path.resolve(dir);
  const parent = path.dirname(target);
  const base = path.basename(target);
  for (const name of Object.keys(files)) {
    if (!FILE_NAME.test(name)) throw new CheckpointError('bad_config', `checkpoint file name '${name}' is not a plain file name`);
  }
  if (!opts.overwrite && (await exists(target))) {
    throw new CheckpointError('exists', `checkpoint ${target} exists; pass overwrite to replace it`);
  }
  const tag = `${process.pid}-${randomBytes(4).toString('hex')}`;
  const tmp = path.join(parent, `.${base}.tmp-${tag}`);
  const write = opts.writeFile ?? durableWrite;
  try {
    await mkdir(parent, { recursive: true });
    await mkdir(tmp);
    for (const [name, content] of Object.entries(files)) {
      if (typeof content === 'function') await content(path.join(tmp, name));
      else await write(path.join(tmp, name), typeof content === 'string' ? Buffer.from(content, 'utf8') : content);
    }
    await syncDir(tmp);
  } catch (err) {
    await rm(tmp, { recursive: true, force: true }).catch(() => undefined);
    throw ioError(`writing checkpoint ${target}`, err);
  }

  let old: string | undefined;
  try {
    if (await exists(target)) {
      if (!opts.overwrite) throw new CheckpointError('exists', `checkpoint ${target} exists; pass overwrite to replace it`);
      old = path.join(parent, `.${base}.old-${tag}`);
      await rename(target, old);
    }
    // rename(2) onto an existing non-empty folder fails, so a concurrent writer cannot be clobbered.
    await rename(tmp, target);
    await syncDir(parent);
  } catch (err) {
    await rm(tmp, { recursive: true, force: true }).catch(() => undefined);
    if (old && !(await exists(target))) await rename(old, target).catch(() => undefined);
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOTEMPTY' || code === 'EEXIST') {
      throw new CheckpointError('exists', `checkpoint ${target} appeared while writing; not replaced`);
    }
    throw ioError(`installing checkpoint ${target}`, err);
  }
  if (old) await rm(old, { recursive: true, force: true });
}

/**
 * Reads every regular file (or link to one) of a checkpoint folder and parses config.json. Throws
 * CheckpointError: 'missing_file' (no folder or no config.json), 'bad_config' (config.json not
 * a JSON object with a string `preset`), 'io'.
 */
export async function readCheckpointDir(dir: string): Promise<{ config: CheckpointConfig; files: Record<string, Uint8Array> }> {
  let names: string[];
  try {
    // A symlink to a file counts: a checkpoint in the Hugging Face cache (huggingface_hub's
    // snapshot_download) is a folder of links into blobs/.
    const entries = await readdir(dir, { withFileTypes: true });
    const isFile = async (e: (typeof entries)[number]) => e.isFile() || (e.isSymbolicLink() && (await stat(path.join(dir, e.name)).then((s) => s.isFile(), () => false)));
    names = [];
    for (const e of entries) if (await isFile(e)) names.push(e.name);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') throw new CheckpointError('missing_file', `checkpoint ${dir} does not exist`);
    throw ioError(`reading checkpoint ${dir}`, err);
  }
  if (!names.includes('config.json')) throw new CheckpointError('missing_file', `checkpoint ${dir} has no config.json`);
  const files: Record<string, Uint8Array> = {};
  for (const name of names) {
    try {
      files[name] = new Uint8Array(await readFile(path.join(dir, name)));
    } catch (err) {
      throw ioError(`reading ${path.join(dir, name)}`, err);
    }
  }
  return { config: parseConfig(files['config.json']!, dir), files };
}

function parseJson(bytes: Uint8Array, what: string): unknown {
  try {
    return JSON.parse(Buffer.from(bytes).toString('utf8'));
  } catch (err) {
    throw new CheckpointError('bad_config', `${what} is not JSON: ${(err as Error).message}`);
  }
}

function parseConfig(bytes: Uint8Array, dir: string): CheckpointConfig {
  const config = parseJson(bytes, `${dir}/config.json`) as CheckpointConfig | null;
  if (!config || typeof config !== 'object' || Array.isArray(config) || typeof config.preset !== 'string') {
    throw new CheckpointError('bad_config', `${dir}/config.json has no string "preset"`);
  }
  return config;
}

/**
 * Preset names a stored config.json may hold from before issue 23, as the presets they named
 * (kernels/small/config.ts PRESET_ALIASES and LEGACY_BARE_NAMES; kept here as data so the shared
 * checkpoint code does not import a model family). `+custom` marks overridden sizes and is kept.
 */
const STORED_PRESET_NAMES: Record<string, string> = {
  pi0: 'flow0-small', pi05: 'flow05-small',
  'pi0-tiny': 'flow0-tiny', 'pi05-tiny': 'flow05-tiny', 'pi0-small': 'flow0-small', 'pi05-small': 'flow05-small',
};
const canonicalPreset = (p: string): string => {
  const custom = p.endsWith('+custom') ? '+custom' : '';
  const bare = custom ? p.slice(0, -custom.length) : p;
  return (STORED_PRESET_NAMES[bare] ?? bare) + custom;
};

/**
 * Refuses a checkpoint made for another model. The preset is compared first, old names as the
 * presets they named (`pi0-tiny` equals `flow0-tiny`, a stored bare `pi05` equals `flow05-small`):
 * CheckpointError('wrong_preset', "checkpoint is for preset flow0-tiny; this session runs
 * flow05-tiny"). Every other key of `expected` must equal the config's (JSON equality):
 * CheckpointError('bad_config') naming the key and both values.
 */
export function checkCompatible(config: CheckpointConfig, expected: { preset: string; [key: string]: unknown }): void {
  if (canonicalPreset(config.preset) !== canonicalPreset(expected.preset)) {
    throw new CheckpointError('wrong_preset', `checkpoint is for preset ${config.preset}; this session runs ${expected.preset}`);
  }
  for (const [key, want] of Object.entries(expected)) {
    if (key === 'preset') continue;
    const have = JSON.stringify(config[key]);
    if (have !== JSON.stringify(want)) {
      throw new CheckpointError('bad_config', `checkpoint has ${key} ${have ?? 'missing'}; this session has ${JSON.stringify(want)}`);
    }
  }
}

/** Float32 tensors as safetensors entries of `dtype` (F16 / BF16 round to nearest even). */
function toSafeTensors(tensors: NamedTensors, dtype: 'F32' | 'BF16' | 'F16' = 'F32'): Record<string, SafeTensor> {
  const out: Record<string, SafeTensor> = {};
  for (const [name, t] of Object.entries(tensors)) {
    Object.defineProperty(out, name, { value: { dtype, shape: t.shape, data: t.data }, enumerable: true });
  }
  return out;
}

/**
 * Float32 tensors of a decoded safetensors file: F32 as is, F16 / BF16 / F64 converted (F64
 * rounds to float32). Integer or BOOL tensors: CheckpointError('bad_dtype').
 */
export function toFloat32Tensors(content: SafetensorsContent, what = 'safetensors'): NamedTensors {
  const out: NamedTensors = {};
  for (const [name, t] of Object.entries(content.tensors)) {
    if (t.dtype !== 'F32' && t.dtype !== 'F16' && t.dtype !== 'BF16' && t.dtype !== 'F64') {
      throw new CheckpointError('bad_dtype', `${what}: tensor ${name} is ${t.dtype}; weights must be floating point`);
    }
    const data = t.data instanceof Float32Array ? t.data : Float32Array.from(t.data as Float64Array);
    Object.defineProperty(out, name, { value: { shape: t.shape, data }, enumerable: true });
  }
  return out;
}

const ST_META = { format: 'pt' }; // what transformers/peft expect in safetensors metadata

/**
 * The files of a checkpoint folder (layout above), name -> bytes or text. `weightsDtype` stores
 * the weights (model and adapter, not the optimizer) as F32 (default), BF16 or F16: a smaller
 * transfer (sync_inference_weights), read back as float32 by loadCheckpoint. Needs `weights` or
 * `adapter` (or both); `optimizer` and `trainerState` go together. Throws CheckpointError
 * ('bad_config' for a bad combination, the encoders' 'shape_mismatch' / 'bad_dtype').
 */
export function checkpointFiles(content: CheckpointContent, weightsDtype: 'F32' | 'BF16' | 'F16' = 'F32'): Record<string, Uint8Array | string> {
  const { config, weights, adapter, optimizer, trainerState, normStats } = content;
  if (!config || typeof config.preset !== 'string') throw new CheckpointError('bad_config', 'checkpoint config needs a string "preset"');
  if (!weights && !adapter) throw new CheckpointError('bad_config', 'a checkpoint needs weights or an adapter');
  if (!optimizer !== !trainerState) {
    throw new CheckpointError('bad_config', `a saved state needs both optimizer tensors and trainer_state; got ${optimizer ? 'optimizer' : 'trainer_state'} only`);
  }
  const files: Record<string, Uint8Array | string> = { 'config.json': JSON.stringify(config, null, 2) + '\n' };
  if (weights) files['model.safetensors'] = encodeSafetensors(toSafeTensors(weights, weightsDtype), ST_META);
  if (adapter) {
    files['adapter_model.safetensors'] = encodeSafetensors(toSafeTensors(adapter.tensors, weightsDtype), ST_META);
    files['adapter_config.json'] = JSON.stringify(adapter.config, null, 2) + '\n';
  }
  if (normStats) files['norm_stats.json'] = normStatsToJson(normStats);
  if (optimizer && trainerState) {
    files['optimizer.safetensors'] = encodeSafetensors(toSafeTensors(optimizer), ST_META);
    files['trainer_state.json'] = JSON.stringify(trainerState, null, 2) + '\n';
  }
  return files;
}

/** Saves a checkpoint folder (layout above) atomically. Throws as checkpointFiles and writeCheckpointDir. */
export async function saveCheckpoint(dir: string, content: CheckpointContent, opts: WriteOptions = {}): Promise<void> {
  await writeCheckpointDir(dir, checkpointFiles(content), opts);
}

/**
 * Loads a checkpoint folder. With `expected`, refuses another preset (checkCompatible) before
 * decoding any tensor. Throws CheckpointError: 'missing_file' (no weights or adapter, an adapter
 * without adapter_config.json, an optimizer without trainer_state.json or the reverse),
 * 'bad_config' (JSON files), the safetensors decoder's codes; NormError for norm_stats.json.
 */
export async function loadCheckpoint(dir: string, expected?: { preset: string; [key: string]: unknown }): Promise<CheckpointContent> {
  const { config, files } = await readCheckpointDir(dir);
  if (expected) checkCompatible(config, expected);
  const has = (name: string) => Object.hasOwn(files, name);
  if (!has('model.safetensors') && !has('adapter_model.safetensors')) {
    throw new CheckpointError('missing_file', `checkpoint ${dir} has neither model.safetensors nor adapter_model.safetensors`);
  }
  if (has('adapter_model.safetensors') !== has('adapter_config.json')) {
    throw new CheckpointError('missing_file', `checkpoint ${dir} has ${has('adapter_config.json') ? 'adapter_config.json' : 'adapter_model.safetensors'} without its pair`);
  }
  if (has('optimizer.safetensors') !== has('trainer_state.json')) {
    throw new CheckpointError('missing_file', `checkpoint ${dir} has ${has('trainer_state.json') ? 'trainer_state.json' : 'optimizer.safetensors'} without its pair`);
  }
  const tensors = (name: string) => toFloat32Tensors(decodeSafetensors(files[name]!), `${dir}/${name}`);
  const out: CheckpointContent = { config };
  if (has('model.safetensors')) out.weights = tensors('model.safetensors');
  if (has('adapter_model.safetensors')) {
    const cfg = parseJson(files['adapter_config.json']!, `${dir}/adapter_config.json`);
    if (!cfg || typeof cfg !== 'object' || Array.isArray(cfg)) throw new CheckpointError('bad_config', `${dir}/adapter_config.json is not a JSON object`);
    out.adapter = { tensors: tensors('adapter_model.safetensors'), config: cfg as Record<string, unknown> };
  }
  if (has('optimizer.safetensors')) {
    out.optimizer = tensors('optimizer.safetensors');
    const st = parseJson(files['trainer_state.json']!, `${dir}/trainer_state.json`) as { step?: unknown } | null;
    if (!st || typeof st !== 'object' || !Number.isInteger(st.step)) {
      throw new CheckpointError('bad_config', `${dir}/trainer_state.json has no integer "step"`);
    }
    out.trainerState = st as { step: number };
  }
  if (has('norm_stats.json')) out.normStats = parseNormStats(Buffer.from(files['norm_stats.json']!).toString('utf8'));
  return out;
}
