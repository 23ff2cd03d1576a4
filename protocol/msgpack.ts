/**
 * The one msgpack configuration used on every wire of Vela.
 *
 * - `useRecords: false`: never msgpackr's record extension (Python clients cannot read it).
 * - `mapsAsObjects: false` on decode: OpenPI's ndarrays use *binary* map keys (b"__ndarray__"),
 *   which only survive as keys of a `Map`. Decoded maps are therefore `Map`s; `toPlain` turns them
 *   into plain objects once the ndarrays inside have been recognised.
 * - `variableMapSize: true`: maps get the smallest header (fixmap), as Python's msgpack writes.
 * - Bin keys are encoded by putting `Buffer` keys in a `Map`.
 * - Known difference from Python: integral numbers beyond 32 bits are written as float64 (exact
 *   to 2^53); JS cannot tell 1 from 1.0, so integral floats are written as ints.
 */
import { Packr, Unpackr } from 'msgpackr';
import { ProtocolError } from './errors.ts';

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
