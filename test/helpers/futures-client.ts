/**
 * Test helper: a client of the futures API (`/api/v1/...`, PROTOCOL.md section 7) that follows
 * Tinker's polling rules: an op answers `{request_id}`; `retrieve_future` is called again at once
 * on `{"type": "try_again"}` (the server already waited), again after a backoff on 408 and 5xx
 * (50 ms doubling to 1 s), and stops on 404 / 410 / other 4xx and on `{"error", "category"}`.
 * Bodies go as JSON (arrays `{data, dtype, shape}`, frames base64) or msgpack (OpenPI ndarrays).
 */
import { packNumpy, unpackNumpy, NDArray } from '../../protocol/ndarray.ts';
import type { Datum } from '../../protocol/client.ts';

/** An HTTP error answer (status), an error future (category), or an expired / unknown id. */
export class FutureError extends Error {
  constructor(readonly status: number, readonly category: string | null, message: string, readonly body: any = null) {
    super(message);
    this.name = 'FutureError';
  }
}

export type Format = 'json' | 'msgpack';

/** JSON form of a value: NDArray -> {data, dtype, shape}, bytes -> base64. */
export function toJsonBody(v: unknown): unknown {
  if (v instanceof NDArray) return { data: Array.from(v.data as ArrayLike<number | bigint>, (x) => (typeof x === 'bigint' ? Number(x) : x)), dtype: v.dtype, shape: [...v.shape] };
  if (v instanceof Uint8Array) return Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString('base64');
  if (Array.isArray(v)) return v.map(toJsonBody);
  if (v !== null && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, toJsonBody(x)]));
  return v;
}

/** `{data, dtype, shape}` objects of a JSON answer back to NDArrays (to compare with msgpack answers). */
export function fromJsonBody(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(fromJsonBody);
  if (v !== null && typeof v === 'object') {
    const o = v as Record<string, unknown>;
    if (Object.keys(o).length === 3 && Array.isArray(o.data) && typeof o.dtype === 'string' && Array.isArray(o.shape)) {
      return new NDArray(o.dtype, o.shape as number[], o.dtype.endsWith('f4') ? Float32Array.from(o.data as number[]) : Float64Array.from(o.data as number[]));
    }
    return Object.fromEntries(Object.entries(o).map(([k, x]) => [k, fromJsonBody(x)]));
  }
  return v;
}

export interface PollStats {
  tryAgain: number;
  retried: number; // 408 / 5xx retries
  reasons: string[]; // queue_state_reason of each try_again
}

export class FuturesClient {
  readonly stats: PollStats = { tryAgain: 0, retried: 0, reasons: [] };
  constructor(readonly baseUrl: string, readonly apiKey: string, readonly format: Format = 'json') {}

  /** One HTTP call; returns status and the decoded answer (in the client's format). */
  async raw(method: string, route: string, body?: unknown, format: Format = this.format): Promise<{ status: number; body: any }> {
    const type = format === 'msgpack' ? 'application/msgpack' : 'application/json';
    const res = await fetch(`${this.baseUrl}/api/v1/${route}`, {
      method,
      headers: { authorization: `Bearer ${this.apiKey}`, ...(method === 'GET' ? { accept: type } : { 'content-type': type }) },
      body: method === 'GET' || body === undefined ? undefined : format === 'msgpack' ? packNumpy(body) : JSON.stringify(toJsonBody(body)),
    });
    const bytes = Buffer.from(await res.arrayBuffer());
    const isMsgpack = /msgpack/.test(res.headers.get('content-type') ?? '');
    let decoded: any = null;
    if (bytes.length) decoded = isMsgpack ? unpackNumpy(bytes) : fromJsonBody(JSON.parse(bytes.toString('utf8')));
    return { status: res.status, body: decoded };
  }

  /** A call that must answer 200; else FutureError with the status. */
  async call(route: string, body?: unknown, method = 'POST'): Promise<any> {
    const { status, body: b } = await this.raw(method, route, body);
    if (status !== 200) throw new FutureError(status, null, `${route}: HTTP ${status}: ${b?.error ?? JSON.stringify(b)}`, b);
    return b;
  }

  /** Submit an op; returns its request id. */
  async submit(op: string, body: Record<string, unknown>): Promise<string> {
    return (await this.call(op, body)).request_id;
  }

  /** Poll one future to its end, by Tinker's rules. @throws FutureError. */
  async retrieve(requestId: string, maxRetries = 20): Promise<any> {
    let backoffMs = 50;
    let retries = 0;
    for (;;) {
      let answer: { status: number; body: any };
      try {
        answer = await this.raw('POST', 'retrieve_future', { request_id: requestId });
      } catch (e) {
        answer = { status: 599, body: { error: (e as Error).message } }; // connection error: retry like a 5xx
      }
      const { status, body } = answer;
      if (status === 408 || status >= 500) {
        if (++retries > maxRetries) throw new FutureError(status, null, `retrieve_future ${requestId}: HTTP ${status} after ${maxRetries} retries`, body);
        this.stats.retried++;
        await new Promise((r) => setTimeout(r, backoffMs));
        backoffMs = Math.min(1000, backoffMs * 2);
        continue;
      }
      if (status !== 200) throw new FutureError(status, null, `retrieve_future ${requestId}: HTTP ${status}: ${body?.error}`, body);
      if (body?.type === 'try_again') {
        this.stats.tryAgain++;
        this.stats.reasons.push(body.queue_state_reason);
        continue;
      }
      if (body && typeof body === 'object' && typeof body.error === 'string' && typeof body.category === 'string') {
        throw new FutureError(200, body.category, body.error, body);
      }
      return body;
    }
  }

  /** Submit and wait. */
  async run(op: string, body: Record<string, unknown>): Promise<any> {
    return this.retrieve(await this.submit(op, body));
  }

  /** create_model, then wait for its future (the model is ready). */
  async createModel(body: Record<string, unknown>): Promise<{ model_id: string; [k: string]: unknown }> {
    const created = await this.call('create_model', body);
    return this.retrieve(created.request_id);
  }

  forwardBackward(modelId: string, data: Datum[], opts: Record<string, unknown> = {}): Promise<{ loss: number; loss_per_datum: NDArray }> {
    return this.run('forward_backward', { model_id: modelId, data, ...opts });
  }
  optimStep(modelId: string, opts: Record<string, unknown> = {}): Promise<{ grad_norm: number; skipped: boolean }> {
    return this.run('optim_step', { model_id: modelId, ...opts });
  }
  saveWeights(modelId: string, opts: Record<string, unknown> = {}): Promise<{ name: string; path: string; checkpoint_id: string }> {
    return this.run('save_weights', { model_id: modelId, ...opts });
  }
}
