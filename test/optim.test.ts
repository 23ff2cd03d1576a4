import * as tf from '@tensorflow/tfjs';
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import {
  AdamWMoments,
  DEFAULT_ADAMW,
  OptimError,
  adamwStep,
  adamwStepOps,
  globalNorm,
  resolveAdamWOptions,
  type AdamWOptions,
} from '../kernels/optim.ts';
import { forEachBackend, TEST_BACKENDS, useBackend } from './helpers/tf.ts';

interface Case {
  name: string;
  options: { learning_rate: number; beta1: number; beta2: number; eps: number; weight_decay: number; grad_clip_norm: number };
  shapes: Record<string, number[]>;
  params: Record<string, number[]>;
  steps: { grads: Record<string, number[]>; grad_norm: number; clipped: boolean; params_after: Record<string, number[]> }[];
  final_state: { step: number; tensors: Record<string, number[]> };
}
const vectors = JSON.parse(
  readFileSync(new URL('./vectors/adamw/adamw.json', import.meta.url), 'utf8'),
) as { cases: Case[] };

function optionsOf(c: Case): AdamWOptions {
  const o = c.options;
  return {
    learningRate: o.learning_rate,
    beta1: o.beta1,
    beta2: o.beta2,
    eps: o.eps,
    weightDecay: o.weight_decay,
    gradClipNorm: o.grad_clip_norm,
  };
}

function makeParams(c: Case): Map<string, tf.Variable> {
  return new Map(Object.entries(c.params).map(([k, v]) => [k, tf.variable(tf.tensor(v, c.shapes[k], 'float32'))]));
}

function makeGrads(c: Case, step: number): Map<string, tf.Tensor> {
  return new Map(Object.entries(c.steps[step]!.grads).map(([k, v]) => [k, tf.tensor(v, c.shapes[k], 'float32')]));
}

/**
 * Largest |ours - torch| over a tensor, in float32 ulps (2^-23 relative) of the tensor's largest
 * |torch value|. Per-tensor rather than per-entry: torch's CPU kernels fuse lerp's multiply-add
 * into one FMA (one rounding) where TF.js rounds twice, so an entry whose terms nearly cancel
 * differs by a few ulps of the terms, which can be many ulps of the small result.
 */
function maxUlps(ours: Float32Array | number[], ref: number[]): number {
  let scale = 0;
  for (const r of ref) scale = Math.max(scale, Math.abs(r));
  const ulp = Math.max(scale * 2 ** -23, 2 ** -149);
  let worst = 0;
  for (let i = 0; i < ref.length; i++) worst = Math.max(worst, Math.abs(ours[i]! - Math.fround(ref[i]!)) / ulp);
  return worst;
}

function disposeAll(m: Map<string, tf.Tensor>): void {
  for (const t of m.values()) t.dispose();
}

// Tolerance: 2 float32 ulps of each tensor's scale (see maxUlps). Our op order is torch's; what
// is left is FMA contraction in torch's kernels (measured worst: printed in the test log).
const ULPS = 2;

forEachBackend('AdamW', () => {
  describe('adamwStep against torch.optim.AdamW', () => {
    for (const c of vectors.cases) {
      it(`case ${c.name}: three steps, norms, parameters and moments`, () => {
        const params = makeParams(c);
        const moments = AdamWMoments.create(params);
        const opts = optionsOf(c);
        let worst = 0;
        for (let s = 0; s < c.steps.length; s++) {
          const grads = makeGrads(c, s);
          const res = adamwStep(params, grads, moments, opts);
          disposeAll(grads);
          expect(res.skipped).toBe(false);
          expect(res.gradNorm).toBeCloseTo(c.steps[s]!.grad_norm, 5);
          for (const [k, p] of params) {
            const u = maxUlps(p.dataSync() as Float32Array, c.steps[s]!.params_after[k]!);
            worst = Math.max(worst, u);
            expect(u, `${c.name} step ${s + 1} ${k}`).toBeLessThanOrEqual(ULPS);
          }
        }
        const exported = moments.export();
        expect(exported.step).toBe(c.final_state.step);
        expect(Object.keys(exported.tensors).sort()).toEqual(Object.keys(c.final_state.tensors).sort());
        for (const [k, ref] of Object.entries(c.final_state.tensors)) {
          const u = maxUlps(exported.tensors[k]!.data, ref);
          worst = Math.max(worst, u);
          expect(u, `${c.name} ${k}`).toBeLessThanOrEqual(ULPS);
        }
        console.log(`adamw ${c.name}: worst difference from torch ${worst} ulp`);
        moments.dispose();
        disposeAll(params);
      });
    }

    it('the clipped case really clips: without clipping step 2 lands elsewhere', () => {
      // Adam's first step is invariant to a gradient scale (up to eps), so the clip shows at step 2.
      const c = vectors.cases.find((x) => x.name === 'clipped')!;
      expect(c.steps.map((s) => s.clipped)).toEqual([true, false, true]);
      const params = makeParams(c);
      const moments = AdamWMoments.create(params);
      for (const s of [0, 1]) {
        const grads = makeGrads(c, s);
        adamwStep(params, grads, moments, { ...optionsOf(c), gradClipNorm: 0 });
        disposeAll(grads);
      }
      const p = params.get('layer.weight')!.dataSync() as Float32Array;
      expect(maxUlps(p, c.steps[1]!.params_after['layer.weight']!)).toBeGreaterThan(1000);
      moments.dispose();
      disposeAll(params);
    });
  });

  describe('adamwStep behaviour', () => {
    it('a non-finite gradient norm skips: nothing changes, step stays', () => {
      const c = vectors.cases[0]!;
      const params = makeParams(c);
      const moments = AdamWMoments.create(params);
      const g0 = makeGrads(c, 0);
      adamwStep(params, g0, moments, optionsOf(c));
      const before = [...params.values()].map((p) => Array.from(p.dataSync()));
      const mBefore = moments.export();
      const bad = makeGrads(c, 1);
      const old = bad.get('layer.bias')!;
      bad.set('layer.bias', tf.tensor([1, NaN, 0, 0], [4]));
      old.dispose();
      const res = adamwStep(params, bad, moments, optionsOf(c));
      expect(res.skipped).toBe(true);
      expect(Number.isNaN(res.gradNorm)).toBe(true);
      expect([...params.values()].map((p) => Array.from(p.dataSync()))).toEqual(before);
      const mAfter = moments.export();
      expect(mAfter.step).toBe(1);
      for (const k of Object.keys(mBefore.tensors)) expect(mAfter.tensors[k]!.data).toEqual(mBefore.tensors[k]!.data);
      const inf = new Map([...g0].map(([k, t]) => [k, k === 'layer.weight' ? tf.fill(t.shape, Infinity) : t.clone()]));
      expect(adamwStep(params, inf, moments, optionsOf(c))).toEqual({ gradNorm: Infinity, skipped: true });
      for (const m of [g0, bad, inf]) disposeAll(m);
      moments.dispose();
      disposeAll(params);
    });

    it('globalNorm equals a float64 reference on a 1M-element tensor, a ragged one and a scalar', () => {
      const n = 1 << 20;
      const a = new Float32Array(n);
      for (let i = 0; i < n; i++) a[i] = Math.fround(Math.sin(i * 1.7) * 0.01 + 0.003);
      const b = Float32Array.from({ length: 3001 }, (_, i) => Math.fround(i / 1e5 - 0.015));
      let exact = 0;
      for (const v of a) exact += v * v;
      for (const v of b) exact += v * v;
      exact += 0.25 * 0.25;
      const ts = [tf.tensor(a, [1024, 1024]), tf.tensor(b), tf.scalar(0.25)];
      const before = tf.memory().numTensors;
      const norm = globalNorm(ts);
      expect(tf.memory().numTensors).toBe(before);
      // Float64 sums of exact squares, in the same order as the reference: equal.
      expect(norm).toBe(Math.sqrt(exact));
      expect(globalNorm([])).toBe(0);
      for (const t of ts) t.dispose();
    });

    it('leaks no tensors across steps', () => {
      const c = vectors.cases[1]!;
      const params = makeParams(c);
      const moments = AdamWMoments.create(params);
      const grads = makeGrads(c, 0);
      adamwStep(params, grads, moments, optionsOf(c)); // warm-up: kernels may cache on first use
      const n = tf.memory().numTensors;
      for (let i = 0; i < 3; i++) adamwStep(params, grads, moments, optionsOf(c));
      adamwStep(params, grads, moments, { ...optionsOf(c), gradClipNorm: 0, weightDecay: 0 });
      expect(tf.memory().numTensors).toBe(n);
      disposeAll(grads);
      moments.dispose();
      disposeAll(params);
    });

    it('export -> import continues with the identical next step', () => {
      const c = vectors.cases[0]!;
      const params = makeParams(c);
      const moments = AdamWMoments.create(params);
      for (const s of [0, 1]) {
        const g = makeGrads(c, s);
        adamwStep(params, g, moments, optionsOf(c));
        disposeAll(g);
      }
      const copy = new Map([...params].map(([k, p]) => [k, tf.variable(p.clone())]));
      const restored = AdamWMoments.import(copy, moments.export());
      expect(restored.step).toBe(2);
      const g = makeGrads(c, 2);
      adamwStep(params, g, moments, optionsOf(c));
      adamwStep(copy, g, restored, optionsOf(c));
      for (const [k, p] of params) expect(copy.get(k)!.dataSync()).toEqual(p.dataSync());
      expect(maxUlps(params.get('head.scale')!.dataSync() as Float32Array, c.steps[2]!.params_after['head.scale']!)).toBeLessThanOrEqual(ULPS);
      disposeAll(g);
      moments.dispose();
      restored.dispose();
      disposeAll(params);
      disposeAll(copy);
    });

    it('refuses mismatched gradients and moments with codes', () => {
      const c = vectors.cases[0]!;
      const params = makeParams(c);
      const moments = AdamWMoments.create(params);
      const grads = makeGrads(c, 0);
      const missing = new Map([...grads].filter(([k]) => k !== 'layer.bias'));
      expect(() => adamwStep(params, missing, moments, DEFAULT_ADAMW)).toThrow(
        expect.objectContaining({ code: 'grad_mismatch' }),
      );
      const wrong = new Map(grads);
      const t = tf.zeros([4, 3]);
      wrong.set('layer.weight', t);
      expect(() => adamwStep(params, wrong, moments, DEFAULT_ADAMW)).toThrow(/shape \[4,3\]; the parameter has \[3,4\]/);
      const state = moments.export();
      delete state.tensors['layer.bias.exp_avg_sq'];
      expect(() => AdamWMoments.import(params, state)).toThrow(expect.objectContaining({ code: 'bad_moments' }));
      t.dispose();
      disposeAll(grads);
      moments.dispose();
      disposeAll(params);
    });
  });
});

/**
 * The fused update (one SIMD loop over the wasm heap, the same loop over copies on tfjs-node, a
 * JavaScript loop on the cpu backend and for the last n % 4 elements on wasm) against the TF.js-op
 * version that tfjs-node-gpu runs: the same float32 operations in the same order, so parameters
 * and moments must be equal bit for bit. Sizes with every remainder mod 4, both of torch's lerp
 * branches, weight decay, clipping and a divisor.
 */
describe('fused AdamW equals the TF.js ops bit for bit', () => {
  // l (17,030 values) is a tensor of more than one staging page on tfjs-node.
  const shapes: Record<string, number[]> = { w: [7, 13], b: [256], c: [3, 4, 5], s: [1], r: [2, 3], l: [130, 131] };
  function values(seed: number, n: number, scale: number): Float32Array {
    let x = seed;
    return Float32Array.from({ length: n }, () => {
      x = (x * 1103515245 + 12345) % 2 ** 31;
      return Math.fround(((x / 2 ** 31) * 2 - 1) * scale);
    });
  }
  function run(step: typeof adamwStep, opts: AdamWOptions, divisor: number) {
    const params = new Map(Object.entries(shapes).map(([k, sh], i) => [k, tf.variable(tf.tensor(values(i + 1, sh.reduce((a, b) => a * b, 1), 1), sh))]));
    const moments = AdamWMoments.create(params);
    const norms: number[] = [];
    for (let s = 0; s < 3; s++) {
      const grads = new Map(Object.entries(shapes).map(([k, sh], i) => [k, tf.tensor(values(100 * s + i + 7, sh.reduce((a, b) => a * b, 1), 3), sh)]));
      norms.push(step(params, grads, moments, opts, divisor).gradNorm);
      disposeAll(grads);
    }
    const out = { params: Object.fromEntries([...params].map(([k, p]) => [k, p.dataSync() as Float32Array])), moments: moments.export(), norms };
    moments.dispose();
    disposeAll(params);
    return out;
  }
  const cases: [string, AdamWOptions, number][] = [
    ['beta1 0.9 (lerp weight < 0.5), weight decay, clipping, divisor 3', { ...DEFAULT_ADAMW, learningRate: 1e-2, weightDecay: 0.1, gradClipNorm: 1 }, 3],
    ['beta1 0.3 (lerp weight >= 0.5), no decay, no clipping, divisor 1', { ...DEFAULT_ADAMW, learningRate: 3e-3, beta1: 0.3, beta2: 0.99, eps: 1e-8 }, 1],
    // A power-of-two divisor takes sumOfSquares' path without a division per value.
    ['beta1 0.9, clipping, divisor 8', { ...DEFAULT_ADAMW, learningRate: 1e-2, gradClipNorm: 1 }, 8],
  ];
  for (const backend of [...TEST_BACKENDS, 'cpu'] as const) {
    for (const [name, opts, divisor] of cases) {
      it(`${backend}: ${name}`, async () => {
        await useBackend(backend);
        try {
          const fused = run(adamwStep, opts, divisor);
          const ops = run(adamwStepOps, opts, divisor);
          for (const k of Object.keys(shapes)) expect(Buffer.from(fused.params[k]!.buffer)).toEqual(Buffer.from(ops.params[k]!.buffer));
          for (const k of Object.keys(ops.moments.tensors)) {
            expect(Buffer.from(fused.moments.tensors[k]!.data.buffer)).toEqual(Buffer.from(ops.moments.tensors[k]!.data.buffer));
          }
          expect(fused.norms).toEqual(ops.norms);
          expect(fused.params.w).not.toEqual(values(1, 91, 1)); // the step moved the parameters
        } finally {
          await useBackend(TEST_BACKENDS[0]!);
        }
      });
    }
  }
});

describe('an update that would overflow is refused on every backend, nothing changed', () => {
  // w has 91 values: the SIMD loops take 88 and (wasm, cpu) a JavaScript loop the last 3, so
  // the overflow is put in each part; g^2 = 1e60 overflows float32 in v.
  for (const backend of [...TEST_BACKENDS, 'cpu'] as const) {
    for (const at of [5, 90]) {
      it(`${backend}: a gradient of 1e30 at w[${at}]`, async () => {
        await useBackend(backend);
        try {
          const params = new Map([['w', tf.variable(tf.fill([7, 13], 0.5))], ['b', tf.variable(tf.fill([3], 0.25))]]);
          const moments = AdamWMoments.create(params);
          const g = new Float32Array(91).fill(0.1);
          g[at] = 1e30;
          const grads = new Map([['w', tf.tensor(g, [7, 13])], ['b', tf.fill([3], 0.1)]]);
          expect(() => adamwStep(params, grads, moments, { ...DEFAULT_ADAMW, beta2: 0.5 })).toThrow(
            new RegExp(`^optim_step would make w \\(exp_avg_sq\\)\\[${at}\\] Infinity; nothing was changed`),
          );
          let err: unknown = null;
          try {
            adamwStep(params, grads, moments, DEFAULT_ADAMW);
          } catch (e) {
            err = e;
          }
          expect(err).toBeInstanceOf(OptimError);
          expect((err as OptimError).code).toBe('non_finite_update');
          expect(params.get('w')!.dataSync().every((x) => x === 0.5)).toBe(true);
          expect(moments.step).toBe(0);
          expect(moments.export().tensors['w.exp_avg_sq']!.data.every((x) => x === 0)).toBe(true);
          disposeAll(grads);
          moments.dispose();
          disposeAll(params);
        } finally {
          await useBackend(TEST_BACKENDS[0]!);
        }
      });
    }
  }
});

describe('AdamW options', () => {
  it('defaults are PROTOCOL.md section 3', () => {
    expect(DEFAULT_ADAMW).toEqual({ learningRate: 1e-4, beta1: 0.9, beta2: 0.95, eps: 1e-12, weightDecay: 0, gradClipNorm: 0 });
    expect(resolveAdamWOptions({ beta2: 0.999, eps: undefined })).toEqual({ ...DEFAULT_ADAMW, beta2: 0.999 });
  });

  const bad: [Partial<AdamWOptions>, RegExp][] = [
    [{ learningRate: -1e-3 }, /learning_rate is -0.001; it must be a finite number >= 0/],
    [{ eps: 0 }, /eps is 0; it must be a finite number > 0/],
    [{ eps: 1e-50 }, /eps is 1e-50; it must be a finite number > 0 \(at least 1.4e-45/],
    [{ learningRate: Infinity }, /learning_rate is Infinity/],
    [{ beta1: 1 }, /beta1 is 1; it must be in \[0, 1\)/],
    [{ beta2: -0.1 }, /beta2 is -0.1/],
    [{ eps: -1e-8 }, /eps is -1e-8/],
    [{ weightDecay: NaN }, /weight_decay is NaN/],
    [{ gradClipNorm: -1 }, /grad_clip_norm is -1/],
  ];
  for (const [partial, msg] of bad) {
    it(`refuses ${JSON.stringify(partial)}`, () => {
      let err: unknown;
      try {
        resolveAdamWOptions(partial);
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(OptimError);
      expect((err as OptimError).code).toBe('bad_option');
      expect((err as OptimError).message).toMatch(msg);
    });
  }
});
