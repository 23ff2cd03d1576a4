/**
 * Dynamic batching: requests of different connections that arrive close together run as one
 * engine call. The first request to find the batcher idle opens a window of `windowMs`; the
 * batch leaves when the window closes or it holds `maxBatch` requests. While a batch runs, new
 * requests queue; when it ends, whatever queued leaves at once (those requests have already
 * waited), up to `maxBatch`. The window is an upper bound: when every client that could still
 * send (`senders()`, the open connections) has a request queued, the batch leaves at once, so
 * a lone robot never waits for company. One batch is in the engine at a time, so queued requests pile up
 * into the next batch instead of into the engine's queue.
 *
 * Each request carries its own seed and the engine draws datum i's noise from seeds[i] alone,
 * so a request's answer does not depend on what it was batched with.
 */
import { performance } from 'node:perf_hooks';
import type { DatumInput } from '../../kernels/small/batch.ts';
import { recordPolicyBatch } from '../metrics/policy.ts';

/** Runs one batch: rows[i] is datum i's answer. `tags[i]` is what datum i was submitted with (its weights version). */
export type RunBatch = (datums: DatumInput[], seeds: number[], tags: unknown[]) => Promise<{ rows: Float32Array[]; inferMs: number }>;

/** A request's result: its row, the engine time of its batch, and that batch's size. */
export interface BatchResult {
  row: Float32Array;
  inferMs: number;
  batchSize: number;
  /** How long the request waited in the batcher before its batch left for the engine, ms. */
  queueMs: number;
}

interface Waiting {
  datum: DatumInput;
  seed: number;
  tag: unknown;
  submittedMs: number;
  resolve: (r: BatchResult) => void;
  reject: (e: unknown) => void;
}

/** Counts of served batches, for `GET /stats` and tests. */
export interface BatchStats {
  requests: number;
  batches: number;
  /** batch size -> number of batches of that size. */
  batchSizes: Record<string, number>;
  maxBatchSize: number;
  queued: number;
  running: number;
}

export class Batcher {
  private queue: Waiting[] = [];
  private timer: NodeJS.Timeout | null = null;
  private running = 0; // datums in the engine now
  private closed: Error | null = null;
  private counts = { requests: 0, batches: 0, sizes: new Map<number, number>(), max: 0 };

  constructor(
    private run: RunBatch,
    readonly windowMs: number,
    readonly maxBatch: number,
    private senders: () => number = () => Infinity,
  ) {
    if (!(windowMs >= 0) || !Number.isFinite(windowMs)) throw new RangeError(`batch window is ${windowMs} ms; it must be >= 0`);
    if (!Number.isInteger(maxBatch) || maxBatch < 1) throw new RangeError(`max batch is ${maxBatch}; it must be an integer >= 1`);
  }

  /** Queue one datum (with an opaque `tag` handed to the runner); resolves with its row once its batch has run. */
  submit(datum: DatumInput, seed: number, tag: unknown = null): Promise<BatchResult> {
    if (this.closed) return Promise.reject(this.closed);
    return new Promise<BatchResult>((resolve, reject) => {
      this.queue.push({ datum, seed, tag, submittedMs: performance.now(), resolve, reject });
      this.schedule();
    });
  }

  private schedule(): void {
    if (this.running > 0) return; // the batch's end picks the queue up
    if (this.queue.length >= Math.min(this.maxBatch, Math.max(1, this.senders()))) return this.flush();
    if (!this.timer && this.queue.length > 0) this.timer = setTimeout(() => this.flush(), this.windowMs);
  }

  private flush(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    if (this.running > 0 || this.queue.length === 0) return;
    const batch = this.queue.splice(0, this.maxBatch);
    const startedMs = performance.now();
    recordPolicyBatch(batch.length);
    this.running = batch.length;
    this.counts.requests += batch.length;
    this.counts.batches += 1;
    this.counts.sizes.set(batch.length, (this.counts.sizes.get(batch.length) ?? 0) + 1);
    this.counts.max = Math.max(this.counts.max, batch.length);
    const settle = (answer: (w: Waiting, i: number) => void) => {
      this.running = 0;
      batch.forEach(answer);
      if (this.queue.length > 0) this.flush();
    };
    Promise.resolve()
      .then(() => this.run(batch.map((w) => w.datum), batch.map((w) => w.seed), batch.map((w) => w.tag)))
      .then(({ rows, inferMs }) => {
        if (rows.length !== batch.length) throw new Error(`the engine answered ${rows.length} rows for a batch of ${batch.length}`);
        return { rows, inferMs };
      })
      .then(
        ({ rows, inferMs }) => settle((w, i) => w.resolve({ row: rows[i]!, inferMs, batchSize: batch.length, queueMs: startedMs - w.submittedMs })),
        (e) => settle((w) => w.reject(e)),
      );
  }

  stats(): BatchStats {
    const batchSizes: Record<string, number> = {};
    for (const [k, v] of [...this.counts.sizes].sort((a, b) => a[0] - b[0])) batchSizes[String(k)] = v;
    return { requests: this.counts.requests, batches: this.counts.batches, batchSizes, maxBatchSize: this.counts.max, queued: this.queue.length, running: this.running };
  }

  /** Refuse new requests and fail the queued ones with `reason`; the running batch finishes. */
  close(reason: Error): void {
    this.closed = reason;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    for (const w of this.queue.splice(0)) w.reject(reason);
  }
}
