/**
 * v3.0 episodes and tasks (LeRobot `datasets/utils.py`): `meta/episodes/chunk-*\/file-*.parquet`
 * with one row per episode (`episode_index`, `tasks`, `length`, `data/chunk_index`,
 * `data/file_index`, `dataset_from_index`, `dataset_to_index`, and per camera
 * `videos/{key}/chunk_index|file_index|from_timestamp|to_timestamp`), `meta/tasks.parquet` (a
 * pandas frame indexed by the task string), data and video files holding many episodes each.
 */
import fs from 'node:fs';
import path from 'node:path';
import { DatasetError } from './errors.ts';
import { formatTemplate, stringList } from './layout.ts';
import type { Info } from './layout.ts';
import { num, openParquet, readRows } from './parquet.ts';
import type { CameraMeta, EpisodeMeta, EpisodeVideo } from './types.ts';

/** Lists `dir/chunk-*\/file-*.parquet` (relative to root) in chunk then file order. */
function chunkFiles(root: string, dir: string): string[] {
  const abs = path.join(root, dir);
  if (!fs.existsSync(abs)) return [];
  const out: string[] = [];
  for (const chunk of fs.readdirSync(abs).filter((d) => /^chunk-\d+$/.test(d)).sort()) {
    for (const file of fs.readdirSync(path.join(abs, chunk)).filter((f) => f.endsWith('.parquet')).sort()) {
      out.push(`${dir}/${chunk}/${file}`);
    }
  }
  return out;
}

export async function episodesV3(root: string, info: Info, cameras: CameraMeta[]): Promise<EpisodeMeta[]> {
  const files = chunkFiles(root, 'meta/episodes');
  if (files.length === 0) throw new DatasetError('missing_file', 'meta/episodes/chunk-*/file-*.parquet is missing (no episodes metadata)');
  const dataPath = info.data_path ?? 'data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet';
  const videoPath = info.video_path ?? 'videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4';
  const videoCams = cameras.filter((c) => c.kind === 'video');
  const raw: { ep: EpisodeMeta; from: number }[] = [];
  for (const rel of files) {
    const h = await openParquet(root, rel);
    const need = ['episode_index', 'length', 'data/chunk_index', 'data/file_index', 'dataset_from_index'];
    for (const c of videoCams) need.push(`videos/${c.key}/chunk_index`, `videos/${c.key}/file_index`, `videos/${c.key}/from_timestamp`, `videos/${c.key}/to_timestamp`);
    const missing = need.filter((c) => !h.columns.includes(c));
    if (missing.length) throw new DatasetError('bad_metadata', `${rel} lacks the column(s) ${missing.join(', ')}`);
    const cols = h.columns.includes('tasks') ? [...need, 'tasks'] : need;
    for (const r of await readRows(h, cols)) {
      const index = num(r.episode_index);
      const videos: Record<string, EpisodeVideo> = {};
      for (const c of videoCams) {
        const p = `videos/${c.key}/`;
        videos[c.key] = {
          file: formatTemplate(videoPath, { video_key: c.key, chunk_index: num(r[p + 'chunk_index']), file_index: num(r[p + 'file_index']) }),
          fromS: num(r[p + 'from_timestamp']),
          toS: num(r[p + 'to_timestamp']),
        };
      }
      raw.push({
        ep: {
          index,
          length: num(r.length),
          tasks: stringList(r.tasks),
          dataFile: formatTemplate(dataPath, { chunk_index: num(r['data/chunk_index']), file_index: num(r['data/file_index']) }),
          rowStart: 0,
          videos,
        },
        from: num(r.dataset_from_index),
      });
    }
  }
  // A data file holds whole episodes back to back; an episode's first row in its file is its
  // global from-index minus the file's smallest from-index (checked against episode_index later).
  const fileStart = new Map<string, number>();
  for (const { ep, from } of raw) fileStart.set(ep.dataFile, Math.min(fileStart.get(ep.dataFile) ?? Infinity, from));
  for (const { ep, from } of raw) ep.rowStart = from - (fileStart.get(ep.dataFile) ?? 0);
  return raw.map((r) => r.ep);
}

export async function tasksV3(root: string): Promise<Map<number, string>> {
  const h = await openParquet(root, 'meta/tasks.parquet');
  // LeRobot writes a pandas frame indexed by the task string: the index becomes the column
  // `__index_level_0__` (or `task` when named).
  const taskCol = ['task', '__index_level_0__'].find((c) => h.columns.includes(c));
  if (!taskCol || !h.columns.includes('task_index')) {
    throw new DatasetError('bad_metadata', `meta/tasks.parquet has columns ${h.columns.join(', ')}; task_index and task are needed`);
  }
  const tasks = new Map<number, string>();
  for (const r of await readRows(h, ['task_index', taskCol])) tasks.set(num(r.task_index), String(r[taskCol]));
  return tasks;
}
