/**
 * numpy arrays on the wire, as OpenPI's `openpi_client.msgpack_numpy` writes them (PROTOCOL.md
 * section 5). An array is a map with bin keys, in this order:
 *   {b"__ndarray__": true, b"data": <bin, C order>, b"dtype": "<f4", b"shape": [..]}
 * and a numpy scalar is {b"__npgeneric__": true, b"data": <scalar.item()>, b"dtype": "<f4"}.
 * Decoding also accepts string keys; encoding always writes bin keys (Python looks them up as
 * bytes). Our encoder reproduces pack_array's bytes exactly (test/vectors/ndarray).
 *
 * Element types per dtype are listed in numpy_dtype.ts (b1 -> Uint8Array of 0/1, i8 ->
 * BigInt64Array, f2 -> Float32Array, big-endian data swapped into native order, ...). A decoded
 * array keeps the dtype string the wire said, so re-encoding gives the same bytes.
 */
import { C1 } from 'msgpackr';
import { ProtocolError } from './errors.ts';
import { pack, unpack, RawMsgpack } from './msgpack.ts';
import { bytesToData, dataToBytes, describe, parseDtype, type Dtype, type NDArrayData } from './numpy_dtype.ts';

export type { NDArrayData } from './numpy_dtype.ts';
export { parseDtype } from './numpy_dtype.ts';

/**
 * An n-d array: `data` holds the elements in C order and native byte order. Built by `ndarray()`
 * or the decoders, which check that `data` is the typed array of `dtype` and that its length is
 * the product of `shape` (1 for shape []).
 */
export class NDArray<D extends NDArrayData = NDArrayData> {
  /** numpy dtype string, e.g. '<f4', '>i2', '|u1' (written back verbatim on encode). */
  readonly dtype: string;
  readonly shape: readonly number[];
  readonly data: D;

  /** @throws ProtocolError `unsupported_dtype`, `bad_ndarray` or `shape_mismatch`, as `ndarray()`. */
  constructor(dtype: string, shape: readonly number[], data: D) {
    const dt = parseDtype(dtype);
    const size = checkShape(shape);
    if (!(data instanceof dt.ctor)) {
      throw new ProtocolError('bad_ndarray', `dtype '${dtype}' holds its elements in a ${dt.ctor.name}; got ${describe(data)}`);
    }
    if (data.length !== size) {
      throw new ProtocolError('shape_mismatch', `shape [${shape.join(', ')}] holds ${size} elements; data holds ${data.length}`);
    }
    this.dtype = dtype;
    this.shape = Object.freeze([...shape]);
    this.data = data;
  }

  /** Number of elements (product of the shape). */
  get size(): number {
    return this.data.length;
  }
}

/**
 * A numpy scalar (`np.float32(1.5)`). `value` is a number for int/float dtypes (64-bit ints are
 * exact only to 2^53, since msgpack.ts decodes integers as numbers) and a boolean for b1.
 */
export class NpScalar {
  constructor(
    readonly dtype: string,
    readonly value: number | boolean,
  ) {}
}

const DEFAULT_DTYPES = new Map<Function, string>([
  [Uint8Array, '|u1'], [Int8Array, '|i1'], [Int16Array, '<i2'], [Uint16Array, '<u2'], [Int32Array, '<i4'],
  [Uint32Array, '<u4'], [BigInt64Array, '<i8'], [BigUint64Array, '<u8'], [Float32Array, '<f4'], [Float64Array, '<f8'],
]);

/**
 * Build an array. `data` is a typed array (used as is, not copied) or a plain array of numbers,
 * booleans or bigints (converted to the dtype's element type). `dtype` defaults to the typed
 * array's own ('<f4' for a Float32Array, '|u1' for a Uint8Array, ...) and is required for plain
 * arrays; it is written in numpy's canonical form ('float32' and 'f4' become '<f4').
 * Example: `ndarray(new Float32Array(6), [2, 3])` is a 2x3 '<f4' array of zeros.
 * Plain data for an int, uint or bool dtype must hold integers within the dtype's range (no
 * wrapping: -1 is not a uint64, 1.5 not an int64, NaN and Infinity not integers).
 * @throws ProtocolError `unsupported_dtype`, `bad_ndarray` (wrong element type, bad shape entry,
 *   an element that is no integer of the dtype's range, named `data[i]` with its value),
 *   `shape_mismatch` (element count is not the shape's product).
 */
export function ndarray(data: NDArrayData | ArrayLike<number | boolean | bigint>, shape: readonly number[], dtype?: string): NDArray {
  const given = dtype ?? (ArrayBuffer.isView(data) ? DEFAULT_DTYPES.get(data.constructor) : undefined);
  if (given === undefined) {
    throw new ProtocolError('bad_ndarray', `ndarray() needs a dtype for data given as ${describe(data)}`);
  }
  const dt = parseDtype(given);
  let typed: NDArrayData;
  if (data instanceof dt.ctor) typed = data as NDArrayData;
  else if (ArrayBuffer.isView(data)) {
    throw new ProtocolError('bad_ndarray', `dtype '${given}' holds its elements in a ${dt.ctor.name}; got ${describe(data)}`);
  } else typed = fromPlain(data, dt);
  return new NDArray(dt.str, shape, typed);
}

/** The integer range of an int or uint dtype, as bigints (exact for 64-bit ones). */
function intRange(dt: Dtype): [bigint, bigint] {
  const bits = BigInt(dt.itemsize * 8);
  return dt.kind === 'u' ? [0n, (1n << bits) - 1n] : [-(1n << (bits - 1n)), (1n << (bits - 1n)) - 1n];
}

/**
 * Check that every element of plain data fits an int or uint dtype: typed arrays would
 * otherwise wrap silently (-1 as uint64 is 18446744073709551615) or throw a RangeError (1.5 as
 * int64), and a policy would act on the wrapped value.
 * @throws ProtocolError `bad_ndarray` naming `data[i]`, its value and the dtype's range.
 */
function checkIntegers(values: ArrayLike<number | boolean | bigint>, dt: Dtype): void {
  if (dt.kind === 'f' || dt.kind === 'b') return; // a bool is any truthy value, as numpy's bool()
  const [lo, hi] = intRange(dt);
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (typeof v === 'boolean') continue; // numpy takes True as 1
    const ok = typeof v === 'bigint' ? v >= lo && v <= hi : typeof v === 'number' && Number.isInteger(v) && BigInt(v) >= lo && BigInt(v) <= hi;
    if (!ok) {
      const shown = typeof v === 'number' || typeof v === 'bigint' ? String(v) : JSON.stringify(v) ?? String(v);
      throw new ProtocolError('bad_ndarray', `data[${i}] is ${shown}; dtype '${dt.str}' holds integers in ${lo}..${hi}`);
    }
  }
}

function fromPlain(values: ArrayLike<number | boolean | bigint>, dt: Dtype): NDArrayData {
  const n = values.length;
  checkIntegers(values, dt);
  if (dt.itemsize === 8 && dt.kind !== 'f') {
    const out = dt.kind === 'i' ? new BigInt64Array(n) : new BigUint64Array(n);
    for (let i = 0; i < n; i++) out[i] = BigInt(values[i] as number | bigint);
    return out;
  }
  const out = new dt.ctor(new ArrayBuffer(n * (dt.kind === 'f' && dt.itemsize === 2 ? 4 : dt.itemsize)));
  for (let i = 0; i < n; i++) (out as Float64Array)[i] = dt.kind === 'b' ? (values[i] ? 1 : 0) : Number(values[i]);
  if (dt.kind === 'f' && dt.itemsize === 2) return bytesToData(dataToBytes(out, dt), dt); // round to float16
  return out;
}

/** Check a shape (non-negative integers) and return its element count. */
function checkShape(shape: unknown): number {
  if (!Array.isArray(shape)) throw new ProtocolError('bad_ndarray', `ndarray shape is ${describe(shape)}; expected an array of integers`);
  let size = 1;
  let nonzero = 1; // numpy refuses shapes whose nonzero dims overflow, even when size is 0
  for (const d of shape) {
    if (typeof d !== 'number' || !Number.isInteger(d) || d < 0) {
      throw new ProtocolError('bad_ndarray', `ndarray shape [${shape.map(String).join(', ')}] has the entry ${describe(d)}; entries must be integers >= 0`);
    }
    size *= d;
    nonzero *= Math.max(d, 1);
  }
  if (nonzero > Number.MAX_SAFE_INTEGER) throw new ProtocolError('bad_ndarray', `ndarray shape [${shape.join(', ')}] is too big`);
  return size;
}

const KEY = {
  ndarray: Buffer.from('__ndarray__'),
  npgeneric: Buffer.from('__npgeneric__'),
  data: Buffer.from('data'),
  dtype: Buffer.from('dtype'),
  shape: Buffer.from('shape'),
};

/** The wire map of an array: bin keys in OpenPI's order, data as numpy's `tobytes()`. */
export function encodeNDArray(arr: NDArray): Map<Buffer, unknown> {
  const bytes = dataToBytes(arr.data, parseDtype(arr.dtype));
  return new Map<Buffer, unknown>([[KEY.ndarray, true], [KEY.data, bytes], [KEY.dtype, arr.dtype], [KEY.shape, [...arr.shape]]]);
}

/**
 * Decode one ndarray map (bin or string keys; a Map or a plain object). The data is copied:
 * the result never aliases the message, and the copy is aligned whatever the data's offset.
 * @throws ProtocolError `bad_ndarray` (data not bin, shape not non-negative integers, missing
 *   field), `unsupported_dtype` (O/V/c or unknown dtype), `shape_mismatch` (product x itemsize
 *   differs from the data's byte length).
 */
export function decodeNDArray(wire: unknown): NDArray {
  const fields = fieldsOf(wire);
  const dt = parseDtype(fields.get('dtype'));
  const shape = fields.get('shape');
  const size = checkShape(shape);
  const bytes = fields.get('data');
  if (!(bytes instanceof Uint8Array)) {
    throw new ProtocolError('bad_ndarray', `ndarray data is ${describe(bytes)}; expected bin bytes`);
  }
  if (size * dt.itemsize !== bytes.byteLength) {
    throw new ProtocolError(
      'shape_mismatch',
      `ndarray shape [${(shape as number[]).join(', ')}] x ${dt.itemsize}-byte '${fields.get('dtype')}' needs ${size * dt.itemsize} bytes; data has ${bytes.byteLength}`,
    );
  }
  return new NDArray(fields.get('dtype') as string, shape as number[], bytesToData(bytes, dt));
}

/** The wire map of a numpy scalar, with `data` written as Python writes `scalar.item()`. */
export function encodeNpScalar(s: NpScalar): Map<Buffer, unknown> {
  const dt = parseDtype(s.dtype);
  const data = dt.kind === 'b' ? Boolean(s.value) : new RawMsgpack(dt.kind === 'f' ? pyFloat(Number(s.value)) : pyInt(Number(s.value)));
  return new Map<Buffer, unknown>([[KEY.npgeneric, true], [KEY.data, data], [KEY.dtype, s.dtype]]);
}

/**
 * Decode one `__npgeneric__` map. A float is rounded to its dtype (as `np.float32(x)` would).
 * @throws ProtocolError `unsupported_dtype`; `bad_ndarray` when data does not fit the dtype
 *   (a float for an int dtype, an int out of range, a string, ...).
 */
export function decodeNpScalar(wire: unknown): NpScalar {
  const fields = fieldsOf(wire);
  const dtype = fields.get('dtype');
  const dt = parseDtype(dtype);
  const v = fields.get('data');
  const bad = () => new ProtocolError('bad_ndarray', `numpy scalar of dtype '${dtype}' has data ${describe(v)}`);
  if (dt.kind === 'b') {
    if (typeof v !== 'boolean' && !(typeof v === 'number' && Number.isInteger(v))) throw bad();
    return new NpScalar(dtype as string, Boolean(v));
  }
  if (typeof v !== 'number') throw bad();
  if (dt.kind === 'f') return new NpScalar(dtype as string, roundFloat(v, dt));
  const bits = dt.itemsize * 8;
  const lo = dt.kind === 'u' ? 0 : -(2 ** (bits - 1));
  const hi = dt.kind === 'u' ? 2 ** bits - 1 : 2 ** (bits - 1) - 1;
  if (!Number.isInteger(v) || v < lo || v > hi) throw bad();
  return new NpScalar(dtype as string, v);
}

/**
 * Round a float64 to a float dtype. float16 goes through float32, which can round twice; Python
 * never sends such values, since `item()` of a float16 is exact in float16.
 */
function roundFloat(v: number, dt: Dtype): number {
  if (dt.itemsize === 8) return v;
  if (dt.itemsize === 4) return Math.fround(v);
  return bytesToData(dataToBytes(Float32Array.of(v), dt), dt)[0] as number;
}

/** Python's float: always a float64 (cb), even when integral. */
function pyFloat(v: number): Uint8Array {
  const out = new Uint8Array(9);
  out[0] = 0xcb;
  new DataView(out.buffer).setFloat64(1, v);
  return out;
}

/** Python's int: the smallest msgpack int, uint64 (cf) / int64 (d3) past 32 bits. */
function pyInt(v: number): Uint8Array {
  if ((v >= 0 && v < 0x80) || (v < 0 && v >= -32)) return Uint8Array.of(v & 0xff);
  const [tag, size] =
    v >= 0
      ? v < 0x100 ? [0xcc, 1] : v < 0x10000 ? [0xcd, 2] : v < 2 ** 32 ? [0xce, 4] : [0xcf, 8]
      : v >= -0x80 ? [0xd0, 1] : v >= -0x8000 ? [0xd1, 2] : v >= -(2 ** 31) ? [0xd2, 4] : [0xd3, 8];
  const out = new Uint8Array(1 + size);
  out[0] = tag;
  const big = BigInt(v); // big-endian two's complement, byte by byte
  for (let i = 0; i < size; i++) out[size - i] = Number((big >> BigInt(8 * i)) & 0xffn);
  return out;
}

/** A map's fields by string name, whether its keys are bin or str. */
function fieldsOf(wire: unknown): Map<string, unknown> {
  const fields = new Map<string, unknown>();
  if (wire instanceof Map) for (const [k, v] of wire) fields.set(keyString(k), v);
  else if (isPlainObject(wire)) for (const k of Object.keys(wire)) fields.set(k, wire[k]);
  else throw new ProtocolError('bad_ndarray', `an ndarray must be a map; got ${describe(wire)}`);
  for (const name of ['data', 'dtype']) {
    if (!fields.has(name)) throw new ProtocolError('bad_ndarray', `ndarray map has no '${name}' field`);
  }
  return fields;
}

const utf8 = new TextDecoder('utf-8', { fatal: true });

function keyString(k: unknown): string {
  if (typeof k === 'string') return k;
  if (typeof k === 'number') return String(k);
  if (k instanceof Uint8Array) {
    try {
      return utf8.decode(k);
    } catch {
      throw new ProtocolError('bad_request', `a map key is bin that is not UTF-8 (${k.byteLength} bytes)`);
    }
  }
  throw new ProtocolError('bad_request', `a map key is ${describe(k)}; keys must be strings or bin`);
}

function isPlainObject(v: unknown): v is Record<string, unknown> {
  if (typeof v !== 'object' || v === null) return false;
  const proto = Object.getPrototypeOf(v);
  return proto === Object.prototype || proto === null;
}

function hasKey(entries: [unknown, unknown][], name: string, bin: Buffer): boolean {
  for (const [k] of entries) {
    if (k === name || (k instanceof Uint8Array && bin.equals(k))) return true;
  }
  return false;
}

/**
 * Turn a decoded msgpack tree (Maps with string or bin keys, arrays, bin, scalars) into plain JS:
 * ndarray maps become `NDArray`s, numpy scalar maps `NpScalar`s, other maps plain objects (bin
 * keys read as UTF-8; integer-like keys come first in a JS object, whatever the wire order), bin
 * values Buffers. Every byte array in the result is a copy, so nothing aliases the message.
 * @throws ProtocolError as `decodeNDArray`/`decodeNpScalar`; `bad_request` for map keys that are
 *   not strings, numbers or UTF-8 bin, a key given twice (as str and as bin), or nesting deeper
 *   than 1000; `bad_msgpack` for a map or array reached twice (msgpackr's reference extension
 *   can make cycles or exponentially shared trees; Python never writes them).
 */
export function fromWire(value: unknown): unknown {
  return walk(value, new Set(), 0);
}

const MAX_DEPTH = 1000;

function walk(value: unknown, seen: Set<object>, depth: number): unknown {
  // msgpackr decodes the reserved byte 0xc1 into a marker object instead of failing.
  if (value === C1) throw new ProtocolError('bad_msgpack', 'message holds the reserved msgpack byte 0xc1, which is not a value');
  if (value instanceof Uint8Array) return Buffer.from(value);
  const isMap = value instanceof Map;
  if (!Array.isArray(value) && !isMap && !isPlainObject(value)) return value;
  if (seen.has(value as object)) throw new ProtocolError('bad_msgpack', 'the message refers to one map or array twice (a msgpackr reference)');
  seen.add(value as object);
  if (depth >= MAX_DEPTH) throw new ProtocolError('bad_request', `the message nests deeper than ${MAX_DEPTH} levels`);
  if (Array.isArray(value)) return value.map((v) => walk(v, seen, depth + 1));
  const entries: [unknown, unknown][] = isMap ? [...value] : Object.entries(value as object);
  // OpenPI's unpack_array tests key presence only, __ndarray__ first
  if (hasKey(entries, '__ndarray__', KEY.ndarray)) return decodeNDArray(value);
  if (hasKey(entries, '__npgeneric__', KEY.npgeneric)) return decodeNpScalar(value);
  const out: Record<string, unknown> = {};
  for (const [k, v] of entries) {
    const key = keyString(k);
    if (Object.hasOwn(out, key)) throw new ProtocolError('bad_request', `the map key '${key}' appears twice`);
    // defineProperty, so that a '__proto__' key is data, never the object's prototype
    Object.defineProperty(out, key, { value: walk(v, seen, depth + 1), enumerable: true, writable: true, configurable: true });
  }
  return out;
}

/**
 * Turn plain JS (objects, arrays, `NDArray`/`NpScalar` leaves, strings, numbers, Buffers) into the
 * form `pack` writes as OpenPI does: arrays and scalars become their bin-keyed maps, objects
 * become Maps with string keys. Maps pass through with their values converted.
 * @throws ProtocolError `bad_request` for a typed array other than Uint8Array (its dtype would be
 *   lost: wrap it with `ndarray()`).
 */
export function toWire(value: unknown): unknown {
  if (value instanceof NDArray) return encodeNDArray(value);
  if (value instanceof NpScalar) return encodeNpScalar(value);
  if (Array.isArray(value)) return value.map(toWire);
  if (value instanceof Uint8Array) return value;
  if (ArrayBuffer.isView(value)) {
    throw new ProtocolError('bad_request', `cannot send a bare ${value.constructor.name}: wrap it with ndarray(data, shape)`);
  }
  if (value instanceof Map) return new Map([...value].map(([k, v]) => [k, toWire(v)]));
  if (isPlainObject(value)) return new Map(Object.entries(value).map(([k, v]) => [k, toWire(v)]));
  return value;
}

/** msgpack bytes of a tree with ndarray leaves: OpenPI's `msgpack_numpy.packb`. */
export function packNumpy(value: unknown): Buffer {
  return pack(toWire(value));
}

/**
 * Decode msgpack bytes into plain JS with `NDArray` leaves: OpenPI's `msgpack_numpy.unpackb`.
 * @throws ProtocolError `bad_msgpack`, or as `fromWire`.
 */
export function unpackNumpy(bytes: Uint8Array): unknown {
  return fromWire(unpack(bytes));
}
