/**
 * Pixel buffers as every frame codec hands them over (protocol/frames.ts, protocol/zpng.ts), the
 * size limit they share (PROTOCOL.md section 8), and their errors.
 */
import { ProtocolError } from './errors.ts';

/** A decoded frame: `data` is uint8 `[height, width, 3]` RGB, C order. */
export interface Frame {
  data: Uint8Array;
  height: number;
  width: number;
}

/** Pixels with any channel count (1 gray, 2 gray+alpha, 3 RGB, 4 RGBA): uint8 `[height, width, channels]`. */
export interface Pixels extends Frame {
  channels: number;
}

/** The structural shape of an ndarray (protocol/ndarray.ts): raw C-order bytes of `dtype`. */
export interface NDArrayLike {
  dtype: string;
  shape: readonly number[];
  data: ArrayBufferView;
}

/** Decoding limits. */
export interface FrameLimits {
  /** Largest width * height accepted; default 4096 * 4096 (PROTOCOL.md section 8). */
  maxPixels?: number;
}

/** The default of `FrameLimits.maxPixels`. */
export const DEFAULT_MAX_PIXELS = 4096 * 4096;

/** A frame that cannot be decoded: ProtocolError `bad_frame`. */
export function badFrame(message: string): ProtocolError {
  return new ProtocolError('bad_frame', message);
}

/**
 * Checks a frame's size (from its header, before any pixel is decoded); `what` names it in errors.
 * @throws ProtocolError `too_large` over `limits.maxPixels`, `bad_frame` for an empty image.
 */
export function checkPixels(what: string, width: number, height: number, limits: FrameLimits): void {
  const max = limits.maxPixels ?? DEFAULT_MAX_PIXELS;
  if (width * height > max) {
    throw new ProtocolError('too_large', `${what} is ${width}x${height} = ${width * height} pixels; the limit is ${max}`);
  }
  if (width < 1 || height < 1) throw badFrame(`${what} is ${width}x${height}: an empty image`);
}

/** The first 8 bytes in hex, for messages about a header. */
export function hexHead(bytes: Uint8Array): string {
  return Array.from(bytes.subarray(0, 8), (b) => b.toString(16).padStart(2, '0')).join(' ');
}
