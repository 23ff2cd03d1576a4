/**
 * The dashboard's build (scripts/build-ui.ts) and its serving (server/ui, `mountUi`) on a bare
 * uWS app: content types, caching by hashed name, ETag revalidation, redirects, 404 for unknown
 * files, 503 naming the build command when nothing is built, and a rebuild picked up live.
 */
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import uWS from 'uWebSockets.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildUi } from '../scripts/build-ui.ts';
import { mountUi } from '../server/ui/index.ts';

let tmp: string;
let outDir: string;
let listen: uWS.us_listen_socket;
let base: string;

beforeAll(async () => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-ui-'));
  outDir = path.join(tmp, 'dist');
  const app = uWS.App();
  mountUi(app, { dir: outDir });
  // As in server/app.ts: a catch-all after the dashboard (uWS drops a request no route takes).
  app.any('/*', (res) => void res.writeStatus('404 Not Found').end('catch-all'));
  listen = await new Promise((resolve, reject) => app.listen('127.0.0.1', 0, (ls) => (ls ? resolve(ls) : reject(new Error('cannot listen')))));
  base = `http://127.0.0.1:${uWS.us_socket_local_port(listen)}`;
});

afterAll(() => {
  uWS.us_listen_socket_close(listen);
  fs.rmSync(tmp, { recursive: true, force: true });
});

const rawStatus = (p: string) =>
  new Promise<number>((resolve, reject) => {
    http.get(base + p, { agent: false }, (res) => (res.resume(), resolve(res.statusCode!))).on('error', reject);
  });
const get = (p: string, headers: Record<string, string> = {}) => fetch(base + p, { headers, redirect: 'manual' });

describe('dashboard build and serving', () => {
  it('answers 503 naming the build command while nothing is built', async () => {
    const res = await get('/ui/');
    expect(res.status).toBe(503);
    expect(await res.text()).toBe('The dashboard is not built on this server: the operator runs "npm run build:ui" (npm start and npm test run it first).\n');
  });

  it('builds hashed assets and serves them with their types and caching', async () => {
    const built = await buildUi({ outDir });
    const js = built.files.find((f) => /^app-[A-Z0-9]{8}\.js$/.test(f));
    const css = built.files.find((f) => /^app-[A-Z0-9]{8}\.css$/.test(f));
    expect(js && css).toBeTruthy();
    expect(built.files).toContain('index.html');

    for (const p of ['/', '/ui']) {
      const res = await get(p);
      expect([res.status, res.statusText, res.headers.get('location')]).toEqual([302, 'Found', '/ui/']);
    }
    const page = await get('/ui/');
    expect(page.status).toBe(200);
    expect(page.headers.get('content-type')).toBe('text/html; charset=utf-8');
    expect(page.headers.get('cache-control')).toBe('no-cache');
    expect(page.headers.get('content-security-policy')).toContain("script-src 'self'");
    expect(page.headers.get('x-content-type-options')).toBe('nosniff');
    const html = await page.text();
    expect(html).toContain(`<script type="module" src="./${js}"></script>`);
    expect(html).toContain(`<link rel="stylesheet" href="./${css}">`);
    expect((await get('/ui/index.html')).status).toBe(200);

    const script = await get(`/ui/${js}`);
    expect(script.headers.get('content-type')).toBe('text/javascript; charset=utf-8');
    expect(script.headers.get('cache-control')).toBe('public, max-age=31536000, immutable');
    expect(Buffer.from(await script.arrayBuffer())).toEqual(fs.readFileSync(path.join(outDir, js!)));
    const style = await get(`/ui/${css}`);
    expect(style.headers.get('content-type')).toBe('text/css; charset=utf-8');
    expect(await style.text()).toContain('.u-legend'); // uPlot's stylesheet is bundled in

    const etag = page.headers.get('etag')!;
    expect(etag).toMatch(/^"[0-9a-f]{16}"$/);
    const again = await get('/ui/', { 'if-none-match': etag });
    expect(again.status).toBe(304);
    expect(await again.text()).toBe('');

    // node:http sends the path as written (fetch would normalise the dots away).
    for (const p of ['/ui/nope.js', '/ui/../package.json', '/ui/%2e%2e/package.json', '/ui/..%2fpackage.json']) expect(await rawStatus(p)).toBe(404);
  });

  it('serves a rebuild without a restart', async () => {
    const before = await (await get('/ui/')).text();
    const html = path.join(outDir, 'index.html');
    fs.writeFileSync(html, before.replace('<title>Vela</title>', '<title>Vela rebuilt</title>'));
    fs.utimesSync(html, new Date(), new Date(Date.now() + 5000));
    expect(await (await get('/ui/')).text()).toContain('<title>Vela rebuilt</title>');
  });
});
