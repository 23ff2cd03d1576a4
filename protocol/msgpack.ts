/**
 * The one msgpack configuration used on every wire of Vela.
 *
 * - `useRecords: false`: never msgpackr's record extension (Python clients cannot read it).
 * - `mapsAsObjects: false` on decode: OpenPI's ndarrays use *binary* map keys (b"__ndarray__"),
 *   which only survive as keys of a `Map`. Decoded maps are therefore `Map`s; `fromWire`
 *   (protocol/ndarray.ts) turns them into plain objects once the ndarrays inside are recognised.
 * - `variableMapSize: true`: maps get the smallest header (fixmap), as Python's msgpack writes.
 * - Bin keys are encoded by putting `Buffer` keys in a `Map`.
 * - Known difference from Python: integral numbers beyond 32 bits are written as float64 (exact
 *   to 2^53); JS cannot tell 1 from 1.0, so integral floats are written as ints. Where the exact
 *   Python bytes matter (numpy scalars), wrap the pre-encoded value in `RawMsgpack`.
 */
import { Packr, Unpackr, addExtension } from 'msgpackr';
import { ProtocolError } from './errors.ts';

/**
 * Bytes that already are one msgpack value; `pack` copies them into its output verbatim. For the
 * values whose Python encoding msgpackr cannot pick: a float64 holding an integral value (Python
 * writes 2.0 as `cb 40 00 ..`, msgpackr the int `02`) and integers beyond 32 bits (Python writes
 * uint64/int64, msgpackr a float64). The caller vouches that `bytes` hold exactly one value.
 */
export class RawMsgpack {
  constructor(readonly bytes: Uint8Array) {}
}

// Ext type 0x7e is never written: `pack` below writes the raw bytes and returns nothing. msgpackr
// also registers the type for decoding, so that side keeps its usual unknown-extension error.
const RAW_EXT_TYPE = 0x7e;
addExtension({
  Class: RawMsgpack,
  type: RAW_EXT_TYPE,
  pack(raw: RawMsgpack, allocateForWrite: (size: number) => { target: Uint8Array; position: number }) {
    const { target, position } = allocateForWrite(raw.bytes.byteLength);
    target.set(raw.bytes, position);
  },
  unpack() {
    throw new Error(`Unknown extension ${RAW_EXT_TYPE}`);
  },
} as any);

const packr = new Packr({ useRecords: false, variableMapSize: true });
const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: false, int64AsType: 'number' } as any);

/** Encode one value as msgpack bytes. Maps keep their key types (Buffer keys become bin keys). */
export function pack(value: unknown): Buffer {
  return packr.pack(value);
}

/**
 * Decode exactly one msgpack value. Maps come back as `Map`s (keys: string, number or Uint8Array).
 * @throws ProtocolError `bad_msgpack` for bytes that are not one complete msgpack value.
 */
export function unpack(bytes: Uint8Array): unknown {
  if (bytes.byteLength === 0) throw new ProtocolError('bad_msgpack', 'empty message: expected one msgpack value');
  let values: unknown[];
  try {
    values = unpackr.unpackMultiple(bytes as Buffer) as unknown[];
  } catch (e) {
    throw new ProtocolError('bad_msgpack', `message is not valid msgpack: ${(e as Error).message}`);
  }
  if (!values || values.length !== 1) {
    throw new ProtocolError('bad_msgpack', `message holds ${values?.length ?? 0} msgpack values; expected exactly 1`);
  }
  return values[0];
}

/** Byte length of the msgpack value's header and payload at `pos` (containers: the header only) and its item count. */
function head(b: Uint8Array, pos: number): { size: number; items: number } {
  const t = b[pos]!;
  const view = () => new DataView(b.buffer, b.byteOffset, b.byteLength);
  if (t <= 0x7f || t >= 0xe0 || (t >= 0xc0 && t <= 0xc3)) return { size: 1, items: 0 };
  if (t >= 0x80 && t <= 0x8f) return { size: 1, items: 2 * (t & 0x0f) };
  if (t >= 0x90 && t <= 0x9f) return { size: 1, items: t & 0x0f };
  if (t >= 0xa0 && t <= 0xbf) return { size: 1 + (t & 0x1f), items: 0 };
  switch (t) {
    case 0xc4: case 0xd9: return { size: 2 + b[pos + 1]!, items: 0 };
    case 0xc5: case 0xda: return { size: 3 + view().getUint16(pos + 1), items: 0 };
    case 0xc6: case 0xdb: return { size: 5 + view().getUint32(pos + 1), items: 0 };
    case 0xc7: return { size: 3 + b[pos + 1]!, items: 0 };
    case 0xc8: return { size: 4 + view().getUint16(pos + 1), items: 0 };
    case 0xc9: return { size: 6 + view().getUint32(pos + 1), items: 0 };
    case 0xca: return { size: 5, items: 0 };
    case 0xcb: return { size: 9, items: 0 };
    case 0xcc: case 0xd0: return { size: 2, items: 0 };
    case 0xcd: case 0xd1: return { size: 3, items: 0 };
    case 0xce: case 0xd2: return { size: 5, items: 0 };
    case 0xcf: case 0xd3: return { size: 9, items: 0 };
    case 0xd4: return { size: 3, items: 0 };
    case 0xd5: return { size: 4, items: 0 };
    case 0xd6: return { size: 6, items: 0 };
    case 0xd7: return { size: 10, items: 0 };
    case 0xd8: return { size: 18, items: 0 };
    case 0xdc: return { size: 3, items: view().getUint16(pos + 1) };
    case 0xdd: return { size: 5, items: view().getUint32(pos + 1) };
    case 0xde: return { size: 3, items: 2 * view().getUint16(pos + 1) };
    case 0xdf: return { size: 5, items: 2 * view().getUint32(pos + 1) };
  }
  throw new ProtocolError('bad_msgpack', `byte 0x${t.toString(16)} at ${pos} starts no msgpack value`);
}

/** The offset just past the msgpack value at `pos` (iterative: nesting depth costs no stack). */
function skip(b: Uint8Array, pos: number): number {
  let pending = 1;
  while (pending > 0) {
    if (pos >= b.byteLength) throw new ProtocolError('bad_msgpack', 'message ends inside a msgpack value');
    const h = head(b, pos);
    pos += h.size;
    pending += h.items - 1;
  }
  if (pos > b.byteLength) throw new ProtocolError('bad_msgpack', 'message ends inside a msgpack value');
  return pos;
}

/**
 * The exact bytes of the value under key `key` (str or bin) of the top-level msgpack map in `bytes`
 * (the last one when the key repeats, as decoders keep), copied; null when `bytes` is not a map
 * or has no such key. For values whose msgpack type must survive a round trip (request ids: a
 * uint64 stays a uint64, an int64 an int64, a str8 a str8).
 */
export function mapValueBytes(bytes: Uint8Array, key: string): Uint8Array | null {
  if (bytes.byteLength === 0) return null;
  const h = head(bytes, 0);
  const t = bytes[0]!;
  if (!((t >= 0x80 && t <= 0x8f) || t === 0xde || t === 0xdf)) return null;
  const want = Buffer.from(key, 'utf8');
  let pos = h.size;
  let found: Uint8Array | null = null;
  for (let i = 0; i < h.items / 2; i++) {
    const keyStart = pos;
    const keyEnd = skip(bytes, keyStart);
    const valueEnd = skip(bytes, keyEnd);
    const k = bytes.subarray(keyStart, keyEnd);
    // String keys, or bin keys as OpenPI's msgpack_numpy writes them.
    const isKey = (k[0]! >= 0xa0 && k[0]! <= 0xbf) || (k[0]! >= 0xd9 && k[0]! <= 0xdb) || (k[0]! >= 0xc4 && k[0]! <= 0xc6);
    if (isKey && k.byteLength - strHeader(k[0]!) === want.byteLength && Buffer.compare(Buffer.from(k.subarray(strHeader(k[0]!))), want) === 0) {
      found = bytes.slice(keyEnd, valueEnd);
    }
    pos = valueEnd;
  }
  return found;
}

/** Header length of a str or bin value starting with byte `t`. */
function strHeader(t: number): number {
  return t <= 0xbf ? 1 : t === 0xd9 || t === 0xc4 ? 2 : t === 0xda || t === 0xc5 ? 3 : 5;
}

/** A msgpack integer or string, decoded exactly: a number within +-(2^53 - 1), else a bigint; null for any other type. */
export function exactIntOrString(raw: Uint8Array): number | bigint | string | null {
  const t = raw[0]!;
  const v = new DataView(raw.buffer, raw.byteOffset, raw.byteLength);
  let n: bigint;
  if (t <= 0x7f) n = BigInt(t);
  else if (t >= 0xe0) n = BigInt(t - 0x100);
  else if (t === 0xcc) n = BigInt(v.getUint8(1));
  else if (t === 0xcd) n = BigInt(v.getUint16(1));
  else if (t === 0xce) n = BigInt(v.getUint32(1));
  else if (t === 0xcf) n = v.getBigUint64(1);
  else if (t === 0xd0) n = BigInt(v.getInt8(1));
  else if (t === 0xd1) n = BigInt(v.getInt16(1));
  else if (t === 0xd2) n = BigInt(v.getInt32(1));
  else if (t === 0xd3) n = v.getBigInt64(1);
  else if ((t >= 0xa0 && t <= 0xbf) || (t >= 0xd9 && t <= 0xdb)) return Buffer.from(raw.subarray(strHeader(t))).toString('utf8');
  else return null;
  return n >= -BigInt(Number.MAX_SAFE_INTEGER) && n <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(n) : n;
}
