/**
 * The policy websocket (PROTOCOL.md section 6, OpenPI's protocol): metadata on connect, then per
 * binary message decode -> infer -> add timing -> encode -> send, answers in request order.
 *
 * Errors: a text frame with the message (and the stack trace only with --debug; an internal
 * error shows a request id, its stack goes to the server log), then close 1011; an oversize
 * message gets its text frame and close 1009 (Message Too Big). Other connections go on.
 * `__ctrl__` messages of OpenPI's client (episode_start, episode_end) get `{"__ack__": ctrl}`.
 */
import { performance } from 'node:perf_hooks';
import type { HttpRequest, HttpResponse, TemplatedApp, WebSocket, us_socket_context_t } from 'uWebSockets.js';
import { ProtocolError } from '../../protocol/errors.ts';
import { packNumpy } from '../../protocol/ndarray.ts';
import { EngineError } from '../engine/messages.ts';
import { credentialOf } from '../http/auth.ts';
import { bytesText, decodeUrlPart, HttpError, requestHeaders, statusLine, WS_TOO_BIG, wsSettings } from '../http/http.ts';
import { wsKeyOf, type WsAdmission, type WsTicket } from '../http/ws-admission.ts';
import { log } from '../log.ts';
import { PolicyConnectionMetrics } from '../metrics/policy.ts';
import { redactPaths } from '../http/redact.ts';
import { randomId } from '../store/store.ts';
import { decodeMessage, DEFAULT_POLICY_LIMITS } from './observation.ts';
import { RangeWarnings } from './range-warning.ts';
import { MAX_STREAM_CHARS, seedStream } from './seeds.ts';
import { RTC_QUERY_KEYS, RtcConnection, rtcReport, rtcSettings, takeRtcKeys, type RtcPlan, type RtcSettings } from './rtc.ts';
import type { PolicyAnswer, PolicyServer } from './service.ts';

/** What a resolver sees of the upgrade request (copied out of uWS). */
export interface PolicyUpgrade {
  url: string;
  query: URLSearchParams;
  headers: Record<string, string>;
  /** The route pattern's parameters, in order (e.g. the fine-tune id). */
  params: string[];
}

/**
 * Finds the policy a connection is for, checking its credentials. Throw HttpError(401/404/503)
 * to refuse the upgrade with that status.
 */
export type PolicyResolver = (req: PolicyUpgrade) => PolicyServer | Promise<PolicyServer>;

interface Entry {
  arrivedMs: number;
  answer: PolicyAnswer | Buffer | null; // Buffer: a ready control ack
  doneMs: number;
  error: unknown;
}

interface Conn {
  policy: PolicyServer;
  seeds: { next(): number };
  queue: Entry[];
  prevTotalMs: number | null;
  closed: boolean;
  failed: boolean;
  ws?: WebSocket<Conn>;
  metrics?: PolicyConnectionMetrics;
  /** Out-of-range observations: warned once per connection, counted each time. */
  range?: RangeWarnings;
  /** Real-time chunking: the last chunk sent, answer times, round trip (rtc.ts). */
  rtc: RtcConnection;
  /** This connection's reservation in the server's websocket caps (ws-admission.ts). */
  ticket?: WsTicket;
}

/** Bytes of unsent answers past which a policy connection is closed (1013). */
const POLICY_BACKPRESSURE = 64 * 1024 * 1024;

/** The query parameters of a policy connection (PROTOCOL.md section 6). */
const QUERY_KEYS = ['stream', 'seed', ...RTC_QUERY_KEYS];

const CLIENT_ERRORS = new Set(['ShapeError', 'NormError', 'PolicyConfigError']);
const CLOSE_INTERNAL = 1011;
const CLOSE_TOO_BIG = 1009;
const CLOSE_BACKPRESSURE = 1013;

/** The text of an error frame: the message for client errors, a request id for internal ones. */
function errorFrame(err: unknown, debug: boolean, context: string): string {
  const e = err as Error;
  const client = err instanceof ProtocolError || err instanceof EngineError || CLIENT_ERRORS.has(e?.name);
  let text: string;
  if (client) text = redactPaths(e.message);
  else {
    const id = randomId('req-');
    log.error(`${context}: internal error (${id})`, err);
    text = debug ? `internal error (${id}): ${e?.message ?? String(err)}` : `internal error (${id}; see the server log)`;
  }
  return debug && e?.stack ? `${text}\n\n${e.stack}` : text;
}

/** A close reason must fit 123 bytes. */
function shortReason(text: string): string {
  const first = text.split('\n')[0]!;
  return Buffer.byteLength(first) <= 120 ? first : Buffer.from(first).subarray(0, 117).toString('utf8').replace(/\uFFFD$/, '') + '...';
}

function fail(conn: Conn, err: unknown, code = CLOSE_INTERNAL): void {
  const ws = conn.ws;
  if (!ws || conn.closed || conn.failed) return;
  conn.failed = true;
  conn.policy.counters.errors++;
  conn.metrics?.failed();
  const text = errorFrame(err, conn.policy.debug, 'policy request');
  ws.cork(() => {
    ws.send(text, false);
    ws.end(code, shortReason(text));
  });
}

/** Send every answer at the head of the queue that is ready, in order; an error ends the connection. */
function flush(conn: Conn): void {
  const ws = conn.ws;
  if (!ws || conn.closed || conn.failed) return;
  while (conn.queue.length > 0) {
    const e = conn.queue[0]!;
    if (e.error !== null) return fail(conn, e.error);
    if (e.answer === null) return;
    conn.queue.shift();
    let bytes: Buffer;
    if (Buffer.isBuffer(e.answer)) bytes = e.answer;
    else {
      const serverTiming: Record<string, unknown> = { infer_ms: e.doneMs - e.arrivedMs };
      if (conn.prevTotalMs !== null) serverTiming.prev_total_ms = conn.prevTotalMs;
      if (e.answer.rtc) serverTiming.rtc = rtcReport(e.answer.rtc);
      const warnings = conn.range?.check(e.answer.outOfRange);
      bytes = packNumpy({ actions: e.answer.actions, policy_timing: { infer_ms: e.answer.policyInferMs }, server_timing: serverTiming, ...(warnings ? { warnings } : {}) });
    }
    let status = 1;
    ws.cork(() => (status = ws.send(bytes, true)));
    if (status === 2) {
      conn.failed = true;
      log.warn('policy connection: an answer was dropped by backpressure; closing the connection');
      ws.cork(() => ws.end(CLOSE_BACKPRESSURE, 'answers are not being read: backpressure limit reached'));
      return;
    }
    const sentMs = performance.now();
    conn.prevTotalMs = sentMs - e.arrivedMs;
    if (!Buffer.isBuffer(e.answer)) {
      const a = e.answer;
      conn.rtc.answered(a.robotActions, a.actions.shape as [number, number], sentMs - e.arrivedMs, a.rtc && a.rtc.mode !== 'off' ? a.rtc.mode : 'plain');
      // The round trip for RTC's delay estimate: clients answer pings on their own (RFC 6455).
      if (conn.rtc.pinging(sentMs)) ws.ping();
      conn.metrics?.answered({
        decodeMs: a.submittedMs - e.arrivedMs, queueMs: a.queueMs, computeMs: a.policyInferMs, sendMs: sentMs - e.doneMs, totalMs: sentMs - e.arrivedMs, batchSize: a.batchSize,
      });
    }
  }
}

function paramCount(pattern: string): number {
  return pattern.split('/').filter((s) => s.startsWith(':')).length;
}

/**
 * Mounts the policy websocket at `pattern` (`/` standalone, `/v1/fine-tunes/:id/policy` on the
 * main server). `resolve` picks the policy (and checks the key) per connection; it may be async.
 * `maxMessageBytes` is the route's limit (uWS closes a connection, 1006, whose frame declares more:
 * see wsSettings); each policy's own lower limit is checked per message (an error frame, 1009).
 * `admission` caps connections and their buffered bytes per key (the credential presented, or the
 * remote address without one) and in total: past a cap the upgrade is answered 429 with the reason.
 */
export function mountPolicySocket(app: TemplatedApp, pattern: string, resolve: PolicyResolver, opts: { maxMessageBytes?: number; sockets?: Set<WebSocket<unknown>>; limitFlag?: string; admission?: WsAdmission } = {}): void {
  const ceiling = opts.maxMessageBytes ?? DEFAULT_POLICY_LIMITS.maxMessageBytes;
  const nParams = paramCount(pattern);
  app.ws<Conn>(pattern, {
    ...wsSettings(ceiling, POLICY_BACKPRESSURE),
    upgrade: (res: HttpResponse, req: HttpRequest, ctx: us_socket_context_t) => {
      const headers = requestHeaders(req);
      const remote = Buffer.from(res.getRemoteAddressAsText()).toString();
      const params: string[] = [];
      for (let i = 0; i < nParams; i++) params.push(decodeUrlPart(req.getParameter(i) ?? ''));
      const upgrade: PolicyUpgrade = { url: req.getUrl(), query: new URLSearchParams(req.getQuery() ?? ''), headers, params };
      let aborted = false;
      res.onAborted(() => (aborted = true));
      const refuse = (status: number, message: string) => {
        if (aborted) return;
        res.cork(() => res.writeStatus(statusLine(status)).writeHeader('content-type', 'application/json').end(JSON.stringify({ error: message })));
      };
      Promise.resolve()
        .then(() => resolve(upgrade))
        .then((policy) => {
          // A typo (`controlhz`) would otherwise silently leave the setting at its default.
          const unknown = [...upgrade.query.keys()].filter((k) => !QUERY_KEYS.includes(k));
          if (unknown.length > 0) return refuse(400, `unknown query parameter ${unknown.map((k) => JSON.stringify(k)).join(', ')}; a policy connection takes ${QUERY_KEYS.join(', ')}`);
          const stream = upgrade.query.get('stream') ?? '0';
          if (stream.length > MAX_STREAM_CHARS) return refuse(400, `stream is ${stream.length} characters; the limit is ${MAX_STREAM_CHARS}`);
          // ?seed=N: this connection's own seed (reproducible runs on a server started without --seed).
          const seedQ = upgrade.query.get('seed');
          const seed = seedQ === null ? policy.seed : Number(seedQ);
          if (seed !== null && (!/^\d+$/.test(seedQ ?? String(seed)) || !Number.isSafeInteger(seed) || seed > 0xffffffff)) return refuse(400, `seed must be an integer in 0..4294967295, got ${JSON.stringify(seedQ)}`);
          let rtc: RtcSettings;
          try {
            rtc = rtcSettings(policy.rtc, upgrade.query);
          } catch (e) {
            return refuse(400, (e as Error).message);
          }
          if (aborted) return;
          let ticket: WsTicket | undefined;
          if (opts.admission) {
            const granted = opts.admission.admit(wsKeyOf(credentialOf(headers), remote), ceiling + POLICY_BACKPRESSURE);
            if ('status' in granted) return refuse(granted.status, granted.message);
            ticket = granted;
          }
          const conn: Conn = { policy, seeds: seedStream(seed, stream), queue: [], prevTotalMs: null, closed: false, failed: false, rtc: new RtcConnection(rtc), ticket };
          res.cork(() => res.upgrade<Conn>(conn, headers['sec-websocket-key']!, headers['sec-websocket-protocol'] ?? '', headers['sec-websocket-extensions'] ?? '', ctx));
        })
        .catch((err) => {
          if (err instanceof HttpError) return refuse(err.status, redactPaths(err.message));
          const id = randomId('req-');
          log.error(`policy upgrade ${upgrade.url} failed (${id})`, err);
          refuse(500, `internal error (${id})`);
        });
    },
    open: (ws) => {
      const conn = ws.getUserData();
      conn.ws = ws;
      conn.metrics = new PolicyConnectionMetrics(conn.policy.id);
      conn.range = new RangeWarnings(conn.policy.id);
      conn.policy.counters.connections++;
      opts.sockets?.add(ws as WebSocket<unknown>);
      ws.send(packNumpy(conn.policy.metadata(conn.rtc.settings)), true);
    },
    message: (ws, message, isBinary) => {
      const conn = ws.getUserData();
      if (conn.closed || conn.failed) return;
      const arrivedMs = performance.now();
      conn.metrics?.arrived(arrivedMs);
      const { limits } = conn.policy;
      if (message.byteLength > limits.maxMessageBytes) {
        const size = conn.policy.meta.model.imageSize;
        return fail(conn, new ProtocolError('too_large',
          `message is ${message.byteLength} bytes (${bytesText(message.byteLength)}); the limit is ${limits.maxMessageBytes} (${bytesText(limits.maxMessageBytes)}, ${opts.limitFlag ?? '--max-message-bytes'}). ` +
          `Send frames as JPEG (image_codec "JPEG") or resize them on the client: the model sees ${size}x${size} images`), CLOSE_TOO_BIG);
      }
      if (!isBinary) return fail(conn, new ProtocolError('bad_request', 'text frames are not accepted: send the observation as msgpack bytes'));
      if (conn.queue.length >= limits.readAhead) {
        return fail(conn, new ProtocolError('bad_request', `${conn.queue.length} observations are unanswered (the limit is ${limits.readAhead}); wait for each answer before sending the next`));
      }
      let obs: Record<string, unknown>;
      try {
        // The ArrayBuffer dies when this callback returns: decoding copies everything it keeps.
        obs = decodeMessage(new Uint8Array(message), conn.policy.dictionaries, limits.maxDecompressedBytes);
      } catch (err) {
        return fail(conn, err);
      }
      const entry: Entry = { arrivedMs, answer: null, doneMs: 0, error: null };
      conn.queue.push(entry);
      if ('__ctrl__' in obs) {
        const ctrl = obs.__ctrl__;
        if (ctrl === 'episode_start' || ctrl === 'episode_end') conn.rtc.newEpisode();
        entry.answer = packNumpy({ __ack__: ctrl === 'episode_start' || ctrl === 'episode_end' ? ctrl : 'ignored' });
        return flush(conn);
      }
      let plan: RtcPlan | null;
      try {
        plan = conn.rtc.plan(takeRtcKeys(obs), conn.policy.meta.actionHorizon, conn.policy.meta.rtcMaxDelay);
      } catch (err) {
        return fail(conn, err);
      }
      conn.policy
        .infer(obs, conn.seeds.next(), plan)
        .then((answer) => {
          entry.answer = answer;
          entry.doneMs = performance.now();
        })
        .catch((err) => {
          entry.error = err ?? new Error('the request failed without a reason');
        })
        .finally(() => flush(conn));
    },
    drain: (ws) => flush(ws.getUserData()),
    pong: (ws) => ws.getUserData().rtc.pong(performance.now()),
    close: (ws, code, message) => {
      const conn = ws.getUserData();
      conn.ticket?.release();
      if (code === WS_TOO_BIG.code && Buffer.from(message).toString() === WS_TOO_BIG.message) {
        conn.policy.counters.errors++;
        conn.metrics?.failed();
        log.warn(`policy connection ${conn.policy.id}: a message past the route's limit of ${ceiling} bytes (${bytesText(ceiling)}, ${opts.limitFlag ?? '--max-message-bytes'}); closed at its header`);
      }
      // A robot that loses its link mid-request is worth a line: nothing else says where its answers went.
      const unanswered = conn.queue.length;
      if (unanswered > 0 && !conn.failed) log.warn(`policy connection ${conn.policy.id}: closed (${code}${message.byteLength ? ` ${Buffer.from(message).toString()}` : ''}) with ${unanswered} request(s) unanswered`);
      conn.closed = true;
      conn.metrics?.close();
      conn.policy.counters.connections--;
      opts.sockets?.delete(ws as WebSocket<unknown>);
    },
  });
}
