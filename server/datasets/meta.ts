/**
 * Reads and validates a LeRobot dataset's metadata (codebase v2.0/v2.1 and v3.0, the layouts of
 * LeRobot's `lerobot_dataset.py` / `datasets/utils.py`): info.json's features, the episodes and
 * tasks (episodes_v2.ts / episodes_v3.ts), each data parquet's row count, each video's presence.
 * Every problem is a DatasetError naming the file.
 */
import fs from 'node:fs';
import path from 'node:path';
import { episodesV2, tasksV2 } from './episodes_v2.ts';
import { episodesV3, tasksV3 } from './episodes_v3.ts';
import { DatasetError } from './errors.ts';
import { parseNames, readJson } from './layout.ts';
import type { Info } from './layout.ts';
import { openParquet } from './parquet.ts';
import type { ParquetHandle } from './parquet.ts';
import type { CameraMeta, CodebaseVersion, DatasetMeta } from './types.ts';

const SUPPORTED: CodebaseVersion[] = ['v2.0', 'v2.1', 'v3.0'];
const IMAGE_PREFIX = 'observation.images.';

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
    for (const [key, v] of Object.entries(e.videos)) {
      // v3.0 gives each episode's span in the file; it must hold the episode's frames (to a frame).
      if (v.toS !== null && Math.abs((v.toS - v.fromS) * info.fps - e.length) > 1) {
        throw new DatasetError('bad_metadata', `${episodesFile}: episode ${e.index} ${key} spans ${v.fromS}..${v.toS} s (${((v.toS - v.fromS) * info.fps).toFixed(1)} frames at ${info.fps} fps) but has ${e.length} frames`);
      }
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
