/**
 * Downloads a dataset repository from the Hugging Face Hub into a local folder, the way
 * huggingface_hub's `snapshot_download(repo_type="dataset", local_dir=...)` does for LeRobot
 * (`$HF_LEROBOT_HOME/<repo_id>`), through the one Hub client (client.ts: @huggingface/hub with
 * repo type `dataset`, resume, size cap, hash check, idle timeout, progress; the same code as
 * model downloads). Every request names the commit the revision points at, so a push
 * mid-download cannot mix two versions. What is here is LeRobot's local-folder layout and the
 * dataset layer's words:
 * - bytes in `.cache/huggingface/download/<path>.<hash>.incomplete` (named by the expected hash,
 *   so a changed file never resumes another version's bytes), renamed to `<path>` once checked;
 * - done files get huggingface_hub's metadata file (`.cache/huggingface/download/<path>.metadata`:
 *   commit, etag, timestamp), so a rerun skips them without rehashing and huggingface_hub
 *   recognises the folder too;
 * - errors as HubError.
 * It must not import server/models (the Hugging Face cache layout and ModelError are theirs).
 */
import fs from 'node:fs';
import path from 'node:path';
import { HubApiError } from '@huggingface/hub';
import { downloadRepo, hashFile, type ClientErrorCode, type DownloadProgress, type Layout, type TreeFile, type Voice } from './client.ts';

export type { DownloadProgress } from './client.ts';

export type HubErrorCode = ClientErrorCode | 'unauthorized' | 'http';

/** A download that cannot go on; the message names the repository or the file and the values seen. */
export class HubError extends Error {
  constructor(readonly code: HubErrorCode, message: string) {
    super(message);
    this.name = 'HubError';
  }
}

export interface DownloadOptions {
  /** `namespace/name` (e.g. `lerobot/pusht`). */
  repoId: string;
  /** Branch, tag or commit; default `main`. */
  revision?: string;
  /** Default `https://huggingface.co`. */
  endpoint?: string;
  /** Sent as `Authorization: Bearer <token>` (private or gated datasets); a Hugging Face token starts with `hf_`. */
  token?: string | null;
  /** The local folder that receives the files (e.g. `$HF_LEROBOT_HOME/<repo_id>`). */
  dest: string;
  /** Resumed attempts per file after a cut connection or a 5xx; default 3. */
  retries?: number;
  /** A silent request or transfer is broken off (and resumed) after this long; default 60 000 ms. */
  idleTimeoutMs?: number;
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

/**
 * Downloads every file of a dataset repository at a revision into `opts.dest`.
 * @throws HubError: `bad_argument` (repo id, revision, token), `not_found` / `unauthorized`
 *   (repository or revision), `network` / `http` (after the retries; partial bytes are kept for
 *   the next run), `integrity` (size or hash differs from the hub's list: the bytes are
 *   discarded), `bad_answer` (the hub's answer does not fit its API or its own list).
 */
export async function downloadDataset(opts: DownloadOptions): Promise<DownloadResult> {
  const { repoId } = opts;
  const revision = opts.revision ?? 'main';
  const endpoint = (opts.endpoint ?? 'https://huggingface.co').replace(/\/+$/, '');
  const token = opts.token || null;
  const voice: Voice = {
    revision: `dataset ${repoId} at revision ${revision}`,
    listing: `the file list of ${repoId}`,
    file: (p) => p,
    where: '',
    example: 'lerobot/pusht',
    error: (code, message) => new HubError(code, message),
    refused: (e, refusal, what) => {
      if (!(e instanceof HubApiError)) {
        const err = e as Error & { cause?: Error };
        return new HubError('network', `${what}: cannot reach ${new URL(endpoint).origin} (${err.cause?.message ?? err.message})`);
      }
      const data = e.data as { error?: unknown; message?: unknown } | undefined;
      const detail = (typeof data?.error === 'string' ? data.error : typeof data?.message === 'string' ? data.message : e.message.replace(/\. URL: .*$/, '')).slice(0, 200);
      const status = e.statusCode;
      if (status === 401 || status === 403) {
        return new HubError('unauthorized', `${what}: the hub answered ${status}${detail ? ` (${detail})` : ''}; the dataset "${repoId}" is private, gated or does not exist${token ? ' for this token' : ': set HF_TOKEN (or --token) if you have access'}`);
      }
      const errorCode = refusal?.status === status ? refusal.errorCode : null;
      if (status === 404) return new HubError('not_found', `${what}: not found on ${endpoint} (${errorCode ?? (detail || '404')})`);
      return new HubError('http', `${what}: the hub answered ${status}${detail ? ` (${detail})` : ''}`);
    },
  };
  return downloadRepo({ ...opts, type: 'dataset', endpoint, token }, voice, (commit) => localDirLayout(opts.dest, commit));
}

/** LeRobot's (huggingface_hub's `local_dir`) layout: see the module comment. */
function localDirLayout(dest: string, commit: string): Layout {
  const metaRoot = path.join(dest, '.cache', 'huggingface', 'download');
  const target = (f: TreeFile) => path.join(dest, ...f.path.split('/'));
  const metaFile = (f: TreeFile) => path.join(metaRoot, ...f.path.split('/')) + '.metadata';
  return {
    partial: (f) => path.join(metaRoot, ...f.path.split('/')) + `.${f.etag}.incomplete`,
    // Its metadata names the same hash and it was not modified since, or its bytes hash right.
    present: async (f) => {
      const st = await fs.promises.stat(target(f)).catch(() => null);
      if (!st || st.size !== f.size) return false;
      const [, etag, ts] = (await fs.promises.readFile(metaFile(f), 'utf8').catch(() => '')).split('\n');
      if (etag === f.etag && st.mtimeMs / 1000 - 1 <= Number(ts)) return true;
      return (await hashFile(target(f), f.algo)) === f.etag;
    },
    place: async (f, partial) => {
      await fs.promises.mkdir(path.dirname(target(f)), { recursive: true });
      await fs.promises.rename(partial, target(f));
    },
    keep: async (f) => {
      await fs.promises.mkdir(path.dirname(metaFile(f)), { recursive: true });
      await fs.promises.writeFile(metaFile(f), `${commit}\n${f.etag}\n${Date.now() / 1000}\n`);
    },
  };
}
