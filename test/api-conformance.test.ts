/**
 * What the README's conformance table calls "same" (or "adapted") and no other test showed
 * (issue 33: "no row says same that a test does not show"), through the real server and engine
 * (flow05-tiny) with the shipped G1 sample under the datasets root:
 * - Relay: a fine-tune job and a training session have every field Relay's HTTP document lists;
 *   `GET /v1/fine-tunes` is `{"data": [jobs]}`, newest first; errors are `{"error"}` with 400,
 *   401 and 404 (another key's job is not found);
 * - Relay: the session websocket's messages as the document orders them, on a raw socket: the
 *   `info` message first, then each request answered in order as `{id, result}` or `{id, error}`,
 *   arrays as OpenPI's maps with binary keys (`__ndarray__`, `data`, `dtype`, `shape`);
 * - Relay: a datum's frames may be sent with the document's codec names, `LOSSLESS` (ZPNG) and
 *   `CODEC_JPEG_Q90`: the same pixels give the same sampled actions as RAW and `JPEG`;
 * - xorl: a zero valid-token denominator is a hard data error. A robot datum has no tokens; the
 *   denominator is the sum of the datums' `weight`: non-finite or negative weights are refused at
 *   forward_backward, and `optim_step` on a zero sum is refused (`no_gradients`) without a change,
 *   so abort_gradient_epoch starts a new epoch;
 * - xorl: `GET /health` is xorl's shape plus `backend` and `engines`; `POST /sleep` and
 *   `/wake_up` move every model of the caller's key and none of another key's.
 */
import WebSocket from 'ws';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { pack, unpack } from '../protocol/msgpack.ts';
import { fromWire, toWire } from '../protocol/ndarray.ts';
import { VelaClient, type Datum } from '../protocol/client.ts';
import { encodeFrame } from '../protocol/frames.ts';
import { ndarray, type NDArray } from '../protocol/ndarray.ts';
import { initZstd } from '../protocol/zstd.ts';
import { g1Datums, g1Subset } from '../bench/harness/g1.ts';
import { FutureError, FuturesClient } from './helpers/futures-client.ts';
import { api, startTestServer, TEST_KEY, type TestServer } from './helpers/server.ts';
import { syntheticBatch } from './helpers/synthetic.ts';

const SUBSET = g1Subset(2);
let server: TestServer;
let client: VelaClient;

beforeAll(async () => {
  await initZstd();
  server = await startTestServer({ env: { VELA_DATASETS_DIR: SUBSET.root } });
  client = new VelaClient(server.baseUrl, server.apiKey);
});
afterAll(() => server.close());

/** A job's fields in Relay's HTTP document ("A job is JSON: ..."). */
const RELAY_JOB_FIELDS = ['id', 'status', 'created_at', 'model', 'dataset_name', 'batch_size', 'learning_rate', 'steps', 'finetune', 'lora_rank', 'lora_alpha', 'targets', 'cameras', 'name', 'step', 'loss', 'error', 'output_dir'];
/** A session's fields in the document: "id, status, created_at, its request's fields, url, token and error". */
const RELAY_SESSION_FIELDS = ['id', 'status', 'created_at', 'base_model', 'finetune', 'rank', 'alpha', 'targets', 'action_horizon', 'url', 'token', 'error'];

describe("Relay's fine-tunes and training sessions, field by field", () => {
  it('a job has every field of the document; the list is {"data": [jobs]}, newest first; cancel answers the job', async () => {
    const body = (name: string) => ({ model: 'flow05-tiny', dataset_name: SUBSET.name, batch_size: 2, steps: 1000, eval_every: 0, name });
    const a = await api(server, 'POST', '/v1/fine-tunes', body('first'));
    const b = await api(server, 'POST', '/v1/fine-tunes', body('second'));
    expect([a.status, b.status]).toEqual([200, 200]);
    for (const j of [a.json, b.json]) expect(Object.keys(j)).toEqual(expect.arrayContaining(RELAY_JOB_FIELDS));
    expect(a.json).toMatchObject({ model: 'flow05-tiny', dataset_name: SUBSET.name, batch_size: 2, steps: 1000, name: 'first', step: 0, loss: null, error: null });
    const list = await api(server, 'GET', '/v1/fine-tunes');
    expect(Object.keys(list.json)).toContain('data');
    expect(list.json.data.map((j: { id: string }) => j.id)).toEqual([b.json.id, a.json.id]); // newest first
    for (const id of [a.json.id, b.json.id]) {
      const got = await api(server, 'GET', `/v1/fine-tunes/${id}`);
      expect(Object.keys(got.json)).toEqual(expect.arrayContaining(RELAY_JOB_FIELDS));
      const cancelled = await api(server, 'POST', `/v1/fine-tunes/${id}/cancel`);
      expect(cancelled.status).toBe(200);
      expect(cancelled.json.id).toBe(id);
      expect(Object.keys(cancelled.json)).toEqual(expect.arrayContaining(RELAY_JOB_FIELDS));
      const events = await api(server, 'GET', `/v1/fine-tunes/${id}/events`);
      expect(Array.isArray(events.json.data)).toBe(true);
    }
  });

  it('errors are {"error": message}: 400 for a bad body, 401 without a key or with a wrong one, 404 for another key\'s job', async () => {
    const bad = await api(server, 'POST', '/v1/fine-tunes', { dataset_name: SUBSET.name, steps: 0 });
    const noKey = await api(server, 'GET', '/v1/fine-tunes', undefined, null);
    const wrongKey = await api(server, 'GET', '/v1/training_sessions', undefined, 'not-a-key');
    const { json: job } = await api(server, 'POST', '/v1/fine-tunes', { model: 'flow05-tiny', dataset_name: SUBSET.name, steps: 1000, eval_every: 0 });
    await api(server, 'POST', `/v1/fine-tunes/${job.id}/cancel`);
    const other = (await server.store.createApiKey('other')).key;
    const notYours = await api(server, 'GET', `/v1/fine-tunes/${job.id}`, undefined, other);
    const unknown = await api(server, 'GET', '/v1/fine-tunes/ft-doesnotexist');
    for (const [r, status] of [[bad, 400], [noKey, 401], [wrongKey, 401], [notYours, 404], [unknown, 404]] as const) {
      expect(r.status).toBe(status);
      expect(Object.keys(r.json)).toEqual(['error']);
      expect(typeof r.json.error).toBe('string');
    }
    expect(bad.json.error).toMatch(/^steps must be an integer in 1\.\.1000000/);
  });

  it('a session has every field of the document, before and after it is ready, and after close', async () => {
    const created = await api(server, 'POST', '/v1/training_sessions', { base_model: 'flow05-tiny', rank: 4, alpha: 8 });
    expect(created.status).toBe(200);
    expect(Object.keys(created.json)).toEqual(expect.arrayContaining(RELAY_SESSION_FIELDS));
    expect(created.json).toMatchObject({ base_model: 'flow05-tiny', finetune: 'lora', rank: 4, alpha: 8, error: null });
    const ready = await client.waitReady(created.json.id);
    expect(ready.status).toBe('ready');
    expect(Object.keys(ready)).toEqual(expect.arrayContaining(RELAY_SESSION_FIELDS));
    const closed = await api(server, 'POST', `/v1/training_sessions/${created.json.id}/close`);
    expect(closed.json.status).toBe('closed');
    expect(Object.keys(closed.json)).toEqual(expect.arrayContaining(RELAY_SESSION_FIELDS));
  });
});

describe("Relay's session websocket, message by message", () => {
  it('sends {"info": {model, action_horizon, action_dim, trainable_params}} first, then answers pipelined requests in order: {id, result} or {id, error}', async () => {
    const s = await client.waitReady((await client.createSession({ base_model: 'flow05-tiny', rank: 4, alpha: 8 })).id);
    const ws = new WebSocket(s.url, { headers: { authorization: `Bearer ${s.token}` } });
    const messages: Record<string, any>[] = [];
    const frames: Buffer[] = [];
    const data = syntheticBatch(0);
    await new Promise<void>((resolve, reject) => {
      ws.on('error', reject);
      ws.on('message', (bytes: Buffer) => {
        frames.push(bytes);
        messages.push(fromWire(unpack(bytes)) as Record<string, any>);
        if (messages.length === 1) {
          // Sent before any answer: forward_backward, an op that does not exist, optim_step, sample.
          for (const req of [
            { id: 1, op: 'forward_backward', data, codec: 'RAW' },
            { id: 2, op: 'no_such_op' },
            { id: 3, op: 'optim_step', learning_rate: 1e-3 },
            { id: 4, op: 'sample', data, codec: 'RAW', num_steps: 2, seed: 0 },
          ]) ws.send(pack(toWire(req)));
        }
        if (messages.length === 5) resolve();
      });
    });
    ws.close();
    const [greeting, ...answers] = messages;
    expect(Object.keys(greeting!)).toEqual(['info']);
    expect(greeting!.info).toMatchObject({ model: 'flow05-tiny', action_horizon: 16, action_dim: 32 });
    expect(greeting!.info.trainable_params).toBeGreaterThan(0);
    expect(answers.map((a) => a.id)).toEqual([1, 2, 3, 4]);
    expect(Object.keys(answers[0]!.result).sort()).toEqual(['loss', 'loss_per_datum']);
    // OpenPI's array encoding: loss_per_datum is a map with binary keys, __ndarray__ first (bin 8, 11 bytes).
    const binKey = (k: string) => Buffer.concat([Buffer.of(0xc4, k.length), Buffer.from(k)]);
    const lossFrame = frames[1]!;
    const at = lossFrame.indexOf(binKey('__ndarray__'));
    expect(at).toBeGreaterThan(0);
    for (const k of ['data', 'dtype', 'shape']) expect(lossFrame.indexOf(binKey(k), at)).toBeGreaterThan(at);
    expect(answers[0]!.result.loss_per_datum).toMatchObject({ dtype: '<f4', shape: [2] });
    expect(answers[1]!.error).toMatch(/unknown op "no_such_op"/);
    expect(answers[1]!.result).toBeUndefined();
    expect(Object.keys(answers[2]!.result).sort()).toEqual(['grad_norm', 'skipped']);
    expect(answers[3]!.result.actions.shape).toEqual([2, 16, 32]);
    await client.closeSession(s.id);
  });
});

describe("Relay's codec names on the session websocket", () => {
  it('LOSSLESS (ZPNG) gives the actions RAW gives; CODEC_JPEG_Q90 the actions JPEG gives', async () => {
    const s = await client.waitReady((await client.createSession({ base_model: 'flow05-tiny', rank: 4, alpha: 8, seed: 1 })).id);
    const conn = await client.connect(s);
    const withFrame = (d: Datum, frame: unknown): Datum => ({ ...d, observation: { ...d.observation, image: { cam_high: frame as NDArray } } });
    const sampled = async (data: Datum[], codec: string) => Array.from((await conn.sample(data, { codec, seed: 4, num_steps: 2 })).actions.data as Float32Array);

    // RAW pixels and the same pixels as ZPNG: decoded to the same frame, so the same actions.
    const raw = syntheticBatch(0);
    const zpng = await Promise.all(raw.map(async (d) => {
      const px = d.observation.image!.cam_high as NDArray;
      const bytes = await encodeFrame('LOSSLESS', { data: px.data as Uint8Array, height: px.shape[0]!, width: px.shape[1]!, channels: 3 } as never);
      return withFrame(d, bytes);
    }));
    const fromRaw = await sampled(raw, 'RAW');
    expect(fromRaw).toHaveLength(2 * 16 * 32);
    expect(await sampled(zpng, 'LOSSLESS')).toEqual(fromRaw);

    // JPEG bytes of the G1 sample: CODEC_JPEG_Q90 names how they were made; they decode the same.
    const jpeg = await g1Datums(2, { episode: 0 });
    const fromJpeg = await sampled(jpeg, 'JPEG');
    expect(await sampled(jpeg, 'CODEC_JPEG_Q90')).toEqual(fromJpeg);
    // Training takes them too.
    const fb = await conn.forwardBackward(zpng, { codec: 'LOSSLESS' });
    expect(Number.isFinite(fb.loss)).toBe(true);
    await conn.abortGradientEpoch();
    await conn.close();
    await client.closeSession(s.id);
  });
});

describe("xorl's zero denominator, as Vela's sum of weights", () => {
  it('refuses non-finite and negative weights at forward_backward; optim_step on a zero sum is no_gradients and changes nothing', async () => {
    const c = new FuturesClient(server.baseUrl, TEST_KEY, 'msgpack'); // JSON has no NaN or Infinity
    const { model_id } = await c.createModel({ base_model: 'flow05-tiny', lora_config: { rank: 4, alpha: 8 }, seed: 2, model_id: 'denominator' });
    const weighted = (w: number[]) => syntheticBatch(0).map((d, i) => ({ ...d, weight: w[i]! }));
    for (const w of [NaN, Infinity, -1]) {
      const err = await c.forwardBackward(model_id, weighted([1, w]), { codec: 'RAW' }).catch((e: unknown) => e);
      expect(err, `weight ${w}`).toBeInstanceOf(FutureError);
      expect((err as Error).message).toMatch(/weight must be a number >= 0, got /);
    }
    const pending = async () => (await c.call('session_info', { model_id })).sessions[0].pending_gradients;
    expect(await pending()).toBe(0);
    // Every weight 0: the pass runs (its loss is reported), and D stays 0.
    const zero = await c.forwardBackward(model_id, weighted([0, 0]), { codec: 'RAW' });
    expect(zero.loss_per_datum.shape).toEqual([2]);
    expect(await pending()).toBe(1);
    const refused = await c.optimStep(model_id, { learning_rate: 1e-3 }).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(FutureError);
    expect((refused as FutureError).body).toMatchObject({ code: 'no_gradients', category: 'user' });
    expect((refused as Error).message).toMatch(/optim_step needs accumulated gradients with a positive sum of weights; D is 0 after 1 calls/);
    // Nothing changed: the epoch is still there until it is aborted; then a weighted batch steps.
    expect(await pending()).toBe(1);
    expect(await c.run('abort_gradient_epoch', { model_id })).toEqual({ discarded: 1 });
    await c.forwardBackward(model_id, weighted([1, 0]), { codec: 'RAW' });
    const step = await c.optimStep(model_id, { learning_rate: 1e-3 });
    expect(step.skipped).toBe(false);
    expect(step.grad_norm).toBeGreaterThan(0);
    await c.call('kill_session', { model_id });
  }, 120_000);
});

describe("xorl's health check", () => {
  it('GET /health is {status: "healthy", engine_running} plus the backend in use and the running engines', async () => {
    const health = (await (await fetch(server.baseUrl + '/health')).json()) as { backend: string };
    expect(health).toMatchObject({ status: 'healthy', engine_running: true, engines: ['flow05-tiny'] }); // the sessions above started flow05-tiny
    expect(typeof health.backend).toBe('string');
    expect(health.backend.length).toBeGreaterThan(0);
  });
});

describe("xorl's whole-server sleep, per key", () => {
  it("POST /sleep and /wake_up move only the caller's models: another key's sleep leaves them awake", async () => {
    const c = new FuturesClient(server.baseUrl, TEST_KEY);
    await c.createModel({ base_model: 'flow05-tiny', lora_config: { rank: 4, alpha: 8 }, model_id: 'mine' });
    const other = (await server.store.createApiKey('sleeper')).key;
    const root = (name: string, key: string) => fetch(`${server.baseUrl}/${name}`, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: '{}' }).then((r) => r.json());
    expect(await root('sleep', other)).toEqual({ status: 'sleeping', models: [], refused: [] });
    expect((await c.call('session_info', { model_id: 'mine' })).sessions[0]).toMatchObject({ status: 'ready', asleep: false });
    expect(await root('sleep', TEST_KEY)).toEqual({ status: 'sleeping', models: ['mine'], refused: [] });
    expect(await root('wake_up', other)).toEqual({ status: 'awake', models: [], refused: [] });
    expect((await c.call('session_info', { model_id: 'mine' })).sessions[0]).toMatchObject({ status: 'asleep', asleep: true });
    expect(await root('wake_up', TEST_KEY)).toEqual({ status: 'awake', models: ['mine'], refused: [] });
    await c.call('kill_session', { model_id: 'mine' });
  }, 60_000);
});
