/**
 * Per-owner storage accounting for saved states and weights (`<data>/checkpoints/<owner>`).
 * A save is refused before any work when the owner's folder is already at the limit.
 */
import fs from 'node:fs';
import path from 'node:path';

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

/** @throws StorageLimitError when `<dataDir>/checkpoints/<owner>` holds `limitBytes` or more. */
export function checkStorage(dataDir: string, owner: string, limitBytes: number): void {
  const used = folderBytes(path.resolve(dataDir, 'checkpoints', owner));
  if (used >= limitBytes) throw new StorageLimitError(used, limitBytes);
}
