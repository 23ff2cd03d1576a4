/**
 * Image augmentation for training frames (issue 16), openpi's recipe for pi0 on non-wrist
 * cameras: a random crop of 95% of each side at a random place, resized back; a rotation of up
 * to +-5 degrees about the centre; then colour jitter: brightness, contrast and saturation
 * factors drawn from [1 - 0.3, 1 + 0.3], [1 - 0.4, 1 + 0.4], [1 - 0.5, 1 + 0.5]. Geometry is one
 * bilinear resampling pass (output pixel -> rotated, cropped source point; edges clamp).
 * Frames are [height, width, 3] uint8 RGB; every draw comes from the caller's seeded generator.
 */
import type { Rng } from './split.ts';
import type { Frame } from './types.ts';

/** One augmentation's parameters; `identity` changes nothing. */
export interface AugmentParams {
  /** Kept share of each side (1: no crop) and the crop's top-left offset in [0, 1 - scale] of each side. */
  scale: number;
  offsetX: number;
  offsetY: number;
  /** Radians, counter-clockwise about the centre. */
  rotation: number;
  brightness: number;
  contrast: number;
  saturation: number;
}

export const IDENTITY: Readonly<AugmentParams> = Object.freeze({ scale: 1, offsetX: 0, offsetY: 0, rotation: 0, brightness: 1, contrast: 1, saturation: 1 });

/** Draws openpi's ranges (see the module comment) from `rng`, in a fixed order. */
export function drawAugment(rng: Rng): AugmentParams {
  const u = (lo: number, hi: number) => lo + (hi - lo) * rng();
  const scale = 0.95;
  return {
    scale, offsetX: u(0, 1 - scale), offsetY: u(0, 1 - scale), rotation: (u(-5, 5) * Math.PI) / 180,
    brightness: u(0.7, 1.3), contrast: u(0.6, 1.4), saturation: u(0.5, 1.5),
  };
}

const clamp255 = (v: number) => (v < 0 ? 0 : v > 255 ? 255 : Math.round(v));

/**
 * A new frame: crop + rotate (bilinear), then brightness (x * b), contrast (blend with the mean
 * grey level), saturation (blend with each pixel's grey level), rounded and clamped to 0..255.
 * Grey is ITU-R 601 luma (0.299 R + 0.587 G + 0.114 B), as torchvision's jitter uses.
 */
export function augmentFrame(frame: Frame, p: AugmentParams): Frame {
  const { width: W, height: H, data } = frame;
  const out = new Float32Array(W * H * 3);
  const cos = Math.cos(p.rotation);
  const sin = Math.sin(p.rotation);
  const cx = (W - 1) / 2;
  const cy = (H - 1) / 2;
  // Output pixel (x, y) -> the crop's coordinates -> rotated about the crop's centre -> source.
  const cropCx = p.offsetX * W + (p.scale * W - 1) / 2;
  const cropCy = p.offsetY * H + (p.scale * H - 1) / 2;
  for (let y = 0; y < H; y++) {
    for (let x = 0; x < W; x++) {
      const dx = (x - cx) * p.scale;
      const dy = (y - cy) * p.scale;
      const sx = Math.min(W - 1, Math.max(0, cropCx + cos * dx - sin * dy));
      const sy = Math.min(H - 1, Math.max(0, cropCy + sin * dx + cos * dy));
      const x0 = Math.floor(sx);
      const y0 = Math.floor(sy);
      const x1 = Math.min(W - 1, x0 + 1);
      const y1 = Math.min(H - 1, y0 + 1);
      const fx = sx - x0;
      const fy = sy - y0;
      for (let c = 0; c < 3; c++) {
        const a = data[(y0 * W + x0) * 3 + c]!;
        const b = data[(y0 * W + x1) * 3 + c]!;
        const d = data[(y1 * W + x0) * 3 + c]!;
        const e = data[(y1 * W + x1) * 3 + c]!;
        out[(y * W + x) * 3 + c] = (a * (1 - fx) + b * fx) * (1 - fy) + (d * (1 - fx) + e * fx) * fy;
      }
    }
  }
  const n = W * H;
  let meanGrey = 0;
  for (let i = 0; i < n; i++) {
    for (let c = 0; c < 3; c++) out[i * 3 + c] = Math.min(255, out[i * 3 + c]! * p.brightness);
    meanGrey += 0.299 * out[i * 3]! + 0.587 * out[i * 3 + 1]! + 0.114 * out[i * 3 + 2]!;
  }
  meanGrey /= n;
  const result = new Uint8Array(W * H * 3);
  for (let i = 0; i < n; i++) {
    let r = Math.min(255, Math.max(0, (out[i * 3]! - meanGrey) * p.contrast + meanGrey));
    let g = Math.min(255, Math.max(0, (out[i * 3 + 1]! - meanGrey) * p.contrast + meanGrey));
    let b = Math.min(255, Math.max(0, (out[i * 3 + 2]! - meanGrey) * p.contrast + meanGrey));
    const grey = 0.299 * r + 0.587 * g + 0.114 * b;
    r = (r - grey) * p.saturation + grey;
    g = (g - grey) * p.saturation + grey;
    b = (b - grey) * p.saturation + grey;
    result[i * 3] = clamp255(r);
    result[i * 3 + 1] = clamp255(g);
    result[i * 3 + 2] = clamp255(b);
  }
  return { width: W, height: H, data: result };
}
