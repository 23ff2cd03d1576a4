/**
 * `/v1/fine-tunes` (PROTOCOL.md section 1): create (validated before any work), list, get,
 * cancel, events as JSON or Server-Sent Events, output files list and download.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import type { TemplatedApp } from 'uWebSockets.js';
import { resolveWriteToken } from '../models/upload.ts';
import { requireOwner } from '../http/auth.ts';
import { log } from '../log.ts';
import { decodeUrlPart, HttpError, route, sendJson, type Req } from '../http/http.ts';
import { eventCursor, openSse, streamFile } from '../http/stream.ts';
import type { FineTuneJob } from '../../protocol/jobs.ts';
import { nowS, randomId, type JobEvent, type JobRow, type Store } from '../store/store.ts';
import type { ServerConfig } from '../config.ts';
import { parseFineTuneConfig, type FineTuneConfig } from './config.ts';
import { defaultsJson } from './recipes.ts';
import { datasetDirFor } from '../datasets/owned.ts';
import { prepareRun } from './train.ts';
import { isRealModel, type RealModel } from '../models/bases.ts';
import { checkBaseVariant } from '../models/base-variant.ts';
import { tokenizerFileFor } from '../models/layout.ts';
import { modelsDirOf, resolveBase } from '../models/resolve.ts';
import { checkBaseAccess } from '../models/access.ts';
import { memoryLedger } from '../models/memory.ts';
import { jobModelShape, planFineTune, planPresetFineTune, realEngineModel } from './base.ts';
import { isHubDatasetId } from './fetch.ts';
import { isTerminal, jobWorkDir, type JobRunner } from './runner.ts';

/** Public JSON of a job: every config field with defaults (not the server-side engine_model), plus progress fields. */
export function jobJson(j: JobRow): FineTuneJob {
  // The engine's key (`engine_model`: the base's folder on this server) stays inside, as sessions' publicConfig does.
  const { engine_model: _engineKey, ...config } = j.config;
  return {
    id: j.id, object: 'fine_tune', status: j.status, created_at: j.created_at, ...(config as Pick<FineTuneJob, 'model' | 'dataset_name' | 'steps'>),
    step: j.step, loss: j.loss, eval_loss: j.eval_loss, error: j.error, output_dir: j.output_dir,
    // The real models' output as a base checkpoint sits beside weights/final (train.ts).
    ...(j.status === 'succeeded' && isRealModel(j.config.model) && j.config.base ? { model_dir: path.join(path.dirname(path.dirname(j.output_dir)), 'model') } : {}),
    started_at: j.started_at, finished_at: j.finished_at, node: j.node_id ?? null,
  };
}

/** Every file under `dir`, relative, sorted: {path, bytes, sha256}. */
export async function listFiles(dir: string): Promise<{ path: string; bytes: number; sha256: string }[]> {
  if (!fs.existsSync(dir)) return [];
  const out: { path: string; bytes: number; sha256: string }[] = [];
  const walk = async (rel: string) => {
    for (const e of fs.readdirSync(path.join(dir, rel), { withFileTypes: true })) {
      const r = rel ? `${rel}/${e.name}` : e.name;
      if (e.isDirectory()) await walk(r);
      else if (e.isFile()) {
        const full = path.join(dir, r);
        const hash = crypto.createHash('sha256');
        for await (const chunk of fs.createReadStream(full)) hash.update(chunk as Buffer);
        out.push({ path: r, bytes: fs.statSync(full).size, sha256: hash.digest('hex') });
      }
    }
  };
  await walk('');
  return out.sort((a, b) => a.path.localeCompare(b.path));
}

/** Records per JSON answer of `GET .../events` (continue with `from=`), and per read of an SSE backlog. */
const EVENTS_PAGE = 10_000;

export interface JobRoutesDeps {
  store: Store;
  config: ServerConfig;
  runner: JobRunner;
  /** Seconds between SSE keepalive comments (PROTOCOL.md: 15). */
  keepaliveS?: number;
  /** Whether an engine holds this engine model already (its base is then not planned again); default: none does. */
  engineLoaded?: (engineModel: string) => boolean;
  /** Closes engines of real bases nothing uses (sessions.ts releaseIdleEngines), before a memory plan refuses. */
  releaseIdle?: () => Promise<number>;
}

/**
 * Validate a fine-tune body (config and dataset, before any work) and queue the job.
 * @throws HttpError 400 naming the field or the dataset file that is wrong.
 */
export async function submitFineTune(deps: Pick<JobRoutesDeps, 'store' | 'config' | 'runner' | 'engineLoaded' | 'releaseIdle'>, owner: string, body: Record<string, unknown>): Promise<JobRow> {
  const { store, config, runner } = deps;
  const cfg = parseFineTuneConfig(body);
  // Refused now rather than after the training: the upload needs the server's own write token.
  if (cfg.push_to_hub !== null && !resolveWriteToken(undefined)) {
    throw new HttpError(400, `push_to_hub needs a Hub write token on this server, and it has none: the operator sets HF_TOKEN (or HUGGING_FACE_HUB_TOKEN, or the token file of \`hf auth login\`); or leave push_to_hub out and upload the job's files with \`vela models upload\``);
  }
  const baseDir = await submittedBase(deps, owner, cfg);
  // Another key's upload is not found, in the same words as a name that nothing has.
  const dir = datasetDirFor(config, owner, cfg.dataset_name);
  const download = !dir && config.allowDownloads && isHubDatasetId(cfg.dataset_name);
  if (!dir && !download) {
    log.info(`fine-tune refused: dataset_name "${cfg.dataset_name}" is neither an upload of ${owner} nor a shared dataset`);
    const hub = isHubDatasetId(cfg.dataset_name)
      ? `; as a Hub dataset it can be fetched by the operator (\`vela datasets download ${cfg.dataset_name}\` into the datasets root) or by the job itself once the server runs with --allow-downloads (VELA_ALLOW_DOWNLOADS=1)`
      : '';
    throw new HttpError(400, `dataset_name "${cfg.dataset_name}" not found: no such dataset folder under this server's datasets root, nor among this key's uploads (GET /v1/datasets lists them; the operator sets the root with --datasets-dir / VELA_DATASETS_DIR)${hub}`);
  }
  let evalDir: string | undefined;
  if (cfg.eval_dataset !== null) {
    evalDir = datasetDirFor(config, owner, cfg.eval_dataset, 'eval_dataset') ?? undefined;
    if (!evalDir) throw new HttpError(400, `eval_dataset "${cfg.eval_dataset}" not found: no such dataset folder under this server's datasets root, nor among this key's uploads (GET /v1/datasets lists them)`);
  }
  // A dataset or base the job downloads is checked there, before training (the job fails with the same line).
  if (dir && (baseDir || !isRealModel(cfg.model))) {
    try {
      const { ds, evalDs, cameras, actionSpace } = await prepareRun(cfg, dir, (d) => runner.openDataset(d), evalDir, baseDir);
      await ds.checkVideos();
      if (evalDs !== ds) await evalDs.checkVideos();
      // The job records what it will use, not "default": the dataset's cameras and action space.
      cfg.cameras = cameras;
      cfg.action_space = actionSpace;
    } catch (e) {
      if (e instanceof HttpError) throw e;
      // Dataset readers name files by their full path; the client named the dataset.
      let msg = (e as Error).message.split(dir).join(cfg.dataset_name);
      if (evalDir) msg = msg.split(evalDir).join(cfg.eval_dataset!);
      throw new HttpError(400, `dataset "${cfg.dataset_name}": ${msg}`);
    }
  }
  // Planned, not discovered (a base the job downloads is planned by the runner once it is here).
  if (baseDir) {
    // Asked at the check: an engine may start meanwhile, and a base a session reserved (memoryLedger) is counted there already.
    const key = cfg.engine_model!;
    const weightsLoaded = () => (deps.engineLoaded?.(key) ?? false) || memoryLedger.has(`base:${key}`);
    const plan = () => planFineTune(cfg, baseDir, { weightsLoaded, maxMemory: config.maxMemory });
    const note = await plan().catch(async (e) => {
      // Bases that nothing uses any more are memory to free before refusing.
      if (!(e instanceof HttpError) || e.status !== 507 || !deps.releaseIdle || (await deps.releaseIdle()) === 0) throw e;
      return plan();
    });
    // ... and before splitting the batch into micro-batches the freed memory would spare.
    if (cfg.micro_batch_size == null && note.micro_batch_size < cfg.batch_size && deps.releaseIdle && (await deps.releaseIdle()) > 0) await plan();
  } else if (!isRealModel(cfg.model)) await planPresetFineTune(cfg, { maxMemory: config.maxMemory });
  const id = randomId('ft-');
  const row: JobRow = {
    id, owner, status: 'queued', created_at: nowS(), config: cfg as unknown as Record<string, unknown>, step: 0, loss: null, eval_loss: null,
    error: null, output_dir: path.join(jobWorkDir(config, id), 'weights', 'final'), started_at: null, finished_at: null, cancel_requested: false,
  };
  await store.insertJob(row);
  await runner.submit(row);
  return (await store.getJob(id))!;
}

/**
 * A real model's base at submission: resolved to its folder (cfg.engine_model set) and its
 * tokenizer found; undefined for a preset, or for a Hub id not in the cache that the job will
 * download (--allow-downloads).
 * @throws HttpError 400 with the resolver's one line and its fix (`vela models download`, or
 *   --allow-downloads), or the missing tokenizer's.
 */
async function submittedBase(deps: Pick<JobRoutesDeps, 'store' | 'config'>, owner: string, cfg: FineTuneConfig): Promise<string | undefined> {
  if (!isRealModel(cfg.model) || !cfg.base) return undefined;
  const allowDownloads = deps.config.allowDownloads;
  let dir: string;
  try {
    await checkBaseAccess(deps.config, deps.store, owner, cfg.base, path.dirname(jobWorkDir(deps.config, 'x')));
    dir = (await resolveBase(cfg.base, { modelsDir: modelsDirOf(deps.config), cwdRelative: false })).dir;
  } catch (e) {
    const err = e as Error & { code?: string };
    if (err.name !== 'ModelError') throw e;
    if (err.code === 'not_downloaded' && allowDownloads) return undefined;
    const more = err.code === 'not_downloaded' && !err.message.includes('--allow-downloads') ? ', or start the server with --allow-downloads (VELA_ALLOW_DOWNLOADS=1) to let the job download it' : '';
    throw new HttpError(400, `${baseLine(err.message)}${more}`);
  }
  try {
    await jobModelShape(cfg, dir); // its config.json says what the model is (a folder without one is no base)
    tokenizerFileFor(dir); // the real model's prompts need PaliGemma's tokenizer: refused now, not at the first step
  } catch (e) {
    throw new HttpError(400, baseLine((e as Error).message));
  }
  // A pi0 folder given as pi0.5 (or the reverse) is refused now, naming both, as sessions do.
  await checkBaseVariant(cfg.model as RealModel, cfg.base, dir, 'model');
  cfg.engine_model = realEngineModel(cfg, dir);
  return dir;
}

/** A base problem as one line that starts with the field: resolver messages already start `base ...`. */
function baseLine(message: string): string {
  return message.startsWith('base ') ? message : `base: ${message}`;
}


/** @throws HttpError 400 unless `rel` is a relative path of plain segments (no `..`, `.`, empty, backslash). */
export function relativeSegments(rel: string): string[] {
  const segments = rel.split('/');
  if (rel === '' || segments.some((s) => s === '' || s === '.' || s === '..' || s.includes('\\') || s.includes('\0'))) {
    throw new HttpError(400, `file path "${rel}" must be plain relative segments`);
  }
  return segments;
}

/**
 * The file `rel` of a succeeded job's output, for streaming.
 * @throws HttpError 400 unless `rel` is plain relative segments, 404 when the job has no such file.
 */
export function jobOutputFile(j: JobRow, rel: string): string {
  const segments = relativeSegments(rel);
  const file = path.join(j.output_dir, ...segments);
  if (j.status !== 'succeeded' || !fs.existsSync(file) || !fs.statSync(file).isFile()) throw new HttpError(404, `no file "${rel}" in fine-tune ${j.id}'s output`);
  return file;
}

export function mountJobRoutes(app: TemplatedApp, deps: JobRoutesDeps): void {
  const { store, config, runner } = deps;
  const keepaliveMs = (deps.keepaliveS ?? 15) * 1000;

  const ownJob = async (r: Req, owner: string) => {
    const j = await store.getJob(r.params[0]!);
    if (!j || j.owner !== owner) throw new HttpError(404, `no fine-tune ${r.params[0]}`);
    return j;
  };

  // The defaults every surface fills in (server/jobs/recipes.ts), for the dashboard's form and clients.
  app.get('/v1/defaults', route(0, async (r) => {
    await requireOwner(store, r);
    sendJson(r, 200, defaultsJson());
  }));

  app.post('/v1/fine-tunes', route(0, async (r) => {
    const owner = await requireOwner(store, r);
    const row = await submitFineTune(deps, owner, await r.json());
    sendJson(r, 200, jobJson(row));
  }));

  app.get('/v1/fine-tunes', route(0, async (r) => {
    const owner = await requireOwner(store, r);
    sendJson(r, 200, { object: 'list', data: (await store.listJobs(owner)).map(jobJson) });
  }));

  app.get('/v1/fine-tunes/:id', route(1, async (r) => sendJson(r, 200, jobJson(await ownJob(r, await requireOwner(store, r))))));

  app.post('/v1/fine-tunes/:id/cancel', route(1, async (r) => {
    const j = await ownJob(r, await requireOwner(store, r));
    if (!(await runner.cancel(j.id))) throw new HttpError(409, `fine-tune ${j.id} already ended (${(await store.getJob(j.id))!.status})`);
    sendJson(r, 200, jobJson((await store.getJob(j.id))!));
  }));

  app.get('/v1/fine-tunes/:id/events', route(1, async (r) => {
    const j = await ownJob(r, await requireOwner(store, r));
    const from = eventCursor(r.query.get('from'), r.headers['last-event-id'], await store.nextEventIndex(j.id));
    const wantsStream = (r.headers['accept'] ?? '').includes('text/event-stream') || r.query.get('stream') === 'true';
    if (!wantsStream) {
      const data = await store.events(j.id, from, EVENTS_PAGE);
      return sendJson(r, 200, { object: 'list', data, has_more: data.length === EVENTS_PAGE && (await store.nextEventIndex(j.id)) > from + EVENTS_PAGE });
    }

    // Events are written in index order, by whichever node runs the job. This stream sends
    // exactly `next`, `next + 1`, ...: a live event that is not the next one (or that came from
    // another node as a bare index) makes it read the log from `next`, one read at a time.
    const sse = openSse(r);
    let next = from;
    let ended = false;
    let reading: Promise<void> | null = null;
    let again = false;
    const send = (ev: JobEvent) => {
      if (ended || ev.index !== next) return;
      sse.send(ev.index, ev.type, ev);
      next = ev.index + 1;
      if (ev.type === 'status' && isTerminal(ev.status as string)) finish();
    };
    const catchUp = (): Promise<void> => {
      if (reading) {
        again = true;
        return reading;
      }
      reading = (async () => {
        do {
          again = false;
          // The whole backlog, page by page: ending after the terminal status must not skip records.
          for (;;) {
            const page = await store.events(j.id, next, EVENTS_PAGE);
            for (const ev of page) send(ev);
            if (page.length < EVENTS_PAGE || ended) break;
          }
        } while (again && !ended);
      })()
        .catch((e) => log.warn(`events of ${j.id}: ${(e as Error).message}`))
        .finally(() => (reading = null));
      return reading;
    };
    const onLive = (ev: JobEvent) => {
      if (ev.index < next) return;
      if (ev.index === next && ev.type !== undefined && !reading) send(ev);
      else void catchUp();
    };
    // The keepalive also re-reads the log: a notification lost to a dropped connection is only late.
    const keepalive = setInterval(() => (sse.closed ? finish() : (sse.comment('keepalive'), void catchUp())), keepaliveMs);
    const finish = () => {
      if (ended) return;
      ended = true;
      clearInterval(keepalive);
      runner.live.off(`event:${j.id}`, onLive);
      sse.end();
    };
    // Subscribe before reading the log, so nothing lands between the two.
    runner.live.on(`event:${j.id}`, onLive);
    await catchUp();
    // The terminal status is the log's last record: once the job ended, nothing more will come.
    if (!ended && isTerminal((await store.getJob(j.id))!.status)) {
      await catchUp();
      finish();
    }
  }));

  app.get('/v1/fine-tunes/:id/files', route(1, async (r) => {
    const j = await ownJob(r, await requireOwner(store, r));
    sendJson(r, 200, { object: 'list', data: j.status === 'succeeded' ? await listFiles(j.output_dir) : [] });
  }));

  app.get('/v1/fine-tunes/:id/files/*', route(1, async (r) => {
    const j = await ownJob(r, await requireOwner(store, r));
    const rel = decodeUrlPart(r.url.slice(r.url.indexOf('/files/') + '/files/'.length), 'the file path');
    const file = jobOutputFile(j, rel);
    await streamFile(r, file, fs.statSync(file).size);
  }));
}
