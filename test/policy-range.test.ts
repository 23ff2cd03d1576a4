/**
 * Observations far outside the served norm stats, as a robot and an operator see them: a real
 * `vela policy` process (uWS + engine worker) serving a flow0-tiny checkpoint whose stats are in
 * radians, and OpenPI-style Python clients (test/python/openpi_range_check.py) sending the
 * state in degrees, then in radians. The robot always gets its actions (plus a `warnings` entry
 * when the state is out of range); the server logs one line per connection; /metrics counts
 * every out-of-range observation. The detector's arithmetic is tested on its own below.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { outOfRange } from '../kernels/norm-range.ts';
import type { NormStatsSet } from '../kernels/normalize.ts';
import { parseExposition } from './helpers/prom.ts';
import { runPythonJson } from './helpers/python.ts';
import { missing, pythonEnv } from './helpers/requires.ts';
import { tinyLoraCheckpoint } from './helpers/policy-proc.ts';

const SKIP = missing('the test virtualenv (websockets, msgpack, numpy, zstandard)', pythonEnv().reason);
const D = 7;
const NAMES = ['waist', 'shoulder', 'elbow', 'forearm_roll', 'wrist_angle', 'wrist_rotate', 'gripper'];
/** Radians: every joint around 0 with std 0.5 rad. */
const STATS: NormStatsSet = {
  state: { mean: new Array(D).fill(0), std: new Array(D).fill(0.5), q01: new Array(D).fill(-1.2), q99: new Array(D).fill(1.2) },
  actions: { mean: new Array(6).fill(0), std: new Array(6).fill(0.5), q01: new Array(6).fill(-1.2), q99: new Array(6).fill(1.2) },
};
const WARNING = /warn +policy policy: observation state is far outside the norm stats/;

let dir = '';
let policy: ChildProcess | null = null;
let stderr = '';
let seen: any;
let metricsText = '';

async function startPolicy(checkpoint: string): Promise<{ wsUrl: string; httpUrl: string }> {
  policy = spawn(process.execPath, ['bin/vela.js', 'policy', checkpoint, '--port', '0', '--seed', '3', '--backend', 'wasm', '--log-level', 'warn', '--metrics-public'], { stdio: ['ignore', 'pipe', 'pipe'] });
  policy.stderr!.on('data', (b) => (stderr += b));
  return new Promise((resolve, reject) => {
    let out = '';
    policy!.stdout!.on('data', (b) => {
      out += b;
      const m = /Vela policy server on (ws:\/\/\S+)/.exec(out);
      if (m) resolve({ wsUrl: m[1]!, httpUrl: m[1]!.replace(/^ws/, 'http').replace(/\/$/, '') });
    });
    policy!.once('exit', (code) => reject(new Error(`vela policy exited with ${code}: ${stderr}`)));
  });
}

beforeAll(async () => {
  if (SKIP) return;
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-range-'));
  const ck = path.join(dir, 'ck');
  // Stats in radians.
  await tinyLoraCheckpoint(ck, { cameras: ['cam_high'], state_names: NAMES, action_dim: 6, action_horizon: 4 }, STATS);
  const { wsUrl, httpUrl } = await startPolicy(ck);
  seen = await runPythonJson('openpi_range_check.py', [wsUrl, String(D)], 240_000);
  // The server logs before it sends, and the last connection's answer is in: its lines are written.
  metricsText = await (await fetch(`${httpUrl}/metrics`)).text();
}, 400_000);
afterAll(() => {
  policy?.kill('SIGTERM');
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

describe.skipIf(SKIP)('vela policy: a state far outside the norm stats', () => {
  it('answers every observation with actions; out-of-range ones carry a warnings entry the client reads', () => {
    for (const a of [...seen.degrees, ...seen.again]) {
      expect(a).toMatchObject({ keys: ['actions', 'policy_timing', 'server_timing', 'warnings'], shape: [4, 6], finite: true });
      expect(a.warnings).toHaveLength(1);
      expect(a.warnings[0]).toMatch(/^observation state dims 0, 1, 3, 4, 5, 6 far outside the policy's norm stats \(worst: dim 1 \(shoulder\) = 68\.75; the stats accept -3\.\.3\): check units \(degrees vs radians\), the stats and the state's order$/);
    }
    for (const a of seen.radians) expect(a).toEqual({ keys: ['actions', 'policy_timing', 'server_timing'], shape: [4, 6], finite: true, warnings: null });
  });

  it('logs one line per connection (two out-of-range requests: one line; in range: none), naming the policy, dims, values, stats and causes', () => {
    const lines = stderr.split('\n').filter((l) => WARNING.test(l));
    expect(lines, stderr).toHaveLength(2); // the "degrees" connection and the "again" one
    const line = lines[0]!;
    expect(line).toContain('dim 1 (shoulder) = 68.75 (z 137.5; mean 0, std 0.5; accepted -3..3)');
    expect(line).toContain('worst dim 1 (shoulder)');
    expect(line).toContain('Likely causes: units (degrees where training used radians: dim 1 (shoulder) read as degrees is 1.2 rad, inside the stats; or mm vs m)');
    expect(line).toContain("the stats of another dataset or robot, or the state's dims in another order than training's");
    expect(line).not.toContain('\\n');
  });

  it('counts every out-of-range observation in /metrics by policy (2 + 0 + 1)', () => {
    expect(parseExposition(metricsText).value('vela_policy_observations_out_of_range_total', { policy: 'policy' })).toBe(3);
    expect(parseExposition(metricsText).value('vela_policy_requests_total')).toBe(5);
  });
});

describe('outOfRange (kernels/norm-range.ts)', () => {
  const s = { mean: [0, 1, 10], std: [0.5, 0, 2], q01: [-1, 1, 6], q99: [1, 1, 14] };

  it('zscore: |z| > 6 by default, with the worst dim and the raw bounds', () => {
    expect(outOfRange([2.9, 1, 10], s, 'zscore')).toBeNull();
    const r = outOfRange([-3.5, 1, 40], s, 'zscore')!;
    expect(r.dims.map((d) => d.dim)).toEqual([0, 2]);
    expect(r.worst.dim).toBe(2);
    expect(r.worst.normalized).toBeCloseTo(15, 4);
    expect(r.dims[0]!.low).toBeCloseTo(-3, 4);
    expect(r.dims[0]!.high).toBeCloseTo(3, 4);
    // A dim constant in training (std 0) that moves is reported; dims past the stats are not checked.
    expect(outOfRange([0, 1.001, 10, 1e9], s, 'zscore')!.dims.map((d) => d.dim)).toEqual([1]);
  });

  it('quantile: outside [-3, 3] normalised, i.e. more than one q01..q99 width beyond it', () => {
    expect(outOfRange([2.9, 1, 14], s, 'quantile')).toBeNull(); // dim 0: 2.9 -> 2.9
    const r = outOfRange([3.1, 1, 5], s, 'quantile')!;
    expect(r.dims.map((d) => d.dim)).toEqual([0]);
    expect(r.worst.normalized).toBeCloseTo(3.1, 5);
    expect(r.worst.low).toBeCloseTo(-3, 4);
    expect(r.worst.high).toBeCloseTo(3, 4);
    // A constant dim (q01 = q99) at its value normalises to -1; a tighter limit catches it and q99.
    expect(outOfRange([0, 1, 14], s, 'quantile', 0.5)!.dims.map((d) => d.dim)).toEqual([1, 2]);
  });
});
