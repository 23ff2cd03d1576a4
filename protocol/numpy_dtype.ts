/**
 * numpy dtype strings and the bytes <-> typed array conversions behind protocol/ndarray.ts.
 *
 * A dtype string is numpy's `dtype.str`: a byte-order char ('<' little, '>' big, '|' not
 * applicable, '=' native), a kind ('b' bool, 'i' signed, 'u' unsigned, 'f' float) and the item
 * size in bytes, e.g. '<f4', '>i2', '|u1', '|b1'. The order char may be missing ('f4' = native)
 * and numpy's names ('float32', 'uint8', 'bool', ...) are accepted too. Native means little-endian:
 * the module refuses to load on a big-endian host, where the typed-array views would be wrong.
 *
 * Element types (the typed array a dtype decodes to):
 *   b1 -> Uint8Array holding 0/1          i1/i2/i4 -> Int8Array/Int16Array/Int32Array
 *   u1/u2/u4 -> Uint8Array/Uint16Array/Uint32Array
 *   i8/u8 -> BigInt64Array/BigUint64Array (exact, unlike a Float64Array past 2^53)
 *   f2 -> Float32Array (every float16 is exact in float32; encoding rounds to nearest, ties to even)
 *   f4 -> Float32Array                    f8 -> Float64Array
 */
import { endianness } from 'node:os';
import { ProtocolError } from './errors.ts';

if (endianness() !== 'LE') throw new Error(`numpy_dtype.ts assumes a little-endian host; this one is ${endianness()}`);

export type NDArrayData =
  | Uint8Array
  | Int8Array
  | Int16Array
  | Int32Array
  | BigInt64Array
  | Uint16Array
  | Uint32Array
  | BigUint64Array
  | Float32Array
  | Float64Array;

type DataCtor = { new (buffer: ArrayBuffer, byteOffset?: number, length?: number): NDArrayData; readonly name: string };

/** A parsed dtype string. `ctor` is the JS element type (Float32Array for f2). */
export interface Dtype {
  readonly kind: 'b' | 'i' | 'u' | 'f';
  readonly itemsize: 1 | 2 | 4 | 8;
  readonly bigEndian: boolean;
  readonly ctor: DataCtor;
  /** numpy's canonical `dtype.str` for this dtype ('<f4', '|u1', '>i2'). */
  readonly str: string;
}

const CTORS: Record<string, DataCtor> = {
  b1: Uint8Array, i1: Int8Array, i2: Int16Array, i4: Int32Array, i8: BigInt64Array,
  u1: Uint8Array, u2: Uint16Array, u4: Uint32Array, u8: BigUint64Array,
  f2: Float32Array, f4: Float32Array, f8: Float64Array,
};
const NAMES: Record<string, string> = {
  bool: 'b1', int8: 'i1', int16: 'i2', int32: 'i4', int64: 'i8',
  uint8: 'u1', uint16: 'u2', uint32: 'u4', uint64: 'u8', float16: 'f2', float32: 'f4', float64: 'f8',
};
const REFUSED_KINDS: Record<string, string> = {
  O: 'object', V: 'void', c: 'complex', S: 'bytes', a: 'bytes', U: 'unicode', M: 'datetime', m: 'timedelta',
};

/**
 * Parse a numpy dtype string.
 * @throws ProtocolError `unsupported_dtype` for object/void/complex (and other non-numeric) dtypes
 *   and for strings that are no dtype we know; `bad_ndarray` when `str` is not a string.
 */
export function parseDtype(str: unknown): Dtype {
  if (typeof str !== 'string') throw new ProtocolError('bad_ndarray', `ndarray dtype is ${describe(str)}; expected a string like '<f4'`);
  const m = /^([<>|=]?)([a-zA-Z?]+)(\d*)$/.exec(str);
  const order = m?.[1] ?? '';
  let code = m ? (NAMES[m[2] + m[3]] ?? m[2] + m[3]) : '';
  if (code === '?') code = 'b1';
  const refused = m ? REFUSED_KINDS[m[2][0]] : undefined;
  if (refused && m![2].length === 1) {
    throw new ProtocolError('unsupported_dtype', `dtype '${str}' (${refused}) is not supported: only bool, int, uint and float arrays are`);
  }
  const ctor = CTORS[code];
  if (!ctor) throw new ProtocolError('unsupported_dtype', `unknown dtype '${str}': expected one of b1, i1-i8, u1-u8, f2, f4, f8 with a byte order`);
  const kind = code[0] as Dtype['kind'];
  const itemsize = Number(code.slice(1)) as Dtype['itemsize'];
  const bigEndian = order === '>' && itemsize > 1;
  return { kind, itemsize, bigEndian, ctor, str: (itemsize === 1 ? '|' : bigEndian ? '>' : '<') + code };
}

/**
 * Copy `bytes` (numpy's `tobytes()` of the array: any offset, any alignment) into a fresh typed
 * array in native order. The result never aliases `bytes`. b1 bytes become 0/1 (numpy reads any
 * nonzero byte as True).
 */
export function bytesToData(bytes: Uint8Array, dt: Dtype): NDArrayData {
  const copy = new Uint8Array(bytes); // a new, aligned ArrayBuffer
  if (dt.bigEndian) swapBytes(copy, dt.itemsize);
  if (dt.kind === 'b') {
    for (let i = 0; i < copy.length; i++) copy[i] = copy[i] !== 0 ? 1 : 0;
    return copy;
  }
  if (dt.kind === 'f' && dt.itemsize === 2) {
    const half = new Uint16Array(copy.buffer);
    const out = new Float32Array(half.length);
    const bits = new Uint32Array(out.buffer); // bit-level, so NaN payloads survive
    for (let i = 0; i < half.length; i++) bits[i] = halfToFloatBits(half[i]);
    return out;
  }
  return new dt.ctor(copy.buffer, 0, copy.byteLength / dt.itemsize);
}

/**
 * The wire bytes of `data` for dtype `dt` (C order, the dtype's byte order): numpy's `tobytes()`.
 * Little-endian data other than b1/f2 is returned as a view without copying.
 */
export function dataToBytes(data: NDArrayData, dt: Dtype): Uint8Array {
  let bytes: Uint8Array;
  if (dt.kind === 'f' && dt.itemsize === 2) {
    const bits = new Uint32Array(data.buffer, data.byteOffset, data.length);
    const half = new Uint16Array(data.length);
    for (let i = 0; i < half.length; i++) half[i] = floatBitsToHalf(bits[i]);
    bytes = new Uint8Array(half.buffer);
  } else if (dt.kind === 'b') {
    bytes = Uint8Array.from(data as Uint8Array, (v) => (v !== 0 ? 1 : 0));
  } else {
    bytes = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    if (dt.bigEndian) bytes = new Uint8Array(bytes);
  }
  if (dt.bigEndian) swapBytes(bytes, dt.itemsize);
  return bytes;
}

function swapBytes(bytes: Uint8Array, itemsize: number): void {
  for (let i = 0; i < bytes.length; i += itemsize) {
    for (let a = i, b = i + itemsize - 1; a < b; a++, b--) {
      const t = bytes[a];
      bytes[a] = bytes[b];
      bytes[b] = t;
    }
  }
}

/** IEEE binary16 bits -> binary32 bits (exact; NaN payloads kept). */
export function halfToFloatBits(h: number): number {
  const sign = (h & 0x8000) << 16;
  const exp = (h >>> 10) & 0x1f;
  const mant = h & 0x3ff;
  if (exp === 0x1f) return (sign | 0x7f800000 | (mant << 13)) >>> 0;
  if (exp !== 0) return (sign | ((exp + 112) << 23) | (mant << 13)) >>> 0;
  if (mant === 0) return sign >>> 0;
  const p = 31 - Math.clz32(mant); // subnormal: mant * 2^-24 = 2^(p-24) * 1.f
  return (sign | ((p + 103) << 23) | ((mant - (1 << p)) << (23 - p))) >>> 0;
}

/** IEEE binary32 bits -> binary16 bits, rounding to nearest, ties to even (numpy's astype). */
export function floatBitsToHalf(x: number): number {
  const sign = (x >>> 16) & 0x8000;
  const exp = (x >>> 23) & 0xff;
  const mant = x & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant === 0 ? 0 : (mant >>> 13) || 1); // a NaN stays a NaN, as in numpy
  const e = exp - 112; // the binary16 exponent field
  if (e >= 0x1f) return sign | 0x7c00;
  if (e >= 1) {
    let h = (e << 10) | (mant >>> 13);
    const rest = mant & 0x1fff;
    if (rest > 0x1000 || (rest === 0x1000 && (h & 1))) h++; // a carry may make it the next exponent or inf
    return sign | h;
  }
  const shift = 126 - exp; // subnormal result: (1.mant * 2^23) >> shift in units of 2^-24
  if (shift > 24) return sign;
  const m = mant | 0x800000;
  let h = m >>> shift;
  const rest = m & ((1 << shift) - 1);
  const halfway = 1 << (shift - 1);
  if (rest > halfway || (rest === halfway && (h & 1))) h++;
  return sign | h;
}

/** A short description of a wire value's type, for error messages. */
export function describe(v: unknown): string {
  if (v === null) return 'nil';
  if (v === undefined) return 'missing';
  if (v instanceof Uint8Array) return `bin (${v.byteLength} bytes)`;
  if (Array.isArray(v)) return `an array of ${v.length}`;
  if (v instanceof Map) return 'a map';
  if (typeof v === 'string') return `the string '${v.length > 40 ? v.slice(0, 40) + '...' : v}'`;
  if (typeof v === 'object') return `a ${(v as object).constructor?.name ?? 'object'}`;
  return `${typeof v} ${String(v)}`;
}
