/**
 * The fine-tunes page: a form that starts a job (POST /v1/fine-tunes) and the table of the
 * key's jobs, refreshed every 2 s.
 */
import { json, type Job } from './api.ts';
import { badge, errorLine, h, replace } from './dom.ts';
import { clock, dateTime, num } from './format.ts';
import { poll, type View } from './view.ts';

const PRESETS = ['flow0-tiny', 'flow05-tiny', 'flow0-small', 'flow05-small'];
const REFRESH_MS = 2000;

/** The part of GET /v1/defaults the form shows (server/jobs/recipes.ts defaultsJson). */
interface Defaults {
  fine_tune: { model: string; steps: number; batch_size: number; learning_rate: number; eval_fraction: number; finetune: { seeded_preset: string; trained_base: string } };
}

function field(id: string, label: string, input: HTMLElement, help?: string): HTMLElement {
  if (help) input.setAttribute('aria-describedby', `${id}-help`);
  return h('div', { class: 'field' }, h('label', { for: id }, label), input, help ? h('small', { id: `${id}-help` }, help) : null);
}

function createForm(navigate: (hash: string) => void): HTMLElement {
  // Pre-filled from GET /v1/defaults (server/jobs/recipes.ts): the form keeps no defaults of its own.
  const model = h('input', { id: 'ft-model', name: 'model', required: true, list: 'ft-presets' });
  const dataset = h('input', { id: 'ft-dataset', name: 'dataset_name', required: true, placeholder: 'lerobot/pusht_image' });
  // Blank numbers take the server's default recipe (PROTOCOL.md section 1).
  const steps = h('input', { id: 'ft-steps', name: 'steps', type: 'number', min: 1, max: 1_000_000, placeholder: 'recipe default' });
  const batch = h('input', { id: 'ft-batch', name: 'batch_size', type: 'number', min: 1, max: 1024, placeholder: 'recipe default' });
  const lr = h('input', { id: 'ft-lr', name: 'learning_rate', type: 'number', min: 0, max: 1, step: 'any', placeholder: 'recipe default' });
  const mode = h('select', { id: 'ft-finetune', name: 'finetune' },
    h('option', { value: '' }, 'default (full on a seeded base)'), h('option', { value: 'full' }, 'full'), h('option', { value: 'lora' }, 'LoRA'));
  const heldOut = h('input', { id: 'ft-heldout', name: 'eval_fraction', type: 'number', min: 0, max: 0.99, step: 'any', placeholder: '0.1' });
  const evalEvery = h('input', { id: 'ft-eval', name: 'eval_every', type: 'number', min: 0, max: 1_000_000, placeholder: 'steps / 4' });
  const name = h('input', { id: 'ft-name', name: 'name', maxlength: 128 });
  const status = h('p', { class: 'error', role: 'alert' });
  const submit = h('button', { type: 'submit' }, 'Start fine-tune');
  void json<Defaults>('GET', '/v1/defaults').then((d) => {
    const r = d.fine_tune;
    if (model.value === '') model.value = r.model;
    steps.placeholder = `default ${r.steps}`;
    batch.placeholder = `default ${r.batch_size}`;
    lr.placeholder = `default ${r.learning_rate}`;
    heldOut.placeholder = String(r.eval_fraction);
    mode.options[0]!.textContent = `default (${r.finetune.seeded_preset} on a seeded preset, ${r.finetune.trained_base} on a trained base)`;
  }).catch((err) => {
    status.textContent = `Could not read the server's defaults: ${(err as Error).message}`;
  });
  const form = h('form', { class: 'create', 'aria-label': 'New fine-tune' },
    h('datalist', { id: 'ft-presets' }, ...PRESETS.map((p) => h('option', { value: p }))),
    h('div', { class: 'fields' },
      field('ft-model', 'Model', model),
      field('ft-dataset', 'Dataset', dataset, 'A LeRobot folder under the server\'s datasets root'),
      field('ft-steps', 'Steps', steps),
      field('ft-batch', 'Batch size', batch),
      field('ft-lr', 'Learning rate', lr),
      field('ft-finetune', 'Fine-tune', mode),
      field('ft-heldout', 'Held-out share', heldOut, 'Share of episodes held out and scored against the baselines; 0: none'),
      field('ft-eval', 'Eval every (steps)', evalEvery, 'Blank: the server\'s default; 0: only at the end'),
      field('ft-name', 'Name (optional)', name)),
    h('div', { class: 'actions' }, submit),
    status);
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    submit.disabled = true;
    status.textContent = 'Checking the config and the dataset…';
    try {
      const body: Record<string, unknown> = { model: model.value.trim(), dataset_name: dataset.value.trim() };
      const numbers: [HTMLInputElement, string][] = [[steps, 'steps'], [batch, 'batch_size'], [lr, 'learning_rate'], [heldOut, 'eval_fraction'], [evalEvery, 'eval_every']];
      for (const [input, key] of numbers) if (input.value !== '') body[key] = Number(input.value);
      if (mode.value) body.finetune = mode.value;
      if (name.value.trim()) body.name = name.value.trim();
      const job = await json<Job>('POST', '/v1/fine-tunes', body);
      status.textContent = '';
      navigate(`#/jobs/${encodeURIComponent(job.id)}`);
    } catch (err) {
      status.textContent = `The server did not start the job: ${(err as Error).message}`;
    } finally {
      submit.disabled = false;
    }
  });
  return h('details', { class: 'panel' }, h('summary', {}, 'New fine-tune'), form);
}

function jobCells(j: Job): HTMLTableCellElement[] {
  const href = `#/jobs/${encodeURIComponent(j.id)}`;
  return [
    h('td', {}, h('a', { href }, j.name || j.id), j.name ? h('div', { class: 'muted mono' }, j.id) : null),
    h('td', {}, badge(j.status)),
    h('td', {}, j.model),
    h('td', { class: 'mono' }, j.dataset_name),
    h('td', { class: 'num' }, `${j.step} / ${j.steps}`, h('progress', { max: j.steps, value: j.step, 'aria-label': `step ${j.step} of ${j.steps}` })),
    h('td', { class: 'num' }, num(j.loss)),
    h('td', { class: 'num' }, num(j.eval_loss)),
    h('td', {}, dateTime(j.created_at)),
  ];
}

/**
 * Bring `body` to `jobs`, touching only cells whose content changed, so that keyboard focus on
 * a job link survives the refresh.
 */
function updateRows(body: HTMLTableSectionElement, jobs: Job[]): void {
  const old = new Map<string, HTMLTableRowElement>();
  for (const tr of Array.from(body.rows)) if (tr.dataset.job) old.set(tr.dataset.job, tr);
  const rows = jobs.map((j) => {
    const fresh = jobCells(j);
    const tr = old.get(j.id);
    if (!tr) return h('tr', { 'data-job': j.id }, ...fresh);
    fresh.forEach((td, i) => {
      const cur = tr.cells[i];
      if (!cur || !cur.isEqualNode(td)) (cur ? cur.replaceWith(td) : tr.append(td));
    });
    return tr;
  });
  // Re-inserting a row that is already in place does not move focus out of it.
  rows.forEach((tr, i) => {
    if (body.rows[i] !== tr) body.insertBefore(tr, body.rows[i] ?? null);
  });
  while (body.rows.length > rows.length) body.rows[body.rows.length - 1]!.remove();
}

export function jobsView(navigate: (hash: string) => void): View {
  const body = h('tbody');
  const note = h('p', { class: 'muted', 'aria-live': 'polite' });
  const problem = h('div');
  const table = h('table', { class: 'jobs', 'aria-label': 'Fine-tune jobs' },
    h('thead', {}, h('tr', {}, ...['Job', 'Status', 'Model', 'Dataset', 'Step', 'Loss', 'Eval loss', 'Created'].map((c) => h('th', { scope: 'col' }, c)))),
    body);
  const stop = poll(async () => {
    try {
      const { data } = await json<{ data: Job[] }>('GET', '/v1/fine-tunes');
      replace(problem);
      if (data.length === 0) replace(body, h('tr', {}, h('td', { colspan: 8, class: 'empty' }, 'No fine-tunes yet: start one above.')));
      else {
        if (body.querySelector('td.empty')) replace(body);
        updateRows(body, data);
      }
      note.textContent = `${data.length} job${data.length === 1 ? '' : 's'}; refreshed at ${clock()}`;
    } catch (err) {
      replace(problem, errorLine(`Could not load the jobs: ${(err as Error).message}`));
      throw err;
    }
  }, REFRESH_MS);
  const el = h('section', { 'aria-labelledby': 'jobs-title' },
    h('h1', { id: 'jobs-title' }, 'Fine-tunes'),
    createForm(navigate),
    problem,
    h('div', { class: 'table-wrap' }, table),
    note);
  return { el, title: 'Fine-tunes', dispose: stop };
}
