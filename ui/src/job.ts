/**
 * One fine-tune: status and progress, live loss / eval-loss, held-out MSE and learning-rate charts
 * fed by the SSE event log, the held-out evaluation against its baselines (overall and per action
 * group), the log messages, the job's config, its output files (downloaded with the key in a
 * header: fetch -> Blob -> object URL), and cancel.
 */
import { ApiError, json, send, TERMINAL, type Job, type JobFile } from './api.ts';
import { liveChart } from './charts.ts';
import { badge, errorLine, h, replace } from './dom.ts';
import { followJobEvents, type JobEvent } from './events.ts';
import { bytes, dateTime, duration, num } from './format.ts';
import type { View } from './view.ts';

/** Fields of a job that are progress or bookkeeping, not config. */
const NOT_CONFIG = new Set(['id', 'object', 'status', 'created_at', 'step', 'loss', 'eval_loss', 'error', 'output_dir', 'started_at', 'finished_at']);

/** A config value as text: lists of names as "cam_high, cam_wrist", other objects as JSON. */
function configValue(v: unknown): string {
  if (v === null || v === undefined) return '—';
  if (Array.isArray(v) && v.every((x) => typeof x === 'string')) return v.join(', ');
  return typeof v === 'object' ? JSON.stringify(v) : String(v);
}

/** One row of a held-out evaluation: the policy's MSE, both baselines' and the policy's ratio to each. */
interface EvalRow {
  mse: number;
  mse_hold_state: number;
  mse_mean_chunk: number;
  ratio_hold_state: number;
  ratio_mean_chunk: number;
}

/** The last held-out evaluation of a progress record (train.ts / evaluate.ts fields). */
interface HeldOut extends EvalRow {
  step: number;
  frames: number;
  raw: EvalRow;
  groups: (EvalRow & { group: string; dims: string[]; raw: EvalRow })[];
}

const ratio = (x: number) => (Number.isFinite(x) ? `${x.toFixed(2)}×` : '—');

/** Held-out MSE next to the baselines, normalised absolute actions (and raw units for "all"). */
function evalTable(e: HeldOut): HTMLElement {
  const row = (label: string, r: EvalRow, title?: string) => h('tr', { 'data-group': label },
    h('th', { scope: 'row', title }, label),
    h('td', { class: 'num' }, num(r.mse)),
    h('td', { class: 'num' }, num(r.mse_hold_state)), h('td', { class: `num ${r.ratio_hold_state < 1 ? 'better' : 'worse'}` }, ratio(r.ratio_hold_state)),
    h('td', { class: 'num' }, num(r.mse_mean_chunk)), h('td', { class: `num ${r.ratio_mean_chunk < 1 ? 'better' : 'worse'}` }, ratio(r.ratio_mean_chunk)));
  return h('div', {},
    h('p', { class: 'muted' }, `Step ${e.step}: ${e.frames} held-out frames, MSE of 16-step chunks (10 Euler steps) in the normalised absolute-action space; ratio below 1× beats the baseline.`),
    h('table', { class: 'eval', id: 'job-eval', 'aria-label': 'Held-out evaluation' },
      h('thead', {}, h('tr', {}, ...['Actions', 'Policy MSE', 'Hold state', 'Policy / hold', 'Mean chunk', 'Policy / mean'].map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, row('all', e), ...e.groups.map((g) => row(g.group, g, g.dims.join(', '))), row('all (raw units)', e.raw))));
}

function configTable(job: Job): HTMLElement {
  const rows = Object.entries(job).filter(([k]) => !NOT_CONFIG.has(k)).map(([k, v]) =>
    h('tr', { 'data-field': k }, h('th', { scope: 'row', class: 'mono' }, k), h('td', { class: 'mono' }, configValue(v))));
  return h('table', { class: 'kv', 'aria-label': 'Config' }, h('tbody', {}, ...rows));
}

/** Download one output file: the key goes in the header, so the browser cannot follow a plain link. */
async function download(jobId: string, file: JobFile): Promise<void> {
  const res = await send(`/v1/fine-tunes/${encodeURIComponent(jobId)}/files/${file.path.split('/').map(encodeURIComponent).join('/')}`);
  const url = URL.createObjectURL(await res.blob());
  const a = h('a', { href: url, download: file.path.split('/').pop()! });
  document.body.append(a);
  a.click();
  a.remove();
  // The click starts the download synchronously; revoke on the next task.
  setTimeout(() => URL.revokeObjectURL(url), 0);
}

function filesTable(jobId: string, files: JobFile[]): HTMLElement {
  if (files.length === 0) return h('p', { class: 'muted' }, 'No output files (a job has files once it succeeded).');
  return h('table', { class: 'files', 'aria-label': 'Output files' },
    h('thead', {}, h('tr', {}, ...['File', 'Size', 'SHA-256', ''].map((c) => h('th', { scope: 'col' }, c)))),
    h('tbody', {}, ...files.map((f) => {
      const state = h('span', { class: 'muted', 'aria-live': 'polite' });
      const button = h('button', { type: 'button', class: 'small', 'aria-label': `Download ${f.path}` }, 'Download');
      button.addEventListener('click', async () => {
        button.disabled = true;
        state.textContent = ' downloading…';
        try {
          await download(jobId, f);
          state.textContent = '';
        } catch (e) {
          state.textContent = ` failed: ${(e as Error).message}`;
        } finally {
          button.disabled = false;
        }
      });
      return h('tr', { 'data-file': f.path },
        h('td', { class: 'mono' }, f.path),
        h('td', { class: 'num' }, bytes(f.bytes)),
        h('td', { class: 'mono hash', title: f.sha256 }, f.sha256.slice(0, 16) + '…'),
        h('td', {}, button, state));
    })));
}

export function jobView(jobId: string): View {
  const abort = new AbortController();
  const title = h('h1', { id: 'job-title' }, jobId);
  const statusBox = h('span', { role: 'status', id: 'job-status' });
  const stream = h('span', { class: 'muted', id: 'job-stream' });
  const progress = h('progress', { id: 'job-progress', max: 1, value: 0, 'aria-label': 'Progress' });
  const stepText = h('span', { id: 'job-step', class: 'num' });
  const cancel = h('button', { type: 'button', class: 'danger', id: 'job-cancel', hidden: true }, 'Cancel job');
  const actionError = h('div');
  const summary = h('dl', { class: 'summary' });
  const config = h('div');
  const files = h('div', { id: 'job-files' });
  const logList = h('ol', { class: 'log', id: 'job-log', 'aria-label': 'Job log' });

  const lossChart = liveChart('Loss', 'loss', [
    { key: 'loss', label: 'train loss', color: '#1f6feb' },
    { key: 'eval', label: 'eval loss (held-out)', color: '#d9480f', sparse: true },
  ]);
  const lrChart = liveChart('Learning rate', 'learning rate', [{ key: 'lr', label: 'learning rate', color: '#2f9e44' }]);
  const mseChart = liveChart('Held-out MSE', 'MSE', [
    { key: 'policy', label: 'policy', color: '#d9480f', sparse: true },
    { key: 'hold', label: 'hold state', color: '#868e96', sparse: true },
  ]);
  const heldOut = h('div', { id: 'job-heldout' }, h('p', { class: 'muted' }, 'No held-out evaluation yet.'));

  let job: Job | null = null;
  let elapsedS: number | null = null;
  let gradNorm: number | null = null;
  // The last held-out evaluation: the policy against holding the state and the mean chunk.
  let lastEval: HeldOut | null = null;

  const renderJob = () => {
    if (!job) return;
    title.textContent = job.name ? `${job.name}` : job.id;
    replace(statusBox, badge(job.status));
    progress.max = job.steps;
    progress.value = job.step;
    stepText.textContent = `step ${job.step} / ${job.steps}`;
    cancel.hidden = TERMINAL.has(job.status);
    const item = (k: string, v: string) => [h('dt', {}, k), h('dd', {}, v)];
    replace(summary,
      ...item('Id', job.id), ...item('Model', job.model), ...item('Dataset', job.dataset_name),
      ...item('Loss', num(job.loss)), ...item('Eval loss', num(job.eval_loss)),
      ...(lastEval ? item('Held-out MSE', `${num(lastEval.mse)}: ${ratio(lastEval.ratio_hold_state)} hold state, ${ratio(lastEval.ratio_mean_chunk)} mean chunk`) : []),
      ...item('Grad norm', num(gradNorm)),
      ...item('Elapsed', duration(elapsedS)), ...item('Created', dateTime(job.created_at)),
      ...item('Started', dateTime(job.started_at)), ...item('Finished', dateTime(job.finished_at)),
      ...(job.error ? item('Error', job.error) : []));
    // A job that ended without an evaluation says why, not "yet".
    if (!lastEval && TERMINAL.has(job.status)) {
      const why = job.eval_fraction === 0 && !job.eval_dataset ? 'eval_fraction is 0 and there is no eval_dataset' : job.status === 'succeeded' ? 'no episode could be held out (see the log)' : `the job ${job.status} before its first evaluation`;
      replace(heldOut, h('p', { class: 'muted' }, `No held-out evaluation: ${why}.`));
    }
  };

  // A replay of a long log delivers thousands of records at once: redraw the header at most every 100 ms.
  let renderTimer: ReturnType<typeof setTimeout> | null = null;
  let evalDirty = false;
  const scheduleRender = () => {
    renderTimer ??= setTimeout(() => {
      renderTimer = null;
      renderJob();
      if (evalDirty && lastEval) replace(heldOut, evalTable(lastEval));
      evalDirty = false;
    }, 100);
  };

  const loadFiles = async () => {
    try {
      const { data } = await json<{ data: JobFile[] }>('GET', `/v1/fine-tunes/${encodeURIComponent(jobId)}/files`);
      replace(files, filesTable(jobId, data));
    } catch (e) {
      replace(files, errorLine(`Could not list the files: ${(e as Error).message}`));
    }
  };

  const onEvent = (ev: JobEvent) => {
    if (ev.type === 'progress') {
      const step = Number(ev.step);
      lossChart.add(step, [ev.loss as number | null, (ev.eval_loss as number | undefined) ?? null]);
      lrChart.add(step, [ev.learning_rate as number | null]);
      elapsedS = (ev.elapsed_seconds as number | undefined) ?? elapsedS;
      gradNorm = (ev.grad_norm as number | null | undefined) ?? null;
      if (job) {
        job.step = step;
        job.loss = ev.loss as number | null;
        if (ev.eval_loss !== undefined) job.eval_loss = ev.eval_loss as number;
      }
      if (typeof ev.eval_mse === 'number') {
        lastEval = {
          step, frames: ev.eval_frames as number, mse: ev.eval_mse, mse_hold_state: ev.eval_mse_hold_state as number, mse_mean_chunk: ev.eval_mse_mean_chunk as number,
          ratio_hold_state: ev.eval_ratio_hold_state as number, ratio_mean_chunk: ev.eval_ratio_mean_chunk as number,
          raw: ev.eval_raw as EvalRow, groups: (ev.eval_groups as HeldOut['groups'] | undefined) ?? [],
        };
        mseChart.add(step, [lastEval.mse, lastEval.mse_hold_state]);
        evalDirty = true;
      }
    } else {
      const text = ev.type === 'status' ? `status: ${ev.status}${ev.error ? ` (${ev.error})` : ''}` : String(ev.message ?? JSON.stringify(ev));
      // Follow the newest line unless the reader scrolled up to read older ones.
      const atBottom = logList.scrollTop + logList.clientHeight >= logList.scrollHeight - 4;
      logList.append(h('li', { 'data-type': ev.type }, h('time', {}, dateTime(ev.timestamp)), ' ', text));
      if (atBottom) logList.scrollTop = logList.scrollHeight;
      if (ev.type === 'status' && job) {
        job.status = ev.status as Job['status'];
        if (TERMINAL.has(job.status)) {
          // The job row has the final fields (finished_at, error); files exist once it succeeded.
          void json<Job>('GET', `/v1/fine-tunes/${encodeURIComponent(jobId)}`).then((j) => ((job = j), renderJob())).catch(() => {});
          void loadFiles();
        }
      }
    }
    scheduleRender();
  };

  cancel.addEventListener('click', async () => {
    if (!window.confirm(`Cancel fine-tune ${job?.name || jobId}? It stops at the next step and writes no final weights.`)) return;
    cancel.disabled = true;
    try {
      job = await json<Job>('POST', `/v1/fine-tunes/${encodeURIComponent(jobId)}/cancel`);
      replace(actionError);
      renderJob();
    } catch (e) {
      replace(actionError, errorLine(`Cancel failed: ${(e as Error).message}`));
    } finally {
      cancel.disabled = false;
    }
  });

  const body = h('div', { class: 'job-body' });
  const el = h('section', { 'aria-labelledby': 'job-title', class: 'job' },
    h('p', {}, h('a', { href: '#/jobs' }, '← All fine-tunes')),
    h('div', { class: 'job-head' }, title, statusBox, cancel),
    h('div', { class: 'job-progress' }, progress, ' ', stepText, ' ', stream),
    actionError,
    body);

  (async () => {
    try {
      job = await json<Job>('GET', `/v1/fine-tunes/${encodeURIComponent(jobId)}`);
    } catch (e) {
      replace(body, errorLine(e instanceof ApiError && e.status === 404 ? `No fine-tune ${jobId} for this key.` : `Could not load the job: ${(e as Error).message}`));
      return;
    }
    renderJob();
    replace(body,
      h('div', { class: 'charts' }, lossChart.figure, mseChart.figure, lrChart.figure),
      h('section', { 'aria-labelledby': 'heldout-title' }, h('h2', { id: 'heldout-title' }, 'Held-out evaluation'), heldOut),
      h('div', { class: 'columns' },
        h('section', { 'aria-labelledby': 'summary-title' }, h('h2', { id: 'summary-title' }, 'Summary'), summary),
        h('section', { 'aria-labelledby': 'config-title' }, h('h2', { id: 'config-title' }, 'Config'), config)),
      h('section', { 'aria-labelledby': 'files-title' }, h('h2', { id: 'files-title' }, 'Files'), files),
      h('section', { 'aria-labelledby': 'log-title' }, h('h2', { id: 'log-title' }, 'Log'), logList));
    replace(config, configTable(job));
    await loadFiles();
    try {
      await followJobEvents(jobId, { signal: abort.signal, onEvent, onState: (s) => (stream.textContent = `(events: ${s})`) });
    } catch (e) {
      if (!abort.signal.aborted) stream.textContent = `(events stopped: ${(e as Error).message})`;
    }
  })();

  return {
    el,
    title: `Fine-tune ${jobId}`,
    dispose() {
      abort.abort();
      if (renderTimer) clearTimeout(renderTimer);
      lossChart.destroy();
      lrChart.destroy();
      mseChart.destroy();
    },
  };
}
