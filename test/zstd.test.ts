import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ProtocolError } from '../protocol/errors.ts';
import { missing, zstdCliReason } from './helpers/requires.ts';
import {
  dictionaryId,
  initZstd,
  isZstdFrame,
  loadObservationDictionary,
  parseZstdFrame,
  zstdCompress,
  zstdDecompress,
} from '../protocol/zstd.ts';

const VEC = new URL('./vectors/zstd/', import.meta.url);
const DICT_PATH = new URL('../protocol/observation.zdict', import.meta.url).pathname;
const VELA_DICT_ID = 0x56454c41; // set by scripts/train_zdict.py
const MiB = 1024 * 1024;

function vec(name: string): Uint8Array {
  return new Uint8Array(readFileSync(new URL(name, VEC)));
}

/** Deterministic bytes that compress somewhat (a ramp with an LCG's noise in the low bits). */
function sample(n: number, seed = 1): Uint8Array {
  const out = new Uint8Array(n);
  let s = seed;
  for (let i = 0; i < n; i++) {
    s = (s * 1103515245 + 12345) >>> 0;
    out[i] = ((i >> 4) + (s >>> 29)) & 255;
  }
  return out;
}

/** Byte equality without vitest's slow element-wise diff of large typed arrays. */
function expectBytes(actual: Uint8Array, expected: Uint8Array): void {
  expect(actual.byteLength).toBe(expected.byteLength);
  expect(Buffer.compare(actual, expected)).toBe(0);
}

function errorOf(fn: () => unknown): ProtocolError {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(ProtocolError);
    return e as ProtocolError;
  }
  throw new Error('expected a ProtocolError, nothing was thrown');
}

let tmp: string;
let dict: Uint8Array;
beforeAll(async () => {
  await initZstd();
  dict = loadObservationDictionary();
  tmp = mkdtempSync(path.join(tmpdir(), 'vela-zstd-'));
});
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

/** Runs the zstd CLI on a file (not stdin: from a pipe it would write no content size). */
function cli(args: string[], input: Uint8Array, name: string): Uint8Array {
  const file = path.join(tmp, name);
  writeFileSync(file, input);
  return new Uint8Array(execFileSync('zstd', [...args, '-q', '-c', file], { maxBuffer: 256 * MiB }));
}

describe('initZstd', () => {
  it('is idempotent', async () => {
    await Promise.all([initZstd(), initZstd()]);
    expect(zstdDecompress(zstdCompress(sample(10)), { maxBytes: 10 })).toEqual(sample(10));
  });
});

describe('one instance of the wasm library per process', () => {
  // The library's init() re-instantiates its module, which made the contexts created by an
  // earlier init() point into a new heap: opening a parquet dataset (whose ZSTD pages used a
  // second init()) broke every later dictionary decode ("memory access out of bounds", then
  // error -14 on each call). The frame is a real G1 observation, made by Python.
  it('dictionary decoding still works after a LeRobot dataset opens its parquet files', async () => {
    const msg = vec('g1-obs96.msgpack');
    expectBytes(zstdDecompress(vec('g1-obs96.dict.zst'), { dict, maxBytes: MiB }), msg);
    const { openDataset } = await import('../server/datasets/index.ts');
    const { G1_DIR } = await import('../bench/harness/g1.ts');
    const ds = await openDataset(G1_DIR);
    expect(ds.table(0).state.length).toBeGreaterThan(0);
    expectBytes(zstdDecompress(vec('g1-obs96.dict.zst'), { dict, maxBytes: MiB }), msg);
    expectBytes(zstdDecompress(zstdCompress(msg, { dict }), { dict, maxBytes: MiB }), msg);
  });
});

describe('frame header', () => {
  it('recognises the magic', () => {
    expect(isZstdFrame(Uint8Array.of(0x28, 0xb5, 0x2f, 0xfd, 0))).toBe(true);
    expect(isZstdFrame(Uint8Array.of(0x28, 0xb5, 0x2f))).toBe(false);
    expect(isZstdFrame(Uint8Array.of(0x82, 0xa1, 0x61, 0x01))).toBe(false);
  });

  it('reads every Frame_Content_Size width, including the +256 of the 2-byte field', () => {
    for (const n of [0, 1, 255, 256, 257, 65791, 65792, 300000]) {
      const frame = zstdCompress(sample(n, n));
      const info = parseZstdFrame(frame);
      expect(info).toEqual({ contentSize: n, dictionaryId: 0, frameBytes: frame.byteLength });
    }
  });

  it('reads the dictionary id of a dictionary and of a frame made with it', () => {
    expect(dictionaryId(dict)).toBe(VELA_DICT_ID);
    expect(dictionaryId(new TextEncoder().encode('a raw-content dictionary has no id'))).toBe(0);
    expect(parseZstdFrame(zstdCompress(sample(1000), { dict })).dictionaryId).toBe(VELA_DICT_ID);
  });

  it('ships a dictionary within 112 KB', () => {
    expect(dict.byteLength).toBeLessThanOrEqual(112 * 1024);
    expect(dict.byteLength).toBe(112640);
  });
});

describe('round trips', () => {
  it('without a dictionary, at level 1 and 19', () => {
    const data = sample(200_000);
    for (const level of [1, 19]) {
      const frame = zstdCompress(data, { level });
      expect(frame.byteLength).toBeLessThan(data.byteLength);
      expectBytes(zstdDecompress(frame, { maxBytes: data.byteLength }), data);
    }
  });

  it('with the observation dictionary, which shrinks a small observation', () => {
    const msg = vec('obs.msgpack');
    const withDict = zstdCompress(msg, { dict });
    expectBytes(zstdDecompress(withDict, { dict, maxBytes: MiB }), msg);
    expect(withDict.byteLength).toBeLessThan(zstdCompress(msg).byteLength);
  });

  it('decodes a frame without a dictionary id even when a dictionary is given', () => {
    const data = sample(5000);
    expectBytes(zstdDecompress(zstdCompress(data), { dict, maxBytes: 5000 }), data);
  });

  it('decodes python-zstandard frames (with and without the dictionary)', () => {
    const msg = vec('obs.msgpack');
    expect(msg.byteLength).toBe(391);
    expectBytes(zstdDecompress(vec('obs.dict.zst'), { dict, maxBytes: MiB }), msg);
    expectBytes(zstdDecompress(vec('obs.nodict.zst'), { maxBytes: MiB }), msg);
  });
});

describe.skipIf(missing('the zstd CLI', zstdCliReason()))('the zstd CLI', () => {
  const msg = () => vec('obs.msgpack');
  const big = () => sample(3 * MiB + 17, 7);

  it('makes frames with our dictionary that we decode', () => {
    for (const [name, data] of [['obs', msg()], ['big', big()]] as const) {
      const frame = cli(['-1', '-D', DICT_PATH], data, `${name}.bin`);
      const info = parseZstdFrame(frame);
      expect(info.dictionaryId).toBe(VELA_DICT_ID);
      expect(info.contentSize).toBe(data.byteLength);
      expectBytes(zstdDecompress(frame, { dict, maxBytes: 64 * MiB }), data);
    }
  });

  it('decodes our frames, with our dictionary and without one', () => {
    for (const [name, data] of [['obs', msg()], ['big', big()]] as const) {
      expectBytes(cli(['-d', '-D', DICT_PATH], zstdCompress(data, { dict }), `${name}.d.zst`), data);
      expectBytes(cli(['-d'], zstdCompress(data), `${name}.zst`), data);
    }
  });

  it('with a corrupted byte is refused (the CLI writes a checksum)', () => {
    const frame = cli(['-1'], sample(100_000), 'c.bin');
    frame[Math.floor(frame.byteLength / 2)]! ^= 0x40;
    const err = errorOf(() => zstdDecompress(frame, { maxBytes: MiB }));
    expect(err.code).toBe('bad_zstd');
  });
});

describe('refusals', () => {
  it('a frame made with the dictionary, decoded without one', () => {
    const err = errorOf(() => zstdDecompress(zstdCompress(sample(100), { dict }), { maxBytes: MiB }));
    expect(err.code).toBe('dictionary_mismatch');
    expect(err.message).toContain('dictionary mismatch');
    expect(err.message).toContain(String(VELA_DICT_ID));
    expect(err.message).toContain('no dictionary was given');
  });

  it('a frame made with another dictionary names both ids', () => {
    const other = dict.slice();
    new DataView(other.buffer).setUint32(4, 123456, true);
    expect(dictionaryId(other)).toBe(123456);
    const frame = zstdCompress(sample(100), { dict: other });
    const err = errorOf(() => zstdDecompress(frame, { dict, maxBytes: MiB }));
    expect(err.code).toBe('dictionary_mismatch');
    expect(err.message).toContain('dictionary mismatch');
    expect(err.message).toContain('123456');
    expect(err.message).toContain(String(VELA_DICT_ID));
  });

  it('every truncation of a frame', () => {
    const frame = zstdCompress(sample(3000), { dict });
    for (let n = 0; n < frame.byteLength; n++) {
      expect(errorOf(() => zstdDecompress(frame.subarray(0, n), { dict, maxBytes: MiB })).code).toBe('bad_zstd');
    }
  });

  it('bytes after the frame, and two frames', () => {
    const frame = zstdCompress(sample(300));
    const extra = new Uint8Array([...frame, 0]);
    expect(errorOf(() => zstdDecompress(extra, { maxBytes: MiB })).message).toMatch(/^1 bytes follow the zstd frame/);
    const two = new Uint8Array([...frame, ...frame]);
    expect(errorOf(() => zstdDecompress(two, { maxBytes: MiB })).code).toBe('bad_zstd');
  });

  it('not a frame, a skippable frame, a reserved bit', () => {
    expect(errorOf(() => zstdDecompress(vec('obs.msgpack'), { maxBytes: MiB })).code).toBe('bad_zstd');
    const skippable = Uint8Array.of(0x50, 0x2a, 0x4d, 0x18, 0, 0, 0, 0);
    expect(errorOf(() => zstdDecompress(skippable, { maxBytes: MiB })).code).toBe('bad_zstd');
    const reserved = zstdCompress(sample(300));
    reserved[4]! |= 0x08;
    expect(errorOf(() => zstdDecompress(reserved, { maxBytes: MiB })).message).toContain('reserved bit');
  });

  it('a block shorter than the declared content size', () => {
    // single-segment, 1-byte size 10, then one raw last block of 5 bytes
    const frame = Uint8Array.of(0x28, 0xb5, 0x2f, 0xfd, 0x20, 10, 0x29, 0, 0, 1, 2, 3, 4, 5);
    expect(parseZstdFrame(frame)).toEqual({ contentSize: 10, dictionaryId: 0, frameBytes: 14 });
    expect(errorOf(() => zstdDecompress(frame, { maxBytes: MiB })).code).toBe('bad_zstd');
  });

  it('a content size over the bound, checked before decoding', () => {
    const data = sample(1000);
    const frame = zstdCompress(data);
    const err = errorOf(() => zstdDecompress(frame, { maxBytes: 999 }));
    expect(err.code).toBe('too_large');
    expect(err.message).toBe('zstd frame decompresses to 1000 bytes; the limit is 999');
    expectBytes(zstdDecompress(frame, { maxBytes: 1000 }), data);
    // A 17-byte frame claiming 2^40 bytes (8-byte size field): refused from its header alone.
    const bomb = Uint8Array.of(0x28, 0xb5, 0x2f, 0xfd, 0xe0, 0, 0, 0, 0, 0, 1, 0, 0, 0x03, 0, 0, 0);
    expect(parseZstdFrame(bomb).contentSize).toBe(2 ** 40);
    expect(errorOf(() => zstdDecompress(bomb, { maxBytes: 64 * MiB })).message).toBe(
      `zstd frame decompresses to ${2 ** 40} bytes; the limit is ${64 * MiB}`,
    );
  });

  it('a frame that does not declare its content size', () => {
    const frame = vec('obs.nosize.zst');
    expect(parseZstdFrame(frame).contentSize).toBe(null);
    const err = errorOf(() => zstdDecompress(frame, { maxBytes: MiB }));
    expect(err.code).toBe('too_large');
    expect(err.message).toContain('does not declare its content size');
  });
});
