/**
 * Sessions that outlive a server restart (issue 22, item 12): a Tinker client session
 * (create_session) and a sampling session (create_sampling_session) are stored, so after the real
 * server is stopped and started again on the same data folder the client session still takes
 * heartbeats and new models, and the sampling session serves its checkpoint's policy again
 * (loaded on first use), with the same actions. Another key still cannot use either.
 * Real engine (flow05-tiny), synthetic RAW frames.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { syntheticBatch } from './helpers/synthetic.ts';
import { Store } from '../server/store/store.ts';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { FuturesClient, toJsonBody } from './helpers/futures-client.ts';
import { postgresSkipReason, startPostgres, type TestPostgres } from '../bench/harness/postgres.ts';
import { missing } from './helpers/requires.ts';

const LORA = { base_model: 'flow05-tiny', lora_config: { rank: 4, alpha: 8 } };
const servers: TestServer[] = [];
const noPostgres = missing('PostgreSQL (sessions across a restart on PostgreSQL)', postgresSkipReason);
let pg: TestPostgres | null = null;
beforeAll(async () => {
  if (!noPostgres) pg = await startPostgres();
}, 120_000);
afterAll(async () => {
  for (const s of servers) await s.close();
  await pg?.stop();
});

/** The server's settings on each store; the restarted server gets the same ones. */
const backends: Record<string, () => Promise<Record<string, string> | null>> = {
  sqlite: async () => ({}),
  postgres: async () => (pg ? { VELA_DATABASE_URL: await pg.newDatabase(), VELA_STORAGE_DIR: fs.mkdtempSync(path.join(os.tmpdir(), 'vela-restart-st-')), VELA_NODE_ID: 'n1' } : null),
};

describe.each(Object.keys(backends))('sessions across a restart, store on %s', (name) => {
  it('a client session and a sampling session still resolve after the server restarts on the same data folder; ownership stays enforced', async (ctx) => {
    const env = await backends[name]!();
    if (!env) return ctx.skip();
    const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-restart-'));
    const first = await startTestServer({ dataDir, env });
    servers.push(first);
    const c1 = new FuturesClient(first.baseUrl, first.apiKey);
    const { session_id: sid } = await c1.call('create_session', { tags: ['arm'], user_metadata: { lab: 'b' } });
    expect(sid).toMatch(/^sess-/);
    await c1.createModel({ ...LORA, model_id: 'm1', session_id: sid });
    const batch = syntheticBatch(0);
    await c1.run('forward_backward', { model_id: 'm1', data: batch, loss_fn: 'mse', codec: 'RAW' });
    await c1.run('optim_step', { model_id: 'm1', adam_params: { learning_rate: 3e-3 } });
    expect((await c1.call('session_heartbeat', { session_id: sid })).models).toEqual(['m1']);
    const saved = await c1.run('save_weights_for_sampler', { model_id: 'm1', name: 'for-robots' });
    const samp = await c1.call('create_sampling_session', { checkpoint_id: saved.checkpoint_id });
    const datum = batch[0]!.observation;
    const body = JSON.stringify({ images: { cam_high: toJsonBody(datum.image!.cam_high) }, state: Array.from(datum.state!.data as Float32Array), prompt: datum.prompt, seed: 9 });
    const infer = (base: string, key: string) =>
      fetch(`${base}/v1/sampling_sessions/${samp.sampling_session_id}/infer`, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body })
        .then(async (r) => ({ status: r.status, json: (await r.json()) as any }));
    const before = await infer(first.baseUrl, first.apiKey);
    expect(before.status).toBe(200);
    await first.close();

    const second = await startTestServer({ dataDir, env });
    servers.push(second);
    const c2 = new FuturesClient(second.baseUrl, second.apiKey);
    // The client session resolves; its model did not survive the restart (models live in engine memory).
    expect(await c2.call('session_heartbeat', { session_id: sid })).toMatchObject({ session_id: sid, models: [] });
    await c2.createModel({ ...LORA, model_id: 'm2', session_id: sid });
    expect((await c2.call('session_heartbeat', { session_id: sid })).models).toEqual(['m2']);
    // The sampling session serves its checkpoint again, loaded on this first request.
    const after = await infer(second.baseUrl, second.apiKey);
    expect(after.status, JSON.stringify(after.json)).toBe(200);
    expect(after.json).toMatchObject({ cold_start: true, seed: 9, weights_version: saved.checkpoint_id });
    expect(after.json.actions.data).toEqual(before.json.actions.data);

    // Another key: neither session is its own.
    const store = await Store.open({ dataDir, databaseUrl: env.VELA_DATABASE_URL });
    const { key } = await store.createApiKey('other');
    await store.close();
    const other = new FuturesClient(second.baseUrl, key);
    expect(await other.raw('POST', 'session_heartbeat', { session_id: sid })).toEqual({ status: 404, body: { error: `no session "${sid}": create one with create_session` } });
    expect((await other.raw('POST', 'create_model', { ...LORA, session_id: sid })).status).toBe(404);
    expect((await infer(second.baseUrl, key)).status).toBe(404);
    expect(await c2.raw('POST', 'create_model', { ...LORA, session_id: 'sess-nope' })).toEqual({ status: 404, body: { error: 'no session "sess-nope": create one with create_session' } });
  }, 240_000);
});
