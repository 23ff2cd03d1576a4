/**
 * Who may name which dataset (issue 22). An uploaded dataset belongs to the key that sent it and
 * lives in that key's own folder, `<datasets root>/.uploads/<owner hash>/<name>`: two keys may
 * upload the same name, and no answer tells a key whether another one has it. The folders the
 * operator put under the root by hand (never uploaded) are shared: every key reads them. A key's
 * own upload wins over a shared folder of the same name. Hidden folders under the root (the
 * uploads, temporaries, caches) are never a dataset, whatever path names them.
 *
 * Also here: the per-key byte quota of uploads (extracted bytes, `--datasets-per-key-bytes`).
 * The listing of what a key may name is datasets/listing.ts.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { HttpError } from '../http/http.ts';
import { resolveDatasetDir } from '../jobs/config.ts';
import { DATASET_NAME, UPLOAD_MARKER } from './upload.ts';

/** The folder of every key's uploads, under the datasets root. */
export const UPLOADS_DIR = '.uploads';

/** What an upload's marker records (datasets/upload.ts writes it). */
export interface UploadMarker {
  owner: string;
  sha256: string;
  /** The archive's size, bytes. */
  bytes: number;
  /** The installed folder's size, bytes (absent in markers written before issue 22: then walked). */
  extracted_bytes?: number;
  /** Unix seconds. */
  uploaded_at: number;
}

/** The folder of `owner`'s uploads: a hash of the owner id, so paths carry no key id. */
export function ownerUploadsDir(root: string, owner: string): string {
  return path.join(path.resolve(root), UPLOADS_DIR, crypto.createHash('sha256').update(owner).digest('hex').slice(0, 16));
}

/** The upload marker of `dir`, or null when there is none (the folder was not uploaded). */
export function readMarker(dir: string): UploadMarker | null {
  try {
    const m = JSON.parse(fs.readFileSync(path.join(dir, UPLOAD_MARKER), 'utf8'));
    return m && typeof m === 'object' ? m : null;
  } catch {
    return null;
  }
}

/** `dir` is `parent` or inside it (both resolved). */
function inside(dir: string, parent: string): boolean {
  return dir === parent || dir.startsWith(parent + path.sep);
}

/** `p` with symlinks resolved, when it exists. */
function real(p: string): string {
  try {
    return fs.realpathSync(p);
  } catch {
    return path.resolve(p);
  }
}

/** The folder of a shared dataset `name` (operator-placed, under the root or absolute), or null when there is none. */
function sharedDir(root: string, name: string, allowAbsolute: boolean, field: string): string | null {
  const dir = resolveDatasetDir(name, root, allowAbsolute, field); // 400 for `..`, or an absolute path not allowed
  if (!fs.existsSync(dir)) return null;
  // Hidden folders under the root are the server's (uploads, temporaries) or tools' caches;
  // the real path also catches an absolute path or a link that leads into them.
  const base = real(root);
  const at = real(dir);
  if (inside(at, base) && path.relative(base, at).split(path.sep).some((s) => s.startsWith('.'))) return null;
  // An upload left at the root by an older Vela (before per-key folders) is its key's, not shared.
  if (readMarker(dir)) return null;
  return dir;
}

/**
 * The folder that dataset `name` means for key `owner`: its own upload of that name, else the
 * operator's shared folder; null when neither exists (another key's upload is not seen).
 * @throws HttpError 400 (naming `field`) for `..` segments or an absolute path the operator did not allow.
 */
export function datasetDirFor(config: { datasetsDir: string; allowAbsoluteDatasets: boolean }, owner: string, name: string, field = 'dataset_name'): string | null {
  if (DATASET_NAME.test(name)) {
    const own = path.join(ownerUploadsDir(config.datasetsDir, owner), name);
    if (readMarker(own)?.owner === owner) return own;
  }
  return sharedDir(path.resolve(config.datasetsDir), name, config.allowAbsoluteDatasets, field);
}

/** A shared folder (the operator's, not uploaded) holds `name` directly under the root. */
export function isSharedName(root: string, name: string): boolean {
  const dir = path.join(path.resolve(root), name);
  return fs.existsSync(dir) && !readMarker(dir);
}

/** Bytes of every file under `dir`, read without blocking (0 when it does not exist). */
export async function folderBytesAsync(dir: string): Promise<number> {
  let total = 0;
  let entries: fs.Dirent[];
  try {
    entries = await fs.promises.readdir(dir, { withFileTypes: true });
  } catch {
    return 0;
  }
  for (const e of entries) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) total += await folderBytesAsync(p);
    else if (e.isFile()) total += (await fs.promises.stat(p).catch(() => ({ size: 0 }))).size;
  }
  return total;
}

/** One of a key's uploads, from its marker. */
export interface OwnUpload {
  name: string;
  dir: string;
  marker: UploadMarker;
}

/** `owner`'s uploads (name order), read from their markers. Small reads: one marker per upload. */
export function ownUploads(root: string, owner: string): OwnUpload[] {
  const base = ownerUploadsDir(root, owner);
  let names: string[];
  try {
    names = fs.readdirSync(base).filter((n) => DATASET_NAME.test(n)).sort();
  } catch {
    return [];
  }
  const out: OwnUpload[] = [];
  for (const name of names) {
    const marker = readMarker(path.join(base, name));
    if (marker?.owner === owner) out.push({ name, dir: path.join(base, name), marker });
  }
  return out;
}

/** Bytes an upload counts for in its key's quota: its extracted size. */
function uploadBytes(u: OwnUpload): number {
  return typeof u.marker.extracted_bytes === 'number' ? u.marker.extracted_bytes : 0;
}

/** Bytes admitted for installs in progress, per owner: counted before they land on disk. */
const reserved = new Map<string, number>();

/** Bytes `owner`'s uploads hold now, plus those of its installs in progress; `replacing`'s own are left out. */
export function quotaUsed(root: string, owner: string, replacing: string | null = null): number {
  const onDisk = ownUploads(root, owner).filter((u) => u.name !== replacing).reduce((s, u) => s + uploadBytes(u), 0);
  return onDisk + (reserved.get(owner) ?? 0);
}

/**
 * Admit `extractedBytes` of a new upload `name` of `owner` against `limitBytes` (a replaced
 * upload of the same name counts as freed), reserving them until the returned release is called
 * (once the install ended, installed or not). Check and reservation are one synchronous step, so
 * concurrent uploads of one key cannot both pass.
 * @throws HttpError 413 naming the key's usage, the limit and the upload's bytes.
 */
export function admitUpload(root: string, owner: string, name: string, extractedBytes: number, limitBytes: number): () => void {
  const used = quotaUsed(root, owner, name);
  if (used + extractedBytes > limitBytes) throw quotaError(name, used, limitBytes, extractedBytes);
  reserved.set(owner, (reserved.get(owner) ?? 0) + extractedBytes);
  let released = false;
  return () => {
    if (released) return;
    released = true;
    const left = (reserved.get(owner) ?? 0) - extractedBytes;
    if (left > 0) reserved.set(owner, left);
    else reserved.delete(owner);
  };
}

/** The 413 of a key over its uploads quota; `bytes` null when the upload's size is not known yet. */
export function quotaError(name: string, usedBytes: number, limitBytes: number, bytes: number | null): HttpError {
  const what = bytes === null ? `dataset "${name}" cannot be stored` : `dataset "${name}" extracts to ${bytes} bytes`;
  return new HttpError(413, `${what}; this key's uploads use ${usedBytes} of its ${limitBytes} bytes (--datasets-per-key-bytes): delete one (DELETE /v1/datasets/{name}) first`);
}
