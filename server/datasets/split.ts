/**
 * Seeded randomness and the train / held-out episode split. Everything here is deterministic for
 * a given seed so a fine-tune can be repeated exactly (MODEL.md: all randomness is seeded).
 */
import { DatasetError } from './errors.ts';

/** A generator of uniform numbers in [0, 1). */
export type Rng = () => number;

/** mulberry32: a small, fast 32-bit seeded generator (good enough for sampling, not crypto). */
export function seededRng(seed: number): Rng {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export interface SplitOptions {
  /** Share of episodes held out, in [0, 1). Default 0.1. */
  evalFraction?: number;
  seed?: number;
}

export interface EpisodeSplit {
  /** Both sorted ascending. */
  train: number[];
  heldOut: number[];
}

/**
 * Splits episodes into train and held-out: the sorted indices are shuffled with a seeded
 * Fisher-Yates, the first `max(1, round(n * evalFraction))` are held out (none when n < 2 or
 * evalFraction is 0, and never all). Same set and seed -> same split, whatever the input order.
 * Example: 15 episodes, evalFraction 0.1 -> 2 held out, 13 train.
 * @throws DatasetError `bad_argument` for an evalFraction outside [0, 1) or repeated indices.
 */
export function splitEpisodes(episodeIndices: readonly number[], opts: SplitOptions = {}): EpisodeSplit {
  const evalFraction = opts.evalFraction ?? 0.1;
  if (!(evalFraction >= 0 && evalFraction < 1)) throw new DatasetError('bad_argument', `evalFraction ${evalFraction} is not in [0, 1)`);
  const sorted = [...episodeIndices].sort((a, b) => a - b);
  if (new Set(sorted).size !== sorted.length) throw new DatasetError('bad_argument', 'episode indices repeat');
  const n = sorted.length;
  const nEval = n < 2 || evalFraction === 0 ? 0 : Math.min(n - 1, Math.max(1, Math.round(n * evalFraction)));
  const rng = seededRng(opts.seed ?? 0);
  const order = [...sorted];
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(rng() * (i + 1));
    [order[i], order[j]] = [order[j], order[i]];
  }
  return {
    train: order.slice(nEval).sort((a, b) => a - b),
    heldOut: order.slice(0, nEval).sort((a, b) => a - b),
  };
}
