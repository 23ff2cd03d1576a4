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
