/**
 * Training samples: datums at (episode, frame) with images, state, prompt and action chunk;
 * uniform batches over the frames of a set of episodes; and the state rows and action-chunk rows
 * from which norm stats are computed (kernels/normalize.ts computeNormStats takes them).
 */
import { actionChunk, chunkActionRows, pairsFor } from './actions.ts';
import type { Dataset } from './dataset.ts';
import { DatasetError } from './errors.ts';
import { seededRng } from './split.ts';
import type { Rng } from './split.ts';
import type { ActionSpace, Frame, TrainingDatum } from './types.ts';

export interface DatumOptions {
  /** Action horizon ah (chunk length). */
  horizon: number;
  /** Cameras by short or full name; default every camera of the dataset. */
  cameras?: readonly string[];
  /** Square image size (MODEL.md D12 padding), or null for the source size. */
  imageSize: number | null;
  actionSpace: ActionSpace;
}

/**
 * The training datum at frame t of an episode: images at t per camera (keyed by short name),
 * observation.state at t, the task string as prompt, and the action chunk with its mask.
 * @throws DatasetError `unknown_episode`, `unknown_camera`, `bad_argument`, `bad_video`, ...
 */
export async function makeDatum(ds: Dataset, episodeIndex: number, t: number, opts: DatumOptions): Promise<TrainingDatum> {
  const { meta } = ds;
  const table = ds.table(episodeIndex);
  const cams = (opts.cameras ?? meta.cameras.map((c) => c.key)).map((c) => ds.camera(c));
  const { actions, mask } = actionChunk(table, t, opts.horizon, meta.actionDim, meta.stateDim, pairsFor(meta, opts.actionSpace));
  const frames = await Promise.all(cams.map((c) => ds.frame(episodeIndex, c.key, t, opts.imageSize)));
  const images: Record<string, Frame> = {};
  cams.forEach((c, i) => {
    images[c.name] = frames[i];
  });
  return {
    episodeIndex,
    frameIndex: t,
    images,
    state: table.state.slice(t * meta.stateDim, (t + 1) * meta.stateDim),
    prompt: ds.prompt(episodeIndex, t),
    actions,
    actionMask: mask,
    horizon: opts.horizon,
    actionDim: meta.actionDim,
  };
}

export interface BatchOptions extends DatumOptions {
  /** Episodes to draw from (e.g. the train split). */
  episodes: readonly number[];
  batchSize: number;
  /** The generator to draw with (advance it across batches), or a seed for a fresh one. */
  rng?: Rng;
  seed?: number;
}

/**
 * Draws `batchSize` frames uniformly over all frames of the given episodes (with replacement)
 * and builds their datums. Episodes' frames are decoded once and then come from the cache.
 * @throws DatasetError `bad_argument` for an empty episode list or a batch size < 1.
 */
export async function sampleBatch(ds: Dataset, opts: BatchOptions): Promise<TrainingDatum[]> {
  if (!(Number.isInteger(opts.batchSize) && opts.batchSize >= 1)) throw new DatasetError('bad_argument', `batchSize ${opts.batchSize} is not a positive integer`);
  if (opts.episodes.length === 0) throw new DatasetError('bad_argument', 'no episodes to sample from');
  const rng = opts.rng ?? seededRng(opts.seed ?? 0);
  const ends: number[] = []; // cumulative frame counts
  let total = 0;
  for (const e of opts.episodes) {
    total += ds.episode(e).length;
    ends.push(total);
  }
  const picks: [number, number][] = [];
  for (let b = 0; b < opts.batchSize; b++) {
    const g = Math.min(total - 1, Math.floor(rng() * total));
    let lo = 0;
    let hi = ends.length - 1;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (ends[mid] > g) hi = mid;
      else lo = mid + 1;
    }
    picks.push([opts.episodes[lo], g - (lo > 0 ? ends[lo - 1] : 0)]);
  }
  return Promise.all(picks.map(([e, t]) => makeDatum(ds, e, t, opts)));
}

export interface NormRows {
  /** Rows N of `state` (frames of the episodes). */
  count: number;
  stateDim: number;
  actionDim: number;
  /** [N, s] row-major. */
  state: Float32Array;
  /**
   * [M, ad] row-major: every valid action-chunk entry in the chosen space (actions.ts
   * chunkActionRows): action[t + k] - state[t] on shared dims for delta, k < horizon.
   */
  action: Float32Array;
}

/**
 * The rows norm stats are computed from: every state of the given episodes, and every action-chunk
 * entry the model is trained on (horizon `horizon`, padding excluded) in `space`. horizon 1 gives
 * per-frame actions (action[t] - state[t] for delta).
 * @throws DatasetError `unknown_episode`; `bad_argument` for `delta` without shared names or a bad horizon.
 */
export function gatherNormRows(ds: Dataset, episodes: readonly number[], space: ActionSpace, horizon: number): NormRows {
  const { stateDim, actionDim } = ds.meta;
  const pairs = pairsFor(ds.meta, space);
  const tables = episodes.map((e) => ds.table(e));
  const count = tables.reduce((s, t) => s + t.length, 0);
  const state = new Float32Array(count * stateDim);
  let row = 0;
  for (const t of tables) {
    state.set(t.state, row * stateDim);
    row += t.length;
  }
  return { count, stateDim, actionDim, state, action: chunkActionRows(tables, horizon, actionDim, stateDim, pairs) };
}
