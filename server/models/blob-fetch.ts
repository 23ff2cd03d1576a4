/**
 * One file of a model repository into `blobs/<etag>.incomplete`, resumed from what that file
 * already holds: @huggingface/hub resolves the file (`fileDownloadInfo`: the redirect, the size
 * and the ETag) and reads it (`downloadFile`'s WebBlob, sliced from the bytes kept, i.e. a
 * `Range: bytes=<have>-<size-1>` request). The library itself always starts from byte 0.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import { capAt, TooLong } from '../hub/untrusted.ts';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { ReadableStream as NodeReadableStream } from 'node:stream/web';
import { downloadFile, fileDownloadInfo, HubApiError, InvalidApiResponseFormatError } from '@huggingface/hub';
import { ModelError } from './errors.ts';

/** A file of the tree listing, with the hash it must have. */
export interface TreeFile {
  path: string;
  size: number;
  etag: string;
  algo: 'sha256' | 'git-blob-sha1';
}

/** Thrown by the fetch wrapper when a ranged GET is answered with the whole file. */
export class RangeIgnored extends Error {}

/** SHA-256 of a file, or its git blob id (SHA-1 of "blob <size>\0" + content). */
export async function hashFile(file: string, algo: TreeFile['algo']): Promise<string> {
  const h = crypto.createHash(algo === 'sha256' ? 'sha256' : 'sha1');
  if (algo === 'git-blob-sha1') h.update(`blob ${(await fs.promises.stat(file)).size}\0`);
  for await (const chunk of fs.createReadStream(file)) h.update(chunk as Buffer);
  return h.digest('hex');
}

/** A file's size, or null when it does not exist. */
export const sizeOf = async (p: string): Promise<number | null> => fs.promises.stat(p).then((s) => s.size, () => null);

/**
 * One attempt at a file: the library resolves it (size and ETag checked against the tree), then
 * its WebBlob streams the bytes from what `partial` already holds to the end, appended.
 * @throws ModelError `network` (connection broke; the bytes written stay), `integrity` (the hub
 *   states another hash or size than its tree), HubApiError (refused), RangeIgnored.
 */
export async function fetchInto(o: {
  hubUrl: string; accessToken: string | undefined; fetch: typeof fetch; repoId: string; commit: string;
  file: TreeFile; partial: string; idleTimeoutMs: number; onData: (n: number, fileBytes: number) => void;
}): Promise<void> {
  const { file, partial } = o;
  let have = (await sizeOf(partial)) ?? 0;
  if (have > file.size) {
    fs.truncateSync(partial, 0);
    have = 0;
  }
  if (have === file.size) return;
  const repo = { type: 'model' as const, name: o.repoId };
  const lib = { hubUrl: o.hubUrl, accessToken: o.accessToken, fetch: o.fetch };
  // The library puts the path into the URL as is; a space or `#` in a file name needs quoting.
  const urlPath = file.path.split('/').map(encodeURIComponent).join('/');
  let info;
  try {
    info = await fileDownloadInfo({ ...lib, repo, path: urlPath, revision: o.commit });
  } catch (e) {
    if (e instanceof HubApiError || e instanceof RangeIgnored) throw e;
    if (e instanceof InvalidApiResponseFormatError) throw new ModelError('network', `${o.repoId}: ${file.path}: the answer of ${o.hubUrl} does not fit the hub's API (${e.message}); is it a Hugging Face hub or mirror?`);
    throw new ModelError('network', `${o.repoId}: ${file.path}: cannot reach ${new URL(o.hubUrl).origin} (${(e as Error & { cause?: Error }).cause?.message ?? (e as Error).message})`);
  }
  if (info === null) throw new ModelError('not_found', `${o.repoId}: ${file.path} is listed at commit ${o.commit} but the hub has no such entry`);
  const etag = info.etag.replace(/^W\//, '').replace(/^"(.*)"$/, '$1');
  // The ETag is compared only for plain answers: for a Xet-stored file the hub answers the probe
  // with Xet file info, and the hash check after the download is what counts anyway.
  if (info.size !== file.size || (!info.xet && etag.length >= 40 && etag !== file.etag)) {
    throw new ModelError('integrity', `${o.repoId}: ${file.path}: the hub serves ${info.size} bytes with ETag ${etag}; its file list says ${file.size} bytes, ${file.etag}. Nothing was saved`);
  }
  const blob = await downloadFile({ ...lib, repo, path: urlPath, revision: o.commit, xet: false, downloadInfo: info });
  if (!blob) throw new ModelError('not_found', `${o.repoId}: ${file.path} is listed at commit ${o.commit} but the hub has no such entry`);
  const rest = have > 0 ? blob.slice(have) : blob;
  // The watchdog: a transfer silent for idleTimeoutMs is broken off (and resumed by the caller).
  // capAt lets no byte past the listed size into the file, whatever the body goes on sending.
  let watchdog: NodeJS.Timeout | undefined;
  const count = capAt(have, file.size, (n, fileBytes) => {
    watchdog?.refresh();
    o.onData(n, fileBytes);
  });
  watchdog = setTimeout(() => count.destroy(new Error(`no data for ${o.idleTimeoutMs} ms`)), o.idleTimeoutMs);
  const out = fs.createWriteStream(partial, { flags: have > 0 ? 'a' : 'w' });
  try {
    await pipeline(Readable.fromWeb(rest.stream() as NodeReadableStream), count, out);
    clearTimeout(watchdog);
  } catch (e) {
    clearTimeout(watchdog);
    // pipeline rejects as soon as the source breaks; writes already handed to the file may still
    // land. Wait for the file to close so the size we resume from is final.
    if (!out.closed) await new Promise<void>((resolve) => out.once('close', () => resolve()));
    if (e instanceof RangeIgnored) throw e;
    if (e instanceof TooLong) {
      fs.rmSync(partial, { force: true });
      throw new ModelError('integrity', `${o.repoId}: ${file.path}: ${e.message}; the bytes were discarded, not saved in the cache`);
    }
    const reason = typeof e === 'string' ? e : ((e as Error & { cause?: Error }).cause?.message ?? (e as Error).message);
    throw new ModelError('network', `${o.repoId}: ${file.path}: the connection broke after ${(await sizeOf(partial)) ?? 0} of ${file.size} bytes (${reason})`);
  }
}

