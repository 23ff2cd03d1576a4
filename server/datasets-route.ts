/**
 * `PUT /v1/datasets/{name}`: a LeRobot dataset uploaded as a tar, tar.gz or zip of its folder,
 * streamed to disk (never held in memory; `--max-dataset-bytes`), extracted, validated like any
 * dataset and installed as `<datasets root>/<name>` (datasets/upload.ts), so that a fine-tune's
 * `dataset_name` can name it. Answers `{"name", "dataset_name", "episodes", "frames", "bytes",
 * "sha256", "reused"}`. The sidecar's `job_start` `dataset_content` takes the same path.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import type { TemplatedApp } from 'uWebSockets.js';
import { requireOwner } from './auth.ts';
import { route, sendJson } from './http.ts';
import { openDataset } from './datasets/index.ts';
import { checkDatasetName, installDataset, type InstallResult } from './datasets/upload.ts';
import type { ServerConfig } from './config.ts';
import type { Store } from './store.ts';

/** Opens and checks a dataset folder: the validation of every fine-tune, before any work. */
export async function validateDataset(dir: string): Promise<{ episodes: number; frames: number }> {
  const ds = await openDataset(dir);
  await ds.checkVideos();
  return { episodes: ds.meta.episodes.length, frames: ds.meta.totalFrames };
}

/** Install `archive` (a file; removed afterwards) as dataset `name` of `owner`. */
export async function installArchive(config: ServerConfig, owner: string, name: string, archive: string): Promise<InstallResult> {
  try {
    return await installDataset({ root: path.resolve(config.datasetsDir), name, archive, owner, maxBytes: config.maxDatasetBytes, validate: validateDataset });
  } finally {
    await fs.promises.rm(archive, { force: true }); // asynchronous: unlinking gigabytes takes a while
  }
}

/** A fresh temporary file name for an archive, beside the datasets (same filesystem as the install). */
export function archiveTemp(config: ServerConfig, name: string): string {
  const root = path.resolve(config.datasetsDir);
  fs.mkdirSync(root, { recursive: true });
  return path.join(root, `.${name}.archive-${crypto.randomBytes(4).toString('hex')}`);
}

export function mountDatasetUpload(app: TemplatedApp, deps: { store: Store; config: ServerConfig }): void {
  const { config } = deps;
  app.put('/v1/datasets/:name', route(1, async (r) => {
    const owner = await requireOwner(deps.store, r);
    const name = checkDatasetName(r.params[0], 'name');
    const file = archiveTemp(config, name);
    await r.bodyToFile(file, config.maxDatasetBytes);
    const result = await installArchive(config, owner, name, file);
    sendJson(r, 200, { name, dataset_name: name, episodes: result.episodes, frames: result.frames, bytes: result.bytes, extracted_bytes: result.extracted_bytes, files: result.files, sha256: result.sha256, reused: result.reused });
  }));
}
