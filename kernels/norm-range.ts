/**
 * Observations far outside the stats a policy normalises with: the most reported silent failure
 * of openpi users (a state in degrees where training saw radians, the stats of another robot,
 * state dims in another order). The model still answers, with actions from far outside its
 * training data; this finds the dims that show it. Pure: plain arrays in, a report out.
 *
 * "Far outside" in the normalised space the model sees (kernels/normalize.ts's transforms):
 * - zscore: |z| > 6 (default): six standard deviations from the training mean.
 * - quantile: outside [-3, 3] (default): [-1, 1] is q01..q99, so 3 is one full q01..q99 width
 *   beyond q99 (or below q01).
 * A dim whose training values were constant (std 0, or q01 = q99) normalises any other value to
 * about 1e6, so it is reported too: training never saw a change there either.
 */
import type { NormMode, NormStats } from './normalize.ts';

const EPS = 1e-6; // as kernels/normalize.ts

/** Default limits in the normalised space. */
export const OUT_OF_RANGE_LIMITS: Readonly<Record<NormMode, number>> = Object.freeze({ zscore: 6, quantile: 3 });

/** One dim outside the limit. */
export interface OutOfRangeDim {
  dim: number;
  /** The raw value, in the robot's units. */
  value: number;
  /** The value normalised as the model sees it. */
  normalized: number;
  /** The raw values at -limit and +limit: what the stats accept before this report. */
  low: number;
  high: number;
}

/** What outOfRange reports for one state vector. */
export interface OutOfRangeReport {
  mode: NormMode;
  limit: number;
  /** Every dim outside the limit, in dim order. */
  dims: OutOfRangeDim[];
  /** The dim with the largest |normalized|. */
  worst: OutOfRangeDim;
}

/**
 * The dims of a raw state vector whose normalised value is outside [-limit, limit].
 * Dims past the stats' length are not checked (they are padding the model never normalises).
 * @param state raw values, the robot's units (length <= the stats' or more).
 * @param stats the stats the policy normalises this vector with.
 * @param mode the transform: zscore (limit 6 by default) or quantile (limit 3).
 * @param limit the bound in the normalised space, > 0.
 * @returns null when every dim is within the limit (or non-finite: the caller refuses those).
 * @example outOfRange([57.3], { mean: [0], std: [0.5], q01: [-1], q99: [1] }, 'zscore')
 *   -> { dims: [{ dim: 0, value: 57.3, normalized: 114.6, low: -3, high: 3 }], ... }
 */
export function outOfRange(state: ArrayLike<number>, stats: NormStats, mode: NormMode, limit = OUT_OF_RANGE_LIMITS[mode]): OutOfRangeReport | null {
  if (!(limit > 0)) throw new RangeError(`limit is ${limit}; it must be > 0`);
  const dims: OutOfRangeDim[] = [];
  const n = Math.min(state.length, stats.mean.length);
  for (let j = 0; j < n; j++) {
    const v = state[j]!;
    let z: number;
    let low: number;
    let high: number;
    if (mode === 'zscore') {
      const s = stats.std[j]! + EPS;
      z = (v - stats.mean[j]!) / s;
      low = stats.mean[j]! - limit * s;
      high = stats.mean[j]! + limit * s;
    } else {
      const w = stats.q99[j]! - stats.q01[j]! + EPS;
      z = ((v - stats.q01[j]!) / w) * 2 - 1;
      low = ((1 - limit) / 2) * w + stats.q01[j]!;
      high = ((limit + 1) / 2) * w + stats.q01[j]!;
    }
    if (Number.isFinite(z) && Math.abs(z) > limit) dims.push({ dim: j, value: v, normalized: z, low, high });
  }
  if (dims.length === 0) return null;
  const worst = dims.reduce((a, b) => (Math.abs(b.normalized) > Math.abs(a.normalized) ? b : a));
  return { mode, limit, dims, worst };
}
