/**
 * streamFile under backpressure: a client that stops reading makes uWS's tryEnd write part of a
 * chunk and report backpressure; the rest must follow from exactly where the socket stopped.
 * A client-side sha256 of a 24 MB random file, read slowly, must equal the file's. (A CI run once
 * downloaded a model.safetensors of the right size with the wrong hash: the resumed write started
 * from the offset after the partial write, sending part of a chunk twice.)
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import uWS from 'uWebSockets.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createApp } from '../server/http/guard.ts';
import { route } from '../server/http/http.ts';
import { streamFile } from '../server/http/stream.ts';

const SIZE = 24 * 1024 * 1024 + 12345; // not a multiple of the read stream's 256 KiB chunks
let dir: string;
let file: string;
let want: string;
let port: number;
let listen: uWS.us_listen_socket | null = null;

beforeAll(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-stream-'));
  file = path.join(dir, 'blob.bin');
  const bytes = crypto.randomBytes(SIZE);
  fs.writeFileSync(file, bytes);
  want = crypto.createHash('sha256').update(bytes).digest('hex');
  const app = createApp();
  app.get('/blob', route(0, (r) => streamFile(r, file, SIZE)));
  port = await new Promise<number>((resolve, reject) => app.listen('127.0.0.1', 0, (s) => {
    if (!s) return reject(new Error('listen failed'));
    listen = s;
    resolve(uWS.us_socket_local_port(s));
  }));
});
afterAll(() => {
  if (listen) uWS.us_listen_socket_close(listen);
  fs.rmSync(dir, { recursive: true, force: true });
});

/** GET /blob over a raw socket that reads in bursts with pauses, so that the server's writes back up. */
function slowGet(pauses: number): Promise<{ head: string; body: Buffer }> {
  return new Promise((resolve, reject) => {
    const sock = net.connect(port, '127.0.0.1');
    const parts: Buffer[] = [];
    let got = 0;
    let paused = 0;
    let need = Infinity;
    const finish = () => {
      const all = Buffer.concat(parts);
      const split = all.indexOf('\r\n\r\n');
      sock.destroy();
      resolve({ head: all.subarray(0, split).toString('latin1'), body: all.subarray(split + 4) });
    };
    sock.on('data', (b) => {
      parts.push(b);
      got += b.length;
      if (need === Infinity) {
        const all = Buffer.concat(parts);
        const split = all.indexOf('\r\n\r\n');
        const len = /content-length: (\d+)/i.exec(all.subarray(0, Math.max(split, 0)).toString('latin1'));
        if (split >= 0 && len) need = split + 4 + Number(len[1]);
      }
      if (got >= need) return finish();
      // Stop reading now and then: the kernel buffers fill and uWS reports backpressure.
      if (paused < pauses && got > (paused + 1) * (SIZE / (pauses + 1))) {
        paused++;
        sock.pause();
        setTimeout(() => sock.resume(), 150);
      }
    });
    sock.on('end', finish);
    sock.on('error', reject);
    sock.write('GET /blob HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
  });
}

describe('streamFile', () => {
  it('sends every byte once, in order, to a client that keeps stopping to read', async () => {
    const { head, body } = await slowGet(6);
    expect(head).toMatch(/^HTTP\/1\.1 200 OK/);
    expect(head.toLowerCase()).toContain(`content-length: ${SIZE}`);
    expect(body.length).toBe(SIZE);
    expect(crypto.createHash('sha256').update(body).digest('hex')).toBe(want);
  }, 60_000);

  it('sends an empty file as an empty 200', async () => {
    const empty = path.join(dir, 'empty.bin');
    fs.writeFileSync(empty, '');
    const app = createApp();
    app.get('/e', route(0, (r) => streamFile(r, empty, 0)));
    const p = await new Promise<[number, uWS.us_listen_socket]>((res) => app.listen('127.0.0.1', 0, (s) => res([uWS.us_socket_local_port(s), s])));
    try {
      const r = await fetch(`http://127.0.0.1:${p[0]}/e`);
      expect(r.status).toBe(200);
      expect((await r.arrayBuffer()).byteLength).toBe(0);
    } finally {
      uWS.us_listen_socket_close(p[1]);
    }
  });
});
