/**
 * Test and bench harness: hostile request bodies against a server in another process, and what
 * they cost it. A body of any size is sent from a raw socket (zeros, with backpressure, never
 * held whole), with a Content-Length or chunked; a gzip "bomb" of concatenated members is
 * built in a moment; the server's RSS is read from /proc and `/healthz` is timed while it works.
 */
import fs from 'node:fs';
import net from 'node:net';
import crypto from 'node:crypto';
import zlib from 'node:zlib';
import * as tar from 'tar';

/** The resident set of process `pid`, in bytes (Linux /proc). */
export function rssBytes(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
  if (!m) throw new Error(`no VmRSS for process ${pid}`);
  return Number(m[1]) * 1024;
}

/** Samples `rssBytes(pid)` every `everyMs` until stopped; `peak()` is the largest seen, in bytes. */
export function watchRss(pid: number, everyMs = 25): { peak(): number; stop(): number } {
  let peak = rssBytes(pid);
  const t = setInterval(() => {
    try {
      peak = Math.max(peak, rssBytes(pid));
    } catch {}
  }, everyMs);
  return { peak: () => peak, stop: () => (clearInterval(t), peak) };
}

/**
 * Times `GET /healthz` back to back (one at a time, `gapMs` apart) until stopped; `stop()`
 * returns each answer's latency in ms (a request that fails counts as its time to fail).
 */
export function probeHealth(baseUrl: string, gapMs = 20): { stop(): Promise<number[]> } {
  const times: number[] = [];
  let running = true;
  const loop = (async () => {
    while (running) {
      const t0 = performance.now();
      await fetch(`${baseUrl}/healthz`).then((r) => r.text()).catch(() => undefined);
      times.push(performance.now() - t0);
      await new Promise((r) => setTimeout(r, gapMs));
    }
  })();
  return {
    stop: async () => {
      running = false;
      await loop;
      return times;
    },
  };
}

/** The `q` quantile (0..1) of `xs`. */
export function quantile(xs: number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s[Math.min(s.length - 1, Math.floor(q * s.length))]!;
}

export interface SentBody {
  /** The answer's status, 0 when the server closed without one. */
  status: number;
  /** The answer's body (text). */
  body: string;
  /** Body bytes the socket took before the answer came (or, with `keepSending`, in all) or the server closed. */
  sentBytes: number;
  /** Body bytes sent when the whole answer had arrived; null without an answer. */
  answeredAfterBytes: number | null;
  /** The server closed the connection. */
  closed: boolean;
}

/**
 * Sends `head` (request line and headers; a trailing CRLF is dropped) then `totalBytes` of body from
 * `source` (zeros by default), chunked when `chunked`, else as given (`head` carries its own
 * Content-Length). Stops sending once an answer has arrived (unless `keepSending`: an attacker
 * sends it all anyway) or the server closed; resolves when the answer is complete (and, with
 * `keepSending`, all was sent), the server closed, or `waitMs` after the last byte went out.
 * `pauseAfterBytes` holds the body there until an answer is complete or `pauseMs` (10 s) passed,
 * so "answered before the body ended" does not depend on how fast a loaded machine schedules the
 * server against this sender (loopback takes 256 MiB in ~0.2 s).
 */
export function sendBody(port: number, head: string, totalBytes: number, opts: { chunked?: boolean; source?: AsyncIterable<Buffer>; waitMs?: number; keepSending?: boolean; pauseAfterBytes?: number; pauseMs?: number } = {}): Promise<SentBody> {
  return new Promise((resolve) => {
    const sock = net.connect(port, '127.0.0.1');
    let answer = Buffer.alloc(0);
    let sent = 0;
    let closed = false;
    let done = false;
    let allSent = false;
    let answeredAt: number | null = null;
    let timer: NodeJS.Timeout | undefined;
    const finish = () => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      sock.destroy();
      const text = answer.toString('utf8');
      const end = text.indexOf('\r\n\r\n');
      resolve({ status: Number(/^HTTP\/1\.1 (\d+)/.exec(text)?.[1] ?? 0), body: end >= 0 ? text.slice(end + 4) : '', sentBytes: sent, answeredAfterBytes: answeredAt, closed });
    };
    const complete = () => {
      const text = answer.toString('latin1');
      const end = text.indexOf('\r\n\r\n');
      if (end < 0) return false;
      const m = /\r\ncontent-length: *(\d+)/i.exec(text.slice(0, end));
      return !m || answer.length - end - 4 >= Number(m[1]);
    };
    let answered: () => void = () => undefined;
    const answeredOnce = new Promise<void>((res) => (answered = res));
    sock.on('data', (c) => {
      answer = Buffer.concat([answer, c]);
      if (!complete()) return;
      answeredAt ??= sent;
      answered();
      if (!opts.keepSending || allSent) finish();
    });
    sock.on('error', () => undefined);
    sock.on('close', () => {
      closed = true;
      finish();
    });
    const write = (b: Buffer) => (sock.destroyed || (answer.length > 0 && !opts.keepSending) ? Promise.resolve(false) : new Promise<boolean>((res) => (sock.write(b) ? res(true) : sock.once('drain', () => res(true)))));
    (async () => {
      await write(Buffer.from(`${head.replace(/(\r\n)+$/, '')}\r\n${opts.chunked ? 'Transfer-Encoding: chunked\r\n' : ''}\r\n`, 'latin1'));
      const zeros = Buffer.alloc(256 * 1024);
      const chunks = opts.source ?? (async function* () {
        for (let left = totalBytes; left > 0; left -= zeros.length) yield left >= zeros.length ? zeros : zeros.subarray(0, left);
      })();
      let paused = opts.pauseAfterBytes === undefined;
      for await (const c of chunks) {
        if (!paused && sent >= opts.pauseAfterBytes!) {
          paused = true;
          await Promise.race([answeredOnce, new Promise((res) => setTimeout(res, opts.pauseMs ?? 10_000))]);
        }
        const piece = opts.chunked ? Buffer.concat([Buffer.from(`${c.length.toString(16)}\r\n`), c, Buffer.from('\r\n')]) : c;
        if (!(await write(piece))) break;
        sent += c.length;
      }
      if (opts.chunked && !done) await write(Buffer.from('0\r\n\r\n'));
      allSent = true;
      if (answeredAt !== null) finish();
      if (!done) timer = setTimeout(finish, opts.waitMs ?? 30_000);
    })().catch(finish);
  });
}

/**
 * Writes a .tgz of one file `bomb/zeros.bin` that inflates to `inflatedBytes` (a multiple of
 * 64 MiB): a gzip member with the tar header, then the same 64 MiB member again and again (1%
 * random bytes, the rest zeros: about 1/100 of its size compressed, under node-tar's own ratio
 * cap of 1000), as `cat a.gz b.gz` makes one gzip. With `afterEnd`, the tar instead holds a
 * 1 KiB file and ends, and the members follow its end: a tar reader ignores them, but they
 * still inflate. @returns the archive's size in bytes.
 */
export function writeBombTgz(file: string, inflatedBytes: number, opts: { afterEnd?: boolean } = {}): number {
  const block = 64 * 1024 * 1024;
  if (inflatedBytes % block !== 0) throw new Error(`inflatedBytes must be a multiple of ${block}`);
  const header = new tar.Header({ path: 'bomb/zeros.bin', mode: 0o644, size: opts.afterEnd ? 1024 : inflatedBytes, type: 'File', mtime: new Date(0), uid: 0, gid: 0 });
  header.encode();
  const data = Buffer.alloc(block);
  const random = crypto.randomBytes(block / 100);
  for (let i = 0; i < random.length; i += 4096) random.copy(data, i * 100, i, Math.min(i + 4096, random.length));
  const member = zlib.gzipSync(data, { level: 6 });
  const fd = fs.openSync(file, 'w');
  const end = Buffer.alloc(1024); // tar's two end blocks
  if (opts.afterEnd) fs.writeSync(fd, zlib.gzipSync(Buffer.concat([header.block!, Buffer.alloc(1024), end])));
  else fs.writeSync(fd, zlib.gzipSync(header.block!));
  for (let n = 0; n < inflatedBytes / block; n++) fs.writeSync(fd, member);
  if (!opts.afterEnd) fs.writeSync(fd, zlib.gzipSync(end));
  fs.closeSync(fd);
  return fs.statSync(file).size;
}

/** Streams `file` as chunks (for sendBody's `source`). */
export async function* fileChunks(file: string): AsyncIterable<Buffer> {
  for await (const c of fs.createReadStream(file, { highWaterMark: 256 * 1024 })) yield c as Buffer;
}
