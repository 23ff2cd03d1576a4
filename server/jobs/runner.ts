/**
 * Running fine-tunes: a queue (queue.ts) hands this node job ids; every record goes to the
 * durable event log first and then to live SSE readers (on other nodes too, through the store's
 * notifications). A job is never left `running`: one node restarted resumes it from its last
 * checkpoint at start-up; in a cluster, a job whose node stopped or was lost is claimed by
 * another node, which resumes it from the last checkpoint on the shared storage (train.ts reads
 * resume.json) and logs a `resumed` event naming both nodes.
 */
import { EventEmitter } from 'node:events';
import fs from 'node:fs';
import path from 'node:path';
import { log } from '../log.ts';
import { redactPaths } from '../http/redact.ts';
import { nowS, type JobEvent, type JobFields, type JobRow, type Store } from '../store/store.ts';
import type { EngineLike } from '../engine/host.ts';
import type { ServerConfig } from '../config.ts';
import { storageOf } from '../store/storage.ts';
import { parseFineTuneConfig, type FineTuneConfig } from './config.ts';
import { datasetDirFor } from '../datasets/owned.ts';
import { isRealModel } from '../models/bases.ts';
import { modelsDirOf, resolveBase } from '../models/resolve.ts';
import { parseEngineModel } from '../engine/model-key.ts';
import { engineModelOf, planFineTune, realEngineModel } from './base.ts';
import { fetchDataset, isHubDatasetId, throttledProgress } from './fetch.ts';
import { runFineTune } from './train.ts';
import { resolveWriteToken, TRAINING_RECORD, uploadModel } from '../models/upload.ts';
import { trainingRecord, writeTrainingRecord } from './record.ts';
import { openDataset, type Dataset } from '../datasets/index.ts';
import { LocalQueue, type JobQueue, type RunOutcome } from './queue.ts';

const TERMINAL = new Set(['succeeded', 'failed', 'cancelled']);
/** At most one progress line per job in the server log this often (ms); the events have every step. */
const PROGRESS_LOG_MS = 30_000;
/** How long a shutdown waits for records held for an unreachable database (ms). */
const SHUTDOWN_RECORDS_WAIT_MS = 15_000;

export function isTerminal(status: string): boolean {
  return TERMINAL.has(status);
}

/** The folder a job writes into: `<storage>/jobs/<id>`; its output is `<that>/weights/final`. */
export function jobWorkDir(config: Pick<ServerConfig, 'dataDir' | 'storageDir'>, id: string): string {
  return storageOf(config).dir('jobs', id);
}

/** The store notification channel of job events: payload `<origin node> <job id> <index>`. */
export const JOB_EVENTS_CHANNEL = 'vela_job_events';

/** This process as a node of a cluster; absent on one node. */
export interface RunnerNode {
  id: string;
  /** True once the cluster declared this node lost: its work now belongs to others. */
  fenced(): boolean;
}

export class JobRunner {
  /** Emits `event:<jobId>` with each JobEvent after it is stored (`{index}` alone when it came from another node). */
  readonly live = new EventEmitter();
  private stopped = false;
  /** Per job, the tail of its event writes: records reach the log in the order they were made. */
  private tails = new Map<string, Promise<unknown>>();
  /** Opened datasets by folder, so that a second job on the same data reuses decoded frames. */
  private datasets = new Map<string, Promise<Dataset>>();
  private unlisten: (() => void) | null = null;
  /** Jobs running here now. */
  readonly running = new Set<string>();

  constructor(
    private store: Store,
    private config: ServerConfig,
    private engineFor: (preset: string) => Promise<EngineLike>,
    readonly queue: JobQueue = new LocalQueue(),
    private node: RunnerNode | null = null,
  ) {
    this.live.setMaxListeners(0);
  }

  /**
   * Start taking jobs. One node: requeue what the last run left, running jobs first (to resume),
   * then queued ones, oldest first. A cluster: listen for other nodes' events and requeue queued
   * jobs whose queue entry may be missing (the node that made them died between the two writes).
   */
  async start(): Promise<void> {
    const open = (await this.store.listJobs(null, ['running', 'queued'])).reverse();
    if (!this.node) {
      for (const j of open.filter((x) => x.status === 'running')) {
        await this.emit(j.id, 'log', { message: 'the server restarted while this job was running; resuming from its last checkpoint' });
        log.info(`job ${j.id}: the server restarted while it was running; it resumes from its last checkpoint`);
        await this.queue.enqueue(j.id);
      }
      for (const j of open.filter((x) => x.status === 'queued')) await this.queue.enqueue(j.id);
    } else {
      const me = this.node.id;
      this.unlisten = await this.store.db.listen(JOB_EVENTS_CHANNEL, (payload) => {
        const [origin, jobId, index] = payload.split(' ');
        if (origin !== me && jobId) this.live.emit(`event:${jobId}`, { index: Number(index) });
      });
      for (const j of open.filter((x) => x.status === 'queued')) await this.queue.enqueue(j.id);
    }
    await this.queue.start((id) => this.run(id));
  }

  /**
   * Append to the durable log (after the job's earlier records), then tell live readers here and
   * on other nodes. While the database is unreachable the record waits in memory (Store.appendEvent).
   * `jobFields`: the job row's progress fields, written with the record.
   */
  emit(jobId: string, type: string, data: Record<string, unknown>, jobFields?: JobFields): Promise<JobEvent> {
    const after = this.tails.get(jobId);
    const p = this.store.appendEvent(jobId, type, data, { after, jobFields }).then(async (ev) => {
      this.logEvent(jobId, ev);
      this.live.emit(`event:${jobId}`, ev);
      if (this.node) await this.store.db.notify(JOB_EVENTS_CHANNEL, `${this.node.id} ${jobId} ${ev.index}`).catch((e) => log.warn(`job ${jobId}: notify failed: ${e.message}`));
      return ev;
    });
    const tail = p.catch(() => undefined);
    this.tails.set(jobId, tail);
    void tail.then(() => this.tails.get(jobId) === tail && this.tails.delete(jobId));
    return p;
  }

  /**
   * At a step boundary: while the records held for the database reach --db-buffer-records, the
   * job waits here (training pauses) until the database takes them or the job must stop. Records
   * are never dropped; the bound can be passed by the records of one step (progress, checkpoint).
   */
  private async roomToRecord(id: string, mustStop: () => boolean): Promise<void> {
    const db = this.store.db;
    const limit = Math.max(1, this.config.dbBufferRecords);
    if (db.bufferedRecords() < limit) return;
    const since = Date.now();
    log.warn(`job ${id}: ${db.bufferedRecords()} records wait for the database ${db.where} (--db-buffer-records ${limit}); training pauses until it takes them`);
    if (await db.room(limit, mustStop)) log.info(`job ${id}: the database took its records; training goes on after ${((Date.now() - since) / 1000).toFixed(1)} s paused`);
  }

  /** Per running job: its steps, and when it last had a progress line in the server log (ms). */
  private progressLogged = new Map<string, { steps: unknown; at: number }>();

  /**
   * The operator's view of a job in the server log: each status and hand-over at info, a progress
   * line at most every PROGRESS_LOG_MS (and at each evaluation and the last step), the job's own
   * log lines at debug. Clients read the events, which have every step.
   */
  private logEvent(jobId: string, e: JobEvent): void {
    if (e.type === 'status') {
      const status = String(e.status);
      let detail = '';
      if (status === 'running') detail = ` (${e.model}, ${e.steps} steps on ${e.dataset ?? 'its dataset'}${e.node ? `, node ${e.node}` : ''})`;
      else if (typeof e.error === 'string') detail = e.error.startsWith(`${status} `) ? e.error.slice(status.length) : `: ${e.error}`; // "cancelled at step 13"
      else if (e.output_dir) detail = `: weights in ${e.output_dir}`;
      (status === 'failed' ? log.warn : log.info)(`job ${jobId} ${status}${detail}`);
      if (status === 'running') this.progressLogged.set(jobId, { steps: e.steps, at: 0 });
      else this.progressLogged.delete(jobId);
    } else if (e.type === 'resumed') {
      log.info(`job ${jobId}: ${e.message}`);
    } else if (e.type === 'progress') {
      const seen = this.progressLogged.get(jobId) ?? { steps: null, at: 0 };
      const now = Date.now();
      if (now - seen.at < PROGRESS_LOG_MS && typeof e.eval_loss !== 'number' && e.step !== seen.steps) return;
      this.progressLogged.set(jobId, { ...seen, at: now });
      const f4 = (x: unknown) => (typeof x === 'number' ? x.toFixed(4) : 'n/a');
      log.info(`job ${jobId}: step ${e.step}${typeof seen.steps === 'number' ? `/${seen.steps}` : ''} loss ${f4(e.loss)}${typeof e.eval_loss === 'number' ? ` eval_loss ${f4(e.eval_loss)}` : ''}`);
    } else if (e.type === 'log') {
      log.debug(`job ${jobId}: ${e.message}`);
    }
  }

  /** A new job (its row is stored): log it and queue it. */
  async submit(job: JobRow): Promise<void> {
    await this.emit(job.id, 'status', { status: 'queued' });
    await this.queue.enqueue(job.id);
  }

  /**
   * Ask a job to stop, from any node. Queued: cancelled now. Running: cancelled at the next step
   * boundary by the node that runs it (it reads the flag from the store).
   * @returns false when the job had already ended.
   */
  async cancel(id: string): Promise<boolean> {
    const job = await this.store.getJob(id);
    if (!job || isTerminal(job.status)) return false;
    await this.store.updateJob(id, { cancel_requested: true });
    // Only while still queued: a node that claims it meanwhile sees the flag at its first step.
    if (job.status === 'queued' && (await this.store.transitionJob(id, ['queued'], { status: 'cancelled', finished_at: nowS(), error: 'cancelled before it started' }))) {
      await this.emit(id, 'status', { status: 'cancelled', error: 'cancelled before it started' });
    }
    return true;
  }

  /** Whether this node has the job: running it now, or in its local queue. */
  isActive(id: string): boolean {
    return this.running.has(id) || (this.queue instanceof LocalQueue && this.queue.holds(id));
  }

  /**
   * The watchdog's verdict on a job that the store says is queued or running but that no runner
   * holds (lost with a worker): it ends `failed` with `reason`, so a waiting reader learns it.
   * A cluster never does this: its queue holds every waiting job, and a lost node's job is
   * resumed elsewhere (cluster/node.ts), so "not held here" does not mean lost.
   * @returns true when the job was marked failed now.
   */
  async failLost(id: string, reason: string): Promise<boolean> {
    if (this.node) return false;
    const job = await this.store.getJob(id);
    if (!job || isTerminal(job.status) || this.isActive(id) || this.stopped) return false;
    await this.finish(id, 'failed', { error: reason });
    return true;
  }

  /** Move a job to its end state once (whoever gets there first), and log it last. */
  /**
   * Uploads a succeeded job's model to the Hub (its `push_to_hub` setting) with the server's write
   * token, before its terminal status so that a reader of its events sees the outcome. A failed
   * upload is a `log` record with the error; the job still succeeds (its model is on the server:
   * `vela models upload` can send it again).
   */
  private async pushToHub(id: string, repoId: string, dir: string): Promise<void> {
    await this.emit(id, 'log', { message: `uploading the model to the Hub repo ${repoId}`, stage: 'push', repo_id: repoId });
    try {
      const token = resolveWriteToken(undefined);
      if (!token) throw new Error('this server has no Hub write token (HF_TOKEN) any more');
      const r = await uploadModel({ dir, repoId, token, endpoint: process.env.HF_ENDPOINT || undefined });
      await this.emit(id, 'log', { message: `uploaded to ${repoId} at commit ${r.commit}: ${r.files.length} files`, stage: 'push', repo_id: repoId, commit: r.commit, files: r.files.length, created: r.created });
    } catch (e) {
      await this.emit(id, 'log', { message: `the upload to ${repoId} failed: ${redactPaths((e as Error).message)}; the model stays on the server (vela models upload sends it again)`, stage: 'push', repo_id: repoId, error: redactPaths((e as Error).message) });
    }
  }

  private async finish(id: string, status: 'succeeded' | 'failed' | 'cancelled', fields: { error?: string | null; output_dir?: string; model_dir?: string }): Promise<void> {
    // Kept like a record: a job that ends while the database is away ends when it returns. A retry
    // after a dropped connection finds the first attempt's status when that one was committed.
    const moved = await this.store.db.keep(async (attempt) =>
      (await this.store.transitionJob(id, ['queued', 'running'], { status, finished_at: nowS(), error: fields.error ?? null })) ||
      (attempt > 0 && (await this.store.getJob(id))?.status === status));
    if (!moved) return;
    await this.emit(id, 'status', { status, ...(fields.error ? { error: fields.error } : {}), ...(fields.output_dir ? { output_dir: fields.output_dir } : {}), ...(fields.model_dir ? { model_dir: fields.model_dir } : {}) });
  }

  /**
   * Make a job this node's to run. Queued: claimed. Running on this node (a restart): resumed.
   * Running on a node that stopped or was lost: taken over, with a `resumed` event. Running on a
   * node that is up, or ended: not ours (a duplicate queue entry).
   * @returns whether to run it, and the node it was taken from.
   */
  private async claim(job: JobRow): Promise<{ run: boolean; from: string | null }> {
    const me = this.node?.id ?? null;
    const startedAt = job.started_at ?? nowS();
    if (job.status === 'queued') {
      return { run: await this.store.transitionJob(job.id, ['queued'], { status: 'running', started_at: startedAt, node_id: me }), from: null };
    }
    if (job.status !== 'running') return { run: false, from: null };
    if (!me || !job.node_id || job.node_id === me) {
      if (me && !job.node_id) await this.store.updateJob(job.id, { node_id: me });
      return { run: true, from: null };
    }
    const owner = await this.store.getNode(job.node_id);
    if (owner?.status === 'up') return { run: false, from: null };
    const took = await this.store.transitionJob(job.id, ['running'], { node_id: me }, job.node_id);
    return { run: took, from: took ? job.node_id : null };
  }

  /** Run (or resume) one job to its end, or until this node stops. */
  async run(id: string): Promise<RunOutcome> {
    const job = await this.store.getJob(id);
    if (!job || isTerminal(job.status)) return 'done';
    // Re-validated: a job queued by an older server lacks the newer fields, which take their defaults.
    let cfg: FineTuneConfig;
    let lastEval: Record<string, unknown> | null = null;
    try {
      cfg = parseFineTuneConfig(job.config, { stored: true });
    } catch (e) {
      await this.finish(id, 'failed', { error: `the stored config is no longer valid: ${(e as Error).message}` });
      return 'done';
    }
    const { run, from } = await this.claim(job);
    if (!run) return 'done';
    const me = this.node?.id ?? null;
    this.running.add(id);
    if (from) {
      await this.emit(id, 'resumed', { from_node: from, to_node: me, step: job.step, message: `node ${from} stopped during this job; node ${me} resumes it from its last checkpoint` });
    }
    await this.emit(id, 'status', { status: 'running', model: cfg.model, steps: cfg.steps, dataset: cfg.dataset_name, ...(me ? { node: me } : {}) });
    const mustStop = () => this.stopped || (this.node?.fenced() ?? false);
    let engine: EngineLike | null = null;
    try {
      const logLine = (data: Record<string, unknown>) => void this.emit(id, 'log', data).catch((e) => log.error(`job ${id}: a log record was not stored: ${e.message}`));
      // Resolved as its key sees it (its own upload first), as when the job was accepted; a Hub
      // dataset accepted for download is fetched now, with its progress in the events.
      const datasetDir = await this.jobDataset(job.owner, cfg.dataset_name, 'dataset_name', logLine);
      const evalDatasetDir = cfg.eval_dataset ? await this.jobDataset(job.owner, cfg.eval_dataset, 'eval_dataset', logLine) : undefined;
      const baseDir = await this.jobBase(cfg, logLine);
      engine = await this.engineFor(engineModelOf(cfg));
      await this.emit(id, 'log', { message: `engine ready: ${engine.info.preset}${baseDir ? ` on base ${cfg.base}` : ''}, ${engine.info.backendLine}` });
      const result = await runFineTune(cfg, {
        jobId: id,
        datasetDir,
        baseDir,
        evalDatasetDir,
        workDir: jobWorkDir(this.config, id),
        engine,
        emit: (type, data) => {
          let fields: JobFields | undefined;
          if (type === 'progress') {
            fields = { step: data.step as number, loss: data.loss as number | null };
            if (data.eval_loss !== undefined) fields.eval_loss = data.eval_loss as number;
            if (data.eval_mse !== undefined) lastEval = data; // the model card's held-out numbers
          }
          void this.emit(id, type, data, fields).catch((e) => log.error(`job ${id}: a ${type} record was not stored: ${e.message}`));
        },
        openDataset: (dir) => this.openDataset(dir),
        // A store that cannot be read does not stop the training (the database may be back at the next step).
        isCancelled: async () => {
          await this.roomToRecord(id, mustStop);
          return mustStop() || ((await this.store.getJob(id).catch(() => null))?.cancel_requested ?? false);
        },
      });
      if (result.status === 'cancelled' && mustStop() && !(await this.store.getJob(id))?.cancel_requested) return await this.handOff(id, result.step);
      if (result.status === 'cancelled') await this.finish(id, 'cancelled', { error: `cancelled at step ${result.step}` });
      else {
        const modelDir = result.modelDir ?? result.outputDir!;
        // The model is whole without it: a record that cannot be written is said, not a failed job.
        const record = trainingRecord(id, cfg, lastEval);
        for (const dir of new Set([modelDir, result.outputDir!])) {
          await writeTrainingRecord(dir, record).catch((e) =>
            this.emit(id, 'log', { message: `${TRAINING_RECORD} (the model card's training facts) was not written: ${redactPaths((e as Error).message)}` }));
        }
        if (cfg.push_to_hub) await this.pushToHub(id, cfg.push_to_hub, modelDir);
        await this.finish(id, 'succeeded', { output_dir: result.outputDir!, ...(result.modelDir ? { model_dir: result.modelDir } : {}) });
      }
    } catch (e) {
      // A node that is stopping (its engines close) hands the job on instead of failing it.
      if (mustStop()) return await this.handOff(id, null);
      const msg = (e as Error).message ?? String(e);
      // The failed status is logged with the redacted error (logEvent); the whole one is for debugging.
      log.debug(`job ${id} failed: ${(e as { code?: unknown }).code ? msg : ((e as Error).stack ?? msg)}`);
      await this.finish(id, 'failed', { error: redactPaths(msg) }); // the job's error is shown to its owner
    } finally {
      this.running.delete(id);
      await engine?.call(id, 'close_session').catch(() => undefined);
    }
    return 'done';
  }

  /**
   * The folder of a job's dataset: on disk as its key sees it, else (a Hub id the operator lets
   * jobs download) fetched into the datasets root now.
   * @throws Error naming the field when the dataset is gone; HubError when the download fails.
   */
  private async jobDataset(owner: string, name: string, field: string, logLine: (data: Record<string, unknown>) => void): Promise<string> {
    const dir = datasetDirFor(this.config, owner, name, field);
    if (dir) return dir;
    if (!this.config.allowDownloads || !isHubDatasetId(name)) return ownedDatasetDir(this.config, owner, name, field);
    logLine({ message: `${field} "${name}" is not in the datasets root: downloading it from the Hub`, stage: 'download' });
    return fetchDataset(this.config.datasetsDir, name, { endpoint: process.env.HF_ENDPOINT, token: process.env.HF_TOKEN || null, emit: logLine });
  }

  /**
   * The real model's base folder (undefined for presets), with cfg.engine_model set to its
   * engine: the one resolved at submission while it is still there, else resolved again (and
   * downloaded, with progress, when the operator allows it).
   * @throws ModelError's one line (the base is not there, and how to get it).
   */
  private async jobBase(cfg: FineTuneConfig, logLine: (data: Record<string, unknown>) => void): Promise<string | undefined> {
    if (!isRealModel(cfg.model) || !cfg.base) return undefined;
    if (cfg.engine_model) {
      const m = parseEngineModel(cfg.engine_model);
      if (m.kind === 'real' && fs.existsSync(path.join(m.dir, 'config.json'))) return m.dir;
    }
    const { dir } = await resolveBase(cfg.base, { modelsDir: modelsDirOf(this.config), cwdRelative: false, allowDownload: this.config.allowDownloads, onProgress: throttledProgress(cfg.base, logLine) as (p: unknown) => void });
    cfg.engine_model = realEngineModel(cfg, dir);
    // Downloaded now, so not planned at submission: planned before it loads (the job fails with the line).
    await planFineTune(cfg, dir, { maxMemory: this.config.maxMemory });
    return dir;
  }

  /** This node stops midway: the job stays `running` on purpose, and resumes from its last checkpoint elsewhere (or at the next start). */
  private async handOff(id: string, step: number | null): Promise<RunOutcome> {
    this.progressLogged.delete(id);
    if (this.node?.fenced()) return 'handoff'; // another node owns it now: write nothing more
    const where = this.node ? 'on another node' : 'on the next start';
    const message = `server shutting down${step === null ? '' : ` at step ${step}`}; the job resumes from its last checkpoint ${where}`;
    log.info(`job ${id}: ${message}`);
    await this.emit(id, 'log', { message });
    return 'handoff';
  }

  /** The last two datasets stay open (their frame caches are bounded); a failed open is not kept. */
  openDataset(dir: string): Promise<Dataset> {
    // A rewritten info.json (episodes added) makes a new key, so a changed dataset is re-read.
    let key = dir;
    try {
      key += `|${fs.statSync(path.join(dir, 'meta', 'info.json')).mtimeMs}`;
    } catch {
      return openDataset(dir); // let the reader name what is missing
    }
    let p = this.datasets.get(key);
    if (p) {
      this.datasets.delete(key); // re-insert: most recently used last
      this.datasets.set(key, p);
      return p;
    }
    p = openDataset(dir);
    p.catch(() => this.datasets.delete(key));
    this.datasets.set(key, p);
    while (this.datasets.size > 2) this.datasets.delete(this.datasets.keys().next().value!);
    return p;
  }

  /** Stop taking jobs; the running one stops at its next step boundary and resumes on restart (or on another node). */
  async shutdown(): Promise<void> {
    this.stopped = true;
    this.unlisten?.();
    await this.queue.shutdown();
    // Records still held for an unreachable database get a grace period, then are named as lost.
    const stored = Promise.all([...this.tails.values()]).then(() => true);
    if (!(await Promise.race([stored, new Promise<false>((r) => setTimeout(() => r(false), SHUTDOWN_RECORDS_WAIT_MS).unref())]))) {
      log.error(`shutting down with ${this.store.db.bufferedRecords()} job records not stored: the database ${this.store.db.where} did not answer within ${SHUTDOWN_RECORDS_WAIT_MS / 1000} s`);
    }
  }
}

/**
 * The folder of a queued job's dataset, as its key sees it.
 * @throws Error naming the field when the dataset is gone (deleted or moved since the job was accepted).
 */
function ownedDatasetDir(config: ServerConfig, owner: string, name: string, field: string): string {
  const dir = datasetDirFor(config, owner, name, field);
  if (!dir) throw new Error(`${field} "${name}" not found: it is no longer among this key's uploads or under the datasets root`);
  return dir;
}
