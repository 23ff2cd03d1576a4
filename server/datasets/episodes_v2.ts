/**
 * v2.0 / v2.1 episodes and tasks: `meta/episodes.jsonl` ({episode_index, tasks, length}) and
 * `meta/tasks.jsonl` ({task_index, task}); one data parquet per episode at `data_path`
 * (`data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet`, chunk = index /
 * chunks_size) and one mp4 per episode and camera at `video_path`.
 */
import { DatasetError } from './errors.ts';
import { formatTemplate, readJsonl, stringList } from './layout.ts';
import type { Info } from './layout.ts';
import type { CameraMeta, EpisodeMeta, EpisodeVideo } from './types.ts';

export function episodesV2(root: string, info: Info, cameras: CameraMeta[]): EpisodeMeta[] {
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

export function tasksV2(root: string): Map<number, string> {
  const tasks = new Map<number, string>();
  for (const r of readJsonl(root, 'meta/tasks.jsonl')) tasks.set(Number(r.task_index), String(r.task));
  return tasks;
}
