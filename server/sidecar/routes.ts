/**
 * The sidecar training API (its reference document; the routes are in docs/PROTOCOL.md section 10) on Vela's jobs, for
 * clients written against it. A sidecar job is a Vela fine-tune (`ft-...`, visible at
 * `/v1/fine-tunes/{id}` too); every route needs the API key, like the rest of Vela.
 * - `POST /training/job_start` `{dataset, num_train_steps?, model_size?, dataset_content?}`:
 *   `dataset` names one of the key's uploaded datasets or a shared one under the datasets root
 *   (datasets/owned.ts); `dataset_content`, a base64 tar / tar.gz / zip of it, is installed as
 *   the key's upload first (datasets/upload.ts); the body is streamed to disk and
 *   dataset_content decoded from there (sidecar/content.ts), never held in memory;
 *   `num_train_steps` (default 100) is the job's `steps`; `model_size` (default flow0-tiny, the fine-tunes' preset: server/jobs/recipes.ts) is
 *   `pi0` / `pi05` (the real models, with Vela's `base`) or a Vela preset (the document's
 *   4b / 12b / 31b are not: a 400 lists them). Vela's other
 *   fine-tune fields (every one of section 1's: batch_size, learning_rate, eval_fraction,
 *   warmup_steps, ema_decay, ...) are taken too, checked as POST /v1/fine-tunes checks them.
 *   Answers the TrainingJob.
 * - `GET /training/job_progress?job_id=`: `{"progress": [events]}` (sidecar/events.ts).
 * - `GET /training/job_events?job_id=&from=`: the same as Server-Sent Events, `: keepalive`
 *   while idle, ending after the final status or after 5 minutes; while idle, a watchdog every
 *   15 s fails a job that no runner holds any more (the log gets its `failed` event).
 * - `POST /training/job_cancel` `{job_id}`: `{"job_id", "status": "stopping"}`; 409 when over.
 * - `GET /models/file?model_path=trained/<job id>&file=`: one file of a completed job's weights.
 * - `POST /infer/query`: `model_path` + one observation (OpenPI's keys): the job's policy
 *   (inference/routes.ts answerInfer); `max_tokens` and `temperature` have no meaning for a
 *   policy and are ignored. The answer has the document's `input_tokens` (the prompt's tokens
 *   as the model read them) and `output_tokens` (the action expert's tokens: one per step of
 *   the model's chunk, its horizon).
 * - `POST /evals/add_to_dataset` `{prompt, response, notes?}`, `GET /evals/get_dataset_count`:
 *   the key's `eval_dataset.jsonl` under `<data>/evals/<key id>/` (evals.ts).
 */
import fs from 'node:fs';
import path from 'node:path';
import type { TemplatedApp } from 'uWebSockets.js';
import { requireOwner } from '../http/auth.ts';
import { PRESET_ALIASES, PRESET_NAMES, PRESETS } from '../../kernels/small/config.ts';
import { isRealModel } from '../models/bases.ts';
import { HttpError, route, sendJson, type Req } from '../http/http.ts';
import { requestPreset, storedPreset } from '../models/presets.ts';
import { SIDECAR_DEFAULTS } from '../jobs/recipes.ts';
import { streamFile } from '../http/stream.ts';
import { archiveTemp, checkUploadable, installArchive, takeUploadSlot } from '../datasets/routes.ts';
import { datasetDirFor } from '../datasets/owned.ts';
import { checkDatasetName, type InstallResult } from '../datasets/upload.ts';
import { jobOutputFile, listFiles, relativeSegments, submitFineTune } from '../jobs/routes.ts';
import { FieldError, FIELDS, parseFineTuneConfig } from '../jobs/config.ts';
import { readBody } from '../futures/codec.ts';
import { answerInfer, targetOf } from '../inference/routes.ts';
import type { JobEvent, JobRow } from '../store/store.ts';
import { allEvents, sidecarEvent, sidecarStatus, type TrainedModel } from './events.ts';
import { jobEvents } from './stream.ts';
import { mountEvals } from './evals.ts';
import type { SidecarDeps } from './deps.ts';
import { splitDatasetContent } from './content.ts';

/** Bytes of job_start's body besides dataset_content (which is limited by --max-dataset-bytes, decoded). */
const JOB_START_FIELDS_BYTES = 1024 * 1024;
/** Vela's fine-tune fields that job_start takes under their own names: all of section 1's but the three it names its way (SIDECAR_NAMES). */
const VELA_FIELDS = FIELDS.filter((k) => !['model', 'dataset_name', 'steps'].includes(k));
const JOB_ID = /^ft-[a-z0-9]{1,64}$/;
/** Vela's config fields under the names job_start gives them, for its errors. */
const SIDECAR_NAMES: Record<string, string> = { steps: 'num_train_steps', model: 'model_size', dataset_name: 'dataset' };

export function mountSidecar(app: TemplatedApp, deps: SidecarDeps): void {
  const { store, config, runner } = deps;
  const models = new Map<string, Promise<TrainedModel>>(); // a completed job's files never change

  const trainedModel = (job: JobRow): Promise<TrainedModel> => {
    let m = models.get(job.id);
    if (!m) {
      m = listFiles(job.output_dir).then((files) => ({ path: `trained/${job.id}`, model_size: job.config.model as string, files: files.map((f) => ({ path: f.path, size: f.bytes, sha256: f.sha256 })) }));
      models.set(job.id, m);
      m.catch(() => models.delete(job.id));
    }
    return m;
  };
  const mapped = async (job: JobRow, events: JobEvent[]) => {
    const model = job.status === 'succeeded' && events.some((e) => e.type === 'status' && e.status === 'succeeded') ? await trainedModel(job) : null;
    return events.map((e) => sidecarEvent(e, job, model));
  };
  const jobOf = async (owner: string, id: unknown): Promise<JobRow> => {
    if (typeof id !== 'string' || !JOB_ID.test(id)) throw new HttpError(400, `job_id must be a job id (ft-...) that job_start returned, got ${JSON.stringify(id ?? null)}`);
    const job = await store.getJob(id);
    if (!job || job.owner !== owner) throw new HttpError(404, `no job ${id}`);
    return job;
  };
  const trainingJob = (job: JobRow, upload: InstallResult | null = null) => ({
    job_id: job.id, id: job.id, status: sidecarStatus(job), dataset: job.config.dataset_name, model_size: job.config.model, num_train_steps: job.config.steps,
    created_at: job.created_at, step: job.step, loss: job.loss, error: job.error,
    ...(upload ? { dataset_upload: { sha256: upload.sha256, reused: upload.reused, episodes: upload.episodes, frames: upload.frames } } : {}),
  });

  app.post('/training/job_start', route(0, async (r) => {
    const owner = await requireOwner(store, r);
    // The body goes to disk as it comes, and dataset_content from there to its own file, decoded:
    // neither is ever held in memory (a 600 MB body cannot be one string anyway).
    // A body that can carry a dataset takes one of the key's upload slots while it lasts.
    const large = r.headers['transfer-encoding'] !== undefined || Number(r.headers['content-length'] ?? 0) > JOB_START_FIELDS_BYTES;
    const release = large ? takeUploadSlot(owner) : () => {};
    const raw = archiveTemp(config, owner, 'job_start-body');
    const file = archiveTemp(config, owner, 'job_start-content');
    try {
      await r.bodyToFile(raw, Math.ceil((config.maxDatasetBytes * 4) / 3) + JOB_START_FIELDS_BYTES);
      const split = await splitDatasetContent(raw, file, JOB_START_FIELDS_BYTES);
      await fs.promises.rm(raw, { force: true });
      await jobStart(r, owner, split.fields, file, split.contentBytes);
    } finally {
      release();
      // Asynchronous: unlinking a file of gigabytes takes a while.
      await Promise.all([fs.promises.rm(raw, { force: true }), fs.promises.rm(file, { force: true })]);
    }
  }));

  /** job_start once its body is read: `file` holds dataset_content decoded (`contentBytes`, or null when absent). */
  const jobStart = async (r: Req, owner: string, body: Record<string, unknown>, file: string, contentBytes: number | null) => {
    for (const k of Object.keys(body)) {
      if (!['dataset', 'num_train_steps', 'model_size', 'dataset_content', ...VELA_FIELDS].includes(k)) throw new HttpError(400, `job_start has no field "${k}"; it takes dataset, num_train_steps, model_size, dataset_content and Vela's ${VELA_FIELDS.join(', ')}`);
    }
    const sizeName = body.model_size ?? SIDECAR_DEFAULTS.model_size;
    if (typeof sizeName !== 'string' || !(PRESET_NAMES.includes(sizeName) || isRealModel(sizeName))) throw new HttpError(400, `model_size must be pi0 or pi05 (the real models, on \`base\`: a Hub id or a checkpoint folder) or a Vela preset: ${Object.keys(PRESETS).join(', ')} (or a deprecated name: ${Object.keys(PRESET_ALIASES).join(', ')}); got ${JSON.stringify(sizeName)} (the sidecar's 4b, 12b and 31b are not Vela models)`);
    // The job stores the canonical name; pi0 / pi05 are the real models (fine-tunes' `model`).
    const size = isRealModel(sizeName) ? sizeName : requestPreset('model_size', sizeName);
    const steps = body.num_train_steps ?? SIDECAR_DEFAULTS.num_train_steps;
    if (typeof steps !== 'number' || !Number.isInteger(steps) || steps < 1) throw new HttpError(400, `num_train_steps must be a positive integer, got ${JSON.stringify(steps)}`);
    if (body.dataset === undefined) throw new HttpError(400, 'dataset is required: the name of a LeRobot dataset folder (there is no default dataset)');
    const dataset = checkDatasetName(body.dataset);
    // The config is checked before an upload is installed: a refused request leaves nothing behind.
    const extras = Object.fromEntries(Object.entries(body).filter(([k]) => VELA_FIELDS.includes(k)));
    const jobBody = { ...extras, model: size, dataset_name: dataset, steps };
    try {
      parseFineTuneConfig(jobBody);
    } catch (e) {
      const ours = e instanceof FieldError ? SIDECAR_NAMES[e.field] : undefined;
      throw ours ? new HttpError(400, `${ours}${(e as Error).message.slice(e instanceof FieldError ? e.field.length : 0)}`) : e;
    }
    let upload: InstallResult | null = null;
    if (body.dataset_content !== undefined) {
      if (contentBytes === null) throw new HttpError(400, `dataset_content must be a string (the dataset folder as a base64 tar or zip), got ${JSON.stringify(body.dataset_content)}`);
      if (contentBytes === 0) throw new HttpError(400, 'dataset_content is empty: send the dataset folder as a base64 tar or zip');
      checkUploadable(config, owner, dataset);
      upload = await installArchive(store, config, owner, dataset, file);
    } else {
      // Another key's upload reads as absent, in the same words.
      const dir = datasetDirFor(config, owner, dataset, 'dataset');
      if (!dir || !fs.existsSync(path.join(dir, 'meta', 'info.json'))) throw new HttpError(400, `dataset "${dataset}" is not under the datasets root and no dataset_content was sent`);
    }
    const job = await submitFineTune(deps, owner, jobBody);
    sendJson(r, 200, trainingJob(job, upload));
  };

  app.get('/training/job_progress', route(0, async (r) => {
    const job = await jobOf(await requireOwner(store, r), r.query.get('job_id'));
    sendJson(r, 200, { progress: await mapped(job, await allEvents(store, job.id)) });
  }));

  app.post('/training/job_cancel', route(0, async (r) => {
    const owner = await requireOwner(store, r);
    const job = await jobOf(owner, (await r.json()).job_id);
    if (!(await runner.cancel(job.id))) throw new HttpError(409, `job ${job.id} is over already (${sidecarStatus((await store.getJob(job.id))!)})`);
    sendJson(r, 200, { job_id: job.id, status: 'stopping' });
  }));

  app.get('/training/job_events', route(0, async (r) => jobEvents(r, deps, await jobOf(await requireOwner(store, r), r.query.get('job_id')), mapped)));

  app.get('/models/file', route(0, async (r) => {
    const owner = await requireOwner(store, r);
    const m = /^trained\/(ft-[a-z0-9]{1,64})$/.exec(r.query.get('model_path') ?? '');
    if (!m) throw new HttpError(400, `model_path must be "trained/<job id>" as a completed job's model gives it, got ${JSON.stringify(r.query.get('model_path'))}`);
    const rel = r.query.get('file') ?? '';
    relativeSegments(rel); // a bad file path is a 400 before any lookup
    const job = await store.getJob(m[1]!);
    if (!job || job.owner !== owner) throw new HttpError(404, `no trained model ${m[1]}`);
    const file = jobOutputFile(job, rel);
    await streamFile(r, file, fs.statSync(file).size);
  }));

  app.post('/infer/query', route(0, async (r) => {
    await requireOwner(store, r);
    const body = await readBody(r, config.maxPolicyMessageBytes);
    const { model_path: modelPath, model_size: size, ...obs } = body.value;
    delete obs.max_tokens; // a policy answers an action chunk: no tokens, no temperature
    delete obs.temperature;
    const m = typeof modelPath === 'string' ? /^trained\/(ft-[a-z0-9]{1,64})$/.exec(modelPath) : null;
    if (!m) throw new HttpError(400, `model_path must be "trained/<job id>" (Vela keeps no per-size default adapter), got ${JSON.stringify(modelPath ?? null)}`);
    const t = await targetOf(deps.inference, 'fine-tunes', m[1]!, r.headers);
    const job = (await store.getJob(m[1]!))!;
    // A job stored before issue 23 holds the old name; both sides compare as the preset they name.
    if (size !== undefined && (typeof size !== 'string' || storedPreset(size) !== storedPreset(String(job.config.model)))) throw new HttpError(400, `model_size ${JSON.stringify(size)} is not the size ${m[1]} was trained for (${job.config.model})`);
    await answerInfer(deps.inference, r, t, obs, body.format, { tokens: true });
  }));

  mountEvals(app, deps);
}
