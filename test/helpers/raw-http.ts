/**
 * Test helper: one HTTP/1.1 exchange over a raw TCP socket, for requests that fetch refuses to
 * send (malformed %-escapes are fine for fetch, but not invalid UTF-8 bytes in a path or header,
 * lying Content-Length values, or a body cut short). Only 127.0.0.1.
 */
import net from 'node:net';

export interface RawAnswer {
  /** The status code, or 0 when the server closed (or stayed silent) without answering. */
  status: number;
  /** The header block, lower-cased names. */
  headers: Record<string, string>;
  /** What arrived of the body before the answer was complete or the wait ended. */
  body: string;
}

/**
 * Send `head` (request line and headers, without the blank line) and then `body`; with `cut`, the
 * socket is half-closed after the bytes (a body shorter than its Content-Length). Resolves with
 * the answer once its headers and Content-Length bytes arrived, or after `waitMs`.
 */
export function rawHttp(port: number, head: Buffer | string, body: Buffer | string = '', opts: { cut?: boolean; waitMs?: number } = {}): Promise<RawAnswer> {
  return new Promise((resolve) => {
    const sock = net.connect(port, '127.0.0.1');
    const chunks: Buffer[] = [];
    let done = false;
    const finish = () => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      sock.destroy();
      const all = Buffer.concat(chunks);
      const end = all.indexOf('\r\n\r\n');
      if (end < 0) return resolve({ status: 0, headers: {}, body: '' });
      const lines = all.subarray(0, end).toString('latin1').split('\r\n');
      const headers: Record<string, string> = {};
      for (const l of lines.slice(1)) headers[l.slice(0, l.indexOf(':')).toLowerCase()] = l.slice(l.indexOf(':') + 1).trim();
      resolve({ status: Number(lines[0]!.split(' ')[1]) || 0, headers, body: all.subarray(end + 4).toString('utf8') });
    };
    const timer = setTimeout(finish, opts.waitMs ?? 2000);
    const isHead = String(head).startsWith('HEAD '); // an answer to HEAD has no body, whatever its Content-Length
    sock.on('data', (c) => {
      chunks.push(c);
      const all = Buffer.concat(chunks);
      const end = all.indexOf('\r\n\r\n');
      if (end < 0) return;
      const m = /\r\ncontent-length: *(\d+)/i.exec(all.subarray(0, end).toString('latin1'));
      if (isHead || !m || all.length - end - 4 >= Number(m[1])) finish();
    });
    sock.on('error', finish);
    sock.on('close', finish);
    sock.write(Buffer.concat([Buffer.isBuffer(head) ? head : Buffer.from(head as string, 'latin1'), Buffer.from('\r\n\r\n'), Buffer.isBuffer(body) ? body : Buffer.from(body)]));
    if (opts.cut) sock.end();
  });
}
