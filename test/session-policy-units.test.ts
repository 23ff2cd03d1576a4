/**
 * A training session's live policy says which units it answers in (Vela issue 35, item 9),
 * through the real server: without `robot` the answer is the model's normalised space padded to
 * its 32 action dims (`units: "model"` and a note); a session created with
 * `robot: {action_dim, action_names, norm_stats}` answers the robot's dims in robot units, built
 * as a job checkpoint's policy is. Two sessions of the same preset and seed hold the same weights
 * (forward_backward without optim_step changes none), so at the same policy seed the robot
 * session's answer is the plain one mapped by the z-score inverse: mean + (std + 1e-6) * x.
 * Bad robot objects are a 400 naming the field.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { VelaClient, type Datum } from '../protocol/client.ts';
import { ndarray } from '../protocol/ndarray.ts';
import { g1Datums } from '../bench/harness/g1.ts';
import { nowS } from '../server/store/store.ts';
import { tinyLoraCheckpoint } from './helpers/policy-proc.ts';
import { PolicyClient } from '../bench/harness/policy-stub.ts';
import { api, startTestServer, TEST_KEY, type TestServer } from './helpers/server.ts';

const A = 6;
const S = 26; // the g1 datums' state dims
const NAMES = ['j0', 'j1', 'j2', 'j3', 'j4', 'gripper'];
const MEAN = [0.5, -1, 2, 0, 3, -0.25];
const STD = [0.1, 2, 0.5, 1, 4, 0.05];
/** Identity-like state stats (mean 0, std 1): the state the model sees is the same in both sessions but for openpi's eps. */
const NORM_STATS = {
  state: { mean: new Array(S).fill(0), std: new Array(S).fill(1), q01: new Array(S).fill(-2), q99: new Array(S).fill(2) },
  actions: { mean: MEAN, std: STD, q01: MEAN.map((m, i) => m - 2 * STD[i]!), q99: MEAN.map((m, i) => m + 2 * STD[i]!) },
};

let server: TestServer;
let batch: Datum[];

beforeAll(async () => {
  server = await startTestServer();
  batch = await g1Datums(2, { episode: 0 });
}, 120_000);
afterAll(async () => {
  await server?.close();
  if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
});
let tmp = '';

/** Creates a flow0-tiny session (optionally with `robot`), binds cam_high with one forward_backward, and opens its live policy at seed 7. */
async function livePolicy(robot?: unknown): Promise<{ id: string; robot: PolicyClient }> {
  const client = new VelaClient(server.baseUrl, TEST_KEY);
  const s = await client.waitReady((await client.createSession({ base_model: 'flow0-tiny', ...(robot ? { robot } : {}) } as never)).id);
  const conn = await client.connect(s);
  await conn.forwardBackward(batch, { codec: 'JPEG' });
  const policy = await PolicyClient.connect(`${server.baseUrl.replace('http', 'ws')}/v1/training_sessions/${s.id}/policy?seed=7`, { authorization: `Api-Key ${TEST_KEY}` });
  return { id: s.id, robot: policy };
}

// A zero state: (0 - 0) / (1 + 1e-6) is exactly 0, so both sessions' models see the same input
// and their outputs are the same bits; only the affine map of the answer rounds.
const obsOf = (d: Datum) => ({ 'observation/cam_high': Buffer.from(d.observation.image!.cam_high as Uint8Array), image_codec: 'JPEG', 'observation/state': ndarray(new Float32Array(S), [S]), prompt: d.observation.prompt });

describe('a training session\'s live policy: units', () => {
  it('without robot: units "model", a note, [H, 32]; with robot: units "robot", names, [H, 6] = mean + std * the plain answer', async () => {
    const plain = await livePolicy();
    const robot = await livePolicy({ action_dim: A, action_names: NAMES, norm_stats: NORM_STATS });
    try {
      expect(plain.robot.metadata.units).toBe('model');
      expect(plain.robot.metadata.note).toMatch(/normalised.*32 dims.*robot/);
      expect(plain.robot.metadata.action_dim).toBe(32);
      expect(robot.robot.metadata.units).toBe('robot');
      expect(robot.robot.metadata.note).toBeUndefined();
      expect(robot.robot.metadata.action_dim).toBe(A);
      expect(robot.robot.metadata.action_names).toEqual(NAMES);
      expect(robot.robot.metadata.state_dim).toBe(S);

      const p = await plain.robot.infer(obsOf(batch[0]!));
      const r = await robot.robot.infer(obsOf(batch[0]!));
      const H = p.actions.shape[0];
      expect(p.actions.shape).toEqual([H, 32]);
      expect(r.actions.shape).toEqual([H, A]);
      const pv = p.actions.data as Float32Array;
      const rv = r.actions.data as Float32Array;
      let worst = 0;
      for (let h = 0; h < H; h++) {
        for (let i = 0; i < A; i++) {
          const x = pv[h * 32 + i]!;
          const want = MEAN[i]! + (STD[i]! + 1e-6) * x;
          // float32: std + 1e-6, the product and the sum each round once (2^-24 relative each).
          const tol = 4 * 2 ** -24 * (Math.abs(MEAN[i]!) + Math.abs(STD[i]! * x));
          worst = Math.max(worst, Math.abs(rv[h * A + i]! - want) / tol);
        }
      }
      expect(worst).toBeLessThanOrEqual(1);
      // And the map is not the identity: the robot's answer is not the plain one.
      expect(Math.abs(rv[0]! - pv[0]!)).toBeGreaterThan(0.1);
    } finally {
      plain.robot.close();
      robot.robot.close();
    }
  }, 120_000);

  it('a bad robot object is a 400 naming the field', async () => {
    const cases: [unknown, RegExp][] = [
      [{ action_dim: 0 }, /robot\.action_dim/],
      [{ action_dim: 33 }, /robot\.action_dim/],
      [{ action_dim: A, action_names: ['a', 'b'] }, /robot\.action_names/],
      [{ action_dim: A, state_names: [1, 2] }, /robot\.state_names/],
      [{ action_dim: A, norm_stats: { ...NORM_STATS, actions: { ...NORM_STATS.actions, std: [0.1, NaN, 1, 1, 1, 1] } } }, /robot\.norm_stats\.actions\.std/],
      [{ action_dim: A, norm_stats: { ...NORM_STATS, actions: { ...NORM_STATS.actions, mean: [1, 2] } } }, /robot\.norm_stats\.actions/],
      [{ action_dim: A, extra: 1 }, /robot\.extra/],
      ['six', /robot must be an object/],
    ];
    for (const [robot, message] of cases) {
      const res = await api(server, 'POST', '/v1/training_sessions', { base_model: 'flow0-tiny', robot });
      expect(res.status, JSON.stringify(robot)).toBe(400);
      expect(JSON.stringify(res.json), JSON.stringify(robot)).toMatch(message);
    }
    // A good one is shown in the session's JSON.
    const ok = await api(server, 'POST', '/v1/training_sessions', { base_model: 'flow0-tiny', robot: { action_dim: A, action_names: NAMES } });
    expect(ok.status).toBe(200);
    expect(ok.json.robot).toEqual({ action_dim: A, action_names: NAMES });
  }, 60_000);

  it('a job\'s policy says units "robot" too (the same key), with no note', async () => {
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-units-'));
    const out = path.join(tmp, 'job-output');
    await tinyLoraCheckpoint(out, { cameras: ['cam_high'], action_dim: A, action_horizon: 4 }, NORM_STATS);
    const job = 'ft-units00001';
    await server.store.insertJob({
      id: job, owner: (await server.store.findApiKey(TEST_KEY))!, status: 'succeeded', created_at: nowS(), config: { model: 'flow0-tiny', dataset_name: 'pick' },
      step: 3, loss: null, eval_loss: null, error: null, output_dir: out, started_at: nowS(), finished_at: nowS(), cancel_requested: false,
    });
    const robot = await PolicyClient.connect(`${server.baseUrl.replace('http', 'ws')}/v1/fine-tunes/${job}/policy`, { authorization: `Api-Key ${TEST_KEY}` });
    try {
      expect(robot.metadata.units).toBe('robot');
      expect(robot.metadata.note).toBeUndefined();
      expect(robot.metadata.action_dim).toBe(A);
    } finally {
      robot.close();
    }
  }, 120_000);
});
