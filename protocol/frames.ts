/**
 * Camera frames on the wire (PROTOCOL.md sections 3 and 5): decoding every codec to one layout,
 * uint8 `[H, W, 3]` RGB in C order, encoders for each codec, and the model's resize with padding.
 *
 * Codecs: `RAW` (an ndarray), `LOSSLESS` (ZPNG, protocol/zpng.ts), `PNG`, `JPEG` and
 * `CODEC_JPEG_Q<N>` (N 1..100).
 * PNG and JPEG go through sharp (libvips) off the event loop; the bytes' signature must match the
 * codec, so no other libvips loader ever sees client bytes. Sizes are checked from headers before
 * any pixel is decoded.
 */
import sharp, { type Metadata, type OutputInfo } from 'sharp';
import { ProtocolError } from './errors.ts';
import { DEFAULT_MAX_PIXELS, badFrame, checkPixels, hexHead, type Frame, type FrameLimits, type NDArrayLike, type Pixels } from './pixels.ts';
import { decodeZpng, encodeZpng } from './zpng.ts';
import { initZstd } from './zstd.ts';
import { resizeWithPadSync } from './resize.ts';

export type { Frame, FrameLimits, NDArrayLike, Pixels } from './pixels.ts';

// Every frame is decoded once: libvips' operation cache (up to 50 MB of results, a locked hash
// lookup per operation) only costs here, ~10% of a 480x640 JPEG decode (2.26 -> 2.05 ms).
sharp.cache(false);

/** Quality of the plain `JPEG` codec when encoding. */
export const DEFAULT_JPEG_QUALITY = 90;

export type CodecKind = 'RAW' | 'LOSSLESS' | 'PNG' | 'JPEG';

/**
 * Parses a codec name (case-insensitive). `CODEC_JPEG_Q<N>` gives `{kind: 'JPEG', quality: N}`.
 * @throws ProtocolError `unknown_codec`.
 */
export function parseCodec(name: string): { kind: CodecKind; quality: number | null } {
  const up = typeof name === 'string' ? name.toUpperCase() : '';
  if (up === 'RAW' || up === 'LOSSLESS' || up === 'PNG' || up === 'JPEG') return { kind: up, quality: null };
  const m = /^CODEC_JPEG_Q(\d{1,3})$/.exec(up);
  if (m && Number(m[1]) >= 1 && Number(m[1]) <= 100) return { kind: 'JPEG', quality: Number(m[1]) };
  throw new ProtocolError(
    'unknown_codec',
    `unknown image codec ${JSON.stringify(name)}; expected RAW, LOSSLESS, PNG, JPEG or CODEC_JPEG_Q<1..100>`,
  );
}

/**
 * Decodes one frame to uint8 `[H, W, 3]` RGB.
 *
 * `RAW` takes a uint8 ndarray: `[H, W, C]` or `[C, H, W]` (C in 1, 3, 4; channels-last wins when
 * both readings fit) or `[H, W]`. Gray is replicated to RGB and alpha is dropped, as PIL's
 * `convert("RGB")` does. Other codecs take bytes; grayscale, CMYK, 16-bit and alpha images are
 * converted to 8-bit sRGB. The input is read or copied before this returns its promise, so the
 * caller may release its buffer at once.
 * @throws ProtocolError `unknown_codec`; `too_large` (over `limits.maxPixels`); `bad_frame`
 *   (truncated or corrupt bytes, wrong signature, bad channel count or dtype, bytes for RAW or an
 *   ndarray for another codec); `shape_mismatch` (an ndarray whose data does not fill its shape).
 */
export async function decodeFrame(codec: string, input: Uint8Array | NDArrayLike, limits: FrameLimits = {}): Promise<Frame> {
  const { kind } = parseCodec(codec);
  if (kind === 'RAW') {
    if (input instanceof Uint8Array) throw badFrame(`codec RAW expects an ndarray; got ${input.byteLength} bytes`);
    return decodeRaw(input, limits);
  }
  if (!(input instanceof Uint8Array)) {
    throw badFrame(`codec ${codec} expects bytes; got an ndarray of shape [${input.shape}] (use codec RAW)`);
  }
  // Copied before the first await: a websocket message's buffer dies when its callback returns.
  const own = input.slice();
  if (kind === 'LOSSLESS') {
    await initZstd();
    return toRgb(decodeZpng(own, limits));
  }
  return decodeWithSharp(kind, own, limits);
}

const UINT8_DTYPES = new Set(['|u1', 'u1', '<u1', '>u1', '=u1', 'uint8', 'B']);

function decodeRaw(arr: NDArrayLike, limits: FrameLimits): Frame {
  if (!UINT8_DTYPES.has(arr.dtype)) throw badFrame(`RAW frames must be uint8 ("|u1"); got dtype "${arr.dtype}"`);
  const shape = arr.shape;
  const bytes = new Uint8Array(arr.data.buffer, arr.data.byteOffset, arr.data.byteLength);
  const isChannels = (c: number | undefined) => c === 1 || c === 3 || c === 4;
  let h: number, w: number, c: number, chw: boolean;
  if (shape.length === 2) [h, w, c, chw] = [shape[0]!, shape[1]!, 1, false];
  else if (shape.length === 3 && isChannels(shape[2])) [h, w, c, chw] = [shape[0]!, shape[1]!, shape[2]!, false];
  else if (shape.length === 3 && isChannels(shape[0])) [h, w, c, chw] = [shape[1]!, shape[2]!, shape[0]!, true];
  else throw badFrame(`RAW frame has shape [${shape}]; expected [H, W, C] or [C, H, W] with C in 1, 3, 4, or [H, W]`);
  checkPixels('RAW frame', w, h, limits);
  if (bytes.byteLength !== h * w * c) {
    throw new ProtocolError('shape_mismatch', `RAW frame of shape [${shape}] needs ${h * w * c} bytes; got ${bytes.byteLength}`);
  }
  if (!chw) return toRgb({ data: bytes, height: h, width: w, channels: c });
  const plane = h * w;
  const hwc = new Uint8Array(plane * c);
  for (let k = 0; k < c; k++) {
    for (let i = 0; i < plane; i++) hwc[i * c + k] = bytes[k * plane + i]!;
  }
  return toRgb({ data: hwc, height: h, width: w, channels: c });
}

/**
 * Converts pixels of 1 to 4 channels to an RGB frame (gray replicated, alpha dropped). Always
 * returns a fresh buffer, so the result never aliases a message buffer.
 * @throws ProtocolError `bad_frame` for another channel count.
 */
export function toRgb(p: Pixels): Frame {
  const n = p.width * p.height;
  const c = p.channels;
  if (c < 1 || c > 4) throw badFrame(`frame has ${c} channels; expected 1 to 4`);
  if (c === 3) return { data: p.data.slice(0, n * 3), height: p.height, width: p.width };
  const out = new Uint8Array(n * 3);
  for (let i = 0; i < n; i++) {
    if (c <= 2) {
      const v = p.data[i * c]!;
      out[i * 3] = v;
      out[i * 3 + 1] = v;
      out[i * 3 + 2] = v;
    } else {
      out[i * 3] = p.data[i * 4]!;
      out[i * 3 + 1] = p.data[i * 4 + 1]!;
      out[i * 3 + 2] = p.data[i * 4 + 2]!;
    }
  }
  return { data: out, height: p.height, width: p.width };
}

const PNG_SIGNATURE = [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a];
const JPEG_SIGNATURE = [0xff, 0xd8, 0xff];

async function decodeWithSharp(kind: 'PNG' | 'JPEG', bytes: Uint8Array, limits: FrameLimits): Promise<Frame> {
  const signature = kind === 'PNG' ? PNG_SIGNATURE : JPEG_SIGNATURE;
  if (bytes.byteLength < signature.length || signature.some((b, i) => bytes[i] !== b)) {
    throw badFrame(`${kind} frame does not start with the ${kind} signature: [${hexHead(bytes)}] (${bytes.byteLength} bytes)`);
  }
  const max = limits.maxPixels ?? DEFAULT_MAX_PIXELS;
  let dims = headerSize(kind, bytes);
  if (!dims) {
    let meta: Metadata;
    try {
      meta = await sharp(bytes).metadata();
    } catch (e) {
      throw badFrame(`${kind} header could not be read (${bytes.byteLength} bytes): ${(e as Error).message}`);
    }
    dims = { width: meta.width ?? 0, height: meta.height ?? 0 };
  }
  checkPixels(`${kind} frame`, dims.width, dims.height, limits);
  let out: { data: Buffer; info: OutputInfo };
  try {
    // failOn 'error' also refuses truncated data; limitInputPixels is a second guard on the header.
    out = await sharp(bytes, { failOn: 'error', limitInputPixels: max, sequentialRead: true })
      .toColourspace('srgb')
      .removeAlpha()
      .raw({ depth: 'uchar' })
      .toBuffer({ resolveWithObject: true });
  } catch (e) {
    throw badFrame(`${kind} frame could not be decoded (${bytes.byteLength} bytes): ${(e as Error).message}`);
  }
  const { width, height, channels } = out.info;
  if (channels !== 3 || out.data.byteLength !== width * height * 3) {
    throw badFrame(`${kind} frame decoded to ${width}x${height}x${channels} (${out.data.byteLength} bytes); expected 3 uint8 channels`);
  }
  return { data: new Uint8Array(out.data.buffer, out.data.byteOffset, out.data.byteLength), height, width };
}

/**
 * Width and height from a PNG's IHDR or a JPEG's SOF marker (ITU T.81 B.2.2), read in
 * JavaScript: asking sharp costs a thread-pool round trip per frame before the decode can start.
 * Null when the header is not where these formats put it; the caller then asks sharp.
 */
export function headerSize(kind: 'PNG' | 'JPEG', b: Uint8Array): { width: number; height: number } | null {
  const u16 = (i: number) => (b[i]! << 8) | b[i + 1]!;
  if (kind === 'PNG') {
    if (b.byteLength < 24 || String.fromCharCode(b[12]!, b[13]!, b[14]!, b[15]!) !== 'IHDR') return null;
    return { width: u16(16) * 65536 + u16(18), height: u16(20) * 65536 + u16(22) };
  }
  let i = 2;
  while (i + 9 <= b.byteLength) {
    if (b[i] !== 0xff) return null;
    const marker = b[i + 1]!;
    if (marker === 0xff) {
      i++; // fill byte
      continue;
    }
    if (marker === 0x01 || (marker >= 0xd0 && marker <= 0xd8)) {
      i += 2; // markers without a length
      continue;
    }
    // SOF0..SOF15 except DHT (C4), JPG (C8) and DAC (CC): P, Y, X follow the length.
    if (marker >= 0xc0 && marker <= 0xcf && marker !== 0xc4 && marker !== 0xc8 && marker !== 0xcc) {
      const height = u16(i + 5);
      return height === 0 ? null : { width: u16(i + 7), height }; // height 0: given later by DNL
    }
    if (marker === 0xda || marker === 0xd9) return null; // scan or end before any frame header
    i += 2 + u16(i + 2);
  }
  return null;
}

/**
 * Decodes a frame and resizes it to `size` x `size` (`resizeWithPad`, MODEL.md D12). Whatever the
 * codec, the pixels are those of decoding at full size and then resizing, so a frame the client
 * already resized with the same rule (the Python package does) gives the same model input.
 * @throws ProtocolError as `decodeFrame`.
 */
export async function decodeFrameResized(codec: string, input: Uint8Array | NDArrayLike, size: number, limits: FrameLimits = {}): Promise<Frame> {
  const frame = await decodeFrame(codec, input, limits);
  // Already the model's size (a client that resized, as the Python package does): decodeFrame's buffer is fresh, so no copy and no turn of the loop.
  return frame.width === size && frame.height === size ? frame : resizeWithPad(frame, size);
}

// ---- encoding and resizing ----

/**
 * Encodes a frame (3 channels, or `Pixels` of 1 to 4) with `codec`. `RAW` gives an ndarray
 * `{dtype: "|u1", shape: [H, W, C], data}`; the others give bytes. `JPEG` uses quality
 * `DEFAULT_JPEG_QUALITY`; JPEG drops alpha.
 * @throws ProtocolError `unknown_codec`, `bad_frame` (a buffer that does not fill the frame).
 */
export async function encodeFrame(codec: string, frame: Frame | Pixels): Promise<Uint8Array | NDArrayLike> {
  const { kind, quality } = parseCodec(codec);
  const channels = 'channels' in frame ? frame.channels : 3;
  const { width, height, data } = frame;
  if (data.byteLength !== width * height * channels) {
    throw badFrame(`frame data is ${data.byteLength} bytes; ${width}x${height}x${channels} needs ${width * height * channels}`);
  }
  if (kind === 'RAW') return { dtype: '|u1', shape: [height, width, channels], data: data.slice() };
  if (kind === 'LOSSLESS') {
    await initZstd();
    return encodeZpng({ data, width, height, channels });
  }
  const img = sharp(data, { raw: { width, height, channels: channels as 1 | 2 | 3 | 4 } });
  const buf =
    kind === 'PNG'
      ? await img.png().toBuffer()
      : await img.removeAlpha().jpeg({ quality: quality ?? DEFAULT_JPEG_QUALITY }).toBuffer();
  return new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength);
}

/**
 * Resizes `frame` to fit `size` x `size` keeping its aspect ratio, then pads it with black,
 * centred: LeRobot's `resize_with_pad_torch` (bilinear, align_corners=False, no antialias),
 * specified to the bit in protocol/resize.ts. Yields to the event loop first, so that a batch of
 * frames resizes one frame per turn. A frame already `size` x `size` comes back as a copy.
 * @returns a uint8 `[size, size, 3]` frame.
 */
export async function resizeWithPad(frame: Frame, size: number): Promise<Frame> {
  await new Promise<void>((resolve) => setImmediate(resolve));
  return resizeWithPadSync(frame, size);
}
