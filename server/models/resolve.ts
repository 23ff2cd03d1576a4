/**
 * A base checkpoint reference (a folder, or a Hub id looked up in the Hugging Face cache) as a
 * local folder. (Interim version: the Hub download lands with `vela models`.)
 */
import fs from 'node:fs';
import path from 'node:path';
import { hubCacheDir, isFolderRef } from './bases.ts';

export type ModelErrorCode = 'not_found' | 'not_downloaded' | 'unauthorized' | 'gated' | 'network' | 'integrity' | 'bad_argument';

/** A base that cannot be resolved; the message names it and the fix. */
export class ModelError extends Error {
  constructor(readonly code: ModelErrorCode, message: string) {
    super(message);
    this.name = 'ModelError';
  }
}

export interface ResolveOptions {
  env?: NodeJS.ProcessEnv;
  allowDownload?: boolean;
  endpoint?: string;
  token?: string | null;
  onProgress?: (p: unknown) => void;
}

/**
 * The local folder of `ref`: an existing folder, or `namespace/name[@revision]` in the HF cache.
 * @throws ModelError 'not_found' (no such folder), 'not_downloaded' (a Hub id not in the cache).
 */
export async function resolveBase(ref: string, opts: ResolveOptions = {}): Promise<{ dir: string; repoId: string | null; revision: string | null }> {
  const env = opts.env ?? process.env;
  if (isFolderRef(ref)) {
    const dir = path.resolve(ref);
    if (!fs.existsSync(path.join(dir, 'config.json'))) throw new ModelError('not_found', `base ${ref}: ${dir} has no config.json; a base is a checkpoint folder in the Hub layout (config.json + model.safetensors) or a Hub id`);
    return { dir, repoId: null, revision: null };
  }
  const [repoId, revision = 'main'] = ref.split('@') as [string, string?];
  const repoDir = path.join(hubCacheDir(env), `models--${repoId.replace('/', '--')}`);
  let commit = revision;
  try {
    commit = fs.readFileSync(path.join(repoDir, 'refs', revision), 'utf8').trim();
  } catch {
    // A commit hash names its snapshot directly.
  }
  const dir = path.join(repoDir, 'snapshots', commit);
  if (!fs.existsSync(path.join(dir, 'config.json'))) {
    throw new ModelError('not_downloaded', `base ${ref} is not in the Hugging Face cache (${repoDir}); run \`vela models download ${repoId}\``);
  }
  return { dir, repoId, revision };
}
