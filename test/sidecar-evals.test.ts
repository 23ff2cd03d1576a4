/**
 * The sidecar's eval dataset stays cheap and honest at any size (issue 22, item 10):
 * `POST /evals/add_to_dataset` and `GET /evals/get_dataset_count` no longer read the key's whole
 * file on every call (a 300 MiB file used to cost every call 300+ MiB of memory), a file past
 * 512 MiB is counted right (it used to count as 0), a key's file is capped at
 * --max-eval-bytes-per-key (413 naming it), concurrent adds are all counted and the count
 * survives a restart. Real server; large files are sparse (no disk used).
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Store } from '../server/store/store.ts';
import { api, startTestServer, TEST_KEY, type TestServer } from './helpers/server.ts';

const MiB = 1024 * 1024;
const CAP = 512 * MiB;
let server: TestServer;
const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-evals-'));
let keys: { big: string; huge: string; busy: string };

/** A key's eval file written before this server: `lines` short lines, then a sparse zero block to `bytes`, then "\n". */
async function legacyFile(key: string, lines: number, bytes: number): Promise<void> {
  const store = await Store.open({ dataDir });
  const owner = (await store.findApiKey(key))!;
  await store.close();
  const file = path.join(dataDir, 'evals', owner, 'eval_dataset.jsonl');
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file, Array.from({ length: lines }, (_, i) => JSON.stringify({ prompt: `p${i}`, response: 'r', notes: null, timestamp: 1 }) + '\n').join(''));
  fs.truncateSync(file, bytes); // a hole: one more line, of zero bytes
  fs.appendFileSync(file, '\n');
}

const add = (key: string, prompt: string) => api(server, 'POST', '/evals/add_to_dataset', { prompt, response: 'ok' }, key);
const count = async (key: string) => (await api(server, 'GET', '/evals/get_dataset_count', undefined, key)).json.count;

beforeAll(async () => {
  server = await startTestServer({ dataDir, env: { VELA_MAX_EVAL_BYTES_PER_KEY: String(CAP) } });
  const store = await Store.open({ dataDir });
  keys = { big: (await store.createApiKey('big')).key, huge: (await store.createApiKey('huge')).key, busy: (await store.createApiKey('busy')).key };
  await store.close();
  await add(TEST_KEY, 'warm up'); // the server's own first-request allocations, before the RSS baseline
}, 60_000);
afterAll(async () => {
  await server?.close();
  fs.rmSync(dataDir, { recursive: true, force: true });
});

describe('evals/add_to_dataset and get_dataset_count', () => {
  // First: the RSS peak is per process and only grows.
  it('adds to and counts a 300 MiB file without reading it per call (peak RSS grows < 150 MiB over 20 adds and counts)', async () => {
    await legacyFile(keys.big, 3, 300 * MiB);
    const peakBefore = process.resourceUsage().maxRSS * 1024;
    expect(await count(keys.big)).toBe(4);
    for (let i = 1; i <= 20; i++) {
      expect((await add(keys.big, `step ${i}`)).json).toEqual({ status: 'ok', count: 4 + i });
      expect(await count(keys.big)).toBe(4 + i);
    }
    const grownMiB = (process.resourceUsage().maxRSS * 1024 - peakBefore) / MiB;
    console.log(`peak RSS grew ${grownMiB.toFixed(1)} MiB over 41 calls on a 300 MiB eval file`);
    expect(grownMiB).toBeLessThan(150);
  }, 120_000);

  it('counts a 600 MiB file right (not 0) and refuses to grow it past the cap with a 413 naming the setting', async () => {
    await legacyFile(keys.huge, 2, 600 * MiB);
    expect(await count(keys.huge)).toBe(3);
    const size = 600 * MiB + 1;
    const refused = await add(keys.huge, 'one more');
    expect(refused.status).toBe(413);
    expect(refused.json.error).toMatch(new RegExp(`^this key's eval dataset holds ${size} bytes \\(3 entries\\); this entry \\(\\d+ bytes\\) would pass the limit of ${CAP} bytes \\(--max-eval-bytes-per-key\\)$`));
    expect(await count(keys.huge)).toBe(3); // nothing was written
  }, 120_000);

  it('counts 40 concurrent adds exactly, and the count survives a restart and a lost record', async () => {
    const answers = await Promise.all(Array.from({ length: 40 }, (_, i) => add(keys.busy, `concurrent ${i}`)));
    expect(answers.map((a) => a.json.count).sort((a, b) => a - b)).toEqual(Array.from({ length: 40 }, (_, i) => i + 1));
    expect(await count(keys.busy)).toBe(40);
    const store = await Store.open({ dataDir });
    const owner = (await store.findApiKey(keys.busy))!;
    await store.close();
    const file = path.join(dataDir, 'evals', owner, 'eval_dataset.jsonl');
    expect(fs.readFileSync(file, 'utf8').split('\n').filter((l) => l).map((l) => JSON.parse(l).prompt).sort()).toEqual(Array.from({ length: 40 }, (_, i) => `concurrent ${i}`).sort());
    await server.close();
    server = await startTestServer({ dataDir, env: { VELA_MAX_EVAL_BYTES_PER_KEY: String(CAP) } });
    expect(await count(keys.busy)).toBe(40);
    expect((await add(keys.busy, 'after restart')).json.count).toBe(41);
    // A record that no longer matches the file (a crash between append and record): counted again.
    await server.close();
    fs.appendFileSync(file, JSON.stringify({ prompt: 'appended by hand', response: 'r' }) + '\n');
    server = await startTestServer({ dataDir, env: { VELA_MAX_EVAL_BYTES_PER_KEY: String(CAP) } });
    expect(await count(keys.busy)).toBe(42);
  }, 120_000);
});
