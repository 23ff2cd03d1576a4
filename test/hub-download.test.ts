/**
 * `vela datasets download` against a local stand-in for the Hugging Face Hub (test/helpers/
 * fake-hub.ts) that serves the shipped G1 sample as `lerobot-test/g1_sample`: the real file API
 * (revision -> commit, paged recursive tree, resolve with CDN redirects, ETag / X-Linked-Etag /
 * X-Repo-Commit), a resume after a cut connection (in the same run, and in the next run from the
 * kept .incomplete bytes), a corrupted file that is refused, and a token.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { downloadDataset, HubError, type DownloadProgress } from '../server/hub/download.ts';
import { parseDownloadArgs } from '../server/hub/cli.ts';
import { runCli } from '../server/cli/main.ts';
import { openDataset } from '../server/datasets/index.ts';
import { startFakeHub, type FakeHub } from './helpers/fake-hub.ts';
import { G1_DIR } from '../bench/harness/g1.ts';

const REPO = 'lerobot-test/g1_sample';
const VIDEO = 'videos/chunk-000/observation.images.cam_high/episode_000001.mp4';
const PARQUET = 'data/chunk-000/episode_000002.parquet';
/** The Range of @huggingface/hub's fileDownloadInfo probe (size and ETag), sent before each file's GET. */
const PROBE = 'bytes=0-0';
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-hub-'));
const hubs: FakeHub[] = [];
afterAll(async () => {
  for (const h of hubs) await h.close();
  fs.rmSync(tmp, { recursive: true, force: true });
});

async function hub(opts: Partial<Parameters<typeof startFakeHub>[0]> = {}): Promise<FakeHub> {
  const h = await startFakeHub({ repoId: REPO, dir: G1_DIR, ...opts });
  hubs.push(h);
  return h;
}

function sampleFiles(dir: string): string[] {
  const out: string[] = [];
  const walk = (rel: string) => {
    for (const e of fs.readdirSync(path.join(dir, rel), { withFileTypes: true })) {
      const r = rel ? `${rel}/${e.name}` : e.name;
      if (e.isDirectory()) {
        if (r !== '.cache') walk(r);
      } else out.push(r);
    }
  };
  walk('');
  return out.sort();
}

function expectSameAsSample(dest: string): void {
  const files = sampleFiles(G1_DIR);
  expect(sampleFiles(dest)).toEqual(files);
  for (const f of files) expect(Buffer.compare(fs.readFileSync(path.join(dest, f)), fs.readFileSync(path.join(G1_DIR, f))), f).toBe(0);
}

async function hubError(p: Promise<unknown>): Promise<HubError> {
  try {
    await p;
  } catch (e) {
    expect(e).toBeInstanceOf(HubError);
    return e as HubError;
  }
  throw new Error('expected a HubError');
}

describe('vela datasets download', () => {
  it('downloads every file at the revision\'s commit, byte-identical, into a dataset that opens; a rerun fetches nothing', async () => {
    const h = await hub();
    const dest = path.join(tmp, 'full', REPO);
    const progress: DownloadProgress[] = [];
    const r = await downloadDataset({ repoId: REPO, endpoint: h.url, dest, onProgress: (p) => progress.push(p) });
    expect(r.commit).toBe(h.commit);
    expect(r.files).toBe(sampleFiles(G1_DIR).length);
    expect(r.transferredBytes).toBe(r.totalBytes);
    expect(r.skipped).toBe(0);
    expectSameAsSample(dest);
    // The tree came in pages (Link: rel="next"), every file from the commit, LFS files via the CDN
    // redirect (one GET each besides @huggingface/hub's `bytes=0-0` probe).
    expect(h.requests.filter((q) => q.url.includes('/tree/')).length).toBe(Math.ceil(r.files / 2));
    expect(h.requests.filter((q) => q.url.startsWith('/cdn/') && q.range !== PROBE).length).toBe(6);
    expect(h.requests.filter((q) => q.url.includes('/resolve/')).every((q) => q.url.includes(`/resolve/${h.commit}/`))).toBe(true);
    // Progress: monotone, ends at the total.
    const done = progress.map((p) => p.doneBytes);
    expect(done.every((d, i) => i === 0 || d >= done[i - 1]!)).toBe(true);
    expect(progress.at(-1)).toMatchObject({ phase: 'done', doneBytes: r.totalBytes, fileIndex: r.files, files: r.files });
    // huggingface_hub's local-dir metadata: commit, etag (the hash), timestamp.
    const meta = fs.readFileSync(path.join(dest, '.cache/huggingface/download', `${VIDEO}.metadata`), 'utf8').split('\n');
    expect(meta[0]).toBe(h.commit);
    expect(meta[1]).toMatch(/^[0-9a-f]{64}$/);
    const ds = await openDataset(dest);
    expect([ds.meta.episodes.length, ds.meta.totalFrames]).toEqual([3, 1083]);

    const before = h.requests.length;
    const again = await downloadDataset({ repoId: REPO, endpoint: h.url, dest });
    expect(again).toMatchObject({ transferredBytes: 0, skipped: r.files });
    expect(h.requests.slice(before).filter((q) => q.url.includes('/resolve/') || q.url.startsWith('/cdn/'))).toEqual([]);
  });

  it('resumes a file whose connection was cut, with a Range request from the bytes it kept', async () => {
    const cut = 1_000_000;
    const h = await hub({ cutAfter: new Map([[VIDEO, cut]]) });
    const dest = path.join(tmp, 'cut', REPO);
    const phases: string[] = [];
    const r = await downloadDataset({ repoId: REPO, endpoint: h.url, dest, onProgress: (p) => p.file === VIDEO && phases.push(p.phase) });
    expectSameAsSample(dest);
    expect(phases).toContain('retry');
    // One resumed GET (the library's ranged WebBlob read): the resolve URL, and the same Range on
    // the CDN it redirects to, from the kept bytes to the file's last.
    const ranged = h.requests.filter((q) => q.range !== undefined && q.range !== PROBE);
    expect(ranged.map((q) => q.url.split('/')[1])).toEqual(['datasets', 'cdn']);
    expect(ranged[1]!.range).toBe(ranged[0]!.range);
    const m = /^bytes=(\d+)-(\d+)$/.exec(ranged[0]!.range!)!;
    expect(Number(m[2])).toBe(fs.statSync(path.join(G1_DIR, VIDEO)).size - 1);
    const from = Number(m[1]);
    expect(from).toBeGreaterThan(0);
    expect(from).toBeLessThanOrEqual(cut);
    // Only the missing bytes came again: beyond the total, at most what arrived before the cut but
    // was not yet on disk (a refetch of the whole file would add `from` more).
    expect(r.transferredBytes - r.totalBytes).toBeGreaterThanOrEqual(0);
    expect(r.transferredBytes - r.totalBytes).toBeLessThanOrEqual(cut - from);
  });

  it('keeps the bytes of a failed run and the next run continues them', async () => {
    const cut = 700_000;
    const h = await hub({ cutAfter: new Map([[VIDEO, cut]]) });
    const dest = path.join(tmp, 'rerun', REPO);
    const err = await hubError(downloadDataset({ repoId: REPO, endpoint: h.url, dest, retries: 0 }));
    expect(err.code).toBe('network');
    expect(err.message).toMatch(new RegExp(`^${VIDEO}: the connection broke after \\d+ of \\d+ bytes .*; \\d+ of \\d+ bytes of ${VIDEO} are kept: run the same command again to resume$`));
    expect(fs.existsSync(path.join(dest, VIDEO))).toBe(false);
    const partial = fs.readdirSync(path.join(dest, '.cache/huggingface/download/videos/chunk-000/observation.images.cam_high')).find((n) => n.endsWith('.incomplete'))!;
    expect(partial).toMatch(/^episode_000001\.mp4\.[0-9a-f]{64}\.incomplete$/);
    const kept = fs.statSync(path.join(dest, '.cache/huggingface/download/videos/chunk-000/observation.images.cam_high', partial)).size;
    expect(kept).toBeGreaterThan(0);

    const before = h.requests.length;
    const r = await downloadDataset({ repoId: REPO, endpoint: h.url, dest });
    expectSameAsSample(dest);
    const last = fs.statSync(path.join(G1_DIR, VIDEO)).size - 1;
    expect(h.requests.slice(before).filter((q) => q.range !== undefined && q.range !== PROBE).map((q) => [q.url.split('/')[1], q.range])).toEqual([['datasets', `bytes=${kept}-${last}`], ['cdn', `bytes=${kept}-${last}`]]);
    expect(r.skipped).toBeGreaterThan(0); // the files finished in the first run
  });

  it('refuses a file whose bytes do not hash to the hub\'s SHA-256, and saves nothing of it', async () => {
    const h = await hub({ corrupt: new Set([PARQUET]) });
    const dest = path.join(tmp, 'corrupt', REPO);
    const err = await hubError(downloadDataset({ repoId: REPO, endpoint: h.url, dest }));
    expect(err.code).toBe('integrity');
    expect(err.message).toMatch(new RegExp(`^${PARQUET}: SHA-256 of the downloaded bytes is [0-9a-f]{64}; the hub's list says [0-9a-f]{64}\\. The file was discarded, not saved$`));
    expect(fs.existsSync(path.join(dest, PARQUET))).toBe(false);
    expect(fs.readdirSync(path.join(dest, '.cache/huggingface/download/data/chunk-000')).filter((n) => n.endsWith('.incomplete'))).toEqual([]);
  });

  it('stops at the listed size when the hub sends an endless body, and keeps nothing of it (issue 32 item 10)', async () => {
    const h = await hub({ endless: new Set([PARQUET]) });
    const dest = path.join(tmp, 'endless', REPO);
    const err = await hubError(downloadDataset({ repoId: REPO, endpoint: h.url, dest }));
    expect(err.code).toBe('integrity');
    const size = fs.statSync(path.join(G1_DIR, PARQUET)).size;
    expect(err.message).toBe(`${PARQUET}: the hub sent more than the ${size} bytes its file list gives; the bytes were discarded, not saved`);
    expect(fs.existsSync(path.join(dest, PARQUET))).toBe(false);
    expect(fs.readdirSync(path.join(dest, '.cache/huggingface/download/data/chunk-000')).filter((n) => n.endsWith('.incomplete'))).toEqual([]);
  });

  it('refuses a listed oid that is not hex digits before any path is built from it (issue 32 item 11)', async () => {
    const h = await hub({ listedOid: new Map([[PARQUET, '../../../outside/x']]) });
    const root = path.join(tmp, 'oid');
    const dest = path.join(root, REPO);
    const err = await hubError(downloadDataset({ repoId: REPO, endpoint: h.url, dest }));
    expect(err.code).toBe('bad_answer');
    expect(err.message).toBe(`the file list of ${REPO}: ${PARQUET}: the hub listed an LFS SHA-256 of "../../../outside/x", not 64 hex digits; nothing was written`);
    expect(fs.existsSync(dest)).toBe(false);
    expect(fs.readdirSync(tmp).filter((n) => n === 'outside')).toEqual([]);
  });

  it('sends HF_TOKEN as a Bearer token, and says what to do without one', async () => {
    const h = await hub({ token: 'hf_secret' });
    const dest = path.join(tmp, 'token', REPO);
    const err = await hubError(downloadDataset({ repoId: REPO, endpoint: h.url, dest }));
    expect(err.code).toBe('unauthorized');
    expect(err.message).toBe(`dataset ${REPO} at revision main: the hub answered 401 (Invalid username or password.); the dataset "${REPO}" is private, gated or does not exist: set HF_TOKEN (or --token) if you have access`);
    await downloadDataset({ repoId: REPO, endpoint: h.url, dest, token: 'hf_secret' });
    expectSameAsSample(dest);
    const apiCalls = h.requests.filter((q) => !q.url.startsWith('/cdn/'));
    expect(new Set(apiCalls.map((q) => q.authorization))).toEqual(new Set([undefined, 'Bearer hf_secret'])); // the refused first try, then the token
  });

  it('names a revision that does not exist', async () => {
    const h = await hub();
    const err = await hubError(downloadDataset({ repoId: REPO, endpoint: h.url, dest: path.join(tmp, 'rev'), revision: 'v9.9' }));
    expect(err.code).toBe('not_found');
    expect(err.message).toBe(`dataset ${REPO} at revision v9.9: not found on ${h.url} (RevisionNotFound)`);
  });

  it('the command writes under VELA_DATASETS_DIR/REPO_ID from HF_ENDPOINT, and prints one line on failure', async () => {
    const h = await hub();
    const root = path.join(tmp, 'cli');
    expect(parseDownloadArgs([REPO, '--revision', 'v2.1'], { HF_ENDPOINT: h.url, VELA_DATASETS_DIR: root, HF_TOKEN: 't' })).toEqual({
      repoId: REPO, revision: 'v2.1', endpoint: h.url, token: 't', dest: path.join(root, 'lerobot-test', 'g1_sample'),
    });
    expect(parseDownloadArgs([REPO], { HF_LEROBOT_HOME: '/data/lerobot' }).dest).toBe('/data/lerobot/lerobot-test/g1_sample');
    const saved = { ...process.env };
    Object.assign(process.env, { HF_ENDPOINT: h.url, VELA_DATASETS_DIR: root });
    try {
      const errors: string[] = [];
      expect(await runCli(['datasets', 'download', REPO], (t) => errors.push(t))).toBe(0);
      expectSameAsSample(path.join(root, REPO));
      expect(await runCli(['datasets', 'download', REPO, '--revision', 'nope'], (t) => errors.push(t))).toBe(1);
      expect(await runCli(['datasets', 'download', '../etc'], (t) => errors.push(t))).toBe(2);
      expect(errors).toEqual([
        `vela datasets download: dataset ${REPO} at revision nope: not found on ${h.url} (RevisionNotFound)\n`,
        'vela datasets download: REPO_ID ../etc: must be namespace/name, e.g. lerobot/pusht\n',
      ]);
    } finally {
      process.env = saved;
    }
  });
});

describe('a resumed transfer checks where the 206 starts (issue 32 item 12)', () => {
  it('a 206 whose Content-Range starts elsewhere than the kept bytes is not appended: the file starts over and arrives whole', async () => {
    const h = await hub({ cutAfter: new Map([[VIDEO, 1_000_000]]), wrongRangeStart: true });
    const dest = path.join(tmp, 'wrongrange', REPO);
    const phases: string[] = [];
    await downloadDataset({ repoId: REPO, endpoint: h.url, dest, onProgress: (p) => p.file === VIDEO && phases.push(p.phase) });
    expect(phases).toContain('retry');
    expectSameAsSample(dest);
  });
});

describe('datasets download through the same Hub client as models (issue 39)', () => {
  it('a transfer that goes silent is broken off after idleTimeoutMs and resumed from the bytes it kept', async () => {
    const stall = 200_000;
    const h = await hub({ stallAfter: new Map([[VIDEO, stall]]) });
    const dest = path.join(tmp, 'silent', REPO);
    const phases: string[] = [];
    await downloadDataset({ repoId: REPO, endpoint: h.url, dest, idleTimeoutMs: 2000, onProgress: (p) => p.file === VIDEO && phases.push(p.phase) });
    expectSameAsSample(dest);
    expect(phases).toContain('retry');
    // The first resumed GET (resolve, then the CDN) starts at the stalled bytes.
    const last = fs.statSync(path.join(G1_DIR, VIDEO)).size - 1;
    const ranged = h.requests.filter((q) => q.range !== undefined && q.range !== PROBE).map((q) => q.range);
    expect(ranged.slice(0, 2)).toEqual([`bytes=${stall}-${last}`, `bytes=${stall}-${last}`]);
  });
});
