/**
 * Where fine-tunes wait to run. One node: an in-process list (`LocalQueue`), jobs run one at a
 * time on this process's engines, and what was queued or running when the server stopped is
 * queued again at the next start from the store. A cluster: graphile-worker on the shared
 * PostgreSQL (graphile-queue.ts), where any node with room claims the next job.
 */

/** What running a job came to: `done` (ended, or not ours to run), or `handoff` (stopped midway; another run resumes it). */
export type RunOutcome = 'done' | 'handoff';

export interface JobQueue {
  /** Start taking jobs: `run(id)` is called for each, one at a time on this node. */
  start(run: (id: string) => Promise<RunOutcome>): Promise<void>;
  /** Queue a job (its row is in the store already). Queuing a job twice runs it once. */
  enqueue(id: string): Promise<void>;
  /** This node's worker id in the queue (what holds the jobs it claimed); null for a local queue. */
  readonly workerId: string | null;
  /** Jobs held by workers that are gone (a lost node's, this node's previous life's) can be claimed again. */
  releaseWorkers(workerIds: string[]): Promise<void>;
  /** Stop taking jobs; resolves once the job in hand returned. */
  shutdown(): Promise<void>;
}

/** The one-node queue: ids in memory, in order. */
export class LocalQueue implements JobQueue {
  private ids: string[] = [];
  private run: ((id: string) => Promise<RunOutcome>) | null = null;
  private busy = false;
  private stopped = false;
  private idle: Promise<void> = Promise.resolve();

  async start(run: (id: string) => Promise<RunOutcome>): Promise<void> {
    this.run = run;
    this.pump();
  }

  async enqueue(id: string): Promise<void> {
    if (!this.ids.includes(id)) this.ids.push(id);
    this.pump();
  }

  readonly workerId = null;

  /** Whether `id` waits in this queue. */
  holds(id: string): boolean {
    return this.ids.includes(id);
  }

  /** One process: nothing of another node to release. */
  async releaseWorkers(): Promise<void> {}

  private pump(): void {
    if (!this.run || this.busy || this.stopped || this.ids.length === 0) return;
    const id = this.ids.shift()!;
    this.busy = true;
    this.idle = this.run(id)
      .catch(() => 'done' as const)
      .then(() => {
        this.busy = false;
        this.pump();
      });
  }

  async shutdown(): Promise<void> {
    this.stopped = true;
    await this.idle;
  }
}
