/**
 * Downloads a model repository from the Hugging Face Hub into the Hugging Face cache
 * (hf-cache.ts), through the one Hub client (server/hub/client.ts: @huggingface/hub, resume,
 * size cap, hash check, idle timeout, progress; the same code as dataset downloads). What is
 * here is the cache layout as huggingface_hub writes it, and the models layer's words:
 * - `refs/<revision>` (the commit) before any file, so a later run finds the commit even if this
 *   one stops;
 * - bytes in `blobs/<etag>.incomplete` (huggingface_hub's name for it), renamed into
 *   `blobs/<etag>` once checked; a blob of the listed size is used only once it hashes right;
 * - `snapshots/<commit>/<path> -> ../../blobs/<etag>` (relative links);
 * - errors as ModelError (hub-errors.ts tells a gated repository from a private or missing one).
 * It must not import server/hub/download.ts (the dataset layout) nor be imported by server/hub.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { downloadRepo, hashFile, sizeOf, type DownloadProgress, type Layout, type Voice } from '../hub/client.ts';
import { ModelError } from './errors.ts';
import { modelRepoFolder } from './hf-cache.ts';
import { toModelError } from './hub-errors.ts';

export type { DownloadProgress } from '../hub/client.ts';
export { globToRegExp } from '../hub/client.ts';

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
 * Downloads every file of a model repository at a revision (or those matching `include`) into
 * the Hugging Face cache; files already there (a blob of the listed size under the listed hash)
 * are not fetched again, only linked into the snapshot.
 * @throws ModelError: `bad_argument` (repo id, revision, token not `hf_...`, include matches nothing),
 *   `not_found` (repository, revision or file), `unauthorized` (token refused, or private),
 *   `gated` (licence not accepted: the fix is in the message), `network` (after the retries; the
 *   bytes so far stay in `blobs/<etag>.incomplete` for the next run), `integrity` (size or hash
 *   differs from the hub's list: the bytes are deleted; or the hub's answers do not fit its list).
 */
export async function downloadModel(opts: ModelDownloadOptions): Promise<ModelDownloadResult> {
  const { repoId } = opts;
  const revision = opts.revision ?? 'main';
  const endpoint = (opts.endpoint ?? 'https://huggingface.co').replace(/\/+$/, '');
  const token = opts.token || undefined;
  const what = `${repoId}${revision === 'main' ? '' : `@${revision}`}`;
  const voice: Voice = {
    revision: what,
    listing: what,
    file: (p) => `${repoId}: ${p}`,
    where: ' in the cache',
    example: 'lerobot/pi05_base',
    error: (code, message) => new ModelError(code === 'bad_answer' ? 'integrity' : code, message),
    refused: (e, refusal, w) => toModelError(e, refusal, { repoId, revision, endpoint, token, what: w }),
  };
  const repoDir = modelRepoFolder(opts.cacheDir, repoId);
  let snapshot = '';
  const r = await downloadRepo({ ...opts, type: 'model' }, voice, (commit) => {
    snapshot = path.join(repoDir, 'snapshots', commit);
    // The ref first, as huggingface_hub does: a later run finds the commit even if this one stops.
    if (revision !== commit) {
      const ref = path.join(repoDir, 'refs', ...revision.split('/'));
      fs.mkdirSync(path.dirname(ref), { recursive: true });
      const tmp = `${ref}.${process.pid}.tmp`;
      fs.writeFileSync(tmp, commit);
      fs.renameSync(tmp, ref);
    }
    return cacheLayout(repoDir, snapshot);
  });
  return { ...r, snapshot };
}

/** The Hugging Face cache's blobs and snapshot links (see the module comment). */
function cacheLayout(repoDir: string, snapshot: string): Layout {
  const blobOf = (etag: string) => path.join(repoDir, 'blobs', etag);
  return {
    partial: (f) => `${blobOf(f.etag)}.incomplete`,
    // A blob of the listed size is linked only once its bytes hash to the listed oid: a file of
    // the right size and other content (a torn write, another tool's) is fetched again.
    present: async (f) => {
      const blob = blobOf(f.etag);
      if ((await sizeOf(blob)) !== f.size) return false;
      if ((await hashFile(blob, f.algo)) === f.etag) return true;
      fs.rmSync(blob, { force: true });
      return false;
    },
    place: async (f, partial) => fs.promises.rename(partial, blobOf(f.etag)),
    // Already downloaded (by Vela or huggingface_hub): at most the snapshot link is missing.
    keep: async (f) => {
      const pointer = path.join(snapshot, ...f.path.split('/'));
      const target = path.relative(path.dirname(pointer), blobOf(f.etag));
      if ((await fs.promises.readlink(pointer).catch(() => null)) === target) return;
      await fs.promises.mkdir(path.dirname(pointer), { recursive: true });
      // Unique per call: two downloads in this process may link the same file at once.
      const tmp = `${pointer}.${process.pid}.${crypto.randomBytes(4).toString('hex')}.tmp`;
      await fs.promises.symlink(target, tmp);
      await fs.promises.rename(tmp, pointer);
    },
  };
}
