/**
 * Downloads a dataset repository from the Hugging Face Hub into a local folder, the way
 * huggingface_hub's `snapshot_download(repo_type="dataset", local_dir=...)` does for LeRobot
 * (`$HF_LEROBOT_HOME/<repo_id>`), with the hub's file API:
 *
 * 1. `GET {endpoint}/api/datasets/{repo_id}/revision/{revision}` -> `sha`, the commit the
 *    revision points at; every later request names that commit, so a push mid-download cannot
 *    mix two versions.
 * 2. `GET {endpoint}/api/datasets/{repo_id}/tree/{sha}?recursive=true` (pages via the `Link:
 *    <...>; rel="next"` header) -> files `{type: "file", path, size, oid, lfs?: {oid, size}}`:
 *    `oid` is the git blob id; for LFS files `lfs.oid` is the SHA-256 of the content.
 * 3. `GET {endpoint}/datasets/{repo_id}/resolve/{sha}/{path}` per file (redirects to a CDN for
 *    LFS files are followed; fetch drops the Authorization header on a cross-origin redirect).
 *    `X-Repo-Commit` must be the commit, `X-Linked-Etag` (else `ETag`) the expected hash.
 *
 * Resumable: bytes go to `.cache/huggingface/download/<path>.<hash>.incomplete` (named by the
 * expected hash, so a changed file never resumes another version's bytes), continued with
 * `Range: bytes=<have>-` after a cut connection (retried here) or in the next run. A finished
 * file is checked (size, then SHA-256 for LFS files or the git blob SHA-1 for the others) before
 * it is renamed into place; a mismatch discards it. Done files get huggingface_hub's metadata file
 * (`.cache/huggingface/download/<path>.metadata`: commit, etag, timestamp), so a rerun skips them
 * without rehashing and huggingface_hub recognises the folder too.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { badOid, badSize, capAt, contentRangeStart, TooLong } from './untrusted.ts';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';

export type HubErrorCode = 'bad_argument' | 'not_found' | 'unauthorized' | 'http' | 'network' | 'bad_answer' | 'integrity';

/** A download that cannot go on; the message names the repository or the file and the values seen. */
export class HubError extends Error {
  constructor(readonly code: HubErrorCode, message: string) {
    super(message);
    this.name = 'HubError';
  }
}

/** One file of the hub's tree listing (the fields used here). */
export interface HubFile {
  path: string;
  size: number;
  /** git blob id (SHA-1 of "blob <size>\0" + content; for LFS files, of the pointer file). */
  oid: string;
  lfs?: { oid: string; size: number };
}

export interface DownloadProgress {
  /** The file being fetched (repository path) and its 1-based number among `files`. */
  file: string;
  fileIndex: number;
  files: number;
  /** Bytes of all files that are on disk now (done, skipped or partial), and of all files. */
  doneBytes: number;
  totalBytes: number;
  /** Bytes actually transferred in this run so far. */
  transferredBytes: number;
  /** 'start' | 'data' while a file is fetched, 'skip' for a file already there, 'done' once checked. */
  phase: 'start' | 'data' | 'skip' | 'done' | 'retry';
}

export interface DownloadOptions {
  /** `namespace/name` (e.g. `lerobot/pusht`). */
  repoId: string;
  /** Branch, tag or commit; default `main`. */
  revision?: string;
  /** Default `https://huggingface.co`. */
  endpoint?: string;
  /** Sent as `Authorization: Bearer <token>` (private or gated datasets). */
  token?: string | null;
  /** The local folder that receives the files (e.g. `$HF_LEROBOT_HOME/<repo_id>`). */
  dest: string;
  /** Resumed attempts per file after a cut connection or a 5xx; default 3. */
  retries?: number;
  onProgress?: (p: DownloadProgress) => void;
}

export interface DownloadResult {
  commit: string;
  files: number;
  totalBytes: number;
  transferredBytes: number;
  /** Files already present and verified (nothing fetched). */
  skipped: number;
}

const REPO_ID = /^[A-Za-z0-9][\w.-]*(\/[A-Za-z0-9][\w.-]*)?$/;

/** huggingface_hub's `_normalize_etag`: `W/"x"` and `"x"` -> `x`. */
function normalizeEtag(etag: string | null): string | null {
  return etag === null ? null : etag.replace(/^W\//, '').replace(/^"(.*)"$/, '$1');
}

/** The hash the hub states for a file: SHA-256 for LFS files, the git blob id for the others. */
function expectedHash(f: HubFile): { algo: 'sha256' | 'git-blob-sha1'; hex: string; size: number } {
  return f.lfs ? { algo: 'sha256', hex: f.lfs.oid, size: f.lfs.size } : { algo: 'git-blob-sha1', hex: f.oid, size: f.size };
}

/** SHA-256 of a file, or git's blob id (SHA-1 of "blob <size>\0" + content). */
async function hashFile(file: string, algo: 'sha256' | 'git-blob-sha1'): Promise<string> {
  const h = crypto.createHash(algo === 'sha256' ? 'sha256' : 'sha1');
  if (algo === 'git-blob-sha1') h.update(`blob ${fs.statSync(file).size}\0`);
  for await (const chunk of fs.createReadStream(file)) h.update(chunk as Buffer);
  return h.digest('hex');
}

/** A repository path as local path segments. @throws HubError for `..`, absolute or empty parts. */
function safeSegments(p: string): string[] {
  const segs = p.split('/');
  if (segs.some((s) => s === '' || s === '.' || s === '..' || s.includes('\\'))) throw new HubError('bad_answer', `the hub listed a file path ${JSON.stringify(p)} that is not plain relative segments`);
  return segs;
}

class Hub {
  constructor(readonly endpoint: string, readonly repoId: string, readonly token: string | null) {}

  headers(extra: Record<string, string> = {}): Record<string, string> {
    return { 'user-agent': 'vela (huggingface-hub file API)', ...(this.token ? { authorization: `Bearer ${this.token}` } : {}), ...extra };
  }

  async get(url: string, what: string, extra: Record<string, string> = {}): Promise<Response> {
    let res: Response;
    try {
      res = await fetch(url, { headers: this.headers(extra), redirect: 'follow' });
    } catch (e) {
      throw new HubError('network', `${what}: cannot reach ${new URL(url).origin} (${(e as Error & { cause?: Error }).cause?.message ?? (e as Error).message})`);
    }
    if (res.ok || res.status === 416) return res;
    const body = (await res.text().catch(() => '')).slice(0, 200);
    let detail = body;
    try {
      detail = (JSON.parse(body) as { error?: string }).error ?? body;
    } catch {
      // not JSON: keep the text
    }
    const errorCode = res.headers.get('x-error-code');
    if (res.status === 401 || res.status === 403) {
      throw new HubError('unauthorized', `${what}: the hub answered ${res.status}${detail ? ` (${detail})` : ''}; the dataset "${this.repoId}" is private, gated or does not exist${this.token ? ' for this token' : ': set HF_TOKEN (or --token) if you have access'}`);
    }
    if (res.status === 404) throw new HubError('not_found', `${what}: not found on ${this.endpoint} (${errorCode ?? detail ?? '404'})`);
    throw new HubError('http', `${what}: the hub answered ${res.status}${detail ? ` (${detail})` : ''}`);
  }

  async json<T>(url: string, what: string): Promise<{ data: T; res: Response }> {
    const res = await this.get(url, what);
    try {
      return { data: (await res.json()) as T, res };
    } catch (e) {
      throw new HubError('bad_answer', `${what}: the answer is not JSON (${(e as Error).message})`);
    }
  }
}

/** `<https://...>; rel="next"` from a Link header, as huggingface_hub's paginate follows it. */
function nextLink(link: string | null): string | null {
  if (!link) return null;
  for (const part of link.split(',')) {
    const m = /<([^>]+)>\s*;\s*rel="?next"?/.exec(part);
    if (m) return m[1]!;
  }
  return null;
}

/**
 * The commit a revision points at and the files of the repository at that commit.
 * @throws HubError `not_found`, `unauthorized`, `network`, `http`, `bad_answer`.
 */
export async function listDatasetFiles(opts: Pick<DownloadOptions, 'repoId' | 'revision' | 'endpoint' | 'token'>): Promise<{ commit: string; files: HubFile[] }> {
  const endpoint = (opts.endpoint ?? 'https://huggingface.co').replace(/\/+$/, '');
  const revision = opts.revision ?? 'main';
  if (!REPO_ID.test(opts.repoId) || opts.repoId.includes('..')) throw new HubError('bad_argument', `repository id ${JSON.stringify(opts.repoId)} is not of the form namespace/name`);
  const hub = new Hub(endpoint, opts.repoId, opts.token ?? null);
  const { data: info } = await hub.json<{ sha?: unknown }>(`${endpoint}/api/datasets/${opts.repoId}/revision/${encodeURIComponent(revision)}`, `dataset ${opts.repoId} at revision ${revision}`);
  if (typeof info.sha !== 'string' || !/^[0-9a-f]{40}$/.test(info.sha)) throw new HubError('bad_answer', `dataset ${opts.repoId} at revision ${revision}: the answer has no commit sha (got ${JSON.stringify(info.sha)})`);
  const commit = info.sha;
  const files: HubFile[] = [];
  let url: string | null = `${endpoint}/api/datasets/${opts.repoId}/tree/${commit}?recursive=true`;
  while (url) {
    const { data, res }: { data: unknown; res: Response } = await hub.json<unknown>(url, `the file list of ${opts.repoId}@${commit.slice(0, 8)}`);
    if (!Array.isArray(data)) throw new HubError('bad_answer', `the file list of ${opts.repoId} is not a JSON array`);
    for (const e of data as Record<string, unknown>[]) {
      if (e.type !== 'file') continue;
      const lfs = e.lfs as { oid?: unknown; size?: unknown } | undefined;
      if (typeof e.path !== 'string' || typeof e.size !== 'number' || typeof e.oid !== 'string' || (lfs && (typeof lfs.oid !== 'string' || typeof lfs.size !== 'number'))) {
        throw new HubError('bad_answer', `the file list of ${opts.repoId} has an entry without path, size and oid: ${JSON.stringify(e).slice(0, 200)}`);
      }
      safeSegments(e.path);
      const f: HubFile = { path: e.path, size: e.size, oid: e.oid, ...(lfs ? { lfs: { oid: lfs.oid as string, size: lfs.size as number } } : {}) };
      // The oid names files (`<path>.<oid>.incomplete`): checked before any path is built from it.
      const want = expectedHash(f);
      const bad = badOid(f.oid, 'git-blob-sha1') ?? (lfs ? badOid(want.hex, 'sha256') : null) ?? badSize(f.size) ?? badSize(want.size);
      if (bad) throw new HubError('bad_answer', `the file list of ${opts.repoId}: ${f.path}: ${bad}; nothing was written`);
      files.push(f);
    }
    url = nextLink(res.headers.get('link'));
  }
  files.sort((a, b) => a.path.localeCompare(b.path));
  return { commit, files };
}

/**
 * Downloads every file of a dataset repository at a revision into `opts.dest`.
 * @throws HubError: `bad_argument` (repo id), `not_found` / `unauthorized` (repository or
 *   revision), `network` / `http` (after the retries; partial bytes are kept for the next run),
 *   `integrity` (size or hash differs from the hub's list: the bytes are discarded),
 *   `bad_answer` (the hub's answer does not fit its API).
 */
export async function downloadDataset(opts: DownloadOptions): Promise<DownloadResult> {
  const endpoint = (opts.endpoint ?? 'https://huggingface.co').replace(/\/+$/, '');
  const { commit, files } = await listDatasetFiles({ ...opts, endpoint });
  const hub = new Hub(endpoint, opts.repoId, opts.token ?? null);
  const retries = opts.retries ?? 3;
  const totalBytes = files.reduce((s, f) => s + expectedHash(f).size, 0);
  let doneBytes = 0;
  let transferredBytes = 0;
  let skipped = 0;
  const metaRoot = path.join(opts.dest, '.cache', 'huggingface', 'download');
  const report = (file: string, fileIndex: number, phase: DownloadProgress['phase'], partial = 0) =>
    opts.onProgress?.({ file, fileIndex, files: files.length, doneBytes: doneBytes + partial, totalBytes, transferredBytes, phase });

  for (const [i, f] of files.entries()) {
    const segs = safeSegments(f.path);
    const target = path.join(opts.dest, ...segs);
    const want = expectedHash(f);
    const metaFile = path.join(metaRoot, ...segs) + '.metadata';
    if (await alreadyThere(target, metaFile, want)) {
      fs.mkdirSync(path.dirname(metaFile), { recursive: true });
      fs.writeFileSync(metaFile, `${commit}\n${want.hex}\n${Date.now() / 1000}\n`);
      doneBytes += want.size;
      skipped++;
      report(f.path, i + 1, 'skip');
      continue;
    }
    const partial = path.join(metaRoot, ...segs) + `.${want.hex}.incomplete`;
    fs.mkdirSync(path.dirname(partial), { recursive: true });
    report(f.path, i + 1, 'start', fs.existsSync(partial) ? fs.statSync(partial).size : 0);
    const url = `${endpoint}/datasets/${opts.repoId}/resolve/${commit}/${segs.map(encodeURIComponent).join('/')}`;
    for (let attempt = 0; ; attempt++) {
      try {
        await fetchInto(hub, url, f.path, partial, want, commit, (n, fileBytes) => {
          transferredBytes += n;
          report(f.path, i + 1, 'data', fileBytes);
        });
        break;
      } catch (e) {
        const retryable = e instanceof HubError && (e.code === 'network' || (e.code === 'http' && /answered 5\d\d/.test(e.message)));
        if (!retryable || attempt >= retries) {
          if (retryable) throw new HubError((e as HubError).code, `${(e as Error).message}; ${fs.existsSync(partial) ? fs.statSync(partial).size : 0} of ${want.size} bytes of ${f.path} are kept: run the same command again to resume`);
          throw e;
        }
        report(f.path, i + 1, 'retry', fs.existsSync(partial) ? fs.statSync(partial).size : 0);
        await new Promise((r) => setTimeout(r, Math.min(8000, 250 * 2 ** attempt)));
      }
    }
    const size = fs.statSync(partial).size;
    if (size !== want.size) {
      fs.rmSync(partial, { force: true });
      throw new HubError('integrity', `${f.path}: downloaded ${size} bytes; the hub's list says ${want.size}. The bytes were discarded; run again to retry`);
    }
    const got = await hashFile(partial, want.algo);
    if (got !== want.hex) {
      fs.rmSync(partial, { force: true });
      throw new HubError('integrity', `${f.path}: ${want.algo === 'sha256' ? 'SHA-256' : 'git blob SHA-1'} of the downloaded bytes is ${got}; the hub's list says ${want.hex}. The file was discarded, not saved`);
    }
    fs.mkdirSync(path.dirname(target), { recursive: true });
    fs.renameSync(partial, target);
    fs.writeFileSync(metaFile, `${commit}\n${want.hex}\n${Date.now() / 1000}\n`);
    doneBytes += want.size;
    report(f.path, i + 1, 'done');
  }
  return { commit, files: files.length, totalBytes, transferredBytes, skipped };
}

/** A file already downloaded: its metadata names the same hash and it was not modified since, or its bytes hash right. */
async function alreadyThere(target: string, metaFile: string, want: ReturnType<typeof expectedHash>): Promise<boolean> {
  if (!fs.existsSync(target) || fs.statSync(target).size !== want.size) return false;
  if (fs.existsSync(metaFile)) {
    const [, etag, ts] = fs.readFileSync(metaFile, 'utf8').split('\n');
    if (etag === want.hex && fs.statSync(target).mtimeMs / 1000 - 1 <= Number(ts)) return true;
  }
  return (await hashFile(target, want.algo)) === want.hex;
}

/**
 * One GET of a file, appended to `partial` from its current size (`Range`), checking the
 * commit and hash headers first.
 * @throws HubError `network` for a cut connection (the bytes written so far stay), else as Hub.get.
 */
async function fetchInto(hub: Hub, url: string, name: string, partial: string, want: ReturnType<typeof expectedHash>, commit: string, onData: (n: number, fileBytes: number) => void): Promise<void> {
  const have = fs.existsSync(partial) ? fs.statSync(partial).size : 0;
  if (have === want.size) return;
  if (have > want.size) fs.truncateSync(partial, 0);
  const from = have > want.size ? 0 : have;
  const res = await hub.get(url, name, { 'accept-encoding': 'identity', ...(from > 0 ? { range: `bytes=${from}-` } : {}) });
  if (res.status === 416) {
    // The server has fewer bytes than we kept: start over.
    await res.body?.cancel();
    fs.truncateSync(partial, 0);
    throw new HubError('network', `${name}: the server refused the range bytes=${from}- (416); starting the file over`);
  }
  const repoCommit = res.headers.get('x-repo-commit');
  const etag = normalizeEtag(res.headers.get('x-linked-etag') ?? res.headers.get('etag'));
  if (repoCommit !== null && repoCommit !== commit) {
    await res.body?.cancel();
    throw new HubError('bad_answer', `${name}: the hub served commit ${repoCommit}, not ${commit}`);
  }
  if (etag !== null && etag.length >= 40 && etag !== want.hex) {
    await res.body?.cancel();
    throw new HubError('integrity', `${name}: the hub's ETag is ${etag}; its file list says ${want.hex}`);
  }
  let append = from > 0 && res.status === 206;
  if (append && contentRangeStart(res.headers.get('content-range')) !== from) append = false; // not the range we asked for: start over
  if (!append && from > 0 && res.status === 206) {
    await res.body?.cancel();
    fs.truncateSync(partial, 0);
    throw new HubError('network', `${name}: the server answered another range than bytes=${from}-; starting the file over`);
  }
  if (!res.body) throw new HubError('bad_answer', `${name}: the answer has no body`);
  // No byte past the listed size reaches the file, whatever the body goes on sending.
  const count = capAt(append ? from : 0, want.size, onData);
  const out = fs.createWriteStream(partial, { flags: append ? 'a' : 'w' });
  try {
    await pipeline(Readable.fromWeb(res.body as import('node:stream/web').ReadableStream), count, out);
  } catch (e) {
    // pipeline rejects as soon as the source breaks; writes already handed to the file may still
    // land. Wait for the file to close so the size we report (and resume from) is final.
    if (!out.closed) await new Promise<void>((resolve) => out.once('close', () => resolve()));
    if (e instanceof TooLong) {
      fs.rmSync(partial, { force: true });
      throw new HubError('integrity', `${name}: ${e.message}; the bytes were discarded, not saved`);
    }
    throw new HubError('network', `${name}: the connection broke after ${fs.statSync(partial).size} of ${want.size} bytes (${(e as Error & { cause?: Error }).cause?.message ?? (e as Error).message})`);
  }
}
