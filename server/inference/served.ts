/**
 * The policies the main server serves (a finished fine-tune's, a sampling session's, a training
 * session's live one), loaded on first use and kept warm: a policy with no open connection and
 * no request for `idleS` seconds (VELA_INFER_IDLE_S, default 60) is unloaded and its engine
 * memory freed; the next request loads it again and says so (`cold_start`, `load_seconds`), as
 * the sidecar's warm inference containers do. A policy that took pushed weights is pinned: an
 * unload would lose them.
 */
import { performance } from 'node:perf_hooks';
import { log } from '../log.ts';
import type { PolicyServer } from '../policy/index.ts';

interface Entry {
  policy: Promise<PolicyServer>;
  settled: PolicyServer | null;
  lastUsedMs: number;
  pinned: boolean;
  /** False once what it serves is gone (a closed session): dropped at the next sweep. */
  alive: () => boolean;
}

/** What a request learns about the policy it got. */
export interface Acquired {
  policy: PolicyServer;
  /** True when this request had to wait for the policy to load. */
  coldStart: boolean;
  /** Seconds this request waited for the load (0 when warm). */
  loadSeconds: number;
}

export class ServedPolicies {
  private entries = new Map<string, Entry>();
  private timer: NodeJS.Timeout;
  /** The last failed load's error per key, until a probe reports it (peek) or a load succeeds. */
  private failures = new Map<string, Error>();

  constructor(readonly idleS: number, private now: () => number = Date.now) {
    this.timer = setInterval(() => this.sweep(), Math.max(200, Math.min(10_000, idleS * 250))).unref();
  }

  /**
   * The policy under `key`, loaded by `load` when absent (a failed load is not kept).
   * @throws whatever `load` throws.
   */
  async acquire(key: string, load: () => Promise<PolicyServer>, alive: () => boolean = () => true): Promise<Acquired> {
    const e = this.entry(key, load, alive);
    if (e.settled) return { policy: e.settled, coldStart: false, loadSeconds: 0 };
    const t0 = performance.now();
    const policy = await e.policy;
    e.lastUsedMs = this.now();
    return { policy, coldStart: true, loadSeconds: (performance.now() - t0) / 1000 };
  }

  /**
   * The policy under `key` if it is loaded, else null with its load begun (a readiness probe:
   * GET .../policy/healthz, so that a robot's first request does not pay the load).
   * @throws the error of the previous load of `key` when that failed (a new one is begun).
   */
  peek(key: string, load: () => Promise<PolicyServer>, alive: () => boolean = () => true): PolicyServer | null {
    const failed = this.failures.get(key);
    this.failures.delete(key);
    const e = this.entry(key, load, alive);
    if (failed && !e.settled) throw failed;
    return e.settled;
  }

  /** The entry under `key`, its load begun when absent (or when what it served is gone); marked used now. */
  private entry(key: string, load: () => Promise<PolicyServer>, alive: () => boolean): Entry {
    let e = this.entries.get(key);
    if (e && e.settled && !e.alive()) {
      this.drop(key, e);
      e = undefined;
    }
    if (!e) {
      const t0 = performance.now();
      const entry: Entry = { policy: load(), settled: null, lastUsedMs: this.now(), pinned: false, alive };
      entry.policy.then(
        (p) => {
          entry.settled = p;
          this.failures.delete(key);
          log.info(`policy ${key}: loaded in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
        },
        (err: Error) => {
          if (this.entries.get(key) === entry) this.entries.delete(key);
          this.failures.set(key, err);
        },
      );
      this.entries.set(key, (e = entry));
    }
    e.lastUsedMs = this.now();
    return e;
  }

  /** Keep `key` loaded for good (it holds pushed weights). */
  pin(key: string): void {
    const e = this.entries.get(key);
    if (e) e.pinned = true;
  }

  /** Whether `key` is loaded (or loading). */
  has(key: string): boolean {
    return this.entries.has(key);
  }

  /** Unload what is idle past `idleS`, has no connection and nothing in flight, or whose source is gone. */
  sweep(): void {
    const limitMs = this.idleS * 1000;
    for (const [key, e] of this.entries) {
      const p = e.settled;
      if (!p) continue;
      const s = p.stats();
      if (!e.alive()) {
        this.drop(key, e);
        continue;
      }
      if (p.counters.connections > 0 || s.queued > 0 || s.running > 0) {
        e.lastUsedMs = this.now(); // idle time counts from the last connection's end
        continue;
      }
      if (!e.pinned && this.now() - e.lastUsedMs > limitMs) {
        log.info(`policy ${key}: idle for ${this.idleS} s, unloaded`);
        this.drop(key, e);
      }
    }
  }

  private drop(key: string, e: Entry): void {
    if (this.entries.get(key) === e) this.entries.delete(key);
    void e.settled?.dispose().catch((err) => log.warn(`unloading policy ${key}: ${(err as Error).message}`));
  }

  /** Stop the sweep and free every policy. */
  async close(): Promise<void> {
    clearInterval(this.timer);
    const all = [...this.entries.values()];
    this.entries.clear();
    for (const e of all) await e.policy.then((p) => p.dispose()).catch(() => undefined);
  }
}
