/**
 * Memory planning (kernels/pi/memory.ts, server/models/memory.ts): the estimate against
 * TF.js's measured peak on the tiny real configs and a mid-size one (wasm, one thread:
 * tf.profile's peakBytes, the most tensor bytes alive at once), against the full-size bench,
 * and the machine probe and refusal message.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import * as tf from '@tensorflow/tfjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeRealPiConfig, REAL_PI05, REAL_PI_TINY_PI0, REAL_PI_TINY_PI05, type RealPiConfig } from '../kernels/pi/config.ts';
import { estimateMemory, loraParamCount, passTokens, type MemoryPlan } from '../kernels/pi/memory.ts';
import type { RealPiBatch } from '../kernels/pi/model.ts';
import { realPiPolicy } from '../kernels/pi/policy.ts';
import { BaseWeights, TrainingState } from '../kernels/trainer.ts';
import { availableMemory, checkFits, parseBytes, type AvailableMemory } from '../server/models/memory.ts';
import { useBackend, useBestBackend, withGraphs } from './helpers/tf.ts';
import { makeConfig } from '../kernels/small/config.ts';
import { fakeBatch } from '../kernels/small/batch.ts';
import { estimatePassMemory, estimateSampleMemory } from '../kernels/small/memory.ts';

const GiB = 2 ** 30;

/** b datums of nc cameras and L prompt tokens, every camera and token present. */
function batch(c: RealPiConfig, b: number, nc: number, L: number): RealPiBatch {
  const S = c.vision.imageSize;
  return {
    size: b, numCameras: nc, images: new Float32Array(b * nc * 3 * S * S).map((_, i) => Math.sin(i * 0.37)), imageMasks: new Array(b * nc).fill(1),
    tokens: Int32Array.from({ length: b * L }, (_, i) => (i * 7919 + 2) % c.vlm.vocabSize), tokenMasks: new Array(b * L).fill(1),
    state: new Float32Array(b * c.stateDim).map((_, i) => Math.cos(i)), actions: new Float32Array(b * c.actionHorizon * c.actionDim).map((_, i) => Math.sin(i * 0.1)),
  };
}

/** The real models' width ratios at a CPU-test size: VLM MLP 8x, expert 4x, vision 3.7x. */
const MID = (variant: 'pi0' | 'pi05', depth = 2) => makeRealPiConfig({
  variant, vlm: { width: 256, depth, mlpDim: 2048, numHeads: 8, numKvHeads: 1, headDim: 32, vocabSize: 1024 },
  expert: { width: 128, depth, mlpDim: 512, numHeads: 8, numKvHeads: 1, headDim: 32 },
  vision: { width: 144, depth: 2, mlpDim: 536, numHeads: 4, patchSize: 14, imageSize: 112 }, actionDim: 32, actionHorizon: 20, maxTokenLen: 64, numSteps: 3,
});

interface Measured { name: string; peak: number; est: number; weights: number }

/**
 * Peak tensor bytes of serve (sample), lora and full (forward_backward + optim_step) steps, and the
 * estimates; `remat` false: training passes taped whole (VELA_CHECKPOINT=off) and planned so.
 */
async function measure(c: RealPiConfig, name: string, cases: [MemoryPlan['use'], number, number, number][], remat = true): Promise<Measured[]> {
  const base = BaseWeights.create(realPiPolicy(c));
  const out: Measured[] = [];
  const before = process.env.VELA_CHECKPOINT;
  if (!remat) process.env.VELA_CHECKPOINT = 'off';
  try {
    for (const [use, b, nc, L] of cases) {
      // openpi's LoRA ranks (16 on the VLM, 32 on the expert); a served checkpoint is LoRA too.
      const st = new TrainingState(base, { finetune: use === 'full' ? 'full' : 'lora', rank: 16, actionRank: 32, alpha: 16, actionAlpha: 32 });
      const bt = batch(c, b, nc, L);
      const prof = use === 'serve' ? await tf.profile(() => void st.sample(bt, { numSteps: 3 })) : await tf.profile(() => void (st.forwardBackward(bt), st.optimStep()));
      st.dispose();
      const est = estimateMemory(c, { use, batch: b, cameras: nc, promptTokens: L, ...(use === 'full' ? {} : { loraRank: 16, loraActionRank: 32 }) });
      out.push({ name: `${name} ${use} b${b} nc${nc} L${L}${remat || use === 'serve' ? '' : ' taped'}`, peak: prof.peakBytes, est: est.tensorBytes, weights: est.parts.weights });
    }
  } finally {
    if (before === undefined) delete process.env.VELA_CHECKPOINT;
    else process.env.VELA_CHECKPOINT = before;
    base.dispose();
  }
  return out;
}

describe('estimateMemory against the measured peak of tensor bytes', () => {
  let rows: Measured[] = [];
  beforeAll(async () => {
    await useBackend('wasm');
    const grid = (L: number): [MemoryPlan['use'], number, number, number][] =>
      (['serve', 'lora', 'full'] as const).flatMap((use) => [[use, 1, 1, 12], [use, 1, 3, L], [use, 4, 3, L]] as [MemoryPlan['use'], number, number, number][]);
    rows = [
      ...(await measure(REAL_PI_TINY_PI0, 'tiny pi0', grid(48))),
      ...(await measure(REAL_PI_TINY_PI05, 'tiny pi05', grid(200))),
      ...(await measure(MID('pi05'), 'mid pi05', [['serve', 2, 2, 64], ['lora', 1, 3, 64], ['full', 1, 1, 16]])),
      // Rematerialised (the default) at depth 4 and two batch sizes: the block inputs grow with depth and batch.
      ...(await measure(MID('pi05', 4), 'mid4 pi05', [['lora', 1, 3, 64], ['lora', 2, 3, 64]])),
      // Taped whole (VELA_CHECKPOINT=off): the plan counts every layer's tape.
      ...(await measure(REAL_PI_TINY_PI05, 'tiny pi05', [['lora', 1, 3, 200], ['full', 1, 3, 200]], false)),
      ...(await measure(MID('pi05'), 'mid pi05', [['lora', 1, 3, 64]], false)),
    ];
  }, 360_000);

  it('is within 0.85x..1.25x of the peak, and 0.6x..1.35x above the weights, for serve, LoRA and full at batch 1 and 4, rematerialised or taped', () => {
    const table = rows.map((r) => `${r.name}: peak ${(r.peak / 1e6).toFixed(1)} MB, estimate ${(r.est / 1e6).toFixed(1)} MB (${(r.est / r.peak).toFixed(2)}x; above weights ${((r.est - r.weights) / (r.peak - r.weights)).toFixed(2)}x)`).join('\n');
    console.log(table);
    expect(rows).toHaveLength(26);
    for (const r of rows) {
      expect(r.est / r.peak, table).toBeGreaterThanOrEqual(0.85);
      expect(r.est / r.peak, table).toBeLessThanOrEqual(1.25);
      expect((r.est - r.weights) / (r.peak - r.weights), table).toBeGreaterThanOrEqual(0.6);
      expect((r.est - r.weights) / (r.peak - r.weights), table).toBeLessThanOrEqual(1.35);
    }
    // What the parts say is really there: a full fine-tune peaks above 4x the weights, LoRA near 1x at batch 1.
    const full = rows.find((r) => r.name === 'tiny pi0 full b1 nc1 L12')!;
    expect(full.peak / full.weights).toBeGreaterThan(4);
    const lora = rows.find((r) => r.name === 'tiny pi0 lora b1 nc1 L12')!;
    expect(lora.peak / lora.weights).toBeLessThan(1.5);
  });
});

describe('estimateSampleMemory (small presets) against the measured peak of tensor bytes', () => {
  it('is within 0.85x..1.25x of what an eager sample holds above the weights, prefix checkpointed or not, at any num_steps', async () => {
    await useBestBackend();
    const rows: string[] = [];
    const ratios: number[] = [];
    // [preset, batch, num_steps]: flow0-tiny at 32 datums checkpoints its prefix (b p w > 500,000).
    for (const [preset, b, n] of [['flow0-tiny', 1, 2], ['flow0-tiny', 4, 2], ['flow0-tiny', 4, 40], ['flow0-tiny', 32, 2], ['flow05-tiny', 1, 2], ['flow05-tiny', 8, 2]] as const) {
      const c = makeConfig(preset);
      const base = BaseWeights.create(c, 0);
      const st = new TrainingState(base, { finetune: 'lora', rank: 8, seed: 1 });
      const bt = fakeBatch(c, b, 3);
      const before = tf.memory().numBytes;
      const prof = await withGraphs(false, () => tf.profile(() => void st.sample(bt, { numSteps: n, seed: 1 })));
      st.dispose();
      base.dispose();
      const est = estimateSampleMemory(c, b).totalBytes;
      ratios.push(est / (prof.peakBytes - before));
      rows.push(`${preset} b${b} ${n} steps: held ${((prof.peakBytes - before) / 1e6).toFixed(1)} MB, estimate ${(est / 1e6).toFixed(1)} MB`);
    }
    for (const r of ratios) {
      expect(r, rows.join('\n')).toBeGreaterThanOrEqual(0.85);
      expect(r, rows.join('\n')).toBeLessThanOrEqual(1.25);
    }
    // num_steps costs no memory: 40 steps hold what 2 do (within one step's activations, 2%).
    expect(Math.abs(ratios[2]! / ratios[1]! - 1), rows.join('\n')).toBeLessThan(0.02);
  }, 120_000);

  it('estimatePassMemory is within 0.85x..1.25x of what an eager forward_backward holds above the weights, checkpointed or not', async () => {
    await useBestBackend();
    const rows: string[] = [];
    const ratios: number[] = [];
    // flow0-tiny checkpoints its prefix from 26 datums (b p w > 500,000), flow05-tiny from 21.
    for (const [preset, b] of [['flow0-tiny', 2], ['flow0-tiny', 8], ['flow0-tiny', 32], ['flow05-tiny', 4], ['flow05-tiny', 24]] as const) {
      const c = makeConfig(preset);
      const base = BaseWeights.create(c, 0);
      const st = new TrainingState(base, { finetune: 'lora', rank: 8, seed: 1 });
      const bt = fakeBatch(c, b, 3);
      const before = tf.memory().numBytes;
      const prof = await withGraphs(false, () => tf.profile(() => void st.forwardBackward(bt)));
      st.dispose();
      base.dispose();
      const est = estimatePassMemory(c, b).totalBytes;
      ratios.push(est / (prof.peakBytes - before));
      rows.push(`${preset} b${b}: held ${((prof.peakBytes - before) / 1e6).toFixed(1)} MB, estimate ${(est / 1e6).toFixed(1)} MB`);
    }
    for (const r of ratios) {
      expect(r, rows.join('\n')).toBeGreaterThanOrEqual(0.85);
      expect(r, rows.join('\n')).toBeLessThanOrEqual(1.25);
    }
  }, 120_000);
});

describe('estimateMemory: the parts', () => {
  it('counts LoRA adapters as the trainer does (openpi ranks 16 / 32) and per tenant', () => {
    const st = new TrainingState(BaseWeights.create(realPiPolicy(REAL_PI_TINY_PI05)), { rank: 16, actionRank: 32 });
    expect(loraParamCount(REAL_PI_TINY_PI05)).toBe(st.trainableParamCount);
    st.dispose();
    const one = estimateMemory(REAL_PI05, { use: 'lora', batch: 1, cameras: 3 });
    const three = estimateMemory(REAL_PI05, { use: 'lora', batch: 1, cameras: 3, tenants: 3 });
    expect(one.parts.trainable).toBe(loraParamCount(REAL_PI05) * 4);
    expect(three.parts.trainable).toBe(3 * one.parts.trainable);
    expect(three.parts.optimizer).toBe(3 * one.parts.optimizer);
    expect(three.parts.weights).toBe(one.parts.weights); // one shared base
    expect(three.parts.activations).toBe(one.parts.activations); // one step at a time
    // The expert alone: 18 layers x rank 32 x (q 1024+2048, k and v 1024+256, o 2048+1024, gate and up 1024+4096, down 4096+1024),
    // and the projections LoRA trains in full: action in 32x1024+1024, out 1024x32+32, time MLP 2 x (1024x1024+1024).
    expect(estimateMemory(REAL_PI05, { use: 'lora', batch: 1, cameras: 3, loraTargets: ['action_expert'] }).parts.trainable).toBe((18 * 32 * 24064 + 2_165_792) * 4);
  });

  it('full size: serve matches the bench (pi0.5, 1.13x its float32 weights peak RSS); LoRA at batch 1 fits 23.5 GiB rematerialised, not taped; full does not', () => {
    expect(passTokens(REAL_PI05, 3)).toEqual({ p: 968, s: 50, n: 1018 });
    const serve = estimateMemory(REAL_PI05, { use: 'serve', batch: 1, cameras: 3 });
    expect(serve.parts.weights).toBe(13_413_735_488);
    expect(serve.totalBytes / serve.parts.weights).toBeGreaterThan(1.08);
    expect(serve.totalBytes / serve.parts.weights).toBeLessThan(1.25);
    const lora = estimateMemory(REAL_PI05, { use: 'lora', batch: 1, cameras: 3, remat: true });
    expect(lora.totalBytes).toBeLessThan(23.5 * GiB);
    const taped = estimateMemory(REAL_PI05, { use: 'lora', batch: 1, cameras: 3, remat: false });
    expect(taped.totalBytes).toBeGreaterThan(23.5 * GiB);
    // What rematerialisation keeps: the residual streams of 18 layers, 968 x 2048 + 50 x 1024 floats each, 4 copies.
    expect(lora.parts.activations).toBeGreaterThan(18 * (968 * 2048 + 50 * 1024) * 4 * 4);
    expect(lora.parts.activations).toBeLessThan(taped.parts.activations / 5);
    const full = estimateMemory(REAL_PI05, { use: 'full', batch: 1, cameras: 3 });
    expect(full.totalBytes).toBeGreaterThan(23.5 * GiB);
    expect(full.parts.trainable + full.parts.optimizer + full.parts.gradients).toBe(4 * full.parts.weights);
    expect(estimateMemory(REAL_PI05, { use: 'full', batch: 1, cameras: 3, freezeEmbedding: true }).parts.trainable).toBe(full.parts.trainable - 257152 * 2048 * 4);
  });

  it('refuses a plan that is not one', () => {
    expect(() => estimateMemory(REAL_PI05, { use: 'lora', batch: 0, cameras: 3 })).toThrow('batch is 0; it must be an integer >= 1');
    expect(() => estimateMemory(REAL_PI05, { use: 'train' as 'lora', batch: 1, cameras: 3 })).toThrow('use is "train"; expected serve, lora or full');
  });
});

describe('availableMemory and checkFits', () => {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-cgroup-'));
  afterAll(() => fs.rmSync(root, { recursive: true, force: true }));
  const cg = (files: Record<string, string>): string => {
    const dir = fs.mkdtempSync(path.join(root, 'cg-'));
    for (const [f, text] of Object.entries(files)) {
      fs.mkdirSync(path.dirname(path.join(dir, f)), { recursive: true });
      fs.writeFileSync(path.join(dir, f), text);
    }
    return dir;
  };
  const machine = { totalMemBytes: 64 * GiB, rssBytes: 1 * GiB };

  it('takes the cgroup v2 limit of the process\'s group, v1\'s, else the machine\'s memory, capped by VELA_MAX_MEMORY, less the RSS', async () => {
    const v2 = cg({ 'system.slice/vela.service/memory.max': `${8 * GiB}\n`, 'memory.max': 'max\n' });
    expect(await availableMemory({ ...machine, cgroupRoot: v2, procSelfCgroup: '0::/system.slice/vela.service\n', maxMemory: undefined })).toEqual({
      bytes: 7 * GiB, limitBytes: 8 * GiB, rssBytes: GiB, machineAvailableBytes: Infinity, source: 'cgroup v2 memory.max', capName: 'VELA_MAX_MEMORY',
    });
    // Other processes hold most of the machine: what it can still give bounds the answer, and the refusal says why.
    const busy = await availableMemory({ ...machine, cgroupRoot: v2, procSelfCgroup: '0::/system.slice/vela.service\n', maxMemory: undefined, machineAvailableBytes: 2 * GiB });
    expect(busy).toMatchObject({ bytes: 2 * GiB, limitBytes: 8 * GiB });
    expect(checkFits(estimateMemory(REAL_PI05, { use: 'serve', batch: 1, cameras: 1 }), busy, 'serving pi05')).toMatch(/is available \(cgroup v2 memory\.max .* in use; other processes hold the rest of the machine\): /);
    const v1 = cg({ 'memory/memory.limit_in_bytes': `${12 * GiB}` });
    expect(await availableMemory({ ...machine, cgroupRoot: v1, procSelfCgroup: '5:memory:/\n', maxMemory: undefined })).toMatchObject({ limitBytes: 12 * GiB, source: 'cgroup v1 memory.limit_in_bytes' });
    const none = cg({ 'memory.max': 'max', 'memory/memory.limit_in_bytes': '9223372036854771712' });
    const free = await availableMemory({ ...machine, cgroupRoot: none, procSelfCgroup: '0::/\n', maxMemory: undefined });
    expect(free).toMatchObject({ bytes: 63 * GiB, limitBytes: 64 * GiB, source: 'the machine\'s memory' });
    expect(await availableMemory({ ...machine, cgroupRoot: v2, procSelfCgroup: '0::/system.slice/vela.service', maxMemory: '4GiB', capName: '--max-memory' })).toMatchObject({ bytes: 3 * GiB, source: '--max-memory' });
    process.env.VELA_MAX_MEMORY = '6g';
    try {
      expect(await availableMemory({ ...machine, cgroupRoot: none })).toMatchObject({ limitBytes: 6 * GiB, source: 'VELA_MAX_MEMORY' });
      process.env.VELA_MAX_MEMORY = '6 gigs';
      await expect(availableMemory({ ...machine, cgroupRoot: none })).rejects.toThrow('VELA_MAX_MEMORY is "6 gigs"; expected bytes with a unit, e.g. 8GiB, 512MiB, 16GB');
    } finally {
      delete process.env.VELA_MAX_MEMORY;
    }
    // This process, for real: some memory, less than the machine has.
    const here = await availableMemory({ maxMemory: undefined });
    expect(here.rssBytes).toBeGreaterThan(10e6);
    expect(here.machineAvailableBytes).toBeGreaterThan(0);
    expect(here.bytes).toBeLessThanOrEqual(here.machineAvailableBytes);
    expect(here.limitBytes).toBeLessThanOrEqual(os.totalmem());
  });

  it('parses sizes as operators write them', () => {
    expect(parseBytes('8GiB', 'x')).toBe(8 * GiB);
    expect(parseBytes('16GB', 'x')).toBe(16e9);
    expect(parseBytes('512MiB', 'x')).toBe(512 * 2 ** 20);
    expect(parseBytes('1.5g', 'x')).toBe(1.5 * GiB);
    expect(parseBytes('1000000', 'x')).toBe(1e6);
    expect(() => parseBytes('-1GiB', '--max-memory')).toThrow('--max-memory is "-1GiB"; expected bytes with a unit');
  });

  it('says null when it fits, else one line naming what, the estimate, what is available, and the fix', () => {
    const avail = (bytes: number, source = 'cgroup v2 memory.max'): AvailableMemory => ({ bytes: bytes - GiB, limitBytes: bytes, rssBytes: GiB, machineAvailableBytes: Infinity, source, capName: 'VELA_MAX_MEMORY' });
    const serve = estimateMemory(REAL_PI05, { use: 'serve', batch: 1, cameras: 3 });
    expect(checkFits(serve, avail(23.5 * GiB), 'pi05 (lerobot/pi05_base) for serving')).toBeNull();
    expect(checkFits(serve, avail(12 * GiB), 'pi05 (lerobot/pi05_base) for serving')).toBe(
      'pi05 (lerobot/pi05_base) for serving needs about 15.7 GB (14.61 GiB) (weights 13.4 GB (12.49 GiB), activations 1.2 GB (1.12 GiB)); ' +
        '11.8 GB (11.00 GiB) is available (cgroup v2 memory.max 12.9 GB (12.00 GiB) less 1.1 GB (1.00 GiB) in use): free memory or run on a machine with >= 17 GB',
    );
    const full = estimateMemory(REAL_PI05, { use: 'full', batch: 32, cameras: 3 });
    const msg = checkFits(full, avail(8 * GiB, 'VELA_MAX_MEMORY'), 'a full fine-tune of pi05 at batch_size 32')!;
    expect(msg).toMatch(/^a full fine-tune of pi05 at batch_size 32 needs about [\d.]+ GB \([\d.]+ GiB\) \(activations [\d.]+ GB \([\d.]+ GiB\), optimizer moments 26\.8 GB \(24\.99 GiB\)\); 7\.5 GB \(7\.00 GiB\) is available \(VELA_MAX_MEMORY 8\.6 GB \(8\.00 GiB\) less 1\.1 GB \(1\.00 GiB\) in use\): /);
    expect(msg).toMatch(/: use LoRA \(the default\) instead of a full fine-tune, or lower batch_size, or free memory or run on a machine with >= \d+ GB, or raise VELA_MAX_MEMORY \(now 8\.6 GB \(8\.00 GiB\)\)$/);
    // A LoRA step on a base already loaded (its weights not counted again): never "use LoRA", nor a lower batch at batch 1.
    const step = estimateMemory(REAL_PI05, { use: 'lora', batch: 1, cameras: 1 });
    const passOnly = { ...step, totalBytes: step.parts.activations + step.parts.workspace, parts: { ...step.parts, weights: 0, trainable: 0, optimizer: 0, gradients: 0 } };
    // (Rematerialised, its pass is ~2.6 GiB with the workspace: 2 GiB available do not hold it.)
    const lora = checkFits(passOnly, avail(3 * GiB), 'forward_backward of 1 datum(s)', { use: 'lora', batch: 1 })!;
    expect(lora).toMatch(/: free memory or run on a machine with >= \d+ GB$/);
    expect(msg).not.toContain('\n');
  });
});
