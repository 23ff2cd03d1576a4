/**
 * The futures of the `/api/v1` API (PROTOCOL.md section 7): one entry per accepted request,
 * pending until its op settles, then kept for `ttlS` seconds so that a client that lost an
 * answer can fetch it again, then dropped. A dropped id leaves a small tombstone so that
 * `retrieve_future` can tell "expired" (410) from "never existed" (404); tombstones are capped
 * in number, so memory stays bounded however many requests come.
 */
import { randomId } from '../store/store.ts';

/** A settled future: the op's wire result, or an error with Tinker's category. */
export type Outcome = { result: unknown } | { error: string; category: 'user' | 'server'; code?: string };

export interface Future {
  id: string; // "req-..."
  owner: string;
  modelId: string;
  op: string;
  /** The request's seq_id, when it had one. */
  seqId: bigint | null;
  createdMs: number;
  /** Where it is: "held" (a seq_id gap before it), "queued" (handed to the engine chain), "done". */
  stage: string;
  outcome: Outcome | null;
  settledMs: number | null;
  /** Bytes of typed-array data in the outcome (what dominates its memory). */
  bytes: number;
}

/** Bytes of typed-array data in a result tree (NDArray data, frames), walked to a bounded depth. */
function dataBytes(v: unknown, depth = 0): number {
  if (depth > 16 || v === null || typeof v !== 'object') return 0;
  if (ArrayBuffer.isView(v)) return v.byteLength;
  let n = 0;
  for (const x of Array.isArray(v) ? v : Object.values(v)) n += dataBytes(x, depth + 1);
  return n;
}

export interface FutureStoreOptions {
  /** Seconds a settled future is kept (config.futureTtlS). */
  ttlS: number;
  /** Settled futures kept at most; past it the oldest expire early (default 10,000). */
  maxSettled?: number;
  /** Bytes of array data in settled results kept at most (default 512 MiB); past it the oldest expire early. */
  maxSettledBytes?: number;
  /** Tombstones of expired ids kept at most (default 100,000; about 60 bytes each). */
  maxTombstones?: number;
  /** Clock in ms (tests). */
  now?: () => number;
  /** Prefix of request ids (default `req-`; a cluster node's names the node: futures/cluster.ts). */
  idPrefix?: string;
}

export class FutureStore {
  private futures = new Map<string, Future>();
  private waiters = new Map<string, Set<() => void>>();
  private settledOrder: string[] = []; // settle order; TTL expiry walks it from the front
  private settledHead = 0;
  private settledBytes = 0;
  private pendingByModel = new Map<string, number>();
  private tombstones = new Map<string, string>(); // id -> owner, insertion ordered
  private timer: NodeJS.Timeout;
  readonly now: () => number;

  constructor(private opts: FutureStoreOptions) {
    this.now = opts.now ?? Date.now;
    this.timer = setInterval(() => this.sweep(), Math.max(50, Math.min(60_000, opts.ttlS * 250))).unref();
  }

  /** Register a pending future and return it. */
  create(owner: string, modelId: string, op: string, seqId: bigint | null = null, stage = 'queued'): Future {
    const f: Future = { id: randomId(this.opts.idPrefix ?? 'req-'), owner, modelId, op, seqId, createdMs: this.now(), stage, outcome: null, settledMs: null, bytes: 0 };
    this.futures.set(f.id, f);
    this.pendingByModel.set(modelId, (this.pendingByModel.get(modelId) ?? 0) + 1);
    return f;
  }

  /** Settle a future once (later calls are ignored) and wake its long polls. */
  settle(f: Future, outcome: Outcome): void {
    if (f.outcome) return;
    f.outcome = outcome;
    const left = (this.pendingByModel.get(f.modelId) ?? 1) - 1;
    if (left > 0) this.pendingByModel.set(f.modelId, left);
    else this.pendingByModel.delete(f.modelId);
    f.settledMs = this.now();
    f.stage = 'done';
    f.bytes = 'result' in outcome ? dataBytes(outcome.result) : 0;
    this.settledBytes += f.bytes;
    this.settledOrder.push(f.id);
    const w = this.waiters.get(f.id);
    this.waiters.delete(f.id);
    for (const wake of w ?? []) wake();
    this.sweep();
  }

  /**
   * Look a future up for `owner`.
   * @returns the future, `'expired'` for an id dropped after its TTL, or null (unknown, or another
   *   owner's: both read as 404, so ids of other owners cannot be probed).
   */
  get(id: string, owner: string): Future | 'expired' | null {
    this.sweep();
    const f = this.futures.get(id);
    if (f) return f.owner === owner ? f : null;
    return this.tombstones.get(id) === owner ? 'expired' : null;
  }

  /** Resolve when `f` settles or after `waitMs`, whichever comes first; true when settled. */
  wait(f: Future, waitMs: number): Promise<boolean> {
    if (f.outcome) return Promise.resolve(true);
    return new Promise((resolve) => {
      let set = this.waiters.get(f.id);
      if (!set) this.waiters.set(f.id, (set = new Set()));
      const wake = () => {
        clearTimeout(timer);
        resolve(true);
      };
      const timer = setTimeout(() => {
        set!.delete(wake);
        if (set!.size === 0 && this.waiters.get(f.id) === set) this.waiters.delete(f.id);
        resolve(f.outcome !== null);
      }, waitMs);
      set.add(wake);
    });
  }

  /** Futures of a model not yet settled (session_info, and the per-model limit). */
  pendingCount(modelId: string): number {
    return this.pendingByModel.get(modelId) ?? 0;
  }

  /** Entries held (pending + settled) and tombstones: the memory bound tests look at. */
  sizes(): { futures: number; tombstones: number; bytes: number } {
    return { futures: this.futures.size, tombstones: this.tombstones.size, bytes: this.settledBytes };
  }

  /** Drop settled futures past their TTL (and the oldest past `maxSettled` / `maxSettledBytes`), leaving tombstones. */
  sweep(): void {
    const ttlMs = this.opts.ttlS * 1000;
    const maxSettled = this.opts.maxSettled ?? 10_000;
    const maxBytes = this.opts.maxSettledBytes ?? 512 * 1024 * 1024;
    const now = this.now();
    while (this.settledHead < this.settledOrder.length) {
      const id = this.settledOrder[this.settledHead]!;
      const f = this.futures.get(id);
      const live = this.settledOrder.length - this.settledHead;
      if (f && now - f.settledMs! < ttlMs && live <= maxSettled && this.settledBytes <= maxBytes) break;
      this.settledHead++;
      if (f) this.expire(f);
    }
    if (this.settledHead > 1024 && this.settledHead * 2 > this.settledOrder.length) {
      this.settledOrder = this.settledOrder.slice(this.settledHead);
      this.settledHead = 0;
    }
  }

  private expire(f: Future): void {
    this.futures.delete(f.id);
    this.settledBytes -= f.bytes;
    this.tombstones.set(f.id, f.owner);
    const max = this.opts.maxTombstones ?? 100_000;
    if (this.tombstones.size > max) this.tombstones.delete(this.tombstones.keys().next().value!);
  }

  close(): void {
    clearInterval(this.timer);
  }
}
