/**
 * JSON arrays of an int dtype hold integers of that dtype's range (issue 22, item 9): a robot's
 * state given as `{"data", "dtype": "int64" | "uint64" | ..., "shape"}` with 1.5, -1 for a uint,
 * or a value past the range is a 400 naming the element and its value, before any policy sees
 * it (it was a 500 for 1.5 as int64, and -1 as uint64 wrapped to 1.8e19 and came back as actions
 * of 1.8e19). Real server, a sampling session of a saved flow05-tiny checkpoint, its HTTP infer.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { FuturesClient, toJsonBody } from './helpers/futures-client.ts';
import { syntheticDatum } from './helpers/synthetic.ts';

let server: TestServer;
let inferUrl = '';
const datum = syntheticDatum(0).observation;
const STATE = [1, -2, 3, 0, 5, -6, 7, 1]; // integral, within every int dtype (the policy casts to float32)

beforeAll(async () => {
  server = await startTestServer();
  const c = new FuturesClient(server.baseUrl, server.apiKey);
  await c.createModel({ model_id: 'arm', base_model: 'flow05-tiny', lora_config: { rank: 4, alpha: 8 } });
  await c.run('sample', { model_id: 'arm', data: [{ observation: datum }], codec: 'RAW', seed: 1 }); // binds the camera
  const saved = await c.run('save_weights_for_sampler', { model_id: 'arm', name: 'ints' });
  inferUrl = (await c.call('create_sampling_session', { checkpoint_id: saved.checkpoint_id })).infer_url;
}, 180_000);
afterAll(async () => {
  await server?.close();
});

async function infer(state: unknown): Promise<{ status: number; json: any }> {
  const body = { images: { cam_high: toJsonBody(datum.image!.cam_high) }, state, prompt: datum.prompt, seed: 3 };
  const res = await fetch(inferUrl, { method: 'POST', headers: { authorization: `Bearer ${server.apiKey}`, 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return { status: res.status, json: await res.json() };
}

const withFirst = (x: number) => [x, ...STATE.slice(1)];

describe('JSON ndarrays of int dtypes through /v1/sampling_sessions/{id}/infer', () => {
  it('takes integral values of an int dtype and answers finite actions', async () => {
    for (const dtype of ['int64', 'uint64', 'int32', '<i2', 'int8']) {
      const got = await infer({ data: dtype === 'uint64' ? STATE.map(Math.abs) : STATE, dtype, shape: [8] });
      expect(got.status, JSON.stringify(got.json)).toBe(200);
      expect(got.json.actions.shape).toEqual([16, 32]);
      expect(Math.max(...got.json.actions.data.map(Math.abs))).toBeLessThan(1e6);
    }
  }, 120_000);

  it('refuses 1.5 as int64 and -1 as uint64 with a 400 naming the element and the value', async () => {
    expect(await infer({ data: withFirst(1.5), dtype: 'int64', shape: [8] })).toEqual({
      status: 400, json: { error: "body.state.data[0] is 1.5; dtype '<i8' holds integers in -9223372036854775808..9223372036854775807", code: 'bad_ndarray' },
    });
    expect(await infer({ data: [...STATE.slice(0, 3).map(Math.abs), -1, ...STATE.slice(4).map(Math.abs)], dtype: 'uint64', shape: [8] })).toEqual({
      status: 400, json: { error: "body.state.data[3] is -1; dtype '<u8' holds integers in 0..18446744073709551615", code: 'bad_ndarray' },
    });
  });

  it('refuses every int dtype\'s values past its range, and fractions, instead of wrapping them', async () => {
    const cases: [string, number, string][] = [
      ['int8', 128, "dtype '|i1' holds integers in -128..127"],
      ['uint8', 256, "dtype '|u1' holds integers in 0..255"],
      ['uint8', -1, "dtype '|u1' holds integers in 0..255"],
      ['int16', -32769, "dtype '<i2' holds integers in -32768..32767"],
      ['uint16', 65536, "dtype '<u2' holds integers in 0..65535"],
      ['int32', 2 ** 31, "dtype '<i4' holds integers in -2147483648..2147483647"],
      ['uint32', 2 ** 32, "dtype '<u4' holds integers in 0..4294967295"],
      ['int32', 0.25, "dtype '<i4' holds integers in -2147483648..2147483647"],
      ['int64', 2 ** 63, "dtype '<i8' holds integers in -9223372036854775808..9223372036854775807"],
      ['uint64', 2 ** 64, "dtype '<u8' holds integers in 0..18446744073709551615"],
      ['>i4', 1e300, "dtype '>i4' holds integers in -2147483648..2147483647"],
    ];
    for (const [dtype, x, range] of cases) {
      const got = await infer({ data: withFirst(x), dtype, shape: [8] });
      expect(got, `${dtype} ${x}`).toEqual({ status: 400, json: { error: `body.state.data[0] is ${x}; ${range}`, code: 'bad_ndarray' } });
    }
    // The server is fine afterwards: the same session answers a good request.
    expect((await infer({ data: STATE, dtype: 'int32', shape: [8] })).status).toBe(200);
  }, 60_000);
});
