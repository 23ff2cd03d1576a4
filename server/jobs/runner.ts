/**
 * The job queue of the server: fine-tunes run one at a time on the shared engines (2-core
 * machines gain nothing from two), every record goes to the durable event log first and then to
 * live SSE readers. A job is never left `running`: at start-up a job that was running when the
 * server died is resumed from its last checkpoint (train.ts reads resume.json).
 */
import { EventEmitter } from 'node:events';
import fs from 'node:fs';
import path from 'node:path';
import { log } from '../log.ts';
import { redactPaths } from '../redact.ts';
import { nowS, type JobEvent, type JobRow, type Store } from '../store.ts';
import type { EngineLike } from '../engine/host.ts';
import type { ServerConfig } from '../config.ts';
import { resolveDatasetDir, type FineTuneConfig } from './config.ts';
import { runFineTune } from './train.ts';
import { openDataset, type Dataset } from '../datasets/index.ts';

const TERMINAL = new Set(['succeeded', 'failed', 'cancelled']);

export function isTerminal(status: string): boolean {
  return TERMINAL.has(status);
}

/** The folder a job writes into: `<data>/jobs/<id>`; its output is `<that>/weights/final`. */
export function jobWorkDir(dataDir: string, id: string): string {
  return path.resolve(dataDir, 'jobs', id);
}

export class JobRunner {
  /** Emits `event:<jobId>` with each JobEvent after it is stored. */
  readonly live = new EventEmitter();
  private queue: string[] = [];
  private running: string | null = null;
  private stopped = false;
  private idle: Promise<void> = Promise.resolve();
  /** Opened datasets by folder, so that a second job on the same data reuses decoded frames. */
  private datasets = new Map<string, Promise<Dataset>>();

  constructor(
    private store: Store,
    private config: ServerConfig,
    private engineFor: (preset: string) => Promise<EngineLike>,
  ) {
    this.live.setMaxListeners(0);
  }

  /** Requeue what the last run left: running jobs first (to resume), then queued ones, oldest first. */
  recover(): void {
    const open = this.store.listJobs(null, ['running', 'queued']).reverse();
    for (const j of open.filter((x) => x.status === 'running')) {
      this.emit(j.id, 'log', { message: 'the server restarted while this job was running; resuming from its last checkpoint' });
      this.queue.push(j.id);
    }
    for (const j of open.filter((x) => x.status === 'queued')) this.queue.push(j.id);
    this.pump();
  }

  /** Append to the durable log, then tell live readers. */
  emit(jobId: string, type: string, data: Record<string, unknown>): JobEvent {
    const ev = this.store.appendEvent(jobId, type, data);
    this.live.emit(`event:${jobId}`, ev);
    return ev;
  }

  submit(job: JobRow): void {
    this.emit(job.id, 'status', { status: 'queued' });
    this.queue.push(job.id);
    this.pump();
  }

  /**
   * Ask a job to stop. Queued: cancelled now. Running: cancelled at the next step boundary.
   * @returns false when the job had already ended.
   */
  cancel(id: string): boolean {
    const job = this.store.getJob(id);
    if (!job || isTerminal(job.status)) return false;
    this.store.updateJob(id, { cancel_requested: true });
    if (job.status === 'queued' && this.running !== id) {
      this.queue = this.queue.filter((q) => q !== id);
      this.finish(id, 'cancelled', { error: 'cancelled before it started' });
    }
    return true;
  }

  /** Whether this runner has the job: running it now or queued to. */
  isActive(id: string): boolean {
    return this.running === id || this.queue.includes(id);
  }

  /**
   * The watchdog's verdict on a job that the store says is queued or running but that no runner
   * holds (lost with a worker): it ends `failed` with `reason`, so a waiting reader learns it.
   * @returns true when the job was marked failed now.
   */
  failLost(id: string, reason: string): boolean {
    const job = this.store.getJob(id);
    if (!job || isTerminal(job.status) || this.isActive(id) || this.stopped) return false;
    log.warn(`job ${id} is ${job.status} but no runner holds it: marking it failed`);
    this.finish(id, 'failed', { error: reason });
    return true;
  }

  private finish(id: string, status: 'succeeded' | 'failed' | 'cancelled', fields: { error?: string | null; output_dir?: string }): void {
    this.store.updateJob(id, { status, finished_at: nowS(), error: fields.error ?? null });
    this.emit(id, 'status', { status, ...(fields.error ? { error: fields.error } : {}), ...(fields.output_dir ? { output_dir: fields.output_dir } : {}) });
  }

  private pump(): void {
    if (this.running || this.stopped || this.queue.length === 0) return;
    const id = this.queue.shift()!;
    this.running = id;
    this.idle = this.run(id).finally(() => {
      this.running = null;
      this.pump();
    });
  }

  private async run(id: string): Promise<void> {
    const job = this.store.getJob(id);
    if (!job || isTerminal(job.status)) return;
    const cfg = job.config as unknown as FineTuneConfig;
    this.store.updateJob(id, { status: 'running', started_at: job.started_at ?? nowS() });
    this.emit(id, 'status', { status: 'running', model: cfg.model, steps: cfg.steps });
    let engine: EngineLike | null = null;
    try {
      engine = await this.engineFor(cfg.model);
      this.emit(id, 'log', { message: `engine ready: ${engine.info.preset}, ${engine.info.backendLine}` });
      const result = await runFineTune(cfg, {
        jobId: id,
        datasetDir: resolveDatasetDir(cfg.dataset_name, this.config.datasetsDir, this.config.allowAbsoluteDatasets),
        workDir: jobWorkDir(this.config.dataDir, id),
        engine,
        emit: (type, data) => {
          this.emit(id, type, data);
          if (type === 'progress') {
            const fields: Parameters<Store['updateJob']>[1] = { step: data.step as number, loss: data.loss as number | null };
            if (data.eval_loss !== undefined) fields.eval_loss = data.eval_loss as number;
            this.store.updateJob(id, fields);
          }
        },
        openDataset: (dir) => this.openDataset(dir),
        isCancelled: () => this.stopped || (this.store.getJob(id)?.cancel_requested ?? false),
      });
      if (result.status === 'cancelled' && this.stopped && !this.store.getJob(id)?.cancel_requested) {
        this.emit(id, 'log', { message: `server shutting down at step ${result.step}; the job resumes from its last checkpoint on the next start` });
        return; // stays `running` on disk on purpose: recover() resumes it
      }
      if (result.status === 'cancelled') this.finish(id, 'cancelled', { error: `cancelled at step ${result.step}` });
      else this.finish(id, 'succeeded', { output_dir: result.outputDir! });
    } catch (e) {
      const msg = (e as Error).message ?? String(e);
      log.warn(`job ${id} failed: ${msg}`);
      if (!(e as { code?: unknown }).code) log.debug((e as Error).stack ?? '');
      this.finish(id, 'failed', { error: redactPaths(msg) }); // the job's error is shown to its owner
    } finally {
      await engine?.call(id, 'close_session').catch(() => undefined);
    }
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

  /** Stop taking jobs; the running one stops at its next step boundary and resumes on restart. */
  async shutdown(): Promise<void> {
    this.stopped = true;
    await this.idle;
  }
}
