/**
 * The datasets routes. `PUT /v1/datasets/{name}`: a LeRobot dataset uploaded as a tar, tar.gz or
 * zip of its folder, streamed to disk (never held in memory; `--max-dataset-bytes`), extracted,
 * validated like any dataset and installed in the key's own folder (datasets/upload.ts,
 * datasets/owned.ts), so that the key's fine-tunes can name it as `dataset_name`. Answers
 * `{"name", "dataset_name", "episodes", "frames", "bytes", "sha256", "reused"}`. The sidecar's
 * `job_start` `dataset_content` takes the same path. `GET /v1/datasets` lists what the key may
 * name (its uploads, then the shared datasets); `DELETE /v1/datasets/{name}` removes one of its
 * uploads. The key's uploads together hold at most `--datasets-per-key-bytes` (extracted).
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import type { TemplatedApp } from 'uWebSockets.js';
import { requireOwner } from '../http/auth.ts';
import { HttpError, route, sendJson } from '../http/http.ts';
import { log } from '../log.ts';
import { openDataset } from './index.ts';
import { checkDatasetName, installDataset, type InstallResult } from './upload.ts';
import { listDatasets } from './listing.ts';
import { admitUpload, isSharedName, ownerUploadsDir, ownUploads, quotaError, quotaUsed, readMarker } from './owned.ts';
import { sweepDatasetsRoot } from './sweep.ts';
import type { ServerConfig } from '../config.ts';
import type { Store } from '../store/store.ts';

/** Opens and checks a dataset folder: the validation of every fine-tune, before any work. */
export async function validateDataset(dir: string): Promise<{ episodes: number; frames: number }> {
  const ds = await openDataset(dir);
  await ds.checkVideos();
  return { episodes: ds.meta.episodes.length, frames: ds.meta.totalFrames };
}

/**
 * Refuse, before any body is read, an upload that cannot be stored: `name` is a shared dataset's
 * (the operator's, readable by every key: it is not secret), or the key has no byte left.
 * @throws HttpError 409 (shared name), 413 (quota).
 */
export function checkUploadable(config: ServerConfig, owner: string, name: string): void {
  if (isSharedName(config.datasetsDir, name)) throw new HttpError(409, `dataset "${name}" is a shared dataset of this server (the operator's datasets folder); it is never replaced: pick another name`);
  const used = quotaUsed(config.datasetsDir, owner, name);
  if (used >= config.datasetsPerKeyBytes) throw quotaError(name, used, config.datasetsPerKeyBytes, null);
}

/** Uploads of one key at once (PUT /v1/datasets, job_start with a large body): each holds up to --max-dataset-bytes of disk while it lasts. */
export const UPLOADS_PER_KEY = 2;
const uploading = new Map<string, number>();

/**
 * Take one of the key's upload slots, for as long as an upload's body and extraction last.
 * @returns its release (idempotent).
 * @throws HttpError 429 when the key has UPLOADS_PER_KEY uploads in progress.
 */
export function takeUploadSlot(owner: string): () => void {
  const n = uploading.get(owner) ?? 0;
  if (n >= UPLOADS_PER_KEY) throw new HttpError(429, `this key has ${n} uploads in progress, the most at once; wait for one to end, then send this one again`);
  uploading.set(owner, n + 1);
  let released = false;
  return () => {
    if (released) return;
    released = true;
    const left = (uploading.get(owner) ?? 1) - 1;
    if (left > 0) uploading.set(owner, left);
    else uploading.delete(owner);
  };
}

/**
 * Refuse to remove or replace dataset `name` of `owner` while a queued or running job of that
 * key names it (as its dataset or held-out dataset): the job would read another dataset midway.
 * @throws HttpError 409 naming the jobs.
 */
export async function refuseWhileUsed(store: Store, owner: string, name: string, action: 'delete' | 'replace'): Promise<void> {
  const users = (await store.listJobs(owner, ['queued', 'running'])).filter((j) => j.config.dataset_name === name || j.config.eval_dataset === name);
  if (users.length > 0) throw new HttpError(409, `dataset "${name}" is used by fine-tune ${users.map((j) => `${j.id} (${j.status})`).join(', ')}; cancel it or wait for it to end, then ${action === 'delete' ? 'delete' : 'upload the new version (or upload it under another name)'}`);
}

/**
 * Install `archive` (a file; removed afterwards) as dataset `name` of `owner`, in its own folder.
 * @throws HttpError 400 (bad archive), 409 (a shared name; a different archive under a name that a
 *   queued or running job uses), 413 (size, quota).
 */
export async function installArchive(store: Store, config: ServerConfig, owner: string, name: string, archive: string): Promise<InstallResult> {
  let release = () => {};
  try {
    checkUploadable(config, owner, name);
    return await installDataset({
      root: ownerUploadsDir(config.datasetsDir, owner), name, archive, owner, maxBytes: config.maxDatasetBytes, validate: validateDataset,
      admit: (bytes) => (release = admitUpload(config.datasetsDir, owner, name, bytes, config.datasetsPerKeyBytes)),
      beforeReplace: () => refuseWhileUsed(store, owner, name, 'replace'),
      extractCap: () => {
        const used = quotaUsed(config.datasetsDir, owner, name);
        const left = config.datasetsPerKeyBytes - used;
        return { bytes: left, error: () => new HttpError(413, `dataset "${name}" extracts to more than the ${left} bytes left of this key's quota: its uploads use ${used} of its ${config.datasetsPerKeyBytes} bytes (--datasets-per-key-bytes); delete one (DELETE /v1/datasets/{name}) first`) };
      },
    });
  } finally {
    release();
    await fs.promises.rm(archive, { force: true }); // asynchronous: unlinking gigabytes takes a while
  }
}

/** A fresh temporary file name for an archive, in the key's folder (same filesystem as the install). */
export function archiveTemp(config: ServerConfig, owner: string, name: string): string {
  const dir = ownerUploadsDir(config.datasetsDir, owner);
  fs.mkdirSync(dir, { recursive: true });
  return path.join(dir, `.${name}.archive-${crypto.randomBytes(4).toString('hex')}`);
}

/**
 * At start: remove what interrupted uploads left and move uploads of older Velas into their
 * key's folder (datasets/sweep.ts); one log line with the count and bytes removed.
 * @param clustered nodes may share the root: temporaries younger than an hour are kept (another node's upload).
 */
export async function prepareDatasetsRoot(config: ServerConfig, clustered: boolean): Promise<void> {
  const r = await sweepDatasetsRoot(config.datasetsDir, clustered ? 3600 : 0);
  if (r.temporaries > 0) log.info(`datasets: removed ${r.temporaries} stale upload temporar${r.temporaries === 1 ? 'y' : 'ies'} (${r.bytes} bytes) left by an interrupted upload`);
  if (r.moved > 0) log.info(`datasets: moved ${r.moved} upload(s) of an older Vela into their key's folder`);
  if (r.notMoved.length > 0) log.warn(`datasets: upload(s) ${r.notMoved.join(', ')} at the datasets root were left there (their key has an upload of the same name, or the move failed); no key can name them until the operator moves or removes them`);
}

/** Mounts PUT, GET and DELETE of /v1/datasets (see the module comment). */
export function mountDatasetUpload(app: TemplatedApp, deps: { store: Store; config: ServerConfig }): void {
  const { config, store } = deps;
  app.put('/v1/datasets/:name', route(1, async (r) => {
    const owner = await requireOwner(store, r);
    const name = checkDatasetName(r.params[0], 'name');
    checkUploadable(config, owner, name);
    const release = takeUploadSlot(owner);
    let result: InstallResult;
    try {
      const file = archiveTemp(config, owner, name);
      await r.bodyToFile(file, config.maxDatasetBytes);
      result = await installArchive(store, config, owner, name, file);
    } finally {
      release();
    }
    sendJson(r, 200, { name, dataset_name: name, episodes: result.episodes, frames: result.frames, bytes: result.bytes, extracted_bytes: result.extracted_bytes, files: result.files, sha256: result.sha256, reused: result.reused });
  }));

  app.get('/v1/datasets', route(0, async (r) => {
    const owner = await requireOwner(store, r);
    const data = await listDatasets(config.datasetsDir, owner);
    sendJson(r, 200, { object: 'list', data, used_bytes: quotaUsed(config.datasetsDir, owner), limit_bytes: config.datasetsPerKeyBytes });
  }));

  app.del('/v1/datasets/:name', route(1, async (r) => {
    const owner = await requireOwner(store, r);
    const name = checkDatasetName(r.params[0], 'name');
    const upload = ownUploads(config.datasetsDir, owner).find((u) => u.name === name);
    if (!upload) {
      const shared = isSharedName(config.datasetsDir, name) ? ` ("${name}" is a shared dataset: only the operator removes it)` : '';
      throw new HttpError(404, `no dataset "${name}" among this key's uploads${shared}`);
    }
    await refuseWhileUsed(store, owner, name, 'delete');
    // Renamed away first (atomic: no job sees half a folder), then removed without blocking; a
    // crash in between leaves a temporary that the next start sweeps.
    const gone = path.join(path.dirname(upload.dir), `.${name}.old-${crypto.randomBytes(4).toString('hex')}`);
    const bytes = readMarker(upload.dir)?.extracted_bytes ?? null;
    fs.renameSync(upload.dir, gone);
    await fs.promises.rm(gone, { recursive: true, force: true });
    sendJson(r, 200, { name, deleted: true, bytes });
  }));
}
