/**
 * A robot's action queue for real-time chunking (RTC, PROTOCOL.md section 6): pure logic, no
 * clock and no I/O. The robot pops one action per control tick from the chunk it executes; once
 * `executeHorizon` actions of that chunk lie in the past, the queue says to request the next
 * one, and the caller captures an observation (`capture()`), sends it with
 * `rtc/executed = capture.executed`, and keeps popping the old chunk while the server works.
 * The answer's index 0 is the action that was due at the capture, so `push` continues it at
 * index k, k = the actions executed since the capture (the true delay, in control ticks).
 *
 * When the old chunk runs out before the answer arrives, `pop` returns null (an underrun: the
 * robot holds its last command) and those ticks are not counted in k: the robot did not move, so
 * it continues from the new chunk's action that follows the old chunk's last one.
 *
 *   const q = new ActionQueue({ actionDim: 26, executeHorizon: 8 });
 *   // each tick:
 *   if (q.needsRequest()) { const c = q.capture(); send(obs, c).then((a) => q.push(a, c)); }
 *   const action = q.pop(); // Float32Array [action_dim], or null
 */

/** Where the robot stood when an observation was captured; `push` needs it back with the answer. */
export interface Capture {
  /** Index in the current chunk of the action due at capture (`rtc/executed`); null: no chunk yet. */
  readonly executed: number | null;
  /** `ActionQueue.executedTotal` at capture: actions the robot had executed, all chunks together. */
  readonly executedTotal: number;
}

/** What `push` did with an answer. */
export interface Splice {
  /** The capture's `executed` (null for the first chunk). */
  executed: number | null;
  /** k: actions executed between the capture and the answer; the new chunk continues at row k. */
  skipped: number;
  /** Rows of the new chunk left to execute (its horizon - k; 0 or less: an underrun follows). */
  rowsLeft: number;
}

export interface ActionQueueOptions {
  /** Values per action (the answer's `action_dim`). */
  actionDim: number;
  /** s: request the next chunk once this many actions of the current one lie in the past (>= 1). */
  executeHorizon: number;
}

export class ActionQueue {
  readonly actionDim: number;
  readonly executeHorizon: number;
  /** Actions popped so far, all chunks together. */
  executedTotal = 0;
  /** Pops that found no action (no chunk yet, or the chunk ran out before the answer). */
  underruns = 0;
  private chunk: Float32Array | null = null; // [rows * actionDim]
  private rows = 0;
  private nextRow = 0; // index in `chunk` of the action due now
  private pending: Capture | null = null;

  /** @throws RangeError when actionDim or executeHorizon is not an integer >= 1. */
  constructor(opts: ActionQueueOptions) {
    for (const [name, v] of [['actionDim', opts.actionDim], ['executeHorizon', opts.executeHorizon]] as const) {
      if (!Number.isInteger(v) || v < 1) throw new RangeError(`ActionQueue: ${name} must be an integer >= 1; got ${v}`);
    }
    this.actionDim = opts.actionDim;
    this.executeHorizon = opts.executeHorizon;
  }

  /** Index in the current chunk of the action due now (the next `pop`); 0 before the first chunk. */
  get index(): number {
    return this.nextRow;
  }

  /** Rows of the current chunk (its action horizon); 0 before the first chunk. */
  get horizon(): number {
    return this.rows;
  }

  /** Whether a request is out (captured, not yet pushed). */
  get waiting(): boolean {
    return this.pending !== null;
  }

  /** True when no request is out and there is no chunk, or `executeHorizon` of its actions have run. */
  needsRequest(): boolean {
    return this.pending === null && (this.chunk === null || this.nextRow >= this.executeHorizon);
  }

  /**
   * Marks the moment an observation is captured for the next request; send `executed` as
   * `rtc/executed` (leave the key out when it is null: there is no previous answer).
   * @throws Error when a request is already out (one at a time: the server's previous answer
   *   must be the chunk the robot executes).
   */
  capture(): Capture {
    if (this.pending) throw new Error(`ActionQueue.capture: a request captured at action ${this.pending.executed} is still out`);
    this.pending = { executed: this.chunk === null ? null : this.nextRow, executedTotal: this.executedTotal };
    return this.pending;
  }

  /**
   * Splices in the answer to `capture`: the rest of the old chunk is dropped and the robot
   * continues at row k of `actions`, k = actions popped since the capture.
   * @param actions float32 [horizon * actionDim], row-major, robot units; index 0 = the action due
   *   at the capture. Kept by reference (not copied).
   * @throws Error when `capture` is not the request out, or `actions` is empty or not whole rows.
   */
  push(actions: Float32Array, capture: Capture): Splice {
    if (capture !== this.pending) throw new Error('ActionQueue.push: this answer is not for the request out (capture it with capture(), push each answer once)');
    if (actions.length === 0 || actions.length % this.actionDim !== 0) {
      throw new Error(`ActionQueue.push: ${actions.length} values are not whole actions of ${this.actionDim}`);
    }
    this.pending = null;
    const skipped = this.executedTotal - capture.executedTotal;
    this.chunk = actions;
    this.rows = actions.length / this.actionDim;
    this.nextRow = skipped;
    return { executed: capture.executed, skipped, rowsLeft: this.rows - skipped };
  }

  /**
   * The action due now, [actionDim] (a view into the chunk), and moves on one tick; null when
   * there is none (counted in `underruns`; the robot holds and the tick is not an executed action).
   */
  pop(): Float32Array | null {
    if (this.chunk === null || this.nextRow >= this.rows) {
      this.underruns++;
      return null;
    }
    const row = this.chunk.subarray(this.nextRow * this.actionDim, (this.nextRow + 1) * this.actionDim);
    this.nextRow++;
    this.executedTotal++;
    return row;
  }
}
