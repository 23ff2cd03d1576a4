/**
 * The quickstart's time for 300 steps is today's (issue 35, item 11c): the README's "About N
 * minutes on 2 CPU cores" is the minutes bench/quickstart-time.ts measured and recorded in
 * bench/results/quickstart-time.json, on 2 cores; and that script's extrapolation is the
 * arithmetic its comment says (checked on made-up events, exactly).
 */
import fs from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { extrapolate } from '../bench/quickstart-time.ts';

const REPO = path.resolve(import.meta.dirname, '..');
const README = fs.readFileSync(path.join(REPO, 'README.md'), 'utf8');

describe('the quickstart time', () => {
  it('the README quotes the recorded measurement, with the machine', () => {
    const rec = JSON.parse(fs.readFileSync(path.join(REPO, 'bench/results/quickstart-time.json'), 'utf8'));
    const quick = README.slice(README.indexOf('## Quickstart'), README.indexOf('## Python clients'));
    const m = /About (\d+) minutes on (\d+) CPU cores \(([^)]*)\)/.exec(quick);
    expect(m, 'the quickstart says "About N minutes on K CPU cores (...)"').not.toBeNull();
    expect(Number(m![1])).toBe(rec.estimate_300_steps_minutes);
    expect(Number(m![2])).toBe(rec.machine.cores);
    expect(rec.machine.cores).toBe(2);
    // It says how: timed at fewer steps and extrapolated, as the record's method does.
    expect(m![3]).toContain(`${rec.steps_timed} steps`);
    expect(m![3]).toContain('extrapolated');
    expect(rec.method).toContain('extrapolated');
  });

  it('extrapolates: wall time + (300 - N) plain steps; evaluation steps are not plain', () => {
    // 8 steps; evaluations after steps 2, 4, 6, 8. Plain gaps (steps 3, 5, 7) are 1, 2 and 3 s: mean 2.
    const ts = [0, 10, 11, 21, 23, 33, 36, 46];
    const events = [{ type: 'log', timestamp: -5 }, ...ts.map((t, i) => ({ type: 'progress', timestamp: t, step: i + 1 }))];
    const x = extrapolate(events, 60, 8);
    expect(x.plainStepS).toBe(2);
    expect(x.evalExtraS).toEqual([8, 8, 8, 8]);
    expect(x.estimateS).toBe(60 + 292 * 2);
  });
});
