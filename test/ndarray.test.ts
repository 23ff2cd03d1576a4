import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { ProtocolError, type ProtocolErrorCode } from '../protocol/errors.ts';
import { pack } from '../protocol/msgpack.ts';
import {
  NDArray,
  NpScalar,
  decodeNDArray,
  encodeNDArray,
  fromWire,
  ndarray,
  packNumpy,
  toWire,
  unpackNumpy,
} from '../protocol/ndarray.ts';
import { dataToBytes, floatBitsToHalf, halfToFloatBits, parseDtype } from '../protocol/numpy_dtype.ts';

// Vectors written by scripts/make_ndarray_vectors.py with OpenPI's pack_array rules.
const DIR = new URL('./vectors/ndarray/', import.meta.url);
type Case = { name: string; file: string; bytes: number; reencode: boolean; expect: unknown };
const manifest: Case[] = JSON.parse(readFileSync(new URL('manifest.json', DIR), 'utf8'));
const vector = (file: string) => readFileSync(new URL(file, DIR));
const sha256 = (b: Uint8Array) => createHash('sha256').update(b).digest('hex');

function expectCode(fn: () => unknown, code: ProtocolErrorCode, ...inMessage: string[]): void {
  let caught: unknown;
  try {
    fn();
  } catch (e) {
    caught = e;
  }
  expect(caught).toBeInstanceOf(ProtocolError);
  expect((caught as ProtocolError).code).toBe(code);
  for (const s of inMessage) expect((caught as ProtocolError).message).toContain(s);
}

/** The manifest's encoding of one element (see the script's docstring) -> a comparable JS value. */
function expectedElement(v: unknown, kind: string, itemsize: number): number | bigint {
  if (kind === 'b') return v ? 1 : 0;
  if (kind !== 'f') return itemsize === 8 ? BigInt(v as string) : (v as number);
  return ({ nan: NaN, inf: Infinity, '-inf': -Infinity, '-0': -0 } as Record<string, number>)[v as string] ?? (v as number);
}

/** Assert that a decoded tree matches the manifest's description of it. */
function checkTree(got: unknown, want: unknown, path: string): void {
  if (want && typeof want === 'object' && '$ndarray' in want) {
    const w = want.$ndarray as { dtype: string; shape: number[]; sha256: string; values?: unknown[]; gen?: Record<string, number> };
    expect(got, path).toBeInstanceOf(NDArray);
    const arr = got as NDArray;
    expect(arr.dtype, path).toBe(w.dtype);
    expect(arr.shape, path).toEqual(w.shape);
    expect(sha256(dataToBytes(arr.data, parseDtype(arr.dtype))), path).toBe(w.sha256);
    const dt = parseDtype(w.dtype);
    const n = w.shape.reduce((a, b) => a * b, 1);
    expect(arr.data.length, path).toBe(n);
    for (let i = 0; i < n; i++) {
      const g = w.gen;
      const want = g ? ((i * g.a + g.b) % g.m) * g.scale + g.offset : expectedElement(w.values![i], dt.kind, dt.itemsize);
      const have = arr.data[i];
      if (!Object.is(have, want)) expect(have, `${path}[${i}]`).toBe(want); // Object.is tells -0 and NaN apart
    }
    return;
  }
  if (want && typeof want === 'object' && '$npgeneric' in want) {
    const w = want.$npgeneric as { dtype: string; value: unknown };
    expect(got, path).toBeInstanceOf(NpScalar);
    expect((got as NpScalar).dtype, path).toBe(w.dtype);
    expect((got as NpScalar).value, path).toBe(typeof w.value === 'string' ? Number(w.value) : w.value);
    return;
  }
  if (Array.isArray(want)) {
    expect(Array.isArray(got), path).toBe(true);
    expect((got as unknown[]).length, path).toBe(want.length);
    want.forEach((w, i) => checkTree((got as unknown[])[i], w, `${path}[${i}]`));
    return;
  }
  if (want && typeof want === 'object') {
    expect(Object.keys(got as object), path).toEqual(Object.keys(want));
    for (const [k, w] of Object.entries(want)) checkTree((got as Record<string, unknown>)[k], w, `${path}.${k}`);
    return;
  }
  expect(got, path).toBe(want);
}

describe('OpenPI msgpack_numpy vectors', () => {
  it('has the cases the protocol needs', () => {
    const names = manifest.map((c) => c.name);
    for (const n of ['f4_50x32', 'u1_224x224x3', 'b1_2x3', 'i8_5', 'f4be_2x3', 'f8_0d', 'f4_0x3', 'f2_8', 'obs_droid', 'obs_aloha', 'npgeneric_f4_1_5']) {
      expect(names).toContain(n);
    }
    expect(manifest.length).toBe(44);
  });

  for (const c of manifest) {
    it(`${c.name}: decodes to the expected values${c.reencode ? ' and re-encodes to the same bytes' : ''}`, () => {
      const bytes = vector(c.file);
      expect(bytes.length).toBe(c.bytes);
      const decoded = unpackNumpy(bytes);
      checkTree(decoded, c.expect, c.name);
      if (c.reencode) {
        const again = pack(toWire(decoded));
        expect(again.toString('hex')).toBe(bytes.toString('hex'));
      }
    });
  }

  it('decodes the same at every byte offset, and never aliases the message', () => {
    for (const c of manifest) {
      const bytes = vector(c.file);
      const reference = packNumpy(unpackNumpy(bytes)).toString('hex');
      for (let offset = 1; offset < 8; offset++) {
        const shifted = Buffer.alloc(bytes.length + offset);
        bytes.copy(shifted, offset);
        const message = shifted.subarray(offset);
        const decoded = unpackNumpy(message);
        message.fill(0xee); // a dead uWS buffer
        expect(packNumpy(decoded).toString('hex'), `${c.name} at offset ${offset}`).toBe(reference);
      }
    }
  });

  it('decodes f4 data that sits at an odd address into an aligned Float32Array', () => {
    const bytes = vector('f4_50x32.msgpack');
    const at = bytes.indexOf(Buffer.from('data')) + 4 + 3; // after the bin16 header c5 hi lo
    expect(bytes[at - 3]).toBe(0xc5);
    const shifted = Buffer.alloc(bytes.length + 1);
    bytes.copy(shifted, 1);
    expect((shifted.byteOffset + 1 + at) % 2).toBe(1);
    const arr = unpackNumpy(shifted.subarray(1)) as NDArray<Float32Array>;
    expect(arr.data).toBeInstanceOf(Float32Array);
    expect(arr.data.byteOffset % 4).toBe(0);
    expect(arr.data[0]).toBe(bytes.readFloatLE(at));
    expect(arr.data[0]).toBe(11 / 64 - 7.8125);
    expect(arr.data[1599]).toBe(((1599 * 37 + 11) % 1000) / 64 - 7.8125);
  });
});

describe('float16', () => {
  const vectors = JSON.parse(readFileSync(new URL('float16.json', DIR), 'utf8'));
  const toHalfLE = (inputs: Uint32Array) => dataToBytes(new Float32Array(inputs.buffer), parseDtype('<f2'));

  it('rounds the explicit boundary cases as numpy does', () => {
    for (const [input, output] of vectors.explicit as [number, number][]) {
      expect(floatBitsToHalf(input), `0x${input.toString(16)}`).toBe(output);
    }
  });

  it('rounds 2^20 hashed float32 bit patterns exactly as numpy (nearest, ties to even; NaN payloads kept)', () => {
    const n = vectors.hashed.n as number;
    const inputs = new Uint32Array(n);
    for (let i = 0; i < n; i++) inputs[i] = Number((BigInt(i) * 2654435761n) % 4294967296n);
    expect(sha256(toHalfLE(inputs))).toBe(vectors.hashed.sha256_f16_le);
  });

  it('rounds the sweep over every float16 rounding boundary exactly as numpy', () => {
    const out: number[] = [];
    for (const sign of [0, 1]) for (let exp = 100; exp < 145; exp++) {
      for (const high of [0, 1, 0x155, 0x2aa, 0x3ff]) for (const low of [0, 1, 0xfff, 0x1000, 0x1001, 0x1fff]) {
        out.push(((sign << 31) | (exp << 23) | (high << 13) | low) >>> 0);
      }
    }
    expect(out.length).toBe(vectors.sweep.n);
    expect(sha256(toHalfLE(Uint32Array.from(out)))).toBe(vectors.sweep.sha256_f16_le);
  });

  it('widens all 65536 float16 bit patterns exactly as numpy, and narrowing them back is the identity', () => {
    const halves = new Uint16Array(65536).map((_, i) => i);
    const wide = decodeNDArray(new Map<string, unknown>([['__ndarray__', true], ['data', new Uint8Array(halves.buffer)], ['dtype', '<f2'], ['shape', [65536]]]));
    expect(sha256(new Uint8Array(wide.data.buffer))).toBe(vectors.all_halves.sha256_f32_le);
    for (let h = 0; h < 65536; h++) {
      if (floatBitsToHalf(halfToFloatBits(h)) !== h) expect(floatBitsToHalf(halfToFloatBits(h))).toBe(h);
    }
  });
});

describe('round trip of every dtype in every byte-order spelling', () => {
  // Elements, and their bytes little-endian written independently with DataView.
  const samples: Record<string, { values: (number | bigint | boolean)[]; write: (v: DataView, at: number, x: any) => void }> = {
    b1: { values: [true, false, true], write: (v, at, x) => v.setUint8(at, x ? 1 : 0) },
    i1: { values: [0, -1, 127, -128], write: (v, at, x) => v.setInt8(at, x) },
    u1: { values: [0, 1, 255, 128], write: (v, at, x) => v.setUint8(at, x) },
    i2: { values: [0, -1, 32767, -32768, 258], write: (v, at, x) => v.setInt16(at, x, true) },
    u2: { values: [0, 65535, 258], write: (v, at, x) => v.setUint16(at, x, true) },
    i4: { values: [0, -1, 2147483647, -2147483648, 16909060], write: (v, at, x) => v.setInt32(at, x, true) },
    u4: { values: [0, 4294967295, 16909060], write: (v, at, x) => v.setUint32(at, x, true) },
    i8: { values: [0n, -1n, 9223372036854775807n, -9223372036854775808n, 72623859790382856n], write: (v, at, x) => v.setBigInt64(at, x, true) },
    u8: { values: [0n, 18446744073709551615n, 9007199254740993n], write: (v, at, x) => v.setBigUint64(at, x, true) },
    f2: { values: [0, 1, -2.5, 65504, 2 ** -24], write: (v, at, x) => v.setUint16(at, ({ 0: 0, 1: 0x3c00, [-2.5]: 0xc100, 65504: 0x7bff } as any)[x] ?? 0x0001, true) },
    f4: { values: [0, 1.5, -3.25, Infinity, 2 ** -149], write: (v, at, x) => v.setFloat32(at, x, true) },
    f8: { values: [0, 0.1, -1e300, -Infinity, 5e-324], write: (v, at, x) => v.setFloat64(at, x, true) },
  };

  for (const [code, { values, write }] of Object.entries(samples)) {
    for (const order of ['<', '>', '|', '=', '']) {
      const dtype = order + code;
      it(`'${dtype}'`, () => {
        const size = Number(code.slice(1));
        const little = new DataView(new ArrayBuffer(values.length * size));
        values.forEach((x, i) => write(little, i * size, x));
        const wantBytes = new Uint8Array(little.buffer);
        if (order === '>' && size > 1) {
          for (let i = 0; i < wantBytes.length; i += size) wantBytes.subarray(i, i + size).reverse();
        }
        // our value (dtype kept verbatim) -> wire, as a decoder would produce it
        const decoded = decodeNDArray(new Map<Buffer, unknown>([[Buffer.from('__ndarray__'), true], [Buffer.from('data'), wantBytes], [Buffer.from('dtype'), dtype], [Buffer.from('shape'), [values.length]]]));
        expect(decoded.dtype).toBe(dtype);
        expect([...decoded.data]).toEqual(values.map((x) => (typeof x === 'boolean' ? Number(x) : x)));
        const wire = unpackNumpy(packNumpy({ a: decoded })) as { a: NDArray };
        expect(wire.a.dtype).toBe(dtype);
        expect(Buffer.from(dataToBytes(wire.a.data, parseDtype(dtype))).toString('hex')).toBe(Buffer.from(wantBytes).toString('hex'));
        // ndarray() from plain values gives numpy's canonical dtype string and the same bytes
        const built = ndarray(values as number[], [values.length], dtype);
        expect(built.dtype).toBe((size === 1 ? '|' : order === '>' ? '>' : '<') + code);
        const [key, dataBin] = [...encodeNDArray(built)][1] as [Buffer, Uint8Array];
        expect(key.toString()).toBe('data');
        expect(Buffer.from(dataBin).toString('hex')).toBe(Buffer.from(wantBytes).toString('hex'));
      });
    }
  }
});

describe('refusals', () => {
  const wire = (fields: Record<string, unknown>, binKeys = true) =>
    new Map(Object.entries(fields).map(([k, v]) => [binKeys ? Buffer.from(k) : k, v] as [unknown, unknown]));
  const f4 = (dtype: unknown, shape: unknown, data: unknown = new Uint8Array(24)) => wire({ __ndarray__: true, data, dtype, shape });

  it('object, void and complex dtypes: unsupported_dtype naming the dtype', () => {
    for (const dtype of ['|O', '|O8', '|V8', '<V16', '<c8', '<c16', '>c8', 'O']) {
      expectCode(() => fromWire(f4(dtype, [3])), 'unsupported_dtype', `'${dtype}'`);
    }
  });

  it('unknown dtype strings: unsupported_dtype naming the dtype', () => {
    for (const dtype of ['<f3', '<x4', 'float128', '<f16', '<i16', '', 'f', '<b2', '<<f4', 'complex64']) {
      expectCode(() => fromWire(f4(dtype, [6])), 'unsupported_dtype', `'${dtype}'`);
    }
  });

  it('a dtype that is not a string: bad_ndarray', () => {
    expectCode(() => fromWire(f4(4, [6])), 'bad_ndarray', 'dtype');
    expectCode(() => fromWire(f4(Buffer.from('<f4'), [6])), 'bad_ndarray', 'dtype');
  });

  it('shape product x itemsize != data length: shape_mismatch quoting both numbers', () => {
    expectCode(() => fromWire(f4('<f4', [2, 3], new Uint8Array(20))), 'shape_mismatch', '24', '20');
    expectCode(() => fromWire(f4('<f4', [], new Uint8Array(0))), 'shape_mismatch', '4', '0');
    expectCode(() => fromWire(f4('<f8', [0, 3], new Uint8Array(8))), 'shape_mismatch', '0', '8');
  });

  it('negative, non-integer or non-number shape entries, or no shape: bad_ndarray', () => {
    expectCode(() => fromWire(f4('<f4', [-2, -3])), 'bad_ndarray', '-2');
    expectCode(() => fromWire(f4('<f4', [1.5, 4])), 'bad_ndarray', '1.5');
    expectCode(() => fromWire(f4('<f4', ['6'])), 'bad_ndarray', 'shape');
    expectCode(() => fromWire(f4('<f4', 6)), 'bad_ndarray', 'shape');
    expectCode(() => fromWire(f4('<f4', undefined)), 'bad_ndarray', 'shape');
    expectCode(() => fromWire(f4('<f4', [2 ** 40, 2 ** 40, 0], new Uint8Array(0))), 'bad_ndarray', 'too big');
  });

  it('data that is not bin, or missing: bad_ndarray', () => {
    expectCode(() => fromWire(f4('<f4', [1], 'abcd')), 'bad_ndarray', 'bin');
    expectCode(() => fromWire(f4('<f4', [1], [1, 2, 3, 4])), 'bad_ndarray', 'bin');
    expectCode(() => fromWire(f4('<f4', [1], 7)), 'bad_ndarray', 'bin');
    expectCode(() => fromWire(wire({ __ndarray__: true, dtype: '<f4', shape: [1] })), 'bad_ndarray', "'data'");
  });

  it('the same refusals come through unpackNumpy from bytes', () => {
    expectCode(() => unpackNumpy(pack(f4('<c8', [3]))), 'unsupported_dtype', "'<c8'");
    expectCode(() => unpackNumpy(pack({ obs: f4('<f4', [5]) })), 'shape_mismatch', '20', '24');
  });

  it('numpy scalars whose data does not fit their dtype: bad_ndarray', () => {
    const s = (dtype: string, data: unknown) => wire({ __npgeneric__: true, data, dtype });
    expectCode(() => fromWire(s('|u1', 300)), 'bad_ndarray', '300');
    expectCode(() => fromWire(s('|u1', -1)), 'bad_ndarray', '-1');
    expectCode(() => fromWire(s('<i4', 1.5)), 'bad_ndarray', '1.5');
    expectCode(() => fromWire(s('<f4', 'x')), 'bad_ndarray', "'x'");
    expectCode(() => fromWire(s('|b1', 'true')), 'bad_ndarray');
    expectCode(() => fromWire(s('<c8', 1)), 'unsupported_dtype', "'<c8'");
  });

  it('ndarray(): wrong element type, wrong length, missing dtype', () => {
    expectCode(() => ndarray(new Float64Array(6), [2, 3], '<f4'), 'bad_ndarray', 'Float32Array', 'Float64Array');
    expectCode(() => ndarray(new Float32Array(5), [2, 3]), 'shape_mismatch', '6', '5');
    expectCode(() => ndarray([1, 2], [2]), 'bad_ndarray', 'dtype');
    expectCode(() => ndarray(new Float32Array(2), [2], '|O'), 'unsupported_dtype', "'|O'");
    expectCode(() => new NDArray('<f2', [2], new Uint16Array(2)), 'bad_ndarray', 'Float32Array');
  });

  it('toWire refuses a bare typed array (its dtype would be lost)', () => {
    expectCode(() => toWire({ state: new Float32Array(3) }), 'bad_request', 'Float32Array');
  });

  it('fromWire refuses a key given both as str and as bin, and non-string keys', () => {
    expectCode(() => fromWire(new Map<unknown, unknown>([['a', 1], [Buffer.from('a'), 2]])), 'bad_request', "'a'");
    expectCode(() => fromWire(new Map<unknown, unknown>([[null, 1]])), 'bad_request', 'nil');
    expectCode(() => fromWire(new Map<unknown, unknown>([[Buffer.from([0xff, 0xfe]), 1]])), 'bad_request', 'UTF-8');
  });
});

describe('decoding details', () => {
  it('refuses msgpackr references: a cycle, and a shared subtree (2^40 nodes if walked)', () => {
    // d6 69 = msgpackr's "this map has id 1", d6 70 = "the map with id 1": {x: 1, self: <itself>}
    const cyclic = Buffer.from('d6690000000182a17801a473656c66d67000000001', 'hex');
    expectCode(() => unpackNumpy(cyclic), 'bad_msgpack', 'twice');
    let shared: unknown = [1];
    for (let i = 0; i < 40; i++) shared = [shared, shared];
    expectCode(() => fromWire(shared), 'bad_msgpack', 'twice');
    let deep: unknown = 1;
    for (let i = 0; i < 1001; i++) deep = [deep];
    expectCode(() => fromWire(deep), 'bad_request', '1000');
  });

  it('accepts string keys, in a Map or a plain object, in any order', () => {
    const data = Buffer.from(Float32Array.of(1, 2, 3, 4).buffer);
    const forms = [
      new Map<string, unknown>([['shape', [2, 2]], ['dtype', '<f4'], ['data', data], ['__ndarray__', true]]),
      { __ndarray__: true, data, dtype: '<f4', shape: [2, 2] },
      new Map<unknown, unknown>([['__ndarray__', true], [Buffer.from('data'), data], ['dtype', '<f4'], [Buffer.from('shape'), [2, 2]]]),
    ];
    for (const form of forms) {
      const arr = fromWire({ x: form }) as { x: NDArray };
      expect(arr.x.shape).toEqual([2, 2]);
      expect([...arr.x.data]).toEqual([1, 2, 3, 4]);
    }
  });

  it('re-encodes a string-keyed array with bin keys (what Python clients look up)', () => {
    const bytes = vector('string_keys.msgpack');
    const out = packNumpy(unpackNumpy(bytes));
    const expected = Buffer.concat([
      Buffer.from('84c40b5f5f6e6461727261795f5fc3c40464617461c408', 'hex'),
      Buffer.from(Float32Array.of(1, 2).buffer),
      Buffer.from('c40564747970', 'hex'), Buffer.from('65a33c6634c40573686170659102', 'hex'),
    ]);
    expect(out.toString('hex')).toBe(expected.toString('hex'));
  });

  it('bool bytes other than 0/1 read as 1 (numpy reads them as True)', () => {
    const arr = decodeNDArray({ __ndarray__: true, data: Uint8Array.of(0, 2, 255), dtype: '|b1', shape: [3] });
    expect([...arr.data]).toEqual([0, 1, 1]);
  });

  it('plain maps become plain objects; bin values become Buffer copies; __proto__ stays data', () => {
    const bin = Buffer.from([1, 2, 3]);
    const tree = fromWire(new Map<unknown, unknown>([[Buffer.from('img'), bin], ['__proto__', new Map([['x', 1]])], [7, 'seven']])) as any;
    expect(Object.keys(tree)).toEqual(['7', 'img', '__proto__']);
    expect(Object.getPrototypeOf(tree)).toBe(Object.prototype);
    expect(tree['__proto__']).toEqual({ x: 1 });
    expect(Buffer.isBuffer(tree.img)).toBe(true);
    bin[0] = 9;
    expect([...tree.img]).toEqual([1, 2, 3]);
  });

  it('numpy scalars round a float to their dtype, as np.float32(x) does', () => {
    const s = fromWire({ __npgeneric__: true, data: 0.1, dtype: '<f4' }) as NpScalar;
    expect(s.value).toBe(Math.fround(0.1));
    const h = fromWire({ __npgeneric__: true, data: 0.1, dtype: '<f2' }) as NpScalar;
    expect(h.value).toBe(0.0999755859375);
  });

  it('0-d and zero-size arrays', () => {
    const scalar = ndarray(Float64Array.of(3.25), []);
    expect(pack(toWire(scalar)).toString('hex')).toBe(vector('f8_0d.msgpack').toString('hex'));
    const empty = ndarray(new Float32Array(0), [0, 3]);
    expect(pack(toWire(empty)).toString('hex')).toBe(vector('f4_0x3.msgpack').toString('hex'));
    expect((unpackNumpy(packNumpy(empty)) as NDArray).shape).toEqual([0, 3]);
  });
});

describe('encoding from JS values', () => {
  it('builds the DROID observation from plain JS with bytes identical to Python', () => {
    const image = (a: number, b: number) => {
      const u = new Uint8Array(32 * 32 * 3);
      for (let i = 0; i < u.length; i++) u[i] = (i * a + b) % 256;
      return ndarray(u, [32, 32, 3]);
    };
    const obs = {
      'observation/exterior_image_1_left': image(5, 1),
      'observation/wrist_image_left': image(3, 100),
      'observation/joint_position': ndarray(Float32Array.of(0.1, -0.5, 0.25, -2.0, 0.0, 1.5, 0.75), [7]),
      'observation/gripper_position': ndarray([0.5], [1], 'float32'),
      prompt: 'pick up the bottle',
    };
    expect(packNumpy(obs).toString('hex')).toBe(vector('obs_droid.msgpack').toString('hex'));
  });

  it('writes numpy scalars as Python does: float64 even when integral, uint64/int64 past 32 bits', () => {
    const cases: [NpScalar, string][] = [
      [new NpScalar('<f4', 2), 'npgeneric_f4_2'],
      [new NpScalar('<f4', 1.5), 'npgeneric_f4_1_5'],
      [new NpScalar('<i8', 2 ** 40), 'npgeneric_i8_2p40'],
      [new NpScalar('<i8', -(2 ** 40)), 'npgeneric_i8_neg2p40'],
      [new NpScalar('<i8', -7), 'npgeneric_i8_neg7'],
      [new NpScalar('|u1', 200), 'npgeneric_u1_200'],
      [new NpScalar('<i4', -300), 'npgeneric_i4_neg300'],
      [new NpScalar('|b1', true), 'npgeneric_b1'],
    ];
    for (const [s, name] of cases) expect(packNumpy(s).toString('hex'), name).toBe(vector(`${name}.msgpack`).toString('hex'));
  });

  it('writes a big-endian array from native values', () => {
    const arr = ndarray([-2, -0.75, 0.5, 1.75, 3, 4.25], [2, 3], '>f4');
    expect(packNumpy(arr).toString('hex')).toBe(vector('f4be_2x3.msgpack').toString('hex'));
    expect(arr.data).toBeInstanceOf(Float32Array);
  });

  it('ndarray() writes numpy canonical dtype strings', () => {
    expect(ndarray([1], [1], 'float32').dtype).toBe('<f4');
    expect(ndarray([1], [1], 'uint8').dtype).toBe('|u1');
    expect(ndarray([true], [1], '?').dtype).toBe('|b1');
    expect(ndarray([1], [1], '=i2').dtype).toBe('<i2');
    expect(ndarray(new BigInt64Array(1), [1]).dtype).toBe('<i8');
    expect(ndarray([70000], [1], '<f2').data[0]).toBe(Infinity);
  });
});

describe('reserved bytes', () => {
  it('refuses msgpack 0xc1 at the top and nested, instead of passing msgpackr marker objects on', async () => {
    const { unpackNumpy } = await import('../protocol/ndarray.ts');
    expect(() => unpackNumpy(new Uint8Array([0xc1]))).toThrow(/reserved msgpack byte 0xc1/);
    expect(() => unpackNumpy(new Uint8Array([0x81, 0xa1, 0x61, 0xc1]))).toThrow(/reserved msgpack byte 0xc1/);
  });
});
