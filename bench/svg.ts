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
