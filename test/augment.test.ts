/**
 * Training-frame augmentation (issue 16, server/datasets/augment.ts): identity is exact, the
 * geometry is a bilinear resampling of the crop rotated about its centre, the colour jitter
 * follows its formulas, and the drawn parameters stay in openpi's ranges.
 */
import { describe, expect, it } from 'vitest';
import { augmentFrame, drawAugment, IDENTITY } from '../server/datasets/augment.ts';
import { seededRng } from '../server/datasets/index.ts';

/** A w x h frame whose pixel (x, y) is [10 x + y, 2 y + 50, 255 - x]. */
function ramp(w: number, h: number) {
  const data = new Uint8Array(w * h * 3);
  for (let y = 0; y < h; y++) for (let x = 0; x < w; x++) data.set([10 * x + y, 2 * y + 50, 255 - x], (y * w + x) * 3);
  return { width: w, height: h, data };
}
const px = (f: { width: number; data: Uint8Array }, x: number, y: number) => Array.from(f.data.subarray((y * f.width + x) * 3, (y * f.width + x) * 3 + 3));

describe('augmentFrame', () => {
  it('identity parameters return the same bytes', () => {
    const f = ramp(7, 5);
    expect(augmentFrame(f, IDENTITY).data).toEqual(f.data);
  });

  it('a quarter turn moves pixels about the centre; a half crop upsamples a corner bilinearly', () => {
    const f = ramp(3, 3);
    const turned = augmentFrame(f, { ...IDENTITY, rotation: Math.PI / 2 });
    // Output (x, y) samples the source at centre + R(d): (1 - (y - 1), 1 + (x - 1)) = (2 - y, x).
    for (let y = 0; y < 3; y++) for (let x = 0; x < 3; x++) expect(px(turned, x, y)).toEqual(px(f, 2 - y, x));
    const g = ramp(4, 4);
    const cropped = augmentFrame(g, { ...IDENTITY, scale: 0.5, offsetX: 0, offsetY: 0 });
    // Output (3, 3) samples (1.25, 1.25): the bilinear mix of source pixels (1..2, 1..2).
    const at = (x: number, y: number, c: number) => g.data[(y * 4 + x) * 3 + c]!;
    const want = [0, 1, 2].map((c) => Math.round(0.75 * 0.75 * at(1, 1, c) + 0.25 * 0.75 * (at(2, 1, c) + at(1, 2, c)) + 0.25 * 0.25 * at(2, 2, c)));
    expect(px(cropped, 3, 3)).toEqual(want);
    expect(px(cropped, 0, 0)).toEqual(px(g, 0, 0)); // -0.25 clamps to the edge
  });

  it('brightness scales, saturation 0 greys each pixel with ITU-R 601 luma, contrast blends with the mean grey', () => {
    const f = ramp(4, 2);
    const bright = augmentFrame(f, { ...IDENTITY, brightness: 1.5 });
    bright.data.forEach((v, i) => expect(v).toBe(Math.min(255, Math.round(f.data[i]! * 1.5))));
    const grey = augmentFrame(f, { ...IDENTITY, saturation: 0 });
    for (let i = 0; i < 8; i++) {
      const [r, g, b] = [f.data[i * 3]!, f.data[i * 3 + 1]!, f.data[i * 3 + 2]!];
      const l = Math.round(0.299 * r + 0.587 * g + 0.114 * b);
      expect(Array.from(grey.data.subarray(i * 3, i * 3 + 3))).toEqual([l, l, l]);
    }
    let mean = 0;
    for (let i = 0; i < 8; i++) mean += (0.299 * f.data[i * 3]! + 0.587 * f.data[i * 3 + 1]! + 0.114 * f.data[i * 3 + 2]!) / 8;
    const flat = augmentFrame(f, { ...IDENTITY, contrast: 0 });
    flat.data.forEach((v) => expect(v).toBe(Math.round(mean)));
  });

  it('draws crop 95%, rotation within 5 degrees and jitter within openpi ranges, from the seeded generator', () => {
    const rng = seededRng(5);
    for (let i = 0; i < 200; i++) {
      const p = drawAugment(rng);
      expect(p.scale).toBe(0.95);
      expect(p.offsetX).toBeGreaterThanOrEqual(0);
      expect(p.offsetX).toBeLessThanOrEqual(0.05);
      expect(Math.abs(p.rotation)).toBeLessThanOrEqual((5 * Math.PI) / 180);
      expect(Math.abs(p.brightness - 1)).toBeLessThanOrEqual(0.3);
      expect(Math.abs(p.contrast - 1)).toBeLessThanOrEqual(0.4);
      expect(Math.abs(p.saturation - 1)).toBeLessThanOrEqual(0.5);
    }
    expect(drawAugment(seededRng(9))).toEqual(drawAugment(seededRng(9)));
  });
});
