/**
 * A small layer over uWebSockets.js HTTP: a copied request, body reading with a limit, JSON
 * answers, and the mapping of errors to PROTOCOL.md section 0's status codes. uWS rules kept
 * here once: copy everything from `HttpRequest` synchronously, register `onAborted` before any
 * await, and `cork` every write made after an await.
 */
import fs from 'node:fs';
import { STATUS_CODES } from 'node:http';
import type { HttpRequest, HttpResponse } from 'uWebSockets.js';
import { ProtocolError } from '../../protocol/errors.ts';
import { log } from '../log.ts';
import { randomId } from '../store/store.ts';
import { redactPaths } from './redact.ts';
import { isUnavailable } from '../db/keep.ts';

/** An HTTP error that the client caused or must see: `{"error": message}` with `status`. */
export class HttpError extends Error {
  constructor(readonly status: number, message: string, readonly extra: Record<string, unknown> = {}) {
    super(message);
    this.name = 'HttpError';
  }
}

/** The status line uWS writes for a code, e.g. `404 Not Found` (Node's reason phrases, RFC 9110). */
export function statusLine(status: number): string {
  return `${status} ${STATUS_CODES[status] ?? 'Unknown'}`;
}

/** What a handler sees of a request: copied out of uWS's stack-allocated `HttpRequest`. */
export interface Req {
  method: string;
  url: string;
  query: URLSearchParams;
  headers: Record<string, string>;
  params: string[];
  res: HttpResponse;
  aborted: boolean;
  /**
   * Sends an answer: `write` runs corked and must end the response. When part of the body is
   * still arriving, the rest is read and dropped (never kept), and the connection stays open:
   * closing it with unread bytes would reset it, and a client still sending could lose the
   * answer (a 401 or 413 it needs to see). No-op once the client left.
   */
  answer(write: () => void): void;
  /** The client went away (uWS onAborted): marks the request aborted and fails a body read in progress. */
  abort(): void;
  /**
   * Reads the whole body (at most `limitBytes`: 413 as soon as the declared or received size is
   * past it, without reading the rest).
   */
  body(limitBytes?: number): Promise<Buffer>;
  /** Reads and parses a JSON object body (400 when it is not one). */
  json<T = Record<string, unknown>>(limitBytes?: number): Promise<T>;
  /**
   * Streams the body into `file` (created; pausing the socket while the disk lags), never
   * holding it in memory. Resolves with its size. @throws HttpError 413 as soon as the declared
   * or received size is past `limitBytes` (the partial file is removed), 400 when the client went away.
   */
  bodyToFile(file: string, limitBytes: number): Promise<number>;
}

/** The request's headers (lower-case names), copied: uWS's request is valid only synchronously. */
export function requestHeaders(req: HttpRequest): Record<string, string> {
  const headers: Record<string, string> = {};
  req.forEach((k, v) => (headers[k] = v));
  return headers;
}

/**
 * `decodeURIComponent` for a part of a request's URL.
 * @throws HttpError 400 naming the part when it holds a malformed %-escape or invalid UTF-8.
 */
export function decodeUrlPart(text: string, what = 'a URL path segment'): string {
  try {
    return decodeURIComponent(text);
  } catch {
    const shown = text.length > 200 ? `${text.slice(0, 200)}...` : text;
    throw new HttpError(400, `${what} ${JSON.stringify(shown)} has a malformed %-escape (or one that is not UTF-8)`);
  }
}

/**
 * Bytes of a request body kept before its handler asks for it (handlers check the API key
 * first): past them the socket is paused, so an unauthenticated or unrouted body costs at most
 * this much memory (plus one chunk of uWS's, at most 512 KiB) until it is answered.
 */
export const UNCLAIMED_BODY_BYTES = 1024 * 1024;

/** Does the request carry a body (a non-zero Content-Length, or a Transfer-Encoding)? */
export function hasBody(headers: Record<string, string>): boolean {
  const length = headers['content-length'];
  return (length !== undefined && length.trim() !== '0') || headers['transfer-encoding'] !== undefined;
}

function clip(text: string, max: number): string {
  return text.length > max ? `${text.slice(0, max)}...` : text;
}

/** The warning for Content-Lengths uWS cannot read: the first of each minute, with a count of the rest. */
const unreadableLengths = {
  last: -Infinity,
  quiet: 0,
  seen(what: string): void {
    const now = performance.now();
    if (now - this.last < 60_000) {
      this.quiet++;
      return;
    }
    const more = this.quiet > 0 ? ` (and ${this.quiet} more such requests in the last minute or more)` : '';
    this.last = now;
    this.quiet = 0;
    log.warn(`${what} has 10 or more digits, which uWebSockets.js cannot read; the connection is closed without an answer${more}. Send bodies of 1,000,000,000 bytes or more with Transfer-Encoding: chunked`);
  },
};

/**
 * Copy what a handler needs out of uWS's request (valid only synchronously) and start reading the body.
 * @throws HttpError 400 for a path parameter with a malformed %-escape.
 */
export function copyRequest(res: HttpResponse, req: HttpRequest, paramCount: number): Req {
  const headers = requestHeaders(req);
  if (/^\s*\d{10,}\s*$/.test(headers['content-length'] ?? '')) {
    // uWS 20.30's parser closes such a request once this handler returns, before any answer can
    // go out (even one written now): say so where the operator can see it, once a minute at
    // most (anyone can send these, with or without a key).
    unreadableLengths.seen(`${req.getMethod().toUpperCase()} ${clip(req.getUrl(), 200)}: Content-Length ${clip(headers['content-length']!.trim(), 24)}`);
  }
  const params: string[] = [];
  for (let i = 0; i < paramCount; i++) params.push(decodeUrlPart(req.getParameter(i) ?? ''));

  // onData must be attached synchronously. Until a handler asks for the body (after its key
  // check, say), at most UNCLAIMED_BODY_BYTES are kept and the socket is paused past them; once
  // it asks, chunks are kept up to its limit and the read fails at once past it; once the
  // request is answered (or the client left), the rest is dropped. A handler that streams the
  // body to a file gets the chunks through `sink` instead.
  const chunks: Buffer[] = [];
  let size = 0;
  let limit = Infinity;
  let claimed = false;
  let paused = false;
  let done = !hasBody(headers);
  let waiter: { resolve: () => void; reject: (e: Error) => void } | null = null;
  let cut: (() => void) | null = null;
  let sink: ((chunk: Buffer, isLast: boolean) => void) | null = null;
  const tooLarge = () => new HttpError(413, `body is over ${limit} bytes (${size} so far); the limit is ${limit}`);
  res.onData((chunk, isLast) => {
    size += chunk.byteLength;
    if (isLast) done = true;
    if (sink) return sink(Buffer.from(chunk.slice(0)), isLast);
    if (r.aborted) return; // answered or gone: nothing more is kept
    if (size > limit) {
      waiter?.reject(tooLarge());
      waiter = null;
      return;
    }
    chunks.push(Buffer.from(chunk.slice(0)));
    if (!claimed && size > UNCLAIMED_BODY_BYTES && !isLast && !paused) {
      paused = true;
      res.pause();
    }
    if (isLast) {
      waiter?.resolve();
      waiter = null;
    }
  });
  /** The handler asks for the body: the socket reads again (unless the request is over). */
  const claim = (limitBytes: number) => {
    claimed = true;
    limit = limitBytes;
    if (paused && !r.aborted) {
      paused = false;
      res.resume();
    }
  };

  const r: Req = {
    method: req.getMethod().toUpperCase(),
    url: req.getUrl(),
    query: new URLSearchParams(req.getQuery() ?? ''),
    headers,
    params,
    res,
    aborted: false,
    answer(write) {
      if (paused) {
        paused = false; // the rest is read, to be dropped
        res.resume();
      }
      res.cork(write);
    },
    abort() {
      r.aborted = true;
      if (!done) cut?.(); // a body cut short: its reader fails instead of waiting forever
    },
    async body(limitBytes = 1024 * 1024) {
      const declared = Number(headers['content-length'] ?? 0);
      if (declared > limitBytes) throw new HttpError(413, `body is ${declared} bytes; the limit is ${limitBytes}`);
      if (size > limitBytes) throw new HttpError(413, `body is over ${limitBytes} bytes (${size} so far); the limit is ${limitBytes}`);
      claim(limitBytes);
      if (!done && r.aborted) throw new HttpError(400, 'the client went away before its body was complete');
      if (!done) {
        await new Promise<void>((resolve, reject) => {
          waiter = { resolve, reject };
          cut = () => reject(new HttpError(400, `the client went away after ${size} bytes of its body`));
        });
      }
      return Buffer.concat(chunks.splice(0));
    },
    bodyToFile(file: string, limitBytes: number) {
      const declared = Number(headers['content-length'] ?? 0);
      if (declared > limitBytes) return Promise.reject(new HttpError(413, `body is ${declared} bytes; the limit is ${limitBytes}`));
      return new Promise<number>((resolve, reject) => {
        const out = fs.createWriteStream(file, { flags: 'wx' });
        let finished = false;
        const fail = (e: Error) => {
          if (finished) return;
          finished = true;
          out.destroy();
          fs.rm(file, { force: true }, () => reject(e));
        };
        out.on('error', fail);
        out.on('drain', () => !r.aborted && !finished && res.resume());
        let ended = false;
        const take = (chunk: Buffer, isLast: boolean) => {
          // Failed or ended already: the rest is dropped. A second end (the body's last chunk
          // can be seen both here and by the `done` check below) would fail the stream before
          // its file exists.
          if (finished || ended) return;
          // Past the limit the upload fails at once; the answer closes the connection.
          if (size > limitBytes) return fail(new HttpError(413, `body is over ${limitBytes} bytes (${size} so far); the limit is ${limitBytes}`));
          if (!out.write(chunk) && !isLast) res.pause();
          if (!isLast) return;
          ended = true;
          out.end((err?: Error | null) => {
            if (err) return fail(err);
            if (finished) return;
            finished = true;
            resolve(size);
          });
        };
        if (size > limitBytes) return fail(new HttpError(413, `body is over ${limitBytes} bytes (${size} so far); the limit is ${limitBytes}`));
        for (const c of chunks.splice(0)) out.write(c);
        sink = take;
        claim(limitBytes);
        if (done) take(Buffer.alloc(0), true);
        cut = () => fail(new HttpError(400, `the client went away after ${size} bytes of its upload`));
        if (r.aborted && !done) cut();
      });
    },
    async json<T>(limitBytes?: number) {
      const buf = await r.body(limitBytes);
      if (buf.length === 0) return {} as T;
      let value: unknown;
      try {
        value = JSON.parse(buf.toString('utf8'));
      } catch (e) {
        throw new HttpError(400, `body is not valid JSON: ${(e as Error).message}`);
      }
      if (value === null || typeof value !== 'object' || Array.isArray(value)) throw new HttpError(400, 'body must be a JSON object');
      return value as T;
    },
  };
  return r;
}

/**
 * Send a JSON answer (corked: safe after an await). No-op when the client went away. Sent
 * before the whole body arrived (a 401, 404 or 413), the rest is read and dropped (Req.answer).
 */
export function sendJson(r: Req, status: number, body: unknown, headers: Record<string, string> = {}): void {
  if (r.aborted) return;
  r.aborted = true; // a response is ended once
  r.answer(() => {
    r.res.writeStatus(statusLine(status)).writeHeader('content-type', 'application/json');
    for (const [k, v] of Object.entries(headers)) r.res.writeHeader(k, v);
    r.res.end(JSON.stringify(body));
  });
}

/** Send a text answer (corked: safe after an await; see sendJson). No-op when the client went away. */
export function sendText(r: Req, status: number, text: string, contentType = 'text/plain; charset=utf-8'): void {
  if (r.aborted) return;
  r.aborted = true;
  r.answer(() => {
    r.res.writeStatus(statusLine(status)).writeHeader('content-type', contentType).end(text);
  });
}

/** Map any thrown value to an answer; unexpected ones are 500 with a request id, logged with the stack. */
export function sendError(r: Req, err: unknown): void {
  if (err instanceof HttpError) return sendJson(r, err.status, { error: redactPaths(err.message), ...err.extra });
  if (err instanceof ProtocolError) return sendJson(r, err.code === 'too_large' ? 413 : 400, { error: redactPaths(err.message), code: err.code });
  const code = (err as { code?: unknown })?.code;
  if (err instanceof Error && typeof code === 'string' && (err as any).status) {
    return sendJson(r, (err as any).status, { error: redactPaths(err.message), code });
  }
  if (isUnavailable(err)) {
    // The database is stopped or restarting: the client may retry; nothing of it was lost.
    log.warn(`${r.method} ${r.url}: the database is unavailable (${(err as Error).message})`);
    return sendJson(r, 503, { error: 'the database is unavailable right now; try again in a few seconds' }, { 'retry-after': '5' });
  }
  const requestId = randomId('req-');
  log.error(`${r.method} ${r.url} failed (${requestId})`, err);
  sendJson(r, 500, { error: 'internal error', request_id: requestId });
}

export type Handler = (r: Req) => Promise<void> | void;

/** Wrap a handler: copy the request, track aborts, and turn every throw into an answer. */
export function route(paramCount: number, handler: Handler) {
  return (res: HttpResponse, req: HttpRequest) => {
    const r = copyRequest(res, req, paramCount);
    res.onAborted(() => r.abort());
    Promise.resolve()
      .then(() => handler(r))
      .catch((err) => sendError(r, err));
  };
}

/** A size in bytes for people: `16 MiB`, `1.5 GiB`, `812 bytes`. */
export function bytesText(n: number): string {
  const units: [number, string][] = [[2 ** 30, 'GiB'], [2 ** 20, 'MiB'], [2 ** 10, 'KiB']];
  for (const [size, unit] of units) if (n >= size) return `${Number((n / size).toFixed(1))} ${unit}`;
  return `${n} bytes`;
}

/**
 * The uWS settings every websocket shares: `maxPayloadLength` is the route's message limit
 * (`limitBytes`), so uWS closes a connection whose frame header (or fragments so far) declares more,
 * before it buffers any of it: nothing past the limit is read (issue 32, item 8; an earlier ceiling
 * of 1 GiB above the limit let three connections hold 3 GB). uWS 20.30 closes such a connection
 * without a close frame: the client sees 1006 and no reason, the server's close handler gets 1006
 * "Received too big message" (logged; ws-admission.ts). The limit is in each greeting
 * (`max_message_bytes`), and Vela's clients refuse a larger message before sending it.
 * `maxBackpressure` bytes of unsent answers (bytes; the connection is closed by us, not by uWS,
 * past it), 120 s idle timeout with automatic pings.
 */
export function wsSettings(limitBytes: number, maxBackpressure: number) {
  return { maxPayloadLength: limitBytes, maxBackpressure, closeOnBackpressureLimit: 0, idleTimeout: 120, sendPingsAutomatically: true } as const;
}

/** uWS's close code and message for a frame past maxPayloadLength (see wsSettings). */
export const WS_TOO_BIG = { code: 1006, message: 'Received too big message' } as const;
