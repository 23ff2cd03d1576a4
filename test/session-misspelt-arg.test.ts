/**
 * Over the real session websocket (issue 35, item 11a): a misspelt op argument or op name is a
 * bad_request that names the one it resembles, as REST and the CLI do; the session goes on.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { VelaClient, type SessionConnection } from '../protocol/client.ts';
import { pack, unpack } from '../protocol/msgpack.ts';
import { fromWire, toWire } from '../protocol/ndarray.ts';
import { g1Datums } from '../bench/harness/g1.ts';
import { startTestServer, type TestServer } from './helpers/server.ts';

let server: TestServer;
let client: VelaClient;
let conn: SessionConnection;

beforeAll(async () => {
  server = await startTestServer();
  client = new VelaClient(server.baseUrl, server.apiKey);
  const s = await client.waitReady((await client.createSession({ base_model: 'flow05-tiny' })).id);
  conn = await client.connect(s);
}, 240_000);
afterAll(async () => {
  await conn?.close();
  await server?.close();
});

/** Sends `req` as it is (no client-side checks) and resolves with the answer frame. */
function rawAnswer(req: Record<string, unknown>): Promise<Record<string, any>> {
  const p = new Promise<Record<string, any>>((resolve) => conn.ws.once('message', (d: Buffer) => resolve(fromWire(unpack(d)) as Record<string, any>)));
  conn.ws.send(pack(toWire(req)));
  return p;
}

describe('a misspelt session op argument', () => {
  it('sample with num_step: bad_request suggesting num_steps; smaple suggests sample; then a sample works', async () => {
    const data = await g1Datums(1, { episode: 0 });
    const a = await rawAnswer({ id: 1, op: 'sample', data, codec: 'JPEG', num_step: 3 });
    expect(a.code).toBe('bad_request');
    expect(a.error).toContain('op sample has no argument "num_step" (did you mean "num_steps"?); it takes data, codec, num_steps, weights, seed');
    const b = await rawAnswer({ id: 2, op: 'smaple', data, codec: 'JPEG' });
    expect(b.code).toBe('bad_request');
    expect(b.error).toContain('unknown op "smaple" (did you mean "sample"?)');
    const c = await rawAnswer({ id: 3, op: 'optim_step', learning_rte: 1e-4 });
    expect(c.error).toContain('op optim_step has no argument "learning_rte" (did you mean "learning_rate"?)');
    const ok = await conn.sample(data, { codec: 'JPEG', num_steps: 2 });
    expect(ok.actions.shape[0]).toBe(1);
  }, 240_000);
});
