/**
 * The one Prometheus registry of this process (GET /metrics, Prometheus' text format 0.0.4) and
 * prom-client's default Node metrics (RSS, heap, event-loop lag, GC). Metrics are per process:
 * every server started in it (tests start several) records into the same families.
 */
import client from 'prom-client';

export const registry = new client.Registry();
client.collectDefaultMetrics({ register: registry });

/** The Content-Type of a scrape: `text/plain; version=0.0.4; charset=utf-8`. */
export const METRICS_CONTENT_TYPE = registry.contentType;

/** Seconds, for latencies from 1 ms to 10 s (policy stages, HTTP). */
export const LATENCY_BUCKETS_S = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10];

/** The whole exposition text. Async collectors (the store's job counts) run here, never blocking. */
export function metricsText(): Promise<string> {
  return registry.metrics();
}
