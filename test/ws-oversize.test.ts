/**
 * Oversized websocket messages (issue 13, item 7): a client gets an error frame naming the limit
 * and what to do, then close 1009, not a bare drop; on the policy websocket (OpenPI's protocol:
 * a text frame) and on the session websocket (an error answer). The input: one
 * observation with a RAW 4000x3000x3 frame (36 MB) from a 12 MP camera, unresized.
 */
import WebSocket from 'ws';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { VelaClient } from '../protocol/client.ts';
import { mapValueBytes, pack, unpack } from '../protocol/msgpack.ts';
import { ndarray, packNumpy } from '../protocol/ndarray.ts';
import { wsPayloadCeiling } from '../server/http.ts';
import { startPolicyServer, type PolicyServerHandle } from '../server/policy/index.ts';
import { stubEngine } from './helpers/policy-stub.ts';
import { startTestServer, type TestServer } from './helpers/server.ts';

/** Send one message; resolve with every frame received after the greeting, and the close code and reason. */
function sendBig(url: string, headers: Record<string, string>, message: Buffer): Promise<{ frames: { text: boolean; data: Buffer }[]; code: number; reason: string }> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url, { headers });
    const frames: { text: boolean; data: Buffer }[] = [];
    let greeted = false;
    ws.on('message', (data: Buffer, isBinary: boolean) => {
      if (!greeted) {
        greeted = true;
        ws.send(message);
        return;
      }
      frames.push({ text: !isBinary, data });
    });
    ws.on('close', (code, reason) => resolve({ frames, code, reason: reason.toString() }));
    ws.on('error', reject);
  });
}

describe('the policy websocket', () => {
  let policy: PolicyServerHandle;
  beforeAll(async () => {
    policy = await startPolicyServer({ engine: stubEngine(), checkpointDir: '/ckpt/run-1', policyId: 'pol-1', seed: 1, port: 0 });
  });
  afterAll(() => policy?.close());

  it('a RAW 4000x3000 frame (36 MB): a text frame naming the limit and what to do, then 1009', async () => {
    const frame = ndarray(new Uint8Array(4000 * 3000 * 3), [3000, 4000, 3]);
    const obs = packNumpy({ 'observation/image': frame, 'observation/state': ndarray(new Float32Array(7), [7]), prompt: 'pick' });
    expect(obs.length).toBeGreaterThan(36_000_000);
    const { frames, code, reason } = await sendBig(policy.wsUrl, {}, obs);
    expect(code).toBe(1009);
    expect(frames).toHaveLength(1);
    expect(frames[0]!.text).toBe(true);
    expect(frames[0]!.data.toString()).toBe(
      `message is ${obs.length} bytes (34.3 MiB); the limit is 16777216 (16 MiB, --max-message-bytes). ` +
        'Send frames as JPEG (image_codec "JPEG") or resize them on the client: the model sees 32x32 images',
    );
    expect(reason).toMatch(new RegExp(`^message is ${obs.length} bytes`));
    expect((await fetch(`${policy.baseUrl}/healthz`)).status).toBe(200);
  });

  it('every size up to the ceiling gets the same answer; the ceiling is far above any frame within the pixel limit', () => {
    expect(wsPayloadCeiling(16 * 2 ** 20)).toBe(2 ** 30);
    expect(wsPayloadCeiling(64 * 2 ** 20)).toBe(2 ** 30);
    expect(wsPayloadCeiling(512 * 2 ** 20)).toBe(2 ** 31);
    expect(wsPayloadCeiling(2 ** 31)).toBe(2 ** 32 - 1);
    expect(wsPayloadCeiling(64 * 2 ** 20)).toBeGreaterThan(3 * 4096 * 4096 * 3); // three RAW 4096x4096 cameras
  });
});

describe('the session websocket', () => {
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer();
  });
  afterAll(() => server?.close());

  it('a 130 MB request (above the old 128 MiB ceiling): an error answer with its id, then 1009', async () => {
    const client = new VelaClient(server.baseUrl, server.apiKey);
    const s = await client.waitReady((await client.createSession({ base_model: 'flow05-tiny' })).id);
    const big = new Uint8Array(130_000_002); // a multiple of 3
    const message = packNumpy({ id: 77, op: 'forward_backward', data: [{ observation: { image: { cam_high: ndarray(big, [big.length / 3, 1, 3]) } } }], codec: 'RAW' });
    const { frames, code, reason } = await sendBig(s.url, { authorization: `Bearer ${s.token}` }, message);
    expect(code).toBe(1009);
    expect(reason).toBe(`message is ${message.length} bytes; the limit is 67108864`);
    expect(frames).toHaveLength(1);
    const answer = unpack(frames[0]!.data) as Map<string, unknown>;
    expect(Buffer.from(mapValueBytes(frames[0]!.data, 'id')!).toString('hex')).toBe(pack(77).toString('hex'));
    expect(answer.get('code')).toBe('too_large');
    expect(answer.get('error')).toBe(
      `message is ${message.length} bytes (124 MiB); the limit is 67108864 (64 MiB, --max-session-message-bytes). ` +
        'Send frames as JPEG (codec "JPEG") or resize them on the client (the model sees 96x96 images), or split the batch into smaller requests',
    );
    // The session lives on: a new connection works.
    const conn = await client.connect(s);
    expect(await conn.request('heartbeat')).toEqual({});
    await conn.close();
  });
});
