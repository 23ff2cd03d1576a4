/**
 * An opened LeRobot dataset: validated metadata, every episode's low-dimensional columns in
 * memory (state, action, timestamps, task indices: small next to the frames), and frames decoded
 * on demand, once per (episode, camera, size), into a bounded LRU cache.
 */
import { ByteLruCache } from './cache.ts';
import { DatasetError } from './errors.ts';
import { decodeImageFeature } from './images.ts';
import { readMeta } from './meta.ts';
import type { ParquetHandle } from './parquet.ts';
import { readFileTables } from './tables.ts';
import type { CameraMeta, DatasetMeta, EpisodeFrames, EpisodeMeta, EpisodeTable, Frame } from './types.ts';
import { decodeVideo, probeVideo } from './video.ts';

export const DEFAULT_FRAME_CACHE_BYTES = 512 * 1024 * 1024;
const MAX_IMAGE_SIZE = 4096;

export interface OpenOptions {
  /** Bytes of decoded frames kept (default 512 MiB, or `$VELA_FRAME_CACHE_BYTES`). */
  cacheBytes?: number;
  /** Decodes (ffmpeg processes or sharp batches) at once; default 2. */
  maxConcurrentDecodes?: number;
  /** ffmpeg binary; default `$VELA_FFMPEG`, else `@ffmpeg-installer/ffmpeg`. */
  ffmpeg?: string;
}

export class Dataset {
  readonly cache: ByteLruCache<EpisodeFrames>;
  private readonly byIndex = new Map<number, EpisodeMeta>();

  constructor(
    readonly meta: DatasetMeta,
    private readonly tables: Map<number, EpisodeTable>,
    private readonly files: Map<string, ParquetHandle>,
    private readonly opts: OpenOptions,
  ) {
    const envBytes = Number(process.env.VELA_FRAME_CACHE_BYTES);
    this.cache = new ByteLruCache(opts.cacheBytes ?? (envBytes > 0 ? envBytes : DEFAULT_FRAME_CACHE_BYTES), opts.maxConcurrentDecodes ?? 2);
    for (const e of meta.episodes) this.byIndex.set(e.index, e);
  }

  /** Episode indices in order. */
  get episodeIndices(): number[] {
    return this.meta.episodes.map((e) => e.index);
  }

  /** @throws DatasetError `unknown_episode`. */
  episode(index: number): EpisodeMeta {
    const e = this.byIndex.get(index);
    if (!e) throw new DatasetError('unknown_episode', `episode ${index} is not in the dataset (it has ${this.meta.episodes.length} episodes, ${this.meta.episodes[0]?.index ?? '-'}..${this.meta.episodes.at(-1)?.index ?? '-'})`);
    return e;
  }

  /** The episode's state/action/timestamp/task columns. @throws DatasetError `unknown_episode`. */
  table(index: number): EpisodeTable {
    this.episode(index);
    return this.tables.get(index) as EpisodeTable;
  }

  /** A camera by short (`cam_high`) or full (`observation.images.cam_high`) name. @throws DatasetError `unknown_camera`. */
  camera(name: string): CameraMeta {
    const c = this.meta.cameras.find((cam) => cam.name === name || cam.key === name);
    if (!c) {
      const known = this.meta.cameras.map((cam) => cam.name).join(', ') || 'none';
      throw new DatasetError('unknown_camera', `camera ${JSON.stringify(name)} is not in the dataset; its cameras are ${known}`);
    }
    return c;
  }

  /** The task string at frame t: the frame's task_index, else the episode's first task, else ''. */
  prompt(episodeIndex: number, t: number): string {
    const ti = this.table(episodeIndex).taskIndex[t];
    return (ti >= 0 ? this.meta.tasks.get(ti) : undefined) ?? this.episode(episodeIndex).tasks[0] ?? '';
  }

  /**
   * Every frame of one episode and camera: [l, h, w, 3] uint8, h = w = size for a square size
   * (MODEL.md D12 padding), or the source size when size is null. Decoded once, then cached.
   * @throws DatasetError `unknown_episode`, `unknown_camera`, `bad_argument` (size), `bad_video`
   *   (ffmpeg failed or the frame count differs from the episode length), `corrupt_file`,
   *   `bad_metadata` (an info.json camera shape that is not whole pixels or too large to hold).
   */
  async frames(episodeIndex: number, camera: string, size: number | null): Promise<EpisodeFrames> {
    const ep = this.episode(episodeIndex);
    const cam = this.camera(camera);
    if (size !== null && !(Number.isInteger(size) && size >= 1 && size <= MAX_IMAGE_SIZE)) {
      throw new DatasetError('bad_argument', `image size ${size} is not an integer in 1..${MAX_IMAGE_SIZE}`);
    }
    const key = `${ep.index}|${cam.key}|${size ?? 'full'}`;
    return this.cache.get(key, () => {
      if (cam.kind === 'image') {
        return decodeImageFeature(this.meta.root, this.files.get(ep.dataFile) as ParquetHandle, ep, cam.key, size);
      }
      const v = ep.videos[cam.key];
      return decodeVideo({
        root: this.meta.root,
        file: v.file,
        fromS: v.fromS,
        fps: this.meta.fps,
        frames: ep.length,
        wholeFile: this.meta.codebaseVersion !== 'v3.0',
        size,
        sourceWidth: cam.width,
        sourceHeight: cam.height,
        ffmpeg: this.opts.ffmpeg,
      });
    });
  }

  /**
   * Bytes that the decoded frames of these episodes and cameras take at `size` (full size uses
   * info.json's shape). Uniform sampling re-decodes episodes when this exceeds the cache budget,
   * so a trainer should size `cacheBytes` from it (G1, 15 episodes: 143 MB at 96, 777 MB at 224).
   */
  frameBytes(episodes: readonly number[], cameras: readonly string[], size: number | null): number {
    const perFrame = cameras.reduce((s, c) => {
      const cam = this.camera(c);
      return s + (size ?? cam.width) * (size ?? cam.height) * 3;
    }, 0);
    return episodes.reduce((s, e) => s + this.episode(e).length, 0) * perFrame;
  }

  /**
   * Decodes (into the cache) the frames of these episodes and cameras ahead of sampling, at most
   * `maxConcurrentDecodes` at a time, so the first training steps do not wait on ffmpeg.
   */
  async prefetch(episodes: readonly number[], cameras: readonly string[], size: number | null): Promise<void> {
    await Promise.all(episodes.flatMap((e) => cameras.map((c) => this.frames(e, c, size))));
  }

  /**
   * Opens every video file once and decodes its first frame (ffmpeg, about 0.2 s per file), so a
   * job can refuse a dataset with an unreadable video before any work.
   * @throws DatasetError `bad_video` naming the first bad file.
   */
  async checkVideos(concurrency = 2): Promise<void> {
    const files = [...new Set(this.meta.episodes.flatMap((e) => Object.values(e.videos).map((v) => v.file)))];
    let next = 0;
    const worker = async () => {
      while (next < files.length) await probeVideo(this.meta.root, files[next++], this.opts.ffmpeg);
    };
    await Promise.all(Array.from({ length: Math.max(1, concurrency) }, worker));
  }

  /** Frame t of an episode and camera (a view into the cached episode frames). */
  async frame(episodeIndex: number, camera: string, t: number, size: number | null): Promise<Frame> {
    const f = await this.frames(episodeIndex, camera, size);
    if (!(Number.isInteger(t) && t >= 0 && t < f.count)) throw new DatasetError('bad_argument', `frame ${t} is outside episode ${episodeIndex} (0..${f.count - 1})`);
    const bytes = f.width * f.height * 3;
    return { width: f.width, height: f.height, data: f.data.subarray(t * bytes, (t + 1) * bytes) };
  }
}

/**
 * Opens a LeRobot dataset folder (codebase v2.0, v2.1 or v3.0): reads and checks the metadata,
 * every data parquet (row counts, episode and frame indices) and the presence of every video file.
 * Frames are not decoded here.
 * @throws DatasetError naming the file: `not_found`, `missing_file`, `corrupt_file`,
 *   `unsupported_version`, `bad_metadata`, `row_count_mismatch`.
 */
export async function openDataset(dir: string, opts: OpenOptions = {}): Promise<Dataset> {
  const { meta, files } = await readMeta(dir);
  const byFile = new Map<string, EpisodeMeta[]>();
  for (const e of meta.episodes) byFile.set(e.dataFile, [...(byFile.get(e.dataFile) ?? []), e]);
  const tables = new Map<number, EpisodeTable>();
  for (const [rel, eps] of byFile) {
    for (const t of await readFileTables(meta, eps, files.get(rel) as ParquetHandle)) tables.set(t.episodeIndex, t);
  }
  return new Dataset(meta, tables, files, opts);
}
