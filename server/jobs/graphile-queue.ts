/**
 * The cluster's job queue: graphile-worker on the shared PostgreSQL. Each node runs one worker
 * pool (concurrency 1: a node trains one job at a time, as a single node does); jobs it claims
 * are locked by the pool's id, which the node records in its row of the node registry, so that
 * when a node is declared lost a surviving node releases that node's job at once with
 * `forceUnlockWorkers` instead of graphile-worker's 4-hour lock timeout. A job that stops midway because its node shuts down is failed back to the queue
 * (graphile-worker retries it after a few seconds, on any node). New jobs wake idle workers
 * through LISTEN/NOTIFY; released ones are found by polling every `pollMs`.
 *
 * Why graphile-worker and not pg-boss: pg-boss's lines that run on Node 20 (10.x) notice a dead
 * worker only when a job's `expireInSeconds` passes (heartbeats came in 11/12, which need Node
 * 22), so a training job longer than its expiry would be run twice, or a dead node's job would
 * wait out the expiry. graphile-worker 0.17 (Node >= 14) lets us name each worker and release a
 * named dead worker's jobs at once, which is what our heartbeat-based node registry needs.
 */
import { EventEmitter } from 'node:events';
import { Logger, makeWorkerUtils, run, type Runner, type WorkerEvents, type WorkerUtils } from 'graphile-worker';
import type pg from 'pg';
import { log } from '../log.ts';
import type { JobQueue, RunOutcome } from './queue.ts';

const TASK = 'vela_fine_tune';

/** graphile-worker's log lines go to ours; its routine `info` lines are debug here. */
const logger = new Logger(() => (level, message) => {
  if (level === 'error') log.error(`[queue] ${message}`);
  else if (level === 'warning') log.warn(`[queue] ${message}`);
  else log.debug(`[queue] ${message}`);
});

export class GraphileQueue implements JobQueue {
  private utils: WorkerUtils | null = null;
  private runner: Runner | null = null;
  workerId: string | null = null;

  constructor(private pool: pg.Pool, private nodeId: string, private pollMs = 1000) {}

  private async workerUtils(): Promise<WorkerUtils> {
    // Migrates graphile-worker's own schema (graphile_worker) once, under its own lock.
    this.utils ??= await makeWorkerUtils({ pgPool: this.pool, logger });
    return this.utils;
  }

  async start(runJob: (id: string) => Promise<RunOutcome>): Promise<void> {
    await (await this.workerUtils()).migrate();
    // graphile-worker 0.17 locks jobs with the id of the pool that claimed them (random, made in run()).
    const events = new EventEmitter() as WorkerEvents;
    events.on('pool:create', ({ workerPool }) => (this.workerId = workerPool.id));
    this.runner = await run({
      pgPool: this.pool, concurrency: 1, noHandleSignals: true, pollInterval: this.pollMs, logger, events,
      taskList: {
        [TASK]: async (payload: unknown) => {
          const id = (payload as { id?: unknown })?.id;
          if (typeof id !== 'string') throw new Error(`queue entry without a job id: ${JSON.stringify(payload)}`);
          // Thrown, so graphile-worker puts the job back for another node (retry with backoff).
          if ((await runJob(id)) === 'handoff') throw new Error(`node ${this.nodeId} stopped during job ${id}; it resumes on another node`);
        },
      },
    });
    if (!this.workerId) throw new Error('graphile-worker started without telling its pool id');
  }

  async enqueue(id: string): Promise<void> {
    // jobKey: queuing the same job again updates the waiting entry instead of adding one.
    await (await this.workerUtils()).addJob(TASK, { id }, { jobKey: id, maxAttempts: 1000 });
  }

  async releaseWorkers(workerIds: string[]): Promise<void> {
    if (workerIds.length > 0) await (await this.workerUtils()).forceUnlockWorkers(workerIds);
  }

  async shutdown(): Promise<void> {
    await this.runner?.stop();
    this.runner = null;
    await this.utils?.release();
    this.utils = null;
  }
}
