/**
 * Real-time chunking on the main server's sampling-session routes (PROTOCOL.md section 6): the
 * policy websocket continues a connection's chunk; the HTTP infer route, which has no connection
 * to keep a chunk on, refuses rtc/ keys with a 400 that says to use the websocket (it was an
 * "unknown observation key" listing the camera keys, which does not say why). Real server, a
 * sampling session of a saved flow05-tiny checkpoint.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ndarray } from '../protocol/ndarray.ts';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { FuturesClient, toJsonBody } from './helpers/futures-client.ts';
import { syntheticDatum } from './helpers/synthetic.ts';
import { PolicyClient } from '../bench/harness/policy-stub.ts';

let server: TestServer;
let inferUrl = '';
const datum = syntheticDatum(0).observation;
const STATE = [1, -2, 3, 0, 5, -6, 7, 1];

beforeAll(async () => {
  server = await startTestServer();
  const c = new FuturesClient(server.baseUrl, server.apiKey);
  await c.createModel({ model_id: 'arm', base_model: 'flow05-tiny', lora_config: { rank: 4, alpha: 8 } });
  await c.run('sample', { model_id: 'arm', data: [{ observation: datum }], codec: 'RAW', seed: 1 }); // binds the camera
  const saved = await c.run('save_weights_for_sampler', { model_id: 'arm', name: 'rtc' });
  inferUrl = (await c.call('create_sampling_session', { checkpoint_id: saved.checkpoint_id })).infer_url;
}, 180_000);
afterAll(async () => {
  await server?.close();
});

describe('RTC on a sampling session', () => {
  it('the HTTP infer route refuses rtc/ keys with a 400 naming the websocket; without them it answers', async () => {
    const infer = async (extra: Record<string, unknown>) => {
      const body = { images: { cam_high: toJsonBody(datum.image!.cam_high) }, state: STATE, prompt: datum.prompt, seed: 3, ...extra };
      const res = await fetch(inferUrl, { method: 'POST', headers: { authorization: `Bearer ${server.apiKey}`, 'content-type': 'application/json' }, body: JSON.stringify(body) });
      return { status: res.status, json: await res.json() };
    };
    for (const key of ['rtc/executed', 'rtc/control_hz', 'rtc/whatever']) {
      expect(await infer({ [key]: 2 })).toEqual({
        status: 400,
        json: { error: `${key}: real-time chunking needs the policy websocket (this route's /policy instead of /infer), which keeps each connection's last chunk; this HTTP route answers plain chunks and takes no rtc/ keys`, code: 'bad_request' },
      });
    }
    expect((await infer({})).status).toBe(200);
  }, 60_000);

  it('its policy websocket continues the connection\'s chunk', async () => {
    const url = inferUrl.replace(/^http/, 'ws').replace(/\/infer$/, '/policy');
    const robot = await PolicyClient.connect(`${url}?seed=2`, { authorization: `Bearer ${server.apiKey}` });
    try {
      const obs = (extra: Record<string, unknown> = {}) => ({
        'observation/cam_high': datum.image!.cam_high, 'observation/state': ndarray(Float32Array.from(STATE), [8]), prompt: datum.prompt, ...extra,
      });
      await robot.infer(obs());
      const ans = await robot.infer(obs({ 'rtc/executed': 2, 'rtc/delay': 3 }));
      expect(ans.server_timing.rtc).toMatchObject({ mode: 'guided', executed: 2, delay: 3, delay_source: 'client', overlap: 14 });
    } finally {
      robot.close();
    }
  }, 60_000);
});
