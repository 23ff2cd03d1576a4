/**
 * Downloads a model repository from the Hugging Face Hub into the Hugging Face cache
 * (hf-cache.ts), with @huggingface/hub doing the hub's API: `modelInfo` (revision -> commit),
 * `listFiles` (the paged recursive tree, with each file's git oid and LFS SHA-256),
 * `fileDownloadInfo` (the resolve URL, following the CDN redirect, with the size and ETag) and
 * `downloadFile`'s WebBlob (ranged reads of that URL).
 *
 * What the library does not do is added here, around it, and nothing else:
 * - Resume (blob-fetch.ts). The library's `downloadFileToCacheDir` writes
 *   `blobs/<etag>.incomplete` from byte 0 every time. Here bytes are appended to that same file
 *   (huggingface_hub's name for it), and a cut or silent connection (retried in the run) or a
 *   killed run (the next run) continues from its size with `WebBlob.slice(have)`, i.e. a
 *   `Range: bytes=<have>-<size-1>` request.
 * - Verification. The library renames whatever arrived into the blob. Here the finished file's
 *   size, then its SHA-256 (LFS files) or git blob SHA-1 (others), must equal the tree's before it
 *   is renamed into `blobs/<etag>`; otherwise it is deleted and the file is named in the error.
 * - A server that ignores Range (answers 200 to a resumed GET), or answers a 206 whose
 *   Content-Range does not start at the bytes kept: caught in the fetch wrapper, the partial file
 *   is started over rather than appended to.
 * - Errors (hub-errors.ts): the library's HubApiError keeps neither X-Error-Code nor
 *   X-Error-Message, which is how the hub tells a gated repository from a private or missing
 *   one; the fetch wrapper keeps the last refused answer's headers so that ModelError can say
 *   which, with the fix.
 * - Time limits: an unanswered request or a silent transfer (idleTimeoutMs) is broken off and
 *   resumed; the library sets none.
 * - Include globs (huggingface_hub's `allow_patterns`), and a progress callback.
 * snapshotDownload is not used: it does one paths-info request per file and none of the above.
 * Two processes downloading the same blob at once are not locked against each other (two
 * downloads in one process are: the second waits).
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { badOid, badSize, contentRangeStart } from '../hub/untrusted.ts';
import { HubApiError, listFiles, modelInfo } from '@huggingface/hub';
import type { DownloadProgress } from '../hub/download.ts';
import { fetchInto, hashFile, RangeIgnored, sizeOf, type TreeFile } from './blob-fetch.ts';
import { ModelError } from './errors.ts';
import { isHubRepoId, modelRepoFolder } from './hf-cache.ts';
import { toModelError, type Refusal } from './hub-errors.ts';

export type { DownloadProgress } from '../hub/download.ts';

export interface ModelDownloadOptions {
  /** `namespace/name`, e.g. `lerobot/pi05_base`. */
  repoId: string;
  /** Branch, tag or commit; default `main`. */
  revision?: string;
  /** Default `https://huggingface.co`. */
  endpoint?: string;
  /** A Hugging Face access token (`hf_...`), sent as `Authorization: Bearer`. */
  token?: string | null;
  /** The hub cache folder (hubCacheDir(env)). */
  cacheDir: string;
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

export interface ModelDownloadResult {
  commit: string;
  /** `<cache>/models--ns--name/snapshots/<commit>`. */
  snapshot: string;
  files: number;
  totalBytes: number;
  /** Bytes transferred in this run (resumed files count only the missing part). */
  transferredBytes: number;
  /** Files already in the cache (nothing fetched). */
  skipped: number;
}

/**
 * Blobs being fetched by this process: a second download of the same blob (two jobs on one base)
 * waits for the first instead of appending to the same .incomplete file. Other processes are
 * not locked out.
 */
const inflight = new Map<string, Promise<boolean>>();

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
 * Downloads every file of a model repository at a revision (or those matching `include`) into
 * the Hugging Face cache; files already there (a blob of the listed size under the listed hash)
 * are not fetched again, only linked into the snapshot.
 * @throws ModelError: `bad_argument` (repo id, revision, token not `hf_...`, include matches nothing),
 *   `not_found` (repository, revision or file), `unauthorized` (token refused, or private),
 *   `gated` (licence not accepted: the fix is in the message), `network` (after the retries; the
 *   bytes so far stay in `blobs/<etag>.incomplete` for the next run), `integrity` (size or hash
 *   differs from the hub's list: the bytes are deleted).
 */
export async function downloadModel(opts: ModelDownloadOptions): Promise<ModelDownloadResult> {
  const { repoId } = opts;
  if (!isHubRepoId(repoId)) throw new ModelError('bad_argument', `repository id ${JSON.stringify(repoId)} is not of the form namespace/name (e.g. lerobot/pi05_base)`);
  const token = opts.token || undefined;
  // The library refuses other tokens with a TypeError deep inside; say it here, without the token.
  if (token !== undefined && !token.startsWith('hf_')) throw new ModelError('bad_argument', `the token (HF_TOKEN or --token) does not start with "hf_"; a Hugging Face access token does (create one at https://huggingface.co/settings/tokens)`);
  const endpoint = (opts.endpoint ?? 'https://huggingface.co').replace(/\/+$/, '');
  const revision = opts.revision ?? 'main';
  const retries = opts.retries ?? 3;
  const idleTimeoutMs = opts.idleTimeoutMs ?? 60_000;
  if (revision === '' || revision.startsWith('/') || revision.split('/').some((s) => s === '' || s === '.' || s === '..') || /[\s\\]/.test(revision)) {
    throw new ModelError('bad_argument', `revision ${JSON.stringify(revision)} is not a branch, tag or commit name`);
  }
  let refusal: Refusal | null = null;
  // WebBlob.stream() turns errors into their message; this flag survives that.
  let rangeIgnored = false;
  const guardedFetch: typeof fetch = async (input, init) => {
    const headers = new Headers(init?.headers);
    headers.set('user-agent', 'vela (@huggingface/hub)');
    // A hub that never answers must not hang a job: a limit on the wait for the headers (the
    // body's silences are fetchInto's watchdog).
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(new Error(`no answer within ${idleTimeoutMs} ms`)), idleTimeoutMs);
    let res: Response;
    try {
      res = await fetch(input, { ...init, headers, signal: ctl.signal });
    } finally {
      clearTimeout(timer);
    }
    const range = /^bytes=(\d+)-/.exec(headers.get('range') ?? '');
    if (range && Number(range[1]) > 0 && res.status === 200) {
      await res.body?.cancel();
      rangeIgnored = true;
      throw new RangeIgnored(`the server answered bytes=${range[1]}- with the whole file`);
    }
    // The library's WebBlob takes any 206 as the range it asked for and blob-fetch.ts appends it;
    // a resumed file appends only bytes that start where the kept ones end, else it starts over
    // (as for a 200). The dataset downloader checks the same (untrusted.ts contentRangeStart).
    if (range && Number(range[1]) > 0 && res.status === 206 && contentRangeStart(res.headers.get('content-range')) !== Number(range[1])) {
      await res.body?.cancel();
      rangeIgnored = true;
      throw new RangeIgnored(`the server answered bytes=${range[1]}- with Content-Range ${JSON.stringify(res.headers.get('content-range'))}`);
    }
    if (!res.ok) refusal = { status: res.status, errorCode: res.headers.get('x-error-code'), errorMessage: res.headers.get('x-error-message') };
    return res;
  };
  const common = { hubUrl: endpoint, accessToken: token, fetch: guardedFetch };
  const what = (file?: string) => `${repoId}${revision === 'main' ? '' : `@${revision}`}${file ? `: ${file}` : ''}`;
  const fail = (e: unknown, file?: string): never => {
    throw toModelError(e, refusal, { repoId, revision, endpoint, token, what: what(file) });
  };

  const info = await modelInfo({ ...common, name: repoId, revision, additionalFields: ['sha'] }).catch((e) => fail(e));
  const commit = (info as { sha?: unknown }).sha;
  if (typeof commit !== 'string' || !/^[0-9a-f]{40}$/.test(commit)) throw new ModelError('network', `${what()}: the hub's answer has no commit sha (got ${JSON.stringify(commit)}); is ${endpoint} a Hugging Face hub?`);
  const repoDir = modelRepoFolder(opts.cacheDir, repoId);
  const snapshot = path.join(repoDir, 'snapshots', commit);

  const files: TreeFile[] = [];
  try {
    for await (const e of listFiles({ ...common, repo: { type: 'model', name: repoId }, recursive: true, revision: commit })) {
      if (e.type !== 'file') continue;
      const segs = e.path.split('/');
      if (segs.some((s) => s === '' || s === '.' || s === '..' || s.includes('\\'))) throw new ModelError('network', `${what()}: the hub listed a file path ${JSON.stringify(e.path)} that is not plain relative segments`);
      const f: TreeFile = e.lfs ? { path: e.path, size: e.lfs.size, etag: e.lfs.oid, algo: 'sha256' } : { path: e.path, size: e.size, etag: e.oid ?? '', algo: 'git-blob-sha1' };
      // The oid names files in the cache (blobs/<oid>): checked before any path is built from it.
      const bad = badOid(f.etag, f.algo) ?? badSize(f.size);
      if (bad) throw new ModelError('integrity', `${what(e.path)}: ${bad}; nothing was written`);
      files.push(f);
    }
  } catch (e) {
    if (e instanceof ModelError) throw e;
    fail(e);
  }
  const globs = (opts.include ?? []).map(globToRegExp);
  const wanted = globs.length ? files.filter((f) => globs.some((g) => g.test(f.path))) : files;
  if (wanted.length === 0) {
    throw new ModelError('bad_argument', `${what()}: no file matches --include ${(opts.include ?? []).join(' ')} (the repository has ${files.length}: ${files.slice(0, 5).map((f) => f.path).join(', ')}${files.length > 5 ? ', ...' : ''})`);
  }
  wanted.sort((a, b) => a.path.localeCompare(b.path));

  // The ref first, as huggingface_hub does: a later run finds the commit even if this one stops.
  if (revision !== commit) {
    const ref = path.join(repoDir, 'refs', ...revision.split('/'));
    fs.mkdirSync(path.dirname(ref), { recursive: true });
    const tmp = `${ref}.${process.pid}.tmp`;
    fs.writeFileSync(tmp, commit);
    fs.renameSync(tmp, ref);
  }

  const totalBytes = wanted.reduce((s, f) => s + f.size, 0);
  let doneBytes = 0;
  let transferredBytes = 0;
  let skipped = 0;
  const report = (f: TreeFile, i: number, phase: DownloadProgress['phase'], partial = 0) =>
    opts.onProgress?.({ file: f.path, fileIndex: i + 1, files: wanted.length, doneBytes: doneBytes + partial, totalBytes, transferredBytes, phase });

  for (const [i, f] of wanted.entries()) {
    const blob = path.join(repoDir, 'blobs', f.etag);
    const pointer = path.join(snapshot, ...f.path.split('/'));
    let have = await sizeOf(blob);
    // Checked again after every await, so that the check and inflight.set below are one step.
    while (inflight.has(blob)) {
      await inflight.get(blob)!.catch(() => undefined);
      have = await sizeOf(blob);
    }
    // A blob of the listed size is linked only once its bytes hash to the listed oid: a file of
    // the right size and other content (a torn write, another tool's) is fetched again.
    if (have === f.size && (await hashFile(blob, f.algo)) !== f.etag) {
      fs.rmSync(blob, { force: true });
      have = null;
    }
    if (have === f.size) {
      // Already downloaded (by Vela or huggingface_hub): at most the snapshot link is missing.
      if ((await sizeOf(pointer)) !== f.size) await link(blob, pointer);
      doneBytes += f.size;
      skipped++;
      report(f, i, 'skip');
      continue;
    }
    /** Resolves false when another download of this process finished the blob meanwhile. */
    const fetchBlob = async (): Promise<boolean> => {
      // The size read above and inflight.set below are not one step: another download in this
      // process may have renamed this blob into place (and left inflight) during that read.
      // Hashed right, it is used as is instead of being fetched twice.
      if ((await sizeOf(blob)) === f.size && (await hashFile(blob, f.algo)) === f.etag) return false;
      const partial = `${blob}.incomplete`;
      fs.mkdirSync(path.dirname(blob), { recursive: true });
      report(f, i, 'start', (await sizeOf(partial)) ?? 0);
      for (let attempt = 0; ; attempt++) {
        try {
          await fetchInto({ ...common, repoId, commit, file: f, partial, idleTimeoutMs, onData: (n, fileBytes) => {
            transferredBytes += n;
            report(f, i, 'data', fileBytes);
          } });
          break;
        } catch (e) {
          if (e instanceof RangeIgnored || rangeIgnored) {
            rangeIgnored = false;
            fs.truncateSync(partial, 0);
            if (attempt < retries) continue;
            throw new ModelError('network', `${what(f.path)}: the server ignores Range requests (answers the whole file to bytes=N-), so a broken transfer cannot resume`);
          }
          if (e instanceof ModelError && e.code !== 'network') throw e;
          const broke = e instanceof ModelError || !(e instanceof HubApiError) || e.statusCode >= 500;
          if (!broke) fail(e, f.path);
          const kept = (await sizeOf(partial)) ?? 0;
          if (attempt >= retries) {
            const base = e instanceof ModelError ? e.message : toModelError(e, refusal, { repoId, revision, endpoint, token, what: what(f.path) }).message;
            throw new ModelError('network', `${base}; ${kept} of ${f.size} bytes of ${f.path} are kept in the cache: run the same command again to resume`);
          }
          report(f, i, 'retry', kept);
          await new Promise((r) => setTimeout(r, Math.min(8000, 250 * 2 ** attempt)));
        }
      }
      const size = (await sizeOf(partial)) ?? 0;
      if (size !== f.size) {
        fs.rmSync(partial, { force: true });
        throw new ModelError('integrity', `${repoId}: ${f.path}: downloaded ${size} bytes; the hub's list says ${f.size}. The bytes were discarded, not saved in the cache; run again to retry`);
      }
      const got = await hashFile(partial, f.algo);
      if (got !== f.etag) {
        fs.rmSync(partial, { force: true });
        throw new ModelError('integrity', `${repoId}: ${f.path}: ${f.algo === 'sha256' ? 'SHA-256' : 'git blob SHA-1'} of the downloaded bytes is ${got}; the hub's list says ${f.etag}. The file was discarded, not saved in the cache`);
      }
      fs.renameSync(partial, blob);
      return true;
    };
    const job = fetchBlob();
    inflight.set(blob, job);
    let fetched: boolean;
    try {
      fetched = await job;
    } finally {
      inflight.delete(blob);
    }
    await link(blob, pointer);
    doneBytes += f.size;
    if (!fetched) skipped++;
    report(f, i, fetched ? 'done' : 'skip');
  }
  return { commit, snapshot, files: wanted.length, totalBytes, transferredBytes, skipped };
}

/** `snapshots/<commit>/<path> -> ../../blobs/<etag>` (relative, as huggingface_hub links it). */
async function link(blob: string, pointer: string): Promise<void> {
  await fs.promises.mkdir(path.dirname(pointer), { recursive: true });
  // Unique per call: two downloads in this process may link the same file at once.
  const tmp = `${pointer}.${process.pid}.${crypto.randomBytes(4).toString('hex')}.tmp`;
  await fs.promises.symlink(path.relative(path.dirname(pointer), blob), tmp);
  await fs.promises.rename(tmp, pointer);
}

