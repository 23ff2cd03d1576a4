/**
 * xorl's rules that the futures API follows (issue 33, items 4-8), through the real server on
 * flow05-tiny with synthetic RAW frames: full-weight training only as the reserved model
 * "default"; `normalize_loss_before_backward: true` refuses forward_backward; clipping norm
 * types other than L2 refuse optim_step; session_info says `asleep` after sleep; ZORL's fields
 * are a migration error on every route. A refused request never runs: the model's pending
 * gradients and its next step are those of a twin that was never sent it.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { syntheticBatch } from './helpers/synthetic.ts';
import { api, startTestServer, type TestServer } from './helpers/server.ts';
import { FuturesClient } from './helpers/futures-client.ts';

const LORA = { base_model: 'flow05-tiny', lora_config: { rank: 4, alpha: 8 }, seed: 5 };
let server: TestServer;
let c: FuturesClient;

beforeAll(async () => {
  server = await startTestServer();
  c = new FuturesClient(server.baseUrl, server.apiKey);
});
afterAll(() => server.close());

/** The model's session_info entry. */
async function info(model: string): Promise<any> {
  const { sessions } = await c.call('session_info', { model_id: model });
  expect(sessions).toHaveLength(1);
  return sessions[0];
}

/** Names of the key's open models. */
async function openModels(): Promise<string[]> {
  return (await c.call('session_info', undefined, 'GET')).sessions.map((s: any) => s.model_id).sort();
}

describe('xorl: full-weight training is the reserved model "default" (item 4)', () => {
  it('refuses a full-weight model by any other name, or without one; "default" is made, killed and made again', async () => {
    const d = await c.createModel({ base_model: 'flow05-tiny', model_id: 'default' });
    expect(d).toMatchObject({ model_id: 'default', finetune: 'full', status: 'ready' });
    expect(await c.raw('POST', 'create_model', { base_model: 'flow05-tiny', model_id: 'fullx', finetune: 'full' })).toEqual({
      status: 400,
      body: { error: 'full-weight mode only supports the reserved model_id="default" session (xorl); got model_id "fullx": create model_id "default" for full-weight training, or leave finetune out for a LoRA model' },
    });
    expect(await c.raw('POST', 'create_model', { base_model: 'flow05-tiny', finetune: 'full' })).toEqual({
      status: 400,
      body: { error: 'full-weight mode only supports the reserved model_id="default" session (xorl); got no model_id: create model_id "default" for full-weight training, or leave finetune out for a LoRA model' },
    });
    // A second "default" is the name taken; LoRA models of any name still open beside it.
    expect((await c.raw('POST', 'create_model', { base_model: 'flow05-tiny', model_id: 'default' })).status).toBe(409);
    expect(await c.createModel({ ...LORA, model_id: 'fullx' })).toMatchObject({ model_id: 'fullx', finetune: 'lora' });
    expect(await openModels()).toEqual(['default', 'fullx']);
    // kill_session on "default" closes it (PROTOCOL.md section 7: Vela's adaptation of xorl's "reset"), and it can be made again.
    expect(await c.call('kill_session', { model_id: 'default' })).toEqual({ model_id: 'default', status: 'closed' });
    expect(await openModels()).toEqual(['fullx']);
    expect(await c.createModel({ base_model: 'flow05-tiny', model_id: 'default' })).toMatchObject({ model_id: 'default', finetune: 'full' });
    for (const m of ['default', 'fullx']) await c.call('kill_session', { model_id: m });
  }, 120_000);
});

describe('xorl: raw numerator losses only (item 5)', () => {
  it('normalize_loss_before_backward: true refuses forward_backward, top level or in forward_backward_input; false runs as without it', async () => {
    const [a, twin] = [await c.createModel({ ...LORA, model_id: 'norm-a' }), await c.createModel({ ...LORA, model_id: 'norm-twin' })];
    const refused = (where: string) => ({
      status: 400,
      body: { error: `${where}normalize_loss_before_backward true is refused: training accepts raw numerator losses only (xorl); leave normalization to optim_step, which divides the accumulated gradient by the accumulated weights once; leave normalize_loss_before_backward out, or false` },
    });
    const data = syntheticBatch(0);
    expect(await c.raw('POST', 'forward_backward', { model_id: a.model_id, data, codec: 'RAW', normalize_loss_before_backward: true })).toEqual(refused(''));
    expect(await c.raw('POST', 'forward_backward', { model_id: a.model_id, forward_backward_input: { data, codec: 'RAW', normalize_loss_before_backward: true } })).toEqual(refused('forward_backward_input.'));
    expect((await info(a.model_id)).pending_gradients).toBe(0); // nothing ran
    // false is what Vela does anyway: accepted, not named as ignored, and the same numbers as without it.
    const ack = await c.call('forward_backward', { model_id: a.model_id, data, codec: 'RAW', normalize_loss_before_backward: false });
    expect(ack).not.toHaveProperty('ignored_fields');
    const fa = await c.retrieve(ack.request_id);
    const ft = await c.forwardBackward(twin.model_id, data, { codec: 'RAW' });
    expect(fa.loss).toBe(ft.loss);
    expect((await info(a.model_id)).pending_gradients).toBe(1);
    expect(await c.optimStep(a.model_id, { learning_rate: 3e-3 })).toEqual(await c.optimStep(twin.model_id, { learning_rate: 3e-3 }));
    for (const m of [a, twin]) await c.call('kill_session', { model_id: m.model_id });
  }, 120_000);
});

describe('xorl: clipping by the L2 norm only (item 6)', () => {
  it('refuses optim_step with another norm type under any of its names, before anything changes; L2 spelt any way steps as without it', async () => {
    const [a, twin] = [await c.createModel({ ...LORA, model_id: 'clip-a' }), await c.createModel({ ...LORA, model_id: 'clip-twin' })];
    for (const m of [a, twin]) await c.forwardBackward(m.model_id, syntheticBatch(0), { codec: 'RAW' });
    const msg = (where: string, field: string, v: unknown) =>
      `${where}${field} ${JSON.stringify(v)} is not supported: clipping uses the L2 norm only (xorl; gradient_clip / grad_clip_norm is the L2 threshold); leave ${field} out, or give "l2" or 2`;
    for (const field of ['norm_type', 'clip_norm_type', 'grad_norm_type', 'max_norm_type']) {
      for (const v of ['inf', 1, 'l1', 'fro', 2.5]) {
        expect(await c.raw('POST', 'optim_step', { model_id: a.model_id, learning_rate: 3e-3, gradient_clip: 1, [field]: v })).toEqual({ status: 400, body: { error: msg('', field, v) } });
      }
    }
    expect(await c.raw('POST', 'optim_step', { model_id: a.model_id, adam_params: { learning_rate: 3e-3, norm_type: 'inf' } })).toEqual({ status: 400, body: { error: msg('adam_params.', 'norm_type', 'inf') } });
    expect((await info(a.model_id)).pending_gradients).toBe(1); // no step ran: the gradient is still there
    // L2, spelt as clients do, is what Vela clips by: the same step as the twin's without it.
    const twinStep = await c.optimStep(twin.model_id, { learning_rate: 3e-3, gradient_clip: 1 });
    expect(await c.optimStep(a.model_id, { learning_rate: 3e-3, gradient_clip: 1, norm_type: 'l2', clip_norm_type: 'L2', grad_norm_type: 2, max_norm_type: '2' })).toEqual(twinStep);
    for (const m of [a, twin]) await c.forwardBackward(m.model_id, syntheticBatch(1), { codec: 'RAW' });
    const twinNext = await c.optimStep(twin.model_id, { learning_rate: 3e-3 });
    expect(await c.optimStep(a.model_id, { adam_params: { learning_rate: 3e-3, norm_type: null } })).toEqual(twinNext);
    for (const m of [a, twin]) await c.call('kill_session', { model_id: m.model_id });
  }, 120_000);
});

describe('xorl: session_info shows a model asleep (item 7)', () => {
  it('says status "asleep" (asleep: true, as GET /v1/training_sessions/{id} does) from sleep to wake_up, for one model and for POST /sleep', async () => {
    const a = await c.createModel({ ...LORA, model_id: 'sleepy' });
    const rest = async () => (await api(server, 'GET', `/v1/training_sessions/${a.training_session_id}`)).json;
    expect(await info('sleepy')).toMatchObject({ status: 'ready', asleep: false });
    expect(await rest()).toMatchObject({ status: 'ready', asleep: false });
    expect(await c.call('sleep', { model_id: 'sleepy' })).toEqual({ model_id: 'sleepy', asleep: true });
    expect(await info('sleepy')).toMatchObject({ status: 'asleep', asleep: true });
    expect(await rest()).toMatchObject({ status: 'ready', asleep: true }); // the session's lifecycle status stays; asleep says why ops fail
    expect(await c.call('session_heartbeat', { model_id: 'sleepy' })).toMatchObject({ status: 'asleep' });
    expect(await c.call('weights_info', { model_id: 'sleepy' })).toMatchObject({ status: 'asleep' });
    const op = await c.run('forward_backward', { model_id: 'sleepy', data: syntheticBatch(0), codec: 'RAW' }).catch((e) => e);
    expect(op.body).toMatchObject({ code: 'asleep', category: 'user' });
    expect(await c.call('wake_up', { model_id: 'sleepy' })).toEqual({ model_id: 'sleepy', asleep: false });
    expect(await info('sleepy')).toMatchObject({ status: 'ready', asleep: false });
    expect(await rest()).toMatchObject({ status: 'ready', asleep: false });
    // xorl's whole-engine control: every model of the key.
    const root = (name: string) => fetch(`${server.baseUrl}/${name}`, { method: 'POST', headers: { authorization: `Bearer ${server.apiKey}`, 'content-type': 'application/json' }, body: '{}' }).then((r) => r.json());
    expect(await root('sleep')).toEqual({ status: 'sleeping', models: ['sleepy'], refused: [] });
    expect(await info('sleepy')).toMatchObject({ status: 'asleep', asleep: true });
    expect(await root('wake_up')).toEqual({ status: 'awake', models: ['sleepy'], refused: [] });
    expect(await info('sleepy')).toMatchObject({ status: 'ready', asleep: false });
    // A sleep refused (pending gradients) leaves it awake.
    await c.forwardBackward('sleepy', syntheticBatch(0), { codec: 'RAW' });
    expect((await c.raw('POST', 'sleep', { model_id: 'sleepy' })).status).toBe(409);
    expect(await info('sleepy')).toMatchObject({ status: 'ready', asleep: false });
    await c.call('kill_session', { model_id: 'sleepy' });
  }, 120_000);
});

describe('xorl: ZORL fields are a migration error (item 8)', () => {
  const migration = (what: string, field: string) => ({
    status: 400,
    body: { error: `${what}: "${field}" is a ZORL field, and ZORL was removed (xorl): configure the adapter with lora_config {rank, alpha, targets} on create_model instead`, code: 'zorl_removed' },
  });
  const post = (url: string, body: unknown) => api(server, 'POST', url, body).then((r) => ({ status: r.status, body: r.json }));

  it('refuses zorl, zorl_config and zorl_* on create_model, at the top level and in lora_config, and opens nothing', async () => {
    for (const [field, v] of [['zorl', true], ['zorl_config', { rank: 4 }], ['zorl_rank', 4], ['ZORL_alpha', 8]] as const) {
      expect(await c.raw('POST', 'create_model', { ...LORA, model_id: 'z', [field]: v })).toEqual(migration('create_model', field));
    }
    expect(await c.raw('POST', 'create_model', { ...LORA, model_id: 'z', lora_config: { rank: 4, zorl_alpha: 8 } })).toEqual(migration('lora_config', 'zorl_alpha'));
    expect(await openModels()).toEqual([]);
  });

  it('refuses them on every futures route, before the model is looked up (POST, GET, root paths)', async () => {
    const a = await c.createModel({ ...LORA, model_id: 'zroutes' });
    const routes = [
      'forward_backward', 'forward', 'optim_step', 'abort_gradient_epoch', 'sample', 'save_weights', 'load_weights', 'save_weights_for_sampler',
      'retrieve_future', 'create_session', 'session_info', 'get_info', 'session_heartbeat', 'unload_model', 'kill_session', 'sleep', 'wake_up',
      'list_checkpoints', 'delete_checkpoint', 'weights_info', 'add_inference_endpoint', 'remove_inference_endpoint', 'set_sync_quantization',
      'sync_inference_weights', 'create_sampling_session',
    ];
    for (const route of routes) expect(await post(`/api/v1/${route}`, { model_id: 'zroutes', zorl: true })).toEqual(migration(route, 'zorl'));
    for (const route of ['sleep', 'wake_up', 'add_inference_endpoint', 'remove_inference_endpoint']) expect(await post(`/${route}`, { zorl_config: {} })).toEqual(migration(route, 'zorl_config'));
    for (const route of ['api/v1/training_runs', 'api/v1/session_info', 'list_inference_endpoints', 'api/v1/list_checkpoints']) {
      const got = await api(server, 'GET', `/${route}?zorl_mode=1`);
      expect({ status: got.status, body: got.json }).toEqual(migration(route.replace('api/v1/', ''), 'zorl_mode'));
    }
    // Nested objects too; and the model is untouched (still open, awake, nothing accumulated).
    expect(await post('/api/v1/optim_step', { model_id: 'zroutes', adam_params: { learning_rate: 1e-3, zorl_lr: 1 } })).toEqual(migration('adam_params', 'zorl_lr'));
    expect(await post('/api/v1/forward_backward', { model_id: 'zroutes', forward_backward_input: { data: [], zorl: 1 } })).toEqual(migration('forward_backward_input', 'zorl'));
    expect(await info('zroutes')).toMatchObject({ status: 'ready', pending_gradients: 0 });
    // Unrelated unknown fields keep xorl's rolling-client behaviour: ignored and named back.
    expect(await post('/api/v1/session_heartbeat', { model_id: 'zroutes', client_tag: 'x' })).toMatchObject({ status: 200, body: { ignored_fields: ['client_tag'] } });
    await c.call('kill_session', { model_id: a.model_id });
  }, 120_000);
});
