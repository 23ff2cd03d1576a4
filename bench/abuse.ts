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
import WebSocket from 'ws';
import { VelaClient } from '../protocol/client.ts';
import { g1Datums } from '../test/helpers/g1.ts';
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

// ---- Websocket frames and connections (issue 32, item 8) ----------------------------------------

/** Open a websocket; resolves with the socket once its greeting arrives, or the refusal's status and body. */
function openWs(url: string, headers: Record<string, string>): Promise<{ ws: WebSocket } | { status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url, { headers });
    ws.once('message', () => resolve({ ws }));
    ws.on('unexpected-response', (_req, res) => {
      let body = '';
      res.on('data', (d: Buffer) => (body += d.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    ws.on('error', (e) => { if (!/Unexpected server response/.test(e.message)) reject(e); });
  });
}

/**
 * Three 1000 MiB frames on three authenticated policy connections (a training session's policy
 * websocket), then 20 policy connections of one key: the server's RSS before, at the peak during,
 * and after; the close codes and refusals. Written to bench/results/ws-frames.json.
 */
async function wsFrames(server: NodeProc): Promise<void> {
  const pid = server.child.pid!;
  const client = new VelaClient(server.baseUrl, KEY);
  const s = await client.waitReady((await client.createSession({ base_model: 'flow05-tiny' })).id);
  // One forward_backward binds the session's cameras, so its policy websocket takes connections.
  const conn = await client.connect(s);
  await conn.forwardBackward(await g1Datums(2, { episode: 0 }), { codec: 'JPEG' });
  await conn.close();
  const policyUrl = server.baseUrl.replace(/^http/, 'ws') + `/v1/training_sessions/${s.id}/policy`;
  const auth = { authorization: `Bearer ${KEY}` };
  const f = (x: number) => Number((x / MiB).toFixed(1));
  const frame = Buffer.alloc(1000 * MiB, 1);
  await new Promise((r) => setTimeout(r, 500));
  const before1 = rssBytes(pid);
  let rss = watchRss(pid);
  const codes = await Promise.all([0, 1, 2].map(async () => {
    const o = await openWs(policyUrl, auth);
    if (!('ws' in o)) return `refused ${o.status}`;
    return new Promise<string>((resolve) => {
      o.ws.on('close', (code, reason) => resolve(`${code} ${JSON.stringify(reason.toString())}`));
      o.ws.on('error', () => {});
      o.ws.send(frame);
    });
  }));
  const peak1 = rss.stop();
  await new Promise((r) => setTimeout(r, 500));
  const after1 = rssBytes(pid);
  const health1 = (await fetch(`${server.baseUrl}/healthz`)).status;
  console.log(`three 1000 MiB frames on three policy connections: RSS ${f(before1)} MiB -> peak ${f(peak1)} MiB (+${f(peak1 - before1)} MiB) -> after ${f(after1)} MiB; closes ${codes.join(', ')}; /healthz ${health1}`);

  const before2 = rssBytes(pid);
  rss = watchRss(pid);
  const opened: WebSocket[] = [];
  const refused: string[] = [];
  for (let i = 0; i < 20; i++) {
    const o = await openWs(policyUrl, auth);
    if ('ws' in o) opened.push(o.ws);
    else refused.push(`${o.status} ${o.body}`);
  }
  // Each open connection tries its own 1000 MiB frame as well.
  await Promise.all(opened.map((ws) => new Promise<void>((resolve) => { ws.on('close', () => resolve()); ws.on('error', () => {}); ws.send(frame); })));
  const peak2 = rss.stop();
  await new Promise((r) => setTimeout(r, 500));
  const after2 = rssBytes(pid);
  console.log(`20 policy connections of one key, each sending 1000 MiB: ${opened.length} opened, ${refused.length} refused (${refused[0] ?? '-'}); RSS ${f(before2)} MiB -> peak ${f(peak2)} MiB (+${f(peak2 - before2)} MiB) -> after ${f(after2)} MiB`);
  const out = {
    date: new Date().toISOString(),
    frames: { rss_before_mib: f(before1), rss_peak_mib: f(peak1), rss_after_mib: f(after1), closes: codes, healthz: health1 },
    connections: { tried: 20, opened: opened.length, refused: refused.length, first_refusal: refused[0] ?? null, rss_before_mib: f(before2), rss_peak_mib: f(peak2), rss_after_mib: f(after2) },
  };
  fs.writeFileSync(path.join(path.dirname(new URL(import.meta.url).pathname), 'results', 'ws-frames.json'), JSON.stringify(out, null, 2) + '\n');
}

if (process.argv.includes('--ws')) {
  const server = await NodeProc.start({ VELA_API_KEY: KEY, VELA_DATA_DIR: path.join(tmp, 'data'), VELA_DATASETS_DIR: path.join(tmp, 'datasets') });
  try {
    await wsFrames(server);
  } finally {
    await server.stop();
    fs.rmSync(tmp, { recursive: true, force: true });
  }
} else if (process.argv.includes('--help') || process.argv.includes('-h')) {
  console.log(`usage: npx tsx bench/abuse.ts

Starts vela serve (a child process, temporary folders) and sends it hostile bodies: a .tgz that
inflates to 1 GiB with a 900 MB unauthenticated body at the same time, then job_start with 600 MB
of dataset_content. Prints /healthz p50 / p99 / max during each and the server's RSS growth.
Takes no options; about a minute on 2 cores, and ~2.6 GB of temporary disk.
  --ws   only the websocket attack instead: three 1000 MiB frames on three policy connections,
         then 20 connections of one key; RSS before / peak / after to bench/results/ws-frames.json`);
} else {
  await main();
}
