/**
 * kernels/pi/batch.ts: the server's batch (uint8 HWC frames in camera slots, PaliGemma ids) as
 * the real model's batch, checked value by value, and a camera slot that no datum fills dropped
 * with the same velocity and sample as when it is fed black and masked (openpi's way).
 */
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { REAL_PI_TINY_PI0, REAL_PI_TINY_PI05 } from '../kernels/pi/config.ts';
import { toRealPiBatch } from '../kernels/pi/batch.ts';
import { createRealPiParams, disposeRealPiParams, type RealPiParams } from '../kernels/pi/params.ts';
import { sample, velocity } from '../kernels/pi/model.ts';
import type { ModelBatch } from '../kernels/small/batch.ts';
import { useBestBackend } from './helpers/tf.ts';

const S = REAL_PI_TINY_PI05.vision.imageSize;

/** 2 datums, 3 slots; `filled[i][k]` says whether datum i has a frame in slot k. */
function serverBatch(filled: number[][], ah = 10, ad = 32, sd = 32, L = 12): ModelBatch {
  const b = filled.length;
  const images = new Uint8Array(b * 3 * S * S * 3);
  filled.forEach((row, i) => row.forEach((on, k) => {
    if (!on) return;
    const off = (i * 3 + k) * S * S * 3;
    for (let p = 0; p < S * S * 3; p++) images[off + p] = (p * 31 + i * 7 + k * 13) % 256;
  }));
  return {
    size: b, images, imageMask: Uint8Array.from(filled.flat()),
    tokens: Int32Array.from({ length: b * L }, (_, j) => (j * 37 + 2) % 1000), tokenMask: Uint8Array.from({ length: b * L }, (_, j) => (j % L < 9 ? 1 : 0)),
    state: new Float32Array(b * sd).map((_, j) => Math.sin(j) * 0.5), actions: new Float32Array(b * ah * ad), actionMask: new Float32Array(b * ah * ad), weight: new Float32Array(b).fill(1),
  };
}

beforeAll(async () => {
  await useBestBackend();
});

describe('toRealPiBatch', () => {
  it('writes channels first in [-1, 1] (x / 255 * 2 - 1), keeps the masks, and gives pi0 (not pi0.5) its state', () => {
    const mb = serverBatch([[1, 1, 0], [1, 0, 1]]);
    const rb = toRealPiBatch(REAL_PI_TINY_PI0, mb);
    expect(rb.numCameras).toBe(3);
    expect(Array.from(rb.imageMasks)).toEqual([1, 1, 0, 1, 0, 1]);
    // datum 1, slot 2, pixel (row 3, col 5), channel 1 (G)
    const p = 3 * S + 5;
    const src = mb.images[((1 * 3 + 2) * S * S + p) * 3 + 1]!;
    expect(rb.images[((1 * 3 + 2) * 3 + 1) * S * S + p]).toBeCloseTo((src / 255) * 2 - 1, 6);
    expect(rb.images[((0 * 3 + 2) * 3) * S * S]).toBe(-1); // an empty slot is black
    expect(rb.state).toBe(mb.state);
    expect(toRealPiBatch(REAL_PI_TINY_PI05, mb).state).toBeUndefined();
    expect(rb.actions).toBeUndefined(); // no action entry counts: a sampling batch
  });

  it('trims the prompt padding after the longest real prompt, with the same velocity', () => {
    const config = REAL_PI_TINY_PI05;
    const params: RealPiParams = createRealPiParams(config, 'contract-init');
    try {
      const mb = serverBatch([[1, 1, 0], [1, 0, 0]]); // prompts of 9 real tokens in 12
      const trimmed = toRealPiBatch(config, mb);
      expect(trimmed.tokens.length).toBe(2 * 9);
      expect(Array.from(trimmed.tokens.slice(9, 18))).toEqual(Array.from(mb.tokens.slice(12, 21)));
      const padded = { ...trimmed, tokens: mb.tokens, tokenMasks: mb.tokenMask };
      const x = new Float32Array(2 * 10 * 32).map((_, j) => Math.sin(j * 0.7));
      const time = new Float32Array([0.5, 0.2]);
      const [a, b] = tf.tidy(() => [velocity({ config, params }, trimmed, x, time).dataSync(), velocity({ config, params }, padded, x, time).dataSync()]);
      const scale = Math.max(...Array.from(b!, Math.abs));
      expect(Math.max(...Array.from(a!, (v, j) => Math.abs(v - b![j]!)))).toBeLessThan(1e-5 * scale);
    } finally {
      disposeRealPiParams(params);
    }
  });

  it('drops a slot no datum fills, with the velocity and sample of feeding it black and masked', () => {
    for (const config of [REAL_PI_TINY_PI0, REAL_PI_TINY_PI05]) {
      const params: RealPiParams = createRealPiParams(config, 'contract-init');
      try {
        const mb = serverBatch([[1, 0, 0], [1, 0, 0]]);
        const dropped = toRealPiBatch(config, mb);
        expect(dropped.numCameras).toBe(1);
        // openpi's way: all three cameras, the empty ones black with mask 0.
        const full = { ...dropped, numCameras: 3, imageMasks: [1, 0, 0, 1, 0, 0], images: new Float32Array(2 * 3 * 3 * S * S).fill(-1) };
        for (let i = 0; i < 2; i++) full.images.set(dropped.images.subarray(i * 3 * S * S, (i + 1) * 3 * S * S), i * 3 * 3 * S * S);
        const x = new Float32Array(2 * 10 * 32).map((_, j) => Math.cos(j * 0.3));
        const time = new Float32Array([0.3, 0.9]);
        const model = { config, params };
        const [a, b] = tf.tidy(() => [velocity(model, dropped, x, time).dataSync(), velocity(model, full, x, time).dataSync()]);
        const scale = Math.max(...Array.from(b!, Math.abs));
        expect(Math.max(...Array.from(a!, (v, j) => Math.abs(v - b![j]!)))).toBeLessThan(1e-5 * scale);
        const [sa, sb] = tf.tidy(() => [sample(model, dropped, x, 3).dataSync(), sample(model, full, x, 3).dataSync()]);
        const sscale = Math.max(...Array.from(sb!, Math.abs));
        expect(Math.max(...Array.from(sa!, (v, j) => Math.abs(v - sb![j]!)))).toBeLessThan(1e-5 * sscale);
      } finally {
        disposeRealPiParams(params);
      }
    }
  });
});

afterAll(() => tf.disposeVariables());
