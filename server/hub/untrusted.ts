/**
 * Checks on what a hub (or a mirror, or anything at HF_ENDPOINT) sends, used by the one Hub
 * client (client.ts) that model and dataset downloads share. Nothing the hub lists or answers is
 * used in a path, or written past the size it listed, before it passed these. Imports nothing of
 * Vela's.
 */
import { Transform } from 'node:stream';

/**
 * The hash a listed file must have, checked before it names any file: a git blob id is 40 hex
 * digits (SHA-1), an LFS oid 64 (SHA-256), lower case as the hub writes them. Both become file
 * names (`blobs/<oid>`, `<path>.<oid>.incomplete`), so `../x` or `/etc/x` here would write
 * outside the cache.
 * @returns null when the oid fits, else a sentence saying why not.
 */
export function badOid(oid: unknown, algo: 'sha256' | 'git-blob-sha1'): string | null {
  const digits = algo === 'sha256' ? 64 : 40;
  if (typeof oid === 'string' && new RegExp(`^[0-9a-f]{${digits}}$`).test(oid)) return null;
  return `the hub listed ${algo === 'sha256' ? 'an LFS SHA-256' : 'a git blob id'} of ${JSON.stringify(oid)?.slice(0, 100)}, not ${digits} hex digits`;
}

/** A listed size that can be written: a whole number of bytes, at most 2^53 - 1. */
export function badSize(size: unknown): string | null {
  return Number.isSafeInteger(size) && (size as number) >= 0 ? null : `the hub listed a size of ${JSON.stringify(size)?.slice(0, 40)}, not a whole number of bytes`;
}

/** Thrown (through the stream) when a body goes on past the size the hub listed. */
export class TooLong extends Error {
  constructor(readonly limit: number) {
    super(`the hub sent more than the ${limit} bytes its file list gives`);
    this.name = 'TooLong';
  }
}

/**
 * A pass-through that lets at most `limit - start` bytes out: the chunk that crosses the limit is
 * cut at it and the stream fails with TooLong, so an endless (or too long) body never puts more
 * than the listed size into the file. `onData(n, total)` sees each chunk let out.
 */
export function capAt(start: number, limit: number, onData: (n: number, total: number) => void): Transform {
  let total = start;
  return new Transform({
    transform(chunk: Buffer, _enc, cb) {
      const room = limit - total;
      if (chunk.length > room) {
        if (room > 0) {
          total += room;
          onData(room, total);
          this.push(chunk.subarray(0, room));
        }
        cb(new TooLong(limit));
        return;
      }
      total += chunk.length;
      onData(chunk.length, total);
      cb(null, chunk);
    },
  });
}

/**
 * The first byte of a 206's `Content-Range: bytes <first>-<last>/<size>`, or null when the
 * header is missing or not of that form. A resumed transfer appends only an answer whose first
 * byte is the count of bytes already held.
 */
export function contentRangeStart(header: string | null): number | null {
  const m = /^bytes (\d+)-\d+\/(\d+|\*)$/.exec(header?.trim() ?? '');
  return m ? Number(m[1]) : null;
}
