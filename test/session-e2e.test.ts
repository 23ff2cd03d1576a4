/**
 * The training session end to end over real sockets (issue 4): a flow05-tiny LoRA session on one
 * real engine worker, driven by the TypeScript client with JPEG frames of the G1 dataset.
 */
import fs from 'node:fs';
import path from 'node:path';
import WebSocket from 'ws';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { VelaClient, VelaError, type Datum, type SessionConnection, type SessionJson } from '../protocol/client.ts';
import { pack, unpack } from '../protocol/msgpack.ts';
import { fromWire, ndarray, toWire } from '../protocol/ndarray.ts';
import { decodeSafetensors } from '../kernels/safetensors.ts';
import { g1Datums } from '../bench/harness/g1.ts';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { BEST_BACKEND_NAME } from './helpers/tf.ts';

let server: TestServer;
let client: VelaClient;
let batches: Datum[][];

async function openSession(body: Record<string, unknown> = {}): Promise<{ s: SessionJson; conn: SessionConnection }> {
  const s = await client.waitReady((await client.createSession({ base_model: 'flow05-tiny', ...body })).id);
  return { s, conn: await client.connect(s) };
}

beforeAll(async () => {
  server = await startTestServer();
  client = new VelaClient(server.baseUrl, server.apiKey);
  batches = [await g1Datums(4, { episode: 0 }), await g1Datums(4, { episode: 0, offset: 0.5 })];
});
afterAll(() => server.close());

describe('a flow05-tiny LoRA session on real G1 frames', () => {
  it('trains 30 steps with a falling loss, samples, saves and restores state exactly', async () => {
    const { s, conn } = await openSession({ rank: 8, alpha: 16 });
    expect(conn.info).toMatchObject({ model: 'flow05-tiny', action_horizon: 16, action_dim: 32, image_size: 96, backend: BEST_BACKEND_NAME, pending_gradients: 0 });
    expect(conn.info.trainable_params).toBeGreaterThan(0);
    const losses: number[] = [];
    for (let step = 0; step < 30; step++) {
      const fb = await conn.forwardBackward(batches[step % 2]!, { codec: 'JPEG' });
      expect(fb.loss_per_datum.shape).toEqual([4]);
      const o = await conn.optimStep({ learning_rate: 3e-3 });
      expect(o.skipped).toBe(false);
      expect(o.grad_norm).toBeGreaterThan(0);
      losses.push(fb.loss);
    }
    const first = losses.slice(0, 5).reduce((a, b) => a + b) / 5;
    const last = losses.slice(-5).reduce((a, b) => a + b) / 5;
    expect(last).toBeLessThan(0.7 * first);

    const probe = batches[0]!.slice(0, 2);
    const sampled = await conn.sample(probe, { codec: 'JPEG', seed: 7 });
    expect(sampled.actions.shape).toEqual([2, 16, 32]);
    expect(sampled.actions.dtype).toBe('<f4');

    expect(await conn.saveState('after-30')).toBe('after-30');
    for (let i = 0; i < 2; i++) {
      await conn.forwardBackward(batches[0]!, { codec: 'JPEG' });
      await conn.optimStep({ learning_rate: 3e-3 });
    }
    const moved = await conn.sample(probe, { codec: 'JPEG', seed: 7 });
    expect(Array.from(moved.actions.data as Float32Array)).not.toEqual(Array.from(sampled.actions.data as Float32Array));
    await conn.loadState('after-30');
    const restored = await conn.sample(probe, { codec: 'JPEG', seed: 7 });
    expect(Array.from(restored.actions.data as Float32Array)).toEqual(Array.from(sampled.actions.data as Float32Array));

    const weightsPath = await conn.saveWeights('final');
    expect(fs.readdirSync(weightsPath).sort()).toEqual(['adapter_config.json', 'adapter_model.safetensors', 'config.json']);
    const cfg = JSON.parse(fs.readFileSync(path.join(weightsPath, 'config.json'), 'utf8'));
    expect(cfg).toMatchObject({ preset: 'flow05-tiny', finetune: 'lora', lora_rank: 8, lora_alpha: 16, cameras: ['cam_high'], action_horizon: 16 });
    const st = decodeSafetensors(fs.readFileSync(path.join(weightsPath, 'adapter_model.safetensors')));
    expect(Object.keys(st.tensors).length).toBeGreaterThan(0);
    // Saving under a taken name is a conflict unless overwrite is set.
    await expect(conn.saveWeights('final')).rejects.toThrow(/exists; pass overwrite: true/);
    expect(await conn.saveWeights('final', true)).toBe(weightsPath);
    // A datum of the wrong rank is answered with the sizes this session takes; the session goes on.
    const flat = [{ ...probe[0]!, actions: ndarray(new Float32Array(7), [7]) }];
    await expect(conn.forwardBackward(flat, { codec: 'JPEG' })).rejects.toThrow(
      'data[0].actions has shape [7]; expected [H, A]: H steps (up to this session\'s action_horizon 16) of A values (up to action_dim 32)',
    );
    expect((await conn.sample(probe, { codec: 'JPEG', seed: 7 })).actions.shape).toEqual([2, 16, 32]);
    await conn.close();
    await client.closeSession(s.id);
  });

  it('answers 16 pipelined requests in order with their ids', async () => {
    const s = await client.waitReady((await client.createSession({ base_model: 'flow05-tiny' })).id);
    const ws = new WebSocket(s.url, { headers: { authorization: `Bearer ${s.token}` } });
    const answers: number[] = [];
    const done = new Promise<void>((resolve) => {
      ws.on('message', (data: Buffer) => {
        const m = fromWire(unpack(data)) as Record<string, any>;
        if (m.info) {
          for (let i = 0; i < 16; i++) {
            const id = 100 + i;
            const req = i % 4 === 3 ? { id, op: 'optim_step', learning_rate: 1e-4 } : { id, op: i % 2 ? 'sample' : 'forward_backward', data: batches[0]!.slice(0, 1), codec: 'JPEG' };
            ws.send(pack(toWire(req)));
          }
          return;
        }
        if (m.error !== undefined) console.log('pipelined answer error', m);
        answers.push(m.id);
        if (answers.length === 16) resolve();
      });
    });
    await done;
    expect(answers).toEqual(Array.from({ length: 16 }, (_, i) => 100 + i));
    ws.close();
    await client.closeSession(s.id);
  });

  it('gives each bad input its error and goes on serving the same connection', async () => {
    const { s, conn } = await openSession();
    const good = batches[0]!.slice(0, 1);
    const raw = (req: Record<string, unknown>) => pack(toWire(req));
    const nextAnswer = () =>
      new Promise<Record<string, any>>((resolve) => conn.ws.once('message', (d: Buffer) => resolve(fromWire(unpack(d)) as Record<string, any>)));
    const expectError = async (send: () => void, re: RegExp, code?: string) => {
      const p = nextAnswer();
      send();
      const a = await p;
      expect(a.error, JSON.stringify(a)).toMatch(re);
      if (code) expect(a.code).toBe(code);
      const ok = await conn.forwardBackward(good, { codec: 'JPEG' }); // the session goes on
      expect(Number.isFinite(ok.loss)).toBe(true);
      return a;
    };
    const bigImage = ndarray(new Uint8Array(8 * 8 * 3), [8, 8, 3]);
    const datum = (over: Record<string, unknown>) => ({ ...good[0], ...over });
    await expectError(() => conn.sendRaw('{"id": 1}'), /text frames are not accepted/);
    await expectError(() => conn.sendRaw(new Uint8Array([0x93, 0x01])), /not valid msgpack/, 'bad_msgpack');
    await expectError(() => conn.sendRaw(raw({ op: 'forward' })), /the request has no "id"/);
    await expectError(() => conn.sendRaw(raw({ id: 5 })), /no "op"/);
    const a = await expectError(() => conn.sendRaw(raw({ id: 6, op: 'dance' })), /unknown op "dance"/);
    expect(a.id).toBe(6);
    await expectError(() => conn.sendRaw(raw({ id: 7, op: 'forward_backward', data: [datum({ actions: ndarray(new Float32Array(40 * 2), [40, 2]) })], codec: 'JPEG' })), /40 steps; this session's action_horizon is 16/);
    await expectError(() => conn.sendRaw(raw({ id: 8, op: 'forward_backward', data: [datum({ actions: ndarray(new Float32Array(16), [16]) })], codec: 'JPEG' })), /expected \[H, A\]/);
    await expectError(() => conn.sendRaw(raw({ id: 9, op: 'forward_backward', data: [datum({ observation: { image: { a: bigImage, b: bigImage, c: bigImage, d: bigImage } } })], codec: 'RAW' })), /image slots are bound to/);
    await expectError(() => conn.sendRaw(raw({ id: 10, op: 'forward_backward', data: good, codec: 'WEBP' })), /codec/i, 'unknown_codec');
    await expectError(() => conn.sendRaw(raw({ id: 11, op: 'forward_backward', data: [datum({ observation: { image: { cam_high: new Uint8Array([0xff, 0xd8, 0xff, 1, 2, 3]) } } })], codec: 'JPEG' })), /cam_high/, 'bad_frame');
    const nan = new Float32Array(16 * 26).fill(0.1);
    nan[5] = NaN;
    await expectError(() => conn.sendRaw(raw({ id: 12, op: 'forward_backward', data: [datum({ actions: ndarray(nan, [16, 26]) })], codec: 'JPEG' })), /actions\[0, 5\] is NaN/);
    await expectError(() => conn.sendRaw(raw({ id: 13, op: 'forward_backward', data: Array(257).fill(good[0]), codec: 'JPEG' })), /257 datums; the limit is 256/, 'too_large');
    await expectError(() => conn.sendRaw(raw({ id: 14, op: 'backward', velocity_grad: ndarray(new Float32Array(16 * 32), [1, 16, 32]) })), /needs a forward with keep: true/, 'nothing_kept');
    await conn.abortGradientEpoch();
    await expectError(() => conn.sendRaw(raw({ id: 15, op: 'optim_step' })), /nothing|no gradient|accumulated/i);
    await conn.abortGradientEpoch();
    await expectError(() => conn.sendRaw(raw({ id: 16, op: 'save_state', name: '../escape' })), /name must match/);
    await expectError(() => conn.sendRaw(raw({ id: 17, op: 'load_state', name: 'never-saved' })), /no saved state named "never-saved"/, 'not_found');
    await expectError(() => conn.sendRaw(raw({ id: 18, op: 'forward_backward', data: good, codec: 'JPEG', lr: 3 })), /has no argument "lr"/);
    await conn.close();
    await client.closeSession(s.id);
  });

  it('runs two sessions at once on one engine with the same losses as one alone', async () => {
    const run = async (conn: SessionConnection) => {
      const losses: number[] = [];
      for (let i = 0; i < 3; i++) {
        losses.push((await conn.forwardBackward(batches[i % 2]!, { codec: 'JPEG' })).loss);
        await conn.optimStep({ learning_rate: 3e-3 });
      }
      return losses;
    };
    const alone = await openSession({ seed: 3 });
    const lossesAlone = await run(alone.conn);
    await alone.conn.close();
    await client.closeSession(alone.s.id);
    const [a, b] = await Promise.all([openSession({ seed: 3 }), openSession({ seed: 3 })]);
    const [la, lb] = await Promise.all([run(a.conn), run(b.conn)]);
    expect(la).toEqual(lossesAlone);
    expect(lb).toEqual(lossesAlone);
    for (const x of [a, b]) {
      await x.conn.close();
      await client.closeSession(x.s.id);
    }
  });

  it('reports what landed to a client that reconnects', async () => {
    const { s, conn } = await openSession();
    await conn.forwardBackward(batches[0]!.slice(0, 1), { codec: 'JPEG' });
    const again = await client.connect(s); // takes the session over
    expect(again.info.last_request_id).toBe(1);
    expect(again.info.pending_gradients).toBe(1);
    await new Promise((r) => setTimeout(r, 20));
    expect(conn.closed?.code).toBe(4001);
    expect(await again.abortGradientEpoch()).toEqual({ discarded: 1 });
    await again.close();
    await client.closeSession(s.id);
  });
});

describe('message size limit', () => {
  it('the client refuses a message past the greeting\'s max_message_bytes with the reason; the server closes one that comes anyway (1006) unread', async () => {
    const small = await startTestServer({ env: { VELA_MAX_SESSION_MESSAGE_BYTES: String(64 * 1024) } });
    const c = new VelaClient(small.baseUrl, small.apiKey);
    const s = await c.waitReady((await c.createSession({ base_model: 'flow05-tiny' })).id);
    const conn = await c.connect(s);
    const pending = conn.request('forward_backward', { data: [{ observation: { image: { cam: new Uint8Array(100 * 1024) } } }], codec: 'JPEG' });
    await expect(pending).rejects.toThrow(/^message is \d+ bytes; the server's limit is 65536 \(max_message_bytes, --max-session-message-bytes\)/);
    expect(await conn.request('heartbeat')).toEqual({});
    conn.sendRaw(new Uint8Array(100 * 1024));
    for (let i = 0; i < 200 && !conn.closed; i++) await new Promise((r) => setTimeout(r, 10));
    expect(conn.closed?.code).toBe(1006);
    await small.close();
  });
});

describe('storage limit per key', () => {
  it('refuses a save past the limit with a clear error and keeps the session', async () => {
    const small = await startTestServer({ env: { VELA_STORAGE_PER_KEY_BYTES: '1000' } });
    const c = new VelaClient(small.baseUrl, small.apiKey);
    const s = await c.waitReady((await c.createSession({ base_model: 'flow05-tiny', rank: 2 })).id);
    const conn = await c.connect(s);
    await conn.saveState('first'); // the folder was empty: allowed, and now over 1000 bytes
    const err = await conn.saveState('second').catch((e) => e);
    expect(err).toBeInstanceOf(VelaError);
    expect(err.code).toBe('storage_limit');
    expect(err.message).toMatch(/the limit is 1000 \(--storage-per-key-bytes\): delete checkpoints first/);
    await conn.loadState('first'); // the session goes on
    await conn.close();
    await small.close();
  });
});

describe('graceful shutdown', () => {
  it('answers the request in flight before closing the connection, and stops accepting', async () => {
    const srv = await startTestServer();
    const c = new VelaClient(srv.baseUrl, srv.apiKey);
    const s = await c.waitReady((await c.createSession({ base_model: 'flow05-tiny' })).id);
    const conn = await c.connect(s);
    const inFlight = conn.forwardBackward(batches[0]!, { codec: 'JPEG' });
    await new Promise((r) => setTimeout(r, 50));
    const closing = srv.close();
    const answer = await inFlight;
    expect(Number.isFinite(answer.loss)).toBe(true);
    await closing;
    await new Promise((r) => setTimeout(r, 20));
    expect(conn.closed?.code).toBe(4001);
    expect(conn.closed?.reason).toMatch(/server shutting down/);
    await expect(fetch(srv.baseUrl + '/healthz')).rejects.toThrow();
  });
});

describe('bounded read-ahead', () => {
  it('answers requests past the read-ahead with busy, in order, and serves the rest', async () => {
    const srv = await startTestServer({ env: { VELA_READ_AHEAD: '2' } });
    const c = new VelaClient(srv.baseUrl, srv.apiKey);
    const s = await c.waitReady((await c.createSession({ base_model: 'flow05-tiny' })).id);
    const conn = await c.connect(s);
    const order: number[] = [];
    const results = await Promise.allSettled(
      Array.from({ length: 6 }, (_, i) => conn.sample(batches[0]!.slice(0, 1), { codec: 'JPEG', seed: i }).finally(() => order.push(i))),
    );
    expect(order).toEqual([0, 1, 2, 3, 4, 5]);
    const busy = results.filter((r) => r.status === 'rejected');
    expect(results.slice(0, 2).every((r) => r.status === 'fulfilled')).toBe(true);
    expect(busy.length).toBeGreaterThan(0);
    for (const r of busy) expect((r as PromiseRejectedResult).reason.message).toMatch(/busy: \d+ requests are unanswered \(read-ahead 2\)/);
    expect(Number.isFinite((await conn.forwardBackward(batches[0]!.slice(0, 1), { codec: 'JPEG' })).loss)).toBe(true);
    await conn.close();
    await srv.close();
  });
});
