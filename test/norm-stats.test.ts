/**
 * A checkpoint folder's own norm stats (server/models/norm-stats.ts): LeRobot's processor files
 * (built here with LeRobot's exact file names, JSON fields and tensor keys, FACTS.md 2.1),
 * openpi's assets/<id>/norm_stats.json, Vela's norm_stats.json, and the round trip of what a
 * Vela fine-tune writes.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { encodeSafetensors, type SafeTensor } from '../kernels/safetensors.ts';
import { normStatsToJson, type NormStatsSet } from '../kernels/normalize.ts';
import { readCheckpointNormStats, writeCheckpointNormStats } from '../server/models/norm-stats.ts';

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-normstats-'));
afterAll(() => fs.rmSync(root, { recursive: true, force: true }));
let n = 0;
const folder = (files: Record<string, string | Uint8Array> = {}): string => {
  const dir = path.join(root, `ck-${n++}`);
  for (const [name, data] of Object.entries(files)) {
    fs.mkdirSync(path.dirname(path.join(dir, name)), { recursive: true });
    fs.writeFileSync(path.join(dir, name), data);
  }
  fs.mkdirSync(dir, { recursive: true });
  return dir;
};

const STATS: NormStatsSet = {
  state: { mean: [0.1, -0.25, 1.5], std: [0.5, 0.125, 2], q01: [-1, -0.5, -3], q99: [1.25, 0.0625, 5] },
  actions: { mean: [0.3, 0.7], std: [0.2, 0.05], q01: [-0.1, 0.6], q99: [0.8, 0.9] },
};
const f32 = (xs: number[]): SafeTensor => ({ dtype: 'F32', shape: [xs.length], data: Float32Array.from(xs) });
const fround = (xs: number[]) => xs.map(Math.fround);

/** LeRobot's pi0 preprocessor as make_pi0_pre_post_processors saves it: the normalizer is step 2. */
function lerobotPre(normMode: string, features: Record<string, unknown>, stateFile?: string): string {
  return JSON.stringify({
    name: 'policy_preprocessor',
    steps: [
      { registry_name: 'rename_observations_processor', config: { rename_map: {} } },
      { registry_name: 'to_batch_processor', config: {} },
      {
        registry_name: 'normalizer_processor',
        config: { eps: 1e-8, features, norm_map: { VISUAL: 'IDENTITY', STATE: normMode, ACTION: normMode } },
        ...(stateFile ? { state_file: stateFile } : {}),
      },
      { registry_name: 'tokenizer_processor', config: { max_length: 48, task_key: 'task', padding_side: 'right', padding: 'max_length', truncation: true, tokenizer_name: 'google/paligemma-3b-pt-224' } },
      { registry_name: 'device_processor', config: { device: 'cpu', float_dtype: null } },
    ],
  });
}
const FEATURES = { 'observation.images.top': { type: 'VISUAL', shape: [3, 224, 224] }, 'observation.state': { type: 'STATE', shape: [3] }, action: { type: 'ACTION', shape: [2] } };

describe('LeRobot processor files', () => {
  it('reads a MEAN_STD fine-tune\'s normalizer (step 2, mean/std/min/max/count only) as zscore, filling q01/q99', async () => {
    const file = 'policy_preprocessor_step_2_normalizer_processor.safetensors';
    const dir = folder({
      'policy_preprocessor.json': lerobotPre('MEAN_STD', FEATURES, file),
      [file]: encodeSafetensors({
        'observation.state.mean': f32(STATS.state.mean), 'observation.state.std': f32(STATS.state.std),
        'observation.state.min': f32([-2, -1, -9]), 'observation.state.max': f32([2, 1, 9]), 'observation.state.count': { dtype: 'I64', shape: [1], data: BigInt64Array.of(100n) },
        'action.mean': f32(STATS.actions.mean), 'action.std': f32(STATS.actions.std),
        'observation.images.top.mean': { dtype: 'F32', shape: [3, 1, 1], data: Float32Array.of(0.5, 0.5, 0.5) },
      }),
    });
    // An I64 count tensor is stats LeRobot keeps too; only float stats of the two features are read.
    const got = await readCheckpointNormStats(dir).catch((e) => e);
    expect(got).toBeInstanceOf(Error);
    expect((got as Error).message).toBe(`${file}: tensor observation.state.count is I64; stats must be floating point`);
    fs.writeFileSync(path.join(dir, file), encodeSafetensors({
      'observation.state.mean': f32(STATS.state.mean), 'observation.state.std': f32(STATS.state.std),
      'observation.state.min': f32([-2, -1, -9]), 'observation.state.max': f32([2, 1, 9]),
      'action.mean': f32(STATS.actions.mean), 'action.std': f32(STATS.actions.std),
    }));
    const r = (await readCheckpointNormStats(dir))!;
    expect(r.mode).toBe('zscore');
    expect(r.source).toBe(file);
    // LeRobot's files are applied with LeRobot's arithmetic and the step's own eps.
    expect([r.convention, r.eps]).toEqual(['lerobot', 1e-8]);
    const pre = JSON.parse(fs.readFileSync(path.join(dir, 'policy_preprocessor.json'), 'utf8'));
    pre.steps[2].config.eps = 1e-5;
    fs.writeFileSync(path.join(dir, 'policy_preprocessor.json'), JSON.stringify(pre));
    expect((await readCheckpointNormStats(dir))!.eps).toBe(1e-5);
    pre.steps[2].config.eps = 'tiny';
    fs.writeFileSync(path.join(dir, 'policy_preprocessor.json'), JSON.stringify(pre));
    await expect(readCheckpointNormStats(dir)).rejects.toThrow(/the normalizer_processor step's eps is "tiny"; expected a finite number >= 0/);
    fs.writeFileSync(path.join(dir, 'policy_preprocessor.json'), lerobotPre('MEAN_STD', FEATURES, file));
    expect(r.stats.state.mean).toEqual(fround(STATS.state.mean));
    expect(r.stats.actions.std).toEqual(fround(STATS.actions.std));
    expect(r.filled).toEqual(['state.q01', 'state.q99', 'actions.q01', 'actions.q99']);
    expect(r.stats.state.q99[0]).toBeCloseTo(0.1 + 2.3263478740408408 * 0.5, 6);
  });

  it('reads QUANTILES stats, taking the actions from the postprocessor\'s unnormalizer when the normalizer has none', async () => {
    const pre = 'policy_preprocessor_step_3_normalizer_processor.safetensors';
    const post = 'policy_postprocessor_step_0_unnormalizer_processor.safetensors';
    const q = (s: typeof STATS.state) => ({ mean: f32(s.mean), std: f32(s.std), q01: f32(s.q01), q99: f32(s.q99) });
    const dir = folder({
      'policy_preprocessor.json': lerobotPre('QUANTILES', { 'observation.state': { type: 'STATE', shape: [3] } }, pre),
      [pre]: encodeSafetensors(Object.fromEntries(Object.entries(q(STATS.state)).map(([k, v]) => [`observation.state.${k}`, v]))),
      'policy_postprocessor.json': JSON.stringify({ name: 'policy_postprocessor', steps: [{ registry_name: 'unnormalizer_processor', config: { eps: 1e-8, features: { action: { type: 'ACTION', shape: [2] } }, norm_map: { VISUAL: 'IDENTITY', STATE: 'QUANTILES', ACTION: 'QUANTILES' } }, state_file: post }, { registry_name: 'device_processor', config: { device: 'cpu' } }] }),
      [post]: encodeSafetensors(Object.fromEntries(Object.entries(q(STATS.actions)).map(([k, v]) => [`action.${k}`, v]))),
    });
    const r = (await readCheckpointNormStats(dir))!;
    expect(r).toMatchObject({ mode: 'quantile', source: pre, filled: [], convention: 'lerobot', eps: 1e-8 });
    expect(r.stats.actions.q01).toEqual(fround(STATS.actions.q01));
    expect(r.stats.state.q99).toEqual(fround(STATS.state.q99));
  });

  it('a base checkpoint (pi05_base: empty features, no state file) has no stats', async () => {
    const dir = folder({ 'policy_preprocessor.json': lerobotPre('QUANTILES', {}), 'config.json': JSON.stringify({ type: 'pi05' }) });
    expect(await readCheckpointNormStats(dir)).toBeNull();
    expect(await readCheckpointNormStats(folder({ 'config.json': '{}' }))).toBeNull();
  });

  it('refuses what it cannot serve in one line naming the file and the problem', async () => {
    const cases: [Record<string, string | Uint8Array>, string][] = [
      [{ 'policy_preprocessor.json': '{"steps": [' }, 'policy_preprocessor.json: not JSON'],
      [{ 'policy_preprocessor.json': '{"name": "x"}' }, 'policy_preprocessor.json: has no "steps" list; expected a LeRobot processor pipeline'],
      [{ 'policy_preprocessor.json': lerobotPre('MEAN_STD', FEATURES, 'gone.safetensors') }, 'policy_preprocessor.json names state_file gone.safetensors, which is not in the folder'],
      [{ 'policy_preprocessor.json': lerobotPre('MIN_MAX', FEATURES, 's.safetensors') }, 'policy_preprocessor.json: norm_map mode MIN_MAX is not supported; Vela serves MEAN_STD (zscore) and QUANTILES (quantile)'],
      [
        { 'policy_preprocessor.json': lerobotPre('QUANTILES', FEATURES, 's.safetensors'), 's.safetensors': encodeSafetensors({ 'observation.state.mean': f32([0]), 'observation.state.std': f32([1]), 'action.q01': f32([0]), 'action.q99': f32([1]) }) },
        's.safetensors: state has no q01, q99; quantile normalisation needs q01 and q99',
      ],
      [
        { 'policy_preprocessor.json': lerobotPre('MEAN_STD', FEATURES, 's.safetensors'), 's.safetensors': encodeSafetensors({ 'observation.state.mean': f32([0, 1]), 'observation.state.std': f32([1]), 'action.mean': f32([0]), 'action.std': f32([1]) }) },
        's.safetensors: state.std has 1 values; state.mean has 2',
      ],
    ];
    for (const [files, message] of cases) {
      const err = await readCheckpointNormStats(folder(files)).catch((e) => e as Error);
      expect(err, message).toBeInstanceOf(Error);
      expect((err as Error).message.startsWith(message), `${(err as Error).message} vs ${message}`).toBe(true);
      expect((err as Error).message).not.toContain('\n');
    }
  });
});

describe('openpi assets and Vela\'s norm_stats.json', () => {
  const json = normStatsToJson(STATS);

  it('reads the one asset, with the mode from config.json or the caller', async () => {
    const dir = folder({ 'assets/trossen/norm_stats.json': json, 'config.json': JSON.stringify({ type: 'pi0' }) });
    expect(await readCheckpointNormStats(dir)).toEqual({ stats: STATS, mode: 'zscore', source: 'assets/trossen/norm_stats.json', filled: [], convention: 'openpi', eps: 1e-8 });
    const bare = folder({ 'assets/droid/norm_stats.json': json });
    expect((await readCheckpointNormStats(bare, { mode: 'quantile' }))!.mode).toBe('quantile');
    await expect(readCheckpointNormStats(bare)).rejects.toThrow('assets/droid/norm_stats.json does not say how to normalise and config.json names no model family: pass the mode (zscore for pi0, quantile for pi0.5)');
  });

  it('several assets: an error naming them, unless an asset id is given', async () => {
    const dir = folder({ 'assets/droid/norm_stats.json': json, 'assets/franka/norm_stats.json': normStatsToJson({ ...STATS, state: STATS.actions }), 'config.json': '{"type": "pi05"}' });
    await expect(readCheckpointNormStats(dir)).rejects.toThrow('assets/ has norm stats for 2 robots (droid, franka); name the asset id to serve with');
    const r = (await readCheckpointNormStats(dir, { assetId: 'franka' }))!;
    expect(r).toMatchObject({ mode: 'quantile', source: 'assets/franka/norm_stats.json' });
    expect(r.stats.state).toEqual(STATS.actions);
    await expect(readCheckpointNormStats(dir, { assetId: 'ur5e' })).rejects.toThrow('assets/ur5e/norm_stats.json is not in the folder; its assets with stats: droid, franka');
  });

  it('Vela\'s root norm_stats.json, with the mode of the preset in config.json', async () => {
    const dir = folder({ 'norm_stats.json': json, 'config.json': JSON.stringify({ preset: 'flow05-tiny' }) });
    expect(await readCheckpointNormStats(dir)).toEqual({ stats: STATS, mode: 'quantile', source: 'norm_stats.json', filled: [], convention: 'openpi', eps: 1e-8 });
    const broken = { norm_stats: { state: { mean: [0, 1], std: [1], q01: [0, 0], q99: [1, 1] }, actions: STATS.actions } };
    const bad = folder({ 'norm_stats.json': JSON.stringify(broken), 'config.json': JSON.stringify({ preset: 'flow0-tiny' }) });
    await expect(readCheckpointNormStats(bad)).rejects.toThrow(/^norm_stats.json: state.std has 1 values; state.mean has 2$/);
  });
});

describe('a Vela fine-tune\'s output folder', () => {
  it('round-trips in both modes, in LeRobot\'s layout with its file names and fields, and as norm_stats.json', async () => {
    for (const mode of ['zscore', 'quantile'] as const) {
      const dir = folder();
      const files = await writeCheckpointNormStats(dir, STATS, mode);
      expect(files.sort()).toEqual([
        'norm_stats.json', 'policy_postprocessor.json', 'policy_postprocessor_step_0_unnormalizer_processor.safetensors',
        'policy_preprocessor.json', 'policy_preprocessor_step_0_normalizer_processor.safetensors',
      ]);
      expect(fs.readdirSync(dir).sort()).toEqual(files); // no temporary file left
      const pre = JSON.parse(fs.readFileSync(path.join(dir, 'policy_preprocessor.json'), 'utf8'));
      const lr = mode === 'zscore' ? 'MEAN_STD' : 'QUANTILES';
      expect(pre).toEqual({
        name: 'policy_preprocessor',
        steps: [{
          registry_name: 'normalizer_processor',
          config: { eps: 1e-8, features: { 'observation.state': { type: 'STATE', shape: [3] }, action: { type: 'ACTION', shape: [2] } }, norm_map: { VISUAL: 'IDENTITY', STATE: lr, ACTION: lr } },
          state_file: 'policy_preprocessor_step_0_normalizer_processor.safetensors',
        }],
      });
      const post = JSON.parse(fs.readFileSync(path.join(dir, 'policy_postprocessor.json'), 'utf8'));
      expect(post.steps[0]).toMatchObject({ registry_name: 'unnormalizer_processor', state_file: 'policy_postprocessor_step_0_unnormalizer_processor.safetensors', config: { features: { action: { type: 'ACTION', shape: [2] } } } });
      const back = (await readCheckpointNormStats(dir))!;
      expect(back.mode).toBe(mode);
      // Vela trained these with openpi's arithmetic; its norm_stats.json beside the LeRobot files says so.
      expect(back.convention).toBe('openpi');
      expect(back.source).toBe('policy_preprocessor_step_0_normalizer_processor.safetensors');
      for (const key of ['state', 'actions'] as const) {
        for (const f of ['mean', 'std', 'q01', 'q99'] as const) expect(back.stats[key][f]).toEqual(fround(STATS[key][f]));
      }
      // openpi-style tools and older Vela read the exact float64 stats from norm_stats.json.
      fs.rmSync(path.join(dir, 'policy_preprocessor.json'));
      expect(await readCheckpointNormStats(dir, { mode })).toEqual({ stats: STATS, mode, source: 'norm_stats.json', filled: [], convention: 'openpi', eps: 1e-8 });
    }
  });

  it('refuses stats that do not validate, writing nothing', async () => {
    const dir = folder();
    await expect(writeCheckpointNormStats(dir, { ...STATS, state: { ...STATS.state, std: [1, -1, 1] } }, 'zscore')).rejects.toThrow('state.std[1] is -1; it must be >= 0');
    expect(fs.readdirSync(dir)).toEqual([]);
  });
});
