/**
 * Which checkpoint folders a key may name as `base` (sessions, fine-tunes, xorl's create_model):
 * a folder base reads the server's disk, so, as with datasets, a key names only what is its own or
 * the operator's: a Hub id (the Hugging Face cache, shared), a folder under `--models-dir`
 * (default `<data dir>/models`, shared; named relative to it, `tiny_pi05_base`, as `dataset_name`
 * is relative to the datasets folder, or by its absolute path), or the `model_dir` of one of its
 * own fine-tunes (absolute, as the job reports it). Any other
 * folder only on a server started with `--allow-absolute-bases`. Another key's fine-tune output
 * reads as a folder that is not there, in the same words, so a key neither trains on nor learns of
 * another's weights; the check runs before the folder is looked at, so it is no existence oracle.
 */
import fs from 'node:fs';
import path from 'node:path';
import type { ServerConfig } from '../config.ts';
import { HttpError } from '../http/http.ts';
import type { Store } from '../store/store.ts';
import { modelsDirOf, nameableText } from './resolve.ts';

/** `p` with symlinks resolved where it exists (else as given, absolute). */
function real(p: string): string {
  try {
    return fs.realpathSync(p);
  } catch {
    return path.resolve(p);
  }
}

function inside(root: string, p: string): string | null {
  const rel = path.relative(root, p);
  return rel === '' || rel.startsWith('..') || path.isAbsolute(rel) ? null : rel;
}

/**
 * Whether a client's `base` is a path on the server to check here: an absolute one. A relative
 * `base` never leaves the models folder (resolveBase with cwdRelative false refuses `..`) or is
 * a Hub id, so it needs no check.
 */
export function isFolderRef(ref: string): boolean {
  return path.isAbsolute(ref);
}

/**
 * Refuses a folder `ref` that key `owner` may not name (see the module comment); Hub ids pass.
 * @param jobsRoot the folder of this server's fine-tune work dirs (`<data dir>/jobs`).
 * @throws HttpError 400: another key's fine-tune output (`base <ref>: no such folder`), or a folder
 *   outside the allowed places (naming them, the operator's setting, and what may be named).
 */
export async function checkBaseAccess(config: Pick<ServerConfig, 'dataDir' | 'modelsDir' | 'allowAbsoluteBases'>, store: Pick<Store, 'getJob'>, owner: string, ref: string, jobsRoot: string): Promise<void> {
  if (typeof ref !== 'string' || !isFolderRef(ref)) return;
  const dir = real(ref);
  const job = inside(real(jobsRoot), dir);
  if (job !== null) {
    const row = await store.getJob(job.split(path.sep)[0]!);
    if (!row || row.owner !== owner) throw new HttpError(400, `base ${ref}: no such folder`);
    return;
  }
  if (inside(real(modelsDirOf(config)), dir) !== null) return;
  if (config.allowAbsoluteBases) return;
  throw new HttpError(
    400,
    `base ${ref.length > 200 ? `${ref.slice(0, 200)}...` : ref}: a folder base must be under the server's models folder (--models-dir) or be one of this key's fine-tunes' model_dir, or the operator may allow any folder with --allow-absolute-bases; ${nameableText(modelsDirOf(config))}`,
  );
}
