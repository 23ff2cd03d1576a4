/**
 * ActionQueue (protocol/action-queue.ts), the client side of real-time chunking, as pure logic
 * with exact values: when it asks for the next chunk, the `rtc/executed` it captures, where it
 * splices the answer in (k = actions executed since the capture), and what an answer later than
 * the old chunk lasts does (underruns, not counted in k).
 */
import { describe, expect, it } from 'vitest';
import { ActionQueue } from '../protocol/client.ts';

const AD = 2;

/** A chunk of `rows` actions whose action i is [base + i, -(base + i)]. */
function chunk(base: number, rows: number): Float32Array {
  const out = new Float32Array(rows * AD);
  for (let i = 0; i < rows; i++) out.set([base + i, -(base + i)], i * AD);
  return out;
}

/** Pops `n` times; each action as its first value, null for an underrun. */
function pops(q: ActionQueue, n: number): (number | null)[] {
  return Array.from({ length: n }, () => q.pop()?.[0] ?? null);
}

describe('ActionQueue', () => {
  it('first chunk: no rtc/executed, the robot holds until it arrives, then starts at row 0', () => {
    const q = new ActionQueue({ actionDim: AD, executeHorizon: 4 });
    expect(q.needsRequest()).toBe(true);
    const c = q.capture();
    expect(c).toEqual({ executed: null, executedTotal: 0 });
    expect(q.needsRequest()).toBe(false); // one request out at a time
    expect(pops(q, 3)).toEqual([null, null, null]);
    expect(q.push(chunk(100, 10), c)).toEqual({ executed: null, skipped: 0, rowsLeft: 10 });
    expect(q.pop()).toEqual(Float32Array.of(100, -100));
    expect({ executed: q.executedTotal, underruns: q.underruns, index: q.index, horizon: q.horizon }).toEqual({ executed: 1, underruns: 3, index: 1, horizon: 10 });
  });

  it('asks after executeHorizon actions, captures the index due, and splices at k = actions run since', () => {
    const q = new ActionQueue({ actionDim: AD, executeHorizon: 4 });
    q.push(chunk(100, 10), q.capture());
    const seen: (number | null)[] = [];
    for (let t = 0; t < 4; t++) {
      expect(q.needsRequest()).toBe(false);
      seen.push(q.pop()![0]!);
    }
    expect(q.needsRequest()).toBe(true);
    const c = q.capture();
    expect(c).toEqual({ executed: 4, executedTotal: 4 });
    seen.push(...pops(q, 3)); // the old chunk goes on while the server works: rows 4, 5, 6
    const s = q.push(chunk(200, 10), c);
    expect(s).toEqual({ executed: 4, skipped: 3, rowsLeft: 7 });
    seen.push(...pops(q, 2)); // new rows 3, 4: row 0 was due at the capture
    expect(seen).toEqual([100, 101, 102, 103, 104, 105, 106, 203, 204]);
    expect(q.index).toBe(5);
    // Next request once row 4 of the new chunk has run: rtc/executed counts the skipped rows too.
    expect(q.needsRequest()).toBe(true);
    expect(q.capture()).toEqual({ executed: 5, executedTotal: 9 });
    expect(q.underruns).toBe(0);
  });

  it('an answer before the next tick (k = 0) starts the robot at the new row 0', () => {
    const q = new ActionQueue({ actionDim: AD, executeHorizon: 2 });
    q.push(chunk(0, 4), q.capture());
    pops(q, 2);
    const c = q.capture();
    expect(q.push(chunk(50, 4), c)).toEqual({ executed: 2, skipped: 0, rowsLeft: 4 });
    expect(pops(q, 2)).toEqual([50, 51]);
  });

  it('an answer later than the old chunk lasts: underruns while the robot holds, and k stops at the old chunk\'s end', () => {
    const q = new ActionQueue({ actionDim: AD, executeHorizon: 4 });
    q.push(chunk(100, 10), q.capture());
    pops(q, 4);
    const c = q.capture();
    // Rows 4..9 of the old chunk, then 3 ticks with nothing to execute.
    expect(pops(q, 9)).toEqual([104, 105, 106, 107, 108, 109, null, null, null]);
    expect({ executed: q.executedTotal, underruns: q.underruns }).toEqual({ executed: 10, underruns: 3 });
    // k = 6 actions run since the capture (not 9 ticks): the robot stands where the old chunk
    // ended (its row 9 = new row 5), so it goes on with new row 6.
    expect(q.push(chunk(200, 10), c)).toEqual({ executed: 4, skipped: 6, rowsLeft: 4 });
    expect(q.needsRequest()).toBe(true); // row 6 >= executeHorizon: ask again at once
    expect(pops(q, 5)).toEqual([206, 207, 208, 209, null]);
    expect(q.underruns).toBe(4);
  });

  it('a chunk shorter than k: every row is past, pops underrun until the next answer', () => {
    const q = new ActionQueue({ actionDim: AD, executeHorizon: 1 });
    q.push(chunk(0, 3), q.capture());
    pops(q, 1);
    const c = q.capture();
    pops(q, 2);
    expect(q.push(chunk(10, 2), c)).toEqual({ executed: 1, skipped: 2, rowsLeft: 0 });
    expect(pops(q, 1)).toEqual([null]);
  });

  it('refuses a second capture, an answer that is not for the request out, and rows that are not whole', () => {
    expect(() => new ActionQueue({ actionDim: 0, executeHorizon: 4 })).toThrow('ActionQueue: actionDim must be an integer >= 1; got 0');
    expect(() => new ActionQueue({ actionDim: 2, executeHorizon: 1.5 })).toThrow('ActionQueue: executeHorizon must be an integer >= 1; got 1.5');
    const q = new ActionQueue({ actionDim: AD, executeHorizon: 4 });
    const c = q.capture();
    expect(() => q.capture()).toThrow('ActionQueue.capture: a request captured at action null is still out');
    expect(() => q.push(new Float32Array(5), c)).toThrow('ActionQueue.push: 5 values are not whole actions of 2');
    expect(() => q.push(chunk(0, 4), { executed: null, executedTotal: 0 })).toThrow(/not for the request out/);
    q.push(chunk(0, 4), c);
    expect(() => q.push(chunk(0, 4), c)).toThrow(/not for the request out/); // pushed once already
  });
});
