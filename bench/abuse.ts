/**
 * Hostile bodies against a real `vela serve` (a child process, default settings but a temporary
 * data folder): what they cost it in RSS and in `/healthz` latency. `npx tsx bench/abuse.ts`.
 *
 * 1. idle: `/healthz` alone.
 * 2. at once: `PUT /v1/datasets/bomb` with a ~10 MB .tgz that inflates to 1 GiB (extracted in
 *    full: the default --max-dataset-bytes is 8 GiB; then refused, it holds no dataset) and an
 *    unauthenticated `POST /v1/fine-tunes` declaring a 900 MB body, sent in full whatever the answer.
 * 3. `POST /training/job_start` with 600 MB of base64 `dataset_content` (not an archive: a 400
 *    once decoded to disk).
 * Prints p50 / p99 / max of `/healthz` during each, the server's RSS growth (peak over before),
 * and each answer.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { NodeProc } from '../test/helpers/node-proc.ts';
import { fileChunks, probeHealth, quantile, rssBytes, sendBody, watchRss, writeBombTgz, type SentBody } from '../test/helpers/abuse.ts';

const KEY = 'bench-abuse-key';
const MiB = 1024 * 1024;
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-abuse-'));

async function measure(server: NodeProc, what: string, work: () => Promise<SentBody[]>): Promise<void> {
  const pid = server.child.pid!;
  global.gc?.();
  const before = rssBytes(pid);
  const rss = watchRss(pid);
  const probe = probeHealth(server.baseUrl);
  const t0 = performance.now();
  const answers = await work();
  const ms = performance.now() - t0;
  await new Promise((r) => setTimeout(r, 300));
  const times = await probe.stop();
  const peak = rss.stop();
  const f = (x: number) => x.toFixed(1);
  console.log(`${what}: ${(ms / 1000).toFixed(1)} s; /healthz x${times.length} p50 ${f(quantile(times, 0.5))} ms, p99 ${f(quantile(times, 0.99))} ms, max ${f(Math.max(...times))} ms; RSS ${f(before / MiB)} MiB -> peak ${f(peak / MiB)} MiB (+${f((peak - before) / MiB)} MiB)`);
  for (const a of answers) console.log(`  -> ${a.status} ${a.body.slice(0, 160)} (${f(a.sentBytes / MiB)} MiB of body sent; answered after ${a.answeredAfterBytes === null ? '-' : f(a.answeredAfterBytes / MiB)} MiB)`);
}

async function main(): Promise<void> {
  const bomb = path.join(tmp, 'bomb.tgz');
  const bombBytes = writeBombTgz(bomb, 1024 * MiB);
  console.log(`bomb: ${(bombBytes / MiB).toFixed(1)} MiB .tgz inflating to 1024 MiB`);
  const server = await NodeProc.start({ VELA_API_KEY: KEY, VELA_DATA_DIR: path.join(tmp, 'data'), VELA_DATASETS_DIR: path.join(tmp, 'datasets') });
  const port = Number(new URL(server.baseUrl).port);
  try {
    await new Promise((r) => setTimeout(r, 1000));
    await measure(server, 'idle 3 s', async () => (await new Promise((r) => setTimeout(r, 3000)), []));
    await measure(server, 'bomb .tgz + 900 MB unauthenticated body, at once', () => Promise.all([
      sendBody(port, `PUT /v1/datasets/bomb HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nContent-Length: ${bombBytes}`, bombBytes, { source: fileChunks(bomb), waitMs: 120_000 }),
      // An attacker sends it all, whatever the answer.
      sendBody(port, 'POST /v1/fine-tunes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 900000000', 900_000_000, { keepSending: true }),
    ]));
    const content = 600_000_000; // base64 characters
    const head = '{"dataset": "big", "dataset_content": "';
    const tail = '"}';
    const chunk = Buffer.alloc(1024 * 1024, 'A');
    async function* body() {
      yield Buffer.from(head);
      for (let left = content; left > 0; left -= chunk.length) yield left >= chunk.length ? chunk : chunk.subarray(0, left);
      yield Buffer.from(tail);
    }
    const total = head.length + content + tail.length;
    await measure(server, 'job_start with 600 MB of dataset_content', async () => [
      await sendBody(port, `POST /training/job_start HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nContent-Type: application/json\r\nContent-Length: ${total}`, total, { source: body(), waitMs: 120_000 }),
    ]);
  } finally {
    await server.stop();
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

if (process.argv.includes('--help') || process.argv.includes('-h')) {
  console.log(`usage: npx tsx bench/abuse.ts

Starts vela serve (a child process, temporary folders) and sends it hostile bodies: a .tgz that
inflates to 1 GiB with a 900 MB unauthenticated body at the same time, then job_start with 600 MB
of dataset_content. Prints /healthz p50 / p99 / max during each and the server's RSS growth.
Takes no options; about a minute on 2 cores, and ~2.6 GB of temporary disk.`);
} else {
  await main();
}
