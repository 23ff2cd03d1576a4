/**
 * Delta-action norm stats over the action-chunk entries the model is trained on (issue 16, item
 * 1): action[t + k] - state[t] for k < horizon, padding excluded, equal to a direct numpy
 * computation (scripts/make_chunk_norm_vectors.py -> test/vectors/chunk_norm/chunk_norm.json).
 */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { computeNormStats } from '../kernels/normalize.ts';
import { chunkActionRows, gatherNormRows, openDataset } from '../server/datasets/index.ts';
import type { EpisodeTable } from '../server/datasets/index.ts';

const here = path.dirname(fileURLToPath(import.meta.url));
const V = JSON.parse(fs.readFileSync(path.join(here, 'vectors/chunk_norm/chunk_norm.json'), 'utf8'));

const tables: EpisodeTable[] = V.episodes.map((e: any, i: number) => ({
  episodeIndex: i, length: e.length, state: Float32Array.from(e.state), action: Float32Array.from(e.action),
  timestamp: new Float64Array(e.length), taskIndex: new Int32Array(e.length),
}));

function expectStats(got: ReturnType<typeof computeNormStats>, want: Record<string, number[]>) {
  for (const k of ['mean', 'std', 'q01', 'q99'] as const) {
    got[k].forEach((v, j) => expect(v, `${k}[${j}]`).toBeCloseTo(want[k]![j]!, 12));
  }
}

describe('delta-action norm stats over chunk entries', () => {
  it('equal numpy on the fixture: every valid (t, k < horizon) entry, padding excluded', () => {
    const rows = chunkActionRows(tables, V.horizon, V.action_dim, V.state_dim, V.pairs);
    expect(rows.length / V.action_dim).toBe(V.count); // 38 + 6 + 22: min(horizon, l - t) per frame
    expect(Array.from(rows.subarray(0, V.first_rows.length))).toEqual(V.first_rows);
    expectStats(computeNormStats({ data: rows, dim: V.action_dim }), V.stats);
  });

  it('horizon 1 is the per-frame statistic, which is narrower than the chunk one', () => {
    const rows = chunkActionRows(tables, 1, V.action_dim, V.state_dim, V.pairs);
    const perFrame = computeNormStats({ data: rows, dim: V.action_dim });
    expectStats(perFrame, V.per_frame_stats);
    for (let j = 0; j < 3; j++) expect(V.stats.std[j]).toBeGreaterThan(1.2 * perFrame.std[j]!); // the delta dims
  });

  it('refuses a horizon that is not a positive integer', () => {
    expect(() => chunkActionRows(tables, 0, V.action_dim, V.state_dim, V.pairs)).toThrow(/horizon 0 is not a positive integer/);
  });

  it('gatherNormRows uses the chunk entries of a real dataset (fixture lerobot_image, shared names a, b)', async () => {
    const ds = await openDataset(path.join(here, 'fixtures/lerobot_image'));
    const rows = gatherNormRows(ds, [0, 1], 'delta', 3);
    const direct = chunkActionRows([ds.table(0), ds.table(1)], 3, ds.meta.actionDim, ds.meta.stateDim, [[0, 0], [1, 1]]);
    expect(rows.count).toBe(7);
    expect(rows.action).toEqual(direct);
    const t0 = ds.table(0);
    // Row 1 is (t 0, k 1): action[1] - state[0] on the shared dims, action[1] as is on the third.
    expect(Array.from(rows.action.subarray(3, 6))).toEqual([Math.fround(t0.action[3]! - t0.state[0]!), Math.fround(t0.action[4]! - t0.state[1]!), t0.action[5]]);
  });
});
