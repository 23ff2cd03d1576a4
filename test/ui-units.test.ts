/**
 * Dashboard helpers that need no browser (issue 14): the loss axis's ticks and the 24-hour
 * clock. The browser-side behaviour (legend, config, labels) is in ui-e2e.test.ts.
 */
import { describe, expect, it } from 'vitest';
import { clock, dateTime, yTicks } from '../ui/src/format.ts';

describe('yTicks', () => {
  it('puts at least four round ticks in the range of a falling loss', () => {
    expect(yTicks(0.42, 1.9)).toEqual([0.6, 0.8, 1, 1.2, 1.4, 1.6, 1.8]);
    expect(yTicks(0.5, 9.6)).toEqual([2, 4, 6, 8]);
    expect(yTicks(0.61, 0.66)).toEqual([0.61, 0.62, 0.63, 0.64, 0.65, 0.66]);
    expect(yTicks(1e-4, 3e-4)).toEqual([0.0001, 0.00015, 0.0002, 0.00025, 0.0003]);
    for (const [lo, hi] of [[0.013, 7.9], [3, 1000], [-2.5, 0.1]]) {
      const t = yTicks(lo!, hi!);
      expect(t.length, `${lo}..${hi}`).toBeGreaterThanOrEqual(4);
      expect(t.length, `${lo}..${hi}`).toBeLessThanOrEqual(11);
      expect(t.every((v) => v >= lo! && v <= hi!)).toBe(true);
    }
    expect(yTicks(2, 2)).toEqual([2]);
  });
});

describe('clock', () => {
  it('is 24-hour, zero-padded, like dateTime', () => {
    const evening = new Date(2026, 10, 30, 19, 45, 3);
    expect(clock(evening)).toBe('19:45:03');
    expect(clock(new Date(2026, 0, 1, 7, 5, 0))).toBe('07:05:00');
    expect(dateTime(evening.getTime() / 1000)).toBe('2026-11-30 19:45:03');
  });
});
