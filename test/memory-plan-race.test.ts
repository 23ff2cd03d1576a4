/**
 * Memory plans of requests at once (issue 32 item 9): four full-weight sessions asked for
 * together under a cap that holds one were all admitted, since each plan saw the same RSS before
 * any engine had allocated a tensor. The server reserves what it admits until the tensors are held
 * (server/models/memory.ts MemoryLedger): through the real server, concurrent requests get the
 * answers sequential ones get, and a reservation goes when its tensors are held, when the session
 * is closed, and when its creation fails.
 *
 * What the planner measures is made exact: the process's RSS reads as a fixed baseline plus the
 * tensor bytes that the engines' tf.memory() counts (what the real RSS holds of a load once it is
 * allocated, without the noise of the test process's own heap), and engine starts wait on a gate
 * so that the sessions are still pending while the others are planned.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import fs from 'node:fs';
import path from 'node:path';
import { estimateMemory } from '../kernels/pi/memory.ts';
import { Engine, type EngineLike } from '../server/engine/host.ts';
import { MemoryLedger } from '../server/models/memory.ts';
import { realConfigOf, selectParts } from '../server/models/plan.ts';
import { engineOptions, type EngineFactory } from '../server/sessions/sessions.ts';
import { writeTinyBase } from './helpers/real-pi-base.ts';
import { api, startTestServer, type TestServer } from './helpers/server.ts';

/** What the process "holds" beside the engines' tensors (the pinned RSS's fixed part). */
const BASELINE = 256 * 2 ** 20;

let base: string;
/** The plan of a full-weight session on the tiny pi05 base: its weights (until an engine holds them) and its own state. */
let weights: number;
let tenant: number;
/** The cap: the first session (weights and state) and half another's state. */
let cap: number;

/** Engines whose tensors the pinned RSS counts (every engine the current server started). */
const seen = new Set<EngineLike>();

beforeAll(async () => {
  base = await writeTinyBase('pi05');
  const est = estimateMemory(await realConfigOf(base), { use: 'full', batch: 1, cameras: 1, loraRank: 16, loraActionRank: 16, loraTargets: ['all'] });
  weights = selectParts(est, { weights: true, tenant: false, pass: false }).totalBytes;
  tenant = selectParts(est, { weights: false, tenant: true, pass: false }).totalBytes;
  cap = BASELINE + weights + tenant + Math.floor(tenant / 2);
  vi.spyOn(process.memoryUsage, 'rss').mockImplementation(() => {
    let held = 0;
    for (const e of seen) held += e.memory?.()?.numBytes ?? 0;
    return BASELINE + held;
  });
});

afterAll(() => {
  vi.restoreAllMocks();
  fs.rmSync(path.dirname(base), { recursive: true, force: true });
});

/** A server under `cap` whose engine starts wait for `open()` (or fail while `fail` is set). */
async function gatedServer(): Promise<{ server: TestServer; open: () => void; fail: { next: boolean } }> {
  let open!: () => void;
  const gate = new Promise<void>((r) => (open = r));
  const fail = { next: false };
  let server!: TestServer;
  const factory: EngineFactory = async (preset, lane) => {
    if (fail.next) {
      fail.next = false;
      throw new Error('engine failed to start (test)');
    }
    await gate;
    const engine = await Engine.start(engineOptions(server.config, preset, lane));
    seen.add(engine);
    return engine;
  };
  server = await startTestServer({ env: { VELA_MAX_MEMORY: String(cap), VELA_SESSIONS_PER_KEY: '16' }, engineFactory: factory });
  seen.clear();
  servers.push({ server, open });
  return { server, open, fail };
}

const full = () => ({ base_model: 'pi05', base, finetune: 'full' });

/**
 * /health's memory report (limit, pinned RSS, reserved, available), from the session manager:
 * /health itself names the backend of the first engine, so it waits for a gated one.
 */
async function memory(server: TestServer): Promise<{ limit_bytes: number; rss_bytes: number; reserved_bytes: number; available_bytes: number }> {
  return (await server.sessions.memoryReport()) as never;
}

/** Polls a session until it leaves `starting`. */
async function settled(server: TestServer, id: string): Promise<{ status: string; error: string | null; memory: { planned_bytes: number } | null }> {
  for (;;) {
    const s = (await api(server, 'GET', `/v1/training_sessions/${id}`)).json;
    if (s.status !== 'starting') return s;
    await new Promise((r) => setTimeout(r, 50));
  }
}

function expectRefusedForReservation(r: { status: number; json: { error: string } }): void {
  expect(r.status).toBe(507);
  expect(r.json.error).toMatch(/^a full-weight session of pi05 \(.*\) needs about [\d.]+ MB \(.*\); [\d.]+ MB is available \(--max-memory [\d.]+ MB less [\d.]+ MB in use and [\d.]+ MB reserved by 1 pending request\): /);
  expect(r.json.error).not.toContain('\n');
}

/** This test's servers: their gates open before they close (a failed test may have left a start waiting). */
let servers: { server: TestServer; open: () => void }[] = [];
afterEach(async () => {
  for (const { server, open } of servers) {
    open();
    await server.close();
  }
  servers = [];
});

describe('sessions asked for at once', () => {
  it('the plan is what the test computes: one session fits under the cap, a second one\'s state does not', () => {
    expect(weights).toBeGreaterThan(370_112 * 4 - 1); // the tiny base's float32 weights, at least
    expect(tenant).toBeGreaterThan(weights); // a full fine-tune's copy, moments and gradients
    expect(cap - BASELINE).toBeGreaterThanOrEqual(weights + tenant);
    expect(cap - BASELINE).toBeLessThan(weights + 2 * tenant);
  });

  it('four at once: exactly one admitted, three refused naming the reservation; after it is held and closed, another is admitted', async () => {
    const { server, open } = await gatedServer();
    const answers = await Promise.all([0, 1, 2, 3].map(() => api(server, 'POST', '/v1/training_sessions', full())));
    const admitted = answers.filter((a) => a.status === 200);
    expect(answers.map((a) => a.status).sort()).toEqual([200, 507, 507, 507]);
    for (const a of answers.filter((x) => x.status === 507)) expectRefusedForReservation(a);
    // Pending: the base and the state are reserved, nothing is held yet.
    expect(await memory(server)).toMatchObject({ limit_bytes: cap, rss_bytes: BASELINE, reserved_bytes: weights + tenant, available_bytes: cap - BASELINE - weights - tenant });
    expect((await api(server, 'GET', '/v1/training_sessions')).json.data.map((s: { id: string }) => s.id)).toEqual([admitted[0]!.json.id]);

    open();
    const s = await settled(server, admitted[0]!.json.id);
    expect(s.status).toBe('ready');
    expect(s.memory!.planned_bytes).toBe(weights + tenant);
    // Held now: the engine's tensors are in the (pinned) RSS and nothing is reserved.
    const held = await memory(server);
    expect(held.reserved_bytes).toBe(0);
    expect(held.rss_bytes).toBeGreaterThan(BASELINE + weights - 1);

    expect((await api(server, 'POST', `/v1/training_sessions/${admitted[0]!.json.id}/close`)).status).toBe(200);
    // The base stays in its engine; another session's state fits beside it once the first is closed.
    const again = await api(server, 'POST', '/v1/training_sessions', full());
    expect(again.status, JSON.stringify(again.json)).toBe(200);
    expect((await settled(server, again.json.id)).status).toBe('ready');
    expect((await memory(server)).reserved_bytes).toBe(0);
  });

  it('one after another while the first is pending: the same answers', async () => {
    const { server, open } = await gatedServer();
    const statuses: number[] = [];
    for (let i = 0; i < 4; i++) {
      const r = await api(server, 'POST', '/v1/training_sessions', full());
      statuses.push(r.status);
      if (r.status === 507) expectRefusedForReservation(r);
    }
    expect(statuses).toEqual([200, 507, 507, 507]);
    open();
  }, 60_000);
});

describe('a creation that fails after its plan was admitted', () => {
  it('releases its reservation: an engine that fails to start, and a session its engine refuses', async () => {
    const { server, open, fail } = await gatedServer();
    open();
    // The engine does not start: the base's and the session's reservations both go.
    fail.next = true;
    const a = await api(server, 'POST', '/v1/training_sessions', full());
    expect(a.status).toBe(200);
    expect(await settled(server, a.json.id)).toMatchObject({ status: 'error', error: 'engine failed to start (test)' });
    expect((await memory(server)).reserved_bytes).toBe(0);
    // The engine starts and then refuses the session (an action_horizon past the model's): its state's reservation goes.
    const b = await api(server, 'POST', '/v1/training_sessions', { ...full(), action_horizon: 10_000 });
    expect(b.status).toBe(200);
    const sb = await settled(server, b.json.id);
    expect(sb.status).toBe('error');
    expect(sb.error).toMatch(/^action_horizon 10000 is larger than pi05's \d+$/);
    expect((await memory(server)).reserved_bytes).toBe(0);
    // Had either kept its bytes, a session whose state needs all but half of one more would be refused.
    const c = await api(server, 'POST', '/v1/training_sessions', full());
    expect(c.status, JSON.stringify(c.json)).toBe(200);
    expect((await settled(server, c.json.id)).status).toBe('ready');
    expect((await memory(server)).reserved_bytes).toBe(0);
  }, 60_000);
});

describe('MemoryLedger', () => {
  const est = (bytes: number) => ({ totalBytes: bytes, tensorBytes: bytes, parts: { weights: 0, trainable: bytes, optimizer: 0, gradients: 0, activations: 0, workspace: 0 } });
  const MB = 1e6;
  const avail = { bytes: 100 * MB, limitBytes: 150 * MB, rssBytes: 50 * MB, machineAvailableBytes: Infinity, source: '--max-memory', capName: '--max-memory' };

  it('admits against what is available less what is reserved, reserves in the same step, and releases once', () => {
    const ledger = new MemoryLedger();
    expect(ledger.admit(est(40 * MB), avail, 'a', { 'base:k': 10 * MB, 'session:a': 30 * MB }, { engine: 'k' })).toBeNull();
    expect(ledger.admit(est(40 * MB), avail, 'b', { 'session:b': 40 * MB })).toBeNull();
    expect([ledger.reservedBytes, ledger.pending, ledger.pendingOn('k'), ledger.has('base:k')]).toEqual([80 * MB, 2, true, true]);
    // 20 MB left: a 30 MB load is refused naming both requests' 80 MB, and the machine it needs counts them.
    const why = ledger.admit(est(30 * MB), avail, 'c', { 'session:c': 30 * MB });
    expect(why).toBe('c needs about 30.0 MB (trainable copy/adapters 30.0 MB); 20.0 MB is available (--max-memory 150.0 MB less 50.0 MB in use and 80.0 MB reserved by 2 pending requests): ' +
      'use LoRA (the default) instead of a full fine-tune, or free memory or run on a machine with >= 1 GB, or raise --max-memory (now 150.0 MB)');
    expect(ledger.has('session:c')).toBe(false);
    expect(() => ledger.admit(est(1), avail, 'a again', { 'session:a': 1 })).toThrow(/memory reservation session:a is taken/);
    expect(ledger.release('session:a')).toBe(30 * MB);
    expect(ledger.release('session:a')).toBe(0);
    expect([ledger.reservedBytes, ledger.pending]).toEqual([50 * MB, 2]);
    ledger.release('base:k');
    ledger.release('session:b');
    expect([ledger.reservedBytes, ledger.pending, ledger.pendingOn('k')]).toEqual([0, 0, false]);
    expect(ledger.admit(est(100 * MB), avail, 'd', { 'session:d': 100 * MB })).toBeNull();
  });
});
