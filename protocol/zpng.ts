/**
 * ZPNG, the `LOSSLESS` frame codec (PROTOCOL.md section 5): a small header, then one zstd frame of
 * row-wise horizontal deltas. It stands alone: bytes in, pixels out, and back.
 */
import { ProtocolError } from './errors.ts';
import { badFrame, checkPixels, hexHead, type FrameLimits, type Pixels } from './pixels.ts';
import { zstdCompress, zstdDecompress } from './zstd.ts';

const ZPNG_MAGIC = 0xfbf8;
const ZPNG_HEADER_BYTES = 8;

/**
 * Decodes ZPNG (`LOSSLESS`) bytes to pixels of 1 to 4 channels. Requires `initZstd()`.
 *
 * Layout: u16 magic 0xFBF8, u16 width, u16 height, u8 channels, u8 bytes_per_channel (LE), then
 * one zstd frame holding the row-wise horizontal deltas; 3 and 4 channels as planes b, g - b,
 * g - r (then alpha), other counts interleaved.
 * @throws ProtocolError `bad_frame` (short header, wrong magic, channels outside 1..4,
 *   bytes_per_channel other than 1, corrupt or wrongly sized payload); `too_large`.
 */
export function decodeZpng(bytes: Uint8Array, limits: FrameLimits = {}): Pixels {
  if (bytes.byteLength < ZPNG_HEADER_BYTES) {
    throw badFrame(`ZPNG frame is ${bytes.byteLength} bytes; its header alone is ${ZPNG_HEADER_BYTES}`);
  }
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const magic = view.getUint16(0, true);
  if (magic !== ZPNG_MAGIC) throw badFrame(`ZPNG magic is 0x${magic.toString(16)}; expected 0xfbf8 (bytes [${hexHead(bytes)}])`);
  const width = view.getUint16(2, true);
  const height = view.getUint16(4, true);
  const channels = view.getUint8(6);
  const bytesPerChannel = view.getUint8(7);
  if (channels < 1 || channels > 4) throw badFrame(`ZPNG frame has ${channels} channels; expected 1 to 4`);
  if (bytesPerChannel !== 1) throw badFrame(`ZPNG bytes_per_channel is ${bytesPerChannel}; only 1 (uint8) is supported`);
  checkPixels('ZPNG frame', width, height, limits);
  const n = width * height;
  const expected = n * channels;
  let payload: Uint8Array;
  try {
    payload = zstdDecompress(bytes.subarray(ZPNG_HEADER_BYTES), { maxBytes: expected });
  } catch (e) {
    if (!(e instanceof ProtocolError)) throw e;
    throw badFrame(`ZPNG ${width}x${height}x${channels} payload: ${e.message}`);
  }
  if (payload.byteLength !== expected) {
    throw badFrame(`ZPNG payload is ${payload.byteLength} bytes; ${width}x${height}x${channels} needs ${expected}`);
  }
  const out = new Uint8Array(expected);
  const c = channels;
  if (c >= 3) {
    for (let y = 0; y < height; y++) {
      let r = 0, g = 0, b = 0, a = 0;
      for (let x = 0; x < width; x++) {
        const i = y * width + x;
        const bf = payload[i]!;
        const gf = payload[n + i]! + bf;
        const rf = gf - payload[2 * n + i]!;
        r = (r + rf) & 255;
        g = (g + gf) & 255;
        b = (b + bf) & 255;
        out[i * c] = r;
        out[i * c + 1] = g;
        out[i * c + 2] = b;
        if (c === 4) out[i * 4 + 3] = a = (a + payload[3 * n + i]!) & 255;
      }
    }
  } else {
    const row = width * c;
    for (let y = 0; y < height; y++) {
      const o = y * row;
      for (let k = 0; k < row; k++) out[o + k] = (payload[o + k]! + (k >= c ? out[o + k - c]! : 0)) & 255;
    }
  }
  return { data: out, height, width, channels };
}

/**
 * Encodes uint8 `[H, W, C]` pixels (C 1 to 4, width and height 1..65535) as ZPNG with zstd at
 * `level`. Requires `initZstd()`.
 */
export function encodeZpng(p: Pixels, level = 1): Uint8Array {
  const { width, height, channels: c } = p;
  if (c < 1 || c > 4) throw badFrame(`ZPNG encodes 1 to 4 channels; got ${c}`);
  if (width < 1 || height < 1 || width > 0xffff || height > 0xffff) {
    throw badFrame(`ZPNG encodes 1..65535 x 1..65535 pixels; got ${width}x${height}`);
  }
  const n = width * height;
  if (p.data.byteLength !== n * c) throw badFrame(`pixels are ${p.data.byteLength} bytes; ${width}x${height}x${c} needs ${n * c}`);
  const payload = new Uint8Array(n * c);
  const src = p.data;
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      const i = y * width + x;
      const j = i * c;
      const prev = x > 0 ? j - c : -1;
      if (c >= 3) {
        const rf = src[j]! - (prev >= 0 ? src[prev]! : 0);
        const gf = src[j + 1]! - (prev >= 0 ? src[prev + 1]! : 0);
        const bf = src[j + 2]! - (prev >= 0 ? src[prev + 2]! : 0);
        payload[i] = bf;
        payload[n + i] = gf - bf;
        payload[2 * n + i] = gf - rf;
        if (c === 4) payload[3 * n + i] = src[j + 3]! - (prev >= 0 ? src[prev + 3]! : 0);
      } else {
        for (let k = 0; k < c; k++) payload[j + k] = src[j + k]! - (prev >= 0 ? src[prev + k]! : 0);
      }
    }
  }
  const body = zstdCompress(payload, { level });
  const out = new Uint8Array(ZPNG_HEADER_BYTES + body.byteLength);
  const view = new DataView(out.buffer);
  view.setUint16(0, ZPNG_MAGIC, true);
  view.setUint16(2, width, true);
  view.setUint16(4, height, true);
  view.setUint8(6, c);
  view.setUint8(7, 1);
  out.set(body, ZPNG_HEADER_BYTES);
  return out;
}
