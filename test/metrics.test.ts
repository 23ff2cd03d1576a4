/**
 * GET /metrics (PROTOCOL.md section 12): scraped through the real server while a flow05-tiny
 * session trains over its websocket (real engine) and a robot runs the session's live policy over
 * OpenPI's websocket protocol; the exposition text is parsed and its values asserted. Then the
 * standalone `vela policy` server's /metrics, and who may scrape (key, --metrics-public).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { VelaClient, type Datum } from '../protocol/client.ts';
import { ndarray } from '../protocol/ndarray.ts';
import { startPolicyServer, type PolicyServerHandle } from '../server/policy/index.ts';
import { MAX_CONNECTION_SERIES } from '../server/metrics/index.ts';
import { g1Datums, g1Subset } from '../bench/harness/g1.ts';
import { PolicyClient, stubEngine } from '../bench/harness/policy-stub.ts';
import { parseExposition, type Exposition } from './helpers/prom.ts';
import { api, startTestServer, type TestServer } from './helpers/server.ts';

let server: TestServer;
let client: VelaClient;
let batches: Datum[][];
const closers: (() => Promise<void>)[] = [];

async function scrape(baseUrl: string, key: string | null): Promise<{ status: number; type: string | null; text: string }> {
  const res = await fetch(`${baseUrl}/metrics`, { headers: key ? { authorization: `Bearer ${key}` } : {} });
  return { status: res.status, type: res.headers.get('content-type'), text: await res.text() };
}

async function metrics(baseUrl: string, key: string | null): Promise<Exposition> {
  const r = await scrape(baseUrl, key);
  expect(r.status, r.text).toBe(200);
  return parseExposition(r.text);
}

/** A scrape once no policy connection is open (the server sees a close a moment after the client). */
async function withoutConnections(baseUrl: string, key: string | null): Promise<Exposition> {
  let m = await metrics(baseUrl, key);
  for (let i = 0; i < 250 && m.value('vela_policy_connections') !== 0; i++) {
    await new Promise((r) => setTimeout(r, 20));
    m = await metrics(baseUrl, key);
  }
  return m;
}

/** A G1 datum as a robot sends it to the live policy: its JPEG frame, raw state and prompt. */
function robotObservation(d: Datum): Record<string, unknown> {
  return { 'observation/cam_high': Buffer.from(d.observation.image!.cam_high as Uint8Array), image_codec: 'JPEG', 'observation/state': d.observation.state, prompt: d.observation.prompt };
}

const SUBSET = g1Subset(2);

beforeAll(async () => {
  server = await startTestServer({ env: { VELA_DATASETS_DIR: SUBSET.root } });
  closers.push(() => server.close());
  client = new VelaClient(server.baseUrl, server.apiKey);
  batches = [await g1Datums(2, { episode: 0 }), await g1Datums(2, { episode: 1 })];
});
afterAll(async () => {
  for (const c of closers.reverse()) await c();
});

describe('GET /metrics on the main server', () => {
  it('needs a valid API key: 401 without one or with an unknown one', async () => {
    const none = await scrape(server.baseUrl, null);
    expect(none.status).toBe(401);
    expect(JSON.parse(none.text).error).toMatch(/missing API key/);
    const wrong = await scrape(server.baseUrl, 'not-a-key');
    expect(wrong.status).toBe(401);
    expect(JSON.parse(wrong.text).error).toBe('invalid API key');
    const ok = await scrape(server.baseUrl, server.apiKey);
    expect(ok.status).toBe(200);
    expect(ok.type).toBe('text/plain; version=0.0.4; charset=utf-8');
    // Both refusals are counted by route pattern.
    expect(parseExposition(ok.text).value('vela_http_errors_total', { method: 'GET', route: '/metrics', status: '401' })).toBe(2);
  });

  it('shows training, policy, engine, job, database and process series that move while a session trains and a robot is served', async () => {
    const s = await client.waitReady((await client.createSession({ base_model: 'flow05-tiny' })).id);
    const conn = await client.connect(s);
    const train = async (steps: number) => {
      for (let i = 0; i < steps; i++) {
        await conn.forwardBackward(batches[i % 2]!, { codec: 'JPEG' });
        await conn.optimStep({ learning_rate: 1e-3 });
      }
    };
    await train(2); // binds cam_high, so the live policy can serve
    const robot = await PolicyClient.connect(`${server.baseUrl.replace('http', 'ws')}/v1/training_sessions/${s.id}/policy`, { authorization: `Api-Key ${server.apiKey}` });
    const serve = async (n: number) => {
      for (let i = 0; i < n; i++) expect((await robot.infer(robotObservation(batches[0]![i % 2]!))).actions.shape).toEqual([16, 32]);
    };
    await serve(3);
    expect((await api(server, 'GET', '/v1/training_sessions/ts-not-there')).status).toBe(404);
    const a = await metrics(server.baseUrl, server.apiKey);

    await train(2);
    await serve(3);
    // Errors by op: one the engine refuses, one that does not parse.
    await expect(conn.loadState('no-such-state')).rejects.toThrow(/no saved state/);
    await expect(conn.request('no_such_op')).rejects.toThrow(/op/);
    expect((await api(server, 'GET', '/v1/training_sessions/ts-not-there-either')).status).toBe(404);
    // Jobs are counted from the store at scrape time; the db getters are read when the db has them.
    await server.store.insertJob({ id: 'ft-metrics-1', owner: (await server.store.findApiKey(server.apiKey))!, status: 'failed', created_at: 1, config: {}, output_dir: '/nowhere', step: 0, loss: null, eval_loss: null, error: 'made by the test', started_at: null, finished_at: null, cancel_requested: false } as never);
    Object.assign(server.store.db, { errorCount: () => 3, bufferedRecords: () => 5 });
    const b = await metrics(server.baseUrl, server.apiKey);

    // Training: op counts, step times, both by op.
    for (const op of ['forward_backward', 'optim_step']) {
      expect(a.value('vela_training_ops_total', { op })).toBe(2);
      expect(b.value('vela_training_ops_total', { op })).toBe(4);
      expect(a.value('vela_training_op_seconds_count', { op })).toBe(2);
      expect(b.value('vela_training_op_seconds_count', { op })).toBe(4);
      expect(b.value('vela_training_op_seconds_sum', { op })!).toBeGreaterThan(a.value('vela_training_op_seconds_sum', { op })!);
      expect(b.value('vela_training_op_errors_total', { op })).toBeUndefined();
    }
    expect(b.types.get('vela_training_op_seconds')).toBe('histogram');
    expect(a.value('vela_training_op_errors_total', { op: 'load_state' })).toBeUndefined();
    expect(b.value('vela_training_ops_total', { op: 'load_state' })).toBe(1);
    expect(b.value('vela_training_op_errors_total', { op: 'load_state' })).toBe(1);
    expect(b.value('vela_training_op_errors_total', { op: 'invalid' })).toBe(1);

    // Policy: every stage of every request, overall and for the robot's connection.
    expect(a.value('vela_policy_requests_total')).toBe(3);
    expect(b.value('vela_policy_requests_total')).toBe(6);
    for (const stage of ['decode', 'queue_wait', 'compute', 'send', 'total']) {
      expect(a.value('vela_policy_request_seconds_count', { stage })).toBe(3);
      expect(b.value('vela_policy_request_seconds_count', { stage })).toBe(6);
      expect(b.value('vela_policy_connection_request_seconds_count', { policy: s.id, stage })).toBe(6);
    }
    // The total spans the other stages.
    expect(b.value('vela_policy_request_seconds_sum', { stage: 'total' })!).toBeGreaterThanOrEqual(b.value('vela_policy_request_seconds_sum', { stage: 'compute' })!);
    expect(b.value('vela_policy_request_seconds_sum', { stage: 'compute' })!).toBeGreaterThan(0);
    // Gaps between the robot's requests (n - 1) and their jitter (n - 2).
    expect(a.value('vela_policy_request_interval_seconds_count')).toBe(2);
    expect(b.value('vela_policy_request_interval_seconds_count')).toBe(5);
    expect(b.value('vela_policy_request_jitter_seconds_count')).toBe(4);
    expect(b.value('vela_policy_connection_request_interval_seconds_count', { policy: s.id })).toBe(5);
    // One robot: each request is a batch of one.
    expect(b.value('vela_policy_batch_size_count')).toBe(6);
    expect(b.value('vela_policy_batch_size_sum')).toBe(6);
    expect(b.value('vela_policy_batch_size_bucket', { le: '1' })).toBe(6);
    expect(b.value('vela_policy_connection_batch_size_sum', { policy: s.id })).toBe(6);
    expect(b.value('vela_policy_connections')).toBe(1);

    // The training engine's memory, pushed by its worker with every answer.
    const mem = b.all('vela_engine_memory_bytes', { preset: 'flow05-tiny', lane: 'training' });
    expect(mem).toHaveLength(1);
    expect(mem[0]!.value).toBeGreaterThan(1e6);
    expect(b.value('vela_engine_tensors', { preset: 'flow05-tiny', lane: 'training' })!).toBeGreaterThan(10);

    // Jobs by state, every state present; the db gauges.
    for (const state of ['queued', 'running', 'succeeded', 'cancelled']) expect(b.value('vela_jobs', { state })).toBe(0);
    expect(a.value('vela_jobs', { state: 'failed' })).toBe(0);
    expect(b.value('vela_jobs', { state: 'failed' })).toBe(1);
    expect(a.value('vela_db_errors_total')).toBe(0);
    expect(b.value('vela_db_errors_total')).toBe(3);
    expect(b.value('vela_db_buffered_records')).toBe(5);

    // HTTP errors by route pattern, never by raw URL.
    const notFound = { method: 'GET', route: '/v1/training_sessions/:id', status: '404' };
    expect(a.value('vela_http_errors_total', notFound)).toBe(1);
    expect(b.value('vela_http_errors_total', notFound)).toBe(2);
    expect(b.samples.some((x) => Object.values(x.labels).some((v) => v.includes('ts-not-there')))).toBe(false);

    // Node's own: RSS, event-loop lag.
    expect(b.value('process_resident_memory_bytes')!).toBeGreaterThan(50e6);
    expect(b.value('nodejs_eventloop_lag_seconds')).toBeGreaterThanOrEqual(0);

    // The robot leaves: its connection's series go with it.
    robot.close();
    await robot.closed();
    const c = await withoutConnections(server.baseUrl, server.apiKey);
    expect(c.value('vela_policy_connections')).toBe(0);
    expect(c.all('vela_policy_connection_request_seconds_count')).toEqual([]);
    expect(c.value('vela_policy_request_seconds_count', { stage: 'total' })).toBe(6);
    conn.close();
  });

  it('counts a fine-tune\'s steps and its state as it runs to the end', async () => {
    const a = await metrics(server.baseUrl, server.apiKey);
    const { status, json } = await api(server, 'POST', '/v1/fine-tunes', { model: 'flow05-tiny', dataset_name: SUBSET.name, steps: 3, batch_size: 2, eval_every: 0, checkpoint_every: 100 });
    expect(status, JSON.stringify(json)).toBe(200);
    let job = json;
    for (let i = 0; i < 1500 && !['succeeded', 'failed', 'cancelled'].includes(job.status); i++) {
      await new Promise((r) => setTimeout(r, 200));
      job = (await api(server, 'GET', `/v1/fine-tunes/${json.id}`)).json;
    }
    expect(job.status, job.error).toBe('succeeded');
    const b = await metrics(server.baseUrl, server.apiKey);
    expect(b.value('vela_jobs', { state: 'succeeded' })).toBe(a.value('vela_jobs', { state: 'succeeded' })! + 1);
    expect(b.value('vela_jobs', { state: 'running' })).toBe(0);
    expect(a.value('vela_job_steps_total') ?? 0).toBe(0);
    expect(b.value('vela_job_steps_total')).toBe(3);
    expect(b.value('vela_job_step_seconds_count')).toBe(3);
    expect(b.value('vela_job_step_seconds_sum')!).toBeGreaterThan(0);
  });

  it('answers without a key when the operator sets --metrics-public (VELA_METRICS_PUBLIC=1)', async () => {
    const open = await startTestServer({ env: { VELA_METRICS_PUBLIC: '1' } });
    closers.push(() => open.close());
    const r = await scrape(open.baseUrl, null);
    expect(r.status).toBe(200);
    expect(parseExposition(r.text).value('process_resident_memory_bytes')!).toBeGreaterThan(0);
  });
});

describe('GET /metrics of vela policy (standalone)', () => {
  const KEY = 'policy-metrics-key';
  const observation = (i: number) => ({
    'observation/image': ndarray(new Uint8Array(20 * 30 * 3).fill(i), [20, 30, 3]),
    'observation/wrist_image': ndarray(new Uint8Array(20 * 30 * 3).fill(2 * i), [20, 30, 3]),
    'observation/state': ndarray(Float32Array.of(0.5, -1.25, 2, 0.75, -3, 1.5, i), [7]),
    prompt: `pick up the bottle ${i}`,
  });
  const start = async (opts: { apiKey?: string; metricsPublic?: boolean; policyId?: string; wsCaps?: { connectionsPerKey: number } }): Promise<PolicyServerHandle> => {
    const s = await startPolicyServer({ engine: stubEngine(), checkpointDir: '/ckpt/run-1', policyId: 'pol-metrics', seed: 7, batchWindowMs: 0, port: 0, ...opts });
    closers.push(() => s.close());
    return s;
  };

  it('is behind --api-key and counts the robot\'s requests', async () => {
    const s = await start({ apiKey: KEY });
    expect((await scrape(s.baseUrl, null)).status).toBe(401);
    expect((await scrape(s.baseUrl, 'wrong')).status).toBe(401);
    const before = await metrics(s.baseUrl, KEY);
    const robot = await PolicyClient.connect(s.wsUrl, { authorization: `Api-Key ${KEY}` });
    for (let i = 0; i < 2; i++) expect((await robot.infer(observation(i))).actions.shape).toEqual([5, 6]);
    const after = await metrics(s.baseUrl, KEY);
    expect(after.value('vela_policy_requests_total')! - (before.value('vela_policy_requests_total') ?? 0)).toBe(2);
    expect(after.value('vela_policy_connection_request_seconds_count', { policy: 'pol-metrics', stage: 'compute' })).toBe(2);
    expect(after.value('vela_policy_connection_request_interval_seconds_count', { policy: 'pol-metrics' })).toBe(1);
    robot.close();
    await robot.closed();
  });

  it(`gives at most ${MAX_CONNECTION_SERIES} open connections their own series, and drops them on close`, async () => {
    // More robots than one address may open by default (16): the cap is raised for this test.
    const s = await start({ metricsPublic: true, policyId: 'pol-many', wsCaps: { connectionsPerKey: MAX_CONNECTION_SERIES + 2 } });
    expect((await withoutConnections(s.baseUrl, null)).value('vela_policy_connections')).toBe(0);
    const robots = await Promise.all(Array.from({ length: MAX_CONNECTION_SERIES + 2 }, () => PolicyClient.connect(s.wsUrl)));
    await Promise.all(robots.map(async (r, i) => expect((await r.infer(observation(i % 3))).actions.shape).toEqual([5, 6])));
    const m = await metrics(s.baseUrl, null);
    expect(m.value('vela_policy_connections')).toBe(MAX_CONNECTION_SERIES + 2);
    const labelled = m.all('vela_policy_connection_request_seconds_count', { policy: 'pol-many', stage: 'total' });
    expect(labelled).toHaveLength(MAX_CONNECTION_SERIES);
    expect(labelled.every((x) => x.value === 1)).toBe(true);
    for (const r of robots) r.close();
    await Promise.all(robots.map((r) => r.closed()));
    const after = await withoutConnections(s.baseUrl, null);
    expect(after.value('vela_policy_connections')).toBe(0);
    expect(after.all('vela_policy_connection_request_seconds_count')).toEqual([]);
    expect(after.all('vela_policy_connection_batch_size_count')).toEqual([]);
  });

  it('answers without the key with --metrics-public', async () => {
    const s = await start({ apiKey: KEY, metricsPublic: true });
    const r = await scrape(s.baseUrl, null);
    expect(r.status).toBe(200);
    expect(parseExposition(r.text).types.get('vela_policy_request_seconds')).toBe('histogram');
    // The other routes keep their key.
    expect((await fetch(`${s.baseUrl}/stats`)).status).toBe(401);
  });
});
