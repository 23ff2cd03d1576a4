/**
 * Gauges read at scrape time from what the servers of this process registered: fine-tune jobs by
 * state (one GROUP BY on the store), the database's error count and buffered records (when its db
 * object offers `errorCount()` / `bufferedRecords()`), and each engine worker's TF.js memory
 * (tf.memory()'s numBytes and numTensors, pushed by the worker with every answer, so a scrape
 * never waits on a busy worker).
 */
import client from 'prom-client';
import { log } from '../log.ts';
import { registry } from './registry.ts';

/** What a store offers the gauges: its db (Store.db). */
export interface MetricsStore {
  db: { all<T>(sql: string, params?: unknown[]): Promise<T[]> };
}

/** An engine worker's numbers, as the host last heard them. */
export interface MetricsEngine {
  readonly labels: { preset: string; lane: string; worker: string };
  /** tf.memory() after the worker's last op; null before its first answer. */
  memory(): { numBytes: number; numTensors: number; graphs?: { traced: number; cached: number; cachedBytes: number } } | null;
  stats(): { queued: number };
}

const JOB_STATES = ['queued', 'running', 'succeeded', 'failed', 'cancelled'];
const stores = new Set<MetricsStore>();
const engines = new Set<MetricsEngine>();

/** Count a db getter's value (the store's db object may not have it yet: then 0). */
function dbValue(name: 'errorCount' | 'bufferedRecords'): number {
  let sum = 0;
  for (const s of stores) {
    const fn = (s.db as unknown as Record<string, unknown>)[name];
    if (typeof fn === 'function') {
      const v = Number(fn.call(s.db));
      if (Number.isFinite(v)) sum += v;
    }
  }
  return sum;
}

new client.Gauge({
  name: 'vela_jobs', help: 'fine-tune jobs in the store by state (read at scrape time)', labelNames: ['state'], registers: [registry],
  async collect() {
    const counts = new Map<string, number>(JOB_STATES.map((s) => [s, 0]));
    for (const s of stores) {
      try {
        for (const r of await s.db.all<{ status: string; n: number }>('SELECT status, COUNT(*) AS n FROM fine_tunes GROUP BY status')) {
          counts.set(r.status, (counts.get(r.status) ?? 0) + Number(r.n));
        }
      } catch (e) {
        // A scrape must still answer when the database is down; the db error gauge shows it.
        log.warn(`metrics: counting jobs failed: ${(e as Error).message}`);
      }
    }
    this.reset();
    for (const [state, n] of counts) this.set({ state }, n);
  },
});
/** The db's errorCount() at the last scrape: the counter moves by the difference (a new store, as in tests, starts again from its own count). */
let dbErrorsSeen = 0;
new client.Counter({
  name: 'vela_db_errors_total', help: 'database statements that failed (the db object\'s errorCount(); 0 when it has none)', registers: [registry],
  collect() {
    const now = dbValue('errorCount');
    if (now > dbErrorsSeen) this.inc(now - dbErrorsSeen);
    dbErrorsSeen = now;
  },
});
new client.Gauge({
  name: 'vela_db_buffered_records', help: 'records buffered for the database, not yet written (bufferedRecords(); 0 when it has none)', registers: [registry],
  collect() {
    this.set(dbValue('bufferedRecords'));
  },
});
const engineLabels = ['preset', 'lane', 'worker'];
new client.Gauge({
  name: 'vela_engine_memory_bytes', help: 'TF.js memory of an engine worker after its last op (tf.memory().numBytes)', labelNames: engineLabels, registers: [registry],
  collect() {
    this.reset();
    for (const e of engines) this.set(e.labels, e.memory()?.numBytes ?? 0);
  },
});
new client.Gauge({
  name: 'vela_engine_tensors', help: 'live tensors of an engine worker after its last op (tf.memory().numTensors)', labelNames: engineLabels, registers: [registry],
  collect() {
    this.reset();
    for (const e of engines) this.set(e.labels, e.memory()?.numTensors ?? 0);
  },
});
new client.Gauge({
  name: 'vela_engine_graphs', help: 'traced graphs an engine worker holds after its last op (kernels/graph-cache.ts)', labelNames: engineLabels, registers: [registry],
  collect() {
    this.reset();
    for (const e of engines) this.set(e.labels, e.memory()?.graphs?.cached ?? 0);
  },
});
new client.Gauge({
  name: 'vela_engine_graph_bytes', help: 'estimated bytes of the traced graphs an engine worker holds (bounded by VELA_GRAPH_CACHE_BYTES)', labelNames: engineLabels, registers: [registry],
  collect() {
    this.reset();
    for (const e of engines) this.set(e.labels, e.memory()?.graphs?.cachedBytes ?? 0);
  },
});
new client.Gauge({
  name: 'vela_engine_graphs_traced', help: 'graphs (sampling and forward_backward) an engine worker has traced since it started', labelNames: engineLabels, registers: [registry],
  collect() {
    this.reset();
    for (const e of engines) this.set(e.labels, e.memory()?.graphs?.traced ?? 0);
  },
});
new client.Gauge({
  name: 'vela_engine_queued_calls', help: 'calls waiting for an engine worker', labelNames: engineLabels, registers: [registry],
  collect() {
    this.reset();
    for (const e of engines) this.set(e.labels, e.stats().queued);
  },
});

/** Count this store's jobs and db numbers in scrapes; returns the undo (call it when the store closes). */
export function watchStore(store: MetricsStore): () => void {
  stores.add(store);
  return () => stores.delete(store);
}

/** Report this engine in scrapes until `unwatchEngine`. */
export function watchEngine(engine: MetricsEngine): void {
  engines.add(engine);
}

/** The engine closed or died: its series go away. */
export function unwatchEngine(engine: MetricsEngine): void {
  engines.delete(engine);
}
