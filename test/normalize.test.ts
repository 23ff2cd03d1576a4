import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import {
  NormError,
  computeNormStats,
  deltaMaskFromNames,
  normStatsToJson,
  normalizerFor,
  normalizerOf,
  parseNormStats,
  quantileNormalize,
  quantileSorted,
  quantileUnnormalize,
  toAbsoluteActions,
  toDeltaActions,
  unzscore,
  zscore,
  type NormStats,
} from '../kernels/normalize.ts';

const ref = JSON.parse(readFileSync(new URL('./vectors/normalize/norm.json', import.meta.url), 'utf8')) as {
  n: number;
  d: number;
  data: number[];
  stats: NormStats;
  rows: number;
  zscore: number[];
  quantile: number[];
  delta: { actions: number[]; action_dim: number; state: number[]; mask: boolean[]; expected: number[] };
};
const data = Float32Array.from(ref.data);
const head = data.subarray(0, ref.rows * ref.d);

function expectRel(ours: number[], theirs: number[], rel: number): void {
  expect(ours.length).toBe(theirs.length);
  ours.forEach((v, i) => expect(Math.abs(v - theirs[i]!), `index ${i}: ${v} vs ${theirs[i]}`).toBeLessThanOrEqual(rel * Math.max(1, Math.abs(theirs[i]!))));
}

describe('computeNormStats against numpy', () => {
  it('q01 / q99 equal np.quantile (linear) exactly; mean / std within 1e-12', () => {
    const s = computeNormStats({ data, dim: ref.d });
    expect(s.q01).toEqual(ref.stats.q01);
    expect(s.q99).toEqual(ref.stats.q99);
    // numpy sums pairwise, we sum in order: both float64, differences are rounding only.
    expectRel(s.mean, ref.stats.mean, 1e-12);
    expectRel(s.std, ref.stats.std, 1e-12);
    expect(s.std[3]).toBe(0);
  });

  it('takes rows as an array of arrays too', () => {
    const rows = Array.from({ length: ref.n }, (_, i) => data.subarray(i * ref.d, (i + 1) * ref.d));
    expect(computeNormStats(rows)).toEqual(computeNormStats({ data, dim: ref.d }));
  });

  it('quantileSorted by hand: np.quantile([1, 2, 4, 8], q)', () => {
    // index (n-1) q = 3 q: q=0.5 -> 1.5 -> 2 + (4-2)*0.5 = 3; q=0.01 -> 0.03 -> 1.03;
    // q=0.99 -> 2.97 -> 8 - 4 * 0.03 = 7.88; q=1 -> 8.
    const a = [1, 2, 4, 8];
    expect(quantileSorted(a, 0.5)).toBe(3);
    expect(quantileSorted(a, 0.01)).toBe(1 + 1 * (3 * 0.01));
    expect(quantileSorted(a, 0.99)).toBe(8 - 4 * (1 - (3 * 0.99 - 2)));
    expect(quantileSorted(a, 1)).toBe(8);
    expect(quantileSorted([5], 0.01)).toBe(5);
  });

  it('refuses empty data and ragged rows', () => {
    expect(() => computeNormStats([])).toThrow(NormError);
    expect(() => computeNormStats([[1, 2], [3]])).toThrow(/row 1 has 1 values; row 0 has 2/);
    expect(() => computeNormStats({ data: new Float32Array(5), dim: 2 })).toThrow(/5 values do not split into rows of 2/);
  });
});

describe('transforms', () => {
  const s = ref.stats;

  it('z-score and quantile equal the numpy values (float32) and invert', () => {
    expect(Array.from(zscore(head, ref.d, s))).toEqual(ref.zscore.map(Math.fround));
    expect(Array.from(quantileNormalize(head, ref.d, s))).toEqual(ref.quantile.map(Math.fround));
    const back1 = unzscore(zscore(head, ref.d, s), ref.d, s);
    const back2 = quantileUnnormalize(quantileNormalize(head, ref.d, s), ref.d, s);
    for (const back of [back1, back2]) {
      // Two float32 roundings; the constant column (std 0, q99 == q01) magnifies by 1 / 1e-6.
      back.forEach((v, i) => {
        const tol = i % ref.d === 3 ? 1e-6 : 4e-6 * Math.max(1, Math.abs(head[i]!));
        expect(Math.abs(v - head[i]!)).toBeLessThanOrEqual(tol);
      });
    }
  });

  it('formulas by hand on one value', () => {
    const one: NormStats = { mean: [2], std: [4], q01: [-1], q99: [3] };
    expect(zscore([10], 1, one)[0]).toBe(Math.fround(8 / (4 + 1e-6)));
    expect(quantileNormalize([3], 1, one)[0]).toBe(Math.fround((4 / (4 + 1e-6)) * 2 - 1));
    expect(quantileNormalize([-1], 1, one)[0]).toBe(-1);
    expect(quantileUnnormalize([-1], 1, one)[0]).toBe(-1);
  });

  it('data with fewer dimensions than the stats uses the first ones; more is refused', () => {
    const two = zscore(head.subarray(0, 4), 2, s);
    expect(two[0]).toBe(Math.fround((head[0]! - s.mean[0]!) / (s.std[0]! + 1e-6)));
    expect(two[3]).toBe(Math.fround((head[3]! - s.mean[1]!) / (s.std[1]! + 1e-6)));
    expect(() => zscore(new Float32Array(12), 6, s)).toThrow(/data dimension is 6; the stats have 5/);
  });

  it('normalizerFor: pi0 presets z-score, pi0.5 presets quantile', () => {
    for (const p of ['pi0', 'flow0-tiny', 'flow0-small']) expect(normalizerFor(p).mode).toBe('zscore');
    for (const p of ['pi05', 'flow05-tiny', 'flow05-small']) expect(normalizerFor(p).mode).toBe('quantile');
    expect(normalizerFor('flow05-tiny').normalize(head, ref.d, s)).toEqual(quantileNormalize(head, ref.d, s));
    expect(() => normalizerFor('gpt2')).toThrow(/preset family of 'gpt2'/);
  });
});

describe('norm_stats.json', () => {
  it('writes the openpi layout and reads it back', () => {
    const set = { state: ref.stats, actions: computeNormStats([[1, 2], [3, 5]]) };
    const text = normStatsToJson(set);
    const obj = JSON.parse(text);
    expect(Object.keys(obj)).toEqual(['norm_stats']);
    expect(Object.keys(obj.norm_stats)).toEqual(['state', 'actions']);
    expect(Object.keys(obj.norm_stats.actions)).toEqual(['mean', 'std', 'q01', 'q99']);
    expect(obj.norm_stats.actions.std).toEqual([1, 1.5]);
    expect(parseNormStats(text)).toEqual(set);
    expect(parseNormStats(obj)).toEqual(set);
  });

  it('refuses malformed stats with codes', () => {
    const ok = { mean: [0], std: [1], q01: [0], q99: [1] };
    const code = (v: unknown) => {
      try {
        parseNormStats(v);
        return 'ok';
      } catch (e) {
        return `${(e as NormError).code}: ${(e as Error).message}`;
      }
    };
    expect(code('{')).toMatch(/^bad_json/);
    expect(code({ state: ok, actions: ok })).toMatch(/^bad_json: .*no "norm_stats"/);
    expect(code({ norm_stats: { state: ok } })).toMatch(/^bad_json: .*no "actions"/);
    expect(code({ norm_stats: { state: ok, actions: { ...ok, std: [1, 2] } } })).toMatch(/^bad_stats: actions.std has 2 values; actions.mean has 1/);
    expect(code({ norm_stats: { state: { ...ok, std: [-1] }, actions: ok } })).toMatch(/^bad_stats: state.std\[0\] is -1/);
    expect(code({ norm_stats: { state: { ...ok, q99: [null] }, actions: ok } })).toMatch(/^bad_stats: state.q99\[0\] is null/);
    expect(code({ norm_stats: { state: ok, actions: ok } })).toBe('ok');
  });
});

describe('delta actions', () => {
  const dl = ref.delta;
  it('toDeltaActions equals openpi DeltaActions (numpy) and toAbsoluteActions undoes it', () => {
    const delta = toDeltaActions(dl.actions, dl.action_dim, dl.state, dl.mask);
    expect(Array.from(delta)).toEqual(dl.expected);
    const back = toAbsoluteActions(delta, dl.action_dim, dl.state, dl.mask);
    back.forEach((v, i) => expect(Math.abs(v - dl.actions[i]!)).toBeLessThanOrEqual(1e-6 * Math.max(1, Math.abs(dl.actions[i]!))));
    // Unmasked dimension 2 is untouched bit for bit.
    expect(delta[2]).toBe(Math.fround(dl.actions[2]!));
  });

  it('a short mask leaves the later dimensions alone; a long one is refused', () => {
    expect(Array.from(toDeltaActions([5, 6, 7, 8], 2, [1, 2], [true]))).toEqual([4, 6, 6, 8]);
    expect(() => toDeltaActions([1, 2], 2, [1], [true, true])).toThrow(/delta mask has 2 entries; actions have 2 dims and state 1/);
  });

  it('deltaMaskFromNames pairs equal names by index', () => {
    expect(deltaMaskFromNames(['a', 'b', 'c'], ['a', 'b', 'grip'])).toEqual([true, true, false]);
    expect(() => deltaMaskFromNames(['a', 'b'], ['b', 'a'])).toThrow(/action dimension 0 \(b\) is state dimension 1/);
  });
});

describe("LeRobot's arithmetic (normalizerOf(mode, 'lerobot'))", () => {
  // scripts/make_norm_lerobot_vectors.py: numpy float64 with LeRobot's operations in LeRobot's
  // order, cast to float32 once. Ours does the same float64 operations in the same order and one
  // fround, so the results are the same float32 numbers (toEqual, no tolerance).
  const le = JSON.parse(readFileSync(new URL('./vectors/normalize/lerobot.json', import.meta.url), 'utf8')) as {
    eps: number; zscore: number[]; unzscore: number[]; quantile: number[]; unquantile: number[];
  };
  it('z-score: (x - mean) / (std + 1e-8) and back x * std + mean, exactly numpy\'s', () => {
    const n = normalizerOf('zscore', 'lerobot', le.eps);
    const z = n.normalize(head, ref.d, ref.stats);
    expect(Array.from(z)).toEqual(le.zscore);
    expect(Array.from(n.unnormalize(z, ref.d, ref.stats))).toEqual(le.unzscore);
    // The convention matters: openpi's 1e-6 moves column 1 (std ~0.2) by ~7e-6.
    expect(Array.from(z)).not.toEqual(Array.from(normalizerOf('zscore').normalize(head, ref.d, ref.stats)));
  });
  it('quantiles: 2 (x - q01) / (q99 - q01) - 1 and back, eps only on the constant column, exactly numpy\'s', () => {
    const n = normalizerOf('quantile', 'lerobot', le.eps);
    const q = n.normalize(head, ref.d, ref.stats);
    expect(Array.from(q)).toEqual(le.quantile);
    expect(Array.from(n.unnormalize(q, ref.d, ref.stats))).toEqual(le.unquantile);
    expect(n.mode).toBe('quantile');
    expect(n.convention).toBe('lerobot');
  });
  it('openpi stays the default; bad modes, conventions and eps are refused', () => {
    expect(normalizerOf('zscore')).toBe(normalizerFor('pi0'));
    expect(normalizerOf('quantile', 'openpi')).toBe(normalizerFor('pi05'));
    expect(() => normalizerOf('minmax' as never)).toThrow(/mode is "minmax"; expected zscore or quantile/);
    expect(() => normalizerOf('zscore', 'jax' as never)).toThrow(/convention is "jax"; expected openpi or lerobot/);
    expect(() => normalizerOf('zscore', 'lerobot', -1)).toThrow(/eps is -1; expected a finite number >= 0/);
  });
});
