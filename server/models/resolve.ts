/**
 * A base checkpoint named by the user (`base`: a folder or a Hub id) -> the folder to load.
 * Hub ids are looked up in the Hugging Face cache first, so what LeRobot or openpi downloaded is
 * used in place; a missing or partial one is downloaded (or completed) only when the caller
 * allows it. A plain relative name (`tiny_pi05_base`, `org/ckpt`) is a folder under the models
 * folder (`--models-dir`), as `dataset_name` is one under the datasets folder: the only relative
 * name a server's remote clients can know. The CLIs also take a path relative to their working
 * directory.
 */
import fs from 'node:fs';
import path from 'node:path';
import { CheckpointError } from '../../kernels/safetensors.ts';
import type { DownloadProgress } from '../hub/client.ts';
import { downloadModel } from './download.ts';
import { modelsDirOf } from './bases.ts';
import { ModelError } from './errors.ts';
import { cachedSnapshot, hubCacheDir, isHubRepoId, modelRepoFolder, repoIdOfFolder } from './hf-cache.ts';
import { HUB_CONFIG_FILE, readCheckpointHeaders } from './hub-checkpoint.ts';

export { cliModelsDir, modelsDirOf } from './bases.ts';

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
   * the refusal then names that setting besides `vela models download`. Default true; sessions,
   * `vela policy` and `vela finetune`, which never download, pass false (every hint a command
   * prints is one that works there: `vela finetune` takes no --allow-downloads).
   */
  serverDownloads?: boolean;
  /**
   * The models folder (`--models-dir`): a plain relative `ref` that is a folder there names it
   * (before a Hub id of the same spelling, as the datasets folder's names do). Refusals then list
   * what may be named (nameableBases).
   */
  modelsDir?: string;
  /**
   * Whether a relative path may name a folder under the working directory (the CLIs; default
   * true). A server passes false: a relative `ref` is then a name under modelsDir or a Hub id,
   * and `.` / `..` / empty segments are refused, as in `dataset_name`.
   */
  cwdRelative?: boolean;
}

/** Most names of each kind a refusal lists. */
export const NAMEABLE_CAP = 20;

/** Whether a checkpoint folder's config.json says it is a pi0 / pi0.5 (LeRobot's `type`). */
function isRealCheckpoint(dir: string): boolean {
  try {
    const t = (JSON.parse(fs.readFileSync(path.join(dir, HUB_CONFIG_FILE), 'utf8')) as { type?: unknown }).type;
    return t === 'pi0' || t === 'pi05';
  } catch {
    return false;
  }
}

/**
 * The bases a client may name, without reading weights: the pi0 / pi0.5 checkpoint folders under
 * `modelsDir` (relative names, one or two levels deep, hidden entries skipped) and the Hub ids of
 * the pi0 / pi0.5 snapshots in the Hugging Face cache; each sorted, at most `cap` (the rest counted).
 */
export function nameableBases(modelsDir: string | undefined, env: NodeJS.ProcessEnv = process.env, cap = NAMEABLE_CAP): { folders: string[]; hubIds: string[]; moreFolders: number; moreHubIds: number } {
  const list = (dir: string): string[] => {
    try {
      return fs.readdirSync(dir, { withFileTypes: true }).filter((e) => !e.name.startsWith('.') && (e.isDirectory() || e.isSymbolicLink())).map((e) => e.name).sort();
    } catch {
      return [];
    }
  };
  const folders: string[] = [];
  if (modelsDir) {
    for (const a of list(modelsDir)) {
      if (isRealCheckpoint(path.join(modelsDir, a))) folders.push(a);
      else for (const b of list(path.join(modelsDir, a))) if (isRealCheckpoint(path.join(modelsDir, a, b))) folders.push(`${a}/${b}`);
    }
  }
  const cacheDir = hubCacheDir(env);
  const hubIds: string[] = [];
  for (const name of list(cacheDir)) {
    const repoId = repoIdOfFolder(name);
    if (!repoId) continue;
    const snaps = list(path.join(cacheDir, name, 'snapshots'));
    if (snaps.some((c) => isRealCheckpoint(path.join(cacheDir, name, 'snapshots', c)))) hubIds.push(repoId);
  }
  return { folders: folders.slice(0, cap), hubIds: hubIds.slice(0, cap), moreFolders: Math.max(0, folders.length - cap), moreHubIds: Math.max(0, hubIds.length - cap) };
}

/**
 * One clause naming what may be named as `base` instead (for refusals that a remote client
 * reads, where the server's folders show as `<models dir>`): the folders under the models folder
 * by their relative names, the Hub ids in the cache, or that there is neither yet.
 */
export function nameableText(modelsDir: string | undefined, env: NodeJS.ProcessEnv = process.env): string {
  const n = nameableBases(modelsDir, env);
  const more = (k: number) => (k > 0 ? ` and ${k} more` : '');
  const parts: string[] = [];
  if (n.folders.length) parts.push(`a folder under the models folder by its relative name: ${n.folders.join(', ')}${more(n.moreFolders)}`);
  if (n.hubIds.length) parts.push(`a Hub id in the Hugging Face cache: ${n.hubIds.join(', ')}${more(n.moreHubIds)}`);
  if (!parts.length) return 'there is no pi0 / pi0.5 checkpoint folder under the models folder (--models-dir) nor in the Hugging Face cache yet; name a Hub id (e.g. lerobot/pi05_base) once it is downloaded';
  return `name ${parts.join(', or ')}`;
}

/** The folder plain relative `ref` names under `modelsDir`, or null when it is not plain segments. */
function underModelsDir(modelsDir: string, ref: string): string | null {
  const segments = ref.split('/');
  if (segments.some((s) => s === '' || s === '.' || s === '..' || s.includes('\\') || s.includes('\0'))) return null;
  return path.join(modelsDir, ...segments);
}

/** Where a base checkpoint is: its folder, the Hub id, and the commit its revision resolved to (both null for a folder). */
export interface ResolvedBase {
  dir: string;
  repoId: string | null;
  revision: string | null;
}

/**
 * Resolves `ref`, in this order: an absolute path (a folder); with cwdRelative (the CLIs), a
 * relative path that exists or starts with `.` / `~`; a plain relative name that is a folder
 * under opts.modelsDir; a Hub id `namespace/name[@revision]` (revision default `main`).
 * @throws ModelError 'bad_argument' (neither a folder nor a Hub id; without cwdRelative, also `.`
 *   / `..` / empty segments), 'not_found' (a path that does not exist; or, downloading, no such
 *   repository / revision), 'not_downloaded' (a Hub id not in the cache and allowDownload off:
 *   the message gives the fixes), and downloadModel's 'unauthorized' / 'gated' / 'network' /
 *   'integrity'. With modelsDir, the bad_argument, not_found and not_downloaded refusals end
 *   with what may be named instead (nameableText).
 */
export async function resolveBase(ref: string, opts: ResolveBaseOptions = {}): Promise<ResolvedBase> {
  const env = opts.env ?? process.env;
  if (typeof ref !== 'string' || ref.trim() === '') throw new ModelError('bad_argument', `base ${JSON.stringify(ref)}: give a folder or a Hub id such as lerobot/pi05_base`);
  const cwdRelative = opts.cwdRelative !== false;
  const instead = () => (opts.modelsDir ? `; ${nameableText(opts.modelsDir, env)}` : '');
  let folder: string | null = null;
  if (path.isAbsolute(ref)) folder = ref;
  else if (cwdRelative && (ref.startsWith('.') || ref.startsWith('~') || fs.existsSync(ref))) folder = ref;
  else if (opts.modelsDir) {
    const dir = underModelsDir(opts.modelsDir, ref);
    if (dir === null && !cwdRelative) throw new ModelError('bad_argument', `base ${JSON.stringify(ref)}: a folder base is named relative to the models folder (--models-dir) in plain segments (no "..", ".", or empty parts)${instead()}`);
    if (dir !== null && fs.existsSync(dir)) folder = dir;
  }
  if (folder !== null) {
    const dir = path.resolve(folder);
    let st: fs.Stats | undefined;
    try {
      st = fs.statSync(dir, { throwIfNoEntry: false });
    } catch (e) {
      // A symlink loop, a NUL byte, a component that is a file: the ref cannot name a folder.
      throw new ModelError('bad_argument', `base ${ref}: not a folder that can be read (${(e as NodeJS.ErrnoException).code ?? 'unreadable'})`);
    }
    if (!st) throw new ModelError('not_found', `base ${ref}: no such folder (${dir})${instead()}`);
    if (!st.isDirectory()) throw new ModelError('bad_argument', `base ${ref} is a file; give the checkpoint folder (config.json and model.safetensors)${instead()}`);
    // A server's client cannot look in the folder: it is told what it may name instead.
    if (!cwdRelative && opts.modelsDir && !fs.existsSync(path.join(dir, HUB_CONFIG_FILE))) {
      throw new ModelError('bad_argument', `base ${ref}: ${dir} has no ${HUB_CONFIG_FILE}, so it is no checkpoint${instead()}`);
    }
    return { dir, repoId: null, revision: null };
  }
  const at = ref.indexOf('@');
  const repoId = at < 0 ? ref : ref.slice(0, at);
  const revision = at < 0 ? 'main' : ref.slice(at + 1);
  if (!isHubRepoId(repoId) || !repoId.includes('/') || revision === '' || revision.includes('..') || /[\s\\]/.test(revision)) {
    const folders = opts.modelsDir ? (cwdRelative ? 'an existing folder (here or under the models folder)' : 'a checkpoint folder under the models folder (--models-dir)') : 'an existing folder';
    throw new ModelError('bad_argument', `base ${JSON.stringify(ref)} is neither ${folders} nor a Hub id namespace/name[@revision] (e.g. lerobot/pi05_base)${instead()}`);
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
    const here = opts.modelsDir ? nameableBases(opts.modelsDir, env) : null;
    const other = here && here.folders.length + here.hubIds.length > 0 ? `; or ${nameableText(opts.modelsDir, env)}` : '';
    throw new ModelError('not_downloaded', `base ${ref} ${where}; run \`vela models download ${shown}\`${or}${other}`);
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
