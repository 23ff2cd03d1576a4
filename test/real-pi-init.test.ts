/**
 * The TS init rule of the real pi0 / pi0.5 parity vectors (test/helpers/real-pi-init.ts) gives the
 * values the Python reference wrote into the vectors' json (`init_check`, made by
 * scripts/real_pi/make_vectors.py): the first 8 and the last 4 values of a few parameters, and the
 * seeds. Both vector files are checked, so a json regenerated with another rule fails here.
 */
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { fnv1a32, mulberry32, realPiInitValues } from './helpers/real-pi-init.ts';

interface InitCheck { seed: number; n: number; first: number[]; last: number[] }
const load = (file: string) =>
  JSON.parse(readFileSync(new URL(`./vectors/real-pi/${file}`, import.meta.url), 'utf8')) as { init_check: Record<string, InitCheck> };

describe('real pi init rule', () => {
  it('FNV-1a 32 matches its published test vectors; mulberry32 draws lie in [0, 1)', () => {
    // FNV-1a 32 test vectors (draft-eastlake-fnv): "" -> offset basis, "a" -> 0xe40c292c, "foobar" -> 0xbf9cf968.
    expect(fnv1a32('')).toBe(2166136261);
    expect(fnv1a32('a')).toBe(0xe40c292c);
    expect(fnv1a32('foobar')).toBe(0xbf9cf968);
    // Non-ASCII goes through UTF-8: "é" is the two bytes c3 a9.
    expect(fnv1a32('é')).toBe(Math.imul((Math.imul(2166136261 ^ 0xc3, 16777619) >>> 0) ^ 0xa9, 16777619) >>> 0);
    const r = mulberry32(0);
    const first = [r(), r(), r()];
    for (const u of first) {
      expect(u).toBeGreaterThanOrEqual(0);
      expect(u).toBeLessThan(1);
    }
    expect(new Set(first).size).toBe(3);
  });

  for (const file of ['tiny_pi0.json', 'tiny_pi05.json']) {
    it(`equals the Python rule on the init_check of ${file}`, () => {
      const checks = Object.entries(load(file).init_check);
      expect(checks.length).toBeGreaterThanOrEqual(4);
      for (const [name, c] of checks) {
        expect(fnv1a32(name), name).toBe(c.seed);
        const v = realPiInitValues(name, c.n);
        expect(Array.from(v.subarray(0, 8)), name).toEqual(c.first);
        expect(Array.from(v.subarray(c.n - 4)), name).toEqual(c.last);
        for (const x of v.subarray(0, 1000)) expect(Math.abs(x)).toBeLessThanOrEqual(0.05);
      }
    });
  }

  it('refuses a bad element count', () => {
    expect(() => realPiInitValues('x', -1)).toThrow(/n is -1/);
    expect(() => realPiInitValues('x', 1.5)).toThrow(/n is 1.5/);
  });
});
