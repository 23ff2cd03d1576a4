/**
 * The datasets root at server start: temporaries that an upload interrupted by a crash left
 * (partial archives, extraction folders, replaced folders not yet removed) are removed, and
 * uploads that an older Vela installed at the root itself are moved into their key's folder
 * (datasets/owned.ts), so they stay their key's and never become shared.
 *
 * Temporaries are recognised by name: at the root only `.<name>.{archive,upload,old}-<8 hex>`
 * (what older Velas wrote there; the operator's own hidden folders are left alone); in a key's
 * uploads folder every hidden entry (uploads themselves are never hidden).
 */
import fs from 'node:fs';
import path from 'node:path';
import { DATASET_NAME, UPLOAD_MARKER } from './upload.ts';
import { folderBytesAsync, ownerUploadsDir, readMarker, UPLOADS_DIR } from './owned.ts';

const ROOT_TEMPORARY = /^\.[A-Za-z0-9][A-Za-z0-9._-]{0,127}\.(archive|upload|old)-[0-9a-f]{8}$/;

/** What a start-up sweep of the datasets root did (sweepDatasetsRoot). */
export interface SweepResult {
  /** Temporaries removed, and the bytes they held. */
  temporaries: number;
  bytes: number;
  /** Uploads moved from the root into their key's folder. */
  moved: number;
  /** Root uploads left where they are (their key already has an upload of that name, or the move failed): names. */
  notMoved: string[];
}

/** Remove `p` (file or folder) unless it changed within `minAgeS`; @returns its bytes, or null when kept. */
async function removeStale(p: string, minAgeS: number, nowMs: number): Promise<number | null> {
  const st = await fs.promises.lstat(p).catch(() => null);
  if (!st || nowMs - st.mtimeMs < minAgeS * 1000) return null;
  const bytes = st.isDirectory() ? await folderBytesAsync(p) : st.size;
  await fs.promises.rm(p, { recursive: true, force: true });
  return bytes;
}

/**
 * Sweep the datasets `root` (see the module comment). Creates nothing when there is nothing to do.
 * @param minAgeS temporaries changed more recently than this are kept: 0 on a single node; a
 *   cluster whose nodes share the root passes more, so a start never removes another node's
 *   upload in progress.
 */
export async function sweepDatasetsRoot(root: string, minAgeS: number): Promise<SweepResult> {
  const out: SweepResult = { temporaries: 0, bytes: 0, moved: 0, notMoved: [] };
  const base = path.resolve(root);
  const nowMs = Date.now();
  const top = await fs.promises.readdir(base, { withFileTypes: true }).catch(() => []);
  const take = (bytes: number | null) => {
    if (bytes === null) return;
    out.temporaries++;
    out.bytes += bytes;
  };
  for (const e of top) {
    if (ROOT_TEMPORARY.test(e.name)) take(await removeStale(path.join(base, e.name), minAgeS, nowMs));
  }
  for (const e of top) {
    if (!e.isDirectory() || !DATASET_NAME.test(e.name)) continue;
    const dir = path.join(base, e.name);
    const marker = readMarker(dir);
    if (!marker || typeof marker.owner !== 'string') continue;
    const target = path.join(ownerUploadsDir(base, marker.owner), e.name);
    if (fs.existsSync(target)) {
      out.notMoved.push(e.name);
      continue;
    }
    try {
      // Older markers lack the extracted size, which the key's quota counts.
      if (typeof marker.extracted_bytes !== 'number') {
        const withSize = { ...marker, extracted_bytes: (await folderBytesAsync(dir)) - (await fs.promises.stat(path.join(dir, UPLOAD_MARKER))).size };
        const tmp = path.join(dir, `${UPLOAD_MARKER}.tmp`);
        await fs.promises.writeFile(tmp, JSON.stringify(withSize, null, 2) + '\n');
        await fs.promises.rename(tmp, path.join(dir, UPLOAD_MARKER));
      }
      await fs.promises.mkdir(path.dirname(target), { recursive: true });
      await fs.promises.rename(dir, target);
      out.moved++;
    } catch (err) {
      // Another node sharing the root may have moved it first: the start goes on.
      if (fs.existsSync(dir)) out.notMoved.push(`${e.name} (${(err as Error).message})`);
    }
  }
  const uploads = path.join(base, UPLOADS_DIR);
  for (const owner of await fs.promises.readdir(uploads, { withFileTypes: true }).catch(() => [])) {
    if (!owner.isDirectory()) continue;
    for (const e of await fs.promises.readdir(path.join(uploads, owner.name)).catch(() => [])) {
      if (e.startsWith('.')) take(await removeStale(path.join(uploads, owner.name, e), minAgeS, nowMs));
    }
  }
  return out;
}
