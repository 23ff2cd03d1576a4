/**
 * A small SVG plot of latency distributions, one row per series on a shared log-scale ms axis:
 * a line from min to max, a box from p50 to p95, a tick at p99 and the samples as faint dots.
 * No dependencies; the output is deterministic for the same input.
 */
import { summarize } from './stats.ts';

export interface PlotSeries {
  label: string;
  samplesMs: readonly number[];
}

const ROW = 26;
const LEFT = 260;
const RIGHT = 30;
const TOP = 40;
const WIDTH = 900;

function esc(s: string): string {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
}

function fmt(x: number): string {
  return Number(x.toFixed(2)).toString();
}

/**
 * The SVG text of the series (empty series are left out). The axis spans the decades that hold
 * every sample (at least 0.01 ms).
 */
export function latencySvg(title: string, series: readonly PlotSeries[]): string {
  const rows = series.filter((s) => s.samplesMs.length > 0);
  const all = rows.flatMap((s) => s.samplesMs).map((x) => Math.max(x, 0.01));
  const lo = all.length ? Math.floor(Math.log10(Math.min(...all))) : 0;
  const hi = all.length ? Math.max(lo + 1, Math.ceil(Math.log10(Math.max(...all)))) : 1;
  const plotW = WIDTH - LEFT - RIGHT;
  const x = (ms: number) => LEFT + ((Math.log10(Math.max(ms, 0.01)) - lo) / (hi - lo)) * plotW;
  const height = TOP + rows.length * ROW + 40;
  const out: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${WIDTH}" height="${height}" viewBox="0 0 ${WIDTH} ${height}" font-family="sans-serif" font-size="11">`,
    `<rect width="${WIDTH}" height="${height}" fill="white"/>`,
    `<text x="${WIDTH / 2}" y="20" text-anchor="middle" font-size="14">${esc(title)}</text>`,
  ];
  const axisY = TOP + rows.length * ROW + 5;
  for (let d = lo; d <= hi; d++) {
    const xd = fmt(x(10 ** d));
    out.push(`<line x1="${xd}" y1="${TOP - 5}" x2="${xd}" y2="${axisY}" stroke="#ddd"/>`);
    out.push(`<text x="${xd}" y="${axisY + 15}" text-anchor="middle">${fmt(10 ** d)} ms</text>`);
  }
  rows.forEach((s, i) => {
    const y = TOP + i * ROW + ROW / 2;
    const st = summarize(s.samplesMs);
    out.push(`<text x="${LEFT - 8}" y="${y + 4}" text-anchor="end">${esc(s.label)}</text>`);
    out.push(`<line x1="${fmt(x(st.min))}" y1="${y}" x2="${fmt(x(st.max))}" y2="${y}" stroke="#888"/>`);
    // At most 200 dots per row, evenly picked, keep the file small.
    const step = Math.max(1, Math.ceil(s.samplesMs.length / 200));
    for (let k = 0; k < s.samplesMs.length; k += step) {
      out.push(`<circle cx="${fmt(x(s.samplesMs[k]!))}" cy="${y - 7}" r="1.5" fill="#36c" fill-opacity="0.4"/>`);
    }
    out.push(`<rect x="${fmt(x(st.p50))}" y="${y - 5}" width="${fmt(Math.max(1, x(st.p95) - x(st.p50)))}" height="10" fill="#9bd" stroke="#36c"/>`);
    out.push(`<line x1="${fmt(x(st.p50))}" y1="${y - 6}" x2="${fmt(x(st.p50))}" y2="${y + 6}" stroke="#036" stroke-width="2"/>`);
    out.push(`<line x1="${fmt(x(st.p99))}" y1="${y - 6}" x2="${fmt(x(st.p99))}" y2="${y + 6}" stroke="#c33" stroke-width="2"/>`);
  });
  out.push(`<text x="${LEFT}" y="${height - 6}" fill="#555">box: p50 to p95, dark line p50, red tick p99, grey line min to max, dots: samples</text>`);
  out.push('</svg>');
  return out.join('\n') + '\n';
}

/** One panel of tracesSvg: a quantity over time, several series of the same length. */
export interface TracePanel {
  label: string;
  series: { label: string; values: readonly number[] }[];
}

const TRACE_COLORS = ['#000', '#d62728', '#ff7f0e', '#1f77b4', '#2ca02c', '#9467bd'];

/**
 * Line plots of time series, one panel per quantity stacked over a shared step axis (the first
 * series of each panel drawn thick: the reference), with faint vertical lines at `marks` (steps)
 * and a legend. Deterministic for the same input.
 */
export function tracesSvg(title: string, panels: readonly TracePanel[], marks: readonly number[], unit: string): string {
  const PANEL = 170;
  const left = 90;
  const right = 20;
  const top = 60;
  const width = 1000;
  const height = top + panels.length * (PANEL + 20) + 30;
  const n = Math.max(...panels.flatMap((p) => p.series.map((s) => s.values.length)), 2);
  const x = (t: number) => left + (t / (n - 1)) * (width - left - right);
  const out: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="sans-serif" font-size="11">`,
    `<rect width="${width}" height="${height}" fill="white"/>`,
    `<text x="${width / 2}" y="18" text-anchor="middle" font-size="14">${esc(title)}</text>`,
  ];
  (panels[0]?.series ?? []).forEach((s, i) => {
    const lx = left + i * 175;
    out.push(`<line x1="${lx}" y1="36" x2="${lx + 20}" y2="36" stroke="${TRACE_COLORS[i % TRACE_COLORS.length]}" stroke-width="${i === 0 ? 2.5 : 1.3}"/>`);
    out.push(`<text x="${lx + 24}" y="40">${esc(s.label)}</text>`);
  });
  panels.forEach((p, pi) => {
    const y0 = top + pi * (PANEL + 20);
    const all = p.series.flatMap((s) => s.values);
    const lo = Math.min(...all);
    const hi = Math.max(...all, lo + 1e-9);
    const y = (v: number) => y0 + PANEL - ((v - lo) / (hi - lo)) * PANEL;
    out.push(`<rect x="${left}" y="${y0}" width="${width - left - right}" height="${PANEL}" fill="none" stroke="#ccc"/>`);
    for (const m of marks) out.push(`<line x1="${fmt(x(m))}" y1="${y0}" x2="${fmt(x(m))}" y2="${y0 + PANEL}" stroke="#eee"/>`);
    out.push(`<text x="${left - 6}" y="${y0 + 10}" text-anchor="end">${fmt(hi)}</text>`);
    out.push(`<text x="${left - 6}" y="${y0 + PANEL}" text-anchor="end">${fmt(lo)}</text>`);
    out.push(`<text x="${left + 6}" y="${y0 + 14}" font-weight="bold">${esc(p.label)} (${esc(unit)})</text>`);
    // Drawn last to first: the reference (first) on top.
    [...p.series.entries()].reverse().forEach(([i, s]) => {
      const pts = s.values.map((v, t) => `${fmt(x(t))},${fmt(y(v))}`).join(' ');
      out.push(`<polyline points="${pts}" fill="none" stroke="${TRACE_COLORS[i % TRACE_COLORS.length]}" stroke-width="${i === 0 ? 2.5 : 1.2}" stroke-opacity="${i === 0 ? 0.5 : 0.9}"/>`);
    });
  });
  out.push(`<text x="${left}" y="${height - 8}" fill="#555">step (30 Hz); faint vertical lines: the steps where switching at once splices in a new chunk</text>`);
  out.push('</svg>');
  return out.join('\n') + '\n';
}
