/**
 * A base checkpoint named by the user (`base`: a folder or a Hub id) -> the folder to load.
 * Hub ids are looked up in the Hugging Face cache first, so what LeRobot or openpi downloaded is
 * used in place; a missing or partial one is downloaded (or completed) only when the caller
 * allows it.
 */
import fs from 'node:fs';
import path from 'node:path';
import { CheckpointError } from '../../kernels/safetensors.ts';
import type { DownloadProgress } from '../hub/client.ts';
import { downloadModel } from './download.ts';
import { ModelError } from './errors.ts';
import { cachedSnapshot, hubCacheDir, isHubRepoId, modelRepoFolder } from './hf-cache.ts';
import { HUB_CONFIG_FILE, readCheckpointHeaders } from './hub-checkpoint.ts';

export interface ResolveBaseOptions {
  /** Environment read for HF_HOME / HF_HUB_CACHE / HF_TOKEN / HF_ENDPOINT; default process.env. */
  env?: NodeJS.ProcessEnv;
  /** Download a Hub id that is not in the cache (else ModelError 'not_downloaded'). */
  allowDownload?: boolean;
  /** Hub URL; default $HF_ENDPOINT, else https://huggingface.co. */
  endpoint?: string;
  /** Access token; default $HF_TOKEN. */
  token?: string | null;
  onProgress?: (p: DownloadProgress) => void;
  /**
   * Whether the caller could download when allowed (fine-tunes, with `vela serve --allow-downloads`):
   * the refusal then names that setting besides `vela models download`. Default true; sessions and
   * `vela policy`, which never download, pass false.
   */
  serverDownloads?: boolean;
}

/** Where a base checkpoint is: its folder, the Hub id, and the commit its revision resolved to (both null for a folder). */
export interface ResolvedBase {
  dir: string;
  repoId: string | null;
  revision: string | null;
}

/**
 * Resolves `ref`: a folder (an absolute or relative path that exists, or one starting with `.`
 * or `/`), or a Hub id `namespace/name[@revision]` (revision default `main`).
 * @throws ModelError 'bad_argument' (neither a folder nor a Hub id), 'not_found' (a path that
 *   does not exist; or, downloading, no such repository / revision), 'not_downloaded' (a Hub id
 *   not in the cache and allowDownload off: the message gives both fixes), and downloadModel's
 *   'unauthorized' / 'gated' / 'network' / 'integrity'.
 */
export async function resolveBase(ref: string, opts: ResolveBaseOptions = {}): Promise<ResolvedBase> {
  const env = opts.env ?? process.env;
  if (typeof ref !== 'string' || ref.trim() === '') throw new ModelError('bad_argument', `base ${JSON.stringify(ref)}: give a folder or a Hub id such as lerobot/pi05_base`);
  const looksLikePath = ref.startsWith('.') || ref.startsWith('/') || ref.startsWith('~') || path.isAbsolute(ref);
  if (looksLikePath || fs.existsSync(ref)) {
    const dir = path.resolve(ref);
    let st: fs.Stats | undefined;
    try {
      st = fs.statSync(dir, { throwIfNoEntry: false });
    } catch (e) {
      // A symlink loop, a NUL byte, a component that is a file: the ref cannot name a folder.
      throw new ModelError('bad_argument', `base ${ref}: not a folder that can be read (${(e as NodeJS.ErrnoException).code ?? 'unreadable'})`);
    }
    if (!st) throw new ModelError('not_found', `base ${ref}: no such folder (${dir})`);
    if (!st.isDirectory()) throw new ModelError('bad_argument', `base ${ref} is a file; give the checkpoint folder (config.json and model.safetensors)`);
    return { dir, repoId: null, revision: null };
  }
  const at = ref.indexOf('@');
  const repoId = at < 0 ? ref : ref.slice(0, at);
  const revision = at < 0 ? 'main' : ref.slice(at + 1);
  if (!isHubRepoId(repoId) || !repoId.includes('/') || revision === '' || revision.includes('..') || /[\s\\]/.test(revision)) {
    throw new ModelError('bad_argument', `base ${JSON.stringify(ref)} is neither an existing folder nor a Hub id namespace/name[@revision] (e.g. lerobot/pi05_base)`);
  }
  const cacheDir = hubCacheDir(env);
  const cached = cachedSnapshot(cacheDir, repoId, revision);
  // A snapshot is there as soon as its first file is (an interrupted or --include download):
  // only one with its config and every weight file counts.
  const missing = cached ? await incomplete(cached.dir) : null;
  if (cached && missing === null) return { dir: cached.dir, repoId, revision: cached.commit };
  if (!opts.allowDownload) {
    const shown = at < 0 ? repoId : `${repoId} --revision ${revision}`;
    const where = cached ? `is only partly in the Hugging Face cache (${cached.dir}: ${missing})` : `is not in the Hugging Face cache (${modelRepoFolder(cacheDir, repoId)})`;
    const or = opts.serverDownloads === false ? '' : ' or start the server with --allow-downloads';
    throw new ModelError('not_downloaded', `base ${ref} ${where}; run \`vela models download ${shown}\`${or}`);
  }
  const r = await downloadModel({
    repoId, revision, cacheDir,
    endpoint: opts.endpoint ?? (env.HF_ENDPOINT || 'https://huggingface.co'),
    token: opts.token === undefined ? env.HF_TOKEN || null : opts.token,
    onProgress: opts.onProgress,
  });
  return { dir: r.snapshot, repoId, revision: r.commit };
}

/** Null when `dir` has config.json and every weight file, else what is missing. */
async function incomplete(dir: string): Promise<string | null> {
  if (!fs.existsSync(path.join(dir, HUB_CONFIG_FILE))) return `no ${HUB_CONFIG_FILE}`;
  try {
    await readCheckpointHeaders(dir);
    return null;
  } catch (e) {
    if (e instanceof CheckpointError) return e.message;
    throw e;
  }
}
