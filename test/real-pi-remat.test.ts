/**
 * Rematerialisation of the real pi0 / pi0.5 (kernels/pi/model.ts gemmaStack and siglip through
 * kernels/layers.ts checkpointBlock; issue 34): a training pass through the trainer keeps only
 * each block's inputs and re-runs the block in the backward pass. On the tiny configs, both
 * families, LoRA and full: the loss and every gradient equal the path without it
 * (`VELA_CHECKPOINT=off`) to float32 rounding; the peak of tensor bytes during forward_backward
 * falls (so the test fails when remat is off); a trained SigLIP (full) is rematerialised too: a
 * deeper tower adds only its blocks' inputs and gradients to the peak; a frozen SigLIP (LoRA's
 * default) keeps nothing for the backward pass: the peak does not grow with the tower's depth.
 * No tensor leaks.
 * On the best backend only (native TensorFlow when present).
 */
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { longestRealPiReduction, passBound, relDiff } from './helpers/float32.ts';
import { useBestBackend } from './helpers/tf.ts';
import { makeRealPiConfig, REAL_PI_TINY_PI0, REAL_PI_TINY_PI05, type RealPiConfig } from '../kernels/pi/config.ts';
import { fakeRealPiBatch } from '../kernels/pi/fake.ts';
import type { RealPiBatch } from '../kernels/pi/model.ts';
import { OPENPI_LORA, realPiPolicy } from '../kernels/pi/policy.ts';
import { BaseWeights, TrainingState } from '../kernels/trainer.ts';

/** Runs fn with VELA_CHECKPOINT set to `mode`, restoring it after. */
function withCheckpoint<T>(mode: 'on' | 'off' | undefined, fn: () => T): T {
  const before = process.env.VELA_CHECKPOINT;
  if (mode === undefined) delete process.env.VELA_CHECKPOINT;
  else process.env.VELA_CHECKPOINT = mode;
  try {
    return fn();
  } finally {
    if (before === undefined) delete process.env.VELA_CHECKPOINT;
    else process.env.VELA_CHECKPOINT = before;
  }
}



const draw = (c: RealPiConfig, b: number) => ({
  noise: new Float32Array(b * c.actionHorizon * c.actionDim).map((_, i) => Math.cos(i * 0.3)),
  time: Float32Array.from({ length: b }, (_, i) => 0.3 + 0.5 * (i % 2)),
});

/** One forward_backward of a fresh state (seed 3) with the checkpoint setting `mode`: loss, per-datum loss, gradients. */
function oneStep(base: BaseWeights<RealPiBatch, RealPiConfig>, finetune: 'lora' | 'full', batch: RealPiBatch, mode: 'on' | 'off' | undefined) {
  const state = new TrainingState(base, { finetune, ...OPENPI_LORA, seed: 3 });
  try {
    const r = withCheckpoint(mode, () => state.forwardBackward(batch, draw(base.policy.config, batch.size)));
    return { ...r, grads: state.accumulatedGradients().grads };
  } finally {
    state.dispose();
  }
}

/** Peak tensor bytes above what was alive before, during one forward_backward (tf.profile). */
async function peakOfStep(base: BaseWeights<RealPiBatch, RealPiConfig>, finetune: 'lora' | 'full', batch: RealPiBatch, mode: 'on' | 'off' | undefined): Promise<number> {
  const state = new TrainingState(base, { finetune, ...OPENPI_LORA, seed: 3 });
  try {
    const before = tf.memory().numBytes;
    const prof = await withCheckpoint(mode, () => tf.profile(() => void state.forwardBackward(batch, draw(base.policy.config, batch.size))));
    return prof.peakBytes - before;
  } finally {
    state.dispose();
  }
}

beforeAll(() => useBestBackend());

describe.each([
  ['pi0', REAL_PI_TINY_PI0],
  ['pi05', REAL_PI_TINY_PI05],
] as const)('real %s: rematerialisation', (_name, c) => {
  const K = longestRealPiReduction(c);
  const batch = fakeRealPiBatch(c, 12, 0.5);
  let base: BaseWeights<RealPiBatch, RealPiConfig>;
  beforeAll(() => {
    base = BaseWeights.create(realPiPolicy(c));
  });
  afterAll(() => base.dispose());

  it.each(['lora', 'full'] as const)('%s: the loss and every gradient equal the path without it (float32 rounding), by default and with VELA_CHECKPOINT=on', (finetune) => {
    const tensorsBefore = tf.memory().numTensors;
    const off = oneStep(base, finetune, batch, 'off');
    for (const mode of [undefined, 'on'] as const) {
      const on = oneStep(base, finetune, batch, mode);
      expect(relDiff(on.lossPerDatum, off.lossPerDatum)).toBeLessThanOrEqual(passBound(K));
      expect(Math.abs(on.loss - off.loss)).toBeLessThanOrEqual(passBound(K) * Math.abs(off.loss));
      // The same parameters get gradients (the prefix's last O and MLP feed nothing: none either way).
      expect([...on.grads.keys()].sort()).toEqual([...off.grads.keys()].sort());
      for (const [name, g] of off.grads) expect(relDiff(on.grads.get(name)!, g), name).toBeLessThanOrEqual(passBound(2 * K));
    }
    // A full fine-tune trains the vision tower (its blocks are rematerialised too); LoRA does not.
    const vision = [...off.grads.keys()].filter((n) => n.includes('vision_tower'));
    expect(vision.length > 0).toBe(finetune === 'full');
    expect(tf.memory().numTensors).toBe(tensorsBefore);
  });
});

/** A tiny-shaped config with `depth` Gemma layers, `visionDepth` SigLIP layers and a wider MLP, so that the tape's activations dominate. */
const DEEP = (variant: 'pi0' | 'pi05', depth: number, visionDepth: number) => makeRealPiConfig({
  variant, vlm: { width: 64, depth, mlpDim: 256, numHeads: 8, numKvHeads: 1, headDim: 16, vocabSize: 1000 },
  expert: { width: 32, depth, mlpDim: 128, numHeads: 8, numKvHeads: 1, headDim: 16 },
  vision: { width: 32, depth: visionDepth, mlpDim: 64, numHeads: 2, patchSize: 14, imageSize: 56 }, actionDim: 32, actionHorizon: 10, maxTokenLen: 48, numSteps: 2,
});

describe.each(['pi0', 'pi05'] as const)('real %s: what a training pass keeps', (variant) => {
  it('rematerialisation lowers the peak of a forward_backward (LoRA and full, depth 8)', async () => {
    const c = DEEP(variant, 8, 2);
    const base = BaseWeights.create(realPiPolicy(c));
    try {
      const batch = fakeRealPiBatch(c, 48, 0.5);
      for (const finetune of ['lora', 'full'] as const) {
        const off = await peakOfStep(base, finetune, batch, 'off');
        const on = await peakOfStep(base, finetune, batch, undefined);
        console.log(`${variant} ${finetune}: peak above the base with remat ${(on / 1e6).toFixed(2)} MB, without ${(off / 1e6).toFixed(2)} MB (${(on / off).toFixed(2)}x)`);
        // Taped, all 8 layers' tapes are alive at once; rematerialised, one block's re-run (about
        // 1.5 taped layers: kernels/pi/memory.ts) and the residual streams: well under half.
        expect(on).toBeLessThan(0.5 * off);
      }
    } finally {
      base.dispose();
    }
  }, 60_000);

  it("full: a trained SigLIP's blocks are rematerialised too: the peak grows with its depth far less than taped", async () => {
    const growth: Record<string, number> = {};
    for (const mode of ['off', undefined] as const) {
      const peaks: number[] = [];
      for (const depth of [2, 8]) {
        const c = DEEP(variant, 2, depth);
        const base = BaseWeights.create(realPiPolicy(c));
        try {
          // The weights a deeper tower adds (its copies, moments, gradients) are allocated before the step or counted by both modes alike.
          peaks.push(await peakOfStep(base, 'full', fakeRealPiBatch(c, 48, 0.5), mode));
        } finally {
          base.dispose();
        }
      }
      growth[mode ?? 'on'] = peaks[1]! - peaks[0]!;
    }
    // Rematerialised, each more block keeps its input and, to the end of the backward pass, a few
    // gradients of that size (4 copies of [b nc, T, Wv]), and its parameters' gradients; taped, its
    // whole tape (tens of values per width and token).
    const c = DEEP(variant, 2, 2);
    const v = c.vision;
    const stream = 2 * 3 * (v.imageSize / v.patchSize) ** 2 * v.width;
    const layerParams = 4 * (v.width * v.width + v.width) + 4 * v.width + 2 * v.width * v.mlpDim + v.mlpDim + v.width;
    const bound = 6 * (4 * stream + layerParams) * 4;
    console.log(`${variant} full: 6 more SigLIP layers raise the peak by ${(growth.on! / 1e6).toFixed(3)} MB rematerialised (bound ${(bound / 1e6).toFixed(3)} MB), ${(growth.off! / 1e6).toFixed(3)} MB taped`);
    expect(growth.on!).toBeLessThanOrEqual(bound);
    expect(growth.off!).toBeGreaterThan(4 * bound);
  }, 60_000);

  it('LoRA keeps nothing of the frozen SigLIP: the peak does not grow with its depth', async () => {
    const peaks: number[] = [];
    const c2 = DEEP(variant, 2, 2);
    let layerBytes = 0;
    for (const depth of [2, 8]) {
      const c = DEEP(variant, 2, depth);
      const base = BaseWeights.create(realPiPolicy(c));
      try {
        const batch = fakeRealPiBatch(c, 48, 0.5);
        peaks.push(await peakOfStep(base, 'lora', batch, undefined));
      } finally {
        base.dispose();
      }
    }
    // One SigLIP layer's residual stream, [b * nc, T, Wv] floats: the six more layers would keep several each.
    layerBytes = 2 * 3 * (c2.vision.imageSize / c2.vision.patchSize) ** 2 * c2.vision.width * 4;
    console.log(`${variant} LoRA: peak above the base with 2 SigLIP layers ${(peaks[0]! / 1e6).toFixed(3)} MB, with 8 ${(peaks[1]! / 1e6).toFixed(3)} MB; one layer's stream ${(layerBytes / 1e6).toFixed(3)} MB`);
    expect(Math.abs(peaks[1]! - peaks[0]!)).toBeLessThan(layerBytes);
  }, 60_000);
});
