/**
 * Websocket caps (issue 32, item 8): connections and the bytes they may make the server hold, per
 * key (the remote address without a key) and in total, through the real servers: past a cap the
 * upgrade gets 429 and the reason; a closed connection frees its place.
 */
import WebSocket from 'ws';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { VelaClient } from '../protocol/client.ts';
import { startPolicyServer, type PolicyServerHandle } from '../server/policy/index.ts';
import { WsAdmission } from '../server/http/ws-admission.ts';
import { stubEngine } from '../bench/harness/policy-stub.ts';
import { startTestServer, type TestServer } from './helpers/server.ts';

const MiB = 2 ** 20;

/** Open a websocket: the open socket (after its first message), or the refusal's status and body. */
function open(url: string, headers: Record<string, string> = {}): Promise<{ ws: WebSocket } | { status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url, { headers });
    ws.once('message', () => resolve({ ws }));
    ws.on('unexpected-response', (_req, res) => {
      let body = '';
      res.on('data', (d: Buffer) => (body += d.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    ws.on('error', (e) => { if (!/Unexpected server response/.test(e.message)) reject(e); });
  });
}

function closeAll(list: { ws: WebSocket }[]): Promise<void[]> {
  return Promise.all(list.map(({ ws }) => new Promise<void>((r) => { ws.once('close', () => r()); ws.close(); })));
}

function opened(x: Awaited<ReturnType<typeof open>>): { ws: WebSocket } {
  if (!('ws' in x)) throw new Error(`refused ${x.status}: ${x.body}`);
  return x;
}

describe('vela policy without a key: caps per remote address and in total', () => {
  let policy: PolicyServerHandle;
  afterAll(() => policy?.close());

  it('the N+1th connection of an address gets 429 with the reason; closing one lets another in', async () => {
    policy = await startPolicyServer({ engine: stubEngine(), checkpointDir: '/ckpt/run-1', policyId: 'pol-1', seed: 1, port: 0, wsCaps: { connectionsPerKey: 2 } });
    const a = [opened(await open(policy.wsUrl)), opened(await open(policy.wsUrl))];
    expect(await open(policy.wsUrl)).toEqual({
      status: 429, body: JSON.stringify({ error: 'address 127.0.0.1 has 2 open websocket connections; the limit is 2 (--max-ws-connections-per-key); close a connection before opening another' }),
    });
    expect((await fetch(`${policy.baseUrl}/healthz`)).status).toBe(200);
    await closeAll([a.pop()!]);
    a.push(opened(await open(policy.wsUrl)));
    await closeAll(a);
    await policy.close();
  });

  it('the total cap and the buffered-bytes caps', async () => {
    policy = await startPolicyServer({ engine: stubEngine(), checkpointDir: '/ckpt/run-1', policyId: 'pol-1', seed: 1, port: 0, apiKey: 'k1', wsCaps: { connections: 2 } });
    const auth = { authorization: 'Api-Key k1' };
    const a = [opened(await open(policy.wsUrl, auth)), opened(await open(policy.wsUrl, auth))];
    expect(await open(policy.wsUrl, auth)).toEqual({
      status: 429, body: JSON.stringify({ error: 'the server has 2 open websocket connections; the limit is 2 (--max-ws-connections); close a connection before opening another' }),
    });
    await closeAll(a);
    await policy.close();
    // Each connection reserves its message limit (16 MiB) plus 64 MiB of unsent answers: 80 MiB.
    policy = await startPolicyServer({ engine: stubEngine(), checkpointDir: '/ckpt/run-1', policyId: 'pol-1', seed: 1, port: 0, wsCaps: { bufferedBytesPerKey: 2 * 80 * MiB } });
    const b = [opened(await open(policy.wsUrl)), opened(await open(policy.wsUrl))];
    expect(await open(policy.wsUrl)).toEqual({
      status: 429, body: JSON.stringify({ error: "address 127.0.0.1's connections may buffer 160 MiB; another (80 MiB) would pass the limit of 160 MiB (--max-ws-buffered-bytes-per-key); close a connection before opening another" }),
    });
    await closeAll(b);
  });
});

describe('WsAdmission', () => {
  it('counts per key and in total, and a ticket releases once', () => {
    const adm = new WsAdmission({ connectionsPerKey: 2, connections: 3, bufferedBytesPerKey: 100, bufferedBytes: 150 });
    const t1 = adm.admit('key:a', 50);
    expect('release' in t1).toBe(true);
    expect('release' in adm.admit('key:a', 50)).toBe(true);
    expect(adm.admit('key:a', 1)).toMatchObject({ status: 429 });
    expect('release' in adm.admit('key:b', 50)).toBe(true);
    expect(adm.admit('key:c', 1)).toMatchObject({ status: 429 }); // 3 connections in all
    (t1 as { release(): void }).release();
    (t1 as { release(): void }).release();
    expect(adm.usage()).toEqual({ connections: 2, bytes: 100 });
    expect(adm.usage('key:a')).toEqual({ connections: 1, bytes: 50 });
    expect(adm.admit('key:c', 60)).toMatchObject({ status: 429 }); // 160 bytes > 150 in all
  });
});

describe('the training-session websocket', () => {
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer({ env: { VELA_MAX_WS_CONNECTIONS_PER_KEY: '1' } });
  });
  afterAll(() => server?.close());

  it("a key's second session connection gets 429 with the reason; the first serves on", async () => {
    const client = new VelaClient(server.baseUrl, server.apiKey);
    const s1 = await client.waitReady((await client.createSession({ base_model: 'flow05-tiny' })).id);
    const s2 = await client.waitReady((await client.createSession({ base_model: 'flow05-tiny' })).id);
    const conn = await client.connect(s1);
    expect(await open(s2.url, { authorization: `Bearer ${s2.token}` })).toEqual({
      status: 429, body: JSON.stringify({ error: 'this key has 1 open websocket connections; the limit is 1 (--max-ws-connections-per-key); close a connection before opening another' }),
    });
    expect(await conn.request('heartbeat')).toEqual({});
    await conn.close();
    const again = opened(await open(s2.url, { authorization: `Bearer ${s2.token}` }));
    await closeAll([again]);
  });
});
