/**
 * Hostile request bodies against a real `vela serve` in a child process, whose RSS is read from
 * /proc and whose `/healthz` is timed meanwhile: a body that is answered early (401, 404, 413)
 * is not kept; a .tgz that inflates to 1 GiB is extracted off the event loop, by streaming;
 * job_start's dataset_content goes to disk, not into a string; a Content-Length of 10 digits
 * (which uWS cannot read) is logged, and the same upload sent chunked is read to the limit.
 * Latency bounds are generous (a loaded 2-core box); bench/abuse.ts measures the real p99.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { NodeProc } from '../bench/harness/node-proc.ts';
import { fileChunks, probeHealth, rssBytes, sendBody, watchRss, writeBombTgz, type SentBody } from '../bench/harness/abuse.ts';

const KEY = 'abuse-test-key';
const MiB = 1024 * 1024;
/** Server RSS growth allowed while any one attack runs. */
const RSS_BOUND = 64 * MiB;
/** Slowest /healthz allowed meanwhile (generous: the real p99 is in bench/abuse.ts). */
const HEALTH_BOUND_MS = 2000;
const LIMIT = 1100 * MiB; // --max-dataset-bytes: the 1 GiB bomb fits; an upload past 1e9 bytes does not

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-abuse-test-'));
let server: NodeProc;
let port: number;

beforeAll(async () => {
  server = await NodeProc.start({ VELA_API_KEY: KEY, VELA_DATA_DIR: path.join(tmp, 'data'), VELA_DATASETS_DIR: path.join(tmp, 'datasets'), VELA_MAX_DATASET_BYTES: String(LIMIT) });
  port = Number(new URL(server.baseUrl).port);
  for (let i = 0; i < 20; i++) await fetch(`${server.baseUrl}/healthz`).then((r) => r.text()); // warm
});
afterAll(async () => {
  await server?.stop();
  fs.rmSync(tmp, { recursive: true, force: true });
});

/** Runs `attack` while watching the server: its answers, RSS growth (bytes) and slowest /healthz (ms). */
async function watched(attack: () => Promise<SentBody[]>): Promise<{ answers: SentBody[]; rssGrowth: number; healthMaxMs: number }> {
  const pid = server.child.pid!;
  const before = rssBytes(pid);
  const rss = watchRss(pid);
  const probe = probeHealth(server.baseUrl);
  const answers = await attack();
  const times = await probe.stop();
  return { answers, rssGrowth: rss.stop() - before, healthMaxMs: Math.max(...times) };
}

const auth = `Authorization: Bearer ${KEY}\r\n`;
const errorOf = (a: SentBody) => (a.body ? JSON.parse(a.body).error : null);

/** The entries of the datasets root and of every key's uploads folder, except the uploads folder itself. */
function entries(root: string): string[] {
  const uploads = path.join(root, '.uploads');
  const keys = fs.existsSync(uploads) ? fs.readdirSync(uploads).map((k) => path.join(uploads, k)) : [];
  return [root, ...keys].flatMap((dir) => fs.readdirSync(dir).filter((f) => f !== '.uploads'));
}

/** Temporaries (hidden entries) left in the datasets root or in a key's uploads folder. */
function leftovers(root: string): string[] {
  return entries(root).filter((f) => f.startsWith('.'));
}

describe('bodies answered before their end are not kept', () => {
  it.each([
    ['POST /v1/fine-tunes, no key, 256 MiB chunked', 'POST /v1/fine-tunes HTTP/1.1\r\nHost: x\r\n', 256 * MiB, true, 401, /^missing API key/],
    ['POST /v1/fine-tunes, no key, Content-Length 900 MB', 'POST /v1/fine-tunes HTTP/1.1\r\nHost: x\r\nContent-Length: 900000000\r\n', 900_000_000, false, 401, /^missing API key/],
    ['PUT /healthz (405), 256 MiB chunked', 'PUT /healthz HTTP/1.1\r\nHost: x\r\n', 256 * MiB, true, 405, /^PUT is not allowed on \/healthz; it answers GET, HEAD$/],
    ['POST to an unknown path, 256 MiB chunked', 'POST /v1/nothing-here HTTP/1.1\r\nHost: x\r\n', 256 * MiB, true, 404, /^no route POST \/v1\/nothing-here/],
    ['POST /v1/fine-tunes with the key, 256 MiB chunked (the limit is 1 MiB)', `POST /v1/fine-tunes HTTP/1.1\r\nHost: x\r\n${auth}`, 256 * MiB, true, 413, /^body is over 1048576 bytes \(\d+ so far\); the limit is 1048576$/],
  ])('%s: answered, RSS flat, /healthz fast', async (_what, head, bytes, chunked, status, error) => {
    // The client sends it all whatever the answer, as an attacker does: the server reads and drops it.
    // The body waits at 16 MiB for up to 10 s: a server that answers from the head has answered by then, one that reads the body first has not.
    const { answers: [a], rssGrowth, healthMaxMs } = await watched(async () => [await sendBody(port, head, bytes, { chunked, keepSending: true, pauseAfterBytes: 16 * MiB })]);
    expect(a!.status).toBe(status);
    expect(errorOf(a!)).toMatch(error);
    expect(a!.answeredAfterBytes).toBeLessThanOrEqual(16 * MiB); // answered from the head, not after the body
    expect([a!.sentBytes, a!.closed]).toEqual([bytes, false]);
    expect(rssGrowth).toBeLessThan(RSS_BOUND);
    expect(healthMaxMs).toBeLessThan(HEALTH_BOUND_MS);
    const after = await fetch(`${server.baseUrl}/healthz`);
    expect([after.status, await after.text()]).toEqual([200, 'OK']);
  });
});

describe('uploads', () => {
  it('extracts a .tgz that inflates to 1 GiB off the event loop while a 900 MB unauthenticated body arrives: both answered, RSS flat, /healthz fast', async () => {
    const bomb = path.join(tmp, 'bomb.tgz');
    const bombBytes = writeBombTgz(bomb, 1024 * MiB);
    expect(bombBytes).toBeLessThan(16 * MiB);
    const { answers: [up, unauth], rssGrowth, healthMaxMs } = await watched(() => Promise.all([
      sendBody(port, `PUT /v1/datasets/bomb HTTP/1.1\r\nHost: x\r\n${auth}Content-Length: ${bombBytes}`, bombBytes, { source: fileChunks(bomb), waitMs: 240_000 }),
      sendBody(port, 'POST /v1/fine-tunes HTTP/1.1\r\nHost: x\r\nContent-Length: 900000000', 900_000_000, { keepSending: true }),
    ]));
    // Extracted in full (1 GiB is under the limit), then refused: it holds no dataset.
    expect([up!.status, errorOf(up!)]).toEqual([400, 'the archive holds no LeRobot dataset: expected meta/info.json at its top, or in its one top folder']);
    expect(unauth!.status).toBe(401);
    expect(rssGrowth).toBeLessThan(RSS_BOUND);
    expect(healthMaxMs).toBeLessThan(HEALTH_BOUND_MS);
    expect(entries(path.join(tmp, 'datasets')).filter((f) => f.includes('bomb'))).toEqual([]); // nothing left behind
  });

  it('stops reading a .tgz at its tar\'s end, whose gzip goes on for 2 GiB past it (node-tar would gather it in one buffer): judged at once, RSS flat, /healthz fast', async () => {
    const bomb = path.join(tmp, 'after-end.tgz');
    const bombBytes = writeBombTgz(bomb, 2048 * MiB, { afterEnd: true });
    const { answers: [up], rssGrowth, healthMaxMs } = await watched(async () => [
      await sendBody(port, `PUT /v1/datasets/after-end HTTP/1.1\r\nHost: x\r\n${auth}Content-Length: ${bombBytes}`, bombBytes, { source: fileChunks(bomb), waitMs: 240_000 }),
    ]);
    expect([up!.status, errorOf(up!)]).toEqual([400, 'the archive holds no LeRobot dataset: expected meta/info.json at its top, or in its one top folder']);
    expect(rssGrowth).toBeLessThan(RSS_BOUND);
    expect(healthMaxMs).toBeLessThan(HEALTH_BOUND_MS);
  });

  it('job_start streams 300 MB of dataset_content to disk: the decoded bytes are judged (not an archive), RSS flat', async () => {
    const chars = 300_000_000;
    const head = Buffer.from('{"dataset": "big", "dataset_content": "');
    const tail = Buffer.from('"}');
    const a = Buffer.alloc(MiB, 'A');
    async function* body() {
      yield head;
      for (let left = chars; left > 0; left -= a.length) yield left >= a.length ? a : a.subarray(0, left);
      yield tail;
    }
    const total = head.length + chars + tail.length;
    const { answers: [res], rssGrowth, healthMaxMs } = await watched(async () => [
      await sendBody(port, `POST /training/job_start HTTP/1.1\r\nHost: x\r\n${auth}Content-Type: application/json\r\nContent-Length: ${total}`, total, { source: body(), waitMs: 240_000 }),
    ]);
    expect(res!.status).toBe(400);
    expect(errorOf(res!)).toBe('the archive is neither a tar (optionally gzipped) nor a zip file (262 bytes; it starts with 0000000000000000)');
    expect(res!.sentBytes).toBe(total);
    expect(rssGrowth).toBeLessThan(RSS_BOUND);
    expect(healthMaxMs).toBeLessThan(HEALTH_BOUND_MS);
    expect(leftovers(path.join(tmp, 'datasets'))).toEqual([]); // both temporary files removed
  });

  it('a Content-Length of 10 digits is logged as unreadable by uWS; the same upload chunked is read past 1e9 bytes to the limit, then 413', async () => {
    const declared = await sendBody(port, `PUT /v1/datasets/big HTTP/1.1\r\nHost: x\r\n${auth}Content-Length: 1000000000`, 4 * MiB, { waitMs: 3000 });
    expect([declared.status, declared.closed]).toEqual([0, true]); // uWS's limitation: no answer can go out
    const warning = 'PUT /v1/datasets/big: Content-Length 1000000000 has 10 or more digits, which uWebSockets.js cannot read; the connection is closed without an answer. Send bodies of 1,000,000,000 bytes or more with Transfer-Encoding: chunked';
    await vi.waitFor(() => expect(server.stderr).toContain(warning), { timeout: 30_000, interval: 50 });
    // Anyone can send these: the warning comes once a minute, not once a request.
    for (let i = 0; i < 20; i++) await sendBody(port, `POST /${'A'.repeat(7000)} HTTP/1.1\r\nHost: x\r\nContent-Length: 9999999999`, 0, { waitMs: 3000 });
    await new Promise((r) => setTimeout(r, 500));
    expect(server.stderr.split('has 10 or more digits').length - 1).toBe(1);

    const { answers: [over], rssGrowth } = await watched(async () => [await sendBody(port, `PUT /v1/datasets/big HTTP/1.1\r\nHost: x\r\n${auth}`, LIMIT + 8 * MiB, { chunked: true, waitMs: 60_000 })]);
    expect([over!.status, errorOf(over!)]).toEqual([413, expect.stringMatching(new RegExp(`^body is over ${LIMIT} bytes \\(\\d+ so far\\); the limit is ${LIMIT}$`))]);
    expect(over!.sentBytes).toBeGreaterThan(1_000_000_000);
    expect(rssGrowth).toBeLessThan(RSS_BOUND);
    expect(entries(path.join(tmp, 'datasets')).filter((f) => f.includes('big'))).toEqual([]);
  });
});
