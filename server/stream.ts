/**
 * Streaming answers on uWS: a file (never held whole in memory, with backpressure) and a
 * Server-Sent Events stream. Both follow uWS's rules: every write after an await is corked, and
 * nothing is written once the client went away.
 */
import fs from 'node:fs';
import { statusLine, type Req } from './http.ts';

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
        offsetAtPause = res.getWriteOffset();
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
