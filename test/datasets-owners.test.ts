/**
 * Uploaded datasets belong to their key (issue 22, items 7-8), through the real server with a
 * stub engine (nothing trains): another key's upload is not found wherever a key names a
 * dataset (fine-tunes' dataset_name and eval_dataset, the sidecar's job_start, DELETE), in the
 * same words as a name nothing has; two keys may upload one name; the operator's folders stay
 * shared; GET /v1/datasets lists, DELETE removes (not while a job uses it), the per-key quota
 * refuses with 413; a restart removes what an upload cut by a crash left, and moves uploads of an
 * older Vela (at the root) into their key's folder.
 */
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import * as tar from 'tar';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { Store, nowS } from '../server/store/store.ts';
import { ownerUploadsDir } from '../server/datasets/owned.ts';
import { api, startTestServer, TEST_KEY, type TestServer } from './helpers/server.ts';
import { NodeProc } from '../bench/harness/node-proc.ts';
import { log } from '../server/log.ts';
import { STUB_INFO } from '../bench/harness/policy-stub.ts';
import type { EngineLike } from '../server/engine/host.ts';

const FIXTURE = fileURLToPath(new URL('./fixtures/lerobot_image', import.meta.url));
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-owners-test-'));
const stub = async (): Promise<EngineLike> => ({ info: STUB_INFO, call: async () => ({ result: {}, pending_gradients: 0 }) as any, stats: () => ({ queued: 0, sessions: 0, calls: 0 }), close: async () => {} });
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

/** A tar.gz of the fixture folder; `extra` adds a file (another archive of the same dataset). */
async function fixtureTarGz(extra?: string): Promise<Buffer> {
  const dir = path.join(tmp, `src-${Math.random()}`);
  fs.cpSync(FIXTURE, path.join(dir, 'ds'), { recursive: true });
  if (extra) fs.writeFileSync(path.join(dir, 'ds', 'NOTE.txt'), extra);
  const file = path.join(dir, 'a.tgz');
  await tar.c({ gzip: true, file, cwd: dir }, ['ds']);
  return fs.readFileSync(file);
}

const put = (server: TestServer, name: string, body: Buffer, key = TEST_KEY) =>
  fetch(`${server.baseUrl}/v1/datasets/${name}`, { method: 'PUT', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/octet-stream' }, body }).then(async (r) => ({ status: r.status, json: await r.json() as any }));

/** A second API key of the server's store: its plain key and owner id. */
async function secondKey(server: TestServer): Promise<{ key: string; owner: string }> {
  const { key, row } = await server.store.createApiKey('second');
  return { key, owner: row.id };
}

const fineTune = (over: Record<string, unknown>) => ({ model: 'flow0-tiny', steps: 2, batch_size: 2, ...over });

describe('datasets belong to the key that uploaded them', () => {
  let server: TestServer;
  let datasets: string;
  let other: { key: string; owner: string };
  let a: any;
  let archiveA: Buffer;
  beforeAll(async () => {
    datasets = path.join(tmp, 'owners');
    fs.cpSync(FIXTURE, path.join(datasets, 'shared_set'), { recursive: true }); // the operator's, by hand
    fs.cpSync(FIXTURE, path.join(datasets, 'lerobot', 'nested_set'), { recursive: true }); // LeRobot's org/name layout
    server = await startTestServer({ env: { VELA_DATASETS_DIR: datasets }, engineFactory: stub });
    other = await secondKey(server);
    archiveA = await fixtureTarGz();
    a = await put(server, 'pick', archiveA);
    expect(a.status).toBe(200);
  });
  afterAll(() => server?.close());

  it('another key naming an upload gets the answer of a name that nothing has: fine-tunes, eval_dataset, job_start', async () => {
    const asOther = (body: unknown) => api(server, 'POST', '/v1/fine-tunes', body, other.key);
    const missing = await asOther(fineTune({ dataset_name: 'nothing_here' }));
    const theirs = await asOther(fineTune({ dataset_name: 'pick' }));
    expect(missing.status).toBe(400);
    expect([theirs.status, theirs.json.error]).toEqual([400, missing.json.error.replace('nothing_here', 'pick')]);
    expect(theirs.json.error).toMatch(/^dataset_name "pick" not found: no such dataset folder under this server's datasets root, nor among this key's uploads/);

    const evalMissing = await asOther(fineTune({ dataset_name: 'shared_set', eval_dataset: 'nothing_here' }));
    const evalTheirs = await asOther(fineTune({ dataset_name: 'shared_set', eval_dataset: 'pick' }));
    expect([evalTheirs.status, evalTheirs.json.error]).toEqual([400, evalMissing.json.error.replace('nothing_here', 'pick')]);
    expect(evalTheirs.json.error).toMatch(/^eval_dataset "pick" not found/);

    const start = (dataset: string) => api(server, 'POST', '/training/job_start', { dataset, model_size: 'flow0-tiny', num_train_steps: 2 }, other.key);
    expect(await start('pick')).toEqual({ status: 400, json: { error: 'dataset "pick" is not under the datasets root and no dataset_content was sent' } });
    expect(await start('nothing_here')).toEqual({ status: 400, json: { error: 'dataset "nothing_here" is not under the datasets root and no dataset_content was sent' } });
    // No path leads into the uploads: a hidden segment, or an upload's folder by its path.
    const byPath = `.uploads/${path.basename(ownerUploadsDir(datasets, (await server.store.findApiKey(TEST_KEY))!))}/pick`;
    const hidden = await asOther(fineTune({ dataset_name: byPath }));
    expect([hidden.status, hidden.json.error]).toEqual([400, missing.json.error.replace('nothing_here', byPath)]);
    expect((await server.store.listJobs(other.owner)).length).toBe(0); // nothing was queued for the other key
  });

  it('the uploader and every key use shared datasets; the uploader uses its own', async () => {
    expect((await api(server, 'POST', '/v1/fine-tunes', fineTune({ dataset_name: 'pick' }))).status).toBe(200);
    expect((await api(server, 'POST', '/v1/fine-tunes', fineTune({ dataset_name: 'shared_set', eval_dataset: 'lerobot/nested_set' }), other.key)).status).toBe(200);
  });

  it('two keys upload the same name, each its own; a shared name is not taken', async () => {
    const b = await put(server, 'pick', await fixtureTarGz('the second key\'s'), other.key);
    expect(b).toMatchObject({ status: 200, json: { name: 'pick', reused: false, episodes: 2, frames: 7 } });
    expect(b.json.sha256).not.toBe(a.json.sha256);
    const ownerA = (await server.store.findApiKey(TEST_KEY))!;
    expect(fs.existsSync(path.join(ownerUploadsDir(datasets, ownerA), 'pick', 'NOTE.txt'))).toBe(false); // the first key's stays as it was
    expect(fs.readFileSync(path.join(ownerUploadsDir(datasets, other.owner), 'pick', 'NOTE.txt'), 'utf8')).toBe('the second key\'s');
    expect((await api(server, 'POST', '/training/job_start', { dataset: 'pick', model_size: 'flow0-tiny', num_train_steps: 2 }, other.key)).status).toBe(200);
    const shared = await put(server, 'shared_set', await fixtureTarGz(), other.key);
    expect(shared).toEqual({ status: 409, json: { error: 'dataset "shared_set" is a shared dataset of this server (the operator\'s datasets folder); it is never replaced: pick another name' } });
  });

  it('GET /v1/datasets lists the key\'s uploads, then the shared datasets', async () => {
    const list = await api(server, 'GET', '/v1/datasets');
    expect(list.status).toBe(200);
    const counts = { episodes: 2, frames: 7 };
    expect(list.json.data).toEqual([
      { name: 'pick', bytes: a.json.extracted_bytes, ...counts, uploaded_at: expect.any(Number), shared: false },
      { name: 'lerobot/nested_set', bytes: expect.any(Number), ...counts, uploaded_at: null, shared: true },
      { name: 'shared_set', bytes: expect.any(Number), ...counts, uploaded_at: null, shared: true },
    ]);
    expect(list.json.data[0].uploaded_at).toBeGreaterThan(nowS() - 600);
    expect(list.json.data[2].bytes).toBe(fs.readdirSync(FIXTURE, { recursive: true }).map((f) => fs.statSync(path.join(FIXTURE, f as string))).filter((s) => s.isFile()).reduce((n, s) => n + s.size, 0));
    expect(list.json).toMatchObject({ used_bytes: a.json.extracted_bytes, limit_bytes: 20 * 1024 ** 3 });
    const theirs = await api(server, 'GET', '/v1/datasets', undefined, other.key);
    expect(theirs.json.data.map((d: any) => [d.name, d.shared])).toEqual([['pick', false], ['lerobot/nested_set', true], ['shared_set', true]]);
    expect(theirs.json.data[0].bytes).toBeGreaterThan(a.json.extracted_bytes); // its own pick, with NOTE.txt
  });

  it('DELETE removes the key\'s own upload: 404 for a shared one or none, 409 while a queued or running job uses it (and a new archive for it too)', async () => {
    const third = await secondKey(server);
    expect(await api(server, 'DELETE', '/v1/datasets/pick', undefined, third.key)).toEqual({ status: 404, json: { error: 'no dataset "pick" among this key\'s uploads' } });
    expect(await api(server, 'DELETE', '/v1/datasets/shared_set')).toEqual({ status: 404, json: { error: 'no dataset "shared_set" among this key\'s uploads ("shared_set" is a shared dataset: only the operator removes it)' } });
    expect(fs.existsSync(path.join(datasets, 'shared_set', 'meta', 'info.json'))).toBe(true);

    const owner = (await server.store.findApiKey(TEST_KEY))!;
    for (const j of await server.store.listJobs(owner)) await server.store.updateJob(j.id, { status: 'failed' }); // the stub engine's jobs
    const id = 'ft-usespick1';
    await server.store.insertJob({ id, owner, status: 'queued', created_at: nowS(), config: { model: 'flow0-tiny', dataset_name: 'shared_set', eval_dataset: 'pick', steps: 10 }, step: 0, loss: null, eval_loss: null, error: null, output_dir: '/nowhere', started_at: null, finished_at: null, cancel_requested: false });
    expect(await api(server, 'DELETE', '/v1/datasets/pick')).toEqual({ status: 409, json: { error: `dataset "pick" is used by fine-tune ${id} (queued); cancel it or wait for it to end, then delete` } });
    // Nor is it replaced under the job: another archive is refused the same way, the same one is reused.
    expect(await put(server, 'pick', await fixtureTarGz('a second version'))).toEqual({ status: 409, json: { error: `dataset "pick" is used by fine-tune ${id} (queued); cancel it or wait for it to end, then upload the new version (or upload it under another name)` } });
    expect((await put(server, 'pick', archiveA)).json).toMatchObject({ reused: true });
    expect(fs.existsSync(path.join(ownerUploadsDir(datasets, owner), 'pick', 'NOTE.txt'))).toBe(false);
    await server.store.updateJob(id, { status: 'running' });
    expect((await api(server, 'DELETE', '/v1/datasets/pick')).json.error).toContain(`${id} (running)`);
    await server.store.updateJob(id, { status: 'cancelled' });

    expect(await api(server, 'DELETE', '/v1/datasets/pick')).toEqual({ status: 200, json: { name: 'pick', deleted: true, bytes: a.json.extracted_bytes } });
    expect(fs.readdirSync(ownerUploadsDir(datasets, owner))).toEqual([]); // nothing left, not even a temporary
    expect((await api(server, 'GET', '/v1/datasets')).json.data.map((d: any) => d.name)).toEqual(['lerobot/nested_set', 'shared_set']);
    expect((await api(server, 'DELETE', '/v1/datasets/pick')).status).toBe(404);
    // The other key's upload of the same name is untouched.
    expect((await api(server, 'GET', '/v1/datasets', undefined, other.key)).json.data[0].name).toBe('pick');
  });
});

describe('uploads of one key at once', () => {
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer({ env: { VELA_DATASETS_DIR: path.join(tmp, 'slots') }, engineFactory: stub });
  });
  afterAll(() => server?.close());

  /** A chunked PUT whose body has begun and not ended; `finish` sends the rest and reads the answer. */
  async function openUpload(name: string, archive: Buffer): Promise<{ finish: () => Promise<number> }> {
    const req = http.request(`${server.baseUrl}/v1/datasets/${name}`, { method: 'PUT', headers: { authorization: `Bearer ${TEST_KEY}`, 'transfer-encoding': 'chunked' } });
    const answered = new Promise<number>((resolve, reject) => {
      req.on('response', (res) => (res.resume(), res.on('end', () => resolve(res.statusCode!))));
      req.on('error', reject);
    });
    req.write(archive.subarray(0, 1000));
    await new Promise((r) => req.once('socket', (s) => (s.connecting ? s.once('connect', r) : r(null))));
    return { finish: () => (req.end(archive.subarray(1000)), answered) };
  }

  it('takes two at a time from a key (each holds up to --max-dataset-bytes of disk): a third is a 429 until one ends', async () => {
    const archive = await fixtureTarGz();
    const a = await openUpload('a', archive);
    const b = await openUpload('b', archive);
    // Both bodies have begun: the server holds their slots once their handlers ran.
    await vi.waitFor(async () => expect((await put(server, 'c', archive)).status).toBe(429), { timeout: 30_000, interval: 100 });
    expect(await put(server, 'c', archive)).toEqual({ status: 429, json: { error: 'this key has 2 uploads in progress, the most at once; wait for one to end, then send this one again' } });
    const other = await secondKey(server);
    expect((await put(server, 'c', archive, other.key)).status).toBe(200); // other keys have their own slots
    expect(await a.finish()).toBe(200);
    expect((await put(server, 'c', archive)).status).toBe(200);
    expect(await b.finish()).toBe(200);
  });
});

describe('the per-key byte quota of uploads', () => {
  let server: TestServer;
  let fixtureBytes: number;
  beforeAll(async () => {
    // What an upload of it counts: its files' bytes and 4096 for each folder (its top, `ds`, too).
    const stats = fs.readdirSync(FIXTURE, { recursive: true }).map((f) => fs.statSync(path.join(FIXTURE, f as string)));
    fixtureBytes = stats.filter((s) => s.isFile()).reduce((n, s) => n + s.size, 0) + 4096 * (1 + stats.filter((s) => s.isDirectory()).length);
    server = await startTestServer({ env: { VELA_DATASETS_DIR: path.join(tmp, 'quota'), VELA_DATASETS_PER_KEY_BYTES: String(Math.floor(fixtureBytes * 1.5)) }, engineFactory: stub });
  });
  afterAll(() => server?.close());

  it('refuses an upload past it with 413 naming used, limit and bytes; a replacement counts the old one as freed; other keys have their own', async () => {
    const limit = Math.floor(fixtureBytes * 1.5);
    const one = await put(server, 'one', await fixtureTarGz());
    expect(one).toMatchObject({ status: 200, json: { extracted_bytes: fixtureBytes } });
    const two = await put(server, 'two', await fixtureTarGz());
    // Refused while it extracts, as soon as it passes what the quota has left (not after filling the disk).
    expect(two).toEqual({ status: 413, json: { error: `dataset "two" extracts to more than the ${limit - fixtureBytes} bytes left of this key's quota: its uploads use ${fixtureBytes} of its ${limit} bytes (--datasets-per-key-bytes); delete one (DELETE /v1/datasets/{name}) first` } });
    const datasets = path.join(tmp, 'quota');
    const owner = (await server.store.findApiKey(TEST_KEY))!;
    expect(fs.readdirSync(ownerUploadsDir(datasets, owner))).toEqual(['one']); // nothing of "two" stays
    // The same name again replaces: its old bytes are freed.
    expect((await put(server, 'one', await fixtureTarGz('v2'))).status).toBe(200);
    expect((await api(server, 'GET', '/v1/datasets')).json).toMatchObject({ used_bytes: fixtureBytes + 2, limit_bytes: limit });
    const other = await secondKey(server);
    expect((await put(server, 'two', await fixtureTarGz(), other.key)).status).toBe(200);
    expect((await api(server, 'DELETE', '/v1/datasets/one')).status).toBe(200);
    expect((await put(server, 'two', await fixtureTarGz())).status).toBe(200);
  });

  it('a key with no byte left is refused before its body is read, by PUT and by job_start\'s dataset_content', async () => {
    const limit = Math.floor(fixtureBytes * 1.5);
    const { key, row } = await server.store.createApiKey('full');
    // An upload that fills the key's quota, as its marker records it.
    const own = ownerUploadsDir(path.join(tmp, 'quota'), row.id);
    fs.mkdirSync(path.join(own, 'filler'), { recursive: true });
    fs.writeFileSync(path.join(own, 'filler', '.vela-upload.json'), JSON.stringify({ sha256: 'ab', owner: row.id, bytes: 1, extracted_bytes: limit, uploaded_at: 1 }));
    const refusal = { status: 413, json: { error: `dataset "b" cannot be stored; this key's uploads use ${limit} of its ${limit} bytes (--datasets-per-key-bytes): delete one (DELETE /v1/datasets/{name}) first` } };
    expect(await put(server, 'b', await fixtureTarGz(), key)).toEqual(refusal);
    const b64 = (await fixtureTarGz()).toString('base64');
    expect(await api(server, 'POST', '/training/job_start', { dataset: 'b', model_size: 'flow0-tiny', num_train_steps: 2, dataset_content: b64 }, key)).toEqual(refusal);
    expect(fs.readdirSync(own)).toEqual(['filler']); // no archive was written
  });
});

describe('a restart after a crash mid-upload', () => {
  it('removes the temporaries the upload left (logged once with count and bytes), keeps the operator\'s hidden folders, and moves an older Vela\'s root uploads into their key\'s folder', async () => {
    const datasets = path.join(tmp, 'crash');
    const dataDir = path.join(tmp, 'crash-data');
    fs.mkdirSync(path.join(datasets, '.cache', 'huggingface'), { recursive: true }); // a tool's, not ours
    fs.writeFileSync(path.join(datasets, '.cache', 'huggingface', 'x'), 'keep me');
    const node = await NodeProc.start({ VELA_DATASETS_DIR: datasets, VELA_DATA_DIR: dataDir, VELA_API_KEY: TEST_KEY });
    let partial: string | null = null;
    let req: http.ClientRequest | null = null;
    try {
      // An upload of 400000 bytes of which 150000 arrive, then the server is killed.
      const url = new URL(`${node.baseUrl}/v1/datasets/pick`);
      req = http.request({ host: url.hostname, port: url.port, path: url.pathname, method: 'PUT', headers: { authorization: `Bearer ${TEST_KEY}`, 'content-length': '400000' } });
      req.on('error', () => {});
      req.write(Buffer.alloc(150_000, 7));
      const find = (dir: string): string | null => {
        for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
          const p = path.join(dir, e.name);
          if (e.name.includes('.archive-') && e.isFile() && fs.statSync(p).size === 150_000) return p;
          if (e.isDirectory() && e.name !== '.cache') {
            const f = find(p);
            if (f) return f;
          }
        }
        return null;
      };
      for (let i = 0; i < 600 && !partial; i++) {
        partial = find(datasets);
        if (!partial) await new Promise((r) => setTimeout(r, 50));
      }
      expect(partial, 'the partial archive on disk').not.toBeNull();
    } finally {
      // Killed before the client goes: a server that saw the client leave would remove the
      // partial archive itself, and there would be nothing left for the restart to sweep.
      await node.kill9();
      req?.destroy();
    }
    expect(fs.existsSync(partial!)).toBe(true);

    const store = await Store.open({ dataDir });
    const owner = (await store.findApiKey(TEST_KEY))!;
    await store.close();
    // An extraction folder cut short, beside the partial archive, and one an older Vela left at the root.
    const ownDir = ownerUploadsDir(datasets, owner);
    fs.mkdirSync(path.join(ownDir, '.pick.upload-0badc0de', 'ds', 'meta'), { recursive: true });
    fs.writeFileSync(path.join(ownDir, '.pick.upload-0badc0de', 'ds', 'meta', 'info.json'), 'x'.repeat(1000));
    fs.mkdirSync(path.join(datasets, '.old.upload-12345678'));
    fs.writeFileSync(path.join(datasets, '.old.upload-12345678', 'part'), 'y'.repeat(500));
    // An upload that an older Vela installed at the root, with its marker.
    fs.cpSync(FIXTURE, path.join(datasets, 'legacy'), { recursive: true });
    fs.writeFileSync(path.join(datasets, 'legacy', '.vela-upload.json'), JSON.stringify({ sha256: 'ab', owner, bytes: 10, uploaded_at: 1 }));

    const lines: string[] = [];
    const write = process.stderr.write.bind(process.stderr);
    process.stderr.write = ((chunk: any, ...rest: any[]) => (lines.push(String(chunk)), write(chunk, ...rest))) as typeof process.stderr.write;
    const before = process.env.VELA_TEST_LOG;
    process.env.VELA_TEST_LOG = 'info';
    let server: TestServer | null = null;
    try {
      server = await startTestServer({ dataDir, env: { VELA_DATASETS_DIR: datasets }, engineFactory: stub });
    } finally {
      process.stderr.write = write;
      if (before === undefined) delete process.env.VELA_TEST_LOG;
      else process.env.VELA_TEST_LOG = before;
      log.setLevel(before ?? 'error');
    }
    try {
      expect(fs.existsSync(partial!)).toBe(false);
      expect(fs.readdirSync(ownDir).sort()).toEqual(['legacy']);
      expect(fs.readdirSync(datasets).sort()).toEqual(['.cache', '.uploads']);
      expect(fs.readFileSync(path.join(datasets, '.cache', 'huggingface', 'x'), 'utf8')).toBe('keep me');
      const swept = lines.filter((l) => l.includes('stale upload temporar'));
      expect(swept).toHaveLength(1);
      expect(swept[0]).toContain(`removed 3 stale upload temporaries (${150_000 + 1000 + 500} bytes) left by an interrupted upload`);
      // The moved upload is its key's: listed as its own, counted in its quota, unseen by another key.
      const fixtureBytes = fs.readdirSync(FIXTURE, { recursive: true }).map((f) => fs.statSync(path.join(FIXTURE, f as string))).filter((s) => s.isFile()).reduce((n, s) => n + s.size, 0);
      const list = await api(server, 'GET', '/v1/datasets');
      expect(list.json).toMatchObject({ data: [{ name: 'legacy', bytes: fixtureBytes, shared: false }], used_bytes: fixtureBytes });
      const other = await secondKey(server);
      expect((await api(server, 'GET', '/v1/datasets', undefined, other.key)).json.data).toEqual([]);
      expect((await api(server, 'POST', '/v1/fine-tunes', fineTune({ dataset_name: 'legacy' }), other.key)).status).toBe(400);
      expect((await api(server, 'POST', '/v1/fine-tunes', fineTune({ dataset_name: 'legacy' }))).status).toBe(200);
    } finally {
      await server?.close();
    }
  }, 180_000);
});
