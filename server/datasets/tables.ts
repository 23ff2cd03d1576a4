/**
 * Loads the low-dimensional columns (observation.state, action, timestamp, frame_index,
 * episode_index, task_index) of every episode from the data parquet files, and checks that each
 * episode's rows are where the metadata says: the right count, the right episode_index, frame_index
 * counting up from 0.
 */
import { DatasetError } from './errors.ts';
import { num, readRows } from './parquet.ts';
import type { ParquetHandle } from './parquet.ts';
import type { DatasetMeta, EpisodeMeta, EpisodeTable } from './types.ts';

function fillVector(out: Float32Array, row: number, dim: number, v: unknown, what: string, rel: string, ep: number, t: number): void {
  const arr = v as ArrayLike<number> | null;
  if (!arr || typeof arr !== 'object' || arr.length !== dim) {
    throw new DatasetError('bad_metadata', `${rel}: episode ${ep} frame ${t} ${what} has ${arr && typeof arr === 'object' ? arr.length : typeof v} values; info.json says ${dim}`);
  }
  for (let i = 0; i < dim; i++) out[row * dim + i] = Number(arr[i]);
}

/**
 * Reads the low-dimensional columns of the episodes stored in one data file, with one pass over
 * the file (a v3.0 file holds many episodes; reading each episode's range separately would decode
 * shared row groups again and again).
 * @throws DatasetError `corrupt_file` (undecodable parquet), `row_count_mismatch` (rows of another
 *   episode, or a frame_index out of order), `bad_metadata` (a missing column, a vector of the
 *   wrong length).
 */
export async function readFileTables(meta: DatasetMeta, eps: EpisodeMeta[], h: ParquetHandle): Promise<EpisodeTable[]> {
  const { stateDim, actionDim } = meta;
  const wanted = ['observation.state', 'action', 'timestamp', 'frame_index', 'episode_index', 'task_index'];
  const missing = wanted.slice(0, 2).filter((c) => !h.columns.includes(c));
  if (missing.length) throw new DatasetError('bad_metadata', `${h.rel} lacks the column(s) ${missing.join(', ')}`);
  const cols = wanted.filter((c) => h.columns.includes(c));
  const first = Math.min(...eps.map((e) => e.rowStart));
  const end = Math.max(...eps.map((e) => e.rowStart + e.length));
  const rows = await readRows(h, cols, first, end);
  if (rows.length !== end - first) {
    throw new DatasetError('row_count_mismatch', `${h.rel}: rows ${first}..${end - 1} were asked for but ${rows.length} were read`);
  }
  return eps.map((ep) => {
    const t: EpisodeTable = {
      episodeIndex: ep.index,
      length: ep.length,
      state: new Float32Array(ep.length * stateDim),
      action: new Float32Array(ep.length * actionDim),
      timestamp: new Float64Array(ep.length),
      taskIndex: new Int32Array(ep.length).fill(-1),
    };
    for (let i = 0; i < ep.length; i++) {
      const row = ep.rowStart + i;
      const r = rows[row - first];
      if ('episode_index' in r && num(r.episode_index) !== ep.index) {
        throw new DatasetError('row_count_mismatch', `${h.rel}: row ${row} belongs to episode ${num(r.episode_index)}, but the metadata places frame ${i} of episode ${ep.index} there`);
      }
      if ('frame_index' in r && num(r.frame_index) !== i) {
        throw new DatasetError('row_count_mismatch', `${h.rel}: episode ${ep.index} row ${row} has frame_index ${num(r.frame_index)}; expected ${i}`);
      }
      fillVector(t.state, i, stateDim, r['observation.state'], 'observation.state', h.rel, ep.index, i);
      fillVector(t.action, i, actionDim, r.action, 'action', h.rel, ep.index, i);
      t.timestamp[i] = 'timestamp' in r ? num(r.timestamp) : i / meta.fps;
      if ('task_index' in r) t.taskIndex[i] = num(r.task_index);
    }
    return t;
  });
}
