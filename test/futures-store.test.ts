/**
 * The futures API's bookkeeping without model compute: the future store (TTL, 410 vs 404,
 * memory bound) on a fake clock, seq_id ordering on its own, and a server with a stub engine for
 * the expiry (410) and seq-gap timeout answers, which need a short TTL and gap.
 */
import http from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ndarray } from '../protocol/ndarray.ts';
import { EngineError } from '../server/engine/messages.ts';
import { FutureStore, SeqOrder } from '../server/futures/index.ts';
import type { EngineLike } from '../server/engine/host.ts';
import { STUB_INFO } from '../bench/harness/policy-stub.ts';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { FutureError, FuturesClient } from './helpers/futures-client.ts';

describe('FutureStore', () => {
  it('keeps a result for the TTL after it settles, then answers expired (410), never for another owner', async () => {
    let t = 1000;
    const s = new FutureStore({ ttlS: 10, now: () => t });
    const f = s.create('alice', 'ts-a', 'optim_step');
    t += 60_000; // pending futures never expire
    expect(s.get(f.id, 'alice')).toBe(f);
    s.settle(f, { result: { grad_norm: 1.5, skipped: false } });
    t += 9_999;
    expect(s.get(f.id, 'alice')).toMatchObject({ outcome: { result: { grad_norm: 1.5 } } });
    expect(s.get(f.id, 'bob')).toBeNull();
    t += 1;
    expect(s.get(f.id, 'alice')).toBe('expired');
    expect(s.get(f.id, 'bob')).toBeNull();
    expect(s.get('req-unknown', 'alice')).toBeNull();
    expect(s.sizes()).toEqual({ futures: 0, tombstones: 1, bytes: 0 });
    s.close();
  });

  it('holds at most maxSettled results and maxTombstones tombstones', () => {
    const s = new FutureStore({ ttlS: 3600, maxSettled: 5, maxTombstones: 7, now: () => 0 });
    const ids: string[] = [];
    for (let i = 0; i < 20; i++) {
      const f = s.create('o', 'm', 'forward');
      s.settle(f, { result: i });
      ids.push(f.id);
    }
    expect(s.sizes()).toEqual({ futures: 5, tombstones: 7, bytes: 0 });
    expect(s.get(ids[19]!, 'o')).toMatchObject({ outcome: { result: 19 } });
    expect(s.get(ids[14]!, 'o')).toBe('expired'); // dropped early, still known
    expect(s.get(ids[0]!, 'o')).toBeNull(); // its tombstone was dropped too
    s.close();
  });

  it('holds at most maxSettledBytes of result arrays', () => {
    const s = new FutureStore({ ttlS: 3600, maxSettledBytes: 3000, now: () => 0 });
    const ids: string[] = [];
    for (let i = 0; i < 4; i++) {
      const f = s.create('o', 'm', 'forward');
      s.settle(f, { result: { velocity: ndarray(new Float32Array(250), [250]) } }); // 1000 bytes each
      ids.push(f.id);
    }
    expect(s.sizes()).toEqual({ futures: 3, tombstones: 1, bytes: 3000 });
    expect(s.get(ids[0]!, 'o')).toBe('expired');
    s.close();
  });

  it('wakes a long poll when the future settles, and times out otherwise', async () => {
    const s = new FutureStore({ ttlS: 60 });
    const f = s.create('o', 'm', 'forward');
    expect(await s.wait(f, 5)).toBe(false);
    const waiting = s.wait(f, 60_000);
    s.settle(f, { error: 'bad frame', category: 'user' });
    expect(await waiting).toBe(true);
    expect(f.outcome).toEqual({ error: 'bad frame', category: 'user' });
    s.close();
  });
});

describe('SeqOrder', () => {
  it('runs requests in seq_id order whatever order they arrive in; repeats and reuse', () => {
    const seq = new SeqOrder({ gapWaitS: 3600, ttlS: 3600 });
    const ran: number[] = [];
    const add = (n: number, hash = `h${n}`) => {
      expect(seq.repeatOf('m', n, hash)).toBeNull();
      return seq.enqueue('m', n, hash, `req-${n}`, () => ran.push(n), () => ran.push(-n));
    };
    expect(add(5)).toBe(true); // the first seq_id starts the sequence
    expect(add(8)).toBe(false);
    expect(add(7)).toBe(false);
    expect(seq.waitingFor('m', 8)).toBe('waiting for seq_ids 6..7');
    expect(seq.repeatOf('m', 8, 'h8')).toBe('req-8');
    expect(() => seq.repeatOf('m', 8, 'other')).toThrow(/seq_id 8 of model m was already used by request req-8 with a different body/);
    expect(add(6)).toBe(true);
    expect(ran).toEqual([5, 6, 7, 8]);
    expect(() => seq.repeatOf('m', 5, 'other')).toThrow(/already used/);
    seq.forget('m', 'gone');
    seq.close();
  });
});

let stall: Promise<void> = Promise.resolve();

/** An engine that answers the session ops instantly (no model), for transport tests. */
function stubEngine(): Promise<EngineLike> {
  const asleep = new Set<string>();
  return Promise.resolve({
    info: STUB_INFO,
    async call(s: string, op: string) {
      if (op === 'create_session') return { result: { trainableParams: 10 }, pending_gradients: 0 };
      if (op === 'sleep') {
        asleep.add(s);
        return { result: { sleeping: true }, pending_gradients: 0 };
      }
      if (op === 'wake_up') {
        if (!asleep.delete(s)) throw new EngineError('conflict', `session ${s} is not asleep`);
        return { result: { sleeping: false }, pending_gradients: 0 };
      }
      if (op === 'abort_gradient_epoch') {
        await stall; // a test holds ops here to keep them pending
        return { result: { discarded: 0 }, pending_gradients: 0 };
      }
      return { result: {}, pending_gradients: 0 };
    },
    stats: () => ({ queued: 0, sessions: 0, calls: 0 }),
    close: async () => {},
  } as EngineLike);
}

describe('futures server with a stub engine', () => {
  let server: TestServer;
  let client: FuturesClient;
  beforeAll(async () => {
    server = await startTestServer({ engineFactory: stubEngine, env: { VELA_FUTURE_TTL_S: '1', VELA_FUTURE_SEQ_GAP_S: '0.3', VELA_FUTURE_WAIT_S: '5', VELA_READ_AHEAD: '3' } });
    client = new FuturesClient(server.baseUrl, server.apiKey);
  });
  afterAll(() => server.close());

  it('answers 410 for a result past its TTL and 404 for an id it never gave', async () => {
    const { model_id } = await client.createModel({ base_model: 'flow0-tiny' });
    const id = await client.submit('abort_gradient_epoch', { model_id });
    expect(await client.retrieve(id)).toEqual({ discarded: 0 });
    await new Promise((r) => setTimeout(r, 1100));
    const gone = await client.raw('POST', 'retrieve_future', { request_id: id });
    expect(gone.status).toBe(410);
    expect(gone.body.error).toBe(`request ${id} expired: results are kept for 1 s after they are ready`);
    const unknown = await client.raw('POST', 'retrieve_future', { request_id: 'req-doesnotexist' });
    expect(unknown).toEqual({ status: 404, body: { error: 'no request req-doesnotexist' } });
    await client.call('kill_session', { model_id });
  });

  it('fails requests held past a seq_id gap, then refuses the late seq_id as behind (409)', async () => {
    const { model_id } = await client.createModel({ base_model: 'flow0-tiny' });
    expect(await client.run('abort_gradient_epoch', { model_id, seq_id: 10 })).toEqual({ discarded: 0 });
    const held = await client.submit('abort_gradient_epoch', { model_id, seq_id: 12 });
    const err = await client.retrieve(held).catch((e) => e);
    expect(err).toBeInstanceOf(FutureError);
    expect(err.category).toBe('user');
    expect(err.message).toBe(`seq_id 12 of model ${model_id} waited 0.3 s for seq_id 11, which never came; requests run in seq_id order, so these were not run`);
    const late = await client.raw('POST', 'abort_gradient_epoch', { model_id, seq_id: 11 });
    expect(late).toEqual({ status: 409, body: { error: `seq_id 11 of model ${model_id} is behind its sequence: the next expected seq_id is 13` } });
    expect(await client.run('abort_gradient_epoch', { model_id, seq_id: 13 })).toEqual({ discarded: 0 });
    await client.call('kill_session', { model_id });
  });

  it('passes sleep and wake_up to the engine in the model\'s order, with the engine\'s errors', async () => {
    const { model_id } = await client.createModel({ base_model: 'flow0-tiny' });
    expect(await client.call('sleep', { model_id })).toEqual({ model_id, sleeping: true });
    expect(await client.call('wake_up', { model_id })).toEqual({ model_id, sleeping: false });
    expect(await client.raw('POST', 'wake_up', { model_id })).toEqual({ status: 409, body: { error: `session ${model_id} is not asleep`, code: 'conflict' } });
    expect(await client.raw('POST', 'sleep', { model_id: 'ts-nosuchmodel' })).toEqual({ status: 404, body: { error: 'no model ts-nosuchmodel' } });
    await client.call('kill_session', { model_id });
  });

  it('client: retries retrieve_future after 503 and 408 with a backoff, as Tinker\'s does', async () => {
    // A proxy that fails the first two polls, then passes everything through.
    let failures = [503, 408];
    const proxy = http.createServer(async (req, res) => {
      const chunks: Buffer[] = [];
      for await (const c of req) chunks.push(c as Buffer);
      if (req.url === '/api/v1/retrieve_future' && failures.length > 0) {
        res.writeHead(failures.shift()!, { 'content-type': 'application/json' }).end('{"error": "try later"}');
        return;
      }
      const up = await fetch(server.baseUrl + req.url, { method: req.method, headers: req.headers as Record<string, string>, body: req.method === 'GET' ? undefined : Buffer.concat(chunks) });
      res.writeHead(up.status, { 'content-type': up.headers.get('content-type') ?? 'application/json' }).end(Buffer.from(await up.arrayBuffer()));
    });
    await new Promise<void>((r) => proxy.listen(0, '127.0.0.1', r));
    try {
      const via = new FuturesClient(`http://127.0.0.1:${(proxy.address() as { port: number }).port}`, server.apiKey, 'msgpack');
      const { model_id } = await client.createModel({ base_model: 'flow0-tiny' });
      expect(await via.run('abort_gradient_epoch', { model_id })).toEqual({ discarded: 0 });
      expect(via.stats.retried).toBe(2);
      failures = [404];
      const lost = await via.retrieve('req-whatever').catch((e) => e);
      expect(lost).toBeInstanceOf(FutureError);
      expect(lost.status).toBe(404); // not retried: 4xx other than 408 are final
      expect(via.stats.retried).toBe(2);
      await client.call('kill_session', { model_id });
    } finally {
      proxy.close();
    }
  });

  it('refuses a request past --read-ahead pending requests of a model with 429', async () => {
    const { model_id } = await client.createModel({ base_model: 'flow0-tiny' });
    let release!: () => void;
    stall = new Promise((r) => (release = r));
    const ids = [];
    for (let i = 0; i < 3; i++) ids.push(await client.submit('abort_gradient_epoch', { model_id }));
    expect(await client.raw('POST', 'abort_gradient_epoch', { model_id })).toEqual({
      status: 429, body: { error: `model ${model_id} has 3 requests pending (limit 3, --read-ahead); retrieve their results before sending more` },
    });
    expect((await client.call('session_info', { model_id })).sessions[0]).toMatchObject({ model_id, pending_futures: 3 });
    release();
    for (const id of ids) expect(await client.retrieve(id)).toEqual({ discarded: 0 });
    expect(await client.run('abort_gradient_epoch', { model_id })).toEqual({ discarded: 0 });
    await client.call('kill_session', { model_id });
  });
});
