/**
 * Policy requests before training (server/engine/host.ts PriorityGate): a training engine holds
 * its next call while policy calls wait, releases it when they are done, and never holds longer
 * than the gate's maxHoldMs; the server serves policies from their own engine; training still
 * progresses while policy calls never stop; a policy batch is sampled in power-of-two parts,
 * each datum's actions the same as alone.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Engine, PriorityGate } from '../server/engine/host.ts';
import { powerOfTwoChunks } from '../server/engine/sample-chunks.ts';
import { fakeBatch } from '../kernels/small/batch.ts';
import { makeConfig } from '../kernels/small/config.ts';
import { TEST_BACKENDS } from './helpers/tf.ts';
import { startTestServer, type TestServer } from './helpers/server.ts';

const tick = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('PriorityGate', () => {
  it('is busy from enter until lingerMs after the last leave, then wakes its waiters', async () => {
    const gate = new PriorityGate(10_000, 30);
    expect(gate.busy).toBe(false);
    gate.enter();
    gate.enter();
    let woke = false;
    const w = gate.wait().then(() => (woke = true));
    gate.leave();
    await tick(60);
    expect(gate.busy).toBe(true); // one urgent call still pending
    expect(woke).toBe(false);
    gate.leave();
    expect(gate.busy).toBe(true); // lingering: a robot's next request comes right after its answer
    gate.enter(); // ...and it did: still busy, nobody woken
    gate.leave();
    await w;
    expect(woke).toBe(true);
    expect(gate.busy).toBe(false);
    expect(gate.held.calls).toBe(1);
  });

  it('never holds a waiter past maxHoldMs, even under endless urgent work', async () => {
    const gate = new PriorityGate(80, 20);
    gate.enter(); // never leaves
    const t0 = performance.now();
    await gate.wait();
    expect(performance.now() - t0).toBeGreaterThanOrEqual(75);
    expect(gate.busy).toBe(true);
    expect(gate.held.calls).toBe(1);
  });
});

describe('a training engine yields to policy calls', () => {
  let engine: Engine;
  const gate = new PriorityGate(1500, 10);
  beforeAll(async () => {
    engine = await Engine.start({ preset: 'flow0-tiny', backend: TEST_BACKENDS[0]!, priority: { gate, role: 'yield' } });
  });
  afterAll(() => engine?.close());

  it('holds its next call while the gate is busy and runs it once the gate is free', async () => {
    await engine.call('s', 'stats'); // idle gate: straight through
    gate.enter(); // a policy request is waiting
    let done = false;
    const call = engine.call('s', 'stats').then(() => (done = true));
    await tick(300);
    expect(done).toBe(false);
    expect(engine.stats().queued).toBe(1);
    gate.leave();
    await call;
    expect(done).toBe(true);
    expect(gate.held.calls).toBe(1);
  });

  it('is never starved: under endless policy work each call waits one hold, then runs', async () => {
    gate.enter(); // policy work that never ends
    try {
      for (let i = 0; i < 2; i++) await engine.call('s', 'stats');
      expect(gate.busy).toBe(true);
      expect(gate.held.calls).toBe(3); // one hold per call, none repeated
    } finally {
      gate.leave();
    }
  });
});

describe('the server', () => {
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer();
  });
  afterAll(() => server?.close());

  it('splits policy batches into powers of two', () => {
    expect([1, 2, 3, 13, 16, 24].map(powerOfTwoChunks)).toEqual([[1], [2], [2, 1], [8, 4, 1], [16], [16, 8]]);
    expect(() => powerOfTwoChunks(0)).toThrow('a batch of 0; expected a positive integer');
  });

  it('keeps training going while policy calls never stop, and samples a batch in parts as each datum alone', async () => {
    const config = makeConfig('flow0-tiny');
    const training = await server.sessions.engineFor('flow0-tiny');
    const policy = await server.sessions.policyEngineFor('flow0-tiny');
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-priority-'));
    const batch = fakeBatch(config, 2, 1);
    await training.call('s1', 'create_session', { finetune: 'lora', rank: 4, alpha: 8, targets: ['all'], seed: 0, dir });
    await training.call('s1', 'forward_backward', { batch });
    await training.call('s1', 'optim_step', { learningRate: 1e-3 });
    const weights = (await training.call<{ result: string }>('s1', 'save_weights', { name: 'w' })).result;
    await policy.call('p', 'load_policy', { dir: weights });

    // Three robots that never pause: the gate is busy from here to the end.
    const obs = fakeBatch(config, 3, 7);
    const infer = (b: typeof obs, seeds: number[]) => policy.call<{ result: { actions: Float32Array } }>('p', 'infer', { batch: b, seeds, numSteps: 3 }).then((r) => r.result.actions);
    let stop = false;
    let inferences = 0;
    const robots = Array.from({ length: 3 }, async () => {
      while (!stop) {
        await infer(obs, [1, 2, 3]);
        inferences++;
      }
    });
    const held = server.sessions.gate.held.calls;
    let steps = 0;
    try {
      for (let i = 0; i < 3; i++) {
        await training.call('s1', 'forward_backward', { batch });
        await training.call('s1', 'optim_step', { learningRate: 1e-3 });
        steps++;
      }
    } finally {
      stop = true;
      await Promise.all(robots);
    }
    expect(steps).toBe(3);
    expect(inferences).toBeGreaterThan(0);
    expect(server.sessions.gate.held.calls).toBeGreaterThan(held); // training did yield on the way

    // 3 datums run as parts of 2 and 1: each row is what that datum gets alone with its seed.
    const together = await infer(obs, [1, 2, 3]);
    const per = config.horizon * config.actionDim;
    const { sliceBatch } = await import('../kernels/small/batch.ts');
    for (let i = 0; i < 3; i++) {
      const alone = await infer(sliceBatch(obs, i, i + 1), [i + 1]);
      const row = together.subarray(i * per, (i + 1) * per);
      alone.forEach((x, k) => expect(row[k]).toBeCloseTo(x, 4));
    }
    await training.call('s1', 'close_session');
    await policy.call('p', 'unload_policy');
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it('serves policies from their own engine, apart from the training engine', async () => {
    const training = await server.sessions.engineFor('flow0-tiny');
    const policy = await server.sessions.policyEngineFor('flow0-tiny');
    expect(policy).not.toBe(training);
    expect(await server.sessions.policyEngineFor('flow0-tiny')).toBe(policy);
    expect(policy.info.backend).toBe(training.info.backend);
  });
});
