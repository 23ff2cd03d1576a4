/**
 * `vela policy`'s server: one policy at the root path. Routes: the websocket at `/`,
 * `GET /healthz` (OK), `GET /v1/observation.zdict` (the zstd dictionary), `GET /stats` (batch
 * sizes served, open connections, errors, weights version), `GET /metrics` (Prometheus text;
 * behind --api-key unless `metricsPublic`), `PUT /weights` (weights pushed by a
 * training server, push.ts; needs --api-key). Binds 127.0.0.1 unless told otherwise.
 */
import uWS from 'uWebSockets.js';
import { credentialOf, safeEqual } from '../http/auth.ts';
import { HttpError, route, sendJson, sendText, statusLine, type Req } from '../http/http.ts';
import { assertNativeUws, assertPortFree, createApp, listenExclusive } from '../http/guard.ts';
import { hideServerPath } from '../http/redact.ts';
import { mountMetrics } from '../metrics/index.ts';
import { createPolicyServer, type PolicyServer, type PolicyServerOptions } from './service.ts';
import { mountPolicySocket } from './socket.ts';
import { WsAdmission, type WsCaps } from '../http/ws-admission.ts';
import { applyWeightsPush, decodeWeightsPush, MAX_PUSH_BYTES } from './push.ts';

export interface StandaloneOptions extends PolicyServerOptions {
  /** Default 127.0.0.1 (OpenPI's server binds every interface; ours does not by default). */
  host?: string;
  /** Default 8000, OpenPI's port; 0 picks a free one. */
  port?: number;
  /** Largest weights push (`PUT /weights`) in bytes; default MAX_PUSH_BYTES (1 GiB). */
  maxPushBytes?: number;
  /** Answer `GET /metrics` without the API key (`--metrics-public`); default false. */
  metricsPublic?: boolean;
  /**
   * Websocket caps (ws-admission.ts); default DEFAULT_WS_CAPS. Without --api-key a connection's
   * key is its remote address, so one address gets connectionsPerKey connections.
   */
  wsCaps?: Partial<WsCaps>;
}

export interface PolicyServerHandle {
  host: string;
  port: number;
  /** `http://host:port` */
  baseUrl: string;
  /** `ws://host:port/` */
  wsUrl: string;
  policy: PolicyServer;
  /** Every route (`WS` for the websocket): method and uWS pattern. */
  routes(): { method: string; pattern: string }[];
  /** Stop listening, close every connection (1001), refuse queued requests. The engine stays open. */
  close(): Promise<void>;
}

/**
 * Checks a request's key against the policy's configured key (none configured: open).
 * @throws HttpError 401.
 */
export function checkPolicyKey(policy: PolicyServer, headers: Record<string, string>): void {
  if (!policy.apiKey) return;
  const key = credentialOf(headers);
  if (!key) throw new HttpError(401, 'missing API key: send "Authorization: Api-Key <key>" or "Authorization: Bearer <key>"');
  if (!safeEqual(key, policy.apiKey)) throw new HttpError(401, 'invalid API key');
}

/** Loads the checkpoint (see createPolicyServer) and listens. @throws Error when the port is taken. */
export async function startPolicyServer(opts: StandaloneOptions): Promise<PolicyServerHandle> {
  assertNativeUws();
  const host = opts.host ?? '127.0.0.1';
  await assertPortFree(host, opts.port ?? 8000); // before loading a checkpoint for nothing
  if (opts.checkpointDir) hideServerPath(opts.checkpointDir, '<checkpoint>');
  const policy = await createPolicyServer(opts);
  const app = createApp();
  const sockets = new Set<uWS.WebSocket<unknown>>();
  const authed = (r: Req) => checkPolicyKey(policy, r.headers);

  // Readiness, as probes read it: 503 until every graph a robot will ask for is traced (PROTOCOL.md section 6).
  app.get('/healthz', route(0, (r) => {
    const { ready, warming } = policy.readiness();
    sendText(r, ready ? 200 : 503, ready ? 'OK' : `WARMING: ${warming}`);
  }));
  app.get('/v1/observation.zdict', route(0, (r) => {
    authed(r);
    if (r.aborted) return;
    r.aborted = true;
    r.res.cork(() => {
      r.res.writeStatus(statusLine(200)).writeHeader('content-type', 'application/octet-stream').end(policy.dictionary);
    });
  }));
  app.get('/stats', route(0, (r) => {
    authed(r);
    sendJson(r, 200, policy.stats());
  }));
  // Its one key is the operator's: every scrape sees every series.
  mountMetrics(app, (r) => {
    if (!opts.metricsPublic) authed(r);
    return null;
  });
  // Weights pushed by a training server (sync_inference_weights): only with a key, since they
  // replace what every robot gets.
  app.put('/weights', route(0, async (r) => {
    if (!policy.apiKey) throw new HttpError(403, 'this policy server has no --api-key, so it refuses weight pushes: start it with --api-key K');
    authed(r);
    const push = decodeWeightsPush(await r.body(opts.maxPushBytes ?? MAX_PUSH_BYTES));
    sendJson(r, 200, await applyWeightsPush(policy, push));
  }));
  mountPolicySocket(app, '/', (req) => {
    checkPolicyKey(policy, req.headers);
    return policy;
  }, { maxMessageBytes: policy.limits.maxMessageBytes, sockets, admission: new WsAdmission(opts.wsCaps) });
  app.fallback(route(0, (r) => {
    throw new HttpError(404, `no route ${r.method} ${r.url}; the policy websocket is at /`);
  }));

  const { socket: listenSocket, port } = await listenExclusive(app, host, opts.port ?? 8000);
  const hostPart = host.includes(':') ? `[${host}]` : host;
  let closing: Promise<void> | null = null;
  return {
    host,
    port,
    baseUrl: `http://${hostPart}:${port}`,
    wsUrl: `ws://${hostPart}:${port}/`,
    policy,
    routes: () => app.routes(),
    close: () =>
      (closing ??= (async () => {
        uWS.us_listen_socket_close(listenSocket);
        policy.close();
        for (const ws of [...sockets]) ws.end(1001, 'the policy server is shutting down');
      })()),
  };
}
