/**
 * Weights swapped into a serving policy (sync_inference_weights' receiving end), with a stub
 * engine that records which engine policy id ran each batch: a request runs entirely on the
 * version current when it arrived, even when it shares a batch with requests of the new
 * version; the old version is unloaded only after its last request; a checkpoint that cannot be
 * served leaves the old weights serving; `vela policy`'s `PUT /weights` needs its key.
 */
import { afterAll, describe, expect, it, vi } from 'vitest';
import { ndarray } from '../protocol/ndarray.ts';
import { createPolicyServer, encodeWeightsPush, startPolicyServer, type PolicyServerHandle } from '../server/policy/index.ts';
import { log } from '../server/log.ts';
import { STUB_CONFIG, stubEngine, type StubEngine } from '../bench/harness/policy-stub.ts';

log.setLevel('error');

/** The stub engine, recording every call's engine policy id, answering unload_policy. */
function recordingEngine(config: unknown = STUB_CONFIG): StubEngine & { calls: [string, string][] } {
  const stub = stubEngine();
  const calls: [string, string][] = [];
  const call = stub.call.bind(stub);
  return Object.assign(stub, {
    calls,
    async call(session: string, op: string, args: Record<string, unknown> = {}) {
      calls.push([session, op]);
      if (op === 'unload_policy') return { result: {}, pending_gradients: 0 };
      if (op === 'load_policy' && String(args.dir).includes('bad')) return { result: { config: { ...(config as object), cameras: [] }, normStats: null }, pending_gradients: 0 };
      return call(session, op, args);
    },
  }) as StubEngine & { calls: [string, string][] };
}

const obs = (k: number) => ({
  'observation/image': ndarray(new Uint8Array(20 * 30 * 3).fill(k), [20, 30, 3]),
  'observation/state': ndarray(Float32Array.of(0.5, -1.25, 2, 0.75, -3, 1.5, k), [7]),
  prompt: `task ${k}`,
});

describe('PolicyServer.swap', () => {
  it('pins each request to the version current on arrival, splits a mixed batch, and unloads the old version after its last request', async () => {
    const engine = recordingEngine();
    const policy = await createPolicyServer({ engine, checkpointDir: '/ckpt/v1', policyId: 'p', version: 1, batchWindowMs: 0, maxBatch: 8 });
    let open!: () => void;
    engine.gate = new Promise<void>((r) => (open = r));
    const a = policy.infer(obs(1), 11); // runs alone, held in the engine by the gate
    // Wait for a to reach the engine, not for a fixed time: its decode runs on the thread pool,
    // which a busy machine can hold back past any sleep (then b or c could overtake it).
    await vi.waitFor(() => expect(engine.calls.some(([, op]) => op === 'infer')).toBe(true), { timeout: 30_000, interval: 5 });
    const b = policy.infer(obs(2), 12); // queued behind it, on version 1
    const swapped = await policy.swap('/ckpt/v2', 2);
    expect(swapped).toMatchObject({ weights_version: 2, previous_version: 1 });
    expect(policy.weightsVersion()).toBe(2);
    const c = policy.infer(obs(3), 13); // arrives after the swap: version 2
    await new Promise((r) => setTimeout(r, 20));
    expect(engine.calls.filter(([, op]) => op === 'unload_policy')).toEqual([]); // b still needs version 1
    open();
    await Promise.all([a, b, c]);
    // The old version is unloaded after its last request answered, not before the answer.
    await vi.waitFor(() => expect(engine.calls.some(([, op]) => op === 'unload_policy')).toBe(true), { timeout: 30_000, interval: 5 });
    const infers = engine.calls.filter(([, op]) => op === 'infer').map(([s]) => s);
    // b and c left in one batch, as two engine calls; their order is the order in which their
    // observations finished decoding (the thread pool's), not the order they were sent.
    expect(infers[0]).toBe('p');
    expect(infers.slice(1).sort()).toEqual(['p', 'p#1']);
    expect(engine.infers.map((i) => i.batch.size)).toEqual([1, 1, 1]);
    expect(engine.calls.filter(([, op]) => op === 'unload_policy')).toEqual([['p', 'unload_policy']]);
    expect(engine.calls.findIndex(([s, op]) => s === 'p' && op === 'unload_policy')).toBeGreaterThan(engine.calls.map(([s, op]) => `${s}:${op}`).lastIndexOf('p:infer'));
    expect(policy.stats()).toMatchObject({ swaps: 1, weights_version: 2 });
  });

  it('keeps the old weights when the new checkpoint cannot be served', async () => {
    const engine = recordingEngine();
    const policy = await createPolicyServer({ engine, checkpointDir: '/ckpt/v1', policyId: 'p', version: 'a', batchWindowMs: 0 });
    await expect(policy.swap('/ckpt/bad', 'b')).rejects.toThrow(/cameras has 0 names/);
    expect(policy.weightsVersion()).toBe('a');
    expect(engine.calls).toContainEqual(['p#1', 'unload_policy']); // the half-loaded one is freed
    expect((await policy.infer(obs(1), 1)).actions.shape).toEqual([5, 6]);
    expect(engine.calls.filter(([, op]) => op === 'infer').map(([s]) => s)).toEqual(['p']);
  });
});

describe('vela policy PUT /weights', () => {
  const servers: PolicyServerHandle[] = [];
  afterAll(async () => {
    for (const s of servers) await s.close();
  });
  const push = encodeWeightsPush({ weights_version: 3, model_id: 'arm', files: { 'config.json': Buffer.from(JSON.stringify(STUB_CONFIG)), 'adapter_model.safetensors': new Uint8Array(8), 'adapter_config.json': Buffer.from('{}') } });
  const put = (s: PolicyServerHandle, body: Uint8Array, key?: string) =>
    fetch(`${s.baseUrl}/weights`, { method: 'PUT', headers: { 'content-type': 'application/msgpack', ...(key ? { authorization: `Bearer ${key}` } : {}) }, body });

  it('refuses pushes without a configured key (403), with a wrong key (401), and bodies that are not a push (400)', async () => {
    const open = await startPolicyServer({ engine: recordingEngine(), checkpointDir: '/ckpt', policyId: 'p', port: 0 });
    servers.push(open);
    const r = await put(open, push);
    expect([r.status, ((await r.json()) as any).error]).toEqual([403, 'this policy server has no --api-key, so it refuses weight pushes: start it with --api-key K']);
    const keyed = await startPolicyServer({ engine: recordingEngine(), checkpointDir: '/ckpt', policyId: 'p', port: 0, apiKey: 'k' });
    servers.push(keyed);
    expect((await put(keyed, push, 'wrong')).status).toBe(401);
    const junk = await put(keyed, Buffer.from('not msgpack at all'), 'k');
    expect(junk.status).toBe(400);
    const noConfig = await put(keyed, encodeWeightsPush({ weights_version: 1, model_id: null, files: { 'model.safetensors': new Uint8Array(4) } }), 'k');
    expect([noConfig.status, ((await noConfig.json()) as any).error]).toEqual([400, 'weights push has no config.json']);
    const escape = await put(keyed, encodeWeightsPush({ weights_version: 1, model_id: null, files: { '../config.json': new Uint8Array(4) } }), 'k');
    expect([escape.status, ((await escape.json()) as any).error]).toEqual([400, 'weights push file name "../config.json" is not a plain file name']);
  });

  it('swaps a good push in and says so in /stats and the metadata', async () => {
    const keyed = await startPolicyServer({ engine: recordingEngine(), checkpointDir: '/ckpt', policyId: 'p', port: 0, apiKey: 'k' });
    servers.push(keyed);
    const r = await put(keyed, push, 'k');
    expect(r.status).toBe(200);
    expect(await r.json()).toMatchObject({ weights_version: 3, previous_version: null });
    const stats = await (await fetch(`${keyed.baseUrl}/stats`, { headers: { authorization: 'Bearer k' } })).json();
    expect(stats).toMatchObject({ swaps: 1, weights_version: 3 });
    expect(keyed.policy.metadata()).toMatchObject({ weights_version: 3, live: false });
  });
});
