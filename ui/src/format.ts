/**
 * Formatting of wire values for people: Unix seconds as local date-times, losses with four
 * significant digits, byte counts in KiB/MiB, round axis ticks. No DOM here (tests import it).
 */

const p2 = (n: number) => String(n).padStart(2, '0');

/** Unix seconds -> "2026-11-30 04:42:07" in the viewer's time zone; "—" for null. */
export function dateTime(unixS: number | null | undefined): string {
  if (unixS === null || unixS === undefined) return '—';
  const d = new Date(unixS * 1000);
  return `${d.getFullYear()}-${p2(d.getMonth() + 1)}-${p2(d.getDate())} ${clock(d)}`;
}

/** A time of day, 24-hour like every other time on the page: "19:45:30" (not the locale's "7:45:30 PM"). */
export function clock(d: Date = new Date()): string {
  return `${p2(d.getHours())}:${p2(d.getMinutes())}:${p2(d.getSeconds())}`;
}

/** A loss or rate: 4 significant digits, exponent form below 1e-3; "—" for null/undefined. */
export function num(x: number | null | undefined): string {
  if (x === null || x === undefined || !Number.isFinite(x)) return '—';
  if (x !== 0 && Math.abs(x) < 1e-3) return x.toExponential(3);
  return x.toPrecision(4);
}

export function bytes(n: number): string {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  if (n < 1024 ** 3) return `${(n / 1024 ** 2).toFixed(1)} MiB`;
  return `${(n / 1024 ** 3).toFixed(2)} GiB`;
}

/** Seconds -> "1 h 02 min", "3 min 05 s", "42 s". */
export function duration(s: number | null | undefined): string {
  if (s === null || s === undefined || !Number.isFinite(s)) return '—';
  const t = Math.round(s);
  if (t < 60) return `${t} s`;
  if (t < 3600) return `${Math.floor(t / 60)} min ${String(t % 60).padStart(2, '0')} s`;
  return `${Math.floor(t / 3600)} h ${String(Math.floor((t % 3600) / 60)).padStart(2, '0')} min`;
}

/**
 * Y-axis ticks: the largest step of 1, 2 or 5 x 10^k that still puts at least `min` ticks in
 * [lo, hi] (uPlot's own choice gave a falling loss as few as two). Example: 0.42..1.9 -> 0.5, 1,
 * 1.5 (step 0.5 leaves 3), so step 0.2: 0.6, 0.8, ..., 1.8.
 */
export function yTicks(lo: number, hi: number, min = 4): number[] {
  if (!(hi > lo) || !Number.isFinite(lo) || !Number.isFinite(hi)) return Number.isFinite(lo) ? [lo] : [];
  const mag = 10 ** Math.floor(Math.log10((hi - lo) / min));
  for (const step of [10, 5, 2, 1].map((m) => m * mag)) {
    const first = Math.ceil(lo / step - 1e-9);
    const last = Math.floor(hi / step + 1e-9);
    if (last - first + 1 >= min) return Array.from({ length: last - first + 1 }, (_, i) => Number(((first + i) * step).toPrecision(12)));
  }
  return [lo, hi];
}
