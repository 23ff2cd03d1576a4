/**
 * Latency summaries: quantiles with numpy's default (linear) interpolation, so a Python reader
 * of the JSON gets the same p50/p95/p99 from the raw samples.
 */

/** Summary of one latency series, all in milliseconds. */
export interface LatencySummary {
  n: number;
  mean: number;
  p50: number;
  p95: number;
  p99: number;
  min: number;
  max: number;
}

/**
 * The q-quantile (0 <= q <= 1) of `xs` as `numpy.quantile(xs, q)` (method "linear").
 * @throws Error for an empty series or q outside [0, 1].
 */
export function quantile(xs: readonly number[], q: number): number {
  if (xs.length === 0) throw new Error('quantile of an empty series');
  if (!(q >= 0 && q <= 1)) throw new Error(`quantile q is ${q}; expected 0 <= q <= 1`);
  const s = [...xs].sort((a, b) => a - b);
  const pos = q * (s.length - 1);
  const lo = Math.floor(pos);
  const hi = Math.min(lo + 1, s.length - 1);
  return s[lo]! + (s[hi]! - s[lo]!) * (pos - lo);
}

/** n, mean, p50/p95/p99, min, max of a non-empty series (ms). */
export function summarize(xs: readonly number[]): LatencySummary {
  if (xs.length === 0) throw new Error('summarize needs at least one sample');
  let sum = 0;
  for (const x of xs) sum += x;
  return {
    n: xs.length,
    mean: sum / xs.length,
    p50: quantile(xs, 0.5),
    p95: quantile(xs, 0.95),
    p99: quantile(xs, 0.99),
    min: Math.min(...xs),
    max: Math.max(...xs),
  };
}

/** Least-squares slope of y over x (units of y per unit of x); 0 for fewer than 2 points. */
export function slope(x: readonly number[], y: readonly number[]): number {
  const n = Math.min(x.length, y.length);
  if (n < 2) return 0;
  let mx = 0;
  let my = 0;
  for (let i = 0; i < n; i++) {
    mx += x[i]!;
    my += y[i]!;
  }
  mx /= n;
  my /= n;
  let num = 0;
  let den = 0;
  for (let i = 0; i < n; i++) {
    num += (x[i]! - mx) * (y[i]! - my);
    den += (x[i]! - mx) ** 2;
  }
  return den === 0 ? 0 : num / den;
}

/** Calls `fn` `n` times (after `burnIn` untimed calls) and returns each call's ms. */
export async function timeCalls(n: number, burnIn: number, fn: (i: number) => unknown | Promise<unknown>): Promise<number[]> {
  for (let i = 0; i < burnIn; i++) await fn(i);
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    await fn(i);
    out.push(performance.now() - t0);
  }
  return out;
}
