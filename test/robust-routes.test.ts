/**
 * No request can take a server down (issue 13, item 2), HEAD and 405 (item 6), and no answer shows
 * a server path (item 9): malformed %-escapes, invalid UTF-8, overlong paths and header values,
 * lying Content-Lengths and bodies cut short, sent to every route of the main app (REST, futures,
 * jobs, websockets, dashboard) and of the standalone policy server, with and without a key. After
 * all of it `/healthz` and a live session on the real engine still answer.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { VelaClient, type SessionConnection } from '../protocol/client.ts';
import WebSocket from 'ws';
import uWS from 'uWebSockets.js';
import { createApp } from '../server/http/guard.ts';
import { HttpError } from '../server/http/http.ts';
import { startPolicyServer, type PolicyServerHandle } from '../server/policy/index.ts';
import { rawHttp, type RawAnswer } from './helpers/raw-http.ts';
import { startTestServer, TEST_KEY, type TestServer } from './helpers/server.ts';
import { stubEngine } from '../bench/harness/policy-stub.ts';

let app: TestServer;
// Its own folder: a fixed one was shared with every other run of this file on the machine, and a
// server's start-up sweep of upload temporaries removed another run's.
const DATASETS_ROOT = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-robust-datasets-'));
let policy: PolicyServerHandle;
let conn: SessionConnection;

beforeAll(async () => {
  app = await startTestServer({ env: { VELA_DATASETS_DIR: DATASETS_ROOT } });
  policy = await startPolicyServer({ engine: stubEngine(), checkpointDir: '/ckpt/run-1', policyId: 'pol-1', seed: 1, port: 0, apiKey: 'pk' });
  const client = new VelaClient(app.baseUrl, app.apiKey);
  conn = await client.connect(await client.waitReady((await client.createSession({ base_model: 'flow05-tiny' })).id));
});
afterAll(async () => {
  await conn?.close();
  await policy?.close();
  await app?.close();
  fs.rmSync(DATASETS_ROOT, { recursive: true, force: true });
});

/** Path segments that break a naive decoder: the issue's input first. Raw bytes go out as latin1. */
const BAD_SEGMENTS = ['%E0%A4%A', '%', '%zz', '%C3%28', '%ED%A0%80', '%00', '\xc3\x28', '\xff\xfe', 'a'.repeat(9000), 'ft-nope'];

/** A concrete path for a uWS pattern, each parameter (and a trailing `*`) replaced by `seg`. */
function fill(pattern: string, seg: string): string {
  return pattern.split('/').map((p) => (p.startsWith(':') || p === '*' ? seg : p)).join('/');
}

function request(method: string, path: string, headers: string[], bodyLength?: number): string {
  const lines = [`${method} ${path} HTTP/1.1`, 'Host: 127.0.0.1', ...headers];
  if (bodyLength !== undefined) lines.push(`Content-Length: ${bodyLength}`);
  return lines.join('\r\n');
}

const WS_HEADERS = ['Upgrade: websocket', 'Connection: Upgrade', 'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==', 'Sec-WebSocket-Version: 13'];

/** Every request of the fuzz for one server's routes; returns each answer with what was sent. */
async function fuzz(port: number, routes: { method: string; pattern: string }[], key: string): Promise<{ sent: string; a: RawAnswer }[]> {
  const out: { sent: string; a: RawAnswer }[] = [];
  const send = async (head: string, body = '', opts: { cut?: boolean; waitMs?: number } = {}) => {
    if (process.env.FUZZ_TRACE) process.stderr.write(`${head.split('\r\n').map((l) => l.slice(0, 60)).slice(0, 6).join(' | ')}\n`);
    out.push({ sent: head.split('\r\n')[0]!.slice(0, 120), a: await rawHttp(port, head, body, opts) });
  };
  for (const { method, pattern } of routes) {
    const http = method === 'WS' ? 'GET' : method;
    const extra = method === 'WS' ? WS_HEADERS : [];
    for (const seg of pattern.includes(':') || pattern.endsWith('*') ? BAD_SEGMENTS : ['']) {
      const path = fill(pattern, seg);
      for (const auth of [[], [`Authorization: Bearer ${key}`]]) {
        const body = http === 'POST' ? '{}' : undefined;
        await send(request(http, path, [...auth, ...extra, ...(body ? ['Content-Type: application/json'] : [])], body?.length), body ?? '');
      }
    }
    const path = fill(pattern, 'x');
    const auth = `Authorization: Bearer ${key}`;
    if (method === 'WS') await send(request('GET', path, [auth])); // a websocket path without the upgrade headers
    // Header values: overlong, invalid UTF-8, odd SSE cursors, lying Content-Lengths.
    await send(request(http, path, [`Authorization: Bearer ${'k'.repeat(6000)}`, ...extra]));
    await send(request(http, path, ['Authorization: Bearer \xff\xfe\xc3\x28', 'Last-Event-ID: \xff%E0', 'Accept: text/event-stream', ...extra]));
    await send(request(http, `${path}?from=%E0%A4%A&stream=%ZZ&model_id=%`, [auth, ...extra]));
    for (const cl of ['abc', '-1', '99999999999999999999', '1e3']) await send(`${request(http, path, [auth, ...extra])}\r\nContent-Length: ${cl}`, '', { waitMs: 500 });
    if (http === 'POST') {
      // Bodies cut short (JSON and msgpack), and bodies that are not what they say.
      await send(request(http, path, [auth, 'Content-Type: application/json'], 1000), '{"model_id": "ts-', { cut: true, waitMs: 500 });
      await send(request(http, path, [auth, 'Content-Type: application/msgpack'], 1000), '\x82\xa8model_id', { cut: true, waitMs: 500 });
      await send(request(http, path, [auth, 'Content-Type: application/json'], 4), '\xff\xfe\xc3\x28');
      await send(request(http, path, [auth, 'Content-Type: application/msgpack'], 3), '\xc1\xc1\xc1');
    }
  }
  // Paths and headers past uWS's own limits.
  await send(request('GET', `/${'a'.repeat(70_000)}`, []));
  await send(request('GET', '/healthz', Array.from({ length: 200 }, (_, i) => `X-H${i}: ${'v'.repeat(100)}`)));
  return out;
}

function expectSane(answers: { sent: string; a: RawAnswer }[], serverPaths: string[]): void {
  const bad = answers.filter(({ a }) => a.status >= 500 && a.status !== 503); // 503: the dashboard is not built
  expect(bad.map((b) => `${b.sent} -> ${b.a.status} ${b.a.body.slice(0, 200)}`)).toEqual([]);
  // A malformed %-escape in a path is the client's error: 400, or 401/404/405 where that comes first.
  for (const { sent, a } of answers) {
    if (/^(GET|POST) [^?\s]*(%E0%A4%A|\/%\/|\/% |%zz|%C3%28|%ED%A0%80)/.test(sent) && !/^\S+ \/ui\//.test(sent)) {
      expect([400, 401, 404, 405], `${sent} -> ${a.status}`).toContain(a.status);
    }
    for (const p of serverPaths) expect(a.body.includes(p), `${sent} shows ${p}: ${a.body.slice(0, 300)}`).toBe(false);
  }
}

describe('no request takes a server down', () => {
  it('the main app: every route, websocket upgrade and the dashboard, with and without a key', async () => {
    const routes = app.routes();
    // The registry is complete: every kind of route is there (REST, futures, jobs, websockets, dashboard).
    for (const p of ['/healthz', '/v1/fine-tunes/:id/events', '/v1/fine-tunes/:id/files/*', '/api/v1/retrieve_future', '/v1/training_sessions/:id/ws', '/v1/fine-tunes/:id/policy', '/ui/*']) {
      expect(routes.map((r) => r.pattern)).toContain(p);
    }
    const issue = await rawHttp(app.port, request('GET', '/v1/fine-tunes/%E0%A4%A', []));
    expect(issue.status).toBe(400);
    expect(JSON.parse(issue.body).error).toMatch(/malformed %-escape/);
    const answers = await fuzz(app.port, routes, TEST_KEY);
    expect(answers.length).toBeGreaterThan(500);
    // The live session's own websocket with its real token: plain GET, and upgrades with bad or missing keys.
    const s = (await (await fetch(`${app.baseUrl}/v1/training_sessions`, { headers: { authorization: `Bearer ${TEST_KEY}` } })).json()) as { data: { id: string; token: string; status: string }[] };
    const live = s.data.find((x) => x.status === 'ready')!;
    const wsPath = `/v1/training_sessions/${live.id}/ws`;
    for (const headers of [[`Authorization: Bearer ${live.token}`], [`Authorization: Bearer ${live.token}`, 'Upgrade: websocket', 'Connection: Upgrade'], [`Authorization: Bearer ${live.token}`, ...WS_HEADERS.filter((h) => !h.startsWith('Sec-WebSocket-Key'))], [`Authorization: Bearer ${live.token}`, 'Upgrade: websocket', 'Connection: Upgrade', 'Sec-WebSocket-Key: %%%', 'Sec-WebSocket-Version: 99']]) {
      answers.push({ sent: `GET ${wsPath} ${headers.join(' | ')}`, a: await rawHttp(app.port, request('GET', wsPath, headers)) });
    }
    expectSane(answers, [app.dataDir, DATASETS_ROOT, process.cwd()]);
    // Still up: healthz, and the live session answers on its open connection.
    expect((await fetch(`${app.baseUrl}/healthz`)).status).toBe(200);
    expect(await conn.request('heartbeat')).toEqual({});
  });

  it('the standalone policy server (vela policy)', async () => {
    const routes = policy.routes();
    expect(routes).toEqual(expect.arrayContaining([{ method: 'GET', pattern: '/healthz' }, { method: 'WS', pattern: '/' }]));
    const answers = await fuzz(policy.port, routes, 'pk');
    expectSane(answers, ['/ckpt/run-1', process.cwd()]);
    expect((await fetch(`${policy.baseUrl}/healthz`)).status).toBe(200);
  });
});

describe('the guard itself (server/http/guard.ts)', () => {
  it('a handler that throws synchronously answers 500 (or its HttpError), a websocket closes 1011, and the app goes on', async () => {
    const app = createApp();
    app.get('/boom', () => {
      throw new Error('a bug');
    });
    app.get('/teapot', () => {
      throw new HttpError(409, 'busy');
    });
    app.ws('/upgrade-boom', {
      upgrade: () => {
        throw new Error('a bug in an upgrade');
      },
    });
    app.ws<{ n: number }>('/ws', {
      upgrade: (res, req, ctx) => res.upgrade({ n: 0 }, req.getHeader('sec-websocket-key'), '', '', ctx),
      open: (ws) => void ws.send('hello'),
      message: () => {
        throw new Error('a bug in a message handler');
      },
    });
    app.get('/ok', (res) => void res.end('ok'));
    const port = await new Promise<number>((resolve) => app.listen('127.0.0.1', 0, (ls) => resolve(uWS.us_socket_local_port(ls))));
    try {
      const boom = await rawHttp(port, request('GET', '/boom', []));
      expect(boom.status).toBe(500);
      expect(JSON.parse(boom.body)).toMatchObject({ error: 'internal error', request_id: expect.stringMatching(/^req-/) });
      expect((await rawHttp(port, request('GET', '/teapot', []))).status).toBe(409);
      expect((await rawHttp(port, request('GET', '/upgrade-boom', WS_HEADERS))).status).toBe(500);
      const closed = await new Promise<{ code: number; reason: string }>((resolve) => {
        const ws = new WebSocket(`ws://127.0.0.1:${port}/ws`);
        ws.on('message', () => ws.send('x'));
        ws.on('close', (code, reason) => resolve({ code, reason: reason.toString() }));
      });
      expect(closed.code).toBe(1011);
      expect(closed.reason).toMatch(/^internal error \(req-\w+; see the server log\)$/);
      expect((await rawHttp(port, request('GET', '/ok', []))).body).toBe('ok');
      expect((await rawHttp(port, request('HEAD', '/ok', []))).headers['content-length']).toBe('2');
    } finally {
      (app as unknown as { close(): void }).close(); // the native app has close(); this uWS version's typings lack it
    }
  });
});

describe('errors name what the client sent, never server paths', () => {
  it('a dataset_name that does not exist, and one that is not a dataset', async () => {
    const post = (dataset_name: string) =>
      fetch(`${app.baseUrl}/v1/fine-tunes`, {
        method: 'POST', headers: { authorization: `Bearer ${TEST_KEY}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'flow05-tiny', dataset_name }),
      });
    const missing = await post('lerobot/no_such_set');
    expect(missing.status).toBe(400);
    const { error } = (await missing.json()) as { error: string };
    expect(error).toMatch(/^dataset_name "lerobot\/no_such_set" not found: no such dataset folder under this server's datasets root/);
    expect(error).not.toContain(DATASETS_ROOT);
    // A folder that exists but is not a dataset: the reader's message names files by full path.
    fs.mkdirSync(`${DATASETS_ROOT}/empty_set/meta`, { recursive: true });
    const notDataset = await post('empty_set');
    expect(notDataset.status).toBe(400);
    const e2 = ((await notDataset.json()) as { error: string }).error;
    expect(e2).toMatch(/^dataset "empty_set": /);
    expect(e2).not.toContain(DATASETS_ROOT);
    fs.rmSync(DATASETS_ROOT, { recursive: true, force: true });
  });

  it('a damaged saved state: the session error names no server folder', async () => {
    const path = await import('node:path');
    expect(await conn.saveState('damaged')).toBe('damaged');
    const dir = (fs.readdirSync(app.dataDir, { recursive: true }) as string[]).find((p) => p.endsWith(path.join('states', 'damaged')))!;
    fs.rmSync(path.join(app.dataDir, dir, 'config.json'));
    const err = await conn.loadState('damaged').then(() => null, (e: Error) => e.message);
    expect(err).toMatch(/^checkpoint <data dir>\/\S+\/states\/damaged has no config.json$/);
    expect(err).not.toContain(app.dataDir);
    expect(await conn.request('heartbeat')).toEqual({});
  });
});

describe('HEAD wherever GET answers; 405 with Allow for a known path', () => {
  it('main app and dashboard', async () => {
    for (const path of ['/healthz', '/health']) {
      const r = await fetch(app.baseUrl + path, { method: 'HEAD' });
      expect(r.status).toBe(200);
      expect(await r.text()).toBe('');
      expect(Number(r.headers.get('content-length'))).toBe((await (await fetch(app.baseUrl + path)).text()).length);
    }
    const unauth = await rawHttp(app.port, request('HEAD', '/v1/fine-tunes', []));
    expect(unauth).toMatchObject({ status: 401, body: '' });
    const authed = await fetch(`${app.baseUrl}/v1/fine-tunes`, { method: 'HEAD', headers: { authorization: `Bearer ${TEST_KEY}` } });
    expect(authed.status).toBe(200);
    expect(authed.headers.get('content-type')).toBe('application/json');
    const ui = await fetch(`${app.baseUrl}/ui/`, { method: 'HEAD' });
    expect([200, 503]).toContain(ui.status); // 503 when the dashboard is not built
    expect(await ui.text()).toBe('');

    const cases: [string, string, string][] = [
      ['POST', '/healthz', 'GET, HEAD'],
      ['DELETE', '/health', 'GET, HEAD'],
      ['DELETE', '/v1/fine-tunes/ft-x', 'GET, HEAD'],
      ['GET', '/v1/fine-tunes/ft-x/cancel', 'POST'],
      ['PUT', '/v1/training_sessions', 'GET, HEAD, POST'],
      ['GET', '/api/v1/forward_backward', 'POST'],
      ['DELETE', '/api/v1/session_info', 'GET, HEAD, POST'],
      ['POST', '/ui/index.html', 'GET, HEAD'],
      ['POST', '/v1/training_sessions/ts-x/ws', 'GET'],
    ];
    for (const [method, path, allow] of cases) {
      const r = await fetch(app.baseUrl + path, { method, headers: { authorization: `Bearer ${TEST_KEY}` } });
      expect(r.status, `${method} ${path}`).toBe(405);
      expect(r.headers.get('allow')).toBe(allow);
      expect(((await r.json()) as { error: string }).error).toBe(`${method} is not allowed on ${path}; it answers ${allow}`);
    }
    const head405 = await rawHttp(app.port, request('HEAD', '/v1/fine-tunes/ft-x/cancel', []));
    expect(head405).toMatchObject({ status: 405, body: '' });
    expect(head405.headers.allow).toBe('POST');
    const unknown = await fetch(`${app.baseUrl}/nowhere`, { method: 'PUT' });
    expect(unknown.status).toBe(404);
    expect(await unknown.json()).toEqual({ error: 'no route PUT /nowhere' });
  });

  it('the standalone policy server', async () => {
    const head = await fetch(`${policy.baseUrl}/healthz`, { method: 'HEAD' });
    expect(head.status).toBe(200);
    expect(await head.text()).toBe('');
    const stats = await fetch(`${policy.baseUrl}/stats`, { method: 'HEAD', headers: { authorization: 'Api-Key pk' } });
    expect(stats.status).toBe(200);
    for (const [method, path, allow] of [['POST', '/healthz', 'GET, HEAD'], ['POST', '/', 'GET'], ['PUT', '/stats', 'GET, HEAD']]) {
      const r = await fetch(policy.baseUrl + path, { method });
      expect(r.status, `${method} ${path}`).toBe(405);
      expect(r.headers.get('allow')).toBe(allow);
    }
    expect((await fetch(`${policy.baseUrl}/nowhere`, { method: 'POST' })).status).toBe(404);
  });
});
