/**
 * Where checkpoints and job outputs live: `checkpoints/<owner>/<session>/{states,weights}/<name>`
 * and `jobs/<id>/...`, under one root that every node of a cluster shares (`--storage-dir`,
 * default the data folder). The engines read and write these folders directly, so a node needs
 * a local path for each; `Storage` is the seam where another backend (S3 behind a local cache)
 * would plug in: `publish` after a node wrote a folder, `fetch` before a node reads one. The
 * shared folder needs neither (every node sees every write at once), so both are no-ops there.
 *
 * Per-owner accounting: a save is refused before any work when the owner's checkpoints already
 * hold the limit.
 */
import fs from 'node:fs';
import path from 'node:path';

export interface Storage {
  /** What this is, for logs and `GET /v1/nodes`: `shared folder /mnt/vela`. */
  readonly description: string;
  /** The local folder of a key (`['checkpoints', owner, session]`, `['jobs', id]`). */
  dir(...key: string[]): string;
  /** Make what this node wrote under `key` visible to every node. */
  publish(...key: string[]): Promise<void>;
  /** Make `key` readable on this node (what another node published). */
  fetch(...key: string[]): Promise<void>;
  /** Bytes stored under `key` (0 when absent). */
  bytes(...key: string[]): number;
}

/** Storage on a folder that every node mounts at the same path (NFS, a shared disk, or one machine). */
export class SharedDirStorage implements Storage {
  readonly root: string;
  constructor(root: string) {
    this.root = path.resolve(root);
  }
  get description(): string {
    return `shared folder ${this.root}`;
  }
  dir(...key: string[]): string {
    return path.join(this.root, ...key);
  }
  async publish(): Promise<void> {}
  async fetch(): Promise<void> {}
  bytes(...key: string[]): number {
    return folderBytes(this.dir(...key));
  }
}

/** The storage of a server config: `storageDir` when set, else the data folder. */
export function storageOf(config: { dataDir: string; storageDir?: string | undefined }): Storage {
  return new SharedDirStorage(config.storageDir || config.dataDir);
}

/** Bytes of every file under `dir` (0 when it does not exist). */
export function folderBytes(dir: string): number {
  let total = 0;
  let entries: fs.Dirent[];
  try {
    entries = fs.readdirSync(dir, { withFileTypes: true });
  } catch {
    return 0;
  }
  for (const e of entries) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) total += folderBytes(p);
    else if (e.isFile()) total += fs.statSync(p).size;
  }
  return total;
}

/** A save refused for the owner's storage limit; the HTTP layers answer 507. */
export class StorageLimitError extends Error {
  readonly code = 'storage_limit';
  readonly status = 507;
  constructor(usedBytes: number, limitBytes: number) {
    super(`this key's saved states and weights use ${usedBytes} bytes; the limit is ${limitBytes} (--storage-per-key-bytes): delete checkpoints first`);
    this.name = 'StorageLimitError';
  }
}

/** @throws StorageLimitError when the owner's checkpoints hold `limitBytes` or more. */
export function checkStorage(storage: Storage, owner: string, limitBytes: number): void {
  const used = storage.bytes('checkpoints', owner);
  if (used >= limitBytes) throw new StorageLimitError(used, limitBytes);
}
