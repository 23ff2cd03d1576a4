/**
 * Real-time chunking in the kernels (kernels/rtc.ts): the guidance's vector-Jacobian product
 * against finite differences through the model, guided sampling with zero weights equal to plain
 * sampling bit for bit, guidance that pulls the chunk onto the previous one, the prefix mode's
 * held actions, graphs equal to eager, per-action flow times, and training-time RTC's loss.
 * Both model families.
 */
import * as tf from '@tensorflow/tfjs';
import { beforeAll, describe, expect, it } from 'vitest';
import { makeConfig } from '../kernels/small/config.ts';
import { passBound, sampleBound } from './helpers/float32.ts';
import { fakeBatch } from '../kernels/small/batch.ts';
import { BaseWeights, TrainingState, TrainerError } from '../kernels/trainer.ts';
import { Rng } from '../kernels/rng.ts';
import { sampleGraphStats } from '../kernels/sample-graph.ts';
import { guidanceGradient, guidanceWeight, rtcWeights, shiftChunk, type ChunkPrefix } from '../kernels/rtc.ts';
import { REAL_PI_TINY_PI05 } from '../kernels/pi/config.ts';
import { fakeRealPiBatch } from '../kernels/pi/fake.ts';
import { realPiPolicy } from '../kernels/pi/policy.ts';
import { NATIVE_PRESENT, useBestBackend, withGraphs } from './helpers/tf.ts';

/** max(1, max |a|): the scale the float32 bounds are relative to. */
function scale(a: Float32Array): number {
  let m = 1;
  for (const x of a) m = Math.max(m, Math.abs(x));
  return m;
}

/**
 * Euler steps of the sampling checks (10 is the models' default). Guided sampling runs a VJP at
 * every step and a graph unrolls them all, so time goes with the count; what is checked does not:
 * zero weights = plain holds at any count, the graph bounds are per pass (sum |dt| = 1), and at 4
 * steps the guided chunk's gap to the old one is 0.04 (flow05-tiny) and 0.008 (flow0-tiny) of the
 * plain chunk's (0.05 and 0.016 at 10) against the 0.3 asserted.
 */
const STEPS = 4;

/**
 * Guided sampling runs a VJP through the model at each step: its backward reductions (a weight's
 * gradient over batch x tokens, an activation's over mlpDim) are at most 2 mlpDim terms here.
 */
const guidedBound = (c: { mlpDim: number }) => sampleBound(2 * c.mlpDim);

function maxAbs(a: Float32Array, b: Float32Array, from = 0, to = a.length): number {
  let m = 0;
  for (let i = from; i < to; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
}

describe('RTC weights and guidance weight (Black et al. 2025, eq. 5 and Algorithm 1)', () => {
  it('weights: 1 over the delay, the exponential (or linear) decay over the overlap, 0 after', () => {
    // horizon 8, d = 2, overlap 6: c_i = (6 - i) / 5 for i = 2..5.
    const c = [0.8, 0.6, 0.4, 0.2];
    const exp = c.map((x) => (x * (Math.exp(x) - 1)) / (Math.E - 1));
    expect(Array.from(rtcWeights(8, 2, 6))).toEqual([1, 1, ...exp, 0, 0].map(Math.fround));
    expect(Array.from(rtcWeights(8, 2, 6, 'linear'))).toEqual([1, 1, ...c, 0, 0].map(Math.fround));
    expect(exp.map((x) => +x.toFixed(4))).toEqual([0.5706, 0.2871, 0.1145, 0.0258]);
    // The delay is clamped to the overlap, the overlap to the horizon.
    expect(Array.from(rtcWeights(4, 9, 3))).toEqual([1, 1, 1, 0]);
    expect(Array.from(rtcWeights(4, 0, 9, 'linear'))).toEqual([0.8, 0.6, 0.4, 0.2].map(Math.fround));
    expect(() => rtcWeights(8, -1, 4)).toThrow('delay is -1; it must be an integer >= 0');
  });

  it('c(t) = min(β, ((1 - t)^2 + t^2) / (t (1 - t))): β at the ends, 2 at t = 0.5', () => {
    expect(guidanceWeight(1, 5)).toBe(5);
    expect(guidanceWeight(0, 5)).toBe(5);
    expect(guidanceWeight(0.5, 5)).toBe(2);
    expect(guidanceWeight(0.3, 5)).toBeCloseTo((0.49 + 0.09) / 0.21, 12);
    expect(guidanceWeight(0.9, 5)).toBe(5); // 9.1 capped
    expect(guidanceWeight(0.9, 100)).toBeCloseTo(0.82 / 0.09, 12);
  });

  it('shiftChunk lines the old chunk up with the new one', () => {
    const prev = Float32Array.from({ length: 8 }, (_, i) => i); // [4, 2]
    expect(Array.from(shiftChunk(prev, 4, 1))).toEqual([2, 3, 4, 5, 6, 7, 0, 0]);
    expect(Array.from(shiftChunk(prev, 4, 4))).toEqual(new Array(8).fill(0));
  });
});

describe('RTC sampling', () => {
  beforeAll(() => useBestBackend());

  it.each(['flow05-tiny', 'flow0-tiny'])('%s: the guidance gradient (a VJP through the model) matches finite differences', (preset) => {
    const c = makeConfig(preset);
    const base = BaseWeights.create(c, 3);
    const batch = fakeBatch(c, 1, 2);
    const shape = [1, c.horizon, c.actionDim];
    const n = c.horizon * c.actionDim;
    const rng = new Rng(4);
    const t = 0.6;
    const time = Float32Array.of(t);
    const velocityAt = (x: tf.Tensor) => base.policy.velocity(base.view(), batch, x, time);
    const x = tf.tensor(rng.normals(n), shape);
    const target = tf.tensor(rng.normals(n), shape);
    const w = rtcWeights(c.horizon, 3, 10);
    const weights = tf.tensor(Float32Array.from({ length: n }, (_, k) => w[Math.floor(k / c.actionDim)]!), shape);
    const L = (xx: tf.Tensor) => tf.tidy(() => {
      const err = tf.sub(target, tf.sub(xx, tf.mul(velocityAt(xx), t)));
      return (tf.sum(tf.mul(weights, tf.square(err))).dataSync()[0]! * 0.5);
    });
    const { velocity, grad } = guidanceGradient(velocityAt, x, t, target, weights);
    expect(maxAbs(velocity.dataSync() as Float32Array, velocityAt(x).dataSync() as Float32Array)).toBe(0);
    const g = grad.dataSync() as Float32Array;
    // Central differences along random directions: <∇L, u> = (L(x + h u) - L(x - h u)) / 2h.
    const h = 1e-2;
    for (let k = 0; k < 3; k++) {
      const u = tf.tensor(rng.normals(n), shape);
      const fd = (L(tf.add(x, tf.mul(u, h))) - L(tf.sub(x, tf.mul(u, h)))) / (2 * h);
      const ud = u.dataSync();
      let dot = 0;
      for (let i = 0; i < n; i++) dot += g[i]! * ud[i]!;
      expect(Math.abs(dot - fd)).toBeLessThan(2e-2 * Math.abs(fd) + 1e-3);
    }
    tf.dispose([x, target, weights, velocity, grad]);
    base.dispose();
  });

  it.each(['flow05-tiny', 'flow0-tiny'])('%s: guided with zero weights is plain sampling bit for bit; with weights it follows the old chunk; graphs = eager', (preset) => {
    const c = makeConfig(preset);
    const base = BaseWeights.create(c, 3);
    const s = new TrainingState(base, { finetune: 'full', seed: 1 });
    s.forwardBackward(fakeBatch(c, 4, 9));
    s.optimStep({ learningRate: 1e-2 });
    const batch = fakeBatch(c, 2, 2);
    const n = 2 * c.horizon * c.actionDim;
    const A = c.actionDim;
    const noise = new Rng(7).normals(n);
    const before = tf.memory().numTensors;
    const plain = withGraphs(false, () => s.sample(batch, { noise, numSteps: STEPS }));
    const zero: ChunkPrefix = { mode: 'guided', actions: new Rng(9).normals(n), weights: new Float32Array(n) };
    const guidedZero = withGraphs(false, () => s.sample(batch, { noise, chunk: zero, numSteps: STEPS }));
    expect(guidedZero.every((x, i) => Object.is(x, plain[i]))).toBe(true); // bit for bit, -0 included
    expect(tf.memory().numTensors).toBe(before); // nothing kept from the backward passes

    // The old chunk (another sample) 3 actions on, d = 4: the guided chunk's first 4 actions land on it.
    const prev = withGraphs(false, () => s.sample(batch, { noise: new Rng(8).normals(n), numSteps: STEPS }));
    const Y = new Float32Array(n);
    for (let b = 0; b < 2; b++) Y.set(shiftChunk(prev.subarray(b * n / 2, (b + 1) * n / 2), c.horizon, 3), b * n / 2);
    const w = rtcWeights(c.horizon, 4, c.horizon - 3);
    const W = Float32Array.from({ length: n }, (_, k) => w[Math.floor(k / A) % c.horizon]!);
    const chunk: ChunkPrefix = { mode: 'guided', actions: Y, weights: W };
    const guided = withGraphs(false, () => s.sample(batch, { noise, chunk, numSteps: STEPS }));
    const gap = (a: Float32Array) => {
      let e = 0;
      for (let b = 0; b < 2; b++) for (let k = 0; k < 4 * A; k++) e += (a[b * n / 2 + k]! - Y[b * n / 2 + k]!) ** 2;
      return Math.sqrt(e / (8 * A));
    };
    expect(gap(guided)).toBeLessThan(0.3 * gap(plain));
    if (NATIVE_PRESENT) {
      const graph = withGraphs(true, () => s.sample(batch, { noise, chunk, numSteps: STEPS }));
      expect(maxAbs(graph, guided)).toBeLessThan(guidedBound(c) * scale(guided));
    }
    s.dispose();
    base.dispose();
  });

  it('guided: β is a graph input: a sweep of β traces one graph, and each β gives the eager chunk', () => {
    if (!NATIVE_PRESENT) return;
    const c = makeConfig('flow05-tiny');
    const base = BaseWeights.create(c, 3);
    const s = new TrainingState(base, { finetune: 'full', seed: 1 });
    const batch = fakeBatch(c, 2, 2);
    const n = 2 * c.horizon * c.actionDim;
    const noise = new Rng(7).normals(n);
    const Y = new Rng(9).normals(n);
    const w = rtcWeights(c.horizon, 4, c.horizon - 3);
    const W = Float32Array.from({ length: n }, (_, k) => w[Math.floor(k / c.actionDim) % c.horizon]!);
    const at = (beta: number, graphs: boolean) => withGraphs(graphs, () => s.sample(batch, { noise, chunk: { mode: 'guided', actions: Y, weights: W, maxGuidance: beta }, numSteps: STEPS }));
    at(5, true); // the layout's one trace
    const traces = sampleGraphStats().traces;
    const outs: Float32Array[] = [];
    for (const beta of [3.000001, 3.000002, 0, 1.5, 20]) {
      const graph = at(beta, true);
      const eager = at(beta, false);
      expect(maxAbs(graph, eager)).toBeLessThan(guidedBound(c) * scale(eager));
      outs.push(graph);
    }
    expect(sampleGraphStats().traces).toBe(traces);
    expect(maxAbs(outs[2]!, outs[4]!)).toBeGreaterThan(1e-3); // β reaches the graph (not a constant)
    // A β per datum (robots of different rtc_max_guidance in one batch): each row is its β's row
    // of the batch, bit for bit (min and the product are per element), in the same graph.
    const perDatum = (graphs: boolean) => withGraphs(graphs, () => s.sample(batch, { noise, chunk: { mode: 'guided', actions: Y, weights: W, maxGuidance: [0, 20] }, numSteps: STEPS }));
    for (const graphs of [false, true]) {
      const mixed = perDatum(graphs);
      expect(Array.from(mixed.subarray(0, n / 2))).toEqual(Array.from(at(0, graphs).subarray(0, n / 2)));
      expect(Array.from(mixed.subarray(n / 2))).toEqual(Array.from(at(20, graphs).subarray(n / 2)));
    }
    expect(sampleGraphStats().traces).toBe(traces);
    s.dispose();
    base.dispose();
  });

  it.each(['flow05-tiny', 'flow0-tiny'])('%s: prefix mode holds each datum\'s first d actions and samples the rest; d = 0 is plain', (preset) => {
    const c = makeConfig(preset);
    const base = BaseWeights.create(c, 3);
    const s = new TrainingState(base, { finetune: 'full', seed: 1, rtcMaxDelay: 6 });
    s.forwardBackward(fakeBatch(c, 4, 9));
    s.optimStep({ learningRate: 1e-2 });
    const batch = fakeBatch(c, 2, 2);
    const per = c.horizon * c.actionDim;
    const noise = new Rng(7).normals(2 * per);
    const Y = new Rng(3).normals(2 * per);
    const delays = [4, 1];
    const W = Float32Array.from({ length: 2 * per }, (_, k) => (Math.floor((k % per) / c.actionDim) < delays[Math.floor(k / per)]! ? 1 : 0));
    const out = withGraphs(false, () => s.sample(batch, { noise, chunk: { mode: 'prefix', actions: Y, weights: W }, numSteps: STEPS }));
    expect(Array.from(out.subarray(0, 4 * c.actionDim))).toEqual(Array.from(Y.subarray(0, 4 * c.actionDim)));
    expect(Array.from(out.subarray(per, per + c.actionDim))).toEqual(Array.from(Y.subarray(per, per + c.actionDim)));
    expect(maxAbs(out, Y, 4 * c.actionDim, per)).toBeGreaterThan(0.1);
    // With no delay every action is at the step's time: the plain chunk, to float32 rounding of a
    // time embedding per action instead of per datum.
    const plain = withGraphs(false, () => s.sample(batch, { noise, numSteps: STEPS }));
    const none = withGraphs(false, () => s.sample(batch, { noise, chunk: { mode: 'prefix', actions: Y, weights: new Float32Array(2 * per) }, numSteps: STEPS }));
    // The time MLP on [b * ah] rows instead of [b]: other matmul shapes, so other summation orders.
    const bound = sampleBound(c.mlpDim);
    expect(maxAbs(none, plain)).toBeLessThan(bound * scale(plain));
    if (NATIVE_PRESENT) {
      const graph = withGraphs(true, () => s.sample(batch, { noise, chunk: { mode: 'prefix', actions: Y, weights: W }, numSteps: STEPS }));
      expect(maxAbs(graph, out)).toBeLessThan(bound * scale(out));
      // Another delay runs the same graph: the held actions are an input, not baked in.
      const traces = sampleGraphStats().traces;
      const W2 = Float32Array.from({ length: 2 * per }, (_, k) => (Math.floor((k % per) / c.actionDim) < 2 ? 1 : 0));
      const other = withGraphs(true, () => s.sample(batch, { noise, chunk: { mode: 'prefix', actions: Y, weights: W2 }, numSteps: STEPS }));
      expect(sampleGraphStats().traces).toBe(traces);
      const otherEager = withGraphs(false, () => s.sample(batch, { noise, chunk: { mode: 'prefix', actions: Y, weights: W2 }, numSteps: STEPS }));
      expect(maxAbs(other, otherEager)).toBeLessThan(bound * scale(otherEager));
    }
    s.dispose();
    base.dispose();
  });

  it('real pi0.5 (tiny): zero weights = plain bit for bit, and a time per action = a time per datum', () => {
    const config = REAL_PI_TINY_PI05;
    const policy = realPiPolicy(config);
    const base = BaseWeights.create(policy);
    const s = new TrainingState(base, { finetune: 'full', seed: 3 });
    const batch = fakeRealPiBatch(config, 12);
    const n = batch.size * config.actionHorizon * config.actionDim;
    const noise = new Rng(5).normals(n);
    const plain = withGraphs(false, () => s.sample(batch, { noise, numSteps: 3 }));
    const zero = withGraphs(false, () => s.sample(batch, { noise, numSteps: 3, chunk: { mode: 'guided', actions: new Rng(6).normals(n), weights: new Float32Array(n) } }));
    expect(zero.every((x, i) => Object.is(x, plain[i]))).toBe(true);
    const x = tf.tensor(new Rng(2).normals(n), [batch.size, config.actionHorizon, config.actionDim]);
    const time = Float32Array.from({ length: batch.size }, (_, i) => 0.3 + 0.2 * i);
    const perAction = Float32Array.from({ length: batch.size * config.actionHorizon }, (_, k) => time[Math.floor(k / config.actionHorizon)]!);
    const a = policy.velocity(base.view(), batch, x, time).dataSync() as Float32Array;
    const b = policy.velocity(base.view(), batch, x, perAction).dataSync() as Float32Array;
    // One velocity pass; its longest reductions: attention over the sequence (3 cameras' patches, the
    // prompt, the chunk) or an MLP.
    const seq = 3 * (config.vision.imageSize / config.vision.patchSize) ** 2 + config.maxTokenLen + config.actionHorizon + 1;
    expect(maxAbs(a, b)).toBeLessThan(passBound(Math.max(seq, config.vlm.mlpDim, config.expert.mlpDim)) * scale(a));
    x.dispose();
    s.dispose();
    base.dispose();
  });

  it('refuses a chunk that does not fit, naming the field', () => {
    const c = makeConfig('flow0-tiny');
    const base = BaseWeights.create(c, 3);
    const s = new TrainingState(base, { finetune: 'full', seed: 1 });
    const batch = fakeBatch(c, 1, 2);
    const n = c.horizon * c.actionDim;
    const ok = new Float32Array(n);
    for (const [chunk, text] of [
      [{ mode: 'guided', actions: new Float32Array(3), weights: ok }, `rtc actions have 3 values; a batch of 1 needs [1, ${c.horizon}, ${c.actionDim}] = ${n}`],
      [{ mode: 'guided', actions: ok, weights: new Float32Array(n).fill(2) }, 'rtc weights[0] is 2; weights lie in [0, 1]'],
      [{ mode: 'prefix', actions: ok, weights: new Float32Array(n).fill(0.5) }, 'rtc weights[0] is 0.5; prefix weights are 1 on every dim of a held action and 0 elsewhere'],
      [{ mode: 'prefix', actions: ok, weights: Float32Array.from({ length: n }, (_, k) => (k === 1 ? 1 : 0)) }, 'rtc weights[1] is 1; prefix weights are 1 on every dim of a held action and 0 elsewhere'],
      [{ mode: 'inpaint', actions: ok, weights: ok }, `rtc mode is "inpaint"; expected 'guided' or 'prefix'`],
      [{ mode: 'guided', actions: ok, weights: ok, maxGuidance: [5, 5] }, 'rtc max_guidance has 2 values; a batch of 1 needs one, or one per datum'],
      [{ mode: 'guided', actions: ok, weights: ok, maxGuidance: [-1] }, 'rtc max_guidance[0] is -1; it must be a finite number >= 0'],
    ] as [ChunkPrefix, string][]) {
      expect(() => s.sample(batch, { chunk })).toThrow(new TrainerError('bad_option', text));
    }
    s.dispose();
    base.dispose();
  });
});

describe('training-time RTC (rtcMaxDelay, arXiv 2512.05964)', () => {
  beforeAll(() => useBestBackend());

  it('gives the first d actions clean at time 0 and counts the loss on the rest only', () => {
    const c = makeConfig('flow0-tiny');
    const { horizon: H, actionDim: A } = c;
    const base = BaseWeights.create(c, 3);
    const batch = fakeBatch(c, 3, 9);
    const B = 3;
    const rng = new Rng(5);
    const noise = rng.normals(B * H * A);
    const time = Float32Array.of(0.9, 0.5, 0.2);
    // Off: exactly the loss of a state without the option.
    const loss = (opts: { rtcMaxDelay?: number }, n: Float32Array) => {
      const st = new TrainingState(base, { finetune: 'full', seed: 1, ...opts });
      const out = st.forwardBackward(batch, { noise: n, time }).lossPerDatum;
      st.dispose();
      return Array.from(out);
    };
    expect(loss({ rtcMaxDelay: 0 }, noise)).toEqual(loss({}, noise));
    // On: the delays come from the state's generator (noise and time given: it draws only them).
    const max = 5;
    const delays = Array.from(new Rng(1 + 0x5eed1).uniforms(B), (u) => Math.min(max, Math.floor(u * (max + 1))));
    expect(delays.some((d) => d > 0)).toBe(true);
    const withRtc = loss({ rtcMaxDelay: max }, noise);
    expect(withRtc).not.toEqual(loss({}, noise));
    // The noise of the prefix never matters (x_t there is the clean action, and it is not scored)...
    const other = Float32Array.from(noise);
    delays.forEach((d, i) => other.fill(7, i * H * A, (i * H + d) * A));
    expect(loss({ rtcMaxDelay: max }, other)).toEqual(withRtc);
    // ...the noise after it does, and only for its own datum.
    const i = delays.findIndex((d) => d > 0);
    const after = Float32Array.from(noise);
    after[(i * H + delays[i]!) * A] += 1;
    const changed = loss({ rtcMaxDelay: max }, after);
    expect(changed[i]).not.toBe(withRtc[i]);
    expect(changed.filter((_, k) => k !== i)).toEqual(withRtc.filter((_, k) => k !== i));
    // And it is the masked mean of (v - u)^2 with per-action times, 0 on the prefix.
    const perAction = Float32Array.from({ length: B * H }, (_, k) => (k % H < delays[Math.floor(k / H)]! ? 0 : time[Math.floor(k / H)]!));
    const xT = Float32Array.from(noise, (e, k) => {
      const t = perAction[Math.floor(k / A)]!;
      return t * e + (1 - t) * batch.actions[k]!;
    });
    const v = tf.tidy(() => base.policy.velocity(base.view(), batch, tf.tensor(xT, [B, H, A]), perAction).dataSync() as Float32Array);
    for (let b = 0; b < B; b++) {
      let num = 0;
      let den = 0;
      for (let k = b * H * A; k < (b + 1) * H * A; k++) {
        const m = Math.floor(k / A) % H < delays[b]! ? 0 : batch.actionMask[k]!;
        num += m * (v[k]! - (noise[k]! - batch.actions[k]!)) ** 2;
        den += m;
      }
      expect(withRtc[b]).toBeCloseTo(num / Math.max(den, 1), 4);
    }
    const s = new TrainingState(base, { finetune: 'full', seed: 1, rtcMaxDelay: max });
    expect(s.exportWeights().config.rtc_max_delay).toBe(max);
    expect(() => new TrainingState(base, { rtcMaxDelay: H })).toThrow(`rtc_max_delay is ${H}; it must be an integer in [0, ${H - 1}] (the horizon is ${H})`);
    s.dispose();
    base.dispose();
  });
});
