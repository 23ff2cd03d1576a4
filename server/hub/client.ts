/**
 * The one Hugging Face Hub client: models (server/models/download.ts, into the Hugging Face
 * cache) and datasets (server/hub/download.ts, into LeRobot's local folder) both download through
 * downloadRepo here, so a check or a fix lands once. @huggingface/hub does the hub's API:
 * `modelInfo` / `datasetInfo` (revision -> commit), `listFiles` (the paged recursive tree, with
 * each file's git oid and LFS SHA-256), `fileDownloadInfo` (the resolve URL, following the CDN
 * redirect, with the size and ETag) and `downloadFile`'s WebBlob (ranged reads of that URL).
 *
 * What the library does not do is added here, around it:
 * - Resume. The library's `downloadFileToCacheDir` writes from byte 0 every time. Here bytes are
 *   appended to the layout's partial file, and a cut or silent connection (retried in the run)
 *   or a killed run (the next run) continues from its size with `WebBlob.slice(have)`, i.e. a
 *   `Range: bytes=<have>-<size-1>` request.
 * - Verification. The library renames whatever arrived. Here the finished file's size, then its
 *   SHA-256 (LFS files) or git blob SHA-1 (others), must equal the tree's before the layout puts
 *   it in place; otherwise it is deleted and the file is named in the error.
 * - Distrust (untrusted.ts): listed paths and oids are checked before any path is built from
 *   them, a body is cut at the listed size, the resolve answer must name the commit asked for.
 * - A server that ignores Range (answers 200 to a resumed GET), answers a 206 whose
 *   Content-Range does not start at the bytes kept, or refuses the range (416): caught in the
 *   fetch wrapper, the partial file is started over rather than appended to.
 * - Errors: the library's HubApiError keeps neither X-Error-Code nor X-Error-Message, which is
 *   how the hub tells a gated repository from a private or missing one; the fetch wrapper keeps
 *   the last refused answer's (a Refusal) for the caller's Voice to word.
 * - Time limits: an unanswered request or a silent transfer (idleTimeoutMs) is broken off and
 *   resumed; the library sets none.
 * - Include globs (huggingface_hub's `allow_patterns`), and a progress callback.
 * snapshotDownload is not used: it does one paths-info request per file and none of the above.
 * Two processes downloading the same file at once are not locked against each other (two
 * downloads in one process are: the second waits).
 *
 * Where the files go is the caller's Layout; how errors are worded and typed, its Voice. This
 * module imports nothing from server/models or server/datasets.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { ReadableStream as NodeReadableStream } from 'node:stream/web';
import { datasetInfo, downloadFile, fileDownloadInfo, HubApiError, InvalidApiResponseFormatError, listFiles, modelInfo } from '@huggingface/hub';
import { badOid, badSize, capAt, contentRangeStart, TooLong } from './untrusted.ts';

/** `namespace/name` or a bare `name` (the hub's legacy ids, e.g. `gpt2`). */
const HUB_REPO_ID = /^[A-Za-z0-9][\w.-]*(\/[A-Za-z0-9][\w.-]*)?$/;

/** True when `id` is a well-formed Hub repository id (no `..`, no third segment). */
export function isHubRepoId(id: string): boolean {
  return HUB_REPO_ID.test(id) && !id.includes('..') && !id.endsWith('.');
}

/** A file of the tree listing, with the hash it must have (`etag`: the LFS SHA-256 or the git blob id). */
export interface TreeFile {
  path: string;
  size: number;
  etag: string;
  algo: 'sha256' | 'git-blob-sha1';
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
  /** 'start' | 'data' while a file is fetched, 'skip' for a file already there, 'done' once checked, 'retry' after a broken connection. */
  phase: 'start' | 'data' | 'skip' | 'done' | 'retry';
}

/** The last answer the hub refused, with the headers HubApiError drops. */
export interface Refusal {
  status: number;
  errorCode: string | null;
  errorMessage: string | null;
}

/**
 * What went wrong here, before the Voice words it as its layer's error: `bad_argument` (as
 * typed), `not_found` (a listed file the hub does not serve), `network` (unreachable, broken
 * after the retries: bytes kept), `bad_answer` (the hub's answer does not fit its API or its own
 * list), `integrity` (bytes whose size or hash differ from the list: discarded).
 */
export type ClientErrorCode = 'bad_argument' | 'not_found' | 'network' | 'bad_answer' | 'integrity';

/** How a caller's layer names things and types its errors. */
export interface Voice {
  /** The revision lookup: `lerobot/pi05_base@v2`, `dataset lerobot/pusht at revision main`. */
  revision: string;
  /** The file list: `lerobot/pi05_base@v2`, `the file list of lerobot/pusht`. */
  listing: string;
  /** One file: `lerobot/pi05_base: model.safetensors`, `data/chunk-000/episode_000000.parquet`. */
  file(path: string): string;
  /** Where discarded bytes are not saved and kept bytes are: ` in the cache`, or ``. */
  where: string;
  /** An example id for the repo id refusal: `lerobot/pi05_base`. */
  example: string;
  /** The layer's error for a condition found here. */
  error(code: ClientErrorCode, message: string): Error;
  /** The layer's error for a request the hub refused (HubApiError) or that failed (fetch's TypeError); `what` is one of the names above. */
  refused(e: unknown, refusal: Refusal | null, what: string): Error;
}

/** Where the files go (the Hugging Face cache, a LeRobot folder). */
export interface Layout {
  /** Where a file's bytes accumulate until checked; also the key that makes a second download of the file in this process wait. */
  partial(f: TreeFile): string;
  /** Whether the file is in place with the listed size and hash (it may remove a wrong one). */
  present(f: TreeFile): Promise<boolean>;
  /** Moves the checked bytes at `partial` into place. */
  place(f: TreeFile, partial: string): Promise<void>;
  /** Completes a file in place (a snapshot link, a metadata file): after `present` or `place`. */
  keep(f: TreeFile): Promise<void>;
}

export interface RepoDownloadOptions {
  type: 'model' | 'dataset';
  /** `namespace/name`. */
  repoId: string;
  /** Branch, tag or commit; default `main`. */
  revision?: string;
  /** Default `https://huggingface.co`. */
  endpoint?: string;
  /** A Hugging Face access token (`hf_...`), sent as `Authorization: Bearer`. */
  token?: string | null;
  /** Only files matching one of these globs (fnmatch: `*` also crosses `/`); default all. */
  include?: string[];
  /** Resumed attempts per file after a cut connection or a 5xx; default 3. */
  retries?: number;
  /**
   * A request that waits this long for the hub's answer, or a transfer that gets no byte for this
   * long, counts as a broken connection (retried, resumed); default 60 000 ms.
   */
  idleTimeoutMs?: number;
  onProgress?: (p: DownloadProgress) => void;
}

export interface RepoDownloadResult {
  commit: string;
  files: number;
  totalBytes: number;
  /** Bytes transferred in this run (resumed files count only the missing part). */
  transferredBytes: number;
  /** Files already in place (nothing fetched). */
  skipped: number;
}

/** A condition found here, worded by the Voice at the way out. */
class ClientError extends Error {
  constructor(readonly code: ClientErrorCode, message: string) {
    super(message);
  }
}

/** Thrown by the fetch wrapper when a resumed GET is not answered from the bytes kept. */
class RangeIgnored extends Error {}

/** Thrown by the fetch wrapper when a resolve answer names another commit (X-Repo-Commit). */
class WrongCommit extends Error {}

/** SHA-256 of a file, or its git blob id (SHA-1 of "blob <size>\0" + content). */
export async function hashFile(file: string, algo: TreeFile['algo']): Promise<string> {
  const h = crypto.createHash(algo === 'sha256' ? 'sha256' : 'sha1');
  if (algo === 'git-blob-sha1') h.update(`blob ${(await fs.promises.stat(file)).size}\0`);
  for await (const chunk of fs.createReadStream(file)) h.update(chunk as Buffer);
  return h.digest('hex');
}

/** A file's size, or null when it does not exist. */
export const sizeOf = async (p: string): Promise<number | null> => fs.promises.stat(p).then((s) => s.size, () => null);

/** huggingface_hub's fnmatch: `*` any run of characters (`/` included), `?` one, `[...]` a set. */
export function globToRegExp(glob: string): RegExp {
  let re = '';
  for (let i = 0; i < glob.length; i++) {
    const c = glob[i]!;
    if (c === '*') re += '.*';
    else if (c === '?') re += '.';
    else if (c === '[') {
      const end = glob.indexOf(']', i + 1);
      if (end < 0) re += '\\[';
      else {
        const body = glob.slice(i + 1, end);
        re += `[${body.startsWith('!') ? '^' + body.slice(1) : body}]`;
        i = end;
      }
    } else re += c.replace(/[.+^${}()|\\]/g, '\\$&');
  }
  return new RegExp(`^${re}$`);
}

/**
 * Files being fetched by this process, by partial path: a second download of the same file (two
 * jobs on one base) waits for the first instead of appending to the same partial file.
 */
const inflight = new Map<string, Promise<boolean>>();

/** The library's calls with the fetch wrapper, and what the wrapper saw. */
interface Hub {
  lib: { hubUrl: string; accessToken: string | undefined; fetch: typeof fetch };
  repo: { type: 'model' | 'dataset'; name: string };
  endpoint: string;
  commit: string;
  idleTimeoutMs: number;
  refusal: Refusal | null;
  /** WebBlob.stream() turns errors into their message; this flag survives that. */
  rangeIgnored: string | null;
}

function openHub(o: RepoDownloadOptions, endpoint: string, token: string | undefined, idleTimeoutMs: number): Hub {
  const hub: Hub = { lib: { hubUrl: endpoint, accessToken: token, fetch }, repo: { type: o.type, name: o.repoId }, endpoint, commit: '', idleTimeoutMs, refusal: null, rangeIgnored: null };
  hub.lib.fetch = async (input, init) => {
    const headers = new Headers(init?.headers);
    headers.set('user-agent', 'vela (@huggingface/hub)');
    // Byte counts and ranges are of the file itself, never of a compressed body.
    headers.set('accept-encoding', 'identity');
    // A hub that never answers must not hang a job: a limit on the wait for the headers (the
    // body's silences are fetchOnce's watchdog).
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(new Error(`no answer within ${idleTimeoutMs} ms`)), idleTimeoutMs);
    let res: Response;
    try {
      res = await fetch(input, { ...init, headers, signal: ctl.signal });
    } finally {
      clearTimeout(timer);
    }
    // A resumed file appends only bytes that start where the kept ones end (the library's WebBlob
    // takes any 206 as the range it asked for); else it starts over.
    const range = /^bytes=(\d+)-/.exec(headers.get('range') ?? '');
    const from = range ? Number(range[1]) : 0;
    const ignored = from === 0 ? null
      : res.status === 200 ? `the server answered bytes=${from}- with the whole file`
      : res.status === 416 ? `the server refused bytes=${from}- (416)`
      : res.status === 206 && contentRangeStart(res.headers.get('content-range')) !== from ? `the server answered bytes=${from}- with Content-Range ${JSON.stringify(res.headers.get('content-range'))}`
      : null;
    if (ignored) {
      await res.body?.cancel();
      hub.rangeIgnored = ignored;
      throw new RangeIgnored(ignored);
    }
    const served = res.headers.get('x-repo-commit');
    if (hub.commit && served !== null && served !== hub.commit && /\/resolve\//.test(String(input instanceof Request ? input.url : input))) {
      await res.body?.cancel();
      throw new WrongCommit(`the hub served commit ${served}, not ${hub.commit}`);
    }
    if (!res.ok) hub.refusal = { status: res.status, errorCode: res.headers.get('x-error-code'), errorMessage: res.headers.get('x-error-message') };
    return res;
  };
  return hub;
}

/**
 * Downloads every file of a repository at a revision (or those matching `include`) into
 * `layoutOf(commit)`'s layout; files already there are not fetched again, only kept.
 * @throws the Voice's errors: `bad_argument` (repo id, revision, token not `hf_...`, include
 *   matches nothing), the hub's refusals (Voice.refused), `network` (after the retries; the bytes
 *   so far stay in the partial file for the next run), `integrity` (size or hash differs from the
 *   hub's list: the bytes are deleted), `bad_answer`, `not_found`.
 */
export async function downloadRepo(o: RepoDownloadOptions, voice: Voice, layoutOf: (commit: string) => Layout | Promise<Layout>): Promise<RepoDownloadResult> {
  try {
    return await download(o, voice, layoutOf);
  } catch (e) {
    throw e instanceof ClientError ? voice.error(e.code, e.message) : e;
  }
}

async function download(o: RepoDownloadOptions, voice: Voice, layoutOf: (commit: string) => Layout | Promise<Layout>): Promise<RepoDownloadResult> {
  const { repoId } = o;
  if (!isHubRepoId(repoId)) throw new ClientError('bad_argument', `repository id ${JSON.stringify(repoId)} is not of the form namespace/name (e.g. ${voice.example})`);
  const token = o.token || undefined;
  // The library refuses other tokens with a TypeError deep inside; say it here, without the token.
  if (token !== undefined && !token.startsWith('hf_')) throw new ClientError('bad_argument', `the token (HF_TOKEN or --token) does not start with "hf_"; a Hugging Face access token does (create one at https://huggingface.co/settings/tokens)`);
  const endpoint = (o.endpoint ?? 'https://huggingface.co').replace(/\/+$/, '');
  const revision = o.revision ?? 'main';
  if (revision === '' || revision.startsWith('/') || revision.split('/').some((s) => s === '' || s === '.' || s === '..') || /[\s\\]/.test(revision)) {
    throw new ClientError('bad_argument', `revision ${JSON.stringify(revision)} is not a branch, tag or commit name`);
  }
  const retries = o.retries ?? 3;
  const hub = openHub(o, endpoint, token, o.idleTimeoutMs ?? 60_000);

  const ask = { ...hub.lib, name: repoId, revision, additionalFields: ['sha' as const] };
  const info = await (o.type === 'model' ? modelInfo(ask) : datasetInfo(ask)).catch((e: unknown) => {
    throw voice.refused(e, hub.refusal, voice.revision);
  });
  const commit = (info as { sha?: unknown }).sha;
  if (typeof commit !== 'string' || !/^[0-9a-f]{40}$/.test(commit)) throw new ClientError('bad_answer', `${voice.revision}: the hub's answer has no commit sha (got ${JSON.stringify(commit)}); is ${endpoint} a Hugging Face hub?`);
  hub.commit = commit;

  const entries: Record<string, unknown>[] = [];
  try {
    for await (const e of listFiles({ ...hub.lib, repo: hub.repo, recursive: true, revision: commit })) entries.push(e as unknown as Record<string, unknown>);
  } catch (e) {
    throw voice.refused(e, hub.refusal, voice.listing);
  }
  const files: TreeFile[] = [];
  for (const e of entries) {
    if (e.type !== 'file') continue;
    if (typeof e.path !== 'string') throw new ClientError('bad_answer', `${voice.listing} has an entry without a path: ${JSON.stringify(e).slice(0, 200)}`);
    if (e.path.split('/').some((s) => s === '' || s === '.' || s === '..' || s.includes('\\'))) throw new ClientError('bad_answer', `${voice.listing}: the hub listed a file path ${JSON.stringify(e.path)} that is not plain relative segments`);
    const lfs = e.lfs as { oid?: unknown; size?: unknown } | undefined;
    // The oids name files (`blobs/<oid>`, `<path>.<oid>.incomplete`): checked before any path is built from them.
    const bad = badOid(e.oid, 'git-blob-sha1') ?? (lfs ? badOid(lfs.oid, 'sha256') ?? badSize(lfs.size) : null) ?? badSize(e.size);
    if (bad) throw new ClientError('bad_answer', `${voice.listing}: ${e.path}: ${bad}; nothing was written`);
    files.push(lfs ? { path: e.path, size: lfs.size as number, etag: lfs.oid as string, algo: 'sha256' } : { path: e.path, size: e.size as number, etag: e.oid as string, algo: 'git-blob-sha1' });
  }
  const globs = (o.include ?? []).map(globToRegExp);
  const wanted = globs.length ? files.filter((f) => globs.some((g) => g.test(f.path))) : files;
  if (wanted.length === 0) {
    throw new ClientError('bad_argument', `${voice.listing}: no file matches --include ${(o.include ?? []).join(' ')} (the repository has ${files.length}: ${files.slice(0, 5).map((f) => f.path).join(', ')}${files.length > 5 ? ', ...' : ''})`);
  }
  wanted.sort((a, b) => a.path.localeCompare(b.path));
  const layout = await layoutOf(commit);

  const totalBytes = wanted.reduce((s, f) => s + f.size, 0);
  let doneBytes = 0;
  let transferredBytes = 0;
  let skipped = 0;
  const report = (f: TreeFile, i: number, phase: DownloadProgress['phase'], partial = 0) =>
    o.onProgress?.({ file: f.path, fileIndex: i + 1, files: wanted.length, doneBytes: doneBytes + partial, totalBytes, transferredBytes, phase });

  for (const [i, f] of wanted.entries()) {
    const partial = layout.partial(f);
    for (let other = inflight.get(partial); other; other = inflight.get(partial)) await other.catch(() => undefined);
    // From the check above to inflight.set below nothing awaits: one step. The job looks for
    // the file first: another download of this process may have finished it meanwhile.
    const job = (async (): Promise<boolean> => {
      if (await layout.present(f)) return false;
      await fs.promises.mkdir(path.dirname(partial), { recursive: true });
      report(f, i, 'start', (await sizeOf(partial)) ?? 0);
      await fetchFile(hub, voice, f, partial, retries, (n, fileBytes) => {
        transferredBytes += n;
        report(f, i, 'data', fileBytes);
      }, (kept) => report(f, i, 'retry', kept));
      await layout.place(f, partial);
      return true;
    })();
    inflight.set(partial, job);
    let fetched: boolean;
    try {
      fetched = await job;
    } finally {
      if (inflight.get(partial) === job) inflight.delete(partial);
    }
    await layout.keep(f);
    doneBytes += f.size;
    if (!fetched) skipped++;
    report(f, i, fetched ? 'done' : 'skip');
  }
  return { commit, files: wanted.length, totalBytes, transferredBytes, skipped };
}

/**
 * One file into `partial`, resumed from what it holds, retried after a broken connection, then
 * checked: its size, then its hash, must be the listed ones (else it is deleted).
 * @throws ClientError, or the Voice's refusal.
 */
async function fetchFile(hub: Hub, voice: Voice, f: TreeFile, partial: string, retries: number, onData: (n: number, fileBytes: number) => void, onRetry: (kept: number) => void): Promise<void> {
  const name = voice.file(f.path);
  for (let attempt = 0; ; attempt++) {
    try {
      await fetchOnce(hub, voice, f, partial, onData);
      break;
    } catch (e) {
      if (e instanceof RangeIgnored || hub.rangeIgnored) {
        const why = hub.rangeIgnored ?? (e as Error).message;
        hub.rangeIgnored = null;
        await fs.promises.truncate(partial, 0).catch(() => undefined);
        if (attempt < retries) continue;
        throw new ClientError('network', `${name}: the server ignores Range requests (${why}), so a broken transfer cannot resume`);
      }
      if (e instanceof ClientError && e.code !== 'network') throw e;
      const broke = e instanceof ClientError || !(e instanceof HubApiError) || e.statusCode >= 500;
      if (!broke) throw voice.refused(e, hub.refusal, name);
      const kept = (await sizeOf(partial)) ?? 0;
      if (attempt >= retries) {
        const base = e instanceof ClientError ? e.message : voice.refused(e, hub.refusal, name).message;
        throw new ClientError('network', `${base}; ${kept} of ${f.size} bytes of ${f.path} are kept${voice.where}: run the same command again to resume`);
      }
      onRetry(kept);
      await new Promise((r) => setTimeout(r, Math.min(8000, 250 * 2 ** attempt)));
    }
  }
  const size = (await sizeOf(partial)) ?? 0;
  if (size !== f.size) {
    fs.rmSync(partial, { force: true });
    throw new ClientError('integrity', `${name}: downloaded ${size} bytes; the hub's list says ${f.size}. The bytes were discarded, not saved${voice.where}; run again to retry`);
  }
  const got = await hashFile(partial, f.algo);
  if (got !== f.etag) {
    fs.rmSync(partial, { force: true });
    throw new ClientError('integrity', `${name}: ${f.algo === 'sha256' ? 'SHA-256' : 'git blob SHA-1'} of the downloaded bytes is ${got}; the hub's list says ${f.etag}. The file was discarded, not saved${voice.where}`);
  }
}

/**
 * One attempt at a file: the library resolves it (size and ETag checked against the tree), then
 * its WebBlob streams the bytes from what `partial` already holds to the end, appended.
 * @throws ClientError `network` (connection broke; the bytes written stay), `integrity` (the hub
 *   states another hash or size than its tree, or sends more), `bad_answer`, `not_found`;
 *   HubApiError (refused), RangeIgnored.
 */
async function fetchOnce(hub: Hub, voice: Voice, file: TreeFile, partial: string, onData: (n: number, fileBytes: number) => void): Promise<void> {
  let have = (await sizeOf(partial)) ?? 0;
  if (have > file.size) {
    fs.truncateSync(partial, 0);
    have = 0;
  }
  if (have === file.size) return;
  const name = voice.file(file.path);
  // The library puts the path into the URL as is; a space or `#` in a file name needs quoting.
  const at = { ...hub.lib, repo: hub.repo, path: file.path.split('/').map(encodeURIComponent).join('/'), revision: hub.commit };
  let info;
  try {
    info = await fileDownloadInfo(at);
  } catch (e) {
    if (e instanceof HubApiError || e instanceof RangeIgnored) throw e;
    if (e instanceof WrongCommit) throw new ClientError('bad_answer', `${name}: ${e.message}`);
    if (e instanceof InvalidApiResponseFormatError) throw new ClientError('network', `${name}: the answer of ${hub.endpoint} does not fit the hub's API (${e.message}); is it a Hugging Face hub or mirror?`);
    throw new ClientError('network', `${name}: cannot reach ${new URL(hub.endpoint).origin} (${(e as Error & { cause?: Error }).cause?.message ?? (e as Error).message})`);
  }
  if (info === null) throw new ClientError('not_found', `${name} is listed at commit ${hub.commit} but the hub has no such entry`);
  const etag = info.etag.replace(/^W\//, '').replace(/^"(.*)"$/, '$1');
  // The ETag is compared only for plain answers: for a Xet-stored file the hub answers the probe
  // with Xet file info, and the hash check after the download is what counts anyway.
  if (info.size !== file.size || (!info.xet && etag.length >= 40 && etag !== file.etag)) {
    throw new ClientError('integrity', `${name}: the hub serves ${info.size} bytes with ETag ${etag}; its file list says ${file.size} bytes, ${file.etag}. Nothing was saved`);
  }
  const blob = await downloadFile({ ...at, xet: false, downloadInfo: info });
  if (!blob) throw new ClientError('not_found', `${name} is listed at commit ${hub.commit} but the hub has no such entry`);
  const rest = have > 0 ? blob.slice(have) : blob;
  // The watchdog: a transfer silent for idleTimeoutMs is broken off (and resumed by the caller).
  // capAt lets no byte past the listed size into the file, whatever the body goes on sending.
  let watchdog: NodeJS.Timeout | undefined;
  const count = capAt(have, file.size, (n, fileBytes) => {
    watchdog?.refresh();
    onData(n, fileBytes);
  });
  watchdog = setTimeout(() => count.destroy(new Error(`no data for ${hub.idleTimeoutMs} ms`)), hub.idleTimeoutMs);
  const out = fs.createWriteStream(partial, { flags: have > 0 ? 'a' : 'w' });
  try {
    await pipeline(Readable.fromWeb(rest.stream() as NodeReadableStream), count, out);
    clearTimeout(watchdog);
  } catch (e) {
    clearTimeout(watchdog);
    // pipeline rejects as soon as the source breaks; writes already handed to the file may still
    // land. Wait for the file to close so the size we resume from is final.
    if (!out.closed) await new Promise<void>((resolve) => out.once('close', () => resolve()));
    if (e instanceof RangeIgnored) throw e;
    if (e instanceof TooLong) {
      fs.rmSync(partial, { force: true });
      throw new ClientError('integrity', `${name}: ${e.message}; the bytes were discarded, not saved${voice.where}`);
    }
    const reason = typeof e === 'string' ? e : ((e as Error & { cause?: Error }).cause?.message ?? (e as Error).message);
    throw new ClientError('network', `${name}: the connection broke after ${(await sizeOf(partial)) ?? 0} of ${file.size} bytes (${reason})`);
  }
}
