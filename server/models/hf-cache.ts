/**
 * The Hugging Face cache as huggingface_hub lays it out, so what LeRobot, openpi or transformers
 * downloaded is used in place and what Vela downloads is found by them:
 *
 *   <cache>/models--<ns>--<name>/blobs/<etag>            the bytes (etag: SHA-256 for LFS files,
 *                                                        the git blob id for the others)
 *   <cache>/models--<ns>--<name>/snapshots/<commit>/<path> -> ../../blobs/<etag>
 *   <cache>/models--<ns>--<name>/refs/<revision>          the commit a branch or tag pointed at
 *
 * <cache> is $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
 * ~/.cache/huggingface/hub (huggingface_hub's constants.py order).
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { getRepoFolderName } from '@huggingface/hub';

export { isHubRepoId } from '../hub/client.ts';

/** The hub cache folder for `env` (see the module comment). */
export function hubCacheDir(env: NodeJS.ProcessEnv = process.env): string {
  if (env.HF_HUB_CACHE) return path.resolve(env.HF_HUB_CACHE);
  const home = env.HF_HOME || path.join(env.XDG_CACHE_HOME || path.join(os.homedir(), '.cache'), 'huggingface');
  return path.resolve(home, 'hub');
}

/** `<cache>/models--<ns>--<name>`. */
export function modelRepoFolder(cacheDir: string, repoId: string): string {
  return path.join(cacheDir, getRepoFolderName({ type: 'model', name: repoId }));
}

/** The repo id of a `models--<ns>--<name>` folder name, or null for anything else. */
export function repoIdOfFolder(name: string): string | null {
  if (!name.startsWith('models--')) return null;
  return name.slice('models--'.length).split('--').join('/');
}

/**
 * The snapshot folder of `repoId` at `revision` in the cache, or null when it is not there:
 * a 40-hex revision is the commit itself; anything else is looked up in refs/<revision>.
 */
export function cachedSnapshot(cacheDir: string, repoId: string, revision = 'main'): { dir: string; commit: string } | null {
  const repo = modelRepoFolder(cacheDir, repoId);
  let commit = revision;
  if (!/^[0-9a-f]{40}$/.test(revision)) {
    try {
      commit = fs.readFileSync(path.join(repo, 'refs', ...revision.split('/')), 'utf8').trim();
    } catch {
      return null;
    }
  }
  const dir = path.join(repo, 'snapshots', commit);
  return fs.existsSync(dir) ? { dir, commit } : null;
}

/** The revisions (refs) that point at `commit` in a cached repository folder, e.g. ['main']. */
export function refsOf(repoFolder: string, commit: string): string[] {
  const out: string[] = [];
  const walk = (rel: string): void => {
    let entries: fs.Dirent[];
    try {
      entries = fs.readdirSync(path.join(repoFolder, 'refs', rel), { withFileTypes: true });
    } catch {
      return;
    }
    for (const e of entries) {
      const r = rel ? `${rel}/${e.name}` : e.name;
      if (e.isDirectory()) walk(r);
      else if (fs.readFileSync(path.join(repoFolder, 'refs', r), 'utf8').trim() === commit) out.push(r);
    }
  };
  walk('');
  return out.sort();
}
