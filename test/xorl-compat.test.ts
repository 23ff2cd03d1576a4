/**
 * The xorl / Tinker compatibility of the futures API that the Python client does not cover:
 * load_weights across a server restart (weights and optimizer state: the next step equals the
 * one the old model would have taken), by checkpoint_id into another model of the key, the
 * reserved full-weight model "default", weights-only checkpoints refused, `GET /` by Accept, and
 * another key's checkpoints out of reach. Real engine (flow05-tiny), synthetic RAW frames.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { syntheticBatch } from './helpers/synthetic.ts';
import { Store } from '../server/store/store.ts';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { FuturesClient, toJsonBody } from './helpers/futures-client.ts';
import { PolicyClient } from '../bench/harness/policy-stub.ts';

const LORA = { base_model: 'flow05-tiny', lora_config: { rank: 4, alpha: 8 } };
const servers: TestServer[] = [];
afterAll(async () => {
  for (const s of servers) await s.close();
});

async function step(c: FuturesClient, model: string, k: number): Promise<{ loss: number; grad_norm: number }> {
  const fb = await c.forwardBackward(model, syntheticBatch(k), { codec: 'RAW' });
  const o = await c.optimStep(model, { adam_params: { learning_rate: 3e-3 }, gradient_clip: 1 });
  return { loss: fb.loss, grad_norm: o.grad_norm };
}

describe('xorl recovery and model ids', () => {
  it('after a server restart, a new model loads the checkpoint by path and takes the step the old model took next', async () => {
    const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-xorl-'));
    const first = await startTestServer({ dataDir });
    servers.push(first);
    const c1 = new FuturesClient(first.baseUrl, first.apiKey);
    expect((await c1.createModel({ ...LORA, model_id: 'arm' })).model_id).toBe('arm');
    await step(c1, 'arm', 0);
    const saved = await c1.saveWeights('arm', { path: 'after-1' });
    const next = await step(c1, 'arm', 1); // what the uninterrupted model does next
    await first.close();

    const second = await startTestServer({ dataDir, env: { VELA_INFER_IDLE_S: '1', VELA_ALLOW_ENDPOINT: '127.0.0.0/8' } }); // the endpoint test registers a loopback one
    servers.push(second);
    const c2 = new FuturesClient(second.baseUrl, second.apiKey);
    expect((await c2.call('session_info', undefined, 'GET')).sessions).toEqual([]); // models do not survive a restart
    await c2.createModel({ ...LORA, model_id: 'arm' }); // the name is free again
    expect(await c2.run('load_weights', { model_id: 'arm', path: saved.path })).toMatchObject({ checkpoint_id: saved.checkpoint_id });
    expect(await step(c2, 'arm', 1)).toEqual(next);

    // By checkpoint_id into a second model of the key: the same step again.
    await c2.createModel({ ...LORA, model_id: 'arm-2' });
    await c2.run('load_weights', { model_id: 'arm-2', checkpoint_id: saved.checkpoint_id });
    expect(await step(c2, 'arm-2', 1)).toEqual(next);

    // A weights-only checkpoint has no optimizer state to restore.
    const sampler = await c2.run('save_weights_for_sampler', { model_id: 'arm-2', name: 'policy' });
    const wo = await c2.raw('POST', 'load_weights', { model_id: 'arm', checkpoint_id: sampler.checkpoint_id });
    expect(wo).toEqual({ status: 400, body: { error: `checkpoint ${sampler.checkpoint_id} holds weights only (save_weights_for_sampler); load_weights needs one that save_weights wrote (weights + optimizer state)` } });
    // A path outside this key's checkpoints, and another key's checkpoint: refused.
    expect((await c2.raw('POST', 'load_weights', { model_id: 'arm', path: '/etc' })).status).toBe(400);
    const store = await Store.open({ dataDir: dataDir });
    const { key } = await store.createApiKey('other');
    await store.close();
    const other = new FuturesClient(second.baseUrl, key);
    await other.createModel({ ...LORA, model_id: 'arm' }); // names are per key
    expect((await other.raw('POST', 'load_weights', { model_id: 'arm', path: saved.path })).status).toBe(400);
    expect((await other.raw('POST', 'load_weights', { model_id: 'arm', checkpoint_id: saved.checkpoint_id })).status).toBe(404);
    expect((await other.raw('POST', 'weights_info', { checkpoint_id: saved.checkpoint_id })).status).toBe(404);
  }, 240_000);

  it('reserves "default" for the full-weight model and checks client ids', async () => {
    const s = servers[1]!;
    const c = new FuturesClient(s.baseUrl, s.apiKey);
    const d = await c.createModel({ base_model: 'flow05-tiny', model_id: 'default' });
    expect(d).toMatchObject({ model_id: 'default', finetune: 'full' });
    expect((await c.raw('POST', 'create_model', { ...LORA, model_id: 'default' })).body.error).toBe(
      'model_id "default" is reserved for the full-weight model (xorl): leave out lora_config, or name the LoRA model otherwise',
    );
    // The same for LoRA settings at the top level, and lora_config on a model that asks for full.
    expect((await c.raw('POST', 'create_model', { base_model: 'flow05-tiny', model_id: 'default', rank: 8 })).body.error).toBe(
      'model_id "default" is reserved for the full-weight model (xorl): leave out rank, or name the LoRA model otherwise',
    );
    expect((await c.raw('POST', 'create_model', { ...LORA, model_id: 'arm2', finetune: 'full' })).body.error).toBe(
      'lora_config applies to LoRA models, and this one is finetune "full", which trains every weight: leave lora_config out, or finetune out (LoRA is the default)',
    );
    expect((await c.raw('POST', 'create_model', { base_model: 'flow05-tiny', model_id: 'ts-mine' })).status).toBe(400);
    expect((await c.raw('POST', 'create_model', { base_model: 'flow05-tiny', model_id: '../x' })).status).toBe(400);
    expect(await c.call('weights_info', { model_id: 'default' })).toMatchObject({ model_id: 'default', is_lora: false, lora_rank: null, base_model: 'flow05-tiny' });
    await c.call('kill_session', { model_id: 'default' });
  }, 120_000);

  it('registers endpoints, reports an unreachable one per endpoint, and serves a saved checkpoint as a sampling session that idles out', async () => {
    const s = servers[1]!;
    const c = new FuturesClient(s.baseUrl, s.apiKey);
    const post = (route: string, body: unknown) => fetch(`${s.baseUrl}/${route}`, { method: 'POST', headers: { authorization: `Bearer ${s.apiKey}`, 'content-type': 'application/json' }, body: JSON.stringify(body) }).then(async (r) => ({ status: r.status, json: await r.json() as any }));
    expect((await post('add_inference_endpoint', { url: 'ftp://x' })).json.error).toBe('url must be ws://, wss://, http:// or https://, got ftp:');
    const dead = await post('add_inference_endpoint', { host: '127.0.0.1', port: 9, api_key: 'secret' }); // nothing listens on port 9
    expect(dead).toMatchObject({ status: 200, json: { url: 'http://127.0.0.1:9/', has_api_key: true, reachable: false } });
    await c.createModel({ ...LORA, model_id: 'fresh' });
    const noCamera = await c.raw('POST', 'sync_inference_weights', { model_id: 'fresh' });
    expect([noCamera.status, noCamera.body.error]).toEqual([409, 'model fresh has no camera bound yet: a policy needs them (its first forward_backward, forward or sample binds them)']);
    await step(c, 'fresh', 0);
    const sync = await c.call('sync_inference_weights', { model_id: 'fresh' });
    expect(sync).toMatchObject({ model_id: 'fresh', weights_version: 1, quantization: 'none', endpoints: [{ endpoint_id: dead.json.endpoint_id, status: 'error' }] });
    expect((await c.raw('POST', 'sync_inference_weights', { model_id: 'fresh', endpoints: ['ep-nope'] })).status).toBe(404);
    expect((await post('remove_inference_endpoint', { endpoint_id: dead.json.endpoint_id })).status).toBe(200);
    expect((await post('remove_inference_endpoint', { endpoint_id: dead.json.endpoint_id })).status).toBe(404);
    expect((await c.raw('POST', 'sync_inference_weights', { model_id: 'fresh' })).status).toBe(409);

    // A sampling session of a saved checkpoint: OpenPI websocket and HTTP, unloaded when idle.
    const saved = await c.run('save_weights_for_sampler', { model_id: 'fresh', name: 'for-robots' });
    const samp = await c.call('create_sampling_session', { checkpoint_id: saved.checkpoint_id, sampling_session_seq_id: 0 });
    expect(samp).toMatchObject({ model: 'flow05-tiny', checkpoint_id: saved.checkpoint_id, url: expect.stringMatching(/^ws:\/\/.*\/v1\/sampling_sessions\/samp-\w+\/policy$/) });
    const ws = await PolicyClient.connect(samp.url, { authorization: `Api-Key ${s.apiKey}` });
    expect(ws.metadata).toMatchObject({ model: 'flow05-tiny', cameras: ['cam_high'], weights_version: saved.checkpoint_id });
    const datum = syntheticBatch(0)[0]!.observation;
    const wsAnswer = await ws.infer({ images: datum.image, state: datum.state, prompt: datum.prompt });
    expect(wsAnswer.actions.shape).toEqual([16, 32]);
    ws.close();
    const body = { images: { cam_high: toJsonBody(datum.image!.cam_high) }, state: Array.from(datum.state!.data as Float32Array), prompt: datum.prompt, seed: 9 };
    const infer = () => fetch(samp.infer_url, { method: 'POST', headers: { authorization: `Bearer ${s.apiKey}`, 'content-type': 'application/json' }, body: JSON.stringify(body) }).then((r) => r.json() as Promise<any>);
    const warm = await infer();
    expect(warm).toMatchObject({ cold_start: false, load_seconds: 0, seed: 9 });
    const sampled = await c.run('sample', { model_id: 'fresh', data: [{ observation: datum }], codec: 'RAW', seed: 9 });
    expect(warm.actions.data).toEqual(Array.from(sampled.actions.data as Float32Array)); // the checkpoint's policy is the model
    await new Promise((r) => setTimeout(r, 3000)); // VELA_INFER_IDLE_S is 1 on this server
    const cold = await infer();
    expect(cold.cold_start).toBe(true);
    expect(cold.load_seconds).toBeGreaterThan(0);
    expect(cold.actions.data).toEqual(warm.actions.data);
    expect((await c.raw('POST', 'create_sampling_session', { checkpoint_id: 'ts-x/weights/none' })).status).toBe(404);
    await c.call('kill_session', { model_id: 'fresh' });
  }, 120_000);

  it('answers GET / with root info for API clients and the dashboard redirect for browsers', async () => {
    const s = servers[1]!;
    const api = await fetch(s.baseUrl + '/', { headers: { accept: 'application/json' } });
    expect(api.status).toBe(200);
    expect(await api.json()).toMatchObject({ name: 'vela', dashboard: `${s.baseUrl}/ui/` });
    const browser = await fetch(s.baseUrl + '/', { headers: { accept: 'text/html,application/xhtml+xml' }, redirect: 'manual' });
    expect([browser.status, browser.headers.get('location')]).toEqual([302, '/ui/']);
    const health = await (await fetch(s.baseUrl + '/health')).json();
    expect(health).toMatchObject({ status: 'healthy', engine_running: true, engines: ['flow05-tiny'] });
  });
});
