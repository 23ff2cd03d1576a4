/**
 * A TypeScript client of Vela's training sessions (PROTOCOL.md sections 2 and 3): REST calls to
 * create and watch a session, then a websocket connection with typed ops that return promises.
 * Requests are pipelined: send many, answers come back in request order.
 *
 *   const vela = new VelaClient('http://127.0.0.1:8080', apiKey);
 *   const s = await vela.waitReady((await vela.createSession({ base_model: 'flow05-tiny' })).id);
 *   const conn = await vela.connect(s);
 *   const { loss } = await conn.forwardBackward(data, { codec: 'JPEG' });
 *   await conn.optimStep({ learning_rate: 1e-3 });
 *
 * A policy (section 6) is driven with `PolicyConnection`, and with real-time chunking by
 * `RealTimeChunking` over an `ActionQueue` (protocol/policy-client.ts, re-exported here).
 */
import WebSocket from 'ws';
import { pack, unpack } from './msgpack.ts';
import { fromWire, toWire, type NDArray } from './ndarray.ts';
import { VelaError } from './errors.ts';

export { VelaError } from './errors.ts';
export { ActionQueue, type ActionQueueOptions, type Capture, type Splice } from './action-queue.ts';
export { PolicyConnection, RealTimeChunking, type PolicyAnswer, type RealTimeChunkingOptions, type RtcTiming } from './policy-client.ts';
// Observations are maps of NDArrays: `ndarray(data, shape)` makes one.
export { ndarray, NDArray } from './ndarray.ts';

/** A datum as the session ops take it (frames encoded with the request's codec, or RAW ndarrays). */
export interface Datum {
  observation: { image?: Record<string, Uint8Array | NDArray>; state?: NDArray; prompt?: string };
  actions?: NDArray;
  weight?: number;
}

export interface SessionJson {
  id: string;
  status: 'starting' | 'ready' | 'closed' | 'error' | 'lost';
  url: string;
  token: string;
  error: string | null;
  base_model: string;
  action_horizon: number;
  [k: string]: unknown;
}

export class VelaClient {
  constructor(readonly baseUrl: string, readonly apiKey: string) {}

  /** One REST call; throws VelaError with the HTTP status as code on an error answer. */
  async http<T = any>(method: string, path: string, body?: unknown): Promise<T> {
    const res = await fetch(this.baseUrl.replace(/\/$/, '') + path, {
      method,
      headers: { authorization: `Bearer ${this.apiKey}`, ...(body !== undefined ? { 'content-type': 'application/json' } : {}) },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    let json: any;
    try {
      json = text ? JSON.parse(text) : {};
    } catch {
      json = { error: text };
    }
    if (!res.ok) throw new VelaError(String(res.status), json.error ?? `HTTP ${res.status}`);
    return json as T;
  }

  createSession(body: Record<string, unknown>): Promise<SessionJson> {
    return this.http('POST', '/v1/training_sessions', body);
  }
  getSession(id: string): Promise<SessionJson> {
    return this.http('GET', `/v1/training_sessions/${id}`);
  }
  closeSession(id: string): Promise<SessionJson> {
    return this.http('POST', `/v1/training_sessions/${id}/close`);
  }

  /** Poll until the session is `ready` (resolves) or `error`/`closed` (throws), at most `timeoutMs`. */
  async waitReady(id: string, timeoutMs = 120_000, pollMs = 100): Promise<SessionJson> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const s = await this.getSession(id);
      if (s.status === 'ready') return s;
      if (s.status !== 'starting') throw new VelaError(s.status, `session ${id} is ${s.status}: ${s.error ?? 'no reason given'}`);
      if (Date.now() > deadline) throw new VelaError('timeout', `session ${id} still starting after ${timeoutMs} ms`);
      await new Promise((r) => setTimeout(r, pollMs));
    }
  }

  /** Open the session's websocket; resolves once the info message arrived. */
  connect(session: Pick<SessionJson, 'url' | 'token'>): Promise<SessionConnection> {
    return SessionConnection.open(session.url, session.token);
  }
}

interface Waiter {
  resolve: (v: any) => void;
  reject: (e: Error) => void;
}

/** One websocket connection to a session. Ops may be called without awaiting (pipelining). */
export class SessionConnection {
  info: Record<string, any> = {};
  private nextId = 1;
  private waiting = new Map<number, Waiter>();
  /** Close code and reason once the socket closed. */
  closed: { code: number; reason: string } | null = null;

  private constructor(readonly ws: WebSocket) {}

  static open(url: string, token: string): Promise<SessionConnection> {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(url, { headers: { authorization: `Bearer ${token}` }, maxPayload: 0 });
      const conn = new SessionConnection(ws);
      let opened = false;
      ws.on('unexpected-response', (_req, res) => {
        let body = '';
        res.on('data', (c: Buffer) => (body += c.toString()));
        res.on('end', () => {
          let msg = body;
          try {
            msg = JSON.parse(body).error ?? body;
          } catch {}
          reject(new VelaError(String(res.statusCode), msg || `HTTP ${res.statusCode}`));
        });
      });
      ws.on('error', (e) => !opened && reject(e));
      ws.on('message', (data: Buffer, isBinary: boolean) => {
        if (!isBinary) return;
        const msg = fromWire(unpack(data)) as Record<string, any>;
        if (!opened && msg.info) {
          opened = true;
          conn.info = msg.info;
          resolve(conn);
          return;
        }
        conn.onAnswer(msg);
      });
      ws.on('close', (code, reason) => {
        conn.closed = { code, reason: reason.toString() };
        const err = new VelaError('closed', `connection closed (${code}${reason.length ? `: ${reason}` : ''})`);
        for (const w of conn.waiting.values()) w.reject(err);
        conn.waiting.clear();
        if (!opened) reject(err);
      });
    });
  }

  private onAnswer(msg: Record<string, any>): void {
    const id = typeof msg.id === 'number' ? msg.id : null;
    const w = id !== null ? this.waiting.get(id) : undefined;
    if (!w) {
      // An error about a frame the server could not read (no id): fail the oldest request.
      const first = this.waiting.entries().next().value as [number, Waiter] | undefined;
      if (first && msg.error !== undefined) {
        this.waiting.delete(first[0]);
        first[1].reject(new VelaError(msg.code ?? 'error', msg.error, first[0]));
      }
      return;
    }
    this.waiting.delete(id!);
    if (msg.error !== undefined) w.reject(new VelaError(msg.code ?? 'error', msg.error, id!));
    else w.resolve(msg.result);
  }

  /** Send one request `{id, op, ...args}`; resolves with its `result`, rejects with VelaError. */
  request<T = any>(op: string, args: Record<string, unknown> = {}): Promise<T> {
    if (this.closed) return Promise.reject(new VelaError('closed', `connection closed (${this.closed.code})`));
    const id = this.nextId++;
    const bytes = pack(toWire({ id, op, ...args }));
    // The server does not read a message past its limit (it closes the connection at the frame
    // header, 1006, without a reason: PROTOCOL.md section 8), so the reason is given here.
    const limit = this.info.max_message_bytes;
    if (typeof limit === 'number' && bytes.length > limit) {
      return Promise.reject(new VelaError('too_large', `message is ${bytes.length} bytes; the server's limit is ${limit} (max_message_bytes, --max-session-message-bytes). ` +
        'Send frames as JPEG (codec "JPEG") or resize them, or split the batch into smaller requests', id));
    }
    return new Promise<T>((resolve, reject) => {
      this.waiting.set(id, { resolve, reject });
      this.ws.send(bytes);
    });
  }

  /** Send raw bytes (tests of bad input); the next answer without a matching id resolves nothing. */
  sendRaw(data: Uint8Array | string): void {
    this.ws.send(data, { binary: typeof data !== 'string' });
  }

  forwardBackward(data: Datum[], opts: { codec?: string; loss_fn?: 'mse' | 'l1' } = {}): Promise<{ loss: number; loss_per_datum: NDArray }> {
    return this.request('forward_backward', { data, ...opts });
  }
  forward(data: Datum[], opts: { codec?: string; keep?: boolean } = {}): Promise<Record<'velocity' | 'target' | 'x_t' | 'noise' | 'time', NDArray>> {
    return this.request('forward', { data, ...opts });
  }
  backward(velocityGrad: NDArray): Promise<Record<string, never>> {
    return this.request('backward', { velocity_grad: velocityGrad });
  }
  optimStep(opts: { learning_rate?: number; beta1?: number; beta2?: number; eps?: number; weight_decay?: number; grad_clip_norm?: number } = {}): Promise<{ grad_norm: number; skipped: boolean }> {
    return this.request('optim_step', opts);
  }
  sample(data: Datum[], opts: { codec?: string; num_steps?: number; weights?: string | null; seed?: number } = {}): Promise<{ actions: NDArray }> {
    return this.request('sample', { data, ...opts });
  }
  saveState(name: string, overwrite = false): Promise<string> {
    return this.request('save_state', { name, overwrite });
  }
  loadState(name: string): Promise<Record<string, never>> {
    return this.request('load_state', { name });
  }
  /** Load another session's saved state (same key): `checkpointId` is `<session id>/states/<name>`. */
  loadCheckpoint(checkpointId: string): Promise<Record<string, never>> {
    return this.request('load_state', { checkpoint_id: checkpointId });
  }
  saveWeights(name: string, overwrite = false): Promise<string> {
    return this.request('save_weights', { name, overwrite });
  }
  abortGradientEpoch(): Promise<{ discarded: number }> {
    return this.request('abort_gradient_epoch');
  }

  close(): Promise<void> {
    if (this.closed) return Promise.resolve();
    return new Promise((resolve) => {
      this.ws.once('close', () => resolve());
      this.ws.close(1000);
    });
  }
}
