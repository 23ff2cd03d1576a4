/**
 * Serving the dashboard: `GET /ui/` and `/ui/<file>` from the built folder, kept in memory and
 * re-read when a rebuild changes index.html. `/ui` and `/` redirect to `/ui/` (the page uses
 * relative asset paths); with `rootInfo`, `/` answers API clients JSON and only browsers the redirect. The page itself carries no key: it asks for one and calls `/v1/...`
 * with an Authorization header, so these routes are open, like /health.
 */
import type { TemplatedApp } from 'uWebSockets.js';
import { route, statusLine, type Req } from '../http/http.ts';
import { buildStamp, loadAssets, UI_DIST_DIR, type AssetSet } from './assets.ts';

export interface UiOptions {
  /** The built folder (default ui/dist). */
  dir?: string;
  /** `GET /` for API clients (an Accept without text/html): this JSON instead of the redirect. */
  rootInfo?: () => Record<string, unknown>;
}

/** Sent with every dashboard answer: no framing, no sniffing, no Referer, scripts only from here. */
const SECURITY_HEADERS: Record<string, string> = {
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'no-referrer',
  'x-frame-options': 'DENY',
  'content-security-policy':
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; connect-src 'self'; " +
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
};

function answer(r: Req, status: number, headers: Record<string, string>, body: Buffer | string = ''): void {
  if (r.aborted) return;
  r.aborted = true;
  r.res.cork(() => {
    r.res.writeStatus(statusLine(status));
    for (const [k, v] of Object.entries({ ...SECURITY_HEADERS, ...headers })) r.res.writeHeader(k, v);
    r.res.end(body);
  });
}

/**
 * Register the dashboard routes on `app`: `GET /`, `GET /ui`, `GET /ui/*`. Call it before a
 * catch-all route. When the build is missing, `/ui/*` answers 503 with the command to run.
 */
export function mountUi(app: TemplatedApp, opts: UiOptions = {}): void {
  const dir = opts.dir ?? UI_DIST_DIR;
  let assets: AssetSet | null = null;
  const current = (): AssetSet | null => {
    const stamp = buildStamp(dir);
    if (stamp === null) return (assets = null);
    if (!assets || assets.stampMs !== stamp) assets = loadAssets(dir);
    return assets;
  };

  const redirect = (to: string) => route(0, (r) => answer(r, 302, { location: to, 'content-type': 'text/plain; charset=utf-8' }, `see ${to}`));
  const toUi = redirect('/ui/');
  // xorl's "root info" for API clients; browsers (Accept: text/html) still land on the dashboard.
  app.get('/', opts.rootInfo ? route(0, (r) => {
    if (/text\/html/i.test(r.headers['accept'] ?? '')) return answer(r, 302, { location: '/ui/', 'content-type': 'text/plain; charset=utf-8' }, 'see /ui/');
    answer(r, 200, { 'content-type': 'application/json', 'cache-control': 'no-store' }, JSON.stringify(opts.rootInfo!()));
  }) : toUi);
  app.get('/ui', redirect('/ui/'));
  app.get('/ui/*', route(0, (r) => {
    const set = current();
    if (!set) {
      return answer(r, 503, { 'content-type': 'text/plain; charset=utf-8', 'cache-control': 'no-store' },
        'The dashboard is not built on this server: the operator runs "npm run build:ui" (npm start and npm test run it first).\n');
    }
    const rel = r.url.slice('/ui/'.length);
    const asset = set.files.get(rel);
    if (!asset) return answer(r, 404, { 'content-type': 'text/plain; charset=utf-8', 'cache-control': 'no-store' }, `no dashboard file "${rel}"\n`);
    const headers = { 'content-type': asset.contentType, 'cache-control': asset.cacheControl, etag: asset.etag };
    if (r.headers['if-none-match'] === asset.etag) return answer(r, 304, { 'cache-control': asset.cacheControl, etag: asset.etag });
    answer(r, 200, headers, asset.body);
  }));
}
