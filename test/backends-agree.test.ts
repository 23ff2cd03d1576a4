/**
 * The same training step and the same sampling on every backend present agree (native
 * TensorFlow and wasm in CI). Each backend builds the model from the same seed, takes one
 * forward_backward with fixed noise and time, one AdamW step, and samples with a fixed seed.
 *
 * Tolerances (float32 everywhere; the backends differ in summation order, FMA and vectorised
 * transcendental functions), derived in test/helpers/float32.ts from the longest reduction K
 * (the MLP's mlpDim = 64 terms forward; a weight gradient sums batch x tokens = 3 x 22 = 66, so 2K
 * backward), with the transcendental functions' few ulp each inside the factor of 2:
 *   loss per datum: 2 passBound(K) relative; gradients and their norm: 2 passBound(2K) of each
 *     tensor's largest entry;
 *   parameters after AdamW (lr 1e-3, its first step: lr g / (|g| + eps) plus the decay, which both
 *     share): a gradient entry g off by at most d moves the update by lr 2d / (|g| - d) while
 *     d < |g| / 2, else by at most 2 lr (the sign); plus half an ulp of the parameter;
 *   sampled actions (10 Euler steps): sampleBound(K) of their scale.
  */
import { passBound, sampleBound, U32 } from './helpers/float32.ts';
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
    const K = config.mlpDim;
    const lossBound = 2 * passBound(K);
    const gradBound = 2 * passBound(2 * K);
    for (let i = 0; i < a.lossPerDatum.length; i++) {
      expect(Math.abs(a.lossPerDatum[i]! - b.lossPerDatum[i]!) / Math.abs(b.lossPerDatum[i]!)).toBeLessThan(lossBound);
    }
    expect(Math.abs(a.gradNorm - b.gradNorm) / b.gradNorm).toBeLessThan(gradBound);
    expect(a.gradNorm).toBeGreaterThan(0); // a real step, so the comparisons below can fail
    expect([...a.grads.keys()].sort()).toEqual([...b.grads.keys()].sort());
    for (const [k, g] of a.grads) expect(worstDiff(g, b.grads.get(k)!), k).toBeLessThanOrEqual(gradBound * Math.max(maxAbs(b.grads.get(k)!), 1e-12));
    const lr = 1e-3;
    for (const [k, p] of a.params) {
      const q = b.params.get(k)!;
      const g = b.grads.get(k);
      const d = gradBound * (g ? maxAbs(g) : 0);
      for (let i = 0; i < p.length; i++) {
        const gi = g ? Math.abs(g[i]!) : 0;
        const update = d < gi / 2 ? (lr * 2 * d) / (gi - d) : 2 * lr;
        expect(Math.abs(p[i]! - q[i]!), `${k}[${i}]`).toBeLessThanOrEqual(update + U32 * Math.abs(q[i]!));
      }
    }
    expect(worstDiff(a.actions, b.actions)).toBeLessThan(sampleBound(K) * Math.max(1, maxAbs(b.actions)));
    expect(maxAbs(a.actions)).toBeGreaterThan(0.1);
  });
});

it('CI runs the agreement above: native TensorFlow and wasm are both present there', () => {
  if (process.env.CI === 'true') expect(NATIVE_PRESENT).toBe(true);
  expect(TEST_BACKENDS.length).toBeGreaterThan(0);
});
