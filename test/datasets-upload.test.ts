/**
 * Datasets sent to the server (`PUT /v1/datasets/{name}`, the sidecar's dataset_content) and the
 * sidecar stream's edges, on a server with a stub engine (nothing here trains): tar.gz and zip of
 * the repository's LeRobot fixture, validation, no path escapes or links, the size cap, names that
 * are never replaced (the operator's; another key's upload is its own: datasets-owners.test.ts); job_events' watchdog failing a job no runner holds, and its time cap.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import * as tar from 'tar';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { nowS } from '../server/store/store.ts';
import { ownerUploadsDir } from '../server/datasets/owned.ts';
import { startTestServer, TEST_KEY, type TestServer } from './helpers/server.ts';
import { STUB_INFO } from '../bench/harness/policy-stub.ts';
import type { EngineLike } from '../server/engine/host.ts';

const FIXTURE = fileURLToPath(new URL('./fixtures/lerobot_image', import.meta.url));
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-upload-test-'));
const stub = async (): Promise<EngineLike> => ({ info: STUB_INFO, call: async () => ({ result: {}, pending_gradients: 0 }) as any, stats: () => ({ queued: 0, sessions: 0, calls: 0 }), close: async () => {} });

let server: TestServer;
let datasets: string;
beforeAll(async () => {
  datasets = path.join(tmp, 'datasets');
  fs.mkdirSync(path.join(datasets, 'operators', 'meta'), { recursive: true }); // a dataset the operator put there
  server = await startTestServer({ env: { VELA_DATASETS_DIR: datasets, VELA_MAX_DATASET_BYTES: '200000' }, engineFactory: stub, start: { sidecarWatchdogS: 0.3, sseKeepaliveS: 0.2 } });
});
afterAll(() => server?.close());

/** The test key's uploads folder. */
const ownDir = async () => ownerUploadsDir(datasets, (await server.store.findApiKey(TEST_KEY))!);

const put = (name: string, body: Buffer | Uint8Array, key = TEST_KEY) =>
  fetch(`${server.baseUrl}/v1/datasets/${name}`, { method: 'PUT', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/octet-stream' }, body }).then(async (r) => ({ status: r.status, json: await r.json() as any }));

/** A tar.gz of the fixture folder (the folder itself at the top), as a client makes it. */
async function fixtureTarGz(): Promise<Buffer> {
  const file = path.join(tmp, `fixture-${Math.random()}.tgz`);
  await tar.c({ gzip: true, file, cwd: path.dirname(FIXTURE) }, [path.basename(FIXTURE)]);
  return fs.readFileSync(file);
}

/** A zip made by Python's zipfile: `entries` (name -> text), or the fixture's files at the top; `link` adds a symlink entry. */
function zipOf(opts: { fixture?: boolean; entries?: Record<string, string>; link?: string }): Buffer {
  const file = path.join(tmp, `z-${Math.random()}.zip`);
  const script = `
import json, os, stat, sys, zipfile
out, fixture, link = sys.argv[1], sys.argv[2], sys.argv[3]
entries = json.load(sys.stdin)
with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
    if fixture:
        for root, _, files in os.walk(fixture):
            for f in files:
                p = os.path.join(root, f)
                z.write(p, os.path.relpath(p, fixture))
    for name, text in entries.items():
        z.writestr(name, text)
    if link:
        info = zipfile.ZipInfo(link)
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        z.writestr(info, "/etc/passwd")
`;
  execFileSync('python3', ['-c', script, file, opts.fixture ? FIXTURE : '', opts.link ?? ''], { input: JSON.stringify(opts.entries ?? {}) });
  return fs.readFileSync(file);
}

describe('PUT /v1/datasets/{name}', () => {
  it('installs a tar.gz of a LeRobot folder, validated; the same archive again is reused', async () => {
    const archive = await fixtureTarGz();
    const a = await put('pick', archive);
    expect(a).toMatchObject({ status: 200, json: { name: 'pick', dataset_name: 'pick', episodes: 2, frames: 7, bytes: archive.length, reused: false } });
    const own = await ownDir();
    expect(fs.existsSync(path.join(own, 'pick', 'meta', 'info.json'))).toBe(true);
    expect((await put('pick', archive)).json).toMatchObject({ reused: true, sha256: a.json.sha256 });
    expect(fs.readdirSync(own)).toEqual(['pick']); // no temporary left
  });

  it('installs a zip whose files sit at its top, and replaces an earlier upload of the same key', async () => {
    const zip = zipOf({ fixture: true, entries: { 'README.txt': 'a second version' } });
    const r = await put('pick', zip);
    expect(r).toMatchObject({ status: 200, json: { episodes: 2, reused: false } });
    expect(fs.readFileSync(path.join(await ownDir(), 'pick', 'README.txt'), 'utf8')).toBe('a second version');
  });

  it('refuses path escapes, links, non-datasets, bad names, too-large archives, the operator\'s datasets', async () => {
    const escape = zipOf({ entries: { '../escaped.txt': 'x' } });
    expect((await put('z1', escape)).status).toBe(400);
    expect(fs.existsSync(path.join(tmp, 'escaped.txt'))).toBe(false);
    const link = await put('z2', zipOf({ fixture: true, link: 'meta/evil' }));
    expect([link.status, link.json.error]).toEqual([400, 'the archive holds meta/evil, which is not a file or a folder']);
    const tarLinkFile = path.join(tmp, 'link.tar');
    fs.mkdirSync(path.join(tmp, 'withlink', 'meta'), { recursive: true });
    fs.symlinkSync('/etc/passwd', path.join(tmp, 'withlink', 'meta', 'info.json'));
    await tar.c({ file: tarLinkFile, cwd: path.join(tmp, 'withlink') }, ['meta']);
    const tlink = await put('t1', fs.readFileSync(tarLinkFile));
    expect([tlink.status, tlink.json.error]).toEqual([400, 'the archive holds meta/info.json, a SymbolicLink; only files and folders are taken']);
    const notDataset = await put('z3', zipOf({ entries: { 'hello.txt': 'hi' } }));
    expect([notDataset.status, notDataset.json.error]).toEqual([400, 'the archive holds no LeRobot dataset: expected meta/info.json at its top, or in its one top folder']);
    const corrupt = await put('z4', zipOf({ entries: { 'meta/info.json': '{not json' } }));
    expect(corrupt.status).toBe(400);
    expect(corrupt.json.error).toMatch(/^dataset "z4": .*info\.json/);
    expect((await put('..', Buffer.from('x'))).status).toBe(404); // never reaches the route as a name
    expect((await put('a%2Fb', Buffer.from('x'))).json.error).toMatch(/^name must be a plain name/);
    const big = await put('big', Buffer.alloc(300_000, 1));
    expect([big.status, big.json.error]).toEqual([413, 'body is 300000 bytes; the limit is 200000']);
    const bomb = await put('bomb', zipOf({ fixture: true, entries: { 'zeros.bin': '0'.repeat(400_000) } }));
    expect([bomb.status, bomb.json.error]).toEqual([400, 'the archive extracts to more than 200000 bytes (--max-dataset-bytes)']);
    // Folders cost disk too (a 1.4 MB .tgz of 300,000 empty folders passed every cap): 60 empty
    // ones beside the fixture are 60 x 4096 bytes, past this server's 200,000.
    const folderBomb = path.join(tmp, 'folders');
    fs.cpSync(FIXTURE, folderBomb, { recursive: true });
    for (let i = 0; i < 60; i++) fs.mkdirSync(path.join(folderBomb, 'empty', `d${i}`), { recursive: true });
    const folderTgz = path.join(tmp, 'folders.tgz');
    await tar.c({ gzip: true, file: folderTgz, cwd: folderBomb }, ['.']);
    const folders = await put('folders', fs.readFileSync(folderTgz));
    expect([folders.status, folders.json.error]).toEqual([400, 'the archive extracts to more than 200000 bytes (--max-dataset-bytes)']);
    const folderZip = await put('folders', zipOf({ fixture: true, entries: Object.fromEntries(Array.from({ length: 60 }, (_, i) => [`empty/d${i}/`, ''])) }));
    expect([folderZip.status, folderZip.json.error]).toEqual([400, 'the archive extracts to more than 200000 bytes (--max-dataset-bytes)']);
    const ops = await put('operators', await fixtureTarGz());
    expect([ops.status, ops.json.error]).toEqual([409, 'dataset "operators" is a shared dataset of this server (the operator\'s datasets folder); it is never replaced: pick another name']);
    expect(fs.readdirSync(datasets).sort()).toEqual(['.uploads', 'operators']);
    expect(fs.readdirSync(await ownDir())).toEqual(['pick']);
  });
});

describe('the sidecar job_events stream', () => {
  it('fails a job that the store says runs but no runner holds (the watchdog), and delivers the failed event', async () => {
    const store = server.store;
    const owner = (await store.findApiKey(TEST_KEY))!;
    const id = 'ft-lostjob1';
    await store.insertJob({ id, owner, status: 'queued', created_at: nowS(), config: { model: 'flow0-tiny', dataset_name: 'pick', steps: 10 }, step: 0, loss: null, eval_loss: null, error: null, output_dir: '/nowhere', started_at: null, finished_at: null, cancel_requested: false });
    await store.updateJob(id, { status: 'running' });
    await store.appendEvent(id, 'status', { status: 'running', model: 'flow0-tiny', steps: 10 });
    const t0 = Date.now();
    const res = await fetch(`${server.baseUrl}/training/job_events?job_id=${id}`, { headers: { authorization: `Bearer ${TEST_KEY}` } });
    const text = await res.text(); // ends after the failed event
    const events = text.split('\n\n').filter((b) => b.includes('data: ')).map((b) => JSON.parse(b.split('\n').find((l) => l.startsWith('data: '))!.slice(6)));
    expect(events.map((e) => [e.type, e.status])).toEqual([['status', 'running'], ['status', 'failed']]);
    expect(events[1].error).toMatch(/^the job stopped without a final event/);
    expect((await store.getJob(id))!.status).toBe('failed');
  });

  it('ends a stream after its time cap, and the reader reconnects with from= for the rest', async () => {
    const capped = await startTestServer({ env: { VELA_DATASETS_DIR: datasets }, engineFactory: stub, start: { sidecarStreamCapS: 0.5, sidecarWatchdogS: 60 } });
    try {
      const owner = (await capped.store.findApiKey(TEST_KEY))!;
      const id = 'ft-waiting1';
      await capped.store.insertJob({ id, owner, status: 'queued', created_at: nowS(), config: { model: 'flow0-tiny', dataset_name: 'pick', steps: 10 }, step: 0, loss: null, eval_loss: null, error: null, output_dir: '/nowhere', started_at: null, finished_at: null, cancel_requested: false });
      await capped.store.appendEvent(id, 'status', { status: 'queued' });
      const t0 = Date.now();
      const text = await (await fetch(`${capped.baseUrl}/training/job_events?job_id=${id}`, { headers: { authorization: `Bearer ${TEST_KEY}` } })).text();
      expect(Date.now() - t0).toBeGreaterThanOrEqual(450);
      expect(text).toContain('id: 0\nevent: log\n');
      await capped.store.appendEvent(id, 'status', { status: 'cancelled', error: 'cancelled before it started' });
      const rest = await (await fetch(`${capped.baseUrl}/training/job_events?job_id=${id}&from=1`, { headers: { authorization: `Bearer ${TEST_KEY}` } })).text();
      expect(rest).toMatch(/^: stream opened\n\nid: 1\nevent: status\ndata: \{"index":1,.*"status":"cancelled"/);
    } finally {
      await capped.close();
    }
  });
});
