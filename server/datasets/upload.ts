/**
 * LeRobot datasets sent to the server as an archive (`PUT /v1/datasets/{name}`, the sidecar's
 * `dataset_content`): a tar (optionally gzipped) or a zip of the dataset folder, extracted with
 * node-tar / yauzl into a temporary folder beside the target, checked, validated like any
 * dataset (openDataset + checkVideos), then renamed into `<root>/<name>`, where `root` is the
 * uploading key's own folder (datasets/owned.ts: who may name which dataset).
 *
 * Safety: only regular files and folders (no links, devices or fifos); every path relative, of
 * plain segments (no `..`, no absolute path, no backslash), resolved inside the temporary
 * folder; the archive and its extracted size are capped (`maxBytes`: a tar is extracted in
 * one streaming pass that stops as soon as its headers' sizes or its inflated bytes pass the
 * cap, with gzip inflated off the main thread; zip central-directory sizes are summed entry by
 * entry, and yauzl checks each entry's real size against its declared one). Nothing of an
 * archive is held in memory and nothing runs long on the event loop. A name under the root that was not uploaded (the
 * operator's own dataset) is never replaced; one uploaded by another key neither; the same
 * archive again (same SHA-256) is reused without rewriting.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { pipeline } from 'node:stream/promises';
import zlib from 'node:zlib';
import * as tar from 'tar';
import yauzl from 'yauzl';
import { HttpError } from '../http/http.ts';
import { log } from '../log.ts';

/** A dataset name: one plain path segment. */
export const DATASET_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
/** The marker written into an uploaded dataset: who uploaded which archive, when. */
export const UPLOAD_MARKER = '.vela-upload.json';
const MAX_ENTRIES = 200_000;
/**
 * Folders an archive may make, listed or implied by its files' paths. A LeRobot dataset has a
 * few dozen (meta, data/chunk-NNN, videos/chunk-NNN/CAMERA); a 1.4 MB .tgz of 300,000 empty folders
 * used to pass every other cap, take 1.2 GB of disk and half a GB of the server's memory.
 */
const MAX_FOLDERS = 10_000;
/** What a folder costs on disk (one block), counted with the files' bytes against the caps. */
const FOLDER_BYTES = 4096;

/** The folders an archive makes so far, each counted once. */
class Folders {
  private readonly seen = new Set<string>();
  /**
   * Count `rel`'s folders: itself when it is one, and every ancestor.
   * @throws HttpError 400 past MAX_FOLDERS.
   */
  add(rel: string, isFolder: boolean): void {
    let dir = isFolder ? rel : path.posix.dirname(rel);
    while (dir !== '.' && dir !== '' && !this.seen.has(dir)) {
      this.seen.add(dir);
      if (this.seen.size > MAX_FOLDERS) bad(`the archive makes more than ${MAX_FOLDERS} folders; a LeRobot dataset has a few dozen`);
      dir = path.posix.dirname(dir);
    }
  }
  /** Bytes of disk the folders take. */
  get bytes(): number {
    return this.seen.size * FOLDER_BYTES;
  }
}

export interface InstallOptions {
  /** The folder it is installed in: the key's uploads folder (datasets/owned.ts ownerUploadsDir). */
  root: string;
  name: string;
  /** The archive, a file on disk. */
  archive: string;
  owner: string;
  /** Cap of the archive and of the extracted bytes. */
  maxBytes: number;
  /** Validates the extracted dataset folder; throws with a message naming the bad file. */
  validate: (dir: string) => Promise<{ episodes: number; frames: number }>;
  /** Called with the extracted bytes before validation; throws (the key's quota, a 413) to refuse. */
  admit?: (extractedBytes: number) => void;
  /**
   * Called before an earlier upload of this name is replaced by a different archive (not for a
   * new name, nor for the same archive again); throws to refuse (e.g. a job uses the dataset).
   */
  beforeReplace?: () => Promise<void>;
  /**
   * A lower cap than `maxBytes` on the extracted bytes, asked for as extraction starts (what the
   * key's quota has left), and the error past it; extraction stops there instead of filling the
   * disk first and refusing after.
   */
  extractCap?: () => { bytes: number; error: () => HttpError };
}

export interface InstallResult {
  name: string;
  dir: string;
  sha256: string;
  bytes: number; // the archive
  extracted_bytes: number;
  files: number;
  episodes: number | null;
  frames: number | null;
  /** True when the same archive was already installed under this name: nothing was rewritten. */
  reused: boolean;
}

function bad(message: string): never {
  throw new HttpError(400, message);
}

/** @throws HttpError 400 unless `name` is one plain segment. */
export function checkDatasetName(name: unknown, field = 'dataset'): string {
  if (typeof name !== 'string' || !DATASET_NAME.test(name)) bad(`${field} must be a plain name (letters, digits, '.', '_', '-', at most 128, no '/'), got ${JSON.stringify(name)}`);
  return name;
}

/** @throws HttpError 400 unless `p` is a relative path of plain segments. */
function checkEntryPath(p: string): string {
  const rel = p.replace(/\/+$/, '');
  if (rel === '' || rel === '.' || rel === './') return '';
  if (rel.includes('\0') || rel.includes('\\') || path.posix.isAbsolute(rel) || /^[A-Za-z]:/.test(rel)) bad(`the archive holds an entry with an unsafe path: ${JSON.stringify(p)}`);
  const segments = rel.replace(/^\.\//, '').split('/');
  if (segments.some((s) => s === '..' || s === '')) bad(`the archive holds an entry with an unsafe path: ${JSON.stringify(p)}`);
  return segments.join('/');
}

async function sha256Of(file: string): Promise<string> {
  const h = crypto.createHash('sha256');
  for await (const chunk of fs.createReadStream(file)) h.update(chunk as Buffer);
  return h.digest('hex');
}

function formatOf(file: string): 'zip' | 'tar' | 'tgz' {
  const head = Buffer.alloc(262);
  const fd = fs.openSync(file, 'r');
  const n = fs.readSync(fd, head, 0, head.length, 0);
  fs.closeSync(fd);
  if (n >= 4 && head.readUInt32LE(0) === 0x04034b50) return 'zip';
  if (n >= 2 && head[0] === 0x1f && head[1] === 0x8b) return 'tgz';
  if (n >= 262 && head.toString('latin1', 257, 262) === 'ustar') return 'tar';
  bad(`the archive is neither a tar (optionally gzipped) nor a zip file (${n} bytes; it starts with ${head.subarray(0, Math.min(n, 8)).toString('hex') || 'nothing'})`);
}

/** Tar entry types that are taken: regular files and folders. */
const TAKEN = new Set(['File', 'OldFile', 'ContiguousFile', 'Directory']);
/** Tar's own bytes beyond the files' (headers, padding, end blocks) allowed past `maxBytes`. */
const TAR_SLACK_BYTES = 1024 * 1024;

/**
 * Extract a tar, or a gzipped one (`gzip`), into `dest`, checking each entry as its header
 * arrives: one streaming pass, never the whole archive in memory, and never a long stretch on
 * the event loop. Inflating runs in Node's zlib on the libuv thread pool (node-tar's own
 * minizlib would inflate on the main thread, a 16 MiB read at a time), with backpressure from
 * the disk; it stops as soon as the entries' sizes, or the inflated bytes, pass `maxBytes`.
 * @returns [files, bytes of the files and of the folders (FOLDER_BYTES each)].
 * @throws HttpError 400 for an unsafe or unsupported entry, an archive past `maxBytes`
 *   extracted, or one that is not a readable tar (the caller removes `dest`).
 */
function extractTar(file: string, dest: string, maxBytes: number, gzip: boolean, tooLarge: () => HttpError): Promise<[number, number]> {
  let files = 0;
  let bytes = 0;
  let inflated = 0;
  const folders = new Folders();
  let problem: HttpError | null = null;
  return new Promise<[number, number]>((resolve, reject) => {
    const stop = (message: string | HttpError) => {
      problem ??= typeof message === 'string' ? new HttpError(400, message) : message;
      unpack.abort(problem);
    };
    const unpack = new tar.Unpack({
      cwd: dest, strict: true, preservePaths: false, preserveOwner: false, brotli: false, zstd: false,
      // Called as each header is read, before anything of the entry is written.
      filter: (p, e) => {
        if (problem) return false;
        const type = 'type' in e ? e.type : '';
        try {
          const rel = checkEntryPath(p);
          if (rel !== '') folders.add(rel, type === 'Directory');
        } catch (err) {
          stop((err as Error).message);
          return false;
        }
        if (!TAKEN.has(type)) stop(`the archive holds ${p}, a ${type}; only files and folders are taken`);
        else if (type !== 'Directory' && ++files > MAX_ENTRIES) stop(`the archive holds more than ${MAX_ENTRIES} files`);
        else if ((bytes += e.size ?? 0) + folders.bytes > maxBytes) stop(tooLarge());
        return !problem;
      },
    });
    const input = fs.createReadStream(file, { highWaterMark: 256 * 1024 });
    const source = gzip ? input.pipe(zlib.createGunzip({ chunkSize: 256 * 1024 })) : input;
    const fail = (e: Error) => {
      input.destroy();
      if (source !== input) source.destroy();
      reject(problem ?? (e instanceof HttpError ? e : new HttpError(400, `the archive is not a readable tar: ${e.message}`)));
    };
    unpack.on('error', fail);
    input.on('error', fail);
    source.on('error', fail);
    unpack.on('close', () => (problem ? fail(problem) : resolve([files, bytes + folders.bytes])));
    unpack.on('drain', () => !atEnd && source.resume());
    // At the tar's end the rest is not read: node-tar would keep appending it to one buffer.
    let atEnd = false;
    unpack.on('eof', () => {
      atEnd = true;
      input.destroy();
      if (source !== input) source.destroy();
      unpack.end();
    });
    source.on('data', (chunk: Buffer) => {
      if (problem || atEnd) return;
      // node-tar would inflate a gzip inside the gzip itself, on the main thread: refused.
      if (gzip && inflated === 0 && chunk[0] === 0x1f && chunk[1] === 0x8b) return stop('the archive is a gzip inside a gzip; send a tar, tar.gz or zip');
      inflated += chunk.length;
      if (inflated > maxBytes + TAR_SLACK_BYTES) return stop(tooLarge());
      if (!unpack.write(chunk)) source.pause();
    });
    source.on('end', () => !problem && !atEnd && unpack.end());
  });
}

/** Extract a zip into `dest` after checking every entry. @returns [files, bytes of the files and folders]. */
async function extractZip(file: string, dest: string, maxBytes: number, tooLarge: () => HttpError): Promise<[number, number]> {
  let zip: yauzl.ZipFile;
  try {
    // strictFileNames: a backslash is an error, not a separator; yauzl refuses absolute and `..` names.
    zip = await yauzl.openPromise(file, { lazyEntries: true, strictFileNames: true, validateEntrySizes: true });
  } catch (e) {
    bad(`the archive is not a readable zip: ${(e as Error).message}`);
  }
  let files = 0;
  let bytes = 0;
  const folders = new Folders();
  try {
    for await (const entry of zip.eachEntry()) {
      const rel = checkEntryPath(entry.fileName);
      const mode = (entry.externalFileAttributes >>> 16) & 0o170000;
      if (mode !== 0 && mode !== 0o100000 && mode !== 0o040000) bad(`the archive holds ${entry.fileName}, which is not a file or a folder`);
      if (entry.isEncrypted()) bad(`the archive holds ${entry.fileName} encrypted`);
      const target = path.resolve(dest, rel);
      if (target !== dest && !target.startsWith(dest + path.sep)) bad(`the archive holds an entry with an unsafe path: ${JSON.stringify(entry.fileName)}`);
      const isFolder = entry.fileName.endsWith('/');
      if (rel !== '') folders.add(rel, isFolder);
      if (folders.bytes + bytes > maxBytes) throw tooLarge();
      if (isFolder) {
        fs.mkdirSync(target, { recursive: true });
        continue;
      }
      bytes += entry.uncompressedSize;
      if (++files > MAX_ENTRIES) bad(`the archive holds more than ${MAX_ENTRIES} files`);
      if (bytes + folders.bytes > maxBytes) throw tooLarge();
      fs.mkdirSync(path.dirname(target), { recursive: true });
      await pipeline(await zip.openReadStreamPromise(entry), fs.createWriteStream(target, { flags: 'wx' }));
    }
  } catch (e) {
    if (e instanceof HttpError) throw e;
    bad(`the zip could not be extracted: ${(e as Error).message}`);
  } finally {
    zip.close();
  }
  return [files, bytes + folders.bytes];
}

/** The dataset folder of an extracted archive: its top, or its one top folder. */
function datasetRoot(dir: string): string {
  if (fs.existsSync(path.join(dir, 'meta', 'info.json'))) return dir;
  const top = fs.readdirSync(dir, { withFileTypes: true }).filter((e) => !e.name.startsWith('.') && e.name !== '__MACOSX');
  if (top.length === 1 && top[0]!.isDirectory() && fs.existsSync(path.join(dir, top[0]!.name, 'meta', 'info.json'))) return path.join(dir, top[0]!.name);
  bad('the archive holds no LeRobot dataset: expected meta/info.json at its top, or in its one top folder');
}

function readMarker(dir: string): { sha256?: string; owner?: string } | null {
  try {
    return JSON.parse(fs.readFileSync(path.join(dir, UPLOAD_MARKER), 'utf8'));
  } catch {
    return null;
  }
}

const installing = new Map<string, Promise<unknown>>(); // per target folder: one install at a time

/**
 * Install an archive as dataset `name` (see the module comment).
 * @throws HttpError 400 (bad archive or dataset, naming the entry or file), 409 (the name is
 *   the operator's dataset or another key's upload), 413 (too large).
 */
export function installDataset(opts: InstallOptions): Promise<InstallResult> {
  const target = path.resolve(opts.root, checkDatasetName(opts.name, 'name'));
  const prev = installing.get(target) ?? Promise.resolve();
  const run = prev.catch(() => undefined).then(() => install(opts, target));
  installing.set(target, run);
  void run.finally(() => installing.get(target) === run && installing.delete(target)).catch(() => undefined);
  return run;
}

async function install(opts: InstallOptions, target: string): Promise<InstallResult> {
  const bytes = fs.statSync(opts.archive).size;
  if (bytes > opts.maxBytes) throw new HttpError(413, `the archive is ${bytes} bytes; the limit is ${opts.maxBytes} (--max-dataset-bytes)`);
  const sha256 = await sha256Of(opts.archive);
  const existing = fs.existsSync(target) ? readMarker(target) : null;
  if (fs.existsSync(target)) {
    if (!existing) throw new HttpError(409, `dataset "${opts.name}" exists under the datasets root and was not uploaded through the API; it is never replaced: pick another name`);
    if (existing.owner !== opts.owner) throw new HttpError(409, `dataset "${opts.name}" was uploaded with another API key; pick another name`);
    if (existing.sha256 === sha256) return { name: opts.name, dir: target, sha256, bytes, extracted_bytes: 0, files: 0, episodes: null, frames: null, reused: true };
    await opts.beforeReplace?.();
  }
  fs.mkdirSync(opts.root, { recursive: true });
  const tag = crypto.randomBytes(4).toString('hex');
  const tmp = path.join(opts.root, `.${opts.name}.upload-${tag}`);
  fs.mkdirSync(tmp);
  try {
    const format = formatOf(opts.archive);
    const cap = opts.extractCap?.();
    const capped = cap !== undefined && cap.bytes < opts.maxBytes;
    const limit = capped ? Math.max(0, cap.bytes) : opts.maxBytes;
    const tooLarge = capped ? cap.error : () => new HttpError(400, `the archive extracts to more than ${opts.maxBytes} bytes (--max-dataset-bytes)`);
    const [files, extracted] = format === 'zip' ? await extractZip(opts.archive, tmp, limit, tooLarge) : await extractTar(opts.archive, tmp, limit, format === 'tgz', tooLarge);
    opts.admit?.(extracted);
    const dir = datasetRoot(tmp);
    let counts: { episodes: number; frames: number };
    try {
      counts = await opts.validate(dir);
    } catch (e) {
      bad(`dataset "${opts.name}": ${(e as Error).message.split(dir).join(opts.name)}`); // name files as the client knows them
    }
    fs.writeFileSync(path.join(dir, UPLOAD_MARKER), JSON.stringify({ sha256, owner: opts.owner, bytes, extracted_bytes: extracted, uploaded_at: Date.now() / 1000 }, null, 2) + '\n');
    const old = fs.existsSync(target) ? path.join(opts.root, `.${opts.name}.old-${tag}`) : null;
    if (old) fs.renameSync(target, old);
    fs.renameSync(dir, target);
    if (old) await fs.promises.rm(old, { recursive: true, force: true });
    return { name: opts.name, dir: target, sha256, bytes, extracted_bytes: extracted, files, ...counts, reused: false };
  } finally {
    // An extraction stopped midway may still be closing a file in `tmp`: retried, and a
    // failure here is logged, never answered in place of the real outcome.
    await fs.promises.rm(tmp, { recursive: true, force: true, maxRetries: 5, retryDelay: 100 }).catch((e: Error) => log.warn(`could not remove ${tmp}: ${e.message}`));
  }
}
