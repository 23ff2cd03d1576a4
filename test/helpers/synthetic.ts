/**
 * Test helper: small synthetic datums that need no dataset (the same values as
 * test/python/xorl_client_check.py's `datum`): one 24x32 RGB frame of camera cam_high (RAW), an
 * 8-dim state, a 16x8 action chunk.
 */
import { ndarray } from '../../protocol/ndarray.ts';
import type { Datum } from '../../protocol/client.ts';

/** Datum `k`: every value a fixed function of k. */
export function syntheticDatum(k: number): Datum {
  const image = new Uint8Array(24 * 32 * 3).map((_, i) => (i * 7 + k * 31) % 256);
  const state = Float32Array.from({ length: 8 }, (_, j) => (j + 1) * 0.1 * (k % 2 ? 1 : -1));
  const actions = Float32Array.from({ length: 16 * 8 }, (_, i) => ((i + k) % 11) / 10 - 0.5);
  return { observation: { image: { cam_high: ndarray(image, [24, 32, 3]) }, state: ndarray(state, [8]), prompt: 'pick up the bottle' }, actions: ndarray(actions, [16, 8]) };
}

/** Batch `step`: datums 2 * step and 2 * step + 1. */
export function syntheticBatch(step: number): Datum[] {
  return [syntheticDatum(2 * step), syntheticDatum(2 * step + 1)];
}
