/**
 * Live line charts over training steps (uPlot). Points are appended as progress records arrive
 * and drawn at most every 100 ms, so a fast stream or a long replay does not redraw per record.
 * The figure carries `data-points` (number of steps), `data-count-<key>` (non-null values of
 * each series), `data-y-ticks` (the y labels drawn) and a text summary in its caption, for
 * screen readers and tests: canvas pixels say nothing to either. The legend shows the values
 * under the cursor, and the last ones while the cursor is elsewhere.
 */
import uPlot from 'uplot';
import { h } from './dom.ts';
import { num, yTicks } from './format.ts';

export interface SeriesSpec {
  /** Short key used in `data-count-<key>`. */
  key: string;
  label: string;
  color: string;
  /** Draw a dashed line with visible points (sparse series such as eval loss). */
  sparse?: boolean;
}

export interface LiveChart {
  readonly figure: HTMLElement;
  /** Add one x (a step) with a value per series (null where the series has no value there). */
  add(x: number, values: (number | null)[]): void;
  destroy(): void;
}

const REDRAW_MS = 100;
const STEP_INCRS = [1, 2, 5].flatMap((m) => [1, 10, 100, 1e3, 1e4, 1e5, 1e6].map((p) => m * p)).sort((a, b) => a - b);

/** Axis labels: short ("0.0015", "1.8", "7.5e-4"), unlike the 4-digit values in the legend. */
function tick(v: number): string {
  if (v !== 0 && Math.abs(v) < 1e-3) return v.toExponential(1);
  return String(Number(v.toPrecision(4)));
}

/**
 * A chart titled `title` with one y axis; `figure` is not attached yet. `xLabel` names the x
 * (whole numbers): a job's `step`, a session's `forward_backward`.
 */
export function liveChart(title: string, yLabel: string, series: SeriesSpec[], xLabel = 'step'): LiveChart {
  const xs: number[] = [];
  const ys: (number | null)[][] = series.map(() => []);
  const counts = series.map(() => 0);
  const last: ({ x: number; y: number } | null)[] = series.map(() => null);
  const id = `chart-${title.toLowerCase().replace(/[^a-z0-9]+/g, '-')}`;
  const caption = h('figcaption', { id: `${id}-caption` });
  const summary = h('p', { class: 'chart-summary', 'aria-live': 'off' });
  const plotBox = h('div', { class: 'chart-plot', role: 'img', 'aria-labelledby': `${id}-caption`, 'aria-describedby': `${id}-summary` });
  summary.id = `${id}-summary`;
  caption.textContent = title;
  const figure = h('figure', { class: 'chart', id, 'data-points': 0 }, caption, plotBox, summary);

  let plot: uPlot | null = null;
  let timer: ReturnType<typeof setTimeout> | null = null;
  let resize: ResizeObserver | null = null;

  const size = () => ({ width: Math.max(280, plotBox.clientWidth || 600), height: 220 });
  const render = () => {
    timer = null;
    const data = [xs, ...ys] as uPlot.AlignedData;
    if (!plot) {
      if (!figure.isConnected) return schedule();
      plot = new uPlot(
        {
          ...size(),
          scales: { x: { time: false } },
          // Steps are whole numbers: no 1.2, 1.4 ticks.
          axes: [
            { label: xLabel, incrs: STEP_INCRS },
            {
              label: yLabel, size: 64, splits: (_u, _axis, lo, hi) => yTicks(lo, hi),
              // The drawn labels, for tests and screen readers (the canvas says nothing to either).
              values: (_u, splits) => {
                const labels = splits.map(tick);
                figure.setAttribute('data-y-ticks', labels.join(' '));
                return labels;
              },
            },
          ],
          series: [
            // Away from the plot, the legend shows the last point instead of uPlot's "--".
            { label: xLabel, value: (_u: uPlot, v: number | null, _s: number, idx: number | null) => (idx === null ? (xs.length ? `${xs.at(-1)} (last)` : '—') : String(v)) },
            ...series.map((s, i) => ({
              label: s.label,
              stroke: s.color,
              width: 2,
              spanGaps: !!s.sparse,
              dash: s.sparse ? [6, 4] : undefined,
              points: { show: s.sparse ? true : undefined, size: 7 },
              value: (_u: uPlot, v: number | null, _s: number, idx: number | null) => num(idx === null ? last[i]?.y : v),
            })),
          ],
          legend: { live: true },
        },
        data,
        plotBox,
      );
      // Resize in the next frame, not inside the observer: a resize that changes layout within the
      // callback (a scrollbar appearing, the legend re-wrapping) is a "ResizeObserver loop
      // completed with undelivered notifications" error. Only a new width redraws.
      let width = size().width;
      let frame = 0;
      resize = new ResizeObserver(() => {
        cancelAnimationFrame(frame);
        frame = requestAnimationFrame(() => {
          const next = size();
          if (next.width === width) return;
          width = next.width;
          plot?.setSize(next);
        });
      });
      resize.observe(plotBox);
    } else plot.setData(data);
    figure.setAttribute('data-points', String(xs.length));
    series.forEach((s, i) => figure.setAttribute(`data-count-${s.key}`, String(counts[i])));
    summary.textContent = xs.length === 0
      ? 'No points yet.'
      : series.map((s, i) => (last[i] ? `${s.label}: ${counts[i]} point${counts[i] === 1 ? '' : 's'}, last ${num(last[i]!.y)} at ${xLabel} ${last[i]!.x}` : `${s.label}: no points yet`)).join('; ') + '.';
  };
  const schedule = () => {
    timer ??= setTimeout(render, REDRAW_MS);
  };
  summary.textContent = 'No points yet.';
  schedule();

  return {
    figure,
    add(x, values) {
      xs.push(x);
      series.forEach((_s, i) => {
        const v = values[i] ?? null;
        ys[i]!.push(v);
        if (v !== null) {
          counts[i] = counts[i]! + 1;
          last[i] = { x, y: v };
        }
      });
      schedule();
    },
    destroy() {
      if (timer) clearTimeout(timer);
      resize?.disconnect();
      plot?.destroy();
    },
  };
}
