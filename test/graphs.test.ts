/**
 * The cached sampler and forward_backward as one TensorFlow graph call each (kernels/backend/graph.ts,
 * kernels/sample-graph.ts, kernels/step-graph.ts) answer what the eager passes answer, to float32
 * rounding, for batches other than the one they were traced with, for weights that changed since
 * (an optimizer step), for LoRA and base weights, and (sampling) for both model families; and a
 * computation that cannot be a graph is refused, not baked in.
 * Native TensorFlow only (graphs are its feature); CI always has it (kernels-backend.test.ts).
 */
import * as tf from '@tensorflow/tfjs';
import { beforeAll, describe, expect, it } from 'vitest';
import { NATIVE_PRESENT, useBackend, withGraphs } from './helpers/tf.ts';
import { passBound, relDiff, sampleBound } from './helpers/float32.ts';
import { GraphTraceError, traceGraph } from '../kernels/backend/graph.ts';
import { sampleGraphStats } from '../kernels/sample-graph.ts';
import { lossGraphStats } from '../kernels/step-graph.ts';
import { graphCacheStats, maxTraceOps } from '../kernels/graph-cache.ts';
import { makeConfig } from '../kernels/small/config.ts';
import { fakeBatch, type ModelBatch } from '../kernels/small/batch.ts';
import { BaseWeights, TrainingState, sampleActions } from '../kernels/trainer.ts';
import { Rng } from '../kernels/rng.ts';
import { REAL_PI_TINY_PI0, REAL_PI_TINY_PI05 } from '../kernels/pi/config.ts';
import { fakeRealPiBatch } from '../kernels/pi/fake.ts';
import { OPENPI_LORA, realPiPolicy } from '../kernels/pi/policy.ts';
import type { RealPiBatch } from '../kernels/pi/model.ts';


/** A batch of `size` with only the first `cams` camera slots filled. */
function smallBatch(preset: string, size: number, seed: number, cams: number): ModelBatch {
  const c = makeConfig(preset);
  const b = fakeBatch(c, size, seed);
  for (let i = 0; i < size; i++) for (let k = cams; k < c.slots; k++) b.imageMask[i * c.slots + k] = 0;
  return b;
}

/**
 * Euler steps of the sampling checks: the graph unrolls them, so tracing and loading it cost in
 * proportion. What is checked (one graph per layout and weight structure, weights read at each
 * call, graph = eager within sampleBound, which holds for any step count since sum |dt| = 1) does
 * not depend on how many; two steps still carry a step's error into the next.
 */
const STEPS = 2;

describe.runIf(NATIVE_PRESENT)('sampling as one TensorFlow graph', () => {
  beforeAll(async () => {
    await useBackend('node');
  });

  it.each(['flow05-tiny', 'flow0-tiny'])('%s: graph = eager for new batches, after an optimizer step, with LoRA', (preset) => {
    const c = makeConfig(preset);
    const base = BaseWeights.create(c, 3);
    const s = new TrainingState(base, { finetune: 'full', seed: 1 });
    const train = fakeBatch(c, 4, 9);
    s.forwardBackward(train);
    s.optimStep({ learningRate: 1e-2 }); // pi0.5's gates open: every path matters
    const before = sampleGraphStats();
    const a = smallBatch(preset, 1, 1, 1);
    const b = smallBatch(preset, 1, 2, 1);
    b.tokenMask.fill(1, 0, 5);
    const both = (batch: ModelBatch, seed: number) => ({ graph: withGraphs(true, () => s.sample(batch, { seed, numSteps: STEPS })), eager: withGraphs(false, () => s.sample(batch, { seed, numSteps: STEPS })) });
    // The longest reductions: the MLP's mlpDim terms (longer than any sequence of these presets).
    const bound = sampleBound(Math.max(c.mlpDim, c.slots * (c.imageSize / c.patch) ** 2 + c.maxTokenLen + c.horizon + 1));
    const ra = both(a, 5);
    const rb = both(b, 6);
    expect(relDiff(ra.graph, ra.eager)).toBeLessThan(bound);
    expect(relDiff(rb.graph, rb.eager)).toBeLessThan(bound);
    expect(relDiff(ra.eager, rb.eager)).toBeGreaterThan(1e-2); // the batches do differ
    const mid = sampleGraphStats();
    expect(mid.traces - before.traces).toBe(1); // one layout, one graph; b ran it
    expect(mid.runs - before.runs).toBe(2);

    // New weights are read at each call, not baked in.
    s.forwardBackward(train);
    s.optimStep({ learningRate: 1e-2 });
    const after = both(a, 5);
    expect(relDiff(after.graph, after.eager)).toBeLessThan(bound);
    expect(relDiff(after.eager, ra.eager)).toBeGreaterThan(2 * bound); // new weights move it past what rounding explains
    expect(sampleGraphStats().traces - before.traces).toBe(1);

    // Another camera layout is another graph; batch 2 too (one family is enough for this).
    const layouts = preset === 'flow05-tiny' ? 2 : 1;
    if (layouts === 2) {
      const three = both(smallBatch(preset, 2, 4, 3), 7);
      expect(relDiff(three.graph, three.eager)).toBeLessThan(bound);
    }
    expect(sampleGraphStats().traces - before.traces).toBe(layouts);

    // A LoRA session on the same base reads other tensors: a graph of its own, equal to eager.
    const lora = new TrainingState(base, { finetune: 'lora', rank: 4, seed: 2 });
    lora.forwardBackward(train);
    lora.optimStep({ learningRate: 1e-2 });
    const lg = withGraphs(true, () => lora.sample(a, { seed: 5, numSteps: STEPS }));
    const le = withGraphs(false, () => lora.sample(a, { seed: 5, numSteps: STEPS }));
    expect(relDiff(lg, le)).toBeLessThan(bound);
    expect(sampleGraphStats().traces - before.traces).toBe(layouts + 1);
    // The base served as it is (BaseWeights.view) reads the names a full fine-tune reads, with no
    // adapters: the full session's graph, fed the base's tensors.
    const view = base.view();
    const bg = withGraphs(true, () => sampleActions(base.policy, view, a, new Rng(5), { numSteps: STEPS }));
    const be = withGraphs(false, () => sampleActions(base.policy, view, a, new Rng(5), { numSteps: STEPS }));
    expect(relDiff(bg, be)).toBeLessThan(bound);
    expect(relDiff(bg, withGraphs(false, () => s.sample(a, { seed: 5, numSteps: STEPS })))).toBeGreaterThan(2 * bound);
    expect(sampleGraphStats().traces - before.traces).toBe(layouts + 1);
    for (const t of [s, lora]) t.dispose();
    base.dispose();
  });

  it.each([REAL_PI_TINY_PI05, REAL_PI_TINY_PI0])('real $variant tiny: graph = eager for batches with other prompts and cameras', (config) => {
    const policy = realPiPolicy(config);
    const base = BaseWeights.create(policy);
    const s = new TrainingState(base, { finetune: 'lora', ...OPENPI_LORA, seed: 3 });
    const train = fakeRealPiBatch(config, 12);
    s.forwardBackward(train);
    s.optimStep({ learningRate: 1e-2 });
    const before = sampleGraphStats();
    const a: RealPiBatch = fakeRealPiBatch(config, 12);
    const b: RealPiBatch = {
      ...a,
      images: a.images.map((x) => -x),
      imageMasks: [1, 1, 1, 0, 0, 1],
      tokens: a.tokens.map((t) => (t * 7 + 3) % config.vlm.vocabSize),
      tokenMasks: Array.from(a.tokenMasks, (_, i) => (i % 12 < 4 ? 1 : 0)),
      state: a.state!.map((x) => 0.5 - x),
    };
    // The longest reductions: attention over the whole sequence (cameras' patches, the prompt, the
    // chunk) or an MLP, whichever is longer.
    const seq = 3 * (config.vision.imageSize / config.vision.patchSize) ** 2 + config.maxTokenLen + config.actionHorizon + 1;
    const bound = sampleBound(Math.max(seq, config.vlm.mlpDim, config.expert.mlpDim, config.vision.mlpDim));
    const ga = withGraphs(true, () => s.sample(a, { seed: 1, numSteps: STEPS }));
    const ea = withGraphs(false, () => s.sample(a, { seed: 1, numSteps: STEPS }));
    const gb = withGraphs(true, () => s.sample(b, { seed: 1, numSteps: STEPS }));
    const eb = withGraphs(false, () => s.sample(b, { seed: 1, numSteps: STEPS }));
    expect(relDiff(ga, ea)).toBeLessThan(bound);
    expect(relDiff(gb, eb)).toBeLessThan(bound);
    expect(relDiff(ea, eb)).toBeGreaterThan(1e-3);
    expect(sampleGraphStats().traces - before.traces).toBe(1);
    // A shorter prompt (7 tokens, as toRealPiBatch trims padding) is padded to the same bucket:
    // the same graph, and the answer of the unpadded batch.
    const short: RealPiBatch = { ...a, tokens: Int32Array.from({ length: 14 }, (_, i) => a.tokens[Math.floor(i / 7) * 12 + (i % 7)]!), tokenMasks: new Array(14).fill(1) };
    const gs = withGraphs(true, () => s.sample(short, { seed: 1, numSteps: STEPS }));
    const es = withGraphs(false, () => s.sample(short, { seed: 1, numSteps: STEPS }));
    expect(relDiff(gs, es)).toBeLessThan(bound);
    expect(relDiff(es, ea)).toBeGreaterThan(2 * bound);
    expect(sampleGraphStats().traces - before.traces).toBe(1);
    s.dispose();
    base.dispose();
  });

  it.each(['flow05-tiny', 'flow0-tiny'])('%s: forward_backward as a graph gives the eager losses and gradients, step after step', (preset) => {
    const c = makeConfig(preset);
    const base = BaseWeights.create(c, 3);
    // The bound is float32 reassociation, derived, not fitted: a graph and eager TensorFlow may sum
    // the same products in another order (fused kernels, another CPU's SIMD width), and reordering
    // a float32 sum of K terms moves it by at most (K - 1) u sum|terms| (Higham's gamma), u = 2^-24.
    // The longest reductions of these models are the MLP's (mlpDim terms) forward and, backward,
    // a weight gradient's sum over the batch's tokens (b x sequence length <= 2 x mlpDim here), so
    // the loss is held to mlpDim u and the gradients to 2 mlpDim u of their scale. A batch or
    // weight baked into the graph would be off by O(1).
    const lossBound = passBound(c.mlpDim);
    const gradBound = passBound(2 * c.mlpDim);
    for (const finetune of ['full', 'lora'] as const) {
      // Two states in lockstep: each step, eager then graph forward_backward on the same weights
      // and noise, then one AdamW step whose result both carry on from (the graph state imports
      // the eager one's state), so each step compares one pass, never an accumulated divergence
      // (AdamW's sign-like update for a gradient that is rounding noise moves a weight by lr).
      const eagerState = new TrainingState(base, { finetune, rank: 4, seed: 1 });
      const graphState = new TrainingState(base, { finetune, rank: 4, seed: 1 });
      const before = sampleGraphStats();
      const lossBefore = lossGraphStats();
      const losses: { eager: number; graph: number }[] = [];
      // Three layouts' worth of batches: 1 camera b4 twice (a traced graph reused on new data and
      // new weights), then 2 cameras b2.
      for (const [size, cams, seed] of [[4, 1, 1], [4, 1, 2], [2, 2, 3]] as const) {
        const b = smallBatch(preset, size, seed, cams);
        b.tokenMask.fill(0, 3 + seed, c.maxTokenLen);
        const k = losses.length;
        const eager = withGraphs(false, () => {
          const loss = eagerState.forwardBackward(b).loss;
          return { loss, grads: eagerState.accumulatedGradients().grads };
        });
        const graph = withGraphs(true, () => {
          const loss = graphState.forwardBackward(b).loss;
          return { loss, grads: graphState.accumulatedGradients().grads };
        });
        losses.push({ eager: eager.loss, graph: graph.loss });
        expect(Math.abs(graph.loss - eager.loss), `${finetune} step ${k} loss`).toBeLessThan(lossBound * eager.loss);
        expect([...graph.grads.keys()].sort()).toEqual([...eager.grads.keys()].sort());
        for (const [name, g] of eager.grads) expect(relDiff(graph.grads.get(name)!, g), `${finetune} step ${k} ${name}`).toBeLessThan(gradBound);
        withGraphs(false, () => eagerState.optimStep({ learningRate: 1e-2 }));
        graphState.abortGradientEpoch();
        graphState.importState(eagerState.exportState());
      }
      expect(sampleGraphStats()).toEqual(before); // sampling graphs untouched
      expect(lossGraphStats().traces - lossBefore.traces).toBe(2); // two layouts
      expect(lossGraphStats().runs - lossBefore.runs).toBe(3);
      // The weights did move between steps (the graph saw new weights, not a replay).
      expect(Math.abs(losses[1]!.eager - losses[0]!.eager)).toBeGreaterThan(1e-3);
      eagerState.dispose();
      graphState.dispose();
    }
    base.dispose();
  });

  it('tenants of several weight structures taking turns keep their graphs (no retrace per turn)', () => {
    const c = makeConfig('flow0-tiny');
    const base = BaseWeights.create(c, 5);
    const states = [
      new TrainingState(base, { finetune: 'full', seed: 1 }),
      ...[[2, 4], [4, 4], [8, 16], [8, 8]].map(([rank, alpha]) => new TrainingState(base, { finetune: 'lora', rank, alpha, seed: 2 })),
    ];
    const b = smallBatch('flow0-tiny', 2, 6, 1);
    const s0 = sampleGraphStats();
    const l0 = lossGraphStats();
    for (let round = 0; round < 2; round++) {
      for (const s of states) {
        s.forwardBackward(b);
        s.optimStep({ learningRate: 1e-3 });
        s.sample(b, { seed: 1, numSteps: STEPS });
      }
    }
    // Five structures, one layout: five sampling graphs (the full session's is the base view's
    // structure) and five loss graphs (ranks differ in shape, alphas in scale), whatever the turns.
    expect(sampleGraphStats().traces - s0.traces).toBe(5);
    expect(lossGraphStats().traces - l0.traces).toBe(5);
    expect(lossGraphStats().runs - l0.runs).toBe(10);
    for (const s of states) s.dispose();
    base.dispose();
  });

  it('the caches hold graphs within VELA_GRAPH_CACHE_BYTES, and a computation past it stays eager', () => {
    const c = makeConfig('flow0-tiny');
    const base = BaseWeights.create(c, 5);
    const s = new TrainingState(base, { finetune: 'lora', rank: 4, alpha: 4, seed: 2 });
    const before = process.env.VELA_GRAPH_CACHE_BYTES;
    try {
      const one = smallBatch('flow0-tiny', 1, 6, 1);
      const eager = withGraphs(false, () => s.sample(one, { seed: 1, numSteps: 7 }));
      // 1 MiB is 51 ops' worth (GRAPH_BYTES_PER_OP 20 KiB): the trace stops there, nothing is kept.
      process.env.VELA_GRAPH_CACHE_BYTES = '1MiB';
      expect(maxTraceOps()).toBe(51);
      const s0 = sampleGraphStats();
      const got = s.sample(one, { seed: 1, numSteps: 7 });
      expect(sampleGraphStats().traces - s0.traces).toBe(0);
      expect(sampleGraphStats().refused - s0.refused).toBe(1);
      expect(relDiff(got, eager)).toBe(0);
      // Room for one 7-step graph (~2,600 ops, ~51 MiB), not two: adding one frees the earlier
      // graphs, and the next layout evicts it. The earlier tests' graphs are 2-step ones, small
      // enough that a few fit beside a 7-step one, so a 7-step graph of batch 4 goes first: the
      // batch-2 one then leaves room for nothing else, whatever those tests left.
      process.env.VELA_GRAPH_CACHE_BYTES = '80MiB';
      const two = smallBatch('flow0-tiny', 2, 6, 1);
      const four = smallBatch('flow0-tiny', 4, 6, 1);
      s.sample(four, { seed: 1, numSteps: 7 });
      s.sample(two, { seed: 1, numSteps: 7 });
      const first = graphCacheStats();
      expect(first.graphs).toBe(1);
      expect(first.bytes).toBeGreaterThan(40 * 2 ** 20);
      s.sample(four, { seed: 1, numSteps: 7 }); // evicted by the batch-2 graph: traced again
      const second = graphCacheStats();
      expect(second.graphs).toBe(1);
      expect(second.bytes).toBeLessThanOrEqual(80 * 2 ** 20);
      expect(sampleGraphStats().traces - s0.traces).toBe(3);
    } finally {
      if (before === undefined) delete process.env.VELA_GRAPH_CACHE_BYTES;
      else process.env.VELA_GRAPH_CACHE_BYTES = before;
      s.dispose();
      base.dispose();
    }
  });

  it('refuses what cannot be a graph instead of baking it in', () => {
    const x = tf.randomNormal([4, 4]);
    // A host read of a traced tensor inside the computation.
    expect(() => traceGraph((input) => [tf.mul(input(x), tf.scalar(tf.sum(tf.add(x, 1)).dataSync()[0]!))])).toThrow(GraphTraceError);
    // A weight-sized tensor read without being declared (a weight the caller forgot), and what
    // the refusals leave behind: nothing.
    const big = tf.zeros([64, 64]);
    const count = tf.memory().numTensors;
    expect(() => traceGraph((input) => [tf.sum(tf.add(tf.mul(big, 2), input(tf.scalar(1))))])).toThrow(/not declared as an input/);
    expect(tf.memory().numTensors).toBe(count);
    // A host array made into a tensor of over 2^20 values is refused as a constant.
    expect(() => traceGraph(() => [tf.sum(tf.tensor1d(new Float32Array((1 << 20) + 1)))])).toThrow(/declare it as an input/);
    // A host array given as an input that the computation never makes into a tensor (it copied it).
    const host = new Float32Array(16).fill(1);
    expect(() => traceGraph(() => [tf.add(x, tf.tensor2d(host.slice(), [4, 4]))], [host])).toThrow(/never became a tensor/);
    // And one that is: new host values give new answers.
    const { outputs, graph } = traceGraph((input) => [tf.add(input(x), tf.tensor2d(host, [4, 4]))], [host]);
    const [y] = graph.run([x], [new Float32Array(16).fill(3)]);
    for (const d of tf.sub(y!, x).dataSync()) expect(d).toBeCloseTo(3, 5);
    for (const d of tf.sub(outputs[0]!, x).dataSync()) expect(d).toBeCloseTo(1, 5);
    graph.dispose();
    expect(() => graph.run([x], [host])).toThrow(GraphTraceError);
    tf.dispose([x, big, y!, ...outputs]);
  });
});
