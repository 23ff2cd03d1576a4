/**
 * Gradient accumulation by the memory planner (issue 34): a fine-tune whose step at batch_size
 * does not fit runs each step as micro-batches summed into one optimizer step.
 *
 * - The trainer (kernels/trainer.ts forwardBackwardParts) on the real tiny pi0.5, LoRA: a batch
 *   of 5 as parts 2 + 2 + 1 (and 3 + 2, with training-time RTC, whose delays are drawn after the
 *   noise) gives the whole batch's loss, losses per datum, denominator and every gradient to
 *   float32 rounding, and leaves the generator where one call on the whole batch leaves it.
 * - Through the real server: with VELA_MAX_MEMORY set so that the plan of a step of 8 and of 4
 *   does not fit and of 2 does, POST /v1/fine-tunes is accepted (a 507 before), its events name
 *   micro-batch 2 and why, and its loss at step 1 equals that of the same job (same seed, so the
 *   same datums, noise and time) run with micro_batch_size 8 under a big cap.
 *
 * Bounds (test/helpers/float32.ts): a datum's loss is the same computation in a pass of another
 * batch size (kernels may block it otherwise): passBound(K) relative, K the longest reduction of
 * a pass (attention over the 1 camera's patches + prompt + chunk, or an MLP); the batch's loss is
 * a weighted mean of those. A weight gradient sums datums x tokens: split, the same terms in
 * another order, passBound(B K) of each tensor's largest entry.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { estimateMemory } from '../kernels/pi/memory.ts';
import { fakeRealPiBatch } from '../kernels/pi/fake.ts';
import type { RealPiBatch } from '../kernels/pi/model.ts';
import { OPENPI_LORA, realPiPolicy } from '../kernels/pi/policy.ts';
import type { RealPiConfig } from '../kernels/pi/config.ts';
import { BaseWeights, TrainingState } from '../kernels/trainer.ts';
import { microBatchCandidates, planPresetFineTune } from '../server/jobs/base.ts';
import { makeConfig } from '../kernels/small/config.ts';
import { estimatePassMemory } from '../kernels/small/memory.ts';
import { parseFineTuneConfig } from '../server/jobs/config.ts';
import { passBound } from './helpers/float32.ts';
import { g1Subset } from '../bench/harness/g1.ts';
import { tinyRealConfig, writeTinyBase } from './helpers/real-pi-base.ts';
import { api, startTestServer, type TestServer } from './helpers/server.ts';
import { useBestBackend } from './helpers/tf.ts';

/** max |a - b| over max |b|. */
function maxRel(a: ArrayLike<number>, b: ArrayLike<number>): number {
  expect(a.length).toBe(b.length);
  let d = 0;
  let s = 0;
  for (let i = 0; i < a.length; i++) {
    d = Math.max(d, Math.abs(a[i]! - b[i]!));
    s = Math.max(s, Math.abs(b[i]!));
  }
  return s > 0 ? d / s : d;
}

/** Datums [from, to) of a RealPiBatch (every field is laid out datum-major). */
function slice(b: RealPiBatch, from: number, to: number): RealPiBatch {
  const part = <T extends ArrayLike<number> & { slice(a: number, z: number): T }>(a: T): T => {
    const per = a.length / b.size;
    return a.slice(from * per, to * per);
  };
  return { ...b, size: to - from, images: part(b.images), imageMasks: part(b.imageMasks as number[]), tokens: part(b.tokens), tokenMasks: part(b.tokenMasks as number[]), state: part(b.state!), actions: part(b.actions!), ...(b.weight ? { weight: part(b.weight) } : {}) };
}

/** a then b as one batch. */
function concat(a: RealPiBatch, b: RealPiBatch): RealPiBatch {
  const cat = <T extends Float32Array | Int32Array>(x: T, y: T): T => {
    const out = new (x.constructor as new (n: number) => T)(x.length + y.length);
    out.set(x);
    out.set(y, x.length);
    return out;
  };
  return {
    ...a, size: a.size + b.size, images: cat(a.images, b.images), imageMasks: [...Array.from(a.imageMasks), ...Array.from(b.imageMasks)], tokens: cat(a.tokens, b.tokens),
    tokenMasks: [...Array.from(a.tokenMasks), ...Array.from(b.tokenMasks)], state: cat(a.state!, b.state!), actions: cat(a.actions!, b.actions!),
  };
}

/** The longest reduction of one pass with `cameras` cameras: attention over patches + prompt + chunk, or an MLP. */
function longestReduction(c: RealPiConfig, cameras: number): number {
  const seq = cameras * (c.vision.imageSize / c.vision.patchSize) ** 2 + c.maxTokenLen + c.actionHorizon + 1;
  return Math.max(seq, c.vlm.mlpDim, c.expert.mlpDim, c.vision.mlpDim);
}

it('micro-batch candidates: the batch, then its divisors and the powers of two below it, largest first', () => {
  expect(microBatchCandidates(8)).toEqual([8, 4, 2, 1]);
  expect(microBatchCandidates(12)).toEqual([12, 8, 6, 4, 3, 2, 1]);
  expect(microBatchCandidates(1)).toEqual([1]);
  // micro_batch_size: optional, 1..batch_size.
  expect(parseFineTuneConfig({ dataset_name: 'd', batch_size: 8 }).micro_batch_size).toBeNull();
  expect(parseFineTuneConfig({ dataset_name: 'd', batch_size: 8, micro_batch_size: 2 }).micro_batch_size).toBe(2);
  for (const bad of [0, 9, 2.5, 'x']) expect(() => parseFineTuneConfig({ dataset_name: 'd', batch_size: 8, micro_batch_size: bad }), String(bad)).toThrow(/^micro_batch_size must be an integer in 1\.\.8/);
});

it('the presets\' job plan chooses micro-batches too: the largest that fits the cap, refused only below 1', async () => {
  const c = makeConfig('flow0-tiny');
  const pass = (m: number) => estimatePassMemory(c, m, 1).totalBytes;
  const cfg = parseFineTuneConfig({ model: 'flow0-tiny', dataset_name: 'd', batch_size: 16, cameras: ['cam_high'] });
  // Between a pass of 4 and one of 8 (~29 MB a datum: a margin of ~58 MB for the RSS to move).
  const cap = String(Math.round(process.memoryUsage.rss() + (pass(4) + pass(8)) / 2));
  const note = await planPresetFineTune(cfg, { maxMemory: cap });
  expect(note.micro_batch_size).toBe(4);
  expect(cfg.memory_plan).toEqual(note);
  expect(note.reason).toMatch(/^batch_size 16 at once does not fit \(needs about .*\); a pass of 4 needs about/);
  await expect(planPresetFineTune({ ...cfg, micro_batch_size: 16 }, { maxMemory: cap })).rejects.toThrow(/^a fine-tune of flow0-tiny at batch_size 16 needs about .*lower micro_batch_size \(or leave it out: the plan chooses one that fits\)/);
  await expect(planPresetFineTune(cfg, { maxMemory: '1MiB' })).rejects.toThrow(/^a fine-tune of flow0-tiny at batch_size 16 in micro-batches of 1 needs about /);
});

describe('the trainer: a batch in micro-batches equals it whole (real tiny pi0.5, LoRA)', () => {
  const c = tinyRealConfig('pi05');
  let base: BaseWeights<RealPiBatch, RealPiConfig>;
  // 5 datums: two fake batches of 2 (other action scales) and one more datum.
  let whole: RealPiBatch;
  beforeAll(() => {
    useBestBackend();
    base = BaseWeights.create(realPiPolicy(c));
    const a = fakeRealPiBatch(c, 12, 0.5);
    // Unequal weights: the batch's loss is sum w_i loss_i / sum w_i over all of it, not a mean of the parts'.
    whole = { ...concat(concat(a, fakeRealPiBatch(c, 12, 1)), slice(fakeRealPiBatch(c, 12, 2), 1, 2)), weight: Float32Array.from([1, 2, 0.5, 1, 3]) };
  });
  afterAll(() => base.dispose());

  it.each([
    ['2 + 2 + 1', [0, 2, 4, 5], 0],
    ['3 + 2, with training-time RTC', [0, 3, 5], 3],
  ] as const)('parts %s: loss, losses per datum, D and every gradient; the generator after', (_name, cuts, rtcMaxDelay) => {
    const K = longestReduction(c, 3);
    const opts = { finetune: 'lora' as const, ...OPENPI_LORA, seed: 7, rtcMaxDelay };
    const one = new TrainingState(base, opts);
    const split = new TrainingState(base, opts);
    try {
      const w = one.forwardBackward(whole);
      const parts = cuts.slice(1).map((to, k) => slice(whole, cuts[k]!, to));
      const s = split.forwardBackwardParts(parts);
      expect(split.pendingGradients).toBe(parts.length);
      expect(maxRel(s.lossPerDatum, w.lossPerDatum)).toBeLessThanOrEqual(passBound(K));
      expect(Math.abs(s.loss - w.loss)).toBeLessThanOrEqual(passBound(K) * Math.abs(w.loss));
      const gw = one.accumulatedGradients();
      const gs = split.accumulatedGradients();
      expect(gs.denominator).toBe(gw.denominator);
      expect([...gs.grads.keys()].sort()).toEqual([...gw.grads.keys()].sort());
      for (const [name, g] of gw.grads) expect(maxRel(gs.grads.get(name)!, g), name).toBeLessThanOrEqual(passBound(whole.size * K));
      // The next draw is the same: the split drew what one call would, in the same order.
      expect(split.forward(slice(whole, 0, 1)).noise).toEqual(one.forward(slice(whole, 0, 1)).noise);
    } finally {
      one.dispose();
      split.dispose();
    }
  });
});

describe('through the real server: a batch the plan cannot hold at once runs in micro-batches', () => {
  const g1 = g1Subset(2);
  // A 400-token prompt: ~118 MiB of activations per datum in the plan, so the caps below leave
  // a margin of ~118 MiB either side for this process's RSS to move between start and submission.
  const c = tinyRealConfig('pi05', { maxTokenLen: 400 });
  const plan = (batch: number) => estimateMemory(c, { use: 'lora', batch, cameras: 1, loraRank: 16, loraActionRank: 32, loraTargets: ['all'] }).totalBytes;
  const body = { model: 'pi05', dataset_name: g1.name, cameras: ['cam_high'], batch_size: 8, steps: 1, eval_fraction: 0, seed: 5, learning_rate: 1e-3 };
  let base = '';
  let tight: TestServer;
  let roomy: TestServer;
  beforeAll(async () => {
    base = await writeTinyBase('pi05', { config: c });
    // Between a step of 2 and one of 4 (and 8): only micro-batches of 2 (or 1) fit.
    const cap = Math.round(process.memoryUsage.rss() + (plan(2) + plan(4)) / 2);
    tight = await startTestServer({ env: { VELA_MAX_MEMORY: String(cap), VELA_DATASETS_DIR: g1.root } });
    roomy = await startTestServer({ env: { VELA_MAX_MEMORY: '20GiB', VELA_DATASETS_DIR: g1.root } });
  });
  afterAll(async () => {
    await tight?.close();
    await roomy?.close();
    fs.rmSync(path.dirname(base), { recursive: true, force: true });
  });

  const finished = async (server: TestServer, id: string) => {
    for (const deadline = Date.now() + 300_000; Date.now() < deadline; await new Promise((r) => setTimeout(r, 200))) {
      const { json } = await api(server, 'GET', `/v1/fine-tunes/${id}`);
      if (['succeeded', 'failed', 'cancelled'].includes(json.status)) return json;
    }
    throw new Error(`job ${id} did not finish`);
  };
  const events = async (server: TestServer, id: string): Promise<Record<string, any>[]> => (await api(server, 'GET', `/v1/fine-tunes/${id}/events`)).json.data;

  it('is accepted (not a 507), its events name micro-batch 2 and why, and its step-1 loss is the whole batch\'s', { timeout: 600_000 }, async () => {
    // Forced whole where it does not fit: refused, naming the batch.
    const forced = await api(tight, 'POST', '/v1/fine-tunes', { ...body, base, micro_batch_size: 8 });
    expect(forced.status).toBe(507);
    expect(forced.json.error).toMatch(/^a LoRA fine-tune of pi05 \(.*\) at batch_size 8 needs about /);

    const created = await api(tight, 'POST', '/v1/fine-tunes', { ...body, base });
    expect(created.status, JSON.stringify(created.json)).toBe(200);
    expect(created.json.micro_batch_size).toBeNull();
    expect(created.json.memory_plan.micro_batch_size).toBe(2);
    expect(created.json.memory_plan.reason).toMatch(/^batch_size 8 at once does not fit \(needs about .*\); a pass of 2 needs about [\d.]+ MB of [\d.]+ MB available$/);
    const done = await finished(tight, created.json.id);
    expect(done.status, done.error).toBe('succeeded');
    const ev = await events(tight, created.json.id);
    const start = ev.find((e) => e.type === 'log' && e.stage === 'training')!;
    expect(start.micro_batch_size).toBe(2);
    expect(start.message).toMatch(/batch 8 in 4 micro-batches of 2 \(gradients summed into one optimizer step\); micro-batch 2 by the memory plan: batch_size 8 at once does not fit/);
    const splitStep = ev.find((e) => e.type === 'progress' && e.step === 1)!;
    const split = splitStep.loss as number;

    const ref = await api(roomy, 'POST', '/v1/fine-tunes', { ...body, base, micro_batch_size: 8 });
    expect(ref.status, JSON.stringify(ref.json)).toBe(200);
    expect(ref.json.memory_plan.reason).toMatch(/^micro_batch_size 8 as requested/);
    const refDone = await finished(roomy, ref.json.id);
    expect(refDone.status, refDone.error).toBe('succeeded');
    const refEv = await events(roomy, ref.json.id);
    expect(refEv.find((e) => e.type === 'log' && e.stage === 'training')!.micro_batch_size).toBe(8);
    const wholeStep = refEv.find((e) => e.type === 'progress' && e.step === 1)!;
    const whole = wholeStep.loss as number;
    console.log(`step-1 loss: micro-batches of 2 ${split}, whole batch of 8 ${whole}, |diff| ${Math.abs(split - whole)}, bound ${passBound(longestReduction(c, 1)) * whole}`);
    expect(split).toBeGreaterThan(0);
    expect(Math.abs(split - whole)).toBeLessThanOrEqual(passBound(longestReduction(c, 1)) * Math.abs(whole));
    // The gradient summed over the micro-batches is the whole batch's: its norm (before clipping) too.
    console.log(`step-1 grad_norm: micro-batches ${splitStep.grad_norm}, whole ${wholeStep.grad_norm}`);
    expect(Math.abs(splitStep.grad_norm - wholeStep.grad_norm)).toBeLessThanOrEqual(passBound(8 * longestReduction(c, 1)) * wholeStep.grad_norm);
  });
});
