/**
 * Policy requests before training (server/engine/host.ts PriorityGate): a training engine holds
 * its next call while policy calls wait, releases it when they are done, and never holds longer
 * than the gate's maxHoldMs; the server serves policies from their own engine.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Engine, PriorityGate } from '../server/engine/host.ts';
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

  it('serves policies from their own engine, apart from the training engine', async () => {
    const training = await server.sessions.engineFor('flow0-tiny');
    const policy = await server.sessions.policyEngineFor('flow0-tiny');
    expect(policy).not.toBe(training);
    expect(await server.sessions.policyEngineFor('flow0-tiny')).toBe(policy);
    expect(policy.info.backend).toBe(training.info.backend);
  });
});
