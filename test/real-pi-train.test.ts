/**
 * The real pi0 / pi0.5 (kernels/pi/) through the shared trainer (kernels/trainer.ts via
 * kernels/pi/policy.ts), on the tiny configs with the parity contract's init: the trainer's loss
 * equals the model's own computeLoss; a full fine-tune and a LoRA fine-tune lower the loss on a
 * fixed batch; LoRA trains adapters on the Gemma projections and the action / state / time
 * projections in full (their gradients against finite differences), and leaves the base
 * bit-identical; adapters saved without those projections still load; grad_norm equals a
 * direct computation; save / load resumes exactly; sampling after training is the model's
 * sampler on the trained weights; no tensor leaks.
 * On the best backend only (native TensorFlow when present): a step is ~0.4-1.5 s here, and
 * backend parity of the model is real-pi-model.test.ts's.
 */
import * as tf from '@tensorflow/tfjs';
import { longestRealPiReduction, passBound, relDiff, sampleBound } from './helpers/float32.ts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { useBestBackend } from './helpers/tf.ts';
import { REAL_PI_TINY_PI0, REAL_PI_TINY_PI05, type RealPiConfig } from '../kernels/pi/config.ts';
import { fakeRealPiBatch } from '../kernels/pi/fake.ts';
import { NAMES, createRealPiParams, disposeRealPiParams } from '../kernels/pi/params.ts';
import { computeLoss, sample, type RealPiBatch } from '../kernels/pi/model.ts';
import { OPENPI_LORA, realPiLinears, realPiLoraFull, realPiPolicy } from '../kernels/pi/policy.ts';
import { BaseWeights, TrainingState, type NamedTensors } from '../kernels/trainer.ts';
import { LoraError } from '../kernels/lora.ts';

const B = 2;
const NC = 3;
const LR = 3e-3; // full fine-tune
const LR_LORA = 1e-2; // adapters start with B = 0, so they move slowly at first
/** Full fine-tune steps: pi0's loss falls slowly at LR and first passes 0.7x of its start at step 18. */
const STEPS = 20;
/** LoRA steps: pi0's loss is 0.14x its start by step 11 (pi0.5's by step 4), against 0.3x asserted. */
const LORA_STEPS = 12;
/** Euler steps where sampling is compared two ways: the bounds (sampleBound) hold for any count. */
const SAMPLE_STEPS = 3;

/** Batch 2, 3 cameras (datum 0's second masked), datum 1's prompt padded after 7 tokens; real values. */
const makeBatch = (c: RealPiConfig, L = 12): RealPiBatch => fakeRealPiBatch(c, L, 0.5);

/** A fixed training draw (so the objective is one function and its loss must fall). */
function fixedDraw(c: RealPiConfig) {
  return {
    noise: new Float32Array(B * c.actionHorizon * c.actionDim).map((_, i) => Math.cos(i * 0.3)),
    time: Float32Array.from([0.3, 0.8]),
  };
}

function same(a: NamedTensors, b: NamedTensors): boolean {
  const keys = Object.keys(a);
  if (keys.length !== Object.keys(b).length) return false;
  for (const k of keys) {
    const x = a[k]!.data;
    const y = b[k]?.data;
    if (!y || x.length !== y.length) return false;
    for (let i = 0; i < x.length; i++) if (!Object.is(x[i], y[i])) return false;
  }
  return true;
}



/** The base with the state's trained tensors in place (full) or its adapters merged in (LoRA: W + s · (A B)ᵀ). */
function mergedWeights(base: BaseWeights<RealPiBatch, RealPiConfig>, state: TrainingState<RealPiBatch, RealPiConfig>, scales: (linear: string) => number): Map<string, tf.Tensor> {
  const out = new Map<string, tf.Tensor>();
  for (const [name, t] of base.tensors) out.set(name, state.params.get(name) ?? t);
  for (const name of state.params.keys()) {
    if (!name.endsWith('.lora_a')) continue;
    const layer = name.slice(0, -'.lora_a'.length);
    const w = base.get(`${layer}.weight`);
    const delta = tf.tidy(() => tf.add(w, tf.mul(tf.transpose(tf.matMul(state.params.get(name)!, state.params.get(`${layer}.lora_b`)!)), scales(layer))));
    out.set(`${layer}.weight`, delta);
  }
  return out;
}

beforeAll(() => useBestBackend());

describe.each([
  ['pi0', REAL_PI_TINY_PI0],
  ['pi05', REAL_PI_TINY_PI05],
] as const)('real %s through the shared trainer', (_name, c) => {
  const policy = realPiPolicy(c);
  const K = longestRealPiReduction(c);
  const batch = makeBatch(c);
  const draw = fixedDraw(c);
  let base: BaseWeights<RealPiBatch, RealPiConfig>;
  beforeAll(() => {
    base = BaseWeights.create(policy);
  });
  afterAll(() => base.dispose());

  it("the trainer's loss equals the model's computeLoss (weighted by datum), and backward matches forward_backward", () => {
    const state = new TrainingState(base, { finetune: 'lora', ...OPENPI_LORA });
    const weighted = { ...batch, weight: Float32Array.from([1, 3]) };
    const { loss, lossPerDatum } = state.forwardBackward(weighted, draw);
    const direct = tf.tidy(() => computeLoss({ config: c, params: base.tensors }, batch, draw.noise, draw.time).dataSync());
    expect(relDiff(lossPerDatum, direct)).toBeLessThan(passBound(K));
    expect(loss).toBeCloseTo((direct[0]! + 3 * direct[1]!) / 4, 5);
    // The same gradient through forward(keep) + backward(dL/dv) (the split path of PROTOCOL.md section 3).
    const g1 = state.accumulatedGradients();
    state.abortGradientEpoch();
    const f = state.forward(weighted, { keep: true, ...draw });
    const grad = new Float32Array(f.velocity.length);
    const per = c.actionHorizon * c.actionDim;
    for (let i = 0; i < grad.length; i++) grad[i] = (2 * weighted.weight[Math.floor(i / per)]! * (f.velocity[i]! - f.target[i]!)) / per;
    state.backward(grad);
    const g2 = state.accumulatedGradients();
    expect(g2.denominator).toBe(g1.denominator);
    for (const [name, g] of g1.grads) expect(relDiff(g2.grads.get(name)!, g), name).toBeLessThan(passBound(2 * K));
    state.dispose();
  });

  it('LoRA at openpi ranks adapts the Gemma projections, trains the projections around them in full, leaves the base alone, and the loss falls', () => {
    const before = base.exportWeights();
    const state = new TrainingState(base, { finetune: 'lora', ...OPENPI_LORA, seed: 3 });
    const linears = realPiLinears(c);
    // openpi's freeze filter: only the Gemmas' own weights are frozen, so the action / state / time projections train in full.
    const full = c.variant === 'pi0'
      ? ['action_in_proj', 'action_out_proj', 'state_proj', 'action_time_mlp_in', 'action_time_mlp_out']
      : ['action_in_proj', 'action_out_proj', 'time_mlp_in', 'time_mlp_out'];
    expect(realPiLoraFull(c).sort()).toEqual(full.flatMap((m) => [`model.${m}.weight`, `model.${m}.bias`]).sort());
    expect([...state.params.keys()].sort()).toEqual([...linears.flatMap((l) => [`${l.name}.lora_a`, `${l.name}.lora_b`]), ...realPiLoraFull(c)].sort());
    expect(state.params.get('model.action_out_proj.weight')!.shape).toEqual([32, 32]);
    expect(state.params.get(`${NAMES.vlm}layers.0.self_attn.q_proj.lora_a`)!.shape).toEqual([64, 16]);
    expect(state.params.get(`${NAMES.expert}layers.3.mlp.down_proj.lora_b`)!.shape).toEqual([32, 32]);
    const losses: number[] = [];
    for (let i = 0; i < LORA_STEPS; i++) {
      losses.push(state.forwardBackward(batch, draw).loss);
      expect(state.optimStep({ learningRate: LR_LORA }).skipped).toBe(false);
    }
    console.log(`${c.variant} LoRA 16/32: loss ${losses[0]!.toFixed(4)} -> ${losses.at(-1)!.toFixed(4)} over ${LORA_STEPS} steps`);
    // Measured (node): pi0 0.659 -> 0.087 (0.041 after 20 steps), pi0.5 0.672 -> 0.042 (0.007). With
    // adapters alone (before the projections trained), after 20 steps, 0.626 and 0.453: the frozen
    // action_out_proj (contract init, |w| < 0.05) bounded |v| well below the target's scale.
    expect(losses.at(-1)!).toBeLessThan(0.3 * losses[0]!);
    expect(Math.max(...losses.slice(LORA_STEPS / 2))).toBeLessThan(losses[0]!);
    expect(same(base.exportWeights(), before)).toBe(true);
    // The exported adapter carries the action expert's own rank, and the projections under their own names.
    const exported = state.exportWeights();
    expect(exported.config).toMatchObject({ preset: `real-${c.variant}`, finetune: 'lora', lora_rank: 16, lora_alpha: 16, lora_action_rank: 32, lora_action_alpha: 32, lora_full: realPiLoraFull(c) });
    expect(Object.keys(exported.weights).filter((k) => !/\.lora_[ab]$/.test(k)).sort()).toEqual(realPiLoraFull(c).sort());
    expect(relDiff(exported.weights['model.action_out_proj.weight']!.data, before['model.action_out_proj.weight']!.data)).toBeGreaterThan(1e-2);
    // A target list is checked and narrows the set: the expert's MLPs only.
    const mlp = new TrainingState(base, { finetune: 'lora', targets: ['mlp'] });
    expect([...mlp.params.keys()].filter((k) => !realPiLoraFull(c).includes(k)).every((k) => /mlp\.(gate|up|down)_proj\.lora_[ab]$/.test(k))).toBe(true);
    mlp.dispose();
    expect(() => new TrainingState(base, { targets: ['vision'] })).toThrow(LoraError);
    state.dispose();
  });

  it('LoRA: the gradients of the projections trained in full agree with central finite differences', () => {
    // Weights 6x the contract's (±0.3), so that the time MLP's gradients stand clear of float32
    // rounding in the differences (as test/real-pi-model.test.ts does).
    const scaled = BaseWeights.fromTensors(policy, Object.fromEntries(Object.entries(base.exportWeights()).map(([n, t]) => [n, { shape: t.shape, data: t.data.map((x) => 6 * x) }])));
    const state = new TrainingState(scaled, { finetune: 'lora', ...OPENPI_LORA, seed: 4 });
    // One step first, so the adapters' B is no longer zero and the projections are off the base.
    state.forwardBackward(batch, draw);
    state.optimStep({ learningRate: LR_LORA });
    const loss = (): number => {
      const l = state.forwardBackward(batch, draw).loss;
      state.abortGradientEpoch();
      return l;
    };
    state.forwardBackward(batch, draw);
    const { grads, denominator } = state.accumulatedGradients();
    state.abortGradientEpoch();
    const h = 1e-2;
    for (const name of realPiLoraFull(c)) {
      const g = grads.get(name);
      expect(g, name).toBeDefined();
      let k = 0;
      for (let j = 1; j < g!.length; j++) if (Math.abs(g![j]!) > Math.abs(g![k]!)) k = j;
      const grad = g![k]! / denominator; // G is the gradient of sum_i w_i loss_i; the loss is it over D
      expect(Math.abs(grad), name).toBeGreaterThan(1e-3);
      const v = state.params.get(name)!;
      const orig = v.dataSync().slice();
      const set = (delta: number) => {
        const next = orig.slice();
        next[k] = orig[k]! + delta;
        tf.tidy(() => v.assign(tf.tensor(next, v.shape)));
      };
      set(h);
      const up = loss();
      set(-h);
      const down = loss();
      tf.tidy(() => v.assign(tf.tensor(orig, v.shape)));
      const fd = (up - down) / (2 * h);
      expect(Math.abs(fd - grad), `${name}[${k}]: fd ${fd} vs ${grad}`).toBeLessThanOrEqual(2e-4 + 2e-2 * Math.abs(grad));
    }
    state.dispose();
    scaled.dispose();
  });

  it('LoRA: an adapter or state saved without the projections (before they trained) loads, with the base\'s projections', () => {
    const a = new TrainingState(base, { finetune: 'lora', ...OPENPI_LORA, emaDecay: 0.5, seed: 6 });
    for (let i = 0; i < 2; i++) {
      a.forwardBackward(batch, draw);
      a.optimStep({ learningRate: LR_LORA });
    }
    const drop = (t: NamedTensors, suffixes: string[]) => Object.fromEntries(Object.entries(t).filter(([k]) => !realPiLoraFull(c).some((n) => suffixes.some((s) => k === n + s))));
    const saved = a.exportState();
    const old = { ...saved, weights: drop(saved.weights, ['']), optimizer: drop(saved.optimizer!, ['.exp_avg', '.exp_avg_sq', '.ema']) };
    const b = new TrainingState(base, { finetune: 'lora', ...OPENPI_LORA, emaDecay: 0.5 });
    b.importState(old);
    const out = b.exportState();
    for (const n of realPiLoraFull(c)) {
      expect(out.weights[n]!.data, n).toEqual(base.get(n).dataSync());
      expect(out.optimizer![`${n}.exp_avg`]!.data.every((x) => x === 0)).toBe(true);
      expect(out.optimizer![`${n}.ema`]!.data).toEqual(base.get(n).dataSync());
    }
    const lora = `${NAMES.expert}layers.0.self_attn.q_proj.lora_b`;
    expect(out.weights[lora]!.data).toEqual(saved.weights[lora]!.data);
    b.importWeights({ weights: drop(a.exportWeights().weights, ['']) });
    expect(b.exportWeights().weights['model.action_out_proj.weight']!.data).toEqual(base.get('model.action_out_proj.weight').dataSync());
    // A tensor that is no adapter and no trained projection is still refused.
    expect(() => b.importWeights({ weights: { ...a.exportWeights().weights, 'model.extra': { shape: [1], data: new Float32Array(1) } } })).toThrow(/unknown tensors: model\.extra/);
    a.dispose();
    b.dispose();
  });

  it('a full fine-tune (token embedding frozen) lowers the loss; sampling afterwards is the model sampler on the trained weights', () => {
    const state = new TrainingState(base, { finetune: 'full', frozen: [NAMES.embedding] });
    expect(state.params.has(NAMES.embedding)).toBe(false);
    expect(state.trainableParamCount).toBe(base.paramCount - c.vlm.vocabSize * c.vlm.width);
    const losses: number[] = [];
    for (let i = 0; i < STEPS; i++) {
      losses.push(state.forwardBackward(batch, draw).loss);
      state.optimStep({ learningRate: LR });
    }
    console.log(`${c.variant} full: loss ${losses[0]!.toFixed(4)} -> ${losses.at(-1)!.toFixed(4)} over ${STEPS} steps`);
    // Measured (node): pi0 0.659 -> 0.370, pi0.5 0.672 -> 0.022.
    expect(losses.at(-1)!).toBeLessThan(0.7 * losses[0]!);
    expect(state.exportWeights().config.frozen).toEqual([NAMES.embedding]);
    // sample(): the cached path equals the uncached one and the model's own sampler on the trained weights.
    const noise = draw.noise;
    const cached = state.sample(batch, { noise, numSteps: SAMPLE_STEPS });
    const uncached = state.sample(batch, { noise, cache: false, numSteps: SAMPLE_STEPS });
    const direct = tf.tidy(() => sample({ config: c, params: mergedWeights(base, state, () => 1) }, batch, noise, SAMPLE_STEPS).dataSync());
    expect(relDiff(cached, uncached)).toBeLessThan(sampleBound(K));
    expect(relDiff(cached, direct)).toBeLessThan(sampleBound(K));
    state.dispose();
  });

  it('LoRA sampling equals the model sampler on the merged weights W + (alpha / r) (A B)ᵀ, per-expert scales', () => {
    // Scales 0.5 on the VLM and 2 on the expert, so a scale taken from the wrong side shows.
    const state = new TrainingState(base, { finetune: 'lora', rank: 16, alpha: 8, actionRank: 32, actionAlpha: 64 });
    for (let i = 0; i < 3; i++) {
      state.forwardBackward(batch, draw);
      state.optimStep({ learningRate: LR });
    }
    const merged = mergedWeights(base, state, (layer) => (layer.startsWith(NAMES.expert) ? 2 : 0.5));
    const direct = tf.tidy(() => sample({ config: c, params: merged }, batch, draw.noise, SAMPLE_STEPS).dataSync());
    const viaState = state.sample(batch, { noise: draw.noise, numSteps: SAMPLE_STEPS });
    for (const [name, t] of merged) if ((!base.tensors.has(name) || base.get(name) !== t) && state.params.get(name) !== t) t.dispose();
    expect(relDiff(viaState, direct)).toBeLessThan(sampleBound(K));
    // Sampling needs no actions; training does, and says so.
    const { actions: _actions, ...observation } = batch;
    expect(state.sample(observation, { noise: draw.noise, numSteps: SAMPLE_STEPS })).toEqual(viaState);
    expect(() => state.forwardBackward(observation)).toThrow(`the loss needs actions [2, ${c.actionHorizon}, 32]; they are missing`);
    state.dispose();
  });

  it('gradient accumulation: datum by datum gives the gradient of the whole batch', () => {
    const one = (i: number): RealPiBatch => {
      const L = batch.tokens.length / B;
      const per = (a: ArrayLike<number>, n: number) => Array.prototype.slice.call(a, i * n, (i + 1) * n) as number[];
      const S = c.vision.imageSize;
      const ad = c.actionHorizon * c.actionDim;
      return {
        size: 1,
        numCameras: NC,
        images: batch.images.slice(i * NC * 3 * S * S, (i + 1) * NC * 3 * S * S),
        imageMasks: per(batch.imageMasks, NC),
        tokens: batch.tokens.slice(i * L, (i + 1) * L),
        tokenMasks: per(batch.tokenMasks, L),
        state: batch.state!.slice(i * c.stateDim, (i + 1) * c.stateDim),
        actions: batch.actions!.slice(i * ad, (i + 1) * ad),
      };
    };
    const whole = new TrainingState(base, { finetune: 'lora', ...OPENPI_LORA });
    const split = new TrainingState(base, { finetune: 'lora', ...OPENPI_LORA });
    for (const s of [whole, split]) {
      // One step first, so B is no longer zero and every adapter has a gradient.
      s.forwardBackward(batch, draw);
      s.optimStep({ learningRate: LR });
    }
    whole.forwardBackward(batch, draw);
    const ad = c.actionHorizon * c.actionDim;
    for (let i = 0; i < B; i++) split.forwardBackward(one(i), { noise: draw.noise.slice(i * ad, (i + 1) * ad), time: draw.time.slice(i, i + 1) });
    const gw = whole.accumulatedGradients();
    const gs = split.accumulatedGradients();
    expect(gs.denominator).toBe(gw.denominator);
    expect(split.pendingGradients).toBe(2);
    for (const [name, g] of gw.grads) expect(relDiff(gs.grads.get(name)!, g), name).toBeLessThan(passBound(2 * K));
    expect(split.optimStep({ learningRate: LR }).gradNorm).toBeCloseTo(whole.optimStep({ learningRate: LR }).gradNorm, 5);
    whole.dispose();
    split.dispose();
  });

  it('grad_norm equals the norm of a direct gradient of the mean computeLoss', () => {
    const state = new TrainingState(base, { finetune: 'full', frozen: [NAMES.embedding] });
    state.forwardBackward(batch, draw);
    const { gradNorm } = state.optimStep({ learningRate: LR });
    const params = createRealPiParams(c, 'contract-init', { trainable: true });
    const vars = [...params].filter(([n]) => n !== NAMES.embedding).map(([, v]) => v as tf.Variable);
    const { value, grads } = tf.variableGrads(() => tf.mean(computeLoss({ config: c, params }, batch, draw.noise, draw.time)) as tf.Scalar, vars);
    let sq = 0;
    for (const g of Object.values(grads)) for (const x of g.dataSync()) sq += x * x;
    tf.dispose([value, ...Object.values(grads)]);
    disposeRealPiParams(params);
    console.log(`${c.variant} grad_norm ${gradNorm} vs direct ${Math.sqrt(sq)}`);
    expect(gradNorm).toBeGreaterThan(0);
    expect(Math.abs(gradNorm - Math.sqrt(sq)) / Math.sqrt(sq)).toBeLessThan(passBound(2 * K));
    state.dispose();
  });

  it('save / load of the state round-trips exactly: the resumed state takes the same next step', () => {
    const a = new TrainingState(base, { finetune: 'lora', ...OPENPI_LORA, emaDecay: 0.9, seed: 5 });
    for (let i = 0; i < 2; i++) {
      a.forwardBackward(batch); // the state's own noise / time generator: it must be restored too
      a.optimStep({ learningRate: LR_LORA });
    }
    const saved = a.exportState();
    const b = new TrainingState(base, { finetune: 'lora', ...OPENPI_LORA, emaDecay: 0.9, seed: 99 });
    b.importState(saved);
    expect(same(b.exportState().weights, saved.weights)).toBe(true);
    const la = a.forwardBackward(batch).loss;
    const lb = b.forwardBackward(batch).loss;
    expect(lb).toBe(la);
    expect(b.optimStep({ learningRate: LR }).gradNorm).toBe(a.optimStep({ learningRate: LR }).gradNorm);
    const ea = a.exportState();
    const eb = b.exportState();
    expect(same(eb.weights, ea.weights)).toBe(true);
    expect(same(eb.optimizer!, ea.optimizer!)).toBe(true);
    expect(eb.trainerState).toEqual(ea.trainerState);
    // A state of other ranks does not load.
    const other = new TrainingState(base, { finetune: 'lora', rank: 16, alpha: 16, emaDecay: 0.9 });
    expect(() => other.importState(saved)).toThrow(/gemma_expert.*shape \[32,32\]; this model needs \[32,16\]/);
    for (const s of [a, b, other]) s.dispose();
  });

  it('leaks no tensors: forward_backward, optim_step, forward + backward, sample, export / import', () => {
    const state = new TrainingState(base, { finetune: 'lora', ...OPENPI_LORA, emaDecay: 0.5 });
    const step = () => {
      state.forwardBackward(batch);
      state.optimStep({ learningRate: LR });
      const f = state.forward(batch, { keep: true });
      state.backward(f.velocity.map((v) => v * 1e-3));
      state.optimStep({ learningRate: LR });
      state.sample(batch, { seed: 1, numSteps: 2 });
      state.sample(batch, { seed: 1, numSteps: 2, ema: true });
      state.importState(state.exportState());
    };
    step(); // first-use allocations (moment buffers, backend caches) happen once
    const n = tf.memory().numTensors;
    step();
    expect(tf.memory().numTensors).toBe(n);
    state.dispose();
  });
});

describe('real pi base weights adopted from tensors (a checkpoint reader streaming into the model)', () => {
  it('take the tensors as they are, and name every missing, unexpected and misshapen one', () => {
    const c = REAL_PI_TINY_PI0;
    const policy = realPiPolicy(c);
    const params = createRealPiParams(c, 'contract-init');
    const base = BaseWeights.adopt(policy, params);
    expect(base.get(NAMES.embedding)).toBe(params.get(NAMES.embedding)); // no copy
    const batch = makeBatch(c);
    const draw = fixedDraw(c);
    const state = new TrainingState(base, { finetune: 'lora' });
    const { lossPerDatum } = state.forwardBackward(batch, draw);
    const direct = tf.tidy(() => computeLoss({ config: c, params }, batch, draw.noise, draw.time).dataSync());
    expect(relDiff(lossPerDatum, direct)).toBeLessThan(passBound(longestRealPiReduction(c)));
    state.dispose();
    const bad = new Map(params);
    bad.delete('model.action_in_proj.bias');
    bad.set('model.state_proj.bias', tf.zeros([3]));
    bad.set('model.extra', tf.zeros([1]));
    expect(() => BaseWeights.adopt(policy, bad)).toThrow(
      "base weights for real-pi0: missing 'model.action_in_proj.bias' [32]; 'model.state_proj.bias' is float32 [3]; expected float32 [32]; unexpected 'model.extra'",
    );
    tf.dispose([bad.get('model.state_proj.bias')!, bad.get('model.extra')!]);
    base.dispose();
  });
});

describe('real pi full fine-tune trains the token embedding by default (as openpi does)', () => {
  it('only the rows of the prompt tokens move (no weight decay)', () => {
    const c = REAL_PI_TINY_PI05;
    const base = BaseWeights.create(realPiPolicy(c));
    const batch = makeBatch(c);
    const state = new TrainingState(base, { finetune: 'full' });
    expect(state.params.has(NAMES.embedding)).toBe(true);
    state.forwardBackward(batch, fixedDraw(c));
    state.optimStep({ learningRate: LR, weightDecay: 0 });
    const after = state.params.get(NAMES.embedding)!.dataSync();
    const before = base.get(NAMES.embedding).dataSync();
    const D = c.vlm.width;
    const used = new Set(batch.tokens);
    const moved = new Set<number>();
    for (let i = 0; i < before.length; i++) if (after[i] !== before[i]) moved.add(Math.floor(i / D));
    // Padding positions gather rows too, but their outputs are masked: their gradient is 0.
    const real = new Set([...batch.tokens].filter((_, i) => batch.tokenMasks[i]));
    expect([...moved].every((r) => used.has(r))).toBe(true);
    expect([...real].every((r) => moved.has(r))).toBe(true);
    state.dispose();
    base.dispose();
  });
});
