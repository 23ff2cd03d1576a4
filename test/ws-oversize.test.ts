/**
 * Oversized websocket messages (issue 13, item 7; issue 32, item 8): a message past the route's
 * limit is not read: uWS closes the connection at its frame header (1006, no reason; the limit is
 * in the greeting as max_message_bytes), and the server serves others. On the policy websocket and
 * the session websocket. The input: a RAW 4000x3000x3 frame (36 MB), unresized.
 */
import WebSocket from 'ws';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { VelaClient } from '../protocol/client.ts';
import { unpack } from '../protocol/msgpack.ts';
import { ndarray, packNumpy } from '../protocol/ndarray.ts';
import { WS_TOO_BIG, wsSettings } from '../server/http/http.ts';
import { startPolicyServer, type PolicyServerHandle } from '../server/policy/index.ts';
import { stubEngine } from '../bench/harness/policy-stub.ts';
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

/** The greeting (metadata) of a new connection. */
function greeting(url: string): Promise<Map<string, unknown>> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url);
    ws.once('message', (data: Buffer) => {
      resolve(unpack(data) as Map<string, unknown>);
      ws.close();
    });
    ws.on('error', reject);
  });
}

describe('the policy websocket', () => {
  let policy: PolicyServerHandle;
  beforeAll(async () => {
    policy = await startPolicyServer({ engine: stubEngine(), checkpointDir: '/ckpt/run-1', policyId: 'pol-1', seed: 1, port: 0 });
  });
  afterAll(() => policy?.close());

  it('a RAW 4000x3000 frame (36 MB) past the 16 MiB limit: closed at its header (1006, nothing read); the server serves on', async () => {
    const frame = ndarray(new Uint8Array(4000 * 3000 * 3), [3000, 4000, 3]);
    const obs = packNumpy({ 'observation/image': frame, 'observation/state': ndarray(new Float32Array(7), [7]), prompt: 'pick' });
    expect(obs.length).toBeGreaterThan(36_000_000);
    const { frames, code, reason } = await sendBig(policy.wsUrl, {}, obs);
    expect([code, reason, frames.length]).toEqual([WS_TOO_BIG.code, '', 0]);
    expect((await fetch(`${policy.baseUrl}/healthz`)).status).toBe(200);
    // Another connection is greeted, with the limit it must keep to.
    const meta = await greeting(policy.wsUrl);
    expect(meta.get('max_message_bytes')).toBe(16 * 2 ** 20);
  });

  it('uWS reads up to the route limit: maxPayloadLength is the limit itself', () => {
    expect(wsSettings(16 * 2 ** 20, 64 * 2 ** 20).maxPayloadLength).toBe(16 * 2 ** 20);
  });
});

describe('the session websocket', () => {
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer();
  });
  afterAll(() => server?.close());

  it('a 130 MB request past the 64 MiB limit: closed at its header (1006), the session lives on', async () => {
    const client = new VelaClient(server.baseUrl, server.apiKey);
    const s = await client.waitReady((await client.createSession({ base_model: 'flow05-tiny' })).id);
    const big = new Uint8Array(130_000_002); // a multiple of 3
    const message = packNumpy({ id: 77, op: 'forward_backward', data: [{ observation: { image: { cam_high: ndarray(big, [big.length / 3, 1, 3]) } } }], codec: 'RAW' });
    const { frames, code, reason } = await sendBig(s.url, { authorization: `Bearer ${s.token}` }, message);
    // Past --max-session-message-bytes: closed at the frame header, nothing of it read.
    expect([code, reason, frames.length]).toEqual([WS_TOO_BIG.code, '', 0]);
    // The session lives on: a new connection works.
    const conn = await client.connect(s);
    expect(await conn.request('heartbeat')).toEqual({});
    await conn.close();
  });
});
