import { readFileSync } from 'node:fs';
import sharp from 'sharp';
import { beforeAll, describe, expect, it } from 'vitest';
import { ProtocolError, type ProtocolErrorCode } from '../protocol/errors.ts';
import {
  decodeFrame,
  encodeFrame,
  parseCodec,
  resizeWithPad,
  toRgb,
  type Frame,
  type NDArrayLike,
  type Pixels,
} from '../protocol/frames.ts';
import { decodeZpng, encodeZpng } from '../protocol/zpng.ts';
import { initZstd, zstdCompress, zstdDecompress } from '../protocol/zstd.ts';

const VEC = new URL('./vectors/frames/', import.meta.url);
const vec = (name: string) => new Uint8Array(readFileSync(new URL(name, VEC)));
const manifest = JSON.parse(readFileSync(new URL('manifest.json', VEC), 'utf8')) as {
  zpng: { name: string; height: number; width: number; channels: number }[];
};

beforeAll(() => initZstd());

/** A deterministic RGB test image: gradients plus a disc. */
function image(height: number, width: number, channels = 3): Pixels {
  const data = new Uint8Array(height * width * channels);
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      const disc = (x - width / 2) ** 2 + (y - height / 2) ** 2 < (Math.min(width, height) / 4) ** 2;
      for (let k = 0; k < channels; k++) {
        data[(y * width + x) * channels + k] = (x * (2 + k) + y * (3 - k) + (disc ? 90 : 0) + 50 * k) & 255;
      }
    }
  }
  return { data, height, width, channels };
}

/** A smooth RGB image (JPEG's friend): low-frequency sines. */
function smooth(height: number, width: number): Pixels {
  const data = new Uint8Array(height * width * 3);
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      for (let k = 0; k < 3; k++) data[(y * width + x) * 3 + k] = Math.round(128 + 60 * Math.sin(x / (6 + k)) + 40 * Math.cos(y / 9));
    }
  }
  return { data, height, width, channels: 3 };
}

async function rejection(p: Promise<unknown> | (() => unknown)): Promise<ProtocolError> {
  try {
    await (typeof p === 'function' ? p() : p);
  } catch (e) {
    expect(e).toBeInstanceOf(ProtocolError);
    return e as ProtocolError;
  }
  throw new Error('expected a ProtocolError, nothing was thrown');
}

async function expectCode(p: Promise<unknown> | (() => unknown), code: ProtocolErrorCode, text?: string): Promise<void> {
  const err = await rejection(p);
  expect(err.code).toBe(code);
  if (text !== undefined) expect(err.message).toContain(text);
}

const nd = (shape: number[], data: Uint8Array, dtype = '|u1'): NDArrayLike => ({ dtype, shape, data });
const rgbOf = (f: Frame) => ({ data: f.data, height: f.height, width: f.width, channels: 3 });

describe('parseCodec', () => {
  it('knows the protocol codecs', () => {
    expect(parseCodec('RAW')).toEqual({ kind: 'RAW', quality: null });
    expect(parseCodec('lossless')).toEqual({ kind: 'LOSSLESS', quality: null });
    expect(parseCodec('PNG')).toEqual({ kind: 'PNG', quality: null });
    expect(parseCodec('JPEG')).toEqual({ kind: 'JPEG', quality: null });
    expect(parseCodec('CODEC_JPEG_Q1')).toEqual({ kind: 'JPEG', quality: 1 });
    expect(parseCodec('CODEC_JPEG_Q100')).toEqual({ kind: 'JPEG', quality: 100 });
  });

  it('refuses the others with unknown_codec', async () => {
    for (const name of ['GIF', 'CODEC_JPEG_Q0', 'CODEC_JPEG_Q101', 'CODEC_JPEG_Q', 'JPEG ', '']) {
      await expectCode(() => parseCodec(name), 'unknown_codec', JSON.stringify(name));
    }
    await expectCode(decodeFrame('WEBP', new Uint8Array(10)), 'unknown_codec', '"WEBP"');
    await expectCode(encodeFrame('AVIF', image(2, 2)), 'unknown_codec');
  });
});

describe('ZPNG (LOSSLESS)', () => {
  it('decodes the Python reference vectors exactly (1, 2, 3, 4 channels)', async () => {
    expect(manifest.zpng.map((m) => m.channels).sort()).toEqual([1, 2, 3, 3, 4]);
    for (const m of manifest.zpng) {
      const raw = vec(`${m.name}.raw`);
      const px = decodeZpng(vec(`${m.name}.zpng`));
      expect([px.height, px.width, px.channels]).toEqual([m.height, m.width, m.channels]);
      expect(Buffer.compare(px.data, raw)).toBe(0);
      const frame = await decodeFrame('LOSSLESS', vec(`${m.name}.zpng`));
      expect(Buffer.compare(frame.data, toRgb({ data: raw, height: m.height, width: m.width, channels: m.channels }).data)).toBe(0);
    }
  });

  it('encodes the same payload as the Python reference, and round trips', () => {
    for (const m of manifest.zpng) {
      const ref = vec(`${m.name}.zpng`);
      const ours = encodeZpng({ data: vec(`${m.name}.raw`), height: m.height, width: m.width, channels: m.channels });
      expect(Array.from(ours.subarray(0, 8))).toEqual(Array.from(ref.subarray(0, 8)));
      const big = { maxBytes: 1 << 20 };
      expect(Buffer.compare(zstdDecompress(ours.subarray(8), big), zstdDecompress(ref.subarray(8), big))).toBe(0);
      expect(Buffer.compare(decodeZpng(ours).data, vec(`${m.name}.raw`))).toBe(0);
    }
  });

  it('round trips 1, 3 and 4 channels through encodeFrame / decodeZpng', async () => {
    for (const c of [1, 3, 4]) {
      const px = image(33, 50, c);
      const bytes = (await encodeFrame('LOSSLESS', px)) as Uint8Array;
      expect(Array.from(bytes.subarray(0, 8))).toEqual([0xf8, 0xfb, 50, 0, 33, 0, c, 1]);
      expect(decodeZpng(bytes)).toEqual(px);
    }
  });

  it('writes the planes b, g - b, g - r of the filtered pixels', () => {
    // One row, two pixels: (10, 20, 30), (15, 5, 200). Filtered: (10, 20, 30), (5, -15, 170).
    const bytes = encodeZpng({ data: Uint8Array.of(10, 20, 30, 15, 5, 200), height: 1, width: 2, channels: 3 });
    const payload = zstdDecompress(bytes.subarray(8), { maxBytes: 6 });
    expect(Array.from(payload)).toEqual([30, 170, 20 - 30 + 256, (-15 - 170 + 512) % 256, 20 - 10, -15 - 5 + 256]);
  });

  it('refuses bad headers and payloads with bad_frame', async () => {
    const good = encodeZpng(image(4, 5, 3));
    const patched = (at: number, value: number) => {
      const b = good.slice();
      b[at] = value;
      return b;
    };
    await expectCode(decodeFrame('LOSSLESS', good.subarray(0, 7)), 'bad_frame', 'ZPNG frame is 7 bytes');
    await expectCode(decodeFrame('LOSSLESS', patched(0, 0)), 'bad_frame', 'ZPNG magic is 0xfb00');
    await expectCode(decodeFrame('LOSSLESS', patched(6, 0)), 'bad_frame', '0 channels');
    await expectCode(decodeFrame('LOSSLESS', patched(6, 5)), 'bad_frame', '5 channels');
    await expectCode(decodeFrame('LOSSLESS', patched(7, 2)), 'bad_frame', 'bytes_per_channel is 2');
    await expectCode(decodeFrame('LOSSLESS', patched(2, 0)), 'bad_frame', '0x4: an empty image');
    // The payload holds 5x4x3 = 60 bytes: too few for a header saying 6 wide, too many for 4 wide.
    await expectCode(decodeFrame('LOSSLESS', patched(2, 6)), 'bad_frame', 'ZPNG payload is 60 bytes; 6x4x3 needs 72');
    await expectCode(decodeFrame('LOSSLESS', patched(2, 4)), 'bad_frame', 'ZPNG 4x4x3 payload: zstd frame decompresses to 60 bytes; the limit is 48');
    await expectCode(decodeFrame('LOSSLESS', good.subarray(0, good.byteLength - 1)), 'bad_frame', 'truncated zstd frame');
    await expectCode(decodeFrame('LOSSLESS', good.subarray(0, 8)), 'bad_frame', 'not a zstd frame');
    // A payload smaller than the header's size (declared honestly by its zstd frame).
    const short = new Uint8Array([...good.subarray(0, 8), ...zstdCompress(new Uint8Array(59))]);
    await expectCode(decodeFrame('LOSSLESS', short), 'bad_frame', 'ZPNG payload is 59 bytes; 5x4x3 needs 60');
  });

  it('refuses more pixels than the limit before decompressing', async () => {
    const header = Uint8Array.of(0xf8, 0xfb, 0x01, 0x10, 0x01, 0x10, 3, 1); // 4097 x 4097
    await expectCode(decodeFrame('LOSSLESS', header), 'too_large', '4097x4097 = 16785409 pixels; the limit is 16777216');
    await expectCode(decodeFrame('LOSSLESS', encodeZpng(image(10, 10, 3)), { maxPixels: 99 }), 'too_large', 'the limit is 99');
  });
});

describe('RAW', () => {
  it('copies HWC uint8 and does not alias the input', async () => {
    const px = image(6, 7, 3);
    const input = px.data.slice();
    const f = await decodeFrame('RAW', nd([6, 7, 3], input));
    expect(f).toEqual({ data: px.data, height: 6, width: 7 });
    input[0] = input[0]! ^ 0xff;
    expect(f.data[0]).toBe(px.data[0]);
  });

  it('reads data at an odd byte offset', async () => {
    const px = image(3, 5, 3);
    const buf = new Uint8Array(px.data.byteLength + 3);
    buf.set(px.data, 3);
    expect((await decodeFrame('RAW', nd([3, 5, 3], buf.subarray(3)))).data).toEqual(px.data);
  });

  it('transposes CHW', async () => {
    const px = image(4, 6, 3);
    const chw = new Uint8Array(px.data.byteLength);
    for (let i = 0; i < 24; i++) for (let k = 0; k < 3; k++) chw[k * 24 + i] = px.data[i * 3 + k]!;
    expect((await decodeFrame('RAW', nd([3, 4, 6], chw))).data).toEqual(px.data);
    // [3, 5, 3] reads as HWC (channels-last wins when both fit).
    expect((await decodeFrame('RAW', nd([3, 5, 3], image(3, 5, 3).data))).width).toBe(5);
  });

  it('replicates gray ([H, W, 1], [1, H, W], [H, W]) and drops alpha', async () => {
    const gray = Uint8Array.of(0, 100, 255, 7);
    const want = Array.from(gray).flatMap((v) => [v, v, v]);
    for (const shape of [[2, 2, 1], [1, 2, 2], [2, 2]]) {
      expect(Array.from((await decodeFrame('RAW', nd(shape, gray))).data)).toEqual(want);
    }
    const rgba = Uint8Array.of(1, 2, 3, 4, 5, 6, 7, 8);
    expect(Array.from((await decodeFrame('RAW', nd([1, 2, 4], rgba))).data)).toEqual([1, 2, 3, 5, 6, 7]);
  });

  it('refuses other shapes, dtypes, sizes and inputs clearly', async () => {
    await expectCode(decodeFrame('RAW', nd([2, 2, 2], new Uint8Array(8))), 'bad_frame', 'shape [2,2,2]');
    await expectCode(decodeFrame('RAW', nd([2, 2, 3, 1], new Uint8Array(12))), 'bad_frame', 'shape [2,2,3,1]');
    await expectCode(decodeFrame('RAW', nd([2, 2, 3], new Uint8Array(48), '<f4')), 'bad_frame', 'dtype "<f4"');
    await expectCode(decodeFrame('RAW', nd([2, 2, 3], new Uint8Array(11))), 'shape_mismatch', 'needs 12 bytes; got 11');
    await expectCode(decodeFrame('RAW', nd([0, 2, 3], new Uint8Array(0))), 'bad_frame', 'empty image');
    await expectCode(decodeFrame('RAW', nd([4097, 4096, 3], new Uint8Array(0))), 'too_large', '4096x4097');
    await expectCode(decodeFrame('RAW', new Uint8Array(12)), 'bad_frame', 'codec RAW expects an ndarray');
    await expectCode(decodeFrame('PNG', nd([2, 2, 3], new Uint8Array(12))), 'bad_frame', 'expects bytes');
  });

  it('encodes to a [H, W, C] |u1 ndarray', async () => {
    const px = image(2, 3, 4);
    expect(await encodeFrame('RAW', px)).toEqual({ dtype: '|u1', shape: [2, 3, 4], data: px.data });
  });
});

describe('PNG', () => {
  it('round trips exactly', async () => {
    const px = image(30, 40);
    const bytes = (await encodeFrame('PNG', px)) as Uint8Array;
    expect((await decodeFrame('PNG', bytes)).data).toEqual(px.data);
  });

  it('converts 16-bit, gray and RGBA PNGs to 8-bit RGB', async () => {
    const px = image(5, 6);
    const wide = new Uint16Array(px.data.length).map((_, i) => px.data[i]! * 257);
    const png16 = await sharp(Buffer.from(wide.buffer), { raw: { width: 6, height: 5, channels: 3, premultiplied: false } })
      .toColourspace('rgb16')
      .png()
      .toBuffer()
      .catch(() => null);
    if (png16 === null) throw new Error('could not make a 16-bit PNG');
    const meta = await sharp(png16).metadata();
    expect(meta.depth).toBe('ushort');
    const f16 = await decodeFrame('PNG', png16);
    expect([f16.height, f16.width, f16.data.byteLength]).toEqual([5, 6, 90]);

    const gray = (await encodeFrame('PNG', { data: Uint8Array.of(9, 200), height: 1, width: 2, channels: 1 })) as Uint8Array;
    expect(Array.from((await decodeFrame('PNG', gray)).data)).toEqual([9, 9, 9, 200, 200, 200]);
    const rgba = (await encodeFrame('PNG', { data: Uint8Array.of(1, 2, 3, 0, 4, 5, 6, 255), height: 1, width: 2, channels: 4 })) as Uint8Array;
    expect(Array.from((await decodeFrame('PNG', rgba)).data)).toEqual([1, 2, 3, 4, 5, 6]);
  });

  it('refuses truncated, mislabelled and oversized PNGs', async () => {
    const bytes = (await encodeFrame('PNG', image(30, 40))) as Uint8Array;
    await expectCode(decodeFrame('PNG', bytes.subarray(0, bytes.byteLength - 20)), 'bad_frame', 'PNG frame could not be decoded');
    await expectCode(decodeFrame('PNG', bytes.subarray(0, 20)), 'bad_frame', 'PNG header could not be read');
    await expectCode(decodeFrame('JPEG', bytes), 'bad_frame', 'does not start with the JPEG signature: [89 50 4e 47');
    await expectCode(decodeFrame('PNG', new TextEncoder().encode('<svg></svg>')), 'bad_frame', 'PNG signature');
    await expectCode(decodeFrame('PNG', bytes, { maxPixels: 1199 }), 'too_large', 'PNG frame is 40x30 = 1200 pixels; the limit is 1199');
  });
});

describe('JPEG', () => {
  it('round trips closely, and quality sets the size', async () => {
    const px = smooth(48, 64);
    const q95 = (await encodeFrame('CODEC_JPEG_Q95', px)) as Uint8Array;
    const q10 = (await encodeFrame('CODEC_JPEG_Q10', px)) as Uint8Array;
    expect(Array.from(q95.subarray(0, 3))).toEqual([0xff, 0xd8, 0xff]);
    expect(q10.byteLength).toBeLessThan(q95.byteLength / 2);
    const f = await decodeFrame('JPEG', q95);
    expect([f.height, f.width]).toEqual([48, 64]);
    let err = 0;
    for (let i = 0; i < f.data.length; i++) err += Math.abs(f.data[i]! - px.data[i]!);
    expect(err / f.data.length).toBeLessThan(2);
    expect((await decodeFrame('CODEC_JPEG_Q10', q95)).data).toEqual(f.data); // the quality only matters to encoders
  });

  it('decodes a grayscale JPEG to three equal channels', async () => {
    const px = image(16, 16);
    const gray = await sharp(px.data, { raw: { width: 16, height: 16, channels: 3 } }).toColourspace('b-w').jpeg().toBuffer();
    expect((await sharp(gray).metadata()).channels).toBe(1);
    const f = await decodeFrame('JPEG', gray);
    expect(f.data.byteLength).toBe(16 * 16 * 3);
    for (let i = 0; i < 256; i++) {
      expect(f.data[i * 3 + 1]).toBe(f.data[i * 3]);
      expect(f.data[i * 3 + 2]).toBe(f.data[i * 3]);
    }
  });

  it('decodes a CMYK JPEG to sRGB', async () => {
    const px = image(16, 16);
    const cmyk = await sharp(px.data, { raw: { width: 16, height: 16, channels: 3 } }).toColourspace('cmyk').jpeg({ quality: 100 }).toBuffer();
    const meta = await sharp(cmyk).metadata();
    expect([meta.channels, meta.space]).toEqual([4, 'cmyk']);
    const f = await decodeFrame('JPEG', cmyk);
    expect([f.height, f.width, f.data.byteLength]).toEqual([16, 16, 768]);
    let err = 0;
    for (let i = 0; i < f.data.length; i++) err += Math.abs(f.data[i]! - px.data[i]!);
    // Through a CMYK profile and back: close, not exact.
    expect(err / f.data.length).toBeLessThan(16);
  });

  it('refuses truncated, corrupt and oversized JPEGs', async () => {
    const bytes = (await encodeFrame('JPEG', image(40, 40))) as Uint8Array;
    await expectCode(decodeFrame('JPEG', bytes.subarray(0, bytes.byteLength - 40)), 'bad_frame', 'JPEG frame could not be decoded');
    await expectCode(decodeFrame('JPEG', bytes.subarray(0, 3)), 'bad_frame', 'JPEG header could not be read');
    const junk = new Uint8Array(200).fill(0x55);
    junk.set([0xff, 0xd8, 0xff]);
    await expectCode(decodeFrame('JPEG', junk), 'bad_frame', 'JPEG');
    await expectCode(decodeFrame('CODEC_JPEG_Q80', bytes, { maxPixels: 1000 }), 'too_large', '40x40 = 1600 pixels; the limit is 1000');
  });
});

describe('resizeWithPad', () => {
  const white = (height: number, width: number): Frame => ({ data: new Uint8Array(height * width * 3).fill(255), height, width });
  const rowIsBlack = (f: Frame, y: number) => f.data.subarray(y * f.width * 3, (y + 1) * f.width * 3).every((v) => v === 0);

  it('puts black bands of 12 rows above and below a 480x640 frame in 96x96', async () => {
    const f = await resizeWithPad(white(480, 640), 96);
    expect([f.height, f.width, f.data.byteLength]).toEqual([96, 96, 96 * 96 * 3]);
    const black = Array.from({ length: 96 }, (_, y) => rowIsBlack(f, y));
    expect(black.indexOf(false)).toBe(12);
    expect(black.lastIndexOf(false)).toBe(83);
    expect(f.data.subarray(12 * 96 * 3, 84 * 96 * 3).every((v) => v === 255)).toBe(true);
  });

  it('puts the bands left and right of a tall frame', async () => {
    const f = await resizeWithPad(white(640, 480), 96);
    for (let y = 0; y < 96; y++) {
      const row = Array.from({ length: 96 }, (_, x) => f.data[(y * 96 + x) * 3]);
      expect(row.indexOf(255)).toBe(12);
      expect(row.lastIndexOf(255)).toBe(83);
    }
  });

  it('returns a frame of the size as a copy', async () => {
    const px = image(8, 8);
    const f = await resizeWithPad(rgbOf(px), 8);
    expect(f.data).toEqual(px.data);
    expect(f.data).not.toBe(px.data);
  });
});

describe('input ownership', () => {
  it('copies byte inputs before the first await', async () => {
    for (const codec of ['LOSSLESS', 'PNG', 'JPEG']) {
      const px = smooth(8, 8);
      const bytes = (await encodeFrame(codec, px)) as Uint8Array;
      const want = await decodeFrame(codec, bytes.slice());
      const pending = decodeFrame(codec, bytes);
      bytes.fill(0); // what a released websocket buffer may hold by the time decoding runs
      expect((await pending).data).toEqual(want.data);
    }
  });
});

describe('decodeFrameResized', () => {
  it('decodes PNG and JPEG to resizeWithPad geometry (test/resize.test.ts checks the pixels), refusing a broken one', async () => {
    const { decodeFrameResized } = await import('../protocol/frames.ts');
    const w = 640, h = 480;
    const data = new Uint8Array(w * h * 3);
    for (let y = 0; y < h; y++) for (let x = 0; x < w; x++) for (let c = 0; c < 3; c++) data[(y * w + x) * 3 + c] = (x * (c + 1) + y * 2) % 256;
    for (const codec of ['JPEG', 'PNG']) {
      const bytes = (await encodeFrame(codec, { data, height: h, width: w })) as Uint8Array;
      const f = await decodeFrameResized(codec, bytes, 96);
      expect([f.width, f.height]).toEqual([96, 96]);
      // Black bands exactly where resizeWithPad puts them: rows 0-11 and 84-95.
      for (const row of [0, 11, 84, 95]) expect(Math.max(...f.data.subarray(row * 96 * 3, (row + 1) * 96 * 3))).toBe(0);
      for (const row of [12, 83]) expect(Math.max(...f.data.subarray(row * 96 * 3, (row + 1) * 96 * 3))).toBeGreaterThan(0);
    }
    await expect(decodeFrameResized('JPEG', new Uint8Array([0xff, 0xd8, 0xff, 0, 1]), 96)).rejects.toMatchObject({ code: 'bad_frame' });
  });

  it('reads PNG and JPEG sizes from their headers as sharp does (baseline, progressive, EXIF)', async () => {
    const { headerSize } = await import('../protocol/frames.ts');
    const sharp = (await import('sharp')).default;
    const px = { raw: { width: 37, height: 21, channels: 3 as const } };
    const img = () => sharp(Buffer.alloc(37 * 21 * 3, 90), px);
    const files: [ 'PNG' | 'JPEG', Buffer][] = [
      ['PNG', await img().png().toBuffer()],
      ['JPEG', await img().jpeg().toBuffer()],
      ['JPEG', await img().jpeg({ progressive: true }).toBuffer()],
      ['JPEG', await img().withMetadata({ orientation: 6 }).jpeg().toBuffer()],
    ];
    for (const [kind, bytes] of files) {
      const meta = await sharp(bytes).metadata();
      expect(headerSize(kind, new Uint8Array(bytes))).toEqual({ width: meta.width, height: meta.height });
      expect([meta.width, meta.height]).toEqual([37, 21]);
    }
    expect(headerSize('JPEG', new Uint8Array([0xff, 0xd8, 0xff, 0xda, 0, 2, 0, 0, 0, 0]))).toBeNull();
    expect(headerSize('PNG', new Uint8Array(30))).toBeNull();
  });
});
