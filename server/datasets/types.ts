/**
 * Types of the LeRobot dataset reader. Axis names as in the rest of the project: `ah` action
 * horizon, `ad` action dim, `s` state dim; `l` is an episode's length in frames.
 */

/** Codebase versions we read. v2.0 and v2.1 share a layout (one parquet/mp4 per episode). */
export type CodebaseVersion = 'v2.0' | 'v2.1' | 'v3.0';

/** A camera: a feature of dtype `video` (mp4 files) or `image` (encoded bytes in the parquet). */
export interface CameraMeta {
  /** Full feature key, e.g. `observation.images.cam_high`. */
  key: string;
  /** Short name: the key's last segment after `observation.images.` (`cam_high`). */
  name: string;
  kind: 'video' | 'image';
  /** Source size in pixels from info.json (0 when info.json does not say). */
  height: number;
  width: number;
  /** `video.codec` from info.json (`av1`, `h264`, ...), null for image features or when absent. */
  codec: string | null;
}

/** Where one camera's frames of one episode live in a video file. */
export interface EpisodeVideo {
  /** Path relative to the dataset root. */
  file: string;
  /** Seconds into the file where the episode starts (0 for v2.x, where each file is one episode). */
  fromS: number;
  /** Seconds into the file where it ends (null when the metadata does not say: v2.x). */
  toS: number | null;
}

export interface EpisodeMeta {
  index: number;
  /** Frames (parquet rows) in the episode. */
  length: number;
  /** Task strings from the episodes metadata (the per-frame task_index may also vary). */
  tasks: string[];
  /** Data parquet path relative to the dataset root. */
  dataFile: string;
  /** First row of the episode inside `dataFile` (0 for v2.x). */
  rowStart: number;
  /** Video location per camera key (video cameras only). */
  videos: Record<string, EpisodeVideo>;
}

export interface DatasetMeta {
  /** Absolute path of the dataset folder. */
  root: string;
  codebaseVersion: CodebaseVersion;
  fps: number;
  robotType: string | null;
  totalFrames: number;
  /** Sorted by `index`. */
  episodes: EpisodeMeta[];
  /** task_index -> task string. */
  tasks: Map<number, string>;
  cameras: CameraMeta[];
  stateDim: number;
  actionDim: number;
  /** Per-dimension names from info.json, or null when the dataset gives none. */
  stateNames: string[] | null;
  actionNames: string[] | null;
}

/** The low-dimensional columns of one episode, in frame order. */
export interface EpisodeTable {
  episodeIndex: number;
  length: number;
  /** [l, s] row-major. */
  state: Float32Array;
  /** [l, ad] row-major. */
  action: Float32Array;
  /** [l] seconds from the episode start. */
  timestamp: Float64Array;
  /** [l] per-frame task index (-1 where the column is absent). */
  taskIndex: Int32Array;
}

/** Decoded RGB frames of one (episode, camera, size): `count` frames of [height, width, 3] uint8. */
export interface EpisodeFrames {
  count: number;
  height: number;
  width: number;
  /** [count, height, width, 3] row-major RGB. */
  data: Uint8Array;
}

/** One frame, [height, width, 3] uint8 RGB (a view into the cached episode frames). */
export interface Frame {
  height: number;
  width: number;
  data: Uint8Array;
}

/** `absolute` actions, or `delta`: action minus the current state on dimensions shared by name. */
export type ActionSpace = 'delta' | 'absolute';

/**
 * A training sample at frame t of an episode (PROTOCOL.md section 3's datum, before encoding).
 * Images are keyed by the camera's short name.
 */
export interface TrainingDatum {
  episodeIndex: number;
  frameIndex: number;
  images: Record<string, Frame>;
  /** [s] observation.state at t. */
  state: Float32Array;
  prompt: string;
  /** [ah, ad] row-major: action[t : t + ah] in the chosen space, padded with the last action. */
  actions: Float32Array;
  /** [ah] 1 where the action is inside the episode, 0 where it is padding. */
  actionMask: Float32Array;
  horizon: number;
  actionDim: number;
}
