/**
 * Reads and validates a LeRobot dataset's metadata (codebase v2.0/v2.1 and v3.0), following
 * LeRobot's `lerobot_dataset.py` / `datasets/utils.py` layouts:
 * - v2.x: `meta/info.json`, `meta/episodes.jsonl`, `meta/tasks.jsonl`, one parquet per episode at
 *   `data_path` (`data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet`) and one mp4
 *   per episode and camera at `video_path`.
 * - v3.0: `meta/info.json`, `meta/episodes/chunk-*\/file-*.parquet` (one row per episode with
 *   `data/chunk_index`, `data/file_index`, `dataset_from_index`, `dataset_to_index`, and per camera
 *   `videos/{key}/chunk_index|file_index|from_timestamp|to_timestamp`), `meta/tasks.parquet`,
 *   data files holding many episodes each, video files holding many episodes each.
 * Every problem is a DatasetError naming the file.
 */
import fs from 'node:fs';
import path from 'node:path';
import { DatasetError } from './errors.ts';
import { num, openParquet, readRows } from './parquet.ts';
import type { ParquetHandle } from './parquet.ts';
import type { CameraMeta, CodebaseVersion, DatasetMeta, EpisodeMeta, EpisodeVideo } from './types.ts';

const SUPPORTED: CodebaseVersion[] = ['v2.0', 'v2.1', 'v3.0'];
const IMAGE_PREFIX = 'observation.images.';

interface Feature {
  dtype: string;
  shape: number[];
  names: unknown;
  info?: Record<string, unknown>;
}

interface Info {
  codebase_version: string;
  fps: number;
  robot_type?: string | null;
  total_frames?: number;
  total_episodes?: number;
  chunks_size?: number;
  data_path?: string;
  video_path?: string | null;
  features: Record<string, Feature>;
}

/** Python `str.format` for the `{name}` / `{name:03d}` fields that LeRobot path templates use. */
export function formatTemplate(template: string, values: Record<string, string | number>): string {
  return template.replace(/\{(\w+)(?::0?(\d+)d)?\}/g, (whole, name: string, width?: string) => {
    const v = values[name];
    if (v === undefined) throw new DatasetError('bad_metadata', `meta/info.json path template ${template} uses {${name}}, which is unknown`);
    return width ? String(v).padStart(Number(width), '0') : String(v);
  });
}

/** Per-dimension names: `["a", ...]`, `[["a", ...]]` or `{"motors": ["a", ...]}`; null otherwise. */
export function parseNames(names: unknown, dim: number): string[] | null {
  let list: unknown = names;
  if (Array.isArray(list) && list.length === 1 && Array.isArray(list[0])) list = list[0];
  if (list && typeof list === 'object' && !Array.isArray(list)) {
    const values = Object.values(list);
    list = values.length === 1 ? values[0] : null;
  }
  if (!Array.isArray(list) || list.length !== dim || !list.every((n) => typeof n === 'string')) return null;
  return list as string[];
}

function readJson(root: string, rel: string): unknown {
  const abs = path.join(root, rel);
  if (!fs.existsSync(abs)) throw new DatasetError('missing_file', `${rel} is missing`);
  try {
    return JSON.parse(fs.readFileSync(abs, 'utf8'));
  } catch (err) {
    throw new DatasetError('corrupt_file', `${rel} is not valid JSON: ${(err as Error).message}`);
  }
}

function readJsonl(root: string, rel: string): Record<string, unknown>[] {
  const abs = path.join(root, rel);
  if (!fs.existsSync(abs)) throw new DatasetError('missing_file', `${rel} is missing`);
  const lines = fs.readFileSync(abs, 'utf8').split('\n');
  const out: Record<string, unknown>[] = [];
  lines.forEach((line, i) => {
    if (!line.trim()) return;
    try {
      out.push(JSON.parse(line) as Record<string, unknown>);
    } catch (err) {
      throw new DatasetError('corrupt_file', `${rel} line ${i + 1} is not valid JSON: ${(err as Error).message}`);
    }
  });
  return out;
}

function vectorFeature(info: Info, key: string): { dim: number; names: string[] | null } {
  const f = info.features[key];
  if (!f) throw new DatasetError('bad_metadata', `meta/info.json has no feature ${key}; features are ${Object.keys(info.features).join(', ')}`);
  if (!Array.isArray(f.shape) || f.shape.length !== 1 || !(f.shape[0] > 0)) {
    throw new DatasetError('bad_metadata', `meta/info.json feature ${key} has shape ${JSON.stringify(f.shape)}; a vector [n] is needed`);
  }
  return { dim: f.shape[0], names: parseNames(f.names, f.shape[0]) };
}

function parseCameras(info: Info): CameraMeta[] {
  const cams: CameraMeta[] = [];
  for (const [key, f] of Object.entries(info.features)) {
    if (f.dtype !== 'video' && f.dtype !== 'image') continue;
    // info.json lists shape as [h, w, c] (names height/width/channel); honour a [c, h, w] order too.
    const names = Array.isArray(f.names) ? f.names : [];
    const chFirst = names[0] === 'channels' || names[0] === 'channel';
    const [h, w] = chFirst ? [f.shape?.[1], f.shape?.[2]] : [f.shape?.[0], f.shape?.[1]];
    const codec = f.info?.['video.codec'];
    cams.push({
      key,
      name: key.startsWith(IMAGE_PREFIX) ? key.slice(IMAGE_PREFIX.length) : key,
      kind: f.dtype,
      height: Number(h) || 0,
      width: Number(w) || 0,
      codec: f.dtype === 'video' && typeof codec === 'string' ? codec : null,
    });
  }
  return cams;
}

function stringList(v: unknown): string[] {
  if (Array.isArray(v)) return v.map(String);
  if (typeof v === 'string') return [v];
  return [];
}

function episodesV2(root: string, info: Info, cameras: CameraMeta[]): EpisodeMeta[] {
  const rows = readJsonl(root, 'meta/episodes.jsonl');
  const chunksSize = info.chunks_size ?? 1000;
  const dataPath = info.data_path ?? 'data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet';
  const videoPath = info.video_path ?? 'videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4';
  return rows.map((r, i) => {
    const index = Number(r.episode_index);
    const length = Number(r.length);
    if (!Number.isInteger(index) || index < 0 || !Number.isInteger(length) || length < 1) {
      throw new DatasetError('bad_metadata', `meta/episodes.jsonl line ${i + 1} has episode_index ${String(r.episode_index)} and length ${String(r.length)}`);
    }
    const chunk = Math.floor(index / chunksSize);
    const videos: Record<string, EpisodeVideo> = {};
    for (const c of cameras) {
      if (c.kind !== 'video') continue;
      videos[c.key] = { file: formatTemplate(videoPath, { episode_chunk: chunk, episode_index: index, video_key: c.key }), fromS: 0, toS: null };
    }
    return {
      index,
      length,
      tasks: stringList(r.tasks),
      dataFile: formatTemplate(dataPath, { episode_chunk: chunk, episode_index: index }),
      rowStart: 0,
      videos,
    };
  });
}

function tasksV2(root: string): Map<number, string> {
  const tasks = new Map<number, string>();
  for (const r of readJsonl(root, 'meta/tasks.jsonl')) tasks.set(Number(r.task_index), String(r.task));
  return tasks;
}

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

async function episodesV3(root: string, info: Info, cameras: CameraMeta[]): Promise<EpisodeMeta[]> {
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

async function tasksV3(root: string): Promise<Map<number, string>> {
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

/**
 * Reads and checks a dataset's metadata: info.json, episodes, tasks, features; opens every data
 * parquet's footer and checks its row count against the episodes it holds; checks that every
 * video file exists.
 * @returns the metadata and the opened data parquet handles (keyed by relative path).
 * @throws DatasetError (`not_found`, `missing_file`, `corrupt_file`, `unsupported_version`,
 *   `bad_metadata`, `row_count_mismatch`), each naming the file.
 */
export async function readMeta(dir: string): Promise<{ meta: DatasetMeta; files: Map<string, ParquetHandle> }> {
  const root = path.resolve(dir);
  if (!fs.existsSync(root) || !fs.statSync(root).isDirectory()) throw new DatasetError('not_found', `dataset folder ${root} does not exist`);
  const info = readJson(root, 'meta/info.json') as Info;
  if (!info || typeof info !== 'object' || !info.features) throw new DatasetError('bad_metadata', 'meta/info.json has no features');
  const version = info.codebase_version as CodebaseVersion;
  if (!SUPPORTED.includes(version)) {
    throw new DatasetError('unsupported_version', `meta/info.json codebase_version is ${JSON.stringify(info.codebase_version)}; supported: ${SUPPORTED.join(', ')}`);
  }
  if (!(info.fps > 0)) throw new DatasetError('bad_metadata', `meta/info.json fps is ${JSON.stringify(info.fps)}`);
  const state = vectorFeature(info, 'observation.state');
  const action = vectorFeature(info, 'action');
  const cameras = parseCameras(info);
  const v3 = version === 'v3.0';
  const episodes = v3 ? await episodesV3(root, info, cameras) : episodesV2(root, info, cameras);
  episodes.sort((a, b) => a.index - b.index);
  const tasks = v3 ? await tasksV3(root) : tasksV2(root);
  const episodesFile = v3 ? 'meta/episodes' : 'meta/episodes.jsonl';

  const seen = new Set<number>();
  for (const e of episodes) {
    if (seen.has(e.index)) throw new DatasetError('bad_metadata', `${episodesFile} lists episode ${e.index} twice`);
    seen.add(e.index);
  }
  const totalFrames = episodes.reduce((s, e) => s + e.length, 0);
  if (info.total_frames !== undefined && info.total_frames !== totalFrames) {
    throw new DatasetError('row_count_mismatch', `meta/info.json says total_frames ${info.total_frames}, but the ${episodesFile} lengths sum to ${totalFrames}`);
  }
  if (info.total_episodes !== undefined && info.total_episodes !== episodes.length) {
    throw new DatasetError('row_count_mismatch', `meta/info.json says total_episodes ${info.total_episodes}, but ${episodesFile} lists ${episodes.length}`);
  }

  // Every data file's footer row count must equal the lengths of the episodes it holds.
  const files = new Map<string, ParquetHandle>();
  const expected = new Map<string, number>();
  for (const e of episodes) expected.set(e.dataFile, (expected.get(e.dataFile) ?? 0) + e.length);
  for (const [rel, rows] of expected) {
    const h = await openParquet(root, rel);
    if (h.numRows !== rows) {
      throw new DatasetError('row_count_mismatch', `${rel} has ${h.numRows} rows, but ${episodesFile} gives its episodes ${rows} frames`);
    }
    files.set(rel, h);
  }
  for (const e of episodes) {
    for (const v of Object.values(e.videos)) {
      const abs = path.join(root, v.file);
      if (!fs.existsSync(abs)) throw new DatasetError('missing_file', `video file ${v.file} (episode ${e.index}) is missing`);
      if (fs.statSync(abs).size === 0) throw new DatasetError('corrupt_file', `video file ${v.file} (episode ${e.index}) is empty`);
    }
  }
  const meta: DatasetMeta = {
    root,
    codebaseVersion: version,
    fps: info.fps,
    robotType: info.robot_type ?? null,
    totalFrames,
    episodes,
    tasks,
    cameras,
    stateDim: state.dim,
    actionDim: action.dim,
    stateNames: state.names,
    actionNames: action.names,
  };
  return { meta, files };
}
