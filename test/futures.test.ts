/**
 * The futures API (PROTOCOL.md section 7) on the real engine: flow05-tiny LoRA models trained
 * over `/api/v1/...` by a client that follows Tinker's polling rules, on real G1 JPEG frames,
 * compared number for number with a websocket session of the same seed. retrieve_future waits
 * only 0.2 s here, so the polls go through try_again answers as a slow op would make them.
 */
import fs from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { VelaClient, type Datum } from '../protocol/client.ts';
import { ndarray, unpackNumpy } from '../protocol/ndarray.ts';
import { decodeFrame, resizeWithPad } from '../protocol/frames.ts';
import { g1Datums } from '../bench/harness/g1.ts';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { FutureError, FuturesClient } from './helpers/futures-client.ts';

let server: TestServer;
let json: FuturesClient;
let msgpack: FuturesClient;
let batches: Datum[][];

beforeAll(async () => {
  server = await startTestServer({ env: { VELA_FUTURE_WAIT_S: '0.2' } });
  json = new FuturesClient(server.baseUrl, server.apiKey, 'json');
  msgpack = new FuturesClient(server.baseUrl, server.apiKey, 'msgpack');
  batches = [await g1Datums(2, { episode: 0 }), await g1Datums(2, { episode: 0, offset: 0.5 })];
});
afterAll(() => server.close());

const MODEL = { base_model: 'flow05-tiny', rank: 4, alpha: 8, seed: 11 };

describe('the futures API on flow05-tiny', () => {
  it('gives the websocket session\'s losses, in JSON and in msgpack, through forward_backward + optim_step + save_weights', async () => {
    const vela = new VelaClient(server.baseUrl, server.apiKey);
    const s = await vela.waitReady((await vela.createSession(MODEL)).id);
    const ws = await vela.connect(s);
    const a = await json.createModel(MODEL);
    const b = await msgpack.createModel({ base_model: 'flow05-tiny', lora_config: { rank: 4, alpha: 8 }, seed: 11 });
    expect(a).toMatchObject({ status: 'ready', base_model: 'flow05-tiny', finetune: 'lora', rank: 4, alpha: 8, action_horizon: 16 });
    expect(a.trainable_params).toBe(ws.info.trainable_params);

    const losses: number[][] = [];
    for (const [step, batch] of batches.entries()) {
      const fw = await ws.forwardBackward(batch, { codec: 'JPEG' });
      const fj = await json.forwardBackward(a.model_id, batch, { codec: 'JPEG', seq_id: 2 * step });
      const fm = await msgpack.forwardBackward(b.model_id, batch, { codec: 'JPEG', seq_id: 2 * step });
      expect(fj.loss).toBe(fw.loss);
      expect(fm.loss).toBe(fw.loss);
      expect(fj.loss_per_datum.dtype).toBe('<f4');
      expect(Array.from(fj.loss_per_datum.data as Float32Array)).toEqual(Array.from(fw.loss_per_datum.data as Float32Array));
      expect(Array.from(fm.loss_per_datum.data as Float32Array)).toEqual(Array.from(fw.loss_per_datum.data as Float32Array));
      const ow = await ws.optimStep({ learning_rate: 3e-3 });
      const oj = await json.optimStep(a.model_id, { adam_params: { learning_rate: 3e-3 }, seq_id: 2 * step + 1 });
      const om = await msgpack.optimStep(b.model_id, { learning_rate: 3e-3, seq_id: 2 * step + 1 });
      expect(ow.skipped).toBe(false);
      expect(oj).toEqual(ow);
      expect(om).toEqual(ow);
      losses.push([fw.loss, fj.loss, fm.loss]);
    }
    // The second batch ran on updated weights: a real step happened between the two.
    expect(losses[1]![0]).not.toBe(losses[0]![0]);

    const saved = await json.saveWeights(a.model_id, { name: 'step-2', seq_id: 4 });
    expect(saved.checkpoint_id).toBe(`${a.model_id}/states/step-2`);
    expect(fs.readdirSync(saved.path).sort()).toEqual(['adapter_config.json', 'adapter_model.safetensors', 'config.json', 'optimizer.safetensors', 'trainer_state.json']);
    const auto = await msgpack.saveWeights(b.model_id, {});
    expect(auto.name).toMatch(/^ckpt-\d{8}T\d{6}Z-[0-9a-f]{6}$/);
    const sampler = await json.run('save_weights_for_sampler', { model_id: a.model_id, name: 'policy' });
    expect(fs.readdirSync(sampler.path).sort()).toEqual(['adapter_config.json', 'adapter_model.safetensors', 'config.json']);

    // load_weights restores weights and optimizer: the next step repeats exactly.
    const f1 = await json.forwardBackward(a.model_id, batches[0]!, { codec: 'JPEG' });
    const o1 = await json.optimStep(a.model_id, { learning_rate: 3e-3 });
    await json.run('load_weights', { model_id: a.model_id, path: 'step-2' });
    const f2 = await json.forwardBackward(a.model_id, batches[0]!, { codec: 'JPEG' });
    const o2 = await json.optimStep(a.model_id, { learning_rate: 3e-3 });
    expect(f2.loss).toBe(f1.loss);
    expect(o2).toEqual(o1);

    // Checkpoints of this owner, and deleting one.
    const list = await json.call('list_checkpoints', { model_id: a.model_id });
    expect(list.checkpoints.map((c: any) => c.checkpoint_id).sort()).toEqual([`${a.model_id}/states/step-2`, `${a.model_id}/weights/policy`]);
    expect(list.checkpoints.find((c: any) => c.name === 'step-2')).toMatchObject({ kind: 'state', model_id: a.model_id, path: saved.path });
    const all = await msgpack.call('list_checkpoints', {});
    expect(all.checkpoints.map((c: any) => c.name)).toContain(auto.name);
    expect(await json.call('delete_checkpoint', { checkpoint_id: `${a.model_id}/weights/policy` })).toEqual({ checkpoint_id: `${a.model_id}/weights/policy`, deleted: true });
    expect(fs.existsSync(sampler.path)).toBe(false);
    expect((await json.raw('POST', 'delete_checkpoint', { checkpoint_id: `${a.model_id}/weights/policy` })).status).toBe(404);
    expect(await json.raw('POST', 'delete_checkpoint', { checkpoint_id: `${a.model_id}/../../x` })).toMatchObject({ status: 400 });

    await ws.close();
    await vela.closeSession(s.id);
    for (const id of [a.model_id, b.model_id]) expect(await json.call('kill_session', { model_id: id })).toEqual({ model_id: id, status: 'closed' });
    const after = await json.raw('POST', 'forward_backward', { model_id: a.model_id, data: batches[0], codec: 'JPEG' });
    expect(after.status).toBe(409);
    expect(after.body.error).toMatch(/^model ts-\w+ is closed; create a new one with create_model$/);
  });

  it('runs requests in seq_id order, answers try_again while one waits, and 409s a reused seq_id', async () => {
    const { model_id } = await json.createModel(MODEL);
    expect(await json.run('abort_gradient_epoch', { model_id, seq_id: 0 })).toEqual({ discarded: 0 });
    // optim_step (seq 2) arrives before the forward_backward (seq 1) that gives it gradients.
    const step = { model_id, seq_id: 2, learning_rate: 1e-3 };
    const held = await json.submit('optim_step', step);
    const poll = await json.raw('POST', 'retrieve_future', { request_id: held });
    expect(poll).toEqual({ status: 200, body: { type: 'try_again', request_id: held, queue_state: 'active', queue_state_reason: 'waiting for seq_id 1' } });
    expect(await json.submit('optim_step', step)).toBe(held); // a retry of the same body
    const reuse = await json.raw('POST', 'optim_step', { ...step, learning_rate: 2e-3 });
    expect(reuse).toEqual({ status: 409, body: { error: `seq_id 2 of model ${model_id} was already used by request ${held} with a different body; use a new seq_id` } });
    const fb = await json.submit('forward_backward', { model_id, seq_id: 1, data: batches[0], codec: 'JPEG' });
    const o = await json.retrieve(held);
    expect(o.skipped).toBe(false);
    expect(o.grad_norm).toBeGreaterThan(0);
    expect((await json.retrieve(fb)).loss).toBeGreaterThan(0);
    // Out of order, the optim_step would have found no gradient: a hard user error.
    const empty = await json.run('optim_step', { model_id, seq_id: 3 }).catch((e) => e);
    expect(empty).toBeInstanceOf(FutureError);
    expect(empty.category).toBe('user');
    await json.call('unload_model', { model_id });
  });

  it('answers every bad input with 400/401/404/409 and a clear error; data errors come back in the future', async () => {
    const { model_id } = await json.createModel(MODEL);
    const post = (route: string, body: unknown) => json.raw('POST', route, body);
    expect(await post('forward_backward', { model_id, data: batches[0], codec: 'JPEG', lr: 1 })).toEqual({
      status: 400, body: { error: 'forward_backward has no field "lr" (a field of other routes); it takes model_id, seq_id, data, codec, loss_fn, forward_backward_input, normalize_loss_before_backward' },
    });
    // A misspelling of a field of the route is refused and named; an unrelated unknown field passes and is named back.
    expect(await post('optim_step', { model_id, grad_clip: 1 })).toEqual({
      status: 400, body: { error: 'optim_step has no field "grad_clip" (did you mean "grad_clip_norm"?); it takes model_id, seq_id, learning_rate, beta1, beta2, eps, weight_decay, grad_clip_norm, adam_params, gradient_clip, lr, norm_type, clip_norm_type, grad_norm_type, max_norm_type' },
    });
    expect((await post('optim_step', { model_id, adam_params: { learning_rate: 1e-3, Beta2: 0.9 } })).body.error).toMatch(/^adam_params has no field "Beta2" \(did you mean "beta2"\?\)/);
    const passed = await fetch(`${server.baseUrl}/api/v1/abort_gradient_epoch`, {
      method: 'POST', headers: { authorization: `Bearer ${server.apiKey}`, 'content-type': 'application/json' }, body: JSON.stringify({ model_id, type: 'abort', client_tag: 7 }),
    });
    expect(passed.headers.get('x-vela-ignored-fields')).toBe('type, client_tag');
    expect(await passed.json()).toMatchObject({ model_id, ignored_fields: ['type', 'client_tag'] });
    expect(await post('optim_step', {})).toEqual({ status: 400, body: { error: 'model_id must be the string that create_model returned, got undefined' } });
    expect(await post('optim_step', { model_id, seq_id: -1 })).toEqual({ status: 400, body: { error: 'seq_id must be an integer in 0..2^64 - 1, got -1' } });
    expect(await post('optim_step', { model_id, learning_rate: 5 })).toMatchObject({ status: 400, body: { error: 'learning_rate must be in [0, 1], got 5' } });
    expect(await post('optim_step', { model_id: 'ts-nosuchmodel' })).toEqual({ status: 404, body: { error: 'no model ts-nosuchmodel' } });
    expect(await post('forward_backward', { model_id, data: [] })).toMatchObject({ status: 400, body: { error: 'data is empty: send at least one datum' } });
    const notB64 = { observation: { image: { cam_high: 'not base64!' } } };
    expect(await post('forward', { model_id, data: [notB64], codec: 'JPEG' })).toMatchObject({
      status: 400, body: { error: 'data[0].observation.image.cam_high is a string but not base64 (11 characters)' },
    });
    const badArray = { observation: { state: { data: [1, 2, 3], dtype: 'float32', shape: [2] } } };
    expect(await post('forward', { model_id, data: [badArray] })).toMatchObject({
      status: 400, body: { error: 'body.data[0].observation.state: shape [2] holds 2 elements; data holds 3' },
    });
    expect(await post('create_model', { base_model: 'pi9' })).toMatchObject({ status: 400 });
    const res = await fetch(`${server.baseUrl}/api/v1/optim_step`, { method: 'POST', headers: { authorization: `Bearer ${server.apiKey}`, 'content-type': 'application/json' }, body: '{"model_id": ' });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: string }).error).toMatch(/^body is not valid JSON/);
    const mp = await fetch(`${server.baseUrl}/api/v1/optim_step`, { method: 'POST', headers: { authorization: `Bearer ${server.apiKey}`, 'content-type': 'application/msgpack' }, body: Buffer.from([0x82, 0xa1]) }); // a map cut short
    expect(mp.status).toBe(400);
    expect(mp.headers.get('content-type')).toBe('application/msgpack');
    expect(unpackNumpy(Buffer.from(await mp.arrayBuffer()))).toMatchObject({ code: 'bad_msgpack' });
    const c1 = await fetch(`${server.baseUrl}/api/v1/optim_step`, { method: 'POST', headers: { authorization: `Bearer ${server.apiKey}`, 'content-type': 'application/msgpack' }, body: Buffer.from([0xc1]) });
    expect(unpackNumpy(Buffer.from(await c1.arrayBuffer()))).toEqual({ error: 'message holds the reserved msgpack byte 0xc1, which is not a value', code: 'bad_msgpack' });
    const noKey = await fetch(`${server.baseUrl}/api/v1/healthz`); // a health probe has no key
    expect([noKey.status, await noKey.json()]).toEqual([200, { status: 'ok' }]);
    expect(await json.call('healthz', undefined, 'GET')).toEqual({ status: 'ok' });
    expect(await msgpack.call('healthz', undefined, 'GET')).toEqual({ status: 'ok' });

    // A frame that is not a JPEG is found while decoding: the future fails with category "user".
    const junk = { observation: { image: { cam_high: Buffer.from('definitely not a jpeg').toString('base64') } } };
    const err = await json.run('forward', { model_id, data: [junk], codec: 'JPEG' }).catch((e) => e);
    expect(err).toBeInstanceOf(FutureError);
    expect(err.category).toBe('user');
    expect(err.message).toMatch(/^data\[0\]\.observation\.image\.cam_high: /);

    // session management
    const info = await json.call('session_info', undefined, 'GET');
    expect(info.sessions.map((x: any) => x.model_id)).toContain(model_id);
    expect(info.sessions.find((x: any) => x.model_id === model_id)).toMatchObject({ status: 'ready', base_model: 'flow05-tiny', pending_futures: 0, cameras: ['cam_high'] }); // bound by the junk frame, as the websocket binds
    expect(await json.call('session_heartbeat', { model_id })).toMatchObject({ model_id, status: 'ready' });
    expect((await post('session_heartbeat', { model_id: 'ts-nosuchmodel' })).status).toBe(404);
    await json.call('kill_session', { model_id });
    expect((await json.call('session_info', { model_id: undefined })).sessions.map((x: any) => x.model_id)).not.toContain(model_id);
  });

  it('takes RAW frames as {data, dtype, shape} in JSON and as ndarrays in msgpack, with the same actions', async () => {
    const { model_id } = await json.createModel(MODEL);
    const d = batches[0]![0]!;
    const small = await resizeWithPad(await decodeFrame('JPEG', d.observation.image!.cam_high as Uint8Array), 96); // a real G1 frame, 96x96
    const datum = { observation: { image: { cam_high: ndarray(small.data, [small.height, small.width, 3]) }, state: d.observation.state, prompt: d.observation.prompt } };
    const body = { model_id, data: [datum], codec: 'RAW', num_steps: 2, seed: 5 };
    const viaJson = await json.run('sample', body);
    const viaMsgpack = await msgpack.run('sample', body);
    expect(viaJson.actions.shape).toEqual([1, 16, 32]);
    expect(Array.from(viaJson.actions.data)).toEqual(Array.from(viaMsgpack.actions.data as Float32Array));
    // The same frame as a JSON list of numbers: the same request, the same actions.
    const plain = { ...body, data: [{ observation: { ...datum.observation, image: { cam_high: { data: Array.from(small.data), dtype: 'uint8', shape: [96, 96, 3] } } } }] };
    const viaPlain = await json.run('sample', plain);
    expect(Array.from(viaPlain.actions.data)).toEqual(Array.from(viaJson.actions.data));
    await json.call('kill_session', { model_id });
  });

  it('sleep refuses a model with pending gradients (409); sleep + wake_up leave the next step as on a twin that stayed awake', async () => {
    const [a, twin] = [await json.createModel(MODEL), await json.createModel(MODEL)];
    for (const m of [a, twin]) await json.forwardBackward(m.model_id, batches[0]!, { codec: 'JPEG' });
    const busy = await json.raw('POST', 'sleep', { model_id: a.model_id });
    expect(busy.status).toBe(409);
    expect(busy.body).toMatchObject({ code: 'busy' });
    expect(busy.body.error).toMatch(/run optim_step or abort_gradient_epoch before sleep$/);
    for (const m of [a, twin]) await json.optimStep(m.model_id, { learning_rate: 3e-3 });
    expect(await msgpack.call('sleep', { model_id: a.model_id })).toEqual({ model_id: a.model_id, asleep: true });
    expect(await json.call('wake_up', { model_id: a.model_id })).toEqual({ model_id: a.model_id, asleep: false });
    const [fa, ft] = [await json.forwardBackward(a.model_id, batches[1]!, { codec: 'JPEG' }), await json.forwardBackward(twin.model_id, batches[1]!, { codec: 'JPEG' })];
    expect(fa.loss).toBe(ft.loss);
    for (const m of [a, twin]) await json.call('kill_session', { model_id: m.model_id });
  });
});
