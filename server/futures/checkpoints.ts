/**
 * Checkpoints of one owner for `list_checkpoints` / `delete_checkpoint`: the folders that
 * `save_state` and `save_weights` wrote under `<data>/checkpoints/<owner>/<model_id>/{states,weights}/<name>`
 * (server/sessions/sessions.ts sessionDir). A checkpoint id is `<model_id>/<kind>/<name>`; ids are checked
 * against strict patterns before any path is built, so no id can leave the owner's folder.
 */
import fs from 'node:fs';
import path from 'node:path';
import { NAME_PATTERN } from '../../protocol/messages.ts';
import { HttpError } from '../http/http.ts';

export type CheckpointKind = 'states' | 'weights';

export interface CheckpointInfo {
  checkpoint_id: string;
  model_id: string;
  /** "state": weights + optimizer (futures `save_weights`, websocket `save_state`); "weights": weights only. */
  kind: 'state' | 'weights';
  name: string;
  path: string;
  created_at: number; // Unix seconds (folder mtime)
  size_bytes: number;
}

const MODEL_ID = /^ts-[a-z0-9]{1,64}$/;
const KINDS: Record<CheckpointKind, CheckpointInfo['kind']> = { states: 'state', weights: 'weights' };

function dirs(root: string): string[] {
  try {
    return fs.readdirSync(root, { withFileTypes: true }).filter((d) => d.isDirectory()).map((d) => d.name);
  } catch {
    return [];
  }
}

function sizeOf(dir: string): number {
  let n = 0;
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) n += e.isDirectory() ? sizeOf(path.join(dir, e.name)) : fs.statSync(path.join(dir, e.name)).size;
  return n;
}

/** Every checkpoint under `ownerRoot`, or only `modelId`'s; newest first. Temporary folders are skipped. */
export function listCheckpoints(ownerRoot: string, modelId?: string): CheckpointInfo[] {
  const out: CheckpointInfo[] = [];
  for (const model of modelId ? [modelId] : dirs(ownerRoot)) {
    if (!MODEL_ID.test(model)) continue;
    for (const kind of Object.keys(KINDS) as CheckpointKind[]) {
      for (const name of dirs(path.join(ownerRoot, model, kind))) {
        if (!NAME_PATTERN.test(name)) continue; // atomic-write temporaries start with '.'
        const p = path.join(ownerRoot, model, kind, name);
        const st = fs.statSync(p);
        out.push({ checkpoint_id: `${model}/${kind}/${name}`, model_id: model, kind: KINDS[kind], name, path: p, created_at: Math.floor(st.mtimeMs / 1000), size_bytes: sizeOf(p) });
      }
    }
  }
  return out.sort((a, b) => b.created_at - a.created_at || a.checkpoint_id.localeCompare(b.checkpoint_id));
}

/**
 * The folder of checkpoint id `id` under `ownerRoot`.
 * @throws HttpError 400 for an id that is not `<model_id>/<states|weights>/<name>`, 404 when no
 *   such checkpoint exists for this owner.
 */
export function checkpointPath(ownerRoot: string, id: unknown): string {
  const parts = typeof id === 'string' ? id.split('/') : [];
  if (parts.length !== 3 || !MODEL_ID.test(parts[0]!) || !(parts[1]! in KINDS) || !NAME_PATTERN.test(parts[2]!)) {
    throw new HttpError(400, `checkpoint_id must be "<model_id>/<states|weights>/<name>" as list_checkpoints gives it, got ${JSON.stringify(id)}`);
  }
  const p = path.join(ownerRoot, ...parts);
  if (!fs.existsSync(p)) throw new HttpError(404, `no checkpoint ${id}`);
  return p;
}

/**
 * The checkpoint id of a `path` that save_weights / list_checkpoints gave (an absolute folder
 * under `ownerRoot`), or of a checkpoint id given as a path. Null for a bare name (a checkpoint
 * of the model itself).
 * @throws HttpError 400 for an absolute path outside the owner's checkpoints, or a malformed one.
 */
export function checkpointIdOfPath(ownerRoot: string, p: string): string | null {
  if (path.isAbsolute(p)) {
    const rel = path.relative(ownerRoot, path.resolve(p));
    if (rel.startsWith('..') || path.isAbsolute(rel) || rel === '') throw new HttpError(400, `path ${p} is not a checkpoint of this key: use the path or checkpoint_id that save_weights or list_checkpoints returned`);
    return rel.split(path.sep).join('/');
  }
  return p.includes('/') ? p : null;
}

/** What weights_info answers about a checkpoint: its model's shape, read from config.json. */
export function checkpointInfo(ownerRoot: string, id: string): Record<string, unknown> {
  const dir = checkpointPath(ownerRoot, id);
  let cfg: Record<string, unknown> = {};
  try {
    cfg = JSON.parse(fs.readFileSync(path.join(dir, 'config.json'), 'utf8'));
  } catch {
    throw new HttpError(404, `checkpoint ${id} has no readable config.json`);
  }
  const info = listCheckpoints(ownerRoot, id.split('/')[0]).find((c) => c.checkpoint_id === id)!;
  const lora = cfg.finetune !== 'full';
  return {
    ...info, base_model: cfg.preset, is_lora: lora, lora_rank: lora ? (cfg.lora_rank ?? null) : null, lora_alpha: lora ? (cfg.lora_alpha ?? null) : null,
    targets: cfg.lora_targets ?? null, finetune: cfg.finetune ?? null, action_horizon: cfg.action_horizon ?? null, cameras: cfg.cameras ?? [],
    has_optimizer_state: fs.existsSync(path.join(dir, 'optimizer.safetensors')),
  };
}

/** Delete a checkpoint folder. @throws as `checkpointPath`. */
export function deleteCheckpoint(ownerRoot: string, id: unknown): string {
  const p = checkpointPath(ownerRoot, id);
  fs.rmSync(p, { recursive: true, force: true });
  return p;
}
