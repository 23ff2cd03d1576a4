/**
 * Ready means ready (issue 35 item 1): a policy says it is ready only when every graph a robot
 * will ask for is traced, so that a robot started on that signal gets its first plain and first
 * real-time-chunked answers from graphs already traced (counted by the engine's
 * vela_engine_graphs_traced, not timed). Through what users run: `vela policy` as its own process
 * on the native backend (graphs on), and the main server's per-policy readiness route.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { NormStatsSet } from '../kernels/normalize.ts';
import { encodeFrame } from '../protocol/frames.ts';
import { ndarray } from '../protocol/ndarray.ts';
import { nowS } from '../server/store/store.ts';
import { tinyLoraCheckpoint } from './helpers/policy-proc.ts';
import { PolicyClient } from '../bench/harness/policy-stub.ts';
import { parseExposition } from './helpers/prom.ts';
import { api, startTestServer, TEST_KEY, type TestServer } from './helpers/server.ts';

const D = 7;
const STATS: NormStatsSet = {
  state: { mean: new Array(D).fill(0), std: new Array(D).fill(0.5), q01: new Array(D).fill(-1.2), q99: new Array(D).fill(1.2) },
  actions: { mean: new Array(6).fill(0), std: new Array(6).fill(0.5), q01: new Array(6).fill(-1.2), q99: new Array(6).fill(1.2) },
};
const observation = (extra: Record<string, unknown> = {}) => ({
  'observation/cam_high': ndarray(new Uint8Array(24 * 32 * 3).fill(90), [24, 32, 3]),
  'observation/state': ndarray(new Float32Array(D).fill(0.1), [D]),
  prompt: 'pick up the cube',
  ...extra,
});

let tmp = '';
let checkpoint = '';
const procs: ChildProcess[] = [];

beforeAll(async () => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-policy-ready-'));
  checkpoint = path.join(tmp, 'ck');
  await tinyLoraCheckpoint(checkpoint, { cameras: ['cam_high'], action_dim: 6, action_horizon: 4 }, STATS);
}, 120_000);
afterAll(() => {
  for (const p of procs) p.kill('SIGKILL');
  if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
});

/** The sum over engine workers of the graphs traced so far, from a /metrics scrape. */
async function graphsTraced(baseUrl: string, headers: Record<string, string> = {}): Promise<number> {
  const res = await fetch(`${baseUrl}/metrics`, { headers });
  expect(res.status).toBe(200);
  const all = parseExposition(await res.text()).all('vela_engine_graphs_traced');
  expect(all.length).toBeGreaterThan(0);
  return all.reduce((n, s) => n + s.value, 0);
}

describe('vela policy: /healthz, the metadata and the startup lines say when its graphs are traced', () => {
  it('503 WARMING until the plain and guided graphs are traced, then OK; a robot started then traces nothing', async () => {
    const proc = spawn(process.execPath, ['bin/vela.js', 'policy', checkpoint, '--port', '0', '--backend', 'node', '--log-level', 'warn'], { stdio: ['ignore', 'pipe', 'pipe'] });
    procs.push(proc);
    let out = '';
    let err = '';
    proc.stderr!.on('data', (b) => (err += b));
    const waitLine = (re: RegExp) => new Promise<RegExpExecArray>((resolve, reject) => {
      const look = () => {
        const m = re.exec(out);
        if (m) return resolve(m);
      };
      proc.stdout!.on('data', (b) => {
        out += b;
        look();
      });
      proc.once('exit', (code) => reject(new Error(`vela policy exited with ${code} before ${re}: ${out}${err}`)));
      look();
    });
    const url = (await waitLine(/Vela policy server on ws:\/\/(\S+?)\/? \(/))[1]!;
    const base = `http://${url}`;
    // The guided graph is traced once the policy has been idle 250 ms, and its trace takes about
    // a second: right after the listening line it is still warming, and says what it does.
    const early = await fetch(`${base}/healthz`);
    const earlyText = await early.text();
    expect(early.status, earlyText).toBe(503);
    expect(earlyText).toMatch(/^WARMING: (tracing )?the guided real-time chunking graph/);
    expect(out).toMatch(/\nwarming up: .*guided real-time chunking graph.* \(GET \/healthz answers 503 until ready\)\n/);

    await waitLine(/\nready: warmed up in \d+\.\d s\n/);
    const ok = await fetch(`${base}/healthz`);
    expect([ok.status, await ok.text()]).toEqual([200, 'OK']);
    // One plain graph and one guided graph, both for the lone robot's layout (one camera, batch 1).
    expect(await graphsTraced(base)).toBe(2);

    const robot = await PolicyClient.connect(`ws://${url}/?control_hz=30`);
    expect(robot.metadata).toMatchObject({ ready: true, live: false });
    expect(robot.metadata.warming).toBeUndefined();
    const first = await robot.infer(observation({ 'rtc/executed': 0 }));
    expect(first.server_timing.rtc).toMatchObject({ mode: 'off' });
    const second = await robot.infer(observation({ 'rtc/executed': 2 }));
    expect(second.server_timing.rtc).toMatchObject({ mode: 'guided', executed: 2 });
    // Neither the first plain nor the first guided answer traced a graph: both were warm.
    expect(await graphsTraced(base)).toBe(2);
    robot.close();
    proc.kill('SIGTERM');
  }, 120_000);

  it('on an engine without graphs (wasm) it is ready at once', async () => {
    const proc = spawn(process.execPath, ['bin/vela.js', 'policy', checkpoint, '--port', '0', '--backend', 'wasm', '--log-level', 'warn'], { stdio: ['ignore', 'pipe', 'pipe'] });
    procs.push(proc);
    let out = '';
    await new Promise<void>((resolve, reject) => {
      proc.stdout!.on('data', (b) => {
        out += b;
        if (/\nready\n/.test(out)) resolve();
      });
      proc.once('exit', (code) => reject(new Error(`exited ${code}: ${out}`)));
    });
    const url = /Vela policy server on (ws:\/\/\S+?)\/? \(/.exec(out)![1]!.replace('ws://', 'http://');
    const res = await fetch(`${url}/healthz`);
    expect([res.status, await res.text()]).toEqual([200, 'OK']);
    proc.kill('SIGTERM');
  }, 120_000);
});

describe('the main server: GET /v1/fine-tunes/<id>/policy/healthz loads a job\'s policy before its robot connects', () => {
  const JOB = 'ft-ready000001';
  const MISSING = 'ft-ready000002';
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer({ env: { VELA_METRICS_PUBLIC: '1' } });
    const owner = (await server.store.findApiKey(TEST_KEY))!;
    const job = { owner, status: 'succeeded' as const, created_at: nowS(), config: { model: 'flow0-tiny', dataset_name: 'pick' }, step: 3, loss: null, eval_loss: null, error: null, started_at: nowS(), finished_at: nowS(), cancel_requested: false };
    await server.store.insertJob({ ...job, id: JOB, output_dir: checkpoint });
    await server.store.insertJob({ ...job, id: MISSING, output_dir: path.join(tmp, 'gone') });
  }, 120_000);
  afterAll(async () => server?.close());

  it('503 while it loads and warms, 200 once ready; then the first request pays no load and traces nothing', async () => {
    expect((await api(server, 'GET', `/v1/fine-tunes/${JOB}/policy/healthz`, undefined, null)).status).toBe(401);
    expect((await api(server, 'GET', '/v1/fine-tunes/ft-nosuchjob0/policy/healthz')).status).toBe(404);
    const first = await api(server, 'GET', `/v1/fine-tunes/${JOB}/policy/healthz`);
    expect(first).toEqual({ status: 503, json: { ready: false, warming: expect.stringMatching(/^loading the policy/) } });
    let last = first;
    const seen = new Set<string>();
    for (let i = 0; i < 600 && last.status !== 200; i++) {
      await new Promise((r) => setTimeout(r, 50));
      last = await api(server, 'GET', `/v1/fine-tunes/${JOB}/policy/healthz`);
      if (last.status === 503) seen.add(last.json.warming.replace(/^tracing /, ''));
    }
    expect(last).toEqual({ status: 200, json: { ready: true } });
    // Between the load and ready: the guided graph (traced once the new policy had been idle 250 ms).
    expect([...seen]).toEqual(expect.arrayContaining([expect.stringMatching(/^the guided real-time chunking graph/)]));
    const traced = await graphsTraced(server.baseUrl);

    const png = Buffer.from((await encodeFrame('PNG', { width: 32, height: 24, data: new Uint8Array(24 * 32 * 3).fill(90) })) as Uint8Array).toString('base64');
    const answer = await api(server, 'POST', `/v1/fine-tunes/${JOB}/infer`, { 'observation/cam_high': png, image_codec: 'PNG', 'observation/state': new Array(D).fill(0.1), prompt: 'pick up the cube' });
    expect(answer.status, JSON.stringify(answer.json)).toBe(200);
    expect(answer.json).toMatchObject({ cold_start: false, load_seconds: 0 });
    const robot = await PolicyClient.connect(`${server.baseUrl.replace('http', 'ws')}/v1/fine-tunes/${JOB}/policy?control_hz=30`, { authorization: `Api-Key ${TEST_KEY}` });
    expect(robot.metadata.ready).toBe(true);
    await robot.infer(observation({ 'rtc/executed': 0 }));
    expect((await robot.infer(observation({ 'rtc/executed': 2 }))).server_timing.rtc.mode).toBe('guided');
    expect(await graphsTraced(server.baseUrl)).toBe(traced);
    robot.close();
  }, 180_000);

  it('a policy that cannot load: the probe after its failed load says why', async () => {
    const first = await api(server, 'GET', `/v1/fine-tunes/${MISSING}/policy/healthz`);
    expect(first.status).toBe(503);
    let last = first;
    for (let i = 0; i < 200 && last.status === 503; i++) {
      await new Promise((r) => setTimeout(r, 50));
      last = await api(server, 'GET', `/v1/fine-tunes/${MISSING}/policy/healthz`);
    }
    expect(last).toEqual({ status: 409, json: { ready: false, error: expect.stringMatching(/^the policy cannot be loaded: .*config\.json is missing/) } });
    // Each probe begins another load: the checkpoint put back is served.
    fs.cpSync(checkpoint, path.join(tmp, 'gone'), { recursive: true });
    for (let i = 0; i < 600 && last.status !== 200; i++) {
      last = await api(server, 'GET', `/v1/fine-tunes/${MISSING}/policy/healthz`);
      await new Promise((r) => setTimeout(r, 50));
    }
    expect(last).toEqual({ status: 200, json: { ready: true } });
  }, 120_000);
});
