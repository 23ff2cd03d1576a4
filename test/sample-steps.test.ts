/**
 * A session's `sample` cannot be made to hold memory without bound (issue 33 item 1), through the
 * real server (uWS, the engine worker, native TensorFlow): num_steps and the batch size are the
 * client's, so a graph is traced only for the default layout (the model's num_steps, a batch of
 * 1, 2, 4, 8 or 16) and every other one samples eagerly with the same answer; the engine's graph
 * counters in GET /metrics say what it traced and holds. A sample whose estimate
 * (kernels/small/memory.ts) exceeds what --max-memory leaves is refused with insufficient_memory
 * and the estimate in one line (the session websocket and the futures API alike), and the server
answers the next request as before.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { relDiff, sampleBound } from './helpers/float32.ts';
import { VelaClient, VelaError, type Datum } from '../protocol/client.ts';
import { makeConfig } from '../kernels/small/config.ts';
import { estimatePassMemory, estimateSampleMemory } from '../kernels/small/memory.ts';
import { parseExposition } from './helpers/prom.ts';
import { FutureError, FuturesClient } from './helpers/futures-client.ts';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { syntheticDatum } from './helpers/synthetic.ts';
import { NATIVE_PRESENT, TEST_BACKENDS } from './helpers/tf.ts';

const STEPS = [10, 37, 100, 250];
const datums = (n: number): Datum[] => Array.from({ length: n }, (_, k) => syntheticDatum(k));


async function graphCounters(server: TestServer): Promise<{ traced: number; cached: number; bytes: number }> {
  const res = await fetch(`${server.baseUrl}/metrics`, { headers: { authorization: `Bearer ${server.apiKey}` } });
  const m = parseExposition(await res.text());
  const labels = { preset: 'flow0-tiny', lane: 'training' };
  return { traced: m.value('vela_engine_graphs_traced', labels)!, cached: m.value('vela_engine_graphs', labels)!, bytes: m.value('vela_engine_graph_bytes', labels)! };
}

/** A seeded flow0-tiny LoRA session on `server`: its connection. */
async function openSession(server: TestServer) {
  const client = new VelaClient(server.baseUrl, server.apiKey);
  const s = await client.waitReady((await client.createSession({ base_model: 'flow0-tiny', seed: 3 })).id);
  return client.connect(s);
}

async function sampleAll(conn: Awaited<ReturnType<typeof openSession>>): Promise<Float32Array[]> {
  const out: Float32Array[] = [];
  for (const n of STEPS) out.push((await conn.sample(datums(2), { num_steps: n, seed: 7 })).actions.data as Float32Array);
  out.push((await conn.sample(datums(3), { num_steps: 10, seed: 7 })).actions.data as Float32Array);
  return out;
}

describe.runIf(NATIVE_PRESENT && TEST_BACKENDS[0] === 'node')('a session sample: bounded graphs, planned memory', () => {
  let graphs: Float32Array[];
  let eager: Float32Array[];
  let counters: { traced: number; cached: number; bytes: number };
  let refusal: VelaError | null = null;
  let after: Float32Array;
  let futuresRefusal: FutureError | null = null;
  let passRefusal: VelaError | null = null;
  let futuresAfter: Float32Array;
  // 1 camera (syntheticDatum's cam_high): a batch of 256 at any num_steps needs ~1.2 GB.
  const huge = estimateSampleMemory(makeConfig('flow0-tiny'), 256, 1).totalBytes;
  const small = estimateSampleMemory(makeConfig('flow0-tiny'), 3, 1).totalBytes;
  const servers: TestServer[] = [];

  beforeAll(async () => {
    // Room for the engine, its graphs and a small sample, not for the huge one: the cap is what
    // this process holds now plus less than the huge estimate.
    const cap = Math.round(process.memoryUsage.rss() + huge - 64 * 2 ** 20);
    const a = await startTestServer({ env: { VELA_MAX_MEMORY: String(cap) } });
    servers.push(a);
    const conn = await openSession(a);
    graphs = await sampleAll(conn);
    try {
      await conn.sample(datums(256), { num_steps: 1000, seed: 7 });
    } catch (e) {
      refusal = e as VelaError;
    }
    // The batch size of a training pass: planned the same way (kernels/small/memory.ts estimatePassMemory).
    try {
      await conn.forwardBackward(datums(256));
    } catch (e) {
      passRefusal = e as VelaError;
    }
    after = (await conn.sample(datums(2), { num_steps: 37, seed: 7 })).actions.data as Float32Array;
    // The futures API's sample: the same plan, a failed future with the same code.
    const futures = new FuturesClient(a.baseUrl, a.apiKey);
    const { model_id } = await futures.createModel({ base_model: 'flow0-tiny', seed: 3 });
    try {
      await futures.run('sample', { model_id, data: datums(256), codec: 'RAW', num_steps: 1000, seed: 7 });
    } catch (e) {
      futuresRefusal = e as FutureError;
    }
    futuresAfter = (await futures.run('sample', { model_id, data: datums(2), codec: 'RAW', num_steps: 37, seed: 7 })).actions.data as Float32Array;
    counters = await graphCounters(a);
    await a.close();
    servers.pop();
    const before = process.env.VELA_GRAPHS;
    process.env.VELA_GRAPHS = '0'; // the engine worker copies the environment at its start
    try {
      const b = await startTestServer();
      servers.push(b);
      eager = await sampleAll(await openSession(b));
    } finally {
      if (before === undefined) delete process.env.VELA_GRAPHS;
      else process.env.VELA_GRAPHS = before;
    }
  }, 300_000);
  afterAll(async () => {
    for (const s of servers) await s.close();
  });

  it('traces only the default layout (num_steps 10 at batch 2) whatever num_steps and batch the client sends', () => {
    expect(counters.traced).toBe(1);
    expect(counters.cached).toBe(1);
    // One 10-step batch-2 graph: ~3,600 ops at GRAPH_BYTES_PER_OP (20 KiB), its constants small.
    expect(counters.bytes).toBeGreaterThan(3000 * 20 * 1024);
    expect(counters.bytes).toBeLessThan(5000 * 20 * 1024 + 4 * 2 ** 20);
  });

  it('answers what the eager sampler answers at every num_steps', () => {
    expect(graphs).toHaveLength(eager.length);
    // num_steps 10 at batch 2 ran as a graph: float32 rounding of Grappler's rewrites (graphs-server.test.ts).
    const bound = sampleBound(makeConfig('flow0-tiny').mlpDim);
    expect(relDiff(graphs[0]!, eager[0]!)).toBeLessThan(bound);
    // The others ran eagerly on both servers: the same ops on the same inputs (held to the same
    // derived bound: two processes may still pick other kernels' blockings).
    for (let k = 1; k < eager.length; k++) expect(relDiff(graphs[k]!, eager[k]!), `case ${k}`).toBeLessThan(bound);
    // num_steps changes the answer (a graph reused across step counts would not).
    expect(relDiff(graphs[1]!, graphs[0]!)).toBeGreaterThan(1e-3);
  });

  it('refuses a sample whose memory does not fit with insufficient_memory and the estimate; the next request works', () => {
    expect(small).toBeLessThan(64 * 2 ** 20);
    expect(refusal).toBeInstanceOf(VelaError);
    expect(refusal!.code).toBe('insufficient_memory');
    expect(refusal!.message).toMatch(/^sample of 256 datum\(s\) with 1 camera\(s\) on flow0-tiny needs about [\d.]+ GB \([\d.]+ GiB\) \(activations [\d.]+ GB/);
    expect(refusal!.message).toContain(`about ${(huge / 1e9).toFixed(1)} GB`);
    expect(refusal!.message).toMatch(/lower batch_size, or .*raise --max-memory/);
    expect(refusal!.message).not.toContain('\n');
    expect(relDiff(after, graphs[1]!)).toBe(0);
    expect(passRefusal).toBeInstanceOf(VelaError);
    expect(passRefusal!.code).toBe('insufficient_memory');
    expect(passRefusal!.message).toContain(`forward_backward of 256 datum(s) with 1 camera(s) on flow0-tiny needs about ${(estimatePassMemory(makeConfig('flow0-tiny'), 256, 1).totalBytes / 1e9).toFixed(1)} GB`);
    // The futures API: the future fails with the same line and code, the user's to fix.
    expect(futuresRefusal).toBeInstanceOf(FutureError);
    expect(futuresRefusal!.category).toBe('user');
    expect(futuresRefusal!.body.code).toBe('insufficient_memory');
    expect(futuresRefusal!.message).toContain(`sample of 256 datum(s) with 1 camera(s) on flow0-tiny needs about ${(huge / 1e9).toFixed(1)} GB`);
    expect(relDiff(futuresAfter, graphs[1]!)).toBe(0);
  });
});
