/**
 * `seq_id` ordering of the futures API (PROTOCOL.md section 7), per model:
 * - The first `seq_id` a model sees starts its sequence; after that a request runs only once
 *   every smaller `seq_id` has been handed to the engine, so requests run in `seq_id` order
 *   whatever order the HTTP requests arrived in.
 * - A request past a gap is held. If the gap is not filled within `gapWaitS` seconds, every held
 *   request of that model fails (category "user", naming the missing ids) and the sequence
 *   continues after the largest held id: running them would apply a batch or an optimizer step
 *   out of the order the client meant.
 * - A repeated `seq_id` with byte-identical body is an idempotent retry and gets the same
 *   `request_id`; with another body it is a 409. A `seq_id` below the sequence that this
 *   server never accepted (its gap timed out) is a 409 too.
 * - Requests without `seq_id` are run in arrival order, not held.
 * What is remembered per `seq_id` (a body hash and a request id) is kept for `ttlS` seconds.
 * seq_ids are compared exactly (as bigints), so ids past 2^53 that differ by one stay different.
 */
import { HttpError } from '../http/http.ts';

interface Seen {
  hash: string;
  requestId: string;
  atMs: number;
}

interface Held {
  start: () => void;
  fail: (message: string) => void;
}

class ModelSeq {
  next: bigint | null = null;
  held = new Map<bigint, Held>();
  seen = new Map<bigint, Seen>(); // insertion (arrival) ordered
  gapTimer: NodeJS.Timeout | null = null;
}

export interface SeqOptions {
  /** Seconds a request past a gap waits for the missing ones. */
  gapWaitS: number;
  /** Seconds a seq_id's body hash and request id are remembered. */
  ttlS: number;
  now?: () => number;
}

export class SeqOrder {
  private models = new Map<string, ModelSeq>();
  private now: () => number;
  constructor(private opts: SeqOptions) {
    this.now = opts.now ?? Date.now;
  }

  private model(id: string): ModelSeq {
    let m = this.models.get(id);
    if (!m) this.models.set(id, (m = new ModelSeq()));
    return m;
  }

  /**
   * The request id already given to this `seq_id` when `hash` matches, else null (a new one).
   * @throws HttpError 409 for a reused seq_id with another body, or one behind the sequence.
   */
  repeatOf(modelId: string, seqId: number | bigint, hash: string): string | null {
    const seq = BigInt(seqId);
    const m = this.model(modelId);
    this.prune(m);
    const seen = m.seen.get(seq);
    if (seen) {
      if (seen.hash === hash) return seen.requestId;
      throw new HttpError(409, `seq_id ${seq} of model ${modelId} was already used by request ${seen.requestId} with a different body; use a new seq_id`);
    }
    if (m.next !== null && seq < m.next) {
      throw new HttpError(409, `seq_id ${seq} of model ${modelId} is behind its sequence: the next expected seq_id is ${m.next}`);
    }
    return null;
  }

  /**
   * Admit a new request (after `repeatOf` returned null): `start` runs now when it is next in
   * line, or later when the gap before it fills; `fail` runs if the gap times out.
   * @returns true when started now, false when held.
   */
  enqueue(modelId: string, seqId: number | bigint, hash: string, requestId: string, start: () => void, fail: (message: string) => void): boolean {
    const seq = BigInt(seqId);
    const m = this.model(modelId);
    m.seen.set(seq, { hash, requestId, atMs: this.now() });
    if (m.next === null) m.next = seq;
    if (seq !== m.next) {
      m.held.set(seq, { start, fail });
      this.armGapTimer(modelId, m);
      return false;
    }
    start();
    m.next = seq + 1n;
    this.drain(modelId, m);
    return true;
  }

  /** The seq_ids missing before a held request, for `try_again` answers. */
  waitingFor(modelId: string, seqId: number | bigint): string {
    const seq = BigInt(seqId);
    const m = this.models.get(modelId);
    if (!m || m.next === null || seq <= m.next) return 'queued';
    return seq - m.next === 1n ? `waiting for seq_id ${m.next}` : `waiting for seq_ids ${m.next}..${seq - 1n}`;
  }

  /** Forget a model (killed or unloaded): held requests fail with `reason`. */
  forget(modelId: string, reason: string): void {
    const m = this.models.get(modelId);
    if (!m) return;
    this.models.delete(modelId);
    if (m.gapTimer) clearTimeout(m.gapTimer);
    for (const h of m.held.values()) h.fail(reason);
  }

  /** Models with sequence state (to forget those closed elsewhere). */
  modelIds(): string[] {
    return [...this.models.keys()];
  }

  close(): void {
    for (const id of [...this.models.keys()]) this.forget(id, 'the server is shutting down');
  }

  private drain(modelId: string, m: ModelSeq): void {
    for (let h = m.held.get(m.next!); h; h = m.held.get(m.next!)) {
      m.held.delete(m.next!);
      m.next!++;
      h.start();
    }
    if (m.gapTimer) clearTimeout(m.gapTimer);
    m.gapTimer = null;
    if (m.held.size > 0) this.armGapTimer(modelId, m);
  }

  private armGapTimer(modelId: string, m: ModelSeq): void {
    if (m.gapTimer) return;
    m.gapTimer = setTimeout(() => {
      m.gapTimer = null;
      const held = [...m.held.keys()].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
      if (held.length === 0) return;
      const missing = m.next === held[0]! - 1n ? `${m.next}` : `${m.next}..${held[0]! - 1n}`;
      const message = `seq_id ${held.join(', ')} of model ${modelId} waited ${this.opts.gapWaitS} s for seq_id ${missing}, which never came; requests run in seq_id order, so these were not run`;
      const hs = held.map((s) => m.held.get(s)!);
      m.held.clear();
      m.next = held[held.length - 1]! + 1n;
      for (const h of hs) h.fail(message);
    }, this.opts.gapWaitS * 1000);
    m.gapTimer.unref?.();
  }

  private prune(m: ModelSeq): void {
    const limit = this.now() - this.opts.ttlS * 1000;
    for (const [seq, s] of m.seen) {
      if (s.atMs >= limit) break;
      if (!m.held.has(seq)) m.seen.delete(seq);
    }
  }
}
