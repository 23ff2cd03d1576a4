/**
 * Real-time chunking through the real policy server (uWS, the engine worker thread, the real
 * engine; PROTOCOL.md section 6 "Real-time chunking"): an unchanged OpenPI-style client gets
 * plain chunks, bit for bit what it got before; a client that sends `rtc/executed` gets a chunk
 * that continues its previous one (guided on a plain checkpoint, the held prefix on one trained
 * with rtc_max_delay), with the delay and weights in the answer's timing; bad RTC input closes
 * only its own connection.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ndarray, NDArray, NpScalar } from '../protocol/ndarray.ts';
import { Engine } from '../server/engine/host.ts';
import { startPolicyServer, type PolicyServerHandle } from '../server/policy/index.ts';
import { parsePolicyArgs } from '../server/policy/cli.ts';
import { log } from '../server/log.ts';
import { makeConfig } from '../kernels/small/config.ts';
import { sampleBound } from './helpers/float32.ts';
import { fakeBatch } from '../kernels/small/batch.ts';
import { rtcWeights } from '../kernels/rtc.ts';
import { computeNormStats, normStatsToJson } from '../kernels/normalize.ts';
import { PolicyClient } from '../bench/harness/policy-stub.ts';
import { PolicyConnection } from '../protocol/client.ts';
import { encodeWeightsPush } from '../server/policy/push.ts';
import { NATIVE_PRESENT, TEST_BACKENDS } from './helpers/tf.ts';

const PRESET = 'flow0-tiny';
const C = makeConfig(PRESET);
const H = 10; // served action_horizon (the model's is 16)
const A = 6; // the dataset's action dims (the model's are 32)
const STATE_DIM = 5;

let engine: Engine;
const servers: PolicyServerHandle[] = [];
const clients: PolicyClient[] = [];
let plainDir: string;
let trainedDir: string;

/** One camera (a pattern that changes with i), a state, a prompt. */
function observation(i: number, extra: Record<string, unknown> = {}): Record<string, unknown> {
  const frame = new Uint8Array(48 * 64 * 3).map((_, k) => (k * 7 + i * 31) % 256);
  return {
    'observation/cam_high': ndarray(frame, [48, 64, 3]),
    'observation/state': ndarray(new Float32Array(STATE_DIM).map((_, k) => 0.1 * k - 0.2 + 0.05 * i), [STATE_DIM]),
    prompt: 'pick up the bottle',
    ...extra,
  };
}

function actionsOf(answer: any): Float32Array {
  const a = answer.actions as NDArray;
  expect(a.shape).toEqual([H, A]);
  return a.data as Float32Array;
}

/** max(1, max |a|): the scale a float32 bound is relative to. */
function scaleOf(a: ArrayLike<number>): number {
  let m = 1;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]!));
  return m;
}

function maxDiff(a: Float32Array, b: Float32Array): number {
  expect(a.length).toBe(b.length);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
}

/** RMS over the first `n` actions of a and b[offset + i]. */
function rms(a: Float32Array, b: Float32Array, n: number, offset = 0): number {
  let s = 0;
  for (let i = 0; i < n * A; i++) s += (a[i]! - b[i + offset * A]!) ** 2;
  return Math.sqrt(s / (n * A));
}

async function connect(server: PolicyServerHandle, query = ''): Promise<PolicyClient> {
  const c = await PolicyClient.connect(`${server.wsUrl}${query}`);
  clients.push(c);
  return c;
}

beforeAll(async () => {
  log.setLevel('error');
  engine = await Engine.start({ preset: PRESET, backend: TEST_BACKENDS[0]! });
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-rtc-'));
  const extra = { cameras: ['cam_high'], action_horizon: H, action_dim: A, state_dim: STATE_DIM };
  const rows = (dim: number, scale: number) => Array.from({ length: 64 }, (_, i) => Array.from({ length: dim }, (_, k) => scale * Math.sin(i * 0.7 + k)));
  const norm = normStatsToJson({ state: computeNormStats(rows(STATE_DIM, 0.5)), actions: computeNormStats(rows(A, 2)) });
  // A few full fine-tune steps so the model's answer depends on its input; the second session
  // with training-time RTC (its config then says rtc_max_delay).
  for (const [id, rtcMaxDelay] of [['plain', 0], ['trained', 6]] as const) {
    await engine.call(id, 'create_session', { finetune: 'full', rank: 4, alpha: 8, targets: ['all'], seed: 1, dir: path.join(root, id), rtcMaxDelay });
    for (let i = 0; i < 2; i++) {
      await engine.call(id, 'forward_backward', { batch: fakeBatch(C, 4, 3 + i) });
      await engine.call(id, 'optim_step', { learningRate: 1e-2 });
    }
    const dir = (await engine.call<{ result: string }>(id, 'save_weights', { name: 'w', extraConfig: extra, normStats: norm })).result;
    if (id === 'plain') plainDir = dir;
    else trainedDir = dir;
  }
  expect(JSON.parse(fs.readFileSync(path.join(trainedDir, 'config.json'), 'utf8')).rtc_max_delay).toBe(6);
  expect(JSON.parse(fs.readFileSync(path.join(plainDir, 'config.json'), 'utf8')).rtc_max_delay).toBeUndefined();
  for (const [dir, id] of [[plainDir, 'pol-plain'], [trainedDir, 'pol-trained']] as const) {
    servers.push(await startPolicyServer({ engine, checkpointDir: dir, policyId: id, seed: 11, batchWindowMs: 0, port: 0 }));
  }
}, 180_000);

afterAll(async () => {
  for (const c of clients) c.close();
  for (const s of servers) await s.close();
  await engine?.close();
});

describe('real-time chunking over the policy websocket', () => {
  it('an unchanged client gets plain chunks; one that sends rtc/executed gets a chunk that continues its last', async () => {
    const [server] = servers;
    const openpi = await connect(server!); // sends nothing new: OpenPI's client
    const robot = await connect(server!); // the same seed stream (--seed 11, stream 0): request n draws the same noise
    expect(robot.metadata.rtc).toMatchObject({ mode: 'guided', trained_max_delay: 0, schedule: 'exp', max_guidance: 5 });
    expect(Object.keys(robot.metadata.observation_keys)).toEqual(expect.arrayContaining(['rtc/executed', 'rtc/control_hz', 'rtc/delay']));

    const a1 = await openpi.infer(observation(1));
    const r1 = await robot.infer(observation(1, { 'rtc/executed': 0 }));
    expect(a1.server_timing.rtc).toBeUndefined();
    // Nothing to continue yet: a plain chunk, and the answer says why.
    expect(r1.server_timing.rtc).toEqual({ mode: 'off', reason: 'no previous answer on this connection yet' });
    expect(Array.from(actionsOf(r1))).toEqual(Array.from(actionsOf(a1)));

    const executed = 3;
    const delay = 4;
    const a2 = await openpi.infer(observation(2));
    const r2 = await robot.infer(observation(2, { 'rtc/executed': executed, 'rtc/delay': delay }));
    expect(a2.server_timing.rtc).toBeUndefined();
    const weights = Array.from(rtcWeights(H, delay, H - executed));
    expect(r2.server_timing.rtc).toEqual({
      mode: 'guided', delay, delay_source: 'client', executed, overlap: H - executed, control_hz: null, weights, schedule: 'exp', max_guidance: 5,
    });
    // The plain chunk is what a third client with the same seed stream gets, bit for bit.
    const other = await connect(server!);
    await other.infer(observation(1));
    expect(Array.from(actionsOf(await other.infer(observation(2))))).toEqual(Array.from(actionsOf(a2)));
    // The RTC chunk follows the old one over the delay (its first d actions are the old chunk's
    // actions `executed` on), where the plain sample of the same noise does not.
    const prev = actionsOf(r1);
    const plainGap = rms(actionsOf(a2), prev, delay, executed);
    const rtcGap = rms(actionsOf(r2), prev, delay, executed);
    expect(plainGap).toBeGreaterThan(0.05);
    expect(rtcGap).toBeLessThan(0.5 * plainGap);
    // Past the overlap the chunk is free: it is not pinned to anything.
    expect(rms(actionsOf(r2), actionsOf(a2), H, 0)).toBeGreaterThan(0);
  }, 120_000);

  it('measures the delay from the round trip and its answer times at the robot\'s control rate', async () => {
    const robot = await connect(servers[0]!, '?seed=5');
    await robot.infer(observation(1, { 'rtc/control_hz': 50 }));
    const t0 = performance.now();
    const ans = await robot.infer(observation(2, { 'rtc/executed': 2 }));
    const took = performance.now() - t0;
    const rtc = ans.server_timing.rtc;
    expect(rtc).toMatchObject({ mode: 'guided', delay_source: 'measured', executed: 2, overlap: H - 2, control_hz: 50 });
    // d = ceil((round trip + the connection's slowest recent answer) x 50 Hz): at least one step
    // (an answer takes ms), at most the overlap.
    expect(rtc.delay).toBeGreaterThanOrEqual(1);
    expect(rtc.delay).toBeLessThanOrEqual(H - 2);
    expect(rtc.weights.slice(0, rtc.delay)).toEqual(new Array(rtc.delay).fill(1));
    expect(took).toBeGreaterThan(0);
  }, 60_000);

  it('serves a policy trained with rtc_max_delay by holding the prefix: its first d actions are the old chunk\'s', async () => {
    const robot = await connect(servers[1]!);
    expect(robot.metadata.rtc).toMatchObject({ mode: 'prefix', trained_max_delay: 6 });
    const r1 = await robot.infer(observation(1));
    const executed = 2;
    const delay = 3;
    const r2 = await robot.infer(observation(2, { 'rtc/executed': executed, 'rtc/delay': delay }));
    expect(r2.server_timing.rtc).toMatchObject({ mode: 'prefix', delay, executed, weights: [1, 1, 1, 0, 0, 0, 0, 0, 0, 0] });
    // Written, not guided: equal up to the unnormalise / normalise round trip (float32).
    expect(rms(actionsOf(r2), actionsOf(r1), delay, executed)).toBeLessThan(1e-5);
    expect(rms(actionsOf(r2), actionsOf(r1), H - executed, executed)).toBeGreaterThan(1e-3); // the rest is sampled
    // rtc=off on the connection: plain chunks whatever it sends.
    const off = await connect(servers[1]!, '?rtc=off');
    await off.infer(observation(1));
    expect((await off.infer(observation(2, { 'rtc/executed': 1 }))).server_timing.rtc).toEqual({ mode: 'off', reason: 'real-time chunking is off for this connection (rtc=off)' });
  }, 60_000);

  it('bad RTC input closes only its own connection, with the reason; bad settings refuse the upgrade', async () => {
    const server = servers[0]!;
    const good = await connect(server);
    await good.infer(observation(1));
    for (const [extra, text] of [
      [{ 'rtc/executed': -1 }, 'rtc/executed is -1; expected an integer in 0..1000000'],
      [{ 'rtc/delay': 1025 }, 'rtc/delay is 1025; expected an integer in 0..1024'],
      [{ 'rtc/executed': 'three' }, 'rtc/executed must be a number; got string'],
      [{ 'rtc/control_hz': 0 }, 'rtc/control_hz is 0; expected a rate in Hz, > 0 and <= 10000'],
      [{ 'rtc/speed': 1 }, 'unknown key rtc/speed; the real-time chunking keys are rtc/executed, rtc/control_hz, rtc/delay'],
      // np.bool_(True) is no count, as Python's True is not (it read as executed = 1).
      [{ 'rtc/executed': new NpScalar('|b1', true) }, 'rtc/executed must be a number; got a numpy bool'],
      [{ 'rtc/executed': true }, 'rtc/executed must be a number; got boolean'],
    ] as const) {
      const bad = await connect(server);
      await expect(bad.infer(observation(1, extra))).rejects.toThrow(text);
      expect(await bad.closed()).toBe(1011);
    }
    await expect(PolicyClient.connect(`${server.wsUrl}?rtc=maybe`)).rejects.toMatchObject({ status: 400 });
    await expect(PolicyClient.connect(`${server.wsUrl}?control_hz=-3`)).rejects.toMatchObject({ status: 400 });
    // The TS client passes the refusal's reason on; a typo is refused, not ignored.
    await expect(PolicyConnection.open(`${server.wsUrl}?rtc=maybe`)).rejects.toThrow('policy connection refused: HTTP 400: rtc is "maybe"; expected auto, guided, prefix or off');
    await expect(PolicyConnection.open(`${server.wsUrl}?controlhz=30`)).rejects.toThrow('policy connection refused: HTTP 400: unknown query parameter "controlhz"; a policy connection takes stream, seed, rtc, control_hz, rtc_delay, rtc_schedule, rtc_max_guidance');
    // The metadata says what this connection gets.
    const tuned = await PolicyConnection.open(`${server.wsUrl}?rtc=off&control_hz=30`);
    expect(tuned.metadata.rtc).toMatchObject({ mode: 'off', control_hz: 30 });
    await tuned.close();
    // A setting given twice is ambiguous (it took the first, and a bad second value passed unseen).
    await expect(PolicyClient.connect(`${server.wsUrl}?rtc=off&rtc=guided`)).rejects.toMatchObject({ status: 400 });
    await expect(PolicyClient.connect(`${server.wsUrl}?control_hz=30&control_hz=-1`)).rejects.toMatchObject({ status: 400 });
    // numpy ints and floats are counts and rates as Python's are.
    const np = await connect(server);
    await np.infer(observation(1, { 'rtc/control_hz': new NpScalar('<f4', 30) }));
    expect((await np.infer(observation(2, { 'rtc/executed': new NpScalar('<i8', 3), 'rtc/delay': new NpScalar('<i8', 2) }))).server_timing.rtc).toMatchObject({ mode: 'guided', executed: 3, delay: 2, control_hz: 30 });
    // The good connection and its chunk state are untouched.
    const ans = await good.infer(observation(2, { 'rtc/executed': 1, 'rtc/delay': 2 }));
    expect(ans.server_timing.rtc).toMatchObject({ mode: 'guided', delay: 2 });
    // OpenPI's episode_start: the last chunk belongs to the old episode; the first request of the new one is plain.
    expect(await good.infer({ __ctrl__: 'episode_start' })).toEqual({ __ack__: 'episode_start' });
    expect((await good.infer(observation(3, { 'rtc/executed': 1 }))).server_timing.rtc).toEqual({
      mode: 'off', reason: 'a new episode started on this connection (episode_start / episode_end): no previous answer in it yet',
    });
    expect((await good.infer(observation(4, { 'rtc/executed': 1, 'rtc/delay': 1 }))).server_timing.rtc).toMatchObject({ mode: 'guided', delay: 1 });
  }, 60_000);
});

describe('real-time chunking of robots with different β (rtc_max_guidance)', () => {
  it('shares one engine call, and each robot gets what it gets alone (β is per datum, not per call)', async () => {
    // A long window: the batch leaves when both connections have a request queued.
    const batching = await startPolicyServer({ engine, checkpointDir: plainDir, policyId: 'pol-betas', seed: 11, batchWindowMs: 5000, port: 0 });
    servers.push(batching);
    const betas = [1, 15] as const;
    const open = (k: number, beta: number) => PolicyClient.connect(`${batching.wsUrl}?seed=${5 + k}&rtc=guided&rtc_max_guidance=${beta}`);
    const rtc2 = observation(2, { 'rtc/executed': 3, 'rtc/delay': 4 });
    // Together: both requests of each round in one batch of 2.
    const pair = [await open(0, betas[0]), await open(1, betas[1])];
    await Promise.all(pair.map((c) => c.infer(observation(1))));
    const calls = engine.stats().calls;
    const together = await Promise.all(pair.map((c) => c.infer(rtc2)));
    // One engine call for both (it was one per β), and both chunks guided with their own β.
    expect(engine.stats().calls - calls).toBe(1);
    together.forEach((a, k) => expect(a.server_timing.rtc).toMatchObject({ mode: 'guided', delay: 4, max_guidance: betas[k] }));
    for (const c of pair) c.close();
    await Promise.all(pair.map((c) => c.closed()));
    const stats = (await (await fetch(`${batching.baseUrl}/stats`)).json()) as { batchSizes: Record<string, number> };
    expect(stats.batchSizes).toEqual({ 2: 2 });
    // Alone (one connection at a time: batches of 1), the same seeds and β: the same chunks.
    const alone = async (k: number, beta: number) => {
      const c = await open(k, beta);
      await c.infer(observation(1));
      const a = await c.infer(rtc2);
      c.close();
      await c.closed();
      return actionsOf(a);
    };
    for (const k of [0, 1]) {
      const solo = await alone(k, betas[k]!);
      // Batch 2 and batch 1 are separate graphs (other summation orders): guided sampling's bound
      // (its VJP's reductions are 2 mlpDim terms; test/helpers/float32.ts) of the chunk's scale.
      expect(maxDiff(actionsOf(together[k]), solo)).toBeLessThanOrEqual(sampleBound(2 * C.mlpDim) * scaleOf(solo));
    }
    // β reaches each datum: robot 1's chunk with robot 0's β is another chunk.
    expect(maxDiff(actionsOf(together[1]), await alone(1, betas[0]))).toBeGreaterThan(1e-3);
  }, 120_000);
});

describe('real-time chunking across a weights push', () => {
  it('does not continue a chunk of another shape of the same size (10 x 6 read as 12 x 5)', async () => {
    const keyed = await startPolicyServer({ engine, checkpointDir: plainDir, policyId: 'pol-keyed', seed: 11, batchWindowMs: 0, port: 0, apiKey: 'k' });
    servers.push(keyed);
    const robot = await PolicyClient.connect(keyed.wsUrl, { authorization: 'Bearer k' });
    clients.push(robot);
    await robot.infer(observation(1));
    // The same weights answering [12, 5] (no norm stats: the stats are of 6 action dims); 12 x 5 = 10 x 6 floats.
    const config = { ...JSON.parse(fs.readFileSync(path.join(plainDir, 'config.json'), 'utf8')), action_horizon: 12, action_dim: 5 };
    delete config.action_names;
    const files: Record<string, Uint8Array> = { 'config.json': Buffer.from(JSON.stringify(config)) };
    for (const f of fs.readdirSync(plainDir)) if (f.endsWith('.safetensors')) files[f] = fs.readFileSync(path.join(plainDir, f));
    const res = await fetch(`${keyed.baseUrl}/weights`, { method: 'PUT', headers: { 'content-type': 'application/msgpack', authorization: 'Bearer k' }, body: encodeWeightsPush({ weights_version: 2, model_id: null, files }) });
    expect(res.status, await res.text()).toBe(200);
    const after = await robot.infer(observation(2, { 'rtc/executed': 1, 'rtc/delay': 3 }));
    expect((after.actions as NDArray).shape).toEqual([12, 5]);
    expect(after.server_timing.rtc).toEqual({ mode: 'off', reason: 'the served weights changed shape since the previous chunk' });
    // The chunk it just sent is of the new shape: the next request continues it.
    expect((await robot.infer(observation(3, { 'rtc/executed': 1, 'rtc/delay': 3 }))).server_timing.rtc).toMatchObject({ mode: 'guided', delay: 3, overlap: 11 });
  }, 60_000);
});

describe('the engine', () => {
  it('fails a call whose buffers were already moved to its thread, and goes on (the warm-up reused one once and hung the queue)', async () => {
    const batch = fakeBatch(C, 1, 1);
    const buffers = [batch.images.buffer as ArrayBuffer];
    await engine.call('pol-plain', 'infer', { batch, seeds: [0], numSteps: 2 }, buffers);
    expect(batch.images.length).toBe(0); // moved
    await expect(engine.call('pol-plain', 'infer', { batch, seeds: [0], numSteps: 2 }, buffers)).rejects.toThrow('engine op infer was given a buffer that an earlier call moved to the engine\'s thread; make its arrays again');
    const again = fakeBatch(C, 1, 1);
    const ans = await engine.call<{ result: { actions: Float32Array } }>('pol-plain', 'infer', { batch: again, seeds: [0], numSteps: 2 });
    expect(ans.result.actions.length).toBe(C.horizon * C.actionDim);
  }, 60_000);
});

describe.runIf(NATIVE_PRESENT)('traces on a shared engine (TRACE_QUIET_MS)', () => {
  type Infer = { result: { actions: Float32Array; graphs: { traced: number; deferred: number } } };
  const infer = (e: Engine, id: string, size: number, trace?: 'quiet') => e.call<Infer>(id, 'infer', { batch: fakeBatch(C, size, 5), seeds: Array.from({ length: size }, (_, i) => 40 + i), numSteps: 3, ...(trace ? { trace } : {}) });
  const sessions = async (e: Engine, root: string) => {
    for (const id of ['a', 'b']) await e.call(id, 'create_session', { finetune: 'lora', rank: 4, alpha: 8, targets: ['all'], seed: 1, dir: path.join(root, id) });
  };

  it('a new layout of one policy samples eagerly while another policy is busy, and traces once the others are quiet', async () => {
    const root = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-quiet-'));
    const e = await Engine.start({ preset: PRESET, backend: TEST_BACKENDS[0]!, traceQuietMs: 60_000 });
    try {
      await sessions(e, root);
      // a alone on the engine: its layout (batch 1) traces at once.
      expect((await infer(e, 'a', 1, 'quiet')).result.graphs).toEqual({ traced: 1, deferred: 0 });
      // b's new layout (batch 2) while a was busy within the quiet time: eager, nothing traced, and
      // a's next request runs its graph (nothing evicted, nothing traced in its way).
      const eager = await infer(e, 'b', 2, 'quiet');
      expect(eager.result.graphs).toEqual({ traced: 0, deferred: 1 });
      expect((await infer(e, 'a', 1, 'quiet')).result.graphs).toEqual({ traced: 0, deferred: 0 });
      // The same call told to trace (no `quiet`) traces, and the graph answers what eager did
      // (graph = eager to float32 rounding: the bound of test/rtc.test.ts).
      const traced = await infer(e, 'b', 2);
      expect(traced.result.graphs).toEqual({ traced: 1, deferred: 0 });
      expect(maxDiff(traced.result.actions, eager.result.actions)).toBeLessThan(sampleBound(2 * C.mlpDim) * scaleOf(eager.result.actions));
      expect((await infer(e, 'b', 2, 'quiet')).result.graphs).toEqual({ traced: 0, deferred: 0 });
    } finally {
      await e.close();
    }
    // Quiet others (a short quiet time, waited out): b's new layout traces on its own request.
    const q = await Engine.start({ preset: PRESET, backend: TEST_BACKENDS[0]!, traceQuietMs: 200 });
    try {
      await sessions(q, root + '-q');
      await infer(q, 'a', 1, 'quiet');
      await new Promise((r) => setTimeout(r, 400));
      expect((await infer(q, 'b', 4, 'quiet')).result.graphs).toEqual({ traced: 1, deferred: 0 });
    } finally {
      await q.close();
    }
  }, 120_000);
});

describe('vela policy RTC flags', () => {
  it('set the server defaults, checked like every flag', () => {
    expect(parsePolicyArgs(['ck']).rtc).toEqual({ mode: 'auto', controlHz: null, delay: null, schedule: 'exp', maxGuidance: 5 });
    expect(parsePolicyArgs(['ck', '--rtc', 'guided', '--control-hz', '30', '--rtc-delay', '4', '--rtc-schedule', 'linear', '--rtc-max-guidance', '10']).rtc)
      .toEqual({ mode: 'guided', controlHz: 30, delay: 4, schedule: 'linear', maxGuidance: 10 });
    expect(() => parsePolicyArgs(['ck', '--control-hz', '0'])).toThrow('--control-hz 0: must be a rate in Hz, > 0 and <= 10000');
    expect(() => parsePolicyArgs(['ck', '--rtc-delay', '2.5'])).toThrow('--rtc-delay 2.5: must be an integer number of control steps in 0..1024');
    expect(() => parsePolicyArgs(['ck', '--rtc', 'on'])).toThrow('--rtc on: must be auto, guided, prefix or off');
    expect(() => parsePolicyArgs(['ck', '--rtc-max-guidance', '50'])).toThrow('--rtc-max-guidance 50: must be a number in 0..20');
    expect(() => parsePolicyArgs(['ck', '--control-hz', '0x1e'])).toThrow('--control-hz 0x1e: must be a rate in Hz, > 0 and <= 10000');
  });
});
