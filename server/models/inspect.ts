/**
 * What a pi0 / pi0.5 checkpoint folder (or a PaliGemma tokenizer folder) holds, from its
 * config.json, its safetensors headers (never the tensor data: a 14 GB checkpoint is described in
 * milliseconds) and its file names; and the list of those in the Hugging Face cache.
 *
 * Norm stats: LeRobot keeps them beside the weights as `policy_preprocessor*.json` plus
 * `*normalizer_processor.safetensors`; openpi as `assets/<asset id>/norm_stats.json`.
 */
import fs from 'node:fs';
import path from 'node:path';
import { HUB_EXPERT_LM_HEAD_KEY } from '../../kernels/pi/keys.ts';
import { CheckpointError } from '../../kernels/safetensors.ts';
import { ModelError } from './errors.ts';
import { refsOf, repoIdOfFolder } from './hf-cache.ts';
import { HUB_CONFIG_FILE, readCheckpointHeaders, readHubConfig } from './hub-checkpoint.ts';

/** The settings of a checkpoint that decide how it is served and trained. */
export interface ModelConfigSummary {
  /** config.json `type`. */
  variant: 'pi0' | 'pi05';
  /** config.json `paligemma_variant` / `action_expert_variant` (e.g. gemma_2b / gemma_300m). */
  paligemmaVariant: string | null;
  actionExpertVariant: string | null;
  /** Widths and depths as the weights have them (null without weights). */
  vlmWidth: number | null;
  vlmDepth: number | null;
  expertWidth: number | null;
  expertDepth: number | null;
  visionWidth: number | null;
  /** Actions per chunk (`chunk_size`) and per call (`n_action_steps`). */
  actionHorizon: number | null;
  actionSteps: number | null;
  /** Prompt token limit (`tokenizer_max_length`). */
  tokenLimit: number | null;
  maxStateDim: number | null;
  maxActionDim: number | null;
}

/** One checkpoint or tokenizer folder. */
export interface ModelSummary {
  /** The repo id (cache) or the folder as given. */
  name: string;
  repoId: string | null;
  /** Refs pointing at the snapshot (e.g. `main`), else the commit; null for a folder. */
  revision: string | null;
  commit: string | null;
  path: string;
  kind: 'pi0' | 'pi05' | 'tokenizer' | 'unknown';
  config: ModelConfigSummary | null;
  /** Parameters the model uses (the unused expert LM head left out); null without weights. */
  parameters: number | null;
  /** Every value stored in the weight files. */
  storedValues: number | null;
  /** Tensors per on-disk dtype, e.g. { F32: 812 }. */
  dtypes: Record<string, number>;
  weightFiles: string[];
  /** Norm stats files found (relative paths); `normStats` true when LeRobot's pair or openpi's file is there. */
  normStats: boolean;
  normStatsFiles: string[];
  /** Bytes of the files (links followed, each blob once). */
  sizeBytes: number;
  /** Why the weights could not be described, if so. */
  problem: string | null;
}

const num = (v: unknown): number | null => (typeof v === 'number' && Number.isFinite(v) ? v : null);
const str = (v: unknown): string | null => (typeof v === 'string' ? v : null);

function filesOf(dir: string): string[] {
  const out: string[] = [];
  const walk = (rel: string): void => {
    for (const e of fs.readdirSync(path.join(dir, rel), { withFileTypes: true })) {
      const r = rel ? `${rel}/${e.name}` : e.name;
      let isDir = e.isDirectory();
      if (e.isSymbolicLink()) isDir = fs.statSync(path.join(dir, r), { throwIfNoEntry: false })?.isDirectory() ?? false;
      if (isDir) {
        if (!r.startsWith('.')) walk(r);
      } else out.push(r);
    }
  };
  walk('');
  return out.sort();
}

/** The norm stats files of a folder's file list (LeRobot's pair, openpi's per-asset files). */
export function normStatsFiles(files: readonly string[]): { lerobot: string[]; openpi: string[] } {
  const pre = files.filter((f) => /^policy_preprocessor[^/]*\.json$/.test(f));
  const norm = files.filter((f) => /^[^/]*normalizer_processor\.safetensors$/.test(f));
  return { lerobot: pre.length && norm.length ? [...pre, ...norm] : [], openpi: files.filter((f) => /^assets\/.+\/norm_stats\.json$/.test(f)) };
}

/** Layer count of `prefix.layers.<i>.` keys. */
function depthOf(names: readonly string[], re: RegExp): number | null {
  const idx = new Set<number>();
  for (const n of names) {
    const m = re.exec(n);
    if (m) idx.add(Number(m[1]));
  }
  return idx.size ? idx.size : null;
}

/**
 * Describes a folder: a pi0 / pi0.5 checkpoint (config.json `type`), a tokenizer folder, or
 * 'unknown'. Reads config.json and the safetensors headers only.
 * @throws ModelError 'not_found' (no such folder), 'bad_argument' (not a folder).
 */
export async function inspectModel(dir: string, where: { name?: string; repoId?: string | null; revision?: string | null; commit?: string | null } = {}): Promise<ModelSummary> {
  const abs = path.resolve(dir);
  const st = fs.statSync(abs, { throwIfNoEntry: false });
  if (!st) throw new ModelError('not_found', `${dir}: no such folder`);
  if (!st.isDirectory()) throw new ModelError('bad_argument', `${dir} is a file; give the checkpoint folder (the one holding config.json and model.safetensors)`);
  const files = filesOf(abs);
  const seen = new Set<string>();
  let sizeBytes = 0;
  for (const f of files) {
    const p = path.join(abs, f);
    let real: string;
    try {
      real = fs.realpathSync(p);
    } catch {
      continue; // a dangling link: nothing on disk
    }
    if (seen.has(real)) continue;
    seen.add(real);
    sizeBytes += fs.statSync(real).size;
  }
  const ns = normStatsFiles(files);
  const out: ModelSummary = {
    name: where.name ?? dir, repoId: where.repoId ?? null, revision: where.revision ?? null, commit: where.commit ?? null, path: abs,
    kind: 'unknown', config: null, parameters: null, storedValues: null, dtypes: {}, weightFiles: [],
    normStats: ns.lerobot.length > 0 || ns.openpi.length > 0, normStatsFiles: [...ns.lerobot, ...ns.openpi], sizeBytes, problem: null,
  };
  let config: Record<string, unknown> | null = null;
  if (files.includes(HUB_CONFIG_FILE)) {
    try {
      config = await readHubConfig(abs);
    } catch (e) {
      out.problem = (e as Error).message;
    }
  }
  const type = config?.type;
  if (type !== 'pi0' && type !== 'pi05') {
    if (files.includes('tokenizer.json') || files.includes('tokenizer.model')) out.kind = 'tokenizer';
    return out;
  }
  out.kind = type;
  const cfg: ModelConfigSummary = {
    variant: type, paligemmaVariant: str(config!.paligemma_variant), actionExpertVariant: str(config!.action_expert_variant),
    vlmWidth: null, vlmDepth: null, expertWidth: null, expertDepth: null, visionWidth: null,
    actionHorizon: num(config!.chunk_size), actionSteps: num(config!.n_action_steps), tokenLimit: num(config!.tokenizer_max_length),
    maxStateDim: num(config!.max_state_dim), maxActionDim: num(config!.max_action_dim),
  };
  out.config = cfg;
  try {
    const { files: weightFiles, tensors } = await readCheckpointHeaders(abs);
    out.weightFiles = weightFiles.map((f) => path.relative(abs, f));
    let stored = 0;
    let unused = 0;
    for (const t of tensors) {
      const n = t.shape.reduce((a, b) => a * b, 1);
      stored += n;
      if (t.name === HUB_EXPERT_LM_HEAD_KEY) unused += n;
      out.dtypes[t.dtype] = (out.dtypes[t.dtype] ?? 0) + 1;
    }
    out.storedValues = stored;
    out.parameters = stored - unused;
    const names = tensors.map((t) => t.name);
    const shapeOf = (re: RegExp) => tensors.find((t) => re.test(t.name))?.shape ?? null;
    cfg.vlmWidth = shapeOf(/language_model\.(model\.)?layers\.0\.self_attn\.o_proj\.weight$/)?.[0] ?? null;
    cfg.expertWidth = shapeOf(/gemma_expert\.model\.layers\.0\.self_attn\.o_proj\.weight$/)?.[0] ?? null;
    cfg.visionWidth = shapeOf(/patch_embedding\.bias$/)?.[0] ?? null;
    cfg.vlmDepth = depthOf(names, /language_model\.(?:model\.)?layers\.(\d+)\./);
    cfg.expertDepth = depthOf(names, /gemma_expert\.model\.layers\.(\d+)\./);
  } catch (e) {
    if (!(e instanceof CheckpointError)) throw e;
    out.problem = e.message;
  }
  return out;
}

/**
 * The pi0 / pi0.5 checkpoints and PaliGemma tokenizers in the hub cache (one row per cached
 * snapshot) and in `folders` (one row each, whatever they hold).
 * @throws ModelError 'not_found' / 'bad_argument' for a folder given that is not one.
 */
export async function listModels(cacheDir: string, folders: readonly string[] = []): Promise<ModelSummary[]> {
  const rows: ModelSummary[] = [];
  let repos: string[] = [];
  try {
    repos = fs.readdirSync(cacheDir).filter((n) => n.startsWith('models--')).sort();
  } catch {
    // no cache yet: nothing cached
  }
  for (const folder of repos) {
    const repoId = repoIdOfFolder(folder)!;
    const repoDir = path.join(cacheDir, folder);
    let snaps: string[] = [];
    try {
      snaps = fs.readdirSync(path.join(repoDir, 'snapshots')).sort();
    } catch {
      continue;
    }
    for (const commit of snaps) {
      const refs = refsOf(repoDir, commit);
      const s = await inspectModel(path.join(repoDir, 'snapshots', commit), { name: repoId, repoId, commit, revision: refs.length ? refs.join(',') : commit.slice(0, 12) });
      if (s.kind === 'pi0' || s.kind === 'pi05' || (s.kind === 'tokenizer' && /paligemma/i.test(repoId))) rows.push(s);
    }
  }
  for (const f of folders) rows.push(await inspectModel(f));
  return rows;
}

/** `3.62B`, `412.9M`, `75.3K`. */
export function formatCount(n: number | null): string {
  if (n === null) return '-';
  if (n >= 1e9) return `${(n / 1e9).toFixed(2)}B`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)}M`;
  if (n >= 1e3) return `${(n / 1e3).toFixed(1)}K`;
  return String(n);
}

/** `13.5 GB`, `4.1 MB`. */
export function formatBytes(n: number): string {
  if (n >= 1e9) return `${(n / 1e9).toFixed(1)} GB`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)} MB`;
  if (n >= 1e3) return `${(n / 1e3).toFixed(1)} kB`;
  return `${n} B`;
}
