/**
 * The same training step and the same sampling on every backend present agree (native
 * TensorFlow and wasm in CI). Each backend builds the model from the same seed, takes one
 * forward_backward with fixed noise and time, one AdamW step, and samples with a fixed seed.
 *
 * Tolerances (float32 everywhere; the backends differ only in summation order, FMA and
 * vectorised transcendental functions):
 *   loss per datum, gradient norm: 1e-5 relative (measured here: 1.8e-7 and 5e-8);
 *   accumulated gradients: 1e-4 of each tensor's largest entry;
 *   parameters after AdamW: 1e-6 absolute plus 1e-5 relative, a small fraction of the step
 *     (lr 1e-3), so a wrong update on one backend cannot hide (measured: 5e-10);
 *   sampled actions (10 Euler steps, errors compound): 1e-5 absolute (measured: 5e-7).
 */
import { describe, expect, it } from 'vitest';
import { makeConfig } from '../kernels/small/config.ts';
import { fakeBatch } from '../kernels/small/batch.ts';
import { drawNoiseTime } from '../kernels/flow.ts';
import { Rng } from '../kernels/rng.ts';
import { BaseWeights, TrainingState } from '../kernels/trainer.ts';
import type { BackendKind } from '../kernels/backend/backend.ts';
import { NATIVE_PRESENT, TEST_BACKENDS, useBackend } from './helpers/tf.ts';

interface Outcome {
  lossPerDatum: Float32Array;
  grads: Map<string, Float32Array>;
  gradNorm: number;
  params: Map<string, Float32Array>;
  actions: Float32Array;
}

const config = makeConfig('flow05-tiny', { imageSize: 32, patch: 16, slots: 2, width: 32, depth: 2, heads: 2, headDim: 16, mlpDim: 64, maxTokenLen: 8, stateDim: 6, actionDim: 4, horizon: 5 });
const batch = fakeBatch(config, 3, 11);
const { noise, time } = drawNoiseTime(new Rng(5), 3, config.horizon, config.actionDim);

async function stepOn(kind: BackendKind, finetune: 'full' | 'lora'): Promise<Outcome> {
  await useBackend(kind);
  const base = BaseWeights.create(config, 3);
  const s = new TrainingState(base, { finetune, rank: 4, alpha: 8, seed: 1 });
  try {
    const { lossPerDatum } = s.forwardBackward(batch, { noise, time });
    const grads = new Map([...s.accumulatedGradients().grads].map(([k, v]) => [k, Float32Array.from(v)]));
    const { gradNorm } = s.optimStep({ learningRate: 1e-3, weightDecay: 0.01, gradClipNorm: 1 });
    const params = new Map(Object.entries(s.trainableTensors()).map(([k, v]) => [k, Float32Array.from(v.data)]));
    const actions = s.sample(batch, { numSteps: 10, seed: 9 });
    return { lossPerDatum: Float32Array.from(lossPerDatum), grads, gradNorm, params, actions };
  } finally {
    s.dispose();
    base.dispose();
  }
}

function maxAbs(a: Float32Array): number {
  let m = 0;
  for (const x of a) m = Math.max(m, Math.abs(x));
  return m;
}

function worstDiff(a: Float32Array, b: Float32Array): number {
  expect(a.length).toBe(b.length);
  let w = 0;
  for (let i = 0; i < a.length; i++) w = Math.max(w, Math.abs(a[i]! - b[i]!));
  return w;
}

describe.each(['full', 'lora'] as const)('cross-backend agreement (%s fine-tune)', (finetune) => {
  it.skipIf(TEST_BACKENDS.length < 2)(`${TEST_BACKENDS.join(' vs ')}: losses, gradients, AdamW update and sampled actions agree`, async () => {
    const [a, b] = [await stepOn(TEST_BACKENDS[0]!, finetune), await stepOn(TEST_BACKENDS[1]!, finetune)];
    for (let i = 0; i < a.lossPerDatum.length; i++) {
      expect(Math.abs(a.lossPerDatum[i]! - b.lossPerDatum[i]!) / Math.abs(b.lossPerDatum[i]!)).toBeLessThan(1e-5);
    }
    expect(Math.abs(a.gradNorm - b.gradNorm) / b.gradNorm).toBeLessThan(1e-5);
    expect(a.gradNorm).toBeGreaterThan(0); // a real step, so the comparisons below can fail
    expect([...a.grads.keys()].sort()).toEqual([...b.grads.keys()].sort());
    for (const [k, g] of a.grads) expect(worstDiff(g, b.grads.get(k)!), k).toBeLessThanOrEqual(1e-4 * Math.max(maxAbs(b.grads.get(k)!), 1e-12));
    for (const [k, p] of a.params) {
      const q = b.params.get(k)!;
      for (let i = 0; i < p.length; i++) expect(Math.abs(p[i]! - q[i]!), k).toBeLessThanOrEqual(1e-6 + 1e-5 * Math.abs(q[i]!));
    }
    expect(worstDiff(a.actions, b.actions)).toBeLessThan(1e-5);
    expect(maxAbs(a.actions)).toBeGreaterThan(0.1);
  });
});

it('CI runs the agreement above: native TensorFlow and wasm are both present there', () => {
  if (process.env.CI === 'true') expect(NATIVE_PRESENT).toBe(true);
  expect(TEST_BACKENDS.length).toBeGreaterThan(0);
});
