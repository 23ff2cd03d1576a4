import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, startTestServer, type TestServer } from './helpers/server.ts';
import type { EngineLike } from '../server/engine/host.ts';
import { loadConfig } from '../server/config.ts';

/** An engine that answers instantly: these tests are about REST, auth and the store. */
function stubEngine(): EngineLike {
  return {
    info: { preset: 'flow05-tiny', backend: 'stub', backendKind: 'stub', backendDevice: 'none', backendLine: 'backend stub', backendFallbacks: [], imageSize: 96, imageSlots: 3, stateDim: 32, actionDim: 32, actionHorizon: 16, maxTokenLen: 48, padToken: 256, family: 'small', baseDir: null, baseParams: 1 },
    call: async (_s, op) => ({ result: op === 'create_session' ? { trainableParams: 42 } : {}, pending_gradients: 0 }) as any,
    stats: () => ({ queued: 0, sessions: 0, calls: 0 }),
    close: async () => {},
  };
}

let server: TestServer;
beforeAll(async () => {
  server = await startTestServer({ engineFactory: async () => stubEngine() });
});
afterAll(() => server.close());

describe('REST training sessions', () => {
  it('answers healthz without a key', async () => {
    const res = await fetch(server.baseUrl + '/healthz');
    expect(res.status).toBe(200);
    expect(await res.text()).toBe('OK');
  });

  it('refuses missing and wrong keys with 401', async () => {
    expect((await api(server, 'GET', '/v1/training_sessions', undefined, null)).status).toBe(401);
    const wrong = await api(server, 'GET', '/v1/training_sessions', undefined, 'nope');
    expect(wrong.status).toBe(401);
    expect(wrong.json.error).toBe('invalid API key');
  });

  it('creates a session with defaults filled, then it becomes ready', async () => {
    const { status, json } = await api(server, 'POST', '/v1/training_sessions', { base_model: 'flow05-tiny' });
    expect(status).toBe(200);
    expect(json.id).toMatch(/^ts-/);
    expect(json).toMatchObject({ base_model: 'flow05-tiny', finetune: 'lora', rank: 16, alpha: 32, targets: ['all'], status: 'starting' });
    expect(json.url).toBe(`${server.baseUrl.replace('http', 'ws')}/v1/training_sessions/${json.id}/ws`);
    expect(json.token).toMatch(/^tok-/);
    await new Promise((r) => setTimeout(r, 50));
    const got = await api(server, 'GET', `/v1/training_sessions/${json.id}`);
    expect(got.json.status).toBe('ready');
    expect(got.json.action_horizon).toBe(16);
    const list = await api(server, 'GET', '/v1/training_sessions');
    expect(list.json.data.map((s: any) => s.id)).toContain(json.id);
    const closed = await api(server, 'POST', `/v1/training_sessions/${json.id}/close`);
    expect(closed.json.status).toBe('closed');
  });

  it('validates the body with 400s that name the field', async () => {
    const cases: [unknown, RegExp][] = [
      [{ base_model: 'gpt-5' }, /base_model must be one of/],
      [{ base_model: 'flow0-tiny', rank: 0 }, /rank must be an integer in 1..256/],
      [{ base_model: 'flow0-tiny', targets: ['attn', 'nope'] }, /targets must be/],
      [{ base_model: 'flow0-tiny', finetune: 'qlora' }, /finetune must be/],
      [{ base_model: 'flow0-tiny', finetune: 'full', rank: 8 }, /^rank applies to finetune "lora" only, got 8: this session is "full", which trains every weight; leave rank out, or use finetune "lora" \(the default\)$/],
      [{ base_model: 'flow05-tiny', targets: ['attn'] }, /^targets must include action_expert or all for LoRA on pi0\.5 with seeded base weights: .*, got \["attn"\]$/],
      [{ base_model: 'flow0-tiny', colour: 'red' }, /unknown field "colour"; known fields: base_model, /],
      [{ base_model: 'flow0-tiny', lora_rank: 8 }, /^unknown field "lora_rank" \(did you mean "rank"\?\); known fields: /],
      [{ base_model: 'flow0-tiny', rnak: 8 }, /^unknown field "rnak" \(did you mean "rank"\?\)/],
      ['{"base_model":', /body is not valid JSON/],
    ];
    for (const [body, re] of cases) {
      const { status, json } = await api(server, 'POST', '/v1/training_sessions', body);
      expect(status).toBe(400);
      expect(json.error).toMatch(re);
    }
  });

  // Issue 33 item 3: a missing required field said "must be one of ..., got undefined".
  it('a missing required field is called required, naming what it takes; a wrong one is shown as sent', async () => {
    const models = 'pi0, pi05 (the real models) or ';
    for (const body of [{}, { base_model: null }]) {
      const { status, json } = await api(server, 'POST', '/v1/training_sessions', body);
      expect(status).toBe(400);
      expect(json.error).toMatch(new RegExp(`^base_model is required: one of ${models.replace(/[()]/g, '\\$&')}flow0-tiny, `));
      expect(json.error).not.toMatch(/undefined|null/);
    }
    expect((await api(server, 'POST', '/v1/training_sessions', { base_model: 7 })).json.error).toMatch(/^base_model must be one of .*, got 7$/);
    // POST /v1/fine-tunes: dataset_name is its one required field (model has a default).
    const ft = await api(server, 'POST', '/v1/fine-tunes', {});
    expect(ft).toEqual({ status: 400, json: { error: 'dataset_name is required: a LeRobot dataset folder under the datasets root, e.g. "lerobot/pusht_image"' } });
    const wrong = await api(server, 'POST', '/v1/fine-tunes', { dataset_name: 5 });
    expect(wrong.status).toBe(400);
    expect(wrong.json.error).toBe('dataset_name must be a LeRobot dataset folder under the datasets root, e.g. "lerobot/pusht_image" (a string of 1 to 512 characters), got 5');
  });

  it('hides a session from another key (404) and refuses a wrong session token', async () => {
    const other = (await server.store.createApiKey('other')).key;
    const { json } = await api(server, 'POST', '/v1/training_sessions', { base_model: 'flow0-tiny' });
    expect((await api(server, 'GET', `/v1/training_sessions/${json.id}`, undefined, other)).status).toBe(404);
    expect((await api(server, 'POST', `/v1/training_sessions/${json.id}/close`, undefined, other)).status).toBe(404);
    const list = await api(server, 'GET', '/v1/training_sessions', undefined, other);
    expect(list.json.data).toEqual([]);
    await new Promise((r) => setTimeout(r, 50));
    const ws = await import('ws');
    const code = await new Promise<number>((resolve) => {
      const c = new ws.default(json.url, { headers: { authorization: 'Bearer tok-wrong' } });
      c.on('unexpected-response', (_q, res) => resolve(res.statusCode ?? 0));
      c.on('open', () => resolve(101));
    });
    expect(code).toBe(401);
    await api(server, 'POST', `/v1/training_sessions/${json.id}/close`);
  });

  it('limits open sessions per key with 429', async () => {
    const made: string[] = [];
    let last = 0;
    for (let i = 0; i < 6; i++) {
      const r = await api(server, 'POST', '/v1/training_sessions', { base_model: 'flow0-tiny' });
      last = r.status;
      if (r.status === 200) made.push(r.json.id);
      else expect(r.json.error).toMatch(/limit is 4/);
    }
    expect(last).toBe(429);
    for (const id of made) await api(server, 'POST', `/v1/training_sessions/${id}/close`);
  });

  it('answers unknown routes with a JSON 404', async () => {
    const r = await api(server, 'GET', '/v1/nothing');
    expect(r.status).toBe(404);
    expect(r.json.error).toMatch(/no route GET \/v1\/nothing/);
  });
});

describe('config', () => {
  it('reads flags over environment over defaults, and refuses bad values', () => {
    const { config } = loadConfig(['--port', '9001', '--host=0.0.0.0'], { VELA_PORT: '9000', VELA_MAX_BATCH: '8' });
    expect(config.port).toBe(9001);
    expect(config.host).toBe('0.0.0.0');
    expect(config.maxBatch).toBe(8);
    expect(config.dataDir).toBe('./vela-data');
    expect(() => loadConfig(['--port', 'x'], {})).toThrow('--port x: must be an integer in 0..65535');
    expect(() => loadConfig([], { VELA_MAX_BATCH: '-1' })).toThrow('VELA_MAX_BATCH=-1: must be a non-negative integer');
    expect(config.dbBufferRecords).toBe(10_000);
    expect(loadConfig(['--db-buffer-records', '50'], {}).config.dbBufferRecords).toBe(50);
    expect(() => loadConfig(['--db-buffer-records', '0'], {})).toThrow('--db-buffer-records must be at least 1, got 0');
  });
});
