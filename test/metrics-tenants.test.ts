/**
 * GET /metrics between tenants (issue 32, item 13), through the real server and its engines:
 * key A serves a fine-tune's policy (flow0-tiny, real engine) and a training session's live
 * policy (flow05-tiny) to robots; key B, to which A's objects are a 404, scrapes and finds no
 * line naming them, while A's scrape and the operator's (--metrics-key; keyless with
 * --metrics-public) have their series. Once the policy is unloaded (idle) or the session
 * closed, the series naming them are gone from the operator's scrape too.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { NormStatsSet } from '../kernels/normalize.ts';
import { VelaClient, type Datum } from '../protocol/client.ts';
import { ndarray } from '../protocol/ndarray.ts';
import { clearSeriesOwner, setSeriesOwner, tenantView } from '../server/metrics/owners.ts';
import { nowS } from '../server/store/store.ts';
import { g1Datums, g1Subset } from '../bench/harness/g1.ts';
import { tinyLoraCheckpoint } from './helpers/policy-proc.ts';
import { PolicyClient } from '../bench/harness/policy-stub.ts';
import { parseExposition, type Exposition } from './helpers/prom.ts';
import { api, startTestServer, TEST_KEY, type TestServer } from './helpers/server.ts';

const OPERATOR_KEY = 'metrics-operator-key-0123456789';
const JOB = 'ft-tenanta0001';
/** The id the fine-tune's policy is served (and labelled) under. */
const POLICY = `policy-${JOB}`;
const D = 7;
/** Every joint around 0 with std 0.5: a state of 60 is |z| = 120, far past the limit of 6. */
const STATS: NormStatsSet = {
  state: { mean: new Array(D).fill(0), std: new Array(D).fill(0.5), q01: new Array(D).fill(-1.2), q99: new Array(D).fill(1.2) },
  actions: { mean: new Array(6).fill(0), std: new Array(6).fill(0.5), q01: new Array(6).fill(-1.2), q99: new Array(6).fill(1.2) },
};
const SUBSET = g1Subset(2);

let server: TestServer;
let keyB = '';
let tmp = '';
const closers: (() => Promise<void>)[] = [];

async function scrape(baseUrl: string, key: string | null): Promise<{ status: number; text: string; m: Exposition }> {
  const res = await fetch(`${baseUrl}/metrics`, { headers: key ? { authorization: `Bearer ${key}` } : {} });
  const text = await res.text();
  return { status: res.status, text, m: res.status === 200 ? parseExposition(text) : parseExposition('') };
}

/** The sample lines of a scrape that contain `id`. */
const naming = (text: string, id: string) => text.split('\n').filter((l) => !l.startsWith('#') && l.includes(id));

/** A robot's observation for the fine-tune's checkpoint: one camera, a state of `value` in every dim. */
const observation = (value: number) => ({
  'observation/cam_high': ndarray(new Uint8Array(24 * 32 * 3).fill(90), [24, 32, 3]),
  'observation/state': ndarray(new Float32Array(D).fill(value), [D]),
  prompt: 'pick up the cube',
});

beforeAll(async () => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-metrics-tenants-'));
  // Idle policies unload after 1 s (the sweep runs every 250 ms).
  server = await startTestServer({ env: { VELA_DATASETS_DIR: SUBSET.root, VELA_INFER_IDLE_S: '1', VELA_METRICS_KEY: OPERATOR_KEY } });
  closers.push(() => server.close());
  keyB = (await server.store.createApiKey('tenant b')).key;
  // A's finished fine-tune, as the jobs runner records one: its output is a flow0-tiny checkpoint.
  const out = path.join(tmp, 'job-output');
  await tinyLoraCheckpoint(out, { cameras: ['cam_high'], action_dim: 6, action_horizon: 4 }, STATS);
  await server.store.insertJob({
    id: JOB, owner: (await server.store.findApiKey(TEST_KEY))!, status: 'succeeded', created_at: nowS(), config: { model: 'flow0-tiny', dataset_name: 'pick' },
    step: 3, loss: null, eval_loss: null, error: null, output_dir: out, started_at: nowS(), finished_at: nowS(), cancel_requested: false,
  });
}, 120_000);
afterAll(async () => {
  for (const c of closers.reverse()) await c();
  if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
});

describe('GET /metrics: a tenant sees no other tenant\'s objects', () => {
  it('a fine-tune\'s policy: B\'s scrape names none of A\'s job, A\'s and the operator\'s do; unloaded, its series are gone', async () => {
    const wsUrl = `${server.baseUrl.replace('http', 'ws')}/v1/fine-tunes/${JOB}/policy`;
    // To B, A's job does not exist.
    await expect(PolicyClient.connect(wsUrl, { authorization: `Api-Key ${keyB}` })).rejects.toMatchObject({ status: 404 });
    const robot = await PolicyClient.connect(wsUrl, { authorization: `Api-Key ${TEST_KEY}` });
    for (let i = 0; i < 2; i++) {
      const a = await robot.infer(observation(60));
      expect(a.actions.shape).toEqual([4, 6]);
      expect(a.warnings).toHaveLength(1); // out of range: counted by policy
    }

    const a = await scrape(server.baseUrl, TEST_KEY);
    const b = await scrape(server.baseUrl, keyB);
    const op = await scrape(server.baseUrl, OPERATOR_KEY);
    for (const s of [a, b, op]) expect(s.status, s.text).toBe(200);
    // B: not one line names A's job (the policy's id holds the job's), but the aggregates are there.
    expect(naming(b.text, JOB)).toEqual([]);
    expect(b.m.value('vela_policy_requests_total')).toBe(2);
    expect(b.m.value('vela_policy_request_seconds_count', { stage: 'total' })).toBe(2);
    expect(b.m.value('vela_policy_connections')).toBe(1);
    // A and the operator: the connection's series and the out-of-range counter, by A's policy.
    for (const s of [a, op]) {
      expect(s.m.value('vela_policy_observations_out_of_range_total', { policy: POLICY })).toBe(2);
      expect(s.m.value('vela_policy_connection_request_seconds_count', { policy: POLICY, stage: 'total' })).toBe(2);
      expect(s.m.value('vela_policy_connection_batch_size_count', { policy: POLICY })).toBe(2);
    }
    // What A sees of its own objects is what the operator sees of them.
    expect(naming(a.text, JOB).length).toBeGreaterThan(0);
    expect(naming(a.text, JOB)).toEqual(naming(op.text, JOB));

    // The operator's key is no API key: it opens no other route, and a scrape without a key is refused here.
    expect((await api(server, 'GET', '/v1/fine-tunes', undefined, OPERATOR_KEY)).status).toBe(401);
    expect((await scrape(server.baseUrl, null)).status).toBe(401);

    // --metrics-public: a scrape without a key is the operator's (every series of the process,
    // A's policy included); one with a key of that server is still that key's, without A's.
    const open = await startTestServer({ env: { VELA_METRICS_PUBLIC: '1' } });
    closers.push(() => open.close());
    const keyless = await scrape(open.baseUrl, null);
    expect(keyless.m.value('vela_policy_observations_out_of_range_total', { policy: POLICY })).toBe(2);
    const keyed = await scrape(open.baseUrl, TEST_KEY); // the same key string, another store: another owner
    expect(keyed.status).toBe(200);
    expect(naming(keyed.text, JOB)).toEqual([]);

    // The robot leaves; a second later the idle policy is unloaded, and its series go with it.
    robot.close();
    await robot.closed();
    let after = await scrape(server.baseUrl, OPERATOR_KEY);
    for (let i = 0; i < 300 && naming(after.text, JOB).length > 0; i++) {
      await new Promise((r) => setTimeout(r, 50));
      after = await scrape(server.baseUrl, OPERATOR_KEY);
    }
    expect(naming(after.text, JOB)).toEqual([]);
    expect(after.m.all('vela_policy_observations_out_of_range_total')).toEqual([]);
    expect(after.m.value('vela_policy_requests_total')).toBe(2); // the aggregates stay
  }, 120_000);

  it('a training session\'s live policy: B\'s scrape names none of A\'s session; closed, its series are gone while the robot is still connected', async () => {
    const client = new VelaClient(server.baseUrl, TEST_KEY);
    const batch: Datum[] = await g1Datums(2, { episode: 0 });
    const s = await client.waitReady((await client.createSession({ base_model: 'flow05-tiny' })).id);
    const conn = await client.connect(s);
    await conn.forwardBackward(batch, { codec: 'JPEG' }); // binds cam_high: the live policy can serve
    const robot = await PolicyClient.connect(`${server.baseUrl.replace('http', 'ws')}/v1/training_sessions/${s.id}/policy`, { authorization: `Api-Key ${TEST_KEY}` });
    const d = batch[0]!;
    const answer = await robot.infer({ 'observation/cam_high': Buffer.from(d.observation.image!.cam_high as Uint8Array), image_codec: 'JPEG', 'observation/state': d.observation.state, prompt: d.observation.prompt });
    expect(answer.actions.shape).toEqual([16, 32]);

    const b = await scrape(server.baseUrl, keyB);
    expect(b.status).toBe(200);
    expect(naming(b.text, s.id)).toEqual([]);
    expect(b.m.value('vela_policy_connections')).toBe(1);
    for (const key of [TEST_KEY, OPERATOR_KEY]) {
      const m = (await scrape(server.baseUrl, key)).m;
      expect(m.value('vela_policy_connection_request_seconds_count', { policy: s.id, stage: 'total' })).toBe(1);
    }

    // Closing the session unloads its live policy at once: no series names it, though the robot's socket is open.
    expect((await api(server, 'POST', `/v1/training_sessions/${s.id}/close`)).status).toBe(200);
    const after = await scrape(server.baseUrl, OPERATOR_KEY);
    expect(naming(after.text, s.id)).toEqual([]);
    expect(after.m.all('vela_policy_connection_request_seconds_count')).toEqual([]);
    expect(after.m.value('vela_policy_connections')).toBe(1);
    robot.close();
    await robot.closed();
    conn.close();
  }, 180_000);
});

describe('tenantView (the filter of a key\'s scrape)', () => {
  it('keeps comments, series without an object label and the owner\'s own; reads escaped values; an unknown owner is the operator\'s only', () => {
    setSeriesOwner('policy', 'pol-a', 'key-a');
    setSeriesOwner('policy', 'pol "b"\\x', 'key-b');
    const text = [
      '# HELP vela_x a help text naming policy="pol-b"',
      '# TYPE vela_x counter',
      'vela_total 3',
      'vela_x{policy="pol-a"} 1',
      'vela_x{policy="pol \\"b\\"\\\\x"} 2', // the format's escapes of pol "b"\x
      'vela_x{connection="c1",policy="pol-a",stage="total"} 4',
      'vela_x{route="/v1/x,policy=\\"pol-a\\""} 5', // not a policy label: a route's value
      'vela_x{policy="pol-unknown"} 6',
      '',
    ].join('\n');
    expect(tenantView(text, 'key-a').split('\n')).toEqual([
      '# HELP vela_x a help text naming policy="pol-b"', '# TYPE vela_x counter', 'vela_total 3',
      'vela_x{policy="pol-a"} 1', 'vela_x{connection="c1",policy="pol-a",stage="total"} 4', 'vela_x{route="/v1/x,policy=\\"pol-a\\""} 5', '',
    ]);
    expect(tenantView(text, 'key-b').split('\n').filter((l) => l.startsWith('vela_x{'))).toEqual(['vela_x{policy="pol \\"b\\"\\\\x"} 2', 'vela_x{route="/v1/x,policy=\\"pol-a\\""} 5']);
    clearSeriesOwner('policy', 'pol-a');
    expect(tenantView(text, 'key-a')).not.toContain('pol-a"} 1');
    clearSeriesOwner('policy', 'pol "b"\\x');
  });
});
