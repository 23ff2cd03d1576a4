/**
 * Normalisation statistics and transforms (MODEL.md "Normalisation"), in plain JS on flat
 * row-major Float32Arrays so that the policy server and dataset code can use them without TF.js.
 *
 * Processing order, written once here: raw -> (delta actions, when the action space is `delta`)
 * -> normalise -> model -> unnormalise -> (add the state back) -> raw.
 *
 * - pi0 presets: z-score `(x - mean) / (std + 1e-6)`.
 * - pi0.5 presets: quantile `(x - q01) / (q99 - q01 + 1e-6) * 2 - 1` (no clipping, as openpi).
 * Those are openpi's transforms (openpi `transforms.py` Normalize / Unnormalize), which Vela's own
 * training uses. A LeRobot checkpoint's stats are applied as LeRobot applies them
 * (`lerobot/processor/normalize_processor.py` _NormalizationMixin._apply_transform): z-score
 * `(x - mean) / (std + eps)` but `x * std + mean` back, quantile `2 (x - q01) / (q99 - q01) - 1`
 * with eps only where q99 == q01 (eps from the step's config, 1e-8 by default); see normalizerOf.
 * Data whose last dimension d is smaller than the stats' uses the first d stats (openpi slices
 * the same way, since padded dimensions come last).
 */

export type NormErrorCode =
  | 'bad_stats' // stats with unequal lengths, non-finite values or a negative std
  | 'shape_mismatch' // data whose size or last dimension does not fit
  | 'bad_input' // empty data, an unknown preset family, an impossible delta mask
  | 'bad_json'; // norm_stats.json not in the openpi layout

export class NormError extends Error {
  readonly code: NormErrorCode;
  constructor(code: NormErrorCode, message: string) {
    super(message);
    this.name = 'NormError';
    this.code = code;
  }
}

/** Per-dimension statistics of one key (`state` or `actions`); all four arrays have length D. */
export interface NormStats {
  mean: number[];
  /** Population standard deviation (ddof 0, as np.std). */
  std: number[];
  /** 1% quantile, np.quantile's default linear interpolation. */
  q01: number[];
  /** 99% quantile, likewise. */
  q99: number[];
}

/** The stats of a dataset, keyed as openpi keys them. */
export interface NormStatsSet {
  state: NormStats;
  actions: NormStats;
}

export type NormMode = 'zscore' | 'quantile';

const EPS = 1e-6;

/**
 * np.quantile(sorted, q) with method 'linear' on an ascending array, reproducing numpy's
 * arithmetic exactly: index (n - 1) * q, neighbours floor(index) and floor(index) + 1 (both the
 * last element at or past the end), and numpy's two-sided lerp: a + (b - a) * g for g < 0.5,
 * b - (b - a) * (1 - g) otherwise.
 */
export function quantileSorted(sorted: ArrayLike<number>, q: number): number {
  const n = sorted.length;
  if (n === 0) throw new NormError('bad_input', 'quantile of an empty array');
  const index = (n - 1) * q;
  if (index >= n - 1) return sorted[n - 1]!;
  if (index < 0) return sorted[0]!;
  const lo = Math.floor(index);
  const a = sorted[lo]!;
  const b = sorted[lo + 1]!;
  const g = index - lo;
  const diff = b - a;
  return g >= 0.5 ? b - diff * (1 - g) : a + diff * g;
}

/**
 * Stats of N rows of D values, in float64: mean, population std (two-pass), q01, q99 (see
 * quantileSorted). Rows are given either as an array of D-length rows or as one flat row-major
 * array with its dimension: `computeNormStats({ data, dim })`. Throws NormError('bad_input') on
 * no rows or rows of unequal length ('shape_mismatch').
 */
export function computeNormStats(rows: ArrayLike<number>[] | { data: ArrayLike<number>; dim: number }): NormStats {
  let n: number;
  let d: number;
  let at: (i: number, j: number) => number;
  if (Array.isArray(rows)) {
    n = rows.length;
    if (n === 0) throw new NormError('bad_input', 'cannot compute norm stats of 0 rows');
    d = rows[0]!.length;
    rows.forEach((r, i) => {
      if (r.length !== d) throw new NormError('shape_mismatch', `row ${i} has ${r.length} values; row 0 has ${d}`);
    });
    at = (i, j) => rows[i]![j]!;
  } else {
    const { data, dim } = rows as { data: ArrayLike<number>; dim: number };
    if (!Number.isInteger(dim) || dim <= 0 || data.length % dim !== 0) {
      throw new NormError('shape_mismatch', `${data.length} values do not split into rows of ${dim}`);
    }
    d = dim;
    n = data.length / dim;
    if (n === 0) throw new NormError('bad_input', 'cannot compute norm stats of 0 rows');
    at = (i, j) => data[i * dim + j]!;
  }
  const out: NormStats = { mean: [], std: [], q01: [], q99: [] };
  const col = new Float64Array(n);
  for (let j = 0; j < d; j++) {
    let sum = 0;
    for (let i = 0; i < n; i++) {
      col[i] = at(i, j);
      sum += col[i]!;
    }
    const mean = sum / n;
    let ss = 0;
    for (let i = 0; i < n; i++) ss += (col[i]! - mean) ** 2;
    col.sort();
    out.mean.push(mean);
    out.std.push(Math.sqrt(ss / n));
    out.q01.push(quantileSorted(col, 0.01));
    out.q99.push(quantileSorted(col, 0.99));
  }
  return out;
}

/** Checks that all four arrays have one length and finite values, std >= 0; returns D. */
export function validateNormStats(stats: NormStats, key = 'stats'): number {
  const d = stats.mean?.length;
  for (const f of ['mean', 'std', 'q01', 'q99'] as const) {
    const a = stats[f];
    if (!Array.isArray(a) || a.length !== d) {
      throw new NormError('bad_stats', `${key}.${f} has ${Array.isArray(a) ? a.length : 'no'} values; ${key}.mean has ${d}`);
    }
    const bad = a.findIndex((x) => typeof x !== 'number' || !Number.isFinite(x));
    if (bad >= 0) throw new NormError('bad_stats', `${key}.${f}[${bad}] is ${a[bad]}; stats must be finite numbers`);
  }
  const neg = stats.std.findIndex((x) => x < 0);
  if (neg >= 0) throw new NormError('bad_stats', `${key}.std[${neg}] is ${stats.std[neg]}; it must be >= 0`);
  return d;
}

function checkDim(x: ArrayLike<number>, dim: number, stats: NormStats): void {
  const d = stats.mean.length;
  if (!Number.isInteger(dim) || dim <= 0 || dim > d) {
    throw new NormError('shape_mismatch', `data dimension is ${dim}; the stats have ${d} dimensions`);
  }
  if (x.length % dim !== 0) throw new NormError('shape_mismatch', `${x.length} values do not split into rows of ${dim}`);
}

function apply(x: ArrayLike<number>, dim: number, stats: NormStats, f: (v: number, j: number) => number): Float32Array {
  checkDim(x, dim, stats);
  const out = new Float32Array(x.length);
  for (let i = 0; i < x.length; i++) out[i] = f(x[i]!, i % dim);
  return out;
}

/** z-score: (x - mean) / (std + 1e-6) over the last dimension `dim` of flat data; a new array. */
export function zscore(x: ArrayLike<number>, dim: number, s: NormStats): Float32Array {
  return apply(x, dim, s, (v, j) => (v - s.mean[j]!) / (s.std[j]! + EPS));
}

/** Inverse of zscore: x * (std + 1e-6) + mean. */
export function unzscore(x: ArrayLike<number>, dim: number, s: NormStats): Float32Array {
  return apply(x, dim, s, (v, j) => v * (s.std[j]! + EPS) + s.mean[j]!);
}

/** Quantile: (x - q01) / (q99 - q01 + 1e-6) * 2 - 1; maps [q01, q99] to about [-1, 1]. */
export function quantileNormalize(x: ArrayLike<number>, dim: number, s: NormStats): Float32Array {
  return apply(x, dim, s, (v, j) => ((v - s.q01[j]!) / (s.q99[j]! - s.q01[j]! + EPS)) * 2 - 1);
}

/** Inverse of quantileNormalize: (x + 1) / 2 * (q99 - q01 + 1e-6) + q01. */
export function quantileUnnormalize(x: ArrayLike<number>, dim: number, s: NormStats): Float32Array {
  return apply(x, dim, s, (v, j) => ((v + 1) / 2) * (s.q99[j]! - s.q01[j]! + EPS) + s.q01[j]!);
}

/**
 * Whose arithmetic applies the stats: openpi's (1e-6 added to std and to the quantile range, in
 * both directions) or LeRobot's (eps added to std only when normalising, and to a quantile range
 * only where it is zero). The stats are the same numbers; at a std of 0.08 the two z-scores differ
 * by ~1.2e-5 relative, so a checkpoint is served with the convention it was trained with.
 */
export type NormConvention = 'openpi' | 'lerobot';

/** LeRobot's NormalizerProcessorStep default eps. */
export const LEROBOT_NORM_EPS = 1e-8;

/** LeRobot's z-score: (x - mean) / (std + eps). */
function lerobotZscore(eps: number): Normalizer['normalize'] {
  return (x, dim, s) => apply(x, dim, s, (v, j) => (v - s.mean[j]!) / (s.std[j]! + eps));
}

/** LeRobot's inverse z-score: x * std + mean (no eps). */
function lerobotUnzscore(x: ArrayLike<number>, dim: number, s: NormStats): Float32Array {
  return apply(x, dim, s, (v, j) => v * s.std[j]! + s.mean[j]!);
}

/** LeRobot's quantile range: q99 - q01, or eps where they are equal. */
const lerobotRange = (s: NormStats, j: number, eps: number): number => {
  const d = s.q99[j]! - s.q01[j]!;
  return d === 0 ? eps : d;
};

export interface Normalizer {
  mode: NormMode;
  convention: NormConvention;
  normalize(x: ArrayLike<number>, dim: number, stats: NormStats): Float32Array;
  unnormalize(x: ArrayLike<number>, dim: number, stats: NormStats): Float32Array;
}

const NORMALIZERS: Record<NormMode, Normalizer> = {
  zscore: { mode: 'zscore', convention: 'openpi', normalize: zscore, unnormalize: unzscore },
  quantile: { mode: 'quantile', convention: 'openpi', normalize: quantileNormalize, unnormalize: quantileUnnormalize },
};

/**
 * The transform of `mode` in `convention`'s arithmetic (NormConvention). `eps` is LeRobot's
 * (the normalizer step's `eps`, LEROBOT_NORM_EPS by default); openpi's is fixed at 1e-6.
 * @throws NormError('bad_input') for an unknown mode or convention, or an eps that is not a finite number >= 0.
 */
export function normalizerOf(mode: NormMode, convention: NormConvention = 'openpi', eps = LEROBOT_NORM_EPS): Normalizer {
  if (mode !== 'zscore' && mode !== 'quantile') throw new NormError('bad_input', `mode is ${JSON.stringify(mode)}; expected zscore or quantile`);
  if (convention === 'openpi') return NORMALIZERS[mode];
  if (convention !== 'lerobot') throw new NormError('bad_input', `convention is ${JSON.stringify(convention)}; expected openpi or lerobot`);
  if (!Number.isFinite(eps) || eps < 0) throw new NormError('bad_input', `eps is ${eps}; expected a finite number >= 0`);
  if (mode === 'zscore') return { mode, convention, normalize: lerobotZscore(eps), unnormalize: lerobotUnzscore };
  return {
    mode,
    convention,
    normalize: (x, dim, s) => apply(x, dim, s, (v, j) => (2 * (v - s.q01[j]!)) / lerobotRange(s, j, eps) - 1),
    unnormalize: (x, dim, s) => apply(x, dim, s, (v, j) => ((v + 1) * lerobotRange(s, j, eps)) / 2 + s.q01[j]!),
  };
}

/**
 * The transform of a preset family or variant: pi0's design (`pi0`, `flow0-tiny`, `flow0-small`,
 * and the deprecated `pi0-tiny`, `pi0-small`) z-score, pi0.5's (`pi05`, `flow05-*`, `pi05-*`)
 * quantile. Throws NormError('bad_input') for anything else.
 */
export function normalizerFor(presetOrFamily: string): Normalizer {
  const family = presetOrFamily.split('-')[0];
  if (family === 'pi0' || family === 'flow0') return NORMALIZERS.zscore;
  if (family === 'pi05' || family === 'flow05') return NORMALIZERS.quantile;
  throw new NormError('bad_input', `preset family of '${presetOrFamily}' is not pi0's (pi0, flow0) or pi0.5's (pi05, flow05)`);
}

/**
 * `norm_stats.json` text in openpi's layout:
 * `{"norm_stats": {"state": {"mean", "std", "q01", "q99"}, "actions": {...}}}`.
 */
export function normStatsToJson(set: NormStatsSet): string {
  validateNormStats(set.state, 'state');
  validateNormStats(set.actions, 'actions');
  const pick = (s: NormStats) => ({ mean: s.mean, std: s.std, q01: s.q01, q99: s.q99 });
  return JSON.stringify({ norm_stats: { state: pick(set.state), actions: pick(set.actions) } }, null, 2) + '\n';
}

/** Parses and validates `norm_stats.json` (text or parsed JSON); NormError 'bad_json' / 'bad_stats'. */
export function parseNormStats(json: string | unknown): NormStatsSet {
  let obj: unknown = json;
  if (typeof json === 'string') {
    try {
      obj = JSON.parse(json);
    } catch (err) {
      throw new NormError('bad_json', `norm_stats.json is not JSON: ${(err as Error).message}`);
    }
  }
  const root = (obj as { norm_stats?: unknown } | null)?.norm_stats as Record<string, unknown> | undefined;
  if (!root || typeof root !== 'object') throw new NormError('bad_json', 'norm_stats.json has no "norm_stats" object');
  const get = (key: 'state' | 'actions'): NormStats => {
    const s = root[key] as Record<string, unknown> | undefined;
    if (!s || typeof s !== 'object') throw new NormError('bad_json', `norm_stats.json has no "${key}" stats`);
    const stats = { mean: s.mean, std: s.std, q01: s.q01, q99: s.q99 } as NormStats;
    validateNormStats(stats, key);
    return stats;
  };
  return { state: get('state'), actions: get('actions') };
}

function checkDelta(actions: ArrayLike<number>, actionDim: number, state: ArrayLike<number>, mask: readonly boolean[]): void {
  if (!Number.isInteger(actionDim) || actionDim <= 0 || actions.length % actionDim !== 0) {
    throw new NormError('shape_mismatch', `${actions.length} action values do not split into rows of ${actionDim}`);
  }
  if (mask.length > actionDim || mask.length > state.length) {
    throw new NormError('shape_mismatch', `delta mask has ${mask.length} entries; actions have ${actionDim} dims and state ${state.length}`);
  }
}

/**
 * openpi's DeltaActions: for every row of `actions` ([H, A] flat) and every dimension i with
 * mask[i], actions[h, i] - state[i]; other dimensions unchanged. A new array.
 */
export function toDeltaActions(actions: ArrayLike<number>, actionDim: number, state: ArrayLike<number>, mask: readonly boolean[]): Float32Array {
  checkDelta(actions, actionDim, state, mask);
  const out = Float32Array.from(actions);
  for (let i = 0; i < out.length; i++) {
    const j = i % actionDim;
    if (mask[j]) out[i] = out[i]! - state[j]!;
  }
  return out;
}

/** openpi's AbsoluteActions, the inverse of toDeltaActions: adds state[i] back where mask[i]. */
export function toAbsoluteActions(actions: ArrayLike<number>, actionDim: number, state: ArrayLike<number>, mask: readonly boolean[]): Float32Array {
  checkDelta(actions, actionDim, state, mask);
  const out = Float32Array.from(actions);
  for (let i = 0; i < out.length; i++) {
    const j = i % actionDim;
    if (mask[j]) out[i] = out[i]! + state[j]!;
  }
  return out;
}

/**
 * The delta mask for dimensions that state and action share by name: mask[i] is true when
 * action dimension i has the name of state dimension i. openpi's transform pairs dimensions by
 * index, so a shared name at two different indices is refused (NormError 'bad_input').
 */
export function deltaMaskFromNames(stateNames: readonly string[], actionNames: readonly string[]): boolean[] {
  return actionNames.map((name, i) => {
    if (stateNames[i] === name) return true;
    const j = stateNames.indexOf(name);
    if (j >= 0) throw new NormError('bad_input', `action dimension ${i} (${name}) is state dimension ${j}; delta actions pair dimensions by index`);
    return false;
  });
}
