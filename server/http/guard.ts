/**
 * The one place where every request enters a Vela server (the main app, `vela policy`'s app, the
 * dashboard mounted on the main app): `createApp()` makes a uWS app whose every HTTP handler,
 * websocket upgrade and websocket handler runs inside a guard, and which knows its routes.
 *
 * - A synchronous throw in any handler never reaches uWS (where it would end the process): an
 *   HTTP request gets its HttpError's status, or 500 `{"error": "internal error", "request_id"}`
 *   with the stack in the log; a websocket is closed with 1011 and a request id; other
 *   connections go on. (Asynchronous failures of HTTP handlers are answered by `route`, http.ts.)
 * - HEAD is answered wherever GET is, by the GET handler, with the headers and no body.
 * - `fallback` answers a path that no route has: 405 with an `Allow` header when the path is
 *   known for other methods, else the given handler (the 404).
 */
import { createRequire } from 'node:module';
import net from 'node:net';
import uWS, { type HttpRequest, type HttpResponse, type TemplatedApp, type WebSocket, type WebSocketBehavior } from 'uWebSockets.js';
import { HttpError, statusLine } from './http.ts';
import { log } from '../log.ts';
import { redactPaths } from './redact.ts';
import { randomId } from '../store/store.ts';
import { NO_ROUTE, recordHttpStatus } from '../metrics/http.ts';

type HttpHandler = (res: HttpResponse, req: HttpRequest) => void | Promise<void>;

const METHODS = ['get', 'post', 'put', 'del', 'patch', 'options', 'head', 'connect', 'trace'] as const;
const WIRE_METHOD: Record<string, string> = { del: 'DELETE' };

/** A uWS app whose handlers all run inside the guard; `fallback` is the 404/405 for unknown paths. */
export interface GuardedApp extends TemplatedApp {
  /** Register the answer for a request no route took (call it last): 405 + Allow first, else `notFound`. */
  fallback(notFound: HttpHandler): GuardedApp;
  /** The methods that `path` answers (upper case, HEAD with GET), for 405's Allow. */
  allowedMethods(path: string): string[];
  /** Every route registered so far (`WS` for a websocket), in order: for tests that must reach them all. */
  routes(): { method: string; pattern: string }[];
}

/** Does a uWS pattern (`/a/:id/b`, `/ui/*`) match a request path? */
function matches(pattern: string, path: string): boolean {
  const p = pattern.split('/');
  const u = path.split('/');
  for (let i = 0; i < p.length; i++) {
    if (p[i] === '*' && i === p.length - 1) return u.length >= p.length - 1;
    if (i >= u.length) return false;
    if (p[i]!.startsWith(':')) continue;
    if (p[i] !== u[i]) return false;
  }
  return p.length === u.length;
}

/** Answer a request whose handler threw synchronously; never throws. */
function answerThrow(res: HttpResponse, what: string, err: unknown): void {
  let status = 500;
  let body: Record<string, unknown>;
  if (err instanceof HttpError) {
    status = err.status;
    body = { error: redactPaths(err.message), ...err.extra };
  } else {
    const requestId = randomId('req-');
    log.error(`${what} failed (${requestId})`, err);
    body = { error: 'internal error', request_id: requestId };
  }
  try {
    res.cork(() => res.writeStatus(statusLine(status)).writeHeader('content-type', 'application/json').end(JSON.stringify(body)));
  } catch {
    // Already answered or aborted: uWS still needs an abort handler when nothing was sent.
    try {
      res.onAborted(() => undefined);
    } catch {}
  }
}

/**
 * The response of a HEAD request as its GET handler sees it: status and headers go out, the body
 * does not (its length is reported). A streaming answer (SSE, a file) ends at its first chunk, and
 * the handler's onAborted runs then, so it stops producing.
 */
function headResponse(res: HttpResponse): HttpResponse {
  let ended = false;
  let onAborted: (() => void) | null = null;
  const finish = (length?: number) => {
    if (ended) return;
    ended = true;
    // Not endWithoutBody(length): uWS 20.30 then leaves the response open, waiting for the body.
    if (length !== undefined) res.writeHeader('content-length', String(length));
    res.endWithoutBody();
    onAborted?.();
  };
  const proxy: HttpResponse = new Proxy(res, {
    get(target, prop) {
      switch (prop) {
        case 'end':
          return (body?: string | ArrayBuffer | ArrayBufferView) => {
            finish(body === undefined ? 0 : typeof body === 'string' ? Buffer.byteLength(body) : body.byteLength);
            return proxy;
          };
        case 'tryEnd':
          return (_chunk: unknown, total: number) => {
            finish(total);
            return [true, true];
          };
        case 'write':
          return () => {
            finish();
            return true;
          };
        case 'writeStatus':
        case 'writeHeader':
          return (...args: unknown[]) => {
            if (!ended) (target as any)[prop](...args);
            return proxy;
          };
        case 'cork':
          return (cb: () => void) => {
            target.cork(cb);
            return proxy;
          };
        case 'onAborted':
          return (cb: () => void) => {
            onAborted = cb;
            target.onAborted(cb);
            return proxy;
          };
        default: {
          const v = (target as any)[prop];
          return typeof v === 'function' ? v.bind(target) : v;
        }
      }
    },
  });
  return proxy;
}

/**
 * Count the answer's status by route pattern (metrics/http.ts): every writeStatus of this
 * response goes through here. uWS responses are plain extensible objects, so the method is
 * replaced on this one response only.
 */
function watchStatus(res: HttpResponse, method: string, pattern: string): void {
  const write = res.writeStatus;
  res.writeStatus = function (this: HttpResponse, status: string) {
    recordHttpStatus(method, pattern, parseInt(status, 10));
    return write.call(this, status);
  };
}

/** Run an HTTP handler inside the guard; `pattern` is its route's (for the metrics). */
function guardHttp(handler: HttpHandler, pattern: string, head = false): HttpHandler {
  return (res, req) => {
    const method = req.getMethod().toUpperCase();
    watchStatus(res, method, pattern);
    const what = `${method} ${req.getUrl()}`;
    try {
      const out = handler(head ? headResponse(res) : res, req);
      if (out instanceof Promise) out.catch((err) => answerThrow(res, what, err));
    } catch (err) {
      answerThrow(res, what, err);
    }
  };
}

/** Close a websocket after its handler threw; never throws. */
function closeAfterThrow(ws: WebSocket<unknown>, what: string, err: unknown): void {
  const requestId = randomId('req-');
  log.error(`${what} failed (${requestId})`, err);
  try {
    ws.end(1011, `internal error (${requestId}; see the server log)`);
  } catch {}
}

function guardBehavior<T>(pattern: string, b: WebSocketBehavior<T>): WebSocketBehavior<T> {
  const out: WebSocketBehavior<T> = { ...b };
  if (b.upgrade) {
    const upgrade = b.upgrade;
    out.upgrade = (res, req, ctx) => {
      watchStatus(res, 'GET', pattern);
      const what = `websocket upgrade ${req.getUrl()}`;
      try {
        upgrade(res, req, ctx);
      } catch (err) {
        answerThrow(res, what, err);
      }
    };
  }
  for (const name of ['open', 'message', 'drain', 'ping', 'pong', 'subscription', 'close'] as const) {
    const h = (b as Record<string, unknown>)[name] as ((ws: WebSocket<T>, ...args: any[]) => void) | undefined;
    if (!h) continue;
    (out as any)[name] = (ws: WebSocket<T>, ...args: unknown[]) => {
      try {
        h(ws, ...args);
      } catch (err) {
        if (name === 'close') log.error(`websocket ${pattern} close handler failed`, err);
        else closeAfterThrow(ws as WebSocket<unknown>, `websocket ${pattern} ${name}`, err);
      }
    };
  }
  return out;
}

/**
 * uWS silently swaps in a pure-JS `ws` shim when its native binary fails to load; that shim has
 * other limits and speed, so refuse it rather than run on it unknowingly.
 * @throws Error naming the cause when the native binary is not in use.
 */
export function assertNativeUws(): void {
  const require = createRequire(import.meta.url);
  const main = require.resolve('uWebSockets.js');
  const nativeLoaded = Object.keys(require.cache).some((k) => k.endsWith('.node') && k.includes('uws_'));
  const fallbackLoaded = Object.keys(require.cache).some((k) => k.startsWith(main.replace(/src[/\\]uws\.js$/, 'dist')));
  if (process.env.UWS_USE_FALLBACK) {
    throw new Error(`UWS_USE_FALLBACK is set (${JSON.stringify(process.env.UWS_USE_FALLBACK)}): uWebSockets.js would run on its pure-JS shim, and Vela refuses to; unset it`);
  }
  if (!nativeLoaded || fallbackLoaded) {
    throw new Error(
      `uWebSockets.js could not load its native binary for ${process.platform}-${process.arch} (Node ABI ${process.versions.modules}) ` +
        'and fell back to a pure-JS shim; Vela refuses to run on it. Use Node 20 on linux-x64/arm64 or darwin.',
    );
  }
}

function inUseMessage(host: string, port: number): string {
  const where = `${host.includes(':') ? `[${host}]` : host}:${port}`;
  return `cannot listen on ${where}: the address is in use (another server on that port?) or cannot be bound here; stop the other server or pick another port with --port`;
}

/**
 * Fail before any side effect (a store that closes "orphan" sessions, engines) when `host:port`
 * is taken: a trial bind with Node's own socket, closed at once. Port 0 always passes.
 * @throws Error naming the address, as listenExclusive does.
 */
export function assertPortFree(host: string, port: number): Promise<void> {
  if (port === 0) return Promise.resolve();
  return new Promise((resolve, reject) => {
    const probe = net.createServer();
    probe.once('error', () => reject(new Error(inUseMessage(host, port))));
    probe.listen({ host, port, exclusive: true }, () => probe.close(() => resolve()));
  });
}

/** uWS's LIBUS_LISTEN_EXCLUSIVE_PORT: bind without SO_REUSEPORT. */
const LISTEN_EXCLUSIVE_PORT = 1;

/**
 * Listen on `host:port` (port 0: any free port) and own it alone. uWS binds with SO_REUSEPORT
 * unless told otherwise, so a second server on a busy port "starts", and the kernel then splits
 * connections between the two (a valid key gets random 401s and 404s from the other one).
 * @returns the listen socket and the port it got.
 * @throws Error naming the address when it is taken (or cannot be bound).
 */
export function listenExclusive(app: uWS.TemplatedApp, host: string, port: number): Promise<{ socket: uWS.us_listen_socket; port: number }> {
  return new Promise((resolve, reject) => {
    (app as any).listen(host, port, LISTEN_EXCLUSIVE_PORT, (ls: uWS.us_listen_socket | false) => {
      if (ls) return resolve({ socket: ls, port: uWS.us_socket_local_port(ls) });
      reject(new Error(inUseMessage(host, port)));
    });
  });
}

/** A new uWS app with every handler guarded (see the module docstring). */
export function createApp(): GuardedApp {
  const app = uWS.App();
  const routes: { method: string; pattern: string; ws?: boolean }[] = [];
  const allowedMethods = (path: string): string[] => {
    const set = new Set<string>();
    for (const r of routes) if (matches(r.pattern, path)) set.add(r.method);
    return [...set].sort();
  };
  const guarded: GuardedApp = new Proxy(app as GuardedApp, {
    get(target, prop) {
      if (typeof prop === 'string' && (METHODS as readonly string[]).includes(prop)) {
        return (pattern: string, handler: HttpHandler) => {
          const method = WIRE_METHOD[prop] ?? prop.toUpperCase();
          routes.push({ method, pattern });
          (target as any)[prop](pattern, guardHttp(handler, pattern));
          if (prop === 'get') {
            routes.push({ method: 'HEAD', pattern });
            target.head(pattern, guardHttp(handler, pattern, true));
          }
          return guarded;
        };
      }
      if (prop === 'any') {
        return (pattern: string, handler: HttpHandler) => {
          for (const method of ['GET', 'HEAD', 'POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS']) routes.push({ method, pattern });
          target.any(pattern, guardHttp(handler, pattern));
          return guarded;
        };
      }
      if (prop === 'ws') {
        return (pattern: string, behavior: WebSocketBehavior<any>) => {
          routes.push({ method: 'GET', pattern, ws: true });
          target.ws(pattern, guardBehavior(pattern, behavior));
          return guarded;
        };
      }
      if (prop === 'fallback') {
        return (notFound: HttpHandler) => {
          target.any('/*', guardHttp((res, req) => {
            const method = req.getMethod().toUpperCase();
            const allow = allowedMethods(req.getUrl());
            if (allow.length > 0 && !allow.includes(method)) {
              res.cork(() => {
                res.writeStatus(statusLine(405)).writeHeader('allow', allow.join(', ')).writeHeader('content-type', 'application/json');
                // A HEAD answer has no body (uWS reports the length it would have had).
                const body = JSON.stringify({ error: `${method} is not allowed on ${req.getUrl()}; it answers ${allow.join(', ')}` });
                if (method === 'HEAD') res.writeHeader('content-length', String(Buffer.byteLength(body))).endWithoutBody();
                else res.end(body);
              });
              return;
            }
            return notFound(method === 'HEAD' ? headResponse(res) : res, req);
          }, NO_ROUTE));
          return guarded;
        };
      }
      if (prop === 'allowedMethods') return allowedMethods;
      if (prop === 'routes') return () => routes.filter((r) => r.method !== 'HEAD').map((r) => ({ method: r.ws ? 'WS' : r.method, pattern: r.pattern }));
      const v = (target as any)[prop];
      return typeof v === 'function' ? v.bind(target) : v;
    },
  });
  return guarded;
}
