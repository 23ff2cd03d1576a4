/**
 * `GET /v1/datasets`: what a key may name, its uploads (from their markers) then the shared
 * datasets (the operator's folders, at the top of the root or one level down as LeRobot's cache
 * keeps `org/name`), with their sizes, episodes and frames. Walked without blocking (only the
 * small markers are read synchronously); a shared folder's size is walked once per change of
 * its info.json.
 */
import fs from 'node:fs';
import path from 'node:path';
import { folderBytesAsync, ownUploads, readMarker } from './owned.ts';

/** One dataset a key may name, as `GET /v1/datasets` lists it. */
export interface DatasetEntry {
  name: string;
  /** Bytes of its files on disk. */
  bytes: number;
  episodes: number | null;
  frames: number | null;
  /** Unix seconds; null for a shared dataset (it was not uploaded). */
  uploaded_at: number | null;
  shared: boolean;
}

/** Episodes and frames from `meta/info.json` (null where it cannot be read). */
async function counts(dir: string): Promise<{ episodes: number | null; frames: number | null }> {
  try {
    const info = JSON.parse(await fs.promises.readFile(path.join(dir, 'meta', 'info.json'), 'utf8'));
    const n = (v: unknown) => (typeof v === 'number' && Number.isFinite(v) ? v : null);
    return { episodes: n(info.total_episodes), frames: n(info.total_frames) };
  } catch {
    return { episodes: null, frames: null };
  }
}

/** Sizes of shared folders, by folder and the mtime of its info.json: a listing does not re-walk them. */
const sharedBytes = new Map<string, { mtimeMs: number; bytes: number }>();

async function sharedSize(dir: string): Promise<number> {
  const mtimeMs = (await fs.promises.stat(path.join(dir, 'meta', 'info.json'))).mtimeMs;
  const hit = sharedBytes.get(dir);
  if (hit && hit.mtimeMs === mtimeMs) return hit.bytes;
  const bytes = await folderBytesAsync(dir);
  sharedBytes.set(dir, { mtimeMs, bytes });
  return bytes;
}

/** The shared datasets under `root`: folders with meta/info.json, at the top or one level down (`org/name`, LeRobot's cache). */
async function sharedNames(root: string): Promise<string[]> {
  const out: string[] = [];
  const visit = async (rel: string, depth: number) => {
    const dir = path.join(root, rel);
    if (rel && (await fs.promises.access(path.join(dir, 'meta', 'info.json')).then(() => true, () => false))) {
      if (!readMarker(dir)) out.push(rel.split(path.sep).join('/'));
      return;
    }
    if (depth === 2) return;
    const entries = await fs.promises.readdir(dir, { withFileTypes: true }).catch(() => []);
    for (const e of entries) if (e.isDirectory() && !e.name.startsWith('.')) await visit(path.join(rel, e.name), depth + 1);
  };
  await visit('', 0);
  return out.sort();
}

/** What `owner` may name: its uploads (name order), then the shared datasets (name order). */
export async function listDatasets(root: string, owner: string): Promise<DatasetEntry[]> {
  const base = path.resolve(root);
  const own: DatasetEntry[] = [];
  for (const u of ownUploads(base, owner)) {
    own.push({ name: u.name, bytes: typeof u.marker.extracted_bytes === 'number' ? u.marker.extracted_bytes : await folderBytesAsync(u.dir), ...(await counts(u.dir)), uploaded_at: u.marker.uploaded_at ?? null, shared: false });
  }
  const shared: DatasetEntry[] = [];
  for (const name of await sharedNames(base)) {
    const dir = path.join(base, ...name.split('/'));
    const size = await sharedSize(dir).catch(() => null);
    if (size !== null) shared.push({ name, bytes: size, ...(await counts(dir)), uploaded_at: null, shared: true });
  }
  return [...own, ...shared];
}
