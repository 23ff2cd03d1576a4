/**
 * The model's resize with padding (MODEL.md D12), specified to the bit so that every place that
 * resizes a frame gives the same pixels: the server (session ops, the policy server, dataset
 * frames) and the Python package (clients/python/src/vela/frames.py, which resizes before
 * sending). Training and serving therefore see one picture whichever side resized it.
 *
 * It is LeRobot's `resize_with_pad_torch` (lerobot/policies/common/vla_utils.py, the copy of
 * openpi's PyTorch path that pi0 / pi0.5 pre-process with): aspect kept, `F.interpolate(...,
 * mode="bilinear", align_corners=False)` (no antialias), centred black padding, and for uint8
 * input `torch.round` (half to even). The arithmetic is written out in float64, in one order, so
 * numpy reproduces it exactly; PyTorch computes the same formula in float32, so its values differ
 * from these by float32 rounding only (see test/frames.test.ts for the bound).
 */

import type { Frame } from './pixels.ts';

/**
 * The geometry of `resizeWithPad`: ratio = max(W / size, H / size), the picture resized to
 * int(W / ratio) x int(H / ratio) (at least 1 pixel), placed at int((size - side) / 2).
 */
export function padGeometry(width: number, height: number, size: number): { rw: number; rh: number; left: number; top: number } {
  const ratio = Math.max(width / size, height / size);
  const rw = Math.max(1, Math.trunc(width / ratio));
  const rh = Math.max(1, Math.trunc(height / ratio));
  return { rw, rh, left: Math.trunc((size - rw) / 2), top: Math.trunc((size - rh) / 2) };
}

/**
 * Source taps along one axis, as PyTorch's `area_pixel_compute_source_index` with
 * align_corners=False: s = max(0, (i + 0.5) * (n_in / n_out) - 0.5), i0 = floor(s),
 * i1 = i0 + 1 unless i0 is the last index, weights 1 - (s - i0) and s - i0.
 */
function taps(nIn: number, nOut: number): { i0: Int32Array; i1: Int32Array; w0: Float64Array; w1: Float64Array } {
  const scale = nIn / nOut;
  const i0 = new Int32Array(nOut), i1 = new Int32Array(nOut), w0 = new Float64Array(nOut), w1 = new Float64Array(nOut);
  for (let i = 0; i < nOut; i++) {
    const s = Math.max(0, (i + 0.5) * scale - 0.5);
    const f = Math.floor(s);
    i0[i] = f;
    i1[i] = f < nIn - 1 ? f + 1 : f;
    w1[i] = s - f;
    w0[i] = 1 - w1[i]!;
  }
  return { i0, i1, w0, w1 };
}

/** torch.round / numpy.rint: to the nearest integer, halves to even. */
function roundHalfEven(v: number): number {
  const r = Math.round(v); // halves up
  return r - v === 0.5 && (r & 1) === 1 ? r - 1 : r;
}

/**
 * The resized picture before rounding: `rh` x `rw` x 3 float64 values in 0..255, each
 * `w0y * (w0x * p[y0][x0] + w1x * p[y0][x1]) + w1y * (w0x * p[y1][x0] + w1x * p[y1][x1])`, in
 * that order, with the taps of PyTorch's bilinear interpolation (align_corners=False).
 * @param frame uint8 `[height, width, 3]`.
 * @throws RangeError when `frame.data` does not hold H x W x 3 bytes or a size is not a positive integer.
 */
export function bilinearValues(frame: Frame, rh: number, rw: number): Float64Array {
  const { width: W, height: H, data: src } = frame;
  if (!(W >= 1 && H >= 1) || src.byteLength !== W * H * 3) {
    throw new RangeError(`frame data is ${src.byteLength} bytes; ${W}x${H}x3 needs ${W * H * 3}`);
  }
  if (!(Number.isInteger(rh) && rh >= 1 && Number.isInteger(rw) && rw >= 1)) throw new RangeError(`resize to ${rw}x${rh}: sizes are positive integers`);
  const ys = taps(H, rh), xs = taps(W, rw);
  const out = new Float64Array(rh * rw * 3);
  let o = 0;
  for (let y = 0; y < rh; y++) {
    const r0 = ys.i0[y]! * W * 3, r1 = ys.i1[y]! * W * 3, wy0 = ys.w0[y]!, wy1 = ys.w1[y]!;
    for (let x = 0; x < rw; x++) {
      const c0 = xs.i0[x]! * 3, c1 = xs.i1[x]! * 3, wx0 = xs.w0[x]!, wx1 = xs.w1[x]!;
      for (let c = 0; c < 3; c++) {
        out[o++] = wy0 * (wx0 * src[r0 + c0 + c]! + wx1 * src[r0 + c1 + c]!) + wy1 * (wx0 * src[r1 + c0 + c]! + wx1 * src[r1 + c1 + c]!);
      }
    }
  }
  return out;
}

/**
 * Resizes `frame` to fit `size` x `size` with its aspect kept and pads it with black, centred:
 * LeRobot's `resize_with_pad_torch` on uint8 (see the module comment): `padGeometry`, then
 * `bilinearValues` rounded half to even. A frame already `size` x `size` comes back as a copy.
 * Synchronous: about a millisecond for a 224 x 224 output on one core.
 * @param frame uint8 `[height, width, 3]`.
 * @returns uint8 `[size, size, 3]`, a fresh buffer.
 * @throws RangeError when `size` is not a positive integer or `frame.data` does not hold H x W x 3 bytes.
 */
export function resizeWithPadSync(frame: Frame, size: number): Frame {
  if (!(Number.isInteger(size) && size >= 1)) throw new RangeError(`resize size ${size} is not a positive integer`);
  const { width: W, height: H } = frame;
  if (W === size && H === size && frame.data.byteLength === W * H * 3) return { data: frame.data.slice(), height: size, width: size };
  const { rw, rh, left, top } = padGeometry(W, H, size);
  const v = bilinearValues(frame, rh, rw);
  const out = new Uint8Array(size * size * 3);
  const row = rw * 3;
  for (let y = 0; y < rh; y++) {
    const o = ((top + y) * size + left) * 3;
    // A convex combination of 0..255 is at most an ulp past 255, which rounds to 255.
    for (let i = 0; i < row; i++) out[o + i] = roundHalfEven(v[y * row + i]!);
  }
  return { data: out, height: size, width: size };
}
