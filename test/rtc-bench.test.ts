/**
 * The RTC replay's arithmetic (bench/rtc-math.ts) on hand-made chunks: when the robot switches
 * chunks under a delay, ACT's temporal ensembling, and the splice metrics. The replay itself runs
 * in `npx tsx bench/rtc.ts` (it needs the G1 dataset beside the clone and trained policies), not here:
 * this file needs nothing outside the repository.
 */
import { describe, expect, it } from 'vitest';
import { closedLoopState, ensembleWeights, executeEnsembling, executeSwitching, meanStepChange, mse, stepJumps } from '../bench/rtc-math.ts';
import { tracesSvg } from '../bench/svg.ts';

// Horizon 4, one action dim: chunk c holds 10c + i at row i (chunk c observed at step 2c).
const CHUNKS = [0, 1, 2].map((c) => Float32Array.from([0, 1, 2, 3], (i) => 10 * c + i));

describe('executeSwitching', () => {
  it('runs the old chunk until the new one arrives d steps after its observation, then the new one from row d', () => {
    // s = 2, d = 1: chunk 1 (observed at step 2) arrives at step 3 and runs from its row 1.
    const x = executeSwitching(CHUNKS, 2, 1, 4, 1, 6);
    expect(Array.from(x.actions)).toEqual([0, 1, 2, 11, 12, 21]);
    expect(x.splices).toEqual([3, 5]);
    expect(stepJumps(x.actions, 1, x.splices)).toEqual([9, 9]);
  });

  it('with d = 0 switches at the observation step, from row 0', () => {
    const x = executeSwitching(CHUNKS, 2, 0, 4, 1, 6);
    expect(Array.from(x.actions)).toEqual([0, 1, 10, 11, 20, 21]);
    expect(x.splices).toEqual([2, 4]);
  });

  it('executes the steps before chunk c * s from chunks 0..c-1 alone (what the closed-state loop reads before asking for chunk c)', () => {
    const full = executeSwitching(CHUNKS, 2, 1, 4, 1, 6).actions;
    expect(Array.from(executeSwitching(CHUNKS.slice(0, 2), 2, 1, 4, 1, 4).actions)).toEqual(Array.from(full.subarray(0, 4)));
    expect(Array.from(executeEnsembling(CHUNKS.slice(0, 2), 2, 1, 4, 1, 4, 0).actions)).toEqual([0, 1, 2, 7]);
  });

  it('refuses a delay the old chunk does not cover, and too few chunks', () => {
    expect(() => executeSwitching(CHUNKS, 3, 2, 4, 1, 6)).toThrow(/exceeds the horizon 4/);
    expect(() => executeSwitching(CHUNKS, 2, 1, 4, 1, 7)).toThrow(/3 chunks cover 6 steps; the episode has 7/);
  });
});

describe('executeEnsembling', () => {
  it('averages every arrived chunk that covers the step, oldest first', () => {
    // m = 0: equal weights. Step 3: chunks 0 (row 3) and 1 (row 1) -> (3 + 11) / 2; step 4:
    // chunk 0 ran out, chunk 1 alone; step 5: chunks 1 (row 3) and 2 (row 1) -> (13 + 21) / 2.
    const x = executeEnsembling(CHUNKS, 2, 1, 4, 1, 6, 0);
    expect(Array.from(x.actions)).toEqual([0, 1, 2, 7, 12, 17]);
    expect(x.splices).toEqual([3, 4, 5]);
  });

  it("weighs by ACT's exp(-m j), oldest first", () => {
    const w = ensembleWeights(2, Math.LN2);
    expect(w[0]).toBeCloseTo(2 / 3, 12);
    expect(w[1]).toBeCloseTo(1 / 3, 12);
    // Step 3 with m = ln 2: 2/3 * 3 + 1/3 * 11 = 17/3.
    expect(executeEnsembling(CHUNKS, 2, 1, 4, 1, 6, Math.LN2).actions[3]).toBeCloseTo(17 / 3, 5);
  });

  it('is switching at once when the delay reaches the end of the overlap (d = horizon - s)', () => {
    expect(Array.from(executeEnsembling(CHUNKS, 2, 2, 4, 1, 6, 0.01).actions)).toEqual(Array.from(executeSwitching(CHUNKS, 2, 2, 4, 1, 6).actions));
  });
});

describe('closedLoopState', () => {
  it('moves each commanded state dim by the executed-minus-recorded action of the step before', () => {
    // State (3 dims) at T: [0.5, -1, 2]; action dims 0 and 1 command state dims 2 and 0.
    // Executed [0.3, 0.1] against recorded [0.25, 0.4]: state 2 += 0.05, state 0 -= 0.3; state 1 as recorded.
    const s = closedLoopState(Float32Array.from([0.5, -1, 2]), Float32Array.from([0.3, 0.1]), Float32Array.from([0.25, 0.4]), [[0, 2], [1, 0]]);
    expect(s[0]).toBeCloseTo(0.2, 6);
    expect(s[1]).toBe(-1);
    expect(s[2]).toBeCloseTo(2.05, 6);
  });

  it('is the recorded state when the robot executed the recorded action', () => {
    const rec = Float32Array.from([0.5, -1, 2]);
    const a = Float32Array.from([0.3, 0.1]);
    expect(Array.from(closedLoopState(rec, a, a, [[0, 2], [1, 0]]))).toEqual(Array.from(rec));
  });

  it('refuses actions of different lengths and pairs outside the arrays', () => {
    expect(() => closedLoopState(Float32Array.of(0), Float32Array.of(0, 1), Float32Array.of(0), [])).toThrow(/2 dims, the recorded one 1/);
    expect(() => closedLoopState(Float32Array.of(0), Float32Array.of(0), Float32Array.of(0), [[0, 1]])).toThrow(/pair \[0, 1\] is outside/);
  });
});

describe('splice metrics', () => {
  it('measures L2 step changes over every action dim', () => {
    // Two dims: (0, 0) -> (3, 4) is 5; (3, 4) -> (3, 4) is 0.
    const a = Float32Array.from([0, 0, 3, 4, 3, 4]);
    expect(stepJumps(a, 2, [1, 2])).toEqual([5, 0]);
    expect(meanStepChange([a], 2)).toBe(2.5);
    // Pooled over sequences: steps 3, 0, 3 -> 2.
    expect(meanStepChange([Float32Array.from([0, 3]), Float32Array.from([1, 1, 4])], 1)).toBe(2);
    expect(() => stepJumps(a, 2, [0])).toThrow(/no previous step/);
  });

  it('MSE of two arrays', () => {
    expect(mse(Float32Array.from([1, 2, 3]), Float32Array.from([1, 0, 6]))).toBeCloseTo(13 / 3, 12);
    expect(() => mse(Float32Array.from([1]), Float32Array.from([1, 2]))).toThrow(/lengths differ/);
  });
});

describe('tracesSvg', () => {
  it('draws one polyline per series and panel, the marks and a legend', () => {
    const svg = tracesSvg('t <1>', [{ label: 'joint', series: [{ label: 'recorded', values: [0, 1, 2] }, { label: 'switch', values: [0, 2, 2] }] }], [1], 'rad');
    expect(svg.match(/<polyline/g)).toHaveLength(2);
    expect(svg).toContain('t &lt;1&gt;');
    expect(svg).toContain('points="90,230 535,60 980,60"'); // switch: x over 0..2 steps, y over the panel's 0..2 range
    expect(svg).toContain('>recorded</text>');
  });
});
