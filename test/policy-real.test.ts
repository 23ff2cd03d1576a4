/**
 * `vela policy` serving the real pi0 / pi0.5 (issue 24), on the tiny real-architecture bases of
 * test/helpers/real-pi-base.ts (the CI stand-ins for lerobot/pi0_base and lerobot/pi05_base):
 * - a base served as it is (`vela policy --base DIR`, a real child process) to OpenPI's Python
 *   client (test/python/openpi_real_check.py) with a real G1 frame and state;
 * - a session on the same base (POST /v1/training_sessions {base_model: pi05, base}) trained a
 *   few steps, its saved weights served by `vela policy --checkpoint`, by the main server's HTTP
 *   inference (live and as a sampling session) and pushed into the running base server with
 *   sync_inference_weights: every one answers what the session's own `sample` answers for the
 *   same seed.
 * Every process runs on wasm (one thread, deterministic), so answers of different processes are
 * compared exactly. Peak RSS and round trips are printed, never asserted on.
 */
import { execFile, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { VelaClient, type Datum, type SessionConnection } from '../protocol/client.ts';
import { decodeFrame } from '../protocol/frames.ts';
import { ndarray, type NDArray } from '../protocol/ndarray.ts';
import { quantileNormalize, quantileUnnormalize, type NormStats } from '../kernels/normalize.ts';
import { realModelKey } from '../server/engine/model-key.ts';
import { nowS } from '../server/store/store.ts';
import { requestSeed } from '../server/policy/seeds.ts';
import { g1Datums } from '../bench/harness/g1.ts';
import { PolicyClient } from '../bench/harness/policy-stub.ts';
import { runPythonJson } from './helpers/python.ts';
import { missing, pythonEnv } from './helpers/requires.ts';
import { writeTinyBase } from './helpers/real-pi-base.ts';
import { startPolicyProc, type PolicyProc } from './helpers/policy-proc.ts';
import { api, startTestServer, type TestServer } from './helpers/server.ts';

const SKIP = missing('the test virtualenv (websockets, msgpack, numpy, zstandard)', pythonEnv().reason);
const KEY = 'real-policy-key';
const SEED = 7;
const G1_CAMERAS = 'cam_high,cam_left_wrist,cam_right_wrist';

const procs: ChildProcess[] = [];
const startPolicy = (args: string[]): Promise<PolicyProc> => startPolicyProc(args).then((p) => (procs.push(p.proc), p));


/** The process's peak resident memory (VmHWM), MiB. */
function peakRssMiB(pid: number): number {
  const m = /VmHWM:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) / 1024 : NaN;
}

let tmp: string;
let pi05Base: string;
let pi0Base: string;
let probe: Datum;
let batch: Datum[];
let frameFile: string;
let obsFile: string;
let basePolicy: PolicyProc;

/** The probe as a robot sends it to a policy: the JPEG frame of cam_high, the raw state, the task. */
function probeObservation(): Record<string, unknown> {
  const o = probe.observation;
  return { 'observation/cam_high': o.image!.cam_high, image_codec: 'JPEG', 'observation/state': o.state, prompt: o.prompt };
}

const values = (a: NDArray) => Array.from(a.data as Float32Array);

beforeAll(async () => {
  if (SKIP) return;
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-policy-real-'));
  [pi05Base, pi0Base] = await Promise.all([writeTinyBase('pi05', { dir: path.join(tmp, 'tiny_pi05_base') }), writeTinyBase('pi0', { dir: path.join(tmp, 'tiny_pi0_base') })]);
  batch = await g1Datums(2, { horizon: 10 });
  probe = batch[0]!;
  // The Python client sends the decoded frame as numpy uint8 [480, 640, 3], as a robot's camera gives it.
  const frame = await decodeFrame('JPEG', probe.observation.image!.cam_high as Uint8Array);
  frameFile = path.join(tmp, 'frame.bin');
  obsFile = path.join(tmp, 'obs.json');
  fs.writeFileSync(frameFile, frame.data);
  fs.writeFileSync(obsFile, JSON.stringify({ shape: [frame.height, frame.width, 3], state: Array.from(probe.observation.state!.data as Float32Array), prompt: probe.observation.prompt }));
  basePolicy = await startPolicy(['--base', pi05Base, '--cameras', G1_CAMERAS, '--api-key', KEY]);
}, 120_000);

afterAll(() => {
  for (const p of procs) p.kill('SIGTERM');
  if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
});

function checkPythonRun(seen: any, variant: 'pi0' | 'pi05', cameras: string[]): void {
  expect(seen.metadata).toMatchObject({ server: 'vela', model: variant, action_horizon: 10, action_dim: 32, state_dim: 32, image_size: 56, cameras, action_space: 'absolute', live: false, seeded: false });
  for (const k of ['first', 'next', 'again', 'open_connection_after_misfit', 'new_connection_after_misfit']) {
    expect(seen[k]).toMatchObject({ dtype: '<f4', shape: [10, 32], finite: true, keys: ['actions', 'policy_timing', 'server_timing'] });
  }
  // The same seed and request number: the same noise, the same answer; the next request differs.
  expect(seen.again.values).toEqual(seen.first.values);
  expect(seen.next.values).not.toEqual(seen.first.values);
  expect(seen.open_connection_after_misfit.values).toEqual(seen.next.values);
  expect(seen.new_connection_after_misfit.values).toEqual(seen.first.values);
  expect(new Set(seen.first.values).size).toBeGreaterThan(100);
  // A state longer than the model's 32 dims: one line naming it, close 1011; the others go on.
  expect(seen.misfit).toEqual({ error: "Error in inference server:\nobservation/state has 33 values; the model's state_dim is 32", close_code: 1011 });
}

describe.skipIf(SKIP)('vela policy --base: a real base served as it is to OpenPI\'s client', () => {
  it('pi0.5: [10, 32] actions for a G1 frame, the metadata, equal answers for equal seeds; a 33-dim state is refused in one line', async () => {
    const seen = await runPythonJson('openpi_real_check.py', [basePolicy.url, String(SEED), frameFile, obsFile, KEY], 60_000);
    checkPythonRun(seen, 'pi05', G1_CAMERAS.split(','));
    // One warning at start: the tiny base carries no norm stats.
    expect(basePolicy.stderr().match(/has no norm stats/g)).toHaveLength(1);
    expect(basePolicy.stderr()).toMatch(/the base .*tiny_pi05_base has no norm stats; states and actions pass unnormalised/);
    const rt = [seen.first, seen.next, seen.again].map((a: any) => a.round_trip_ms.toFixed(0));
    process.stdout.write(`vela policy --base tiny pi05 (wasm): round trips ${rt.join(', ')} ms (G1 frame 480x640 RAW, 921 KB), peak RSS ${peakRssMiB(basePolicy.proc.pid!).toFixed(0)} MiB\n`);
  });

  it('a base without the PaliGemma tokenizer: one line naming the gated repo and the fix, exit 1, nothing served', async () => {
    const bare = await writeTinyBase('pi05', { dir: path.join(tmp, 'no_tokenizer_base'), tokenizer: false });
    const empty = fs.mkdtempSync(path.join(tmp, 'hf-'));
    const r = await new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
      execFile(process.execPath, ['bin/vela.js', 'policy', '--base', bare, '--port', '0'], { env: { ...process.env, HF_HOME: empty, HF_HUB_CACHE: path.join(empty, 'hub') }, timeout: 60_000 }, (err, stdout, stderr) => resolve({ code: err ? (err as { code?: number }).code ?? null : 0, stdout, stderr }));
    });
    expect(r.code).toBe(1);
    expect(r.stdout).toBe('');
    const lines = r.stderr.trim().split('\n');
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(/^vela policy: the PaliGemma tokenizer is not in the Hugging Face cache and .*no_tokenizer_base has no tokenizer of its own \(tokenizer\.json, or the tokenizer\/ folder LeRobot.s processor pipeline saves\): google\/paligemma-3b-pt-224 is gated.*HF_TOKEN/);
  });

  it('pi0 (--model pi0): the same, with openpi\'s camera names from the base\'s config.json', async () => {
    const p = await startPolicy(['--base', pi0Base, '--model', 'pi0', '--api-key', KEY]);
    const seen = await runPythonJson('openpi_real_check.py', [p.url, String(SEED), frameFile, obsFile, KEY], 60_000);
    checkPythonRun(seen, 'pi0', ['base_0_rgb', 'left_wrist_0_rgb', 'right_wrist_0_rgb']);
    process.stdout.write(`vela policy --base tiny pi0 (wasm): round trip ${seen.first.round_trip_ms.toFixed(0)} ms, peak RSS ${peakRssMiB(p.proc.pid!).toFixed(0)} MiB\n`);
    p.proc.kill('SIGTERM');
  });
});

describe.skipIf(SKIP)('a session on the tiny base, served', () => {
  let server: TestServer;
  let sessionId = '';
  let conn: SessionConnection;
  let saved = '';
  let before: number[] = [];
  let after: number[] = [];
  const seed = requestSeed(SEED, '0', 0); // request 0 of stream 0 of a connection with ?seed=SEED

  beforeAll(async () => {
    if (SKIP) return;
    // The policy servers listen on 127.0.0.1: loopback endpoints need the operator's allowlist.
    server = await startTestServer({ env: { VELA_BACKEND: 'wasm', VELA_ALLOW_ENDPOINT: '127.0.0.0/8', VELA_FUTURE_WAIT_S: '1' } });
  });
  afterAll(async () => {
    conn?.close();
    await server?.close();
  });

  it('vela policy --checkpoint <saved weights> answers the session\'s own sample for the same seed; the base answers the untrained one', async () => {
    const client = new VelaClient(server.baseUrl, server.apiKey);
    const s = await client.waitReady((await client.createSession({ base_model: 'pi05', base: pi05Base })).id);
    sessionId = s.id;
    conn = await client.connect(s);
    before = values((await conn.sample([probe], { codec: 'JPEG', seed })).actions);
    for (let i = 0; i < 3; i++) {
      await conn.forwardBackward(batch, { codec: 'JPEG' });
      await conn.optimStep({ learning_rate: 1e-2 });
    }
    after = values((await conn.sample([probe], { codec: 'JPEG', seed })).actions);
    expect(after).toHaveLength(10 * 32);
    expect(after).not.toEqual(before); // the adapters moved
    saved = await conn.saveWeights('w3');
    expect(JSON.parse(fs.readFileSync(path.join(saved, 'config.json'), 'utf8'))).toMatchObject({ preset: 'pi05', base_checkpoint: pi05Base, cameras: ['cam_high'] });

    const served = await startPolicy(['--checkpoint', saved]);
    const c = await PolicyClient.connect(`${served.url}?seed=${SEED}`);
    expect(c.metadata).toMatchObject({ model: 'pi05', cameras: ['cam_high'], action_horizon: 10, action_dim: 32, image_size: 56 });
    expect(values((await c.infer(probeObservation())).actions)).toEqual(after);
    c.close();
    served.proc.kill('SIGTERM');

    // The base served as it is answers what the untrained session (its adapters at zero) sampled.
    const b = await PolicyClient.connect(`${basePolicy.url}?seed=${SEED}`, { authorization: `Bearer ${KEY}` });
    expect(values((await b.infer(probeObservation())).actions)).toEqual(before);
    b.close();
  });

  it('HTTP inference: the session\'s live policy and its saved weights as a sampling session answer the same', async () => {
    const o = probe.observation;
    const body = {
      'observation/cam_high': Buffer.from(o.image!.cam_high as Uint8Array).toString('base64'), image_codec: 'JPEG',
      'observation/state': Array.from(o.state!.data as Float32Array), prompt: o.prompt, seed,
    };
    const live = await api(server, 'POST', `/v1/training_sessions/${sessionId}/infer`, body);
    expect(live.status).toBe(200);
    expect(live.json).toMatchObject({ model: 'pi05', seed });
    expect(live.json.actions.shape).toEqual([10, 32]);
    expect(live.json.actions.data).toEqual(after);

    const wrong = await api(server, 'POST', '/api/v1/create_sampling_session', { path: saved, base_model: 'pi0' });
    expect(wrong).toMatchObject({ status: 400, json: { error: expect.stringMatching(/is for pi05, not "pi0"$/) } });
    const samp = await api(server, 'POST', '/api/v1/create_sampling_session', { path: saved, base_model: 'pi05' });
    expect(samp.status).toBe(200);
    expect(samp.json.model).toBe('pi05');
    const ans = await api(server, 'POST', `/v1/sampling_sessions/${samp.json.sampling_session_id}/infer`, body);
    expect(ans.status).toBe(200);
    expect(ans.json.actions.data).toEqual(after);
  });

  it('a fine-tune\'s policy on the real base serves with its output\'s norm stats, pi0.5\'s quantiles', async () => {
    // A succeeded job of the real model as the jobs runner records one: engine_model names the
    // base, output_dir holds the weights and the dataset's norm_stats.json.
    const out = path.join(tmp, 'job-output');
    fs.cpSync(saved, out, { recursive: true });
    const q = (lo: number, n: number): NormStats => ({ mean: new Array(n).fill(0), std: new Array(n).fill(1), q01: Array.from({ length: n }, (_, i) => lo - i / 8), q99: Array.from({ length: n }, (_, i) => lo + 2 + i / 4) });
    const stats = { state: q(-1, 26), actions: q(-3, 32) };
    fs.writeFileSync(path.join(out, 'norm_stats.json'), JSON.stringify({ norm_stats: stats }));
    const owner = (await server.store.findApiKey(server.apiKey))!;
    const id = 'ft-realpolicy01';
    await server.store.insertJob({
      id, owner, status: 'succeeded', created_at: nowS(), config: { model: 'pi05', base: pi05Base, engine_model: realModelKey('pi05', pi05Base), dataset_name: 'g1' },
      step: 3, loss: null, eval_loss: null, error: null, output_dir: out, started_at: nowS(), finished_at: nowS(), cancel_requested: false,
    });
    const o = probe.observation;
    const raw = o.state!.data as Float32Array;
    const ans = await api(server, 'POST', `/v1/fine-tunes/${id}/infer`, {
      'observation/cam_high': Buffer.from(o.image!.cam_high as Uint8Array).toString('base64'), image_codec: 'JPEG', 'observation/state': Array.from(raw), prompt: o.prompt, seed,
    });
    expect(ans.status).toBe(200);
    expect(ans.json.actions.shape).toEqual([10, 32]);
    // What the session samples for the quantile-normalised state, unnormalised the same way.
    const normalised = { ...probe, observation: { ...o, state: ndarray(quantileNormalize(raw, 26, stats.state), [26]) } };
    const model = (await conn.sample([normalised], { codec: 'JPEG', seed })).actions.data as Float32Array;
    expect(ans.json.actions.data).toEqual(Array.from(quantileUnnormalize(model, 32, stats.actions)));
    expect(ans.json.actions.data).not.toEqual(after);
  });

  it('a fine-tune whose output is a base checkpoint in the Hub layout is served as it is', async () => {
    const owner = (await server.store.findApiKey(server.apiKey))!;
    const id = 'ft-hubout01';
    await server.store.insertJob({
      id, owner, status: 'succeeded', created_at: nowS(), config: { model: 'pi0', base: pi0Base, engine_model: realModelKey('pi0', pi0Base), dataset_name: 'g1' },
      step: 3, loss: null, eval_loss: null, error: null, output_dir: pi0Base, started_at: nowS(), finished_at: nowS(), cancel_requested: false,
    });
    const o = probe.observation;
    const ans = await api(server, 'POST', `/v1/fine-tunes/${id}/infer`, {
      'observation/image': Buffer.from(o.image!.cam_high as Uint8Array).toString('base64'), image_codec: 'JPEG', 'observation/state': Array.from(o.state!.data as Float32Array), prompt: o.prompt, seed,
    });
    expect(ans.status).toBe(200);
    expect(ans.json).toMatchObject({ model: 'pi0', weights_version: 'final' });
    expect(ans.json.actions.shape).toEqual([10, 32]);
    expect(ans.json.actions.data.every((v: number) => Number.isFinite(v))).toBe(true);
  });

  it('a real model whose tokenizer is missing: a 503 with the line that says how to get it, not an internal error', async () => {
    const bare = await writeTinyBase('pi0', { dir: path.join(tmp, 'job_no_tokenizer'), tokenizer: false });
    const owner = (await server.store.findApiKey(server.apiKey))!;
    const id = 'ft-notoken01';
    await server.store.insertJob({
      id, owner, status: 'succeeded', created_at: nowS(), config: { model: 'pi0', base: bare, engine_model: realModelKey('pi0', bare), dataset_name: 'g1' },
      step: 3, loss: null, eval_loss: null, error: null, output_dir: bare, started_at: nowS(), finished_at: nowS(), cancel_requested: false,
    });
    const saved = { HF_HOME: process.env.HF_HOME, HF_HUB_CACHE: process.env.HF_HUB_CACHE };
    const empty = fs.mkdtempSync(path.join(tmp, 'hf-'));
    Object.assign(process.env, { HF_HOME: empty, HF_HUB_CACHE: path.join(empty, 'hub') });
    try {
      const ans = await api(server, 'POST', `/v1/fine-tunes/${id}/infer`, { 'observation/state': [0, 1], prompt: 'pick' });
      expect(ans.status).toBe(503);
      expect(ans.json.error).toMatch(/^this server cannot serve the base yet: the PaliGemma tokenizer is not in the Hugging Face cache and .* has no tokenizer of its own \(tokenizer\.json, or the tokenizer\/ folder LeRobot.s processor pipeline saves\): google\/paligemma-3b-pt-224 is gated/);
    } finally {
      for (const [k, v] of Object.entries(saved)) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
    }
  });

  it('sync_inference_weights pushes the session\'s weights into the running base server: it then answers the session\'s sample', async () => {
    const ep = await api(server, 'POST', '/api/v1/add_inference_endpoint', { url: basePolicy.url, api_key: KEY, name: 'robot' });
    expect(ep.json).toMatchObject({ reachable: true });
    const sync = await api(server, 'POST', '/api/v1/sync_inference_weights', { model_id: sessionId });
    expect(sync.status).toBe(200);
    expect(sync.json.endpoints).toEqual([expect.objectContaining({ status: 'ok', weights_version: 3, previous_version: 'base' })]);
    const c = await PolicyClient.connect(`${basePolicy.url}?seed=${SEED}`, { authorization: `Bearer ${KEY}` });
    expect(c.metadata).toMatchObject({ model: 'pi05', cameras: ['cam_high'], weights_version: 3 });
    expect(values((await c.infer(probeObservation())).actions)).toEqual(after);
    c.close();
  });
});
