import * as tf from '@tensorflow/tfjs';
import { describe, expect, it } from 'vitest';
import { forEachBackend } from './helpers/tf.ts';
import { makeConfig } from '../kernels/small/config.ts';
import { fakeBatch, sliceBatch } from '../kernels/small/batch.ts';
import { mseVelocityGrad, drawNoiseTime } from '../kernels/flow.ts';
import { BaseWeights, TrainerError, TrainingState } from '../kernels/trainer.ts';
import { Rng } from '../kernels/rng.ts';


const micro = (preset: string) =>
  makeConfig(preset, { imageSize: 32, patch: 16, slots: 2, width: 32, depth: 2, heads: 2, headDim: 16, mlpDim: 64, maxTokenLen: 8, stateDim: 6, actionDim: 4, horizon: 5 });

function maxAbsDiff(a: Float32Array, b: Float32Array): number {
  expect(a.length).toBe(b.length);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
}

function weightsOf(s: TrainingState): Map<string, Float32Array> {
  return new Map(Object.entries(s.trainableTensors()).map(([k, v]) => [k, v.data]));
}

/** fn() with VELA_GRAPHS set to `v` (kernels/sample-graph.ts reads it at each call). */
function withGraphs<T>(v: string, fn: () => T): T {
  const before = process.env.VELA_GRAPHS;
  process.env.VELA_GRAPHS = v;
  try {
    return fn();
  } finally {
    if (before === undefined) delete process.env.VELA_GRAPHS;
    else process.env.VELA_GRAPHS = before;
  }
}

function batchOf(preset: string, size: number, seed: number) {
  const c = micro(preset);
  const b = fakeBatch(c, size, seed, { actionShape: [4, 3] });
  (b.weight as Float32Array).set([1, 2, 0.5, 1, 3, 1].slice(0, size));
  return { c, b };
}

forEachBackend('kernels: training state', () => {
  describe.each(['flow0-tiny', 'flow05-tiny'])('training state (%s micro)', (preset) => {
    it('forward(keep) + backward(2 w (v - u) mask / n) gives the G and D of forward_backward', () => {
      const { c, b } = batchOf(preset, 3, 1);
      const base = BaseWeights.create(c, 7);
      const s1 = new TrainingState(base, { finetune: 'full', seed: 3 });
      const s2 = new TrainingState(base, { finetune: 'full', seed: 3 });
      const r1 = s1.forwardBackward(b);
      const f = s2.forward(b, { keep: true });
      s2.backward(mseVelocityGrad(f.velocity, f.target, b.actionMask, b.weight));
      const g1 = s1.accumulatedGradients();
      const g2 = s2.accumulatedGradients();
      expect(g2.denominator).toBe(3.5);
      expect(g1.denominator).toBe(3.5);
      expect([...g2.grads.keys()].sort()).toEqual([...g1.grads.keys()].sort());
      for (const [name, g] of g1.grads) {
        let scale = 0;
        for (const x of g) scale = Math.max(scale, Math.abs(x));
        expect(maxAbsDiff(g, g2.grads.get(name)!), name).toBeLessThanOrEqual(1e-5 + 1e-4 * scale);
      }
      // The loss reported is sum w_i loss_i / sum w_i with loss_i the masked mean (computed here from forward's outputs).
      let num = 0;
      const per = 5 * 4;
      for (let i = 0; i < 3; i++) {
        let sq = 0;
        let n = 0;
        for (let j = 0; j < per; j++) {
          const k = i * per + j;
          sq += b.actionMask[k]! * (f.velocity[k]! - f.target[k]!) ** 2;
          n += b.actionMask[k]!;
        }
        expect(n).toBe(12);
        expect(r1.lossPerDatum[i]).toBeCloseTo(sq / n, 5);
        num += b.weight[i]! * (sq / n);
      }
      expect(r1.loss).toBeCloseTo(num / 3.5, 5);
      expect(() => s2.backward(new Float32Array(60))).toThrow(TrainerError); // the capture was used
      s1.dispose();
      s2.dispose();
      base.dispose();
    });

    it('two half-batches + optim_step equal one whole batch', () => {
      const { c, b } = batchOf(preset, 4, 2);
      const base = BaseWeights.create(c, 8);
      const { noise, time } = drawNoiseTime(new Rng(5), 4, c.horizon, c.actionDim);
      const per = c.horizon * c.actionDim;
      const whole = new TrainingState(base, { finetune: 'lora', rank: 4, alpha: 8, seed: 1 });
      const halves = new TrainingState(base, { finetune: 'lora', rank: 4, alpha: 8, seed: 1 });
      for (let step = 0; step < 2; step++) {
        whole.forwardBackward(b, { noise, time });
        halves.forwardBackward(sliceBatch(b, 0, 2), { noise: noise.slice(0, 2 * per), time: time.slice(0, 2) });
        halves.forwardBackward(sliceBatch(b, 2, 4), { noise: noise.slice(2 * per), time: time.slice(2) });
        expect(halves.pendingGradients).toBe(2);
        const o1 = whole.optimStep({ learningRate: 1e-2 });
        const o2 = halves.optimStep({ learningRate: 1e-2 });
        expect(o2.gradNorm).toBeCloseTo(o1.gradNorm, 4);
      }
      const w1 = weightsOf(whole);
      const w2 = weightsOf(halves);
      for (const [name, w] of w1) expect(maxAbsDiff(w, w2.get(name)!), name).toBeLessThan(2e-5);
      whole.dispose();
      halves.dispose();
      base.dispose();
    });
  });

  describe('LoRA on a shared base', () => {
    it('a fresh adapter leaves outputs bit-identical; training changes only adapter tensors; adapters are independent', () => {
      const { c, b } = batchOf('flow05-tiny', 2, 3);
      const base = BaseWeights.create(c, 9);
      const baseBefore = base.exportWeights();
      const plain = new TrainingState(base, { finetune: 'full', seed: 4 });
      const a1 = new TrainingState(base, { finetune: 'lora', rank: 4, targets: ['all'], seed: 4 });
      const a2 = new TrainingState(base, { finetune: 'lora', rank: 2, targets: ['action_expert'], seed: 5 });
      const ref = plain.sample(b, { seed: 1, numSteps: 3 });
      expect(a1.sample(b, { seed: 1, numSteps: 3 })).toEqual(ref);
      expect(a2.sample(b, { seed: 1, numSteps: 3 })).toEqual(ref);
      expect(a1.forward(b).velocity).toEqual(plain.forward(b).velocity); // same seed, same noise and time
      const before1 = weightsOf(a1);
      for (let i = 0; i < 3; i++) {
        a1.forwardBackward(b);
        a1.optimStep({ learningRate: 1e-2 });
      }
      // The base is untouched, bit for bit.
      for (const [name, t] of Object.entries(base.exportWeights())) expect(t.data, name).toEqual(baseBefore[name]!.data);
      // The adapter's B factors moved (A too, once B is non-zero).
      const after1 = weightsOf(a1);
      const changed = [...after1].filter(([n, w]) => maxAbsDiff(w, before1.get(n)!) > 0).map(([n]) => n);
      expect(changed.some((n) => n.endsWith('.lora_b'))).toBe(true);
      expect(changed.every((n) => n.includes('.lora_'))).toBe(true);
      expect(a1.sample(b, { seed: 1, numSteps: 3 })).not.toEqual(ref);
      // The other adapter still gives the base's outputs.
      expect(a2.sample(b, { seed: 1, numSteps: 3 })).toEqual(ref);
      expect(a1.trainableParamCount).toBeGreaterThan(a2.trainableParamCount);
      for (const s of [plain, a1, a2]) s.dispose();
      base.dispose();
    });
  });

  describe('pi0.5 adaptive-norm gates (adaLN-Zero) on a seeded base', () => {
    it('refuses LoRA that leaves the zero gates frozen (it could never learn); with open gates attn alone trains', () => {
      const { c, b } = batchOf('flow05-tiny', 2, 14);
      const base = BaseWeights.create(c, 14);
      // Why: with the gates at zero no attention or MLP weight of either expert gets a gradient.
      const full = new TrainingState(base, { finetune: 'full', seed: 1 });
      full.forwardBackward(b);
      const gated = [...full.accumulatedGradients().grads].filter(([n]) => /^layers\.\d+\.(prefix|action)\.(qkv|o|mlp1|mlp2)\.weight$/.test(n));
      expect(gated.length).toBeGreaterThanOrEqual(2 * 4); // every block's (the last prefix block feeds nothing)
      for (const [n, g] of gated) expect(g.every((x) => x === 0), n).toBe(true);
      expect([...full.accumulatedGradients().grads].some(([n, g]) => /\.ada1\.weight$/.test(n) && g.some((x) => x !== 0))).toBe(true);
      full.dispose();
      for (const targets of [['attn'], ['mlp'], ['attn', 'mlp', 'prefix_expert']]) {
        expect(() => new TrainingState(base, { finetune: 'lora', rank: 2, targets }), targets.join()).toThrow(/must include action_expert or all for LoRA on pi0\.5 with seeded base weights/);
      }
      new TrainingState(base, { finetune: 'lora', rank: 2, targets: ['attn', 'action_expert'] }).dispose();
      // A base whose gates are open (a trained one): attn alone is taken and its adapters learn.
      const named = base.exportWeights();
      for (const [n, t] of Object.entries(named)) if (/\.ada[12]\.weight$/.test(n)) t.data.forEach((_, i) => (t.data[i] = ((i % 7) - 3) * 0.01));
      const open = BaseWeights.fromTensors(c, named);
      const s = new TrainingState(open, { finetune: 'lora', rank: 2, targets: ['attn'], seed: 1 });
      s.forwardBackward(b);
      const loraB = [...s.accumulatedGradients().grads].filter(([n]) => n.endsWith('.lora_b'));
      expect(loraB.length).toBeGreaterThan(0);
      expect(loraB.some(([, g]) => g.some((x) => x !== 0))).toBe(true);
      s.dispose();
      open.dispose();
      base.dispose();
    });
  });

  describe('sampling, errors, leaks, export/import', () => {
    it('sampling with a fixed seed repeats, and the prefix cache equals re-encoding the prefix', () => {
      for (const preset of ['flow0-tiny', 'flow05-tiny']) {
        const { c, b } = batchOf(preset, 2, 4);
        const base = BaseWeights.create(c, 10);
        const s = new TrainingState(base, { finetune: 'full', seed: 1 });
        s.forwardBackward(b);
        s.optimStep({ learningRate: 1e-2 }); // non-trivial weights (pi0.5's gates are no longer 0)
        const x1 = s.sample(b, { seed: 42, numSteps: 4 });
        expect(s.sample(b, { seed: 42, numSteps: 4 })).toEqual(x1);
        // The cached sampler run eagerly equals re-encoding the prefix bit for bit; on native
        // TensorFlow the cached sampler runs as one graph (kernels/sample-graph.ts), whose
        // rewrites round differently: equal to float32 rounding.
        const eager = withGraphs('0', () => s.sample(b, { seed: 42, numSteps: 4 }));
        expect(s.sample(b, { seed: 42, numSteps: 4, cache: false })).toEqual(eager);
        const scale = Math.max(...eager.map(Math.abs));
        expect(Math.max(...x1.map((x, i) => Math.abs(x - eager[i]!)))).toBeLessThan(1e-5 * scale);
        expect(s.sample(b, { seed: 43, numSteps: 4 })).not.toEqual(x1);
        s.dispose();
        base.dispose();
      }
    });

    it('keeps tf.memory().numTensors stable across steps', () => {
      const { c, b } = batchOf('flow05-tiny', 2, 5);
      const base = BaseWeights.create(c, 11);
      const s = new TrainingState(base, { finetune: 'lora', rank: 4, seed: 1 });
      const count = () => tf.memory().numTensors;
      const step = () => {
        s.forwardBackward(b);
        const f = s.forward(b, { keep: true });
        s.backward(mseVelocityGrad(f.velocity, f.target, b.actionMask, b.weight));
        s.optimStep();
        s.sample(b, { numSteps: 2 });
        s.sample(b, { numSteps: 2, cache: false });
        s.forwardBackward(b, { lossFn: 'l1' });
        s.abortGradientEpoch();
        s.exportState();
      };
      step();
      const n0 = count();
      step();
      step();
      expect(count()).toBe(n0);
      s.dispose();
      base.dispose();
    });

    it('optim_step with D == 0 is a hard error that changes nothing; abort is idempotent', () => {
      const { c, b } = batchOf('flow0-tiny', 2, 6);
      const base = BaseWeights.create(c, 12);
      const s = new TrainingState(base, { finetune: 'lora', rank: 2, seed: 1 });
      expect(() => s.optimStep()).toThrow(/D is 0 after 0 calls/);
      (b.weight as Float32Array).fill(0);
      const r = s.forwardBackward(b);
      expect(r.loss).toBe(0);
      expect(() => s.optimStep()).toThrow(TrainerError);
      expect(s.pendingGradients).toBe(1);
      expect(s.step).toBe(0);
      expect(s.abortGradientEpoch()).toEqual({ discarded: 1 });
      expect(s.abortGradientEpoch()).toEqual({ discarded: 0 });
      expect(() => s.backward(new Float32Array(40))).toThrow(/keep: true/);
      s.dispose();
      base.dispose();
    });

    it('a non-finite gradient norm skips the step and clears G and D', () => {
      const { c, b } = batchOf('flow0-tiny', 2, 7);
      const base = BaseWeights.create(c, 13);
      const s = new TrainingState(base, { finetune: 'full', seed: 1 });
      const w = s.exportWeights();
      w.weights['act.out.weight']!.data.fill(3e38); // velocity overflows to inf
      s.importWeights(w);
      const before = weightsOf(s);
      s.forwardBackward(b);
      const r = s.optimStep();
      expect(r.skipped).toBe(true);
      expect(Number.isFinite(r.gradNorm)).toBe(false);
      expect(s.pendingGradients).toBe(0);
      expect(s.step).toBe(0);
      for (const [n, x] of weightsOf(s)) expect(x, n).toEqual(before.get(n)!);
      expect(() => s.optimStep()).toThrow(TrainerError);
      s.dispose();
      base.dispose();
    });

    it('exportState -> importState gives identical outputs and an identical next optimizer step', () => {
      const { c, b } = batchOf('flow05-tiny', 2, 8);
      const base = BaseWeights.create(c, 14);
      const s1 = new TrainingState(base, { finetune: 'lora', rank: 4, targets: ['action_expert'], seed: 1 });
      for (let i = 0; i < 2; i++) {
        s1.forwardBackward(b);
        s1.optimStep({ learningRate: 1e-2 });
      }
      const saved = s1.exportState();
      expect(saved.trainerState!.step).toBe(2);
      const s2 = new TrainingState(base, { finetune: 'lora', rank: 4, targets: ['action_expert'], seed: 99 });
      s2.importState(saved);
      expect(s2.step).toBe(2);
      expect(s2.sample(b, { seed: 3, numSteps: 3 })).toEqual(s1.sample(b, { seed: 3, numSteps: 3 }));
      const r1 = s1.forwardBackward(b);
      const r2 = s2.forwardBackward(b);
      expect(r2.lossPerDatum).toEqual(r1.lossPerDatum); // the generator state came back too
      expect(s2.optimStep({ learningRate: 1e-2 })).toEqual(s1.optimStep({ learningRate: 1e-2 }));
      const w1 = weightsOf(s1);
      for (const [n, w] of weightsOf(s2)) expect(w, n).toEqual(w1.get(n)!);
      const other = new TrainingState(base, { finetune: 'lora', rank: 2, targets: ['action_expert'], seed: 1 });
      expect(() => other.importState(saved)).toThrow(/shape/);
      for (const s of [s1, s2, other]) s.dispose();
      base.dispose();
    });
  });

  describe('gradient checkpointing of the prefix layers', () => {
    it('gives the same G as the plain backward pass, for full and LoRA sessions', () => {
      const { c, b } = batchOf('flow05-tiny', 2, 9);
      const base = BaseWeights.create(c, 15);
      const before = process.env.VELA_CHECKPOINT;
      try {
        for (const finetune of ['full', 'lora'] as const) {
          const grads = (mode: string) => {
            process.env.VELA_CHECKPOINT = mode;
            const s = new TrainingState(base, { finetune, rank: 4, seed: 2 });
            s.forwardBackward(b);
            const g = s.accumulatedGradients().grads;
            s.dispose();
            return g;
          };
          const on = grads('on');
          const off = grads('off');
          // Checkpointed blocks report explicit zeros for parameters that feed nothing (the last
          // prefix layer's O and MLP); the plain pass leaves them out (optimStep treats both as 0).
          for (const [name, g] of on) if (!off.has(name)) expect(g.every((x) => x === 0), name).toBe(true);
          for (const [name, g] of off) expect(maxAbsDiff(g, on.get(name)!), name).toBeLessThan(1e-6);
          expect(off.size).toBeGreaterThan(10);
        }
      } finally {
        if (before === undefined) delete process.env.VELA_CHECKPOINT;
        else process.env.VELA_CHECKPOINT = before;
      }
      base.dispose();
    });
  });
});

describe('moving average of the weights (ema_decay, issue 16)', () => {
  it('follows ema = d ema + (1 - d) p with the warm-up d = min(decay, (1 + n) / (10 + n)), samples and exports it, and round-trips it in a state', () => {
    const { c, b } = batchOf('flow05-tiny', 2, 10);
    const base = BaseWeights.create(c, 16);
    const decay = 0.5;
    const s1 = new TrainingState(base, { finetune: 'full', seed: 2, emaDecay: decay });
    let expected = new Map([...weightsOf(s1)].map(([k, v]) => [k, Float64Array.from(v)]));
    for (let n = 0; n < 4; n++) {
      s1.forwardBackward(b);
      s1.optimStep({ learningRate: 1e-2 });
      const d = Math.min(decay, (1 + n) / (10 + n)); // 0.1, 0.18, 0.25, 0.31: the warm-up binds here
      const p = weightsOf(s1);
      expected = new Map([...expected].map(([k, e]) => [k, e.map((x, i) => d * x + (1 - d) * p.get(k)![i]!)]));
    }
    const ema = s1.exportWeights({ ema: true });
    expect(ema.config.ema_decay).toBe(decay);
    let worst = 0;
    for (const [k, e] of expected) e.forEach((x, i) => (worst = Math.max(worst, Math.abs(x - ema.weights[k]!.data[i]!))));
    expect(worst).toBeLessThan(1e-6);
    // The average is a different model from the last weights, and sampling / forward use it when asked.
    const plain = s1.sample(b, { seed: 3, numSteps: 3 });
    const averaged = s1.sample(b, { seed: 3, numSteps: 3, ema: true });
    expect(maxAbsDiff(plain, averaged)).toBeGreaterThan(1e-4);
    const other = new TrainingState(base, { finetune: 'full', seed: 2 });
    other.importWeights({ weights: ema.weights, config: ema.config });
    expect(other.sample(b, { seed: 3, numSteps: 3 })).toEqual(averaged);
    expect(() => other.sample(b, { ema: true })).toThrow(/ema_decay > 0/);
    // A saved state carries the average (`<param>.ema`) and its update count.
    const saved = s1.exportState();
    expect(Object.keys(saved.optimizer!).filter((k) => k.endsWith('.ema')).length).toBe(Object.keys(ema.weights).length);
    const s2 = new TrainingState(base, { finetune: 'full', seed: 9, emaDecay: decay });
    s2.importState(saved);
    expect(s2.sample(b, { seed: 3, numSteps: 3, ema: true })).toEqual(averaged);
    for (const s of [s1, s2]) {
      s.forwardBackward(b);
      s.optimStep({ learningRate: 1e-2 });
    }
    expect(s2.exportWeights({ ema: true }).weights).toEqual(s1.exportWeights({ ema: true }).weights);
    expect(() => other.importState(saved)).toThrow(/moving average/);
    expect(() => new TrainingState(base, { emaDecay: 1 })).toThrow(/ema_decay is 1/);
    for (const s of [s1, s2, other]) s.dispose();
    base.dispose();
  });
});

describe('training time distribution (time_sampling, issue 16)', () => {
  it('beta draws t = 0.999 u^(2/3) + 0.001, uniform t = 0.999 u + 0.001, from the same generator draws', () => {
    const { c, b } = batchOf('flow05-tiny', 3, 11);
    const base = BaseWeights.create(c, 17);
    const n = 3 * c.horizon * c.actionDim;
    const draws = () => {
      const twin = new Rng(4 + 0x5eed1); // the session's noise/time generator (seed + 0x5eed1)
      twin.normals(n);
      return Array.from(twin.uniforms(3));
    };
    const u = draws();
    for (const [mode, f] of [['beta', (x: number) => 0.999 * Math.pow(x, 2 / 3) + 0.001], ['uniform', (x: number) => 0.999 * x + 0.001]] as const) {
      const s = new TrainingState(base, { finetune: 'full', seed: 4, timeSampling: mode });
      const { time } = s.forward(b);
      expect(Array.from(time)).toEqual(u.map((x) => Math.fround(f(x))));
      s.dispose();
    }
    expect(() => new TrainingState(base, { timeSampling: 'logit' as 'beta' })).toThrow(/time_sampling is 'logit'/);
    base.dispose();
  });
});
