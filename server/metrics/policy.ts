/**
 * Policy serving (the OpenPI websocket, socket.ts): per request the time of each stage, the gap
 * between a robot's requests and its change (jitter), and batch sizes; overall and per live
 * connection. Connection series exist only while the connection is open and its policy loaded,
 * and for at most MAX_CONNECTION_SERIES connections at once (later ones count in the overall
 * series only), so label cardinality stays bounded however many robots come and go. Series
 * labelled by `policy` belong to the policy's owner (owners.ts): a tenant key's scrape shows
 * only its own; they go when the policy is unloaded (holdPolicySeries).
 *
 * Stages of one request (seconds): `decode` (message arrival -> the datum is handed to the
 * batcher: msgpack, zstd, image decode, normalisation), `queue_wait` (batcher -> its batch's
 * engine call starts), `compute` (the batch's engine call, engine queue included), `send` (the
 * answer is ready -> it is written to the socket, waiting for earlier answers of the connection
 * included), `total` (arrival -> written).
 */
import client from 'prom-client';
import { clearSeriesOwner, setSeriesOwner } from './owners.ts';
import { LATENCY_BUCKETS_S, registry } from './registry.ts';

/** Most connections that get their own series at once. */
export const MAX_CONNECTION_SERIES = 16;

/** Seconds, 1 ms to 120 s: the full-size real pi0 / pi0.5 takes 10-50 s per request on a CPU. */
const POLICY_LATENCY_BUCKETS_S = [...LATENCY_BUCKETS_S, 20, 30, 60, 120];
const INTERVAL_BUCKETS_S = [0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30];
const JITTER_BUCKETS_S = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1];
const BATCH_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256];

const stageSeconds = new client.Histogram({
  name: 'vela_policy_request_seconds', help: 'policy request time by stage (decode, queue_wait, compute, send, total), seconds',
  labelNames: ['stage'], buckets: POLICY_LATENCY_BUCKETS_S, registers: [registry],
});
const connStageSeconds = new client.Histogram({
  name: 'vela_policy_connection_request_seconds', help: 'policy request time by stage, per live connection (series removed on close), seconds',
  labelNames: ['connection', 'policy', 'stage'], buckets: POLICY_LATENCY_BUCKETS_S, registers: [registry],
});
const interval = new client.Histogram({
  name: 'vela_policy_request_interval_seconds', help: 'gap between consecutive requests of one connection (arrival to arrival), seconds',
  buckets: INTERVAL_BUCKETS_S, registers: [registry],
});
const connInterval = new client.Histogram({
  name: 'vela_policy_connection_request_interval_seconds', help: 'gap between consecutive requests, per live connection, seconds',
  labelNames: ['connection', 'policy'], buckets: INTERVAL_BUCKETS_S, registers: [registry],
});
const jitter = new client.Histogram({
  name: 'vela_policy_request_jitter_seconds', help: 'jitter: |gap - previous gap| between consecutive requests of one connection, seconds',
  buckets: JITTER_BUCKETS_S, registers: [registry],
});
const connJitter = new client.Histogram({
  name: 'vela_policy_connection_request_jitter_seconds', help: 'jitter (|gap - previous gap|), per live connection, seconds',
  labelNames: ['connection', 'policy'], buckets: JITTER_BUCKETS_S, registers: [registry],
});
const batchSize = new client.Histogram({
  name: 'vela_policy_batch_size', help: 'requests per engine call of the policy batcher', buckets: BATCH_BUCKETS, registers: [registry],
});
const connBatchSize = new client.Histogram({
  name: 'vela_policy_connection_batch_size', help: 'size of the batch each request of a live connection ran in',
  labelNames: ['connection', 'policy'], buckets: BATCH_BUCKETS, registers: [registry],
});
const requests = new client.Counter({ name: 'vela_policy_requests_total', help: 'policy observations answered', registers: [registry] });
const errors = new client.Counter({ name: 'vela_policy_errors_total', help: 'policy connections ended by an error frame', registers: [registry] });
const connections = new client.Gauge({ name: 'vela_policy_connections', help: 'open policy websocket connections', registers: [registry] });

/** Times of one answered request, milliseconds (performance.now() differences). */
export interface PolicyRequestTiming {
  decodeMs: number;
  queueMs: number;
  computeMs: number;
  sendMs: number;
  totalMs: number;
  batchSize: number;
}

let nextConnection = 1;
let labelled = 0;
/** The recorders that have their own series, so a policy's release can take them away. */
const labelledConnections = new Set<PolicyConnectionMetrics>();

/** One policy connection's recorder; `close()` it when the socket closes. */
export class PolicyConnectionMetrics {
  private ownLabels: { connection: string; policy: string } | null;
  private lastArrivalMs: number | null = null;
  private lastGapMs: number | null = null;
  private closed = false;

  /** `policy`: the served policy's id (a fine-tune, session or checkpoint). */
  constructor(policy: string) {
    connections.inc();
    this.ownLabels = labelled < MAX_CONNECTION_SERIES ? { connection: `c${nextConnection++}`, policy } : null;
    if (this.ownLabels) {
      labelled++;
      labelledConnections.add(this);
    }
  }

  /**
   * The connection's labels, or null when it is past the cap or its policy was released
   * (holdPolicySeries): then it counts in the overall series only.
   */
  get labels(): { connection: string; policy: string } | null {
    return this.ownLabels;
  }

  /** A request arrived at `nowMs` (performance.now()): records the gap and jitter since the previous one. */
  arrived(nowMs: number): void {
    if (this.lastArrivalMs !== null) {
      const gapMs = nowMs - this.lastArrivalMs;
      interval.observe(gapMs / 1000);
      if (this.labels) connInterval.observe(this.labels, gapMs / 1000);
      if (this.lastGapMs !== null) {
        const j = Math.abs(gapMs - this.lastGapMs) / 1000;
        jitter.observe(j);
        if (this.labels) connJitter.observe(this.labels, j);
      }
      this.lastGapMs = gapMs;
    }
    this.lastArrivalMs = nowMs;
  }

  /** A request's answer was written. */
  answered(t: PolicyRequestTiming): void {
    requests.inc();
    const stages: [string, number][] = [['decode', t.decodeMs], ['queue_wait', t.queueMs], ['compute', t.computeMs], ['send', t.sendMs], ['total', t.totalMs]];
    for (const [stage, ms] of stages) {
      const s = Math.max(0, ms) / 1000;
      stageSeconds.observe({ stage }, s);
      if (this.labels) connStageSeconds.observe({ ...this.labels, stage }, s);
    }
    if (this.labels) connBatchSize.observe(this.labels, t.batchSize);
  }

  /** The connection ends with an error frame. */
  failed(): void {
    errors.inc();
  }

  /** The socket closed: its series go away. Idempotent. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    connections.dec();
    this.unlabel();
  }

  /** Its own series go away (closed, or its policy released); later requests count overall only. */
  unlabel(): void {
    const labels = this.ownLabels;
    if (!labels) return;
    this.ownLabels = null;
    labelled--;
    labelledConnections.delete(this);
    for (const stage of ['decode', 'queue_wait', 'compute', 'send', 'total']) connStageSeconds.remove({ ...labels, stage });
    connInterval.remove(labels);
    connJitter.remove(labels);
    connBatchSize.remove(labels);
  }
}

/** One batch of `size` requests left the policy batcher for the engine. */
export function recordPolicyBatch(size: number): void {
  batchSize.observe(size);
}

const outOfRange = new client.Counter({
  name: 'vela_policy_observations_out_of_range_total',
  help: 'policy observations whose state was far outside the norm stats served with (|z| > 6, or outside [-3, 3] quantile-normalised), by policy while it is loaded; each such observation counts',
  labelNames: ['policy'], registers: [registry],
});

/** An observation of `policy` had a state far outside its norm stats (kernels/norm-range.ts). */
export function recordObservationOutOfRange(policy: string): void {
  outOfRange.inc({ policy });
}

/** Holds of each policy id: its series live while one is held. */
const held = new Map<string, number>();

/**
 * A policy server with id `policy` exists (server/policy/service.ts createPolicyServer): series
 * labelled `policy="<id>"` belong to `owner` (an API key's id; null: the operator's only, as on
 * `vela policy`, whose one key is the operator's). Returns the release, called when the policy
 * is unloaded or closed (idempotent): at the last release of the id its out-of-range counter
 * and every open connection's own series go (those connections count in the overall series
 * from then on) and its owner is forgotten. Holds are counted because a replaced policy (a live
 * policy whose cameras changed) is disposed after its successor with the same id was made.
 */
export function holdPolicySeries(policy: string, owner: string | null): () => void {
  held.set(policy, (held.get(policy) ?? 0) + 1);
  if (owner !== null) setSeriesOwner('policy', policy, owner);
  let released = false;
  return () => {
    if (released) return;
    released = true;
    const n = held.get(policy)! - 1;
    if (n > 0) {
      held.set(policy, n);
      return;
    }
    held.delete(policy);
    clearSeriesOwner('policy', policy);
    outOfRange.remove({ policy });
    for (const c of [...labelledConnections]) if (c.labels?.policy === policy) c.unlabel();
  };
}
