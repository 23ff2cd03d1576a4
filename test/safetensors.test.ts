import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import {
  CheckpointError,
  bf16BitsToF32,
  decodeSafetensors,
  encodeSafetensors,
  f16BitsToF32,
  f32ToBf16Bits,
  f32ToF16Bits,
  type SafeTensor,
} from '../kernels/safetensors.ts';

const dir = new URL('./vectors/safetensors/', import.meta.url);
const fixture = (name: string) => new Uint8Array(readFileSync(new URL(name, dir)));
type Value = number | string;
interface Described { dtype: string; shape: number[]; values: Value[] }
const expected = JSON.parse(readFileSync(new URL('expected.json', dir), 'utf8')) as {
  f32: Record<string, Described>;
  mixed: Record<string, Described>;
  metadata: Record<string, Record<string, string> | null>;
  f16_source: Value[];
  bf16_source: Value[];
};

const num = (v: Value): number => (v === 'nan' ? NaN : v === 'inf' ? Infinity : v === '-inf' ? -Infinity : (v as number));

/** Compares decoded values with the Python-side description, exactly (Object.is: -0, NaN). */
function expectValues(t: SafeTensor, d: Described): void {
  expect(t.dtype).toBe(d.dtype);
  expect(t.shape).toEqual(d.shape);
  const got = Array.from(t.data as ArrayLike<number | bigint>);
  if (d.dtype === 'I64') expect(got.map(String)).toEqual(d.values);
  else expect(got.map((x) => Number(x))).toEqual(d.values.map(num));
}

function f32Tensors(): Record<string, SafeTensor> {
  const out: Record<string, SafeTensor> = {};
  // Insertion order deliberately differs from the file's (sorted) order.
  for (const [name, d] of Object.entries(expected.f32).reverse()) {
    out[name] = { dtype: 'F32', shape: d.shape, data: Float32Array.from(d.values.map(num)) };
  }
  return out;
}

describe('safetensors against the Python library', () => {
  it('encodes F32 tensors with metadata byte for byte as safetensors.numpy.save_file', () => {
    const ours = encodeSafetensors(f32Tensors(), { format: 'pt' });
    expect(Buffer.from(ours).equals(fixture('f32_meta.safetensors'))).toBe(true);
  });

  it('encodes F32 tensors without metadata byte for byte', () => {
    const ours = encodeSafetensors(f32Tensors());
    expect(Buffer.from(ours).equals(fixture('f32_plain.safetensors'))).toBe(true);
    // Header padded with spaces to a multiple of 8, as the Rust library does.
    const n = Number(new DataView(ours.buffer).getBigUint64(0, true));
    expect(n % 8).toBe(0);
  });

  it('decodes the F32 files to the exact values and metadata', () => {
    for (const file of ['f32_meta', 'f32_plain']) {
      const { tensors, metadata } = decodeSafetensors(fixture(`${file}.safetensors`));
      expect(metadata).toEqual(expected.metadata[file]);
      expect(Object.keys(tensors).sort()).toEqual(Object.keys(expected.f32).sort());
      for (const [name, d] of Object.entries(expected.f32)) expectValues(tensors[name]!, d);
    }
  });

  it('decodes every dtype (I64 F64 F32 I32 BF16 F16 U8 BOOL) written by safetensors.torch', () => {
    const { tensors, metadata } = decodeSafetensors(fixture('mixed.safetensors'));
    expect(metadata).toEqual(expected.metadata.mixed);
    expect(Object.keys(tensors).sort()).toEqual(Object.keys(expected.mixed).sort());
    for (const [name, d] of Object.entries(expected.mixed)) expectValues(tensors[name]!, d);
    expect(tensors.int64!.data).toBeInstanceOf(BigInt64Array);
    expect((tensors.int64!.data as BigInt64Array)[2]).toBe(2n ** 53n + 1n);
    expect(tensors.f16!.data).toBeInstanceOf(Float32Array);
  });

  it('re-encodes the mixed file byte for byte (dtype-descending order, escaped metadata)', () => {
    const bytes = fixture('mixed.safetensors');
    const { tensors, metadata } = decodeSafetensors(bytes);
    const ours = encodeSafetensors(tensors, metadata);
    expect(ours.length).toBe(bytes.length);
    const differ = [...ours.keys()].filter((i) => ours[i] !== bytes[i]);
    // The one difference: torch's vectorised float->bf16 writes every NaN as 0xffff (element 8,
    // data bytes 112..113); we write a quiet NaN with the sign kept, here 0xffc0. Both are NaN.
    const dataStart = bytes.length - 161;
    expect(differ).toEqual([dataStart + 96 + 8 * 2]);
    expect([bytes[dataStart + 112], bytes[dataStart + 113]]).toEqual([0xff, 0xff]);
    expect([ours[dataStart + 112], ours[dataStart + 113]]).toEqual([0xc0, 0xff]);
  });

  it('rounds float32 to F16 and BF16 as torch does (nearest even, overflow to inf)', () => {
    const f16 = expected.mixed.f16!.values.map(num);
    const f16Ours = expected.f16_source.map((v) => f16BitsToF32(f32ToF16Bits(num(v))));
    expect(f16Ours).toEqual(f16);
    const bf16 = expected.mixed.bf16!.values.map(num);
    expect(expected.bf16_source.map((v) => bf16BitsToF32(f32ToBf16Bits(num(v))))).toEqual(bf16);
    // Also through the encoder, from Float32Array sources.
    const enc = encodeSafetensors({
      f16: { dtype: 'F16', shape: [16], data: Float32Array.from(expected.f16_source.map(num)) },
      bf16: { dtype: 'BF16', shape: [12], data: Float32Array.from(expected.bf16_source.map(num)) },
    });
    const back = decodeSafetensors(enc).tensors;
    expect(Array.from(back.f16!.data as Float32Array)).toEqual(f16);
    expect(Array.from(back.bf16!.data as Float32Array)).toEqual(bf16);
  });

  it('F16 conversions are exact on all 65536 bit patterns that are not NaN', () => {
    let mismatches = 0;
    for (let h = 0; h < 0x10000; h++) {
      const x = f16BitsToF32(h);
      if (Number.isNaN(x)) continue;
      if (f32ToF16Bits(x) !== h) mismatches++;
    }
    expect(mismatches).toBe(0);
    expect(f16BitsToF32(0x3c00)).toBe(1);
    expect(f16BitsToF32(0x0001)).toBe(2 ** -24);
    expect(Number.isNaN(f16BitsToF32(f32ToF16Bits(NaN)))).toBe(true);
  });
});

describe('safetensors strict decoding', () => {
  /** A file from a raw header object and a data length. */
  function build(header: unknown, dataBytes: number, pad = true): Uint8Array {
    let json = Buffer.from(JSON.stringify(header));
    if (pad) json = Buffer.concat([json, Buffer.alloc((8 - (json.length % 8)) % 8, 0x20)]);
    const out = new Uint8Array(8 + json.length + dataBytes);
    new DataView(out.buffer).setBigUint64(0, BigInt(json.length), true);
    out.set(json, 8);
    return out;
  }
  const entry = (dtype: string, shape: number[], begin: number, end: number) => ({ dtype, shape, data_offsets: [begin, end] });
  const code = (bytes: Uint8Array, opts?: { maxHeaderBytes?: number }): string => {
    try {
      decodeSafetensors(bytes, opts);
    } catch (err) {
      expect(err).toBeInstanceOf(CheckpointError);
      return `${(err as CheckpointError).code}: ${(err as Error).message}`;
    }
    return 'ok';
  };

  it('accepts a well-formed hand-built file, unpadded header too', () => {
    expect(code(build({ a: entry('F32', [2], 0, 8), b: entry('U8', [3], 8, 11) }, 11, false))).toBe('ok');
  });

  const cases: [string, () => Uint8Array, RegExp][] = [
    ['shorter than 8 bytes', () => new Uint8Array(5), /^bad_header: .*5 bytes/],
    ['header past the end', () => build({ a: entry('F32', [1], 0, 4) }, 4).subarray(0, 20), /^bad_header: .*claims/],
    ['header over the bound', () => build({ a: entry('F32', [1], 0, 4) }, 4), /^too_large: safetensors header is 56 bytes; the limit is 40/],
    ['not JSON', () => { const b = build({ a: 1 }, 0); b[12] = 0x7d; return b; }, /^bad_header: .*not UTF-8 JSON/],
    ['not an object', () => build([1, 2], 0), /^bad_header: .*start with/],
    ['invalid UTF-8', () => { const b = build({ 'a\u00e9': entry('U8', [0], 0, 0) }, 0); b[11] = 0xff; return b; }, /^bad_header: .*UTF-8/],
    ['unknown dtype', () => build({ a: entry('I16', [1], 0, 2) }, 2), /^bad_dtype: tensor a: dtype "I16"/],
    ['negative shape', () => build({ a: entry('F32', [-1], 0, 4) }, 4), /^bad_header: tensor a: shape \[-1\]/],
    ['offsets beyond data', () => build({ a: entry('F32', [2], 0, 8) }, 4), /^bad_offsets: tensor a: data_offsets \[0, 8\] outside the 4/],
    ['reversed offsets', () => build({ a: entry('U8', [0], 4, 0) }, 4), /^bad_offsets/],
    ['shape product mismatch', () => build({ a: entry('F32', [3], 0, 8) }, 8), /^shape_mismatch: tensor a: 8 bytes for F32 shape \[3\], which needs 12/],
    ['gap between tensors', () => build({ a: entry('U8', [2], 0, 2), b: entry('U8', [2], 3, 5) }, 5), /^bad_offsets: tensor b starts at 3; the previous tensor ends at 2/],
    ['overlap', () => build({ a: entry('U8', [4], 0, 4), b: entry('U8', [2], 2, 4) }, 4), /^bad_offsets: tensor (a|b) starts at/],
    ['trailing bytes', () => build({ a: entry('U8', [2], 0, 2) }, 6), /^bad_offsets: tensors cover 2 data bytes; the file has 6/],
    ['not starting at 0', () => build({ a: entry('U8', [2], 2, 4) }, 4), /^bad_offsets: tensor a starts at 2; the previous tensor ends at 0/],
    ['metadata value not a string', () => build({ __metadata__: { n: 1 } }, 0), /^bad_header: __metadata__ n is 1/],
    ['bool byte 2', () => { const b = build({ a: entry('BOOL', [1], 0, 1) }, 1); b[b.length - 1] = 2; return b; }, /^bad_dtype: tensor a: BOOL byte 2/],
    ['missing data_offsets', () => build({ a: { dtype: 'F32', shape: [1] } }, 4), /^bad_header: tensor a: data_offsets undefined/],
  ];
  for (const [what, make, msg] of cases) {
    it(`refuses ${what}`, () => {
      expect(code(make(), what === 'header over the bound' ? { maxHeaderBytes: 40 } : undefined)).toMatch(msg);
    });
  }

  it('refuses bad input on encode with codes', () => {
    const enc = (t: Record<string, SafeTensor>) => () => encodeSafetensors(t);
    expect(enc({ a: { dtype: 'F32', shape: [3], data: new Float32Array(2) } })).toThrow(/2 values for shape \[3\]/);
    expect(enc({ a: { dtype: 'F32', shape: [2], data: new Float64Array(2) } })).toThrow(/F32 needs Float32Array, got Float64Array/);
    expect(enc({ a: { dtype: 'BOOL', shape: [1], data: new Uint8Array([3]) } })).toThrow(/BOOL value 3/);
    expect(enc({ __metadata__: { dtype: 'U8', shape: [0], data: new Uint8Array(0) } })).toThrow(CheckpointError);
    expect(() => encodeSafetensors({}, { a: 1 as unknown as string })).toThrow(/metadata a is number/);
  });

  it('round-trips awkward names (__proto__, non-ASCII) and empty files', () => {
    const t: Record<string, SafeTensor> = {};
    Object.defineProperty(t, '__proto__', { value: { dtype: 'I32', shape: [1], data: new Int32Array([5]) }, enumerable: true });
    t['héllo.w'] = { dtype: 'F64', shape: [1, 1], data: new Float64Array([0.1]) };
    const back = decodeSafetensors(encodeSafetensors(t, {}));
    expect(Object.keys(back.tensors).sort()).toEqual(['__proto__', 'héllo.w']);
    expect(Array.from(back.tensors['__proto__']!.data as Int32Array)).toEqual([5]);
    expect(back.metadata).toEqual({});
    expect(decodeSafetensors(encodeSafetensors({}))).toEqual({ tensors: {}, metadata: null });
  });

  it('decodes a Node Buffer (as fs.readFileSync gives it) to each tensor\'s own values', () => {
    const t: Record<string, SafeTensor> = {
      a: { dtype: 'F32', shape: [2], data: new Float32Array([1.5, -2]) },
      b: { dtype: 'BF16', shape: [3], data: new Float32Array([0.5, 3, -1]) },
    };
    // A small Buffer sits in Node's shared 8 KB pool; a large one is a whole file.
    const back = decodeSafetensors(Buffer.from(encodeSafetensors(t))).tensors;
    expect(Array.from(back.a!.data as Float32Array)).toEqual([1.5, -2]);
    expect(Array.from(back.b!.data as Float32Array)).toEqual([0.5, 3, -1]);
  });
});
