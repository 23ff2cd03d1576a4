/**
 * Pure encode/decode of the safetensors format (huggingface/safetensors, the field's standard
 * checkpoint format; PROTOCOL.md section 4), byte-compatible with the Rust library behind the
 * Python `safetensors` package (checked against its output in test/safetensors.test.ts):
 *
 *   [u64 little-endian N][N bytes of UTF-8 JSON header, space-padded to a multiple of 8][data]
 *
 * The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
 * relative to the data start) and may hold "__metadata__", a string -> string map, written first.
 * Tensors are laid out in the Rust library's order: dtype descending (I64, F64, F32, I32, BF16,
 * F16, U8, BOOL), then name by UTF-8 bytes, so the larger types come first and stay aligned.
 * Metadata keys are written sorted (the Rust library writes them in hash order, which varies
 * from run to run; any order reads the same). Data is little-endian, row-major.
 */

export type CheckpointErrorCode =
  | 'bad_header' // truncated file, header not JSON / not an object, bad entry fields
  | 'bad_offsets' // data_offsets out of range, overlapping, or leaving gaps
  | 'bad_dtype' // a dtype we do not handle, or data of the wrong array type
  | 'shape_mismatch' // shape product x itemsize != byte length, or data length != shape product
  | 'too_large' // header larger than the bound
  | 'bad_config' // config.json missing fields or not JSON
  | 'wrong_preset' // a checkpoint of another preset than the session's
  | 'exists' // the target folder exists and overwrite is off
  | 'missing_file' // a file the layout needs is absent
  | 'tensor_mismatch' // a checkpoint's tensors are not the model's: missing, unexpected or misshapen
  | 'io'; // a filesystem operation failed

/** The checkpoint layer's one error type (safetensors bytes and checkpoint folders). */
export class CheckpointError extends Error {
  readonly code: CheckpointErrorCode;
  constructor(code: CheckpointErrorCode, message: string) {
    super(message);
    this.name = 'CheckpointError';
    this.code = code;
  }
}

export type SafetensorsDtype = 'I64' | 'F64' | 'F32' | 'I32' | 'BF16' | 'F16' | 'U8' | 'BOOL';

/**
 * Element data of a tensor, row-major. Per dtype: F32 Float32Array; F64 Float64Array; I32
 * Int32Array; I64 BigInt64Array; U8 Uint8Array; BOOL Uint8Array of 0/1; F16 and BF16 a
 * Float32Array (rounded to nearest even on encode; decode always gives Float32Array, exactly) or,
 * on encode only, a Uint16Array of raw bit patterns.
 */
export type TensorData = Float32Array | Float64Array | Int32Array | BigInt64Array | Uint8Array | Uint16Array;

export interface SafeTensor {
  dtype: SafetensorsDtype;
  shape: number[];
  data: TensorData;
}

export interface SafetensorsContent {
  tensors: Record<string, SafeTensor>;
  /** The `__metadata__` map, or null when the file has none. */
  metadata: Record<string, string> | null;
}

/** The Rust library's bound on the header (MAX_HEADER_SIZE), our default. */
export const MAX_HEADER_BYTES = 100_000_000;

const ITEM_BYTES: Record<SafetensorsDtype, number> = { I64: 8, F64: 8, F32: 4, I32: 4, BF16: 2, F16: 2, U8: 1, BOOL: 1 };
type ArrayType = Float32ArrayConstructor | Float64ArrayConstructor | Int32ArrayConstructor | BigInt64ArrayConstructor | Uint8ArrayConstructor | Uint16ArrayConstructor;
const ARRAY_TYPES: Record<SafetensorsDtype, ArrayType[]> = {
  F32: [Float32Array], F64: [Float64Array], I32: [Int32Array], I64: [BigInt64Array], U8: [Uint8Array],
  BOOL: [Uint8Array], F16: [Float32Array, Uint16Array], BF16: [Float32Array, Uint16Array],
};
// Position in the Rust `Dtype` enum among the dtypes we handle; data is sorted descending by it.
const DTYPE_RANK: Record<SafetensorsDtype, number> = { BOOL: 0, U8: 1, F16: 2, BF16: 3, I32: 4, F32: 5, F64: 6, I64: 7 };

if (new Uint8Array(new Uint16Array([1]).buffer)[0] !== 1) {
  throw new Error('safetensors.ts assumes a little-endian platform');
}

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** float32 -> IEEE half bits, round to nearest even; NaN stays NaN. */
export function f32ToF16Bits(value: number): number {
  f32[0] = value;
  const x = u32[0]!;
  const sign = (x >>> 16) & 0x8000;
  const exp = (x >>> 23) & 0xff;
  let mant = x & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 | (mant >>> 13) : 0);
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign; // below half of the smallest subnormal: rounds to zero
    mant |= 0x800000;
    const shift = 14 - e;
    let h = mant >>> shift;
    const rem = mant & ((1 << shift) - 1);
    const half = 1 << (shift - 1);
    if (rem > half || (rem === half && h & 1)) h++; // a carry into 0x400 is the smallest normal
    return sign | h;
  }
  let h = (e << 10) | (mant >>> 13);
  const rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem === 0x1000 && h & 1)) h++; // a carry may reach infinity, as it should
  return sign | h;
}

/** IEEE half bits -> number (exact). */
export function f16BitsToF32(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const e = (h >>> 10) & 0x1f;
  const m = h & 0x3ff;
  if (e === 0) return sign * m * 2 ** -24;
  if (e === 0x1f) return m ? NaN : sign * Infinity;
  return sign * (1 + m / 1024) * 2 ** (e - 15);
}

/** float32 -> bfloat16 bits, round to nearest even (as torch does); NaN -> 0x7fc0. */
export function f32ToBf16Bits(value: number): number {
  f32[0] = value;
  const x = u32[0]!;
  if (Number.isNaN(value)) return ((x >>> 16) & 0x8000) | 0x7fc0;
  return ((x + 0x7fff + ((x >>> 16) & 1)) >>> 16) & 0xffff;
}

/** bfloat16 bits -> number (exact). */
export function bf16BitsToF32(h: number): number {
  u32[0] = (h & 0xffff) << 16;
  return f32[0]!;
}

/** Defines an own enumerable key, so that a tensor named `__proto__` stays a plain entry. */
function setOwn<T>(obj: Record<string, T>, key: string, value: T): void {
  Object.defineProperty(obj, key, { value, enumerable: true, writable: true, configurable: true });
}

function product(shape: readonly number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

function utf8Compare(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a, 'utf8'), Buffer.from(b, 'utf8'));
}

function checkShape(name: string, shape: unknown): number[] {
  if (!Array.isArray(shape) || !shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
    throw new CheckpointError('bad_header', `tensor ${name}: shape ${JSON.stringify(shape)} is not a list of integers >= 0`);
  }
  return shape as number[];
}

/** The tensor's bytes, little-endian, converting F16/BF16 from Float32Array when needed. */
function tensorBytes(name: string, t: SafeTensor): Uint8Array {
  const n = product(t.shape);
  const d = t.data;
  if (d.length !== n) {
    throw new CheckpointError('shape_mismatch', `tensor ${name}: ${d.length} values for shape [${t.shape}] (${n})`);
  }
  const accepts = ARRAY_TYPES[t.dtype];
  if (!accepts.some((A) => d instanceof A)) {
    const names = accepts.map((A) => A.name).join(' or ');
    throw new CheckpointError('bad_dtype', `tensor ${name}: dtype ${t.dtype} needs ${names}, got ${d.constructor.name}`);
  }
  if ((t.dtype === 'F16' || t.dtype === 'BF16') && d instanceof Float32Array) {
    const bits = new Uint16Array(n);
    const conv = t.dtype === 'F16' ? f32ToF16Bits : f32ToBf16Bits;
    for (let i = 0; i < n; i++) bits[i] = conv(d[i]!);
    return new Uint8Array(bits.buffer);
  }
  if (t.dtype === 'BOOL') {
    for (let i = 0; i < n; i++) {
      if (d[i] !== 0 && d[i] !== 1) throw new CheckpointError('bad_dtype', `tensor ${name}: BOOL value ${d[i]} at ${i} is not 0 or 1`);
    }
  }
  return new Uint8Array(d.buffer, d.byteOffset, d.byteLength);
}

/** A tensor's name, dtype and shape: what a header needs, without the data. */
export interface SafetensorsSpec {
  name: string;
  dtype: SafetensorsDtype;
  shape: number[];
}

/** Where each tensor goes in a file laid out by safetensorsLayout. */
export interface SafetensorsLayout {
  /** The first bytes of the file: 8-byte length, then the space-padded JSON header. */
  head: Uint8Array;
  /** Tensors in data order, each with its [begin, end) relative to the data start (= head.length). */
  entries: SafetensorsEntry[];
  /** Total file size in bytes. */
  fileBytes: number;
}

/**
 * The header and data layout of a safetensors file holding `specs`, laid out as the Rust library
 * does (see the module comment), so a writer can stream each tensor's bytes to its offset.
 * Throws CheckpointError: 'bad_dtype' (unknown dtype), 'bad_header' (bad shape, a tensor named
 * `__metadata__`, a metadata value that is not a string, a name given twice).
 */
export function safetensorsLayout(specs: readonly SafetensorsSpec[], metadata: Record<string, string> | null = null): SafetensorsLayout {
  const seen = new Set<string>();
  for (const t of specs) {
    if (t.name === '__metadata__') throw new CheckpointError('bad_header', 'a tensor may not be named __metadata__');
    if (seen.has(t.name)) throw new CheckpointError('bad_header', `tensor ${t.name} is given twice`);
    seen.add(t.name);
    if (!Object.hasOwn(ITEM_BYTES, t.dtype)) throw new CheckpointError('bad_dtype', `tensor ${t.name}: dtype ${String(t.dtype)} is not one of ${Object.keys(ITEM_BYTES).join(', ')}`);
    checkShape(t.name, t.shape);
  }
  const sorted = [...specs].sort((a, b) => DTYPE_RANK[b.dtype] - DTYPE_RANK[a.dtype] || utf8Compare(a.name, b.name));
  const header: Record<string, unknown> = {};
  if (metadata) {
    const meta: Record<string, string> = {};
    for (const key of Object.keys(metadata).sort(utf8Compare)) {
      const value = metadata[key];
      if (typeof value !== 'string') throw new CheckpointError('bad_header', `metadata ${key} is ${typeof value}; values must be strings`);
      setOwn(meta, key, value);
    }
    header.__metadata__ = meta;
  }
  const entries: SafetensorsEntry[] = [];
  let offset = 0;
  for (const t of sorted) {
    const bytes = product(t.shape) * ITEM_BYTES[t.dtype];
    entries.push({ name: t.name, dtype: t.dtype, shape: t.shape, begin: offset, end: offset + bytes });
    setOwn(header, t.name, { dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + bytes] });
    offset += bytes;
  }
  const json = Buffer.from(JSON.stringify(header), 'utf8');
  const headerLen = Math.ceil(json.length / 8) * 8;
  const head = new Uint8Array(8 + headerLen);
  new DataView(head.buffer).setBigUint64(0, BigInt(headerLen), true);
  head.set(json, 8);
  head.fill(0x20, 8 + json.length);
  return { head, entries, fileBytes: head.length + offset };
}

/**
 * Encodes tensors (any key order) and optional string metadata to safetensors bytes, laid out
 * as the Rust library does (see the module comment). Throws CheckpointError: 'bad_dtype' (data
 * array type wrong for the dtype, BOOL value not 0/1, unknown dtype), 'shape_mismatch' (data
 * length != shape product), 'bad_header' (bad shape, a tensor named `__metadata__`, a metadata
 * value that is not a string).
 */
export function encodeSafetensors(tensors: Record<string, SafeTensor>, metadata: Record<string, string> | null = null): Uint8Array {
  const layout = safetensorsLayout(Object.keys(tensors).map((name) => ({ name, dtype: tensors[name]!.dtype, shape: tensors[name]!.shape })), metadata);
  const out = new Uint8Array(layout.fileBytes);
  out.set(layout.head, 0);
  for (const e of layout.entries) out.set(tensorBytes(e.name, tensors[e.name]!), layout.head.length + e.begin);
  return out;
}

function decodeData(dtype: SafetensorsDtype, raw: Uint8Array): TensorData {
  // Copy into a fresh, aligned buffer so that typed views are legal. (Not raw.slice(): on a
  // Node Buffer that is a view, whose .buffer is the whole file or the shared pool.)
  const buf = new Uint8Array(raw).buffer;
  switch (dtype) {
    case 'F32': return new Float32Array(buf);
    case 'F64': return new Float64Array(buf);
    case 'I32': return new Int32Array(buf);
    case 'I64': return new BigInt64Array(buf);
    case 'U8': return new Uint8Array(buf);
    case 'BOOL': return new Uint8Array(buf);
    case 'F16':
    case 'BF16': {
      const bits = new Uint16Array(buf);
      const out = new Float32Array(bits.length);
      const conv = dtype === 'F16' ? f16BitsToF32 : bf16BitsToF32;
      for (let i = 0; i < bits.length; i++) out[i] = conv(bits[i]!);
      return out;
    }
  }
}

/** One tensor's entry in a safetensors header; offsets are relative to the data start. */
export interface SafetensorsEntry {
  name: string;
  dtype: SafetensorsDtype;
  shape: number[];
  begin: number;
  end: number;
}

/** The parsed header of a safetensors file. */
export interface SafetensorsHeader {
  /** Entries in data order (ascending offsets), contiguous from 0 to dataBytes. */
  entries: SafetensorsEntry[];
  metadata: Record<string, string> | null;
  /** Byte offset of the data in the file: 8 + the header length. */
  dataStart: number;
}

/**
 * Reads the 8-byte little-endian header length at the start of a safetensors file and checks
 * it against `fileBytes` and `maxHeaderBytes`. Returns the header's byte length.
 * @throws CheckpointError 'bad_header' (fewer than 8 bytes, header past the end), 'too_large'.
 */
export function safetensorsHeaderLength(first8: Uint8Array, fileBytes: number, maxHeaderBytes = MAX_HEADER_BYTES): number {
  if (fileBytes < 8 || first8.length < 8) throw new CheckpointError('bad_header', `safetensors file is ${fileBytes} bytes; the header length alone needs 8`);
  const n = new DataView(first8.buffer, first8.byteOffset, 8).getBigUint64(0, true);
  if (n > BigInt(maxHeaderBytes)) throw new CheckpointError('too_large', `safetensors header is ${n} bytes; the limit is ${maxHeaderBytes}`);
  const headerLen = Number(n);
  if (8 + headerLen > fileBytes) {
    throw new CheckpointError('bad_header', `safetensors header claims ${headerLen} bytes; the file has ${fileBytes - 8} after the length`);
  }
  return headerLen;
}

/**
 * Parses and checks a safetensors header (the JSON bytes after the length) for a file whose data
 * part is `dataBytes` long, with the checks decodeSafetensors documents (all but the BOOL byte
 * values, which need the data). Lets a reader of a file too large for one Buffer read tensors
 * by their byte ranges.
 * @throws CheckpointError 'bad_header', 'bad_dtype', 'shape_mismatch', 'bad_offsets'.
 */
export function parseSafetensorsHeader(headerBytes: Uint8Array, dataBytes: number): SafetensorsHeader {
  if (headerBytes.length === 0 || headerBytes[0] !== 0x7b) throw new CheckpointError('bad_header', 'safetensors header does not start with "{"');
  let header: unknown;
  try {
    const text = new TextDecoder('utf-8', { fatal: true }).decode(headerBytes);
    header = JSON.parse(text);
  } catch (err) {
    throw new CheckpointError('bad_header', `safetensors header is not UTF-8 JSON: ${(err as Error).message}`);
  }
  if (header === null || typeof header !== 'object' || Array.isArray(header)) {
    throw new CheckpointError('bad_header', 'safetensors header is not a JSON object');
  }
  const dataLen = dataBytes;

  let metadata: Record<string, string> | null = null;
  const entries: SafetensorsEntry[] = [];
  for (const [name, value] of Object.entries(header as Record<string, unknown>)) {
    if (name === '__metadata__') {
      if (value === null || typeof value !== 'object' || Array.isArray(value)) {
        throw new CheckpointError('bad_header', '__metadata__ is not an object of strings');
      }
      const meta: Record<string, string> = {};
      for (const [k, v] of Object.entries(value as Record<string, unknown>)) {
        if (typeof v !== 'string') throw new CheckpointError('bad_header', `__metadata__ ${k} is ${JSON.stringify(v)}; values must be strings`);
        setOwn(meta, k, v);
      }
      metadata = meta;
      continue;
    }
    const info = value as Record<string, unknown> | null;
    if (info === null || typeof info !== 'object' || Array.isArray(info)) {
      throw new CheckpointError('bad_header', `tensor ${name}: entry is not an object`);
    }
    const dtype = info.dtype;
    if (typeof dtype !== 'string' || !Object.hasOwn(ITEM_BYTES, dtype)) {
      throw new CheckpointError('bad_dtype', `tensor ${name}: dtype ${JSON.stringify(dtype)} is not one of ${Object.keys(ITEM_BYTES).join(', ')}`);
    }
    const shape = checkShape(name, info.shape);
    const offsets = info.data_offsets;
    if (!Array.isArray(offsets) || offsets.length !== 2 || !offsets.every((o) => Number.isSafeInteger(o) && o >= 0)) {
      throw new CheckpointError('bad_header', `tensor ${name}: data_offsets ${JSON.stringify(offsets)} is not two integers >= 0`);
    }
    const [begin, end] = offsets as [number, number];
    if (end < begin || end > dataLen) {
      throw new CheckpointError('bad_offsets', `tensor ${name}: data_offsets [${begin}, ${end}] outside the ${dataLen} data bytes`);
    }
    const want = product(shape) * ITEM_BYTES[dtype as SafetensorsDtype];
    if (end - begin !== want) {
      throw new CheckpointError('shape_mismatch', `tensor ${name}: ${end - begin} bytes for ${dtype} shape [${shape}], which needs ${want}`);
    }
    entries.push({ name, dtype: dtype as SafetensorsDtype, shape, begin, end });
  }
  entries.sort((a, b) => a.begin - b.begin || a.end - b.end);
  let expected = 0;
  for (const e of entries) {
    if (e.begin !== expected) {
      throw new CheckpointError('bad_offsets', `tensor ${e.name} starts at ${e.begin}; the previous tensor ends at ${expected} (gap or overlap)`);
    }
    expected = e.end;
  }
  if (expected !== dataLen) throw new CheckpointError('bad_offsets', `tensors cover ${expected} data bytes; the file has ${dataLen}`);
  return { entries, metadata, dataStart: 8 + headerBytes.length };
}

/**
 * Decodes safetensors bytes with the Rust library's checks, strictly: header length within the
 * file and at most `maxHeaderBytes` ('too_large'); header valid UTF-8 JSON object starting with
 * '{' ('bad_header'); each entry's dtype one of ours ('bad_dtype'), shape a list of integers >= 0,
 * data_offsets two integers ('bad_header'); byte length = shape product x item size
 * ('shape_mismatch'); tensors, in offset order, contiguous from 0 to the end of the file with no
 * gap or overlap ('bad_offsets'); BOOL bytes 0 or 1 ('bad_dtype'). F16/BF16 decode to
 * Float32Array (exactly); see TensorData for the rest. The input is not retained.
 */
export function decodeSafetensors(bytes: Uint8Array, opts: { maxHeaderBytes?: number } = {}): SafetensorsContent {
  const headerLen = safetensorsHeaderLength(bytes, bytes.length, opts.maxHeaderBytes ?? MAX_HEADER_BYTES);
  const { entries, metadata, dataStart } = parseSafetensorsHeader(bytes.subarray(8, 8 + headerLen), bytes.length - 8 - headerLen);
  const tensors: Record<string, SafeTensor> = {};
  for (const e of entries) {
    const data = decodeData(e.dtype, bytes.subarray(dataStart + e.begin, dataStart + e.end));
    if (e.dtype === 'BOOL') {
      const bad = (data as Uint8Array).findIndex((b) => b > 1);
      if (bad >= 0) throw new CheckpointError('bad_dtype', `tensor ${e.name}: BOOL byte ${data[bad]} at ${bad} is not 0 or 1`);
    }
    setOwn(tensors, e.name, { dtype: e.dtype, shape: e.shape, data });
  }
  return { tensors, metadata };
}
