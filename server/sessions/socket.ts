/**
 * The session websocket (PROTOCOL.md section 3): binary msgpack requests in, answers out in
 * request order. Pipelining: frames of a request are decoded while the engine runs the one
 * before; the engine sees a session's ops in request order. Read-ahead is bounded: past
 * `readAhead` unanswered requests a request is answered `busy` at once and its payload dropped
 * (uWS 20.30 cannot pause a websocket's reads), so memory stays bounded whatever a client sends.
 */
import type { HttpRequest, HttpResponse, TemplatedApp, WebSocket, us_socket_context_t } from 'uWebSockets.js';
import { ProtocolError } from '../../protocol/errors.ts';
import { exactIntOrString, mapValueBytes, pack, RawMsgpack, unpack } from '../../protocol/msgpack.ts';
import { fromWire, toWire } from '../../protocol/ndarray.ts';
import { idProblem, parseRequest, type RequestId, type SessionRequest } from '../../protocol/messages.ts';
import { credentialOf, safeEqual } from '../http/auth.ts';
import { EngineError } from '../engine/messages.ts';
import { bytesText, requestHeaders, statusLine, WS_TOO_BIG, wsSettings } from '../http/http.ts';
import type { WsAdmission, WsTicket } from '../http/ws-admission.ts';
import { log } from '../log.ts';
import { redactPaths } from '../http/redact.ts';
import { runOp } from './ops.ts';
import { recordSessionRequestRefused } from '../metrics/training.ts';
import type { LiveSession, SessionManager } from './sessions.ts';
import type { ServerConfig } from '../config.ts';
import type { SessionRow, Store } from '../store/store.ts';

interface Entry {
  id: RawMsgpack | null; // the request's id, its msgpack bytes as sent (echoed exactly)
  answer: Buffer | null; // set when ready
}

const TYPE_NAMES: [number, number, string][] = [
  [0xc0, 0xc0, 'nil'], [0xc2, 0xc3, 'a boolean'], [0xc4, 0xc6, 'bytes'], [0xca, 0xcb, 'a float'], [0x90, 0x9f, 'an array'],
  [0xdc, 0xdd, 'an array'], [0x80, 0x8f, 'a map'], [0xde, 0xdf, 'a map'], [0xc7, 0xc9, 'an extension'], [0xd4, 0xd8, 'an extension'],
];

/**
 * The request id of a raw message (PROTOCOL.md section 3, "Request ids"): its exact value and
 * msgpack bytes, or null when the message has none.
 * @throws ProtocolError bad_request for an id of another type (float, nil, ...) or too long.
 */
function requestIdFrom(bytes: Uint8Array): { value: RequestId; raw: RawMsgpack } | null {
  const raw = mapValueBytes(bytes, 'id');
  if (!raw) return null;
  const value = exactIntOrString(raw);
  if (value === null) {
    const kind = TYPE_NAMES.find(([lo, hi]) => raw[0]! >= lo && raw[0]! <= hi)?.[2] ?? 'another type';
    throw new ProtocolError('bad_request', `the request's "id" must be an integer or a string, got ${kind}`);
  }
  const problem = idProblem(value);
  if (problem) throw new ProtocolError('bad_request', problem);
  return { value, raw: new RawMsgpack(raw) };
}

interface ConnData {
  sessionId: string;
  live?: LiveSession;
  queue: Entry[];
  closed: boolean;
  ws?: WebSocket<ConnData>;
  handle?: { takeOver(reason: string): void };
  /** This connection's reservation in the server's websocket caps (ws-admission.ts). */
  ticket?: WsTicket;
}

/** Bytes of unsent answers past which a session connection is closed (1013). */
const SESSION_BACKPRESSURE = 512 * 1024 * 1024;

/** Turn a thrown value into the error text of an answer; internal errors are logged, not shown. */
export function errorText(err: unknown, context: string): { error: string; code: string } {
  if (err instanceof ProtocolError) return { error: redactPaths(err.message), code: err.code };
  if (err instanceof EngineError) return { error: redactPaths(err.message), code: err.code };
  const code = (err as { code?: unknown })?.code;
  if (err instanceof Error && typeof code === 'string' && err.name !== 'Error' && err.name !== 'TypeError') return { error: redactPaths(err.message), code };
  log.error(`${context}: internal error`, err);
  return { error: 'internal error (see the server log)', code: 'internal' };
}

function answerBytes(id: RawMsgpack | null, body: { result: unknown } | { error: string; code: string }): Buffer {
  return pack(toWire({ id, ...body }));
}

/** Send every answer at the head of the queue that is ready, in order. */
function flush(conn: ConnData): void {
  const ws = conn.ws;
  if (!ws || conn.closed) return;
  ws.cork(() => {
    while (conn.queue.length > 0 && conn.queue[0]!.answer !== null) {
      const e = conn.queue.shift()!;
      if (ws.send(e.answer!, true) === 2) {
        log.warn(`session ${conn.sessionId}: answer ${e.id} dropped by backpressure; closing the connection`);
        ws.end(1013, 'answers are not being read: backpressure limit reached');
        return;
      }
    }
  });
}

/**
 * Mount the session websocket at `/v1/training_sessions/:id/ws` (token-checked upgrade). A message
 * past --max-session-message-bytes is not read: uWS closes the connection at its header (1006, see
 * wsSettings). `admission` caps connections and their buffered bytes per session owner (API key)
 * and in total: past a cap the upgrade is answered 429 with the reason.
 */
export function mountSessionSocket(
  app: TemplatedApp,
  deps: { store: Store; sessions: SessionManager; config: ServerConfig; elsewhere?: (row: SessionRow) => string | null; admission?: WsAdmission },
): void {
  const { store, sessions, config } = deps;
  const limit = config.maxSessionMessageBytes;
  app.ws<ConnData>('/v1/training_sessions/:id/ws', {
    ...wsSettings(limit, SESSION_BACKPRESSURE),
    upgrade: (res: HttpResponse, req: HttpRequest, ctx: us_socket_context_t) => {
      const id = req.getParameter(0) ?? '';
      const headers = requestHeaders(req);
      let aborted = false;
      const reject = (status: number, msg: string): void => {
        if (aborted) return;
        res.cork(() => res.writeStatus(statusLine(status)).writeHeader('content-type', 'application/json').end(JSON.stringify({ error: msg })));
      };
      const token = credentialOf(headers);
      // A session open in this process is checked from memory, so the upgrade stays synchronous.
      const live = sessions.live.get(id);
      if (live) {
        if (!token || !safeEqual(token, live.row.token)) return reject(401, 'invalid or missing session token');
        if (!live.engine) return reject(409, `session ${id} is starting: poll GET /v1/training_sessions/${id} until ready`);
        let ticket: WsTicket | undefined;
        if (deps.admission) {
          const granted = deps.admission.admit('owner:' + live.row.owner, limit + SESSION_BACKPRESSURE);
          if ('status' in granted) return reject(granted.status, granted.message);
          ticket = granted;
        }
        return res.upgrade<ConnData>(
          { sessionId: id, live, queue: [], closed: false, ticket },
          headers['sec-websocket-key']!, headers['sec-websocket-protocol'] ?? '', headers['sec-websocket-extensions'] ?? '', ctx,
        );
      }
      // Otherwise the store says why not (closed, lost, unknown, or open on another node).
      res.onAborted(() => (aborted = true));
      store.getSession(id).then(
        (row) => {
          if (!row || !token || !safeEqual(token, row.token)) return reject(row && token ? 401 : row ? 401 : 404, row ? 'invalid or missing session token' : `no session ${id}`);
          const elsewhere = deps.elsewhere?.(row);
          if (elsewhere) return reject(421, `session ${id} runs on node ${row.node_id}: connect to ${elsewhere}`);
          reject(409, `session ${id} is ${row.status}${row.error ? `: ${row.error}` : ''}`);
        },
        (e) => {
          log.error(`session ${id} upgrade`, e);
          reject(500, 'internal error');
        },
      );
    },
    open: (ws) => {
      const conn = ws.getUserData();
      conn.ws = ws;
      const live = conn.live!;
      live.connection?.takeOver('taken over by a new connection to the same session');
      conn.handle = {
        takeOver: (reason: string) => {
          if (!conn.closed) ws.end(4001, reason);
        },
      };
      live.connection = conn.handle;
      live.touch();
      const info = live.engine!.info;
      ws.send(pack(toWire({
        info: {
          session_id: live.id, model: live.config.base_model, base: live.config.base ?? null, base_params: info.baseParams, action_horizon: live.actionHorizon, action_dim: info.actionDim,
          trainable_params: live.trainableParams, image_slots: info.imageSlots, image_size: info.imageSize,
          state_dim: info.stateDim, max_token_len: info.maxTokenLen, backend: info.backend, backend_device: info.backendDevice, cameras: live.cameras,
          last_request_id: live.lastRequestId?.raw ?? null, pending_gradients: live.pendingGradients, max_message_bytes: limit, read_ahead: config.readAhead,
        },
      })), true);
    },
    message: (ws, message, isBinary) => {
      const conn = ws.getUserData();
      const live = conn.live!;
      live.touch();
      if (message.byteLength > limit) {
        // An error answer first (with the request's id when it can be read cheaply), then 1009.
        let id: RawMsgpack | null = null;
        try {
          id = requestIdFrom(new Uint8Array(message))?.raw ?? null;
        } catch {}
        const size = live.engine?.info.imageSize;
        const text = `message is ${message.byteLength} bytes (${bytesText(message.byteLength)}); the limit is ${limit} (${bytesText(limit)}, --max-session-message-bytes). ` +
          `Send frames as JPEG (codec "JPEG") or resize them on the client${size ? ` (the model sees ${size}x${size} images)` : ''}, or split the batch into smaller requests`;
        ws.cork(() => {
          ws.send(answerBytes(id, { error: text, code: 'too_large' }), true);
          ws.end(1009, `message is ${message.byteLength} bytes; the limit is ${limit}`);
        });
        return;
      }
      const entry: Entry = { id: null, answer: null };
      conn.queue.push(entry);
      const fail = (err: unknown) => {
        entry.answer = answerBytes(entry.id, errorText(err, `session ${live.id} request ${entry.id}`));
        flush(conn);
      };
      if (!isBinary) {
        recordSessionRequestRefused(null);
        return fail(new ProtocolError('bad_request', 'text frames are not accepted: send one binary msgpack value per message'));
      }
      let req: SessionRequest;
      let id: { value: RequestId; raw: RawMsgpack } | null;
      try {
        // The ArrayBuffer dies when this callback returns: decoding copies what it keeps.
        const bytes = new Uint8Array(message);
        const value = unpack(bytes);
        id = requestIdFrom(bytes);
        entry.id = id?.raw ?? null;
        if (conn.queue.length > config.readAhead) {
          throw new ProtocolError('bad_request', `busy: ${conn.queue.length - 1} requests are unanswered (read-ahead ${config.readAhead}); wait for answers before sending more`);
        }
        req = parseRequest(fromWire(value), { maxBatch: config.maxBatch, maxPromptBytes: config.maxPromptBytes });
        if (id) req.id = id.value; // decoding rounds integers past 2^53; the raw bytes do not
      } catch (err) {
        recordSessionRequestRefused(null);
        return fail(err);
      }
      const sentId = id;
      runOp(live, req, config)
        .then((result) => {
          live.lastRequestId = sentId;
          entry.answer = answerBytes(entry.id, { result });
          flush(conn);
        })
        .catch(fail);
    },
    drain: (ws) => flush(ws.getUserData()),
    close: (ws, code, message) => {
      const conn = ws.getUserData();
      conn.ticket?.release();
      if (code === WS_TOO_BIG.code && Buffer.from(message).toString() === WS_TOO_BIG.message) {
        log.warn(`session ${conn.sessionId}: a message past ${limit} bytes (${bytesText(limit)}, --max-session-message-bytes); closed at its header`);
      }
      conn.closed = true;
      const live = conn.live;
      if (live && live.connection === conn.handle) live.connection = null;
      live?.touch();
      log.debug(`session ${conn.sessionId}: connection closed (${code})`);
    },
  });
}
