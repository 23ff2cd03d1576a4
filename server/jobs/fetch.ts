/**
 * What a fine-tune may download when the operator allows it (`--allow-downloads`): a dataset named
 * by its Hub id that is not under the datasets root (server/hub/download.ts), and the base
 * checkpoint (server/models/resolve.ts resolveBase). Progress goes into the job's durable events
 * as `log` records with a `download` object, at most one a second per file besides each file's
 * start and end.
 *
 * A dataset is fetched into `<root>/.downloads/<namespace>/<name>` (a hidden folder is never a
 * dataset, so a half-fetched one is never trained on or listed) and renamed to
 * `<root>/<namespace>/<name>` once every file is checked; an interrupted fetch resumes there.
 */
import fs from 'node:fs';
import path from 'node:path';
import { downloadDataset, type DownloadProgress } from '../hub/download.ts';

/** A Hub repository id `namespace/name` (what a download can fetch), not a path. */
export const HUB_DATASET_ID = /^[A-Za-z0-9][\w.-]*\/[A-Za-z0-9][\w.-]*$/;

/** Whether `name` names a Hub dataset (`namespace/name`, no `..`). */
export function isHubDatasetId(name: string): boolean {
  return HUB_DATASET_ID.test(name) && !name.includes('..');
}

/** Minimum time between two `data` progress records of one file (ms). */
const PROGRESS_EVERY_MS = 1000;

/** The `download` object of a progress record (bytes; what SSE readers get). */
export function downloadRecord(what: string, p: DownloadProgress): Record<string, unknown> {
  const mb = (n: number) => (n / 1e6).toFixed(1);
  return {
    message: `downloading ${what}: ${p.fileIndex}/${p.files} files, ${mb(p.doneBytes)}/${mb(p.totalBytes)} MB (${p.file}${p.phase === 'skip' ? ', already here' : p.phase === 'retry' ? ', connection broke: resuming' : ''})`,
    stage: 'download',
    download: { repo_id: what, file: p.file, file_index: p.fileIndex, files: p.files, done_bytes: p.doneBytes, total_bytes: p.totalBytes, phase: p.phase },
  };
}

/** A progress callback that emits a record per file start / end and at most one a second in between. */
export function throttledProgress(what: string, emit: (data: Record<string, unknown>) => void): (p: DownloadProgress) => void {
  let last = 0;
  return (p) => {
    const now = Date.now();
    if (p.phase === 'data' && now - last < PROGRESS_EVERY_MS) return;
    last = now;
    emit(downloadRecord(what, p));
  };
}

/** One fetch per dataset at a time in this process: a second job on it waits for the first. */
const inFlight = new Map<string, Promise<string>>();

/**
 * Fetches Hub dataset `repoId` under `root` (see the module comment) and returns its folder.
 * @throws HubError (download.ts) naming the repository or file: not found, unauthorized, network
 *   (partial bytes kept for the next try), integrity.
 */
export function fetchDataset(root: string, repoId: string, opts: { endpoint?: string; token?: string | null; emit: (data: Record<string, unknown>) => void }): Promise<string> {
  const dest = path.resolve(root, ...repoId.split('/'));
  let p = inFlight.get(dest);
  if (!p) {
    p = (async () => {
      if (fs.existsSync(path.join(dest, 'meta', 'info.json'))) return dest;
      const staging = path.resolve(root, '.downloads', ...repoId.split('/'));
      const r = await downloadDataset({ repoId, dest: staging, endpoint: opts.endpoint, token: opts.token, onProgress: throttledProgress(repoId, opts.emit) });
      await fs.promises.mkdir(path.dirname(dest), { recursive: true });
      await fs.promises.rename(staging, dest);
      opts.emit({ message: `downloaded ${repoId} at commit ${r.commit}: ${r.files} files, ${(r.totalBytes / 1e6).toFixed(1)} MB (${(r.transferredBytes / 1e6).toFixed(1)} MB fetched)`, stage: 'download' });
      return dest;
    })();
    inFlight.set(dest, p);
    void p.finally(() => inFlight.delete(dest)).catch(() => undefined);
  }
  return p;
}
