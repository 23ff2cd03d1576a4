/**
 * Inference endpoints cannot aim the server at itself or its network (issue 22, item 6).
 * add_inference_endpoint with a loopback address in any spelling (127.0.0.1, localhost,
 * 2130706433, 0x7f.1, 0177.0.0.1, [::1], [::ffff:127.0.0.1], 0.0.0.0), a link-local or private
 * one, the server's own host:port or its public host is a 403 naming the URL, the address, why
 * and `--allow-endpoint`; a loopback listener on the other side is never connected to. Rows that
 * point at loopback anyway (stored before, or a name that resolved elsewhere when registered) are
 * refused again when sync_inference_weights connects. With the operator's allowlist a loopback
 * endpoint works, its answers' bodies are never echoed, redirects are not followed, and a key
 * has at most --endpoints-per-key endpoints. Real server and engine (flow05-tiny); the only
 * sockets opened are on 127.0.0.1: private and link-local addresses are refused before any
 * connection.
 */
import http from 'node:http';
import type net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Store } from '../server/store/store.ts';
import { startTestServer, TEST_KEY, type TestServer } from './helpers/server.ts';
import { FuturesClient } from './helpers/futures-client.ts';
import { syntheticDatum } from './helpers/synthetic.ts';

const SECRET = 'SECRET-INTERNAL-ANSWER-do-not-echo';

/** An HTTP listener on 127.0.0.1 that counts every TCP connection made to it. */
interface Listener {
  port: number;
  connections: number;
  requests: string[];
  close: () => Promise<void>;
}

async function listen(handler: (req: http.IncomingMessage, res: http.ServerResponse) => void): Promise<Listener> {
  const server = http.createServer((req, res) => {
    l.requests.push(`${req.method} ${req.url}`);
    req.resume();
    req.on('end', () => handler(req, res));
  });
  const l: Listener = { port: 0, connections: 0, requests: [], close: () => new Promise((r) => server.close(() => r())) };
  server.on('connection', (s: net.Socket) => {
    l.connections++;
    s.unref();
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  l.port = (server.address() as net.AddressInfo).port;
  return l;
}

const secretAnswer = (_req: http.IncomingMessage, res: http.ServerResponse) => res.writeHead(200, { 'content-type': 'text/plain' }).end(SECRET);

let plain: TestServer; // defaults: no allowlist
let allowing: TestServer; // --allow-endpoint 127.0.0.0/8, --endpoints-per-key 3
let trap: Listener;

async function post(s: TestServer, route: string, body: unknown): Promise<{ status: number; json: any }> {
  const res = await fetch(`${s.baseUrl}/${route}`, { method: 'POST', headers: { authorization: `Bearer ${TEST_KEY}`, 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return { status: res.status, json: await res.json() };
}

/** A LoRA model whose camera is bound, so that sync_inference_weights has weights to push. */
async function modelWithCamera(s: TestServer, id: string): Promise<FuturesClient> {
  const c = new FuturesClient(s.baseUrl, s.apiKey);
  await c.createModel({ model_id: id, base_model: 'flow05-tiny', lora_config: { rank: 4, alpha: 8 } });
  await c.run('sample', { model_id: id, data: [{ observation: syntheticDatum(0).observation }], codec: 'RAW', seed: 1 });
  return c;
}

beforeAll(async () => {
  trap = await listen(secretAnswer);
  plain = await startTestServer({ env: { VELA_PUBLIC_URL: 'http://vela-self.test:8080' } });
  allowing = await startTestServer({ env: { VELA_ALLOW_ENDPOINT: '127.0.0.0/8', VELA_ENDPOINTS_PER_KEY: '3' } });
}, 120_000);
afterAll(async () => {
  await plain?.close();
  await allowing?.close();
  await trap?.close();
});

const REFUSAL_TAIL = 'the server does not contact loopback, private, link-local or its own addresses for a client; an operator can allow it with --allow-endpoint';

describe('add_inference_endpoint refuses what is not a public address', () => {
  it('refuses every spelling of loopback with a 403, and the listener there is never contacted', async () => {
    const p = trap.port;
    const loopback: [unknown, string, string][] = [
      [{ url: `http://127.0.0.1:${p}/` }, `http://127.0.0.1:${p}/`, '127.0.0.1'],
      [{ url: `http://2130706433:${p}/` }, `http://2130706433:${p}/`, '127.0.0.1'],
      [{ url: `http://0x7f.1:${p}/` }, `http://0x7f.1:${p}/`, '127.0.0.1'],
      [{ url: `http://0177.0.0.1:${p}/` }, `http://0177.0.0.1:${p}/`, '127.0.0.1'],
      [{ url: `http://127.1:${p}/` }, `http://127.1:${p}/`, '127.0.0.1'],
      [{ url: `ws://127.0.0.1:${p}/` }, `ws://127.0.0.1:${p}/`, '127.0.0.1'],
      [{ url: `http://[::ffff:127.0.0.1]:${p}/` }, `http://[::ffff:127.0.0.1]:${p}/`, '::ffff:7f00:1'],
      [{ url: `http://[::ffff:0:127.0.0.1]:${p}/` }, `http://[::ffff:0:127.0.0.1]:${p}/`, '::ffff:0:7f00:1'], // IPv4-translated (RFC 6145)
      [{ host: '127.0.0.1', port: p }, `http://127.0.0.1:${p}/`, '127.0.0.1'],
    ];
    for (const [body, given, address] of loopback) {
      const got = await post(plain, 'add_inference_endpoint', body);
      expect(got, JSON.stringify(body)).toEqual({
        status: 403,
        json: { error: `url "${given}" resolves to ${address}, a loopback address (127.0.0.0/8): ${REFUSAL_TAIL} 127.0.0.1 (or a CIDR that holds it; VELA_ALLOW_ENDPOINT)` },
      });
    }
    const v6 = await post(plain, 'add_inference_endpoint', { url: `http://[::1]:${p}/` });
    expect(v6).toEqual({ status: 403, json: { error: `url "http://[::1]:${p}/" resolves to ::1, a loopback address (::1): ${REFUSAL_TAIL} ::1 (or a CIDR that holds it; VELA_ALLOW_ENDPOINT)` } });
    // A name that resolves to loopback: refused on the address it resolves to.
    const named = await post(plain, 'add_inference_endpoint', { url: `http://localhost:${p}/` });
    expect(named.status).toBe(403);
    expect(named.json.error).toMatch(new RegExp(`^url "http://localhost:${p}/" resolves to (127\\.0\\.0\\.1|::1), a loopback address`));
    // 0.0.0.0 reaches this machine on Linux.
    expect((await post(plain, 'add_inference_endpoint', { url: `http://0.0.0.0:${p}/` })).json.error).toContain('resolves to 0.0.0.0, an unspecified ("this network") address');
    expect(trap.connections).toBe(0);
    const listed = await fetch(`${plain.baseUrl}/list_inference_endpoints`, { headers: { authorization: `Bearer ${TEST_KEY}` } }).then((r) => r.json() as Promise<any>);
    expect(listed.endpoints).toEqual([]); // nothing refused was stored
  });

  it('refuses link-local, private and the server\'s own addresses before connecting', async () => {
    const own = new URL(plain.baseUrl);
    const cases: [string, string][] = [
      ['http://169.254.169.254/latest/meta-data/', '169.254.169.254, a link-local address (169.254.0.0/16, where cloud metadata services answer)'],
      ['http://10.0.0.7:8000/', '10.0.0.7, a private address (10.0.0.0/8)'],
      ['http://172.16.3.4/', '172.16.3.4, a private address (172.16.0.0/12)'],
      ['https://192.168.1.10/', '192.168.1.10, a private address (192.168.0.0/16)'],
      ['http://100.64.0.1/', '100.64.0.1, a carrier-grade NAT address (100.64.0.0/10)'],
      ['http://[fe80::1]:8000/', 'fe80::1, a link-local address (fe80::/10)'],
      ['http://[fd12::1]/', 'fd12::1, a unique-local (private) address (fc00::/7)'],
      ['http://[::ffff:10.0.0.1]/', '::ffff:a00:1, a private address (10.0.0.0/8)'],
      [`ws://${own.host}/v1/sampling_sessions/samp-x/policy`, `${own.hostname}, a loopback address (127.0.0.0/8)`],
    ];
    for (const [url, tail] of cases) {
      const got = await post(plain, 'add_inference_endpoint', { url });
      expect(got.status, url).toBe(403);
      expect(got.json.error).toContain(`url "${url}" resolves to ${tail}: ${REFUSAL_TAIL}`);
    }
    // --public-url's host is this server whatever it resolves to (here: nothing).
    expect(await post(plain, 'add_inference_endpoint', { url: 'http://vela-self.test:8080/v1/fine-tunes/ft-1/policy' })).toEqual({
      status: 403, json: { error: 'url "http://vela-self.test:8080/v1/fine-tunes/ft-1/policy" names this server itself (its --public-url host vela-self.test): an operator can allow it with --allow-endpoint vela-self.test' },
    });
  });

  it('checks again at connect time: stored loopback rows are refused by sync_inference_weights, without a connection', async () => {
    const store = await Store.open({ dataDir: plain.dataDir });
    const owner = (await store.findApiKey(TEST_KEY))!;
    await store.upsertEndpoint(owner, `http://127.0.0.1:${trap.port}/`, 'k', 'literal');
    await store.upsertEndpoint(owner, `http://localhost:${trap.port}/`, null, 'named'); // resolved when connecting
    await store.close();
    const c = await modelWithCamera(plain, 'arm');
    const sync = await c.call('sync_inference_weights', { model_id: 'arm' });
    const byName = Object.fromEntries(sync.endpoints.map((e: any) => [e.name, e]));
    expect(byName.literal).toMatchObject({ status: 'error', error: `url "http://127.0.0.1:${trap.port}/weights" resolves to 127.0.0.1, a loopback address (127.0.0.0/8): ${REFUSAL_TAIL} 127.0.0.1 (or a CIDR that holds it; VELA_ALLOW_ENDPOINT)` });
    expect(byName.named.status).toBe('error');
    expect(byName.named.error).toMatch(new RegExp(`^url "http://localhost:${trap.port}/weights" resolves to (127\\.0\\.0\\.1|::1), a loopback address`));
    expect(trap.connections).toBe(0);
  }, 120_000);
});

describe('with --allow-endpoint 127.0.0.0/8', () => {
  it('registers and syncs a loopback endpoint, but never echoes its answers and follows no redirect', async () => {
    const elsewhere = await listen(secretAnswer);
    const target = await listen((req, res) => {
      if (req.url === '/healthz') res.writeHead(302, { location: `http://127.0.0.1:${elsewhere.port}/healthz` }).end();
      else res.writeHead(500, { 'content-type': 'application/json' }).end(JSON.stringify({ error: SECRET }));
    });
    try {
      const added = await post(allowing, 'add_inference_endpoint', { url: `http://127.0.0.1:${target.port}/`, name: 'robot' });
      expect(added).toMatchObject({ status: 200, json: { url: `http://127.0.0.1:${target.port}/`, reachable: false } }); // a 302 is not healthy
      const c = await modelWithCamera(allowing, 'arm');
      const sync = await c.call('sync_inference_weights', { model_id: 'arm' });
      expect(sync.endpoints).toEqual([expect.objectContaining({ name: 'robot', status: 'error', http_status: 500, error: 'the endpoint answered HTTP 500' })]);
      expect(JSON.stringify(sync)).not.toContain(SECRET);
      expect(target.requests).toEqual(['GET /healthz', 'PUT /weights']);
      expect(elsewhere.connections).toBe(0); // the redirect was not followed
    } finally {
      await elsewhere.close();
      await target.close();
    }
  }, 120_000);

  it('caps a key at --endpoints-per-key', async () => {
    const base = `http://127.0.0.1:${trap.port}`;
    const before = trap.connections;
    // The first test's endpoint counts: two more fit, a fourth does not; re-adding one is no new one.
    expect((await post(allowing, 'add_inference_endpoint', { url: `${base}/a` })).status).toBe(200);
    expect((await post(allowing, 'add_inference_endpoint', { url: `${base}/b` })).json).toMatchObject({ reachable: true });
    expect(await post(allowing, 'add_inference_endpoint', { url: `${base}/c` })).toEqual({
      status: 429, json: { error: 'this key has 3 inference endpoints; the limit is 3 (--endpoints-per-key): remove one with remove_inference_endpoint first' },
    });
    expect((await post(allowing, 'add_inference_endpoint', { url: `${base}/a`, name: 'again' })).status).toBe(200);
    expect(trap.connections).toBeGreaterThan(before); // allowed: this listener is reached now
  });
});
