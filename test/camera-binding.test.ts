/**
 * A session binds camera names to its image slots in first-seen order and saves the binding with
 * its weights (PROTOCOL.md section 3); a request refused for its cameras binds none of them, so a
 * client's mistake (four cameras on three slots) does not take slots for good.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { VelaClient, type Datum } from '../protocol/client.ts';
import { g1Datums } from '../bench/harness/g1.ts';
import { startTestServer, type TestServer } from './helpers/server.ts';

let server: TestServer;
beforeAll(async () => {
  server = await startTestServer();
});
afterAll(() => server.close());

const withCameras = (d: Datum, names: string[]): Datum => ({ ...d, observation: { ...d.observation, image: Object.fromEntries(names.map((n) => [n, d.observation.image!.cam_high!])) } });

describe('camera slots', () => {
  it('a request with more cameras than slots is refused and binds nothing; the next one binds its own', async () => {
    const client = new VelaClient(server.baseUrl, server.apiKey);
    const s = await client.waitReady((await client.createSession({ base_model: 'flow05-tiny' })).id);
    const conn = await client.connect(s);
    const [d] = await g1Datums(1);
    await expect(conn.sample([withCameras(d!, ['a', 'b', 'c', 'd'])], { codec: 'JPEG', seed: 1 })).rejects.toThrow(/data\[0\] has camera "d"; the model's 3 image slots are bound to a, b, c/);
    // Two datums whose cameras together overflow: refused as a whole too.
    await expect(conn.sample([withCameras(d!, ['a', 'b']), withCameras(d!, ['c', 'e'])], { codec: 'JPEG', seed: 1 })).rejects.toThrow(/camera "e"/);
    await conn.sample([withCameras(d!, ['cam_high'])], { codec: 'JPEG', seed: 1 });
    const path = await conn.saveWeights('w');
    const cfg = JSON.parse((await import('node:fs')).readFileSync(`${path}/config.json`, 'utf8'));
    expect(cfg.cameras).toEqual(['cam_high']);
    conn.close();
  });
});
