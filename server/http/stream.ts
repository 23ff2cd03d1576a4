/**
 * Streaming answers on uWS: a file (never held whole in memory, with backpressure) and a
 * Server-Sent Events stream. Both follow uWS's rules: every write after an await is corked, and
 * nothing is written once the client went away.
 */
import fs from 'node:fs';
import { HttpError, statusLine, type Req } from './http.ts';

/**
 * Stream a file as `application/octet-stream`. Resolves when done or when the client left.
 * Uses uWS's tryEnd/onWritable pattern so that a slow reader pauses the file read.
 */
export function streamFile(r: Req, file: string, size: number): Promise<void> {
  return new Promise((resolve) => {
    const res = r.res;
    const stream = fs.createReadStream(file, { highWaterMark: 256 * 1024 });
    let offsetAtPause = 0;
    let pending: Buffer | null = null;
    const finish = () => {
      stream.destroy();
      resolve();
    };
    // route() registered onAborted, which sets r.aborted: poll it between chunks.
    if (r.aborted) return finish();
    res.cork(() => {
      res.writeStatus(statusLine(200)).writeHeader('content-type', 'application/octet-stream');
    });
    let written = 0;
    stream.on('data', (chunk: string | Buffer) => {
      const buf = chunk as Buffer;
      if (r.aborted) return finish();
      let ok = false;
      let done = false;
      // The offset before the write: on backpressure tryEnd has sent part of `buf`, and
      // onWritable's offset minus this one is how much of it went out.
      const offsetBefore = res.getWriteOffset();
      res.cork(() => {
        [ok, done] = res.tryEnd(buf, size);
      });
      written += buf.length;
      if (done) {
        r.aborted = true;
        return finish();
      }
      if (!ok) {
        stream.pause();
        pending = buf;
        offsetAtPause = offsetBefore;
        res.onWritable((offset) => {
          if (r.aborted) {
            finish();
            return true;
          }
          const rest = pending!.subarray(offset - offsetAtPause);
          const [ok2, done2] = res.tryEnd(rest, size);
          if (done2) {
            r.aborted = true;
            finish();
          } else if (ok2) {
            pending = null;
            stream.resume();
          }
          return ok2;
        });
      }
    });
    stream.on('error', () => {
      if (!r.aborted) res.close();
      r.aborted = true;
      finish();
    });
    stream.on('end', () => {
      if (written === 0 && !r.aborted) {
        res.cork(() => res.end());
        r.aborted = true;
      }
      resolve();
    });
  });
}

/** An open SSE stream: `send` writes one event; `comment` a keepalive; `end` closes. */
export interface SseStream {
  send(id: number, event: string, data: unknown): void;
  comment(text: string): void;
  end(): void;
  readonly closed: boolean;
}

/** Start a `text/event-stream` answer on the request; writes are corked and stop once the client left. */
export function openSse(r: Req): SseStream {
  const res = r.res;
  res.cork(() => {
    res.writeStatus(statusLine(200))
      .writeHeader('content-type', 'text/event-stream')
      .writeHeader('cache-control', 'no-cache')
      .writeHeader('x-accel-buffering', 'no');
    res.write(': stream opened\n\n');
  });
  const write = (text: string) => {
    if (r.aborted) return;
    res.cork(() => res.write(text));
  };
  return {
    send: (id, event, data) => write(`id: ${id}\nevent: ${event}\ndata: ${JSON.stringify(data)}\n\n`),
    comment: (text) => write(`: ${text}\n\n`),
    end: () => {
      if (r.aborted) return;
      r.aborted = true;
      res.cork(() => res.end());
    },
    get closed() {
      return r.aborted;
    },
  };
}

const INDEX = /^\d+$/;

/**
 * The first record index a reader of an event log asks for (PROTOCOL.md section 1, "Event
 * cursors"), from `?from=N` and the `Last-Event-ID` header (the last record it saw: N means start
 * at N + 1), given `next`, the index the log's next record will get. Every odd cursor has one
 * answer, so a reconnect neither skips nor repeats a record:
 * - neither given: 0; an empty Last-Event-ID counts as not given (the SSE spec's "no last id");
 * - both given: the later position wins (an EventSource reconnects with its first URL's `from`
 *   and the Last-Event-ID of what it received since);
 * - a cursor up to `next` is valid (`next` waits for the next record);
 * @throws HttpError 400 for an empty `from`, anything but plain decimal digits (negative, "1e3",
 *   " 2", "2.0", words), and a cursor past `next`, naming the log's last index.
 */
export function eventCursor(fromQ: string | null, lastEventId: string | undefined, next: number): number {
  let from: number | null = null;
  if (fromQ !== null) {
    if (!INDEX.test(fromQ)) throw new HttpError(400, `from must be a record index (an integer >= 0), got ${JSON.stringify(fromQ.slice(0, 40))}`);
    from = Number(fromQ);
  }
  const last = lastEventId?.trim() ?? '';
  if (last !== '') {
    if (!INDEX.test(last)) throw new HttpError(400, `Last-Event-ID must be the id of a record this log sent (an integer >= 0), got ${JSON.stringify(last.slice(0, 40))}`);
    from = Math.max(from ?? 0, Number(last) + 1);
  }
  const cursor = from ?? 0;
  if (cursor > next) {
    const given = fromQ !== null && Number(fromQ) === cursor ? `from=${fromQ}` : `Last-Event-ID ${last}`;
    throw new HttpError(400, next === 0
      ? `${given} is past the end of the log: it has no records yet (start at from=0)`
      : `${given} is past the end of the log: its last record has index ${next - 1} (reconnect with from=${next} or lower)`, { last_index: next - 1 });
  }
  return cursor;
}
