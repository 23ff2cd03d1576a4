/**
 * A real fine-tune's output served as a base (issue 24): a LoRA job on G1 trained with
 * action_space "delta" writes model_dir (Hub layout + norm_stats.json + vela_dataset.json).
 * `vela policy --base <model_dir>` must answer what the job's own policy (`vela policy
 * <output_dir>`) answers for the same observation and seed: the dataset's cameras, names and
 * absolute actions (the state added back on the delta dims), not deltas read as positions.
 * Both run in their own process on wasm. Also: a base whose config.json `type` and
 * `vela_real_pi_config.variant` disagree is refused naming both fields; a --cameras that does
 * not fit the fine-tuned cameras is refused before any load.
 */
import type { ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Datum } from '../protocol/client.ts';
import { g1Datums, g1Subset } from '../bench/harness/g1.ts';
import { PolicyClient } from '../bench/harness/policy-stub.ts';
import { realModelKey } from '../server/engine/model-key.ts';
import { nowS } from '../server/store/store.ts';
import { writeTinyBase } from './helpers/real-pi-base.ts';
import { startPolicyProc } from './helpers/policy-proc.ts';
import { api, startTestServer, type TestServer } from './helpers/server.ts';

const SEED = 7;

let tmp: string;
let server: TestServer;
const procs: ChildProcess[] = [];

beforeAll(async () => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-ft-base-'));
  server = await startTestServer({ env: { VELA_DATASETS_DIR: g1Subset(2, path.join(tmp, 'datasets')).root, VELA_BACKEND: 'wasm' } });
}, 120_000);

afterAll(async () => {
  for (const p of procs) p.kill('SIGTERM');
  await server?.close();
  if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
});


const startPolicy = (args: string[]): Promise<string> => startPolicyProc(args).then((p) => (procs.push(p.proc), p.url));

async function finished(id: string): Promise<Record<string, any>> {
  for (const deadline = Date.now() + 240_000; Date.now() < deadline; await new Promise((r) => setTimeout(r, 250))) {
    const { json } = await api(server, 'GET', `/v1/fine-tunes/${id}`);
    if (['succeeded', 'failed', 'cancelled'].includes(json.status)) return json;
  }
  throw new Error(`fine-tune ${id} did not finish`);
}

/** The metadata and the first seeded answer of a policy server for `obs`. */
async function ask(url: string, obs: Record<string, unknown>): Promise<{ metadata: any; actions: number[]; shape: number[] }> {
  const c = await PolicyClient.connect(`${url}?seed=${SEED}`);
  try {
    const a = (await c.infer(obs)).actions;
    return { metadata: c.metadata, actions: Array.from(a.data as Float32Array), shape: a.shape };
  } finally {
    c.close();
  }
}

describe('a delta-trained fine-tune\'s model_dir served with --base', () => {
  let job: Record<string, any>;
  let probe: Datum;
  let obs: Record<string, unknown>;
  /** The job's own policy's seeded answer to `obs`. */
  let own: { metadata: any; actions: number[]; shape: number[] };

  beforeAll(async () => {
    const base = await writeTinyBase('pi05', { dir: path.join(tmp, 'tiny_pi05_base') });
    const created = await api(server, 'POST', '/v1/fine-tunes', { model: 'pi05', base, dataset_name: 'g1_subset', action_space: 'delta', steps: 4, batch_size: 2, eval_every: 0, checkpoint_every: 4, seed: 3 });
    expect(created.status, JSON.stringify(created.json)).toBe(200);
    job = await finished(created.json.id);
    expect(job.status, job.error).toBe('succeeded');
    probe = (await g1Datums(1, { horizon: 10 }))[0]!;
  }, 300_000);

  it('answers what the job\'s own policy answers: cameras, names, delta -> absolute, for the same seed', { timeout: 240_000 }, async () => {
    const dataset = JSON.parse(fs.readFileSync(path.join(job.model_dir, 'vela_dataset.json'), 'utf8'));
    expect(dataset).toMatchObject({ action_space: 'delta', cameras: ['cam_high'] });
    const [ownUrl, asBase] = await Promise.all([startPolicy([job.output_dir, '--seed', String(SEED)]), startPolicy(['--base', job.model_dir, '--seed', String(SEED)])]);
    const o = probe.observation;
    obs = { 'observation/cam_high': o.image!.cam_high, image_codec: 'JPEG', 'observation/state': o.state, prompt: o.prompt };
    const a = (own = await ask(ownUrl, obs));
    const b = await ask(asBase, obs);

    expect(a.metadata).toMatchObject({ model: 'pi05', action_space: 'delta', cameras: ['cam_high'], action_dim: 26, state_dim: 26, action_horizon: 10 });
    for (const k of ['model', 'action_space', 'cameras', 'action_dim', 'state_dim', 'action_horizon', 'state_names', 'action_names', 'observation_keys', 'answer_keys']) {
      expect(b.metadata[k], k).toEqual(a.metadata[k]);
    }
    expect(b.metadata.state_names).toEqual(dataset.state_names);
    expect(b.shape).toEqual([10, 26]);
    expect(b.shape).toEqual(a.shape);
    // The merged weights (W + scale * A B^T) against the adapters applied at run time: float32 rounding only.
    const worst = Math.max(...a.actions.map((v, i) => Math.abs(v - b.actions[i]!)));
    expect(worst).toBeLessThan(1e-5);
  });

  it('its norm stats are read as the job made them (the family\'s transform), whatever normalization_mapping config.json copied from the base', { timeout: 120_000 }, async () => {
    expect(own, 'the first test ran').toBeDefined();
    const copy = path.join(tmp, 'model_mean_std');
    fs.cpSync(job.model_dir, copy, { recursive: true });
    const cfgFile = path.join(copy, 'config.json');
    // A base fine-tuned by LeRobot with MEAN_STD would pass this on; the job's stats are pi0.5's quantiles all the same.
    fs.writeFileSync(cfgFile, JSON.stringify({ ...JSON.parse(fs.readFileSync(cfgFile, 'utf8')), normalization_mapping: { VISUAL: 'IDENTITY', STATE: 'MEAN_STD', ACTION: 'MEAN_STD' } }));
    const b = await ask(await startPolicy(['--base', copy, '--seed', String(SEED)]), obs);
    expect(Math.max(...own.actions.map((v, i) => Math.abs(v - b.actions[i]!)))).toBeLessThan(1e-5);
  });

  it('the main server serves a model_dir as the job\'s own policy too (POST /v1/fine-tunes/{id}/infer, same seed)', { timeout: 180_000 }, async () => {
    const owner = (await server.store.findApiKey(server.apiKey))!;
    // A job row whose output is the model_dir (a Hub-layout folder), beside the real job whose output is weights/final.
    const id = 'ft-modeldir01';
    await server.store.insertJob({
      id, owner, status: 'succeeded', created_at: nowS(), config: { model: 'pi05', base: job.model_dir, engine_model: realModelKey('pi05', job.model_dir), dataset_name: 'g1_subset' },
      step: 4, loss: null, eval_loss: null, error: null, output_dir: job.model_dir, started_at: nowS(), finished_at: nowS(), cancel_requested: false,
    });
    const o = probe.observation;
    const body = { 'observation/cam_high': Buffer.from(o.image!.cam_high as Uint8Array).toString('base64'), image_codec: 'JPEG', 'observation/state': Array.from(o.state!.data as Float32Array), prompt: o.prompt, seed: 11 };
    const mine = await api(server, 'POST', `/v1/fine-tunes/${job.id}/infer`, body);
    const asBase = await api(server, 'POST', `/v1/fine-tunes/${id}/infer`, body);
    expect(mine.status, JSON.stringify(mine.json)).toBe(200);
    expect(asBase.status, JSON.stringify(asBase.json)).toBe(200);
    expect(asBase.json.actions.shape).toEqual([10, 26]);
    const x = mine.json.actions.data as number[];
    const y = asBase.json.actions.data as number[];
    expect(x.length).toBe(260);
    expect(Math.max(...x.map((v, i) => Math.abs(v - y[i]!)))).toBeLessThan(1e-5);
  });

  it('--cameras must name as many cameras as the model was fine-tuned on: refused before any load', { timeout: 60_000 }, async () => {
    const e = await startPolicy(['--base', job.model_dir, '--cameras', 'front,wrist']).then(() => null, (x) => x);
    expect(e?.code).toBe(1);
    expect(e.stderr).toContain('--cameras front,wrist: the model was fine-tuned on 1 camera (vela_dataset.json cameras ["cam_high"]); give 1 name, in that order, or drop --cameras');
  });
});

describe('a base whose type and vela_real_pi_config disagree', () => {
  it('is refused naming both fields', { timeout: 60_000 }, async () => {
    const dir = await writeTinyBase('pi05', { dir: path.join(tmp, 'type_pi0_cfg_pi05') });
    const cfgFile = path.join(dir, 'config.json');
    fs.writeFileSync(cfgFile, JSON.stringify({ ...JSON.parse(fs.readFileSync(cfgFile, 'utf8')), type: 'pi0' }));
    const e = await startPolicy(['--base', dir]).then(() => null, (x) => x);
    expect(e?.code).toBe(1);
    expect(e.stderr).toContain(`${cfgFile}: "type" is "pi0" but "vela_real_pi_config.variant" is "pi05"; make the two fields agree`);
    expect(e.stderr).not.toContain('was asked for');

    // A pi0 checkpoint trained on it (its base_checkpoint): the same two fields named, not "pi0 was asked for".
    const ck = path.join(tmp, 'ck_on_bad_base');
    fs.mkdirSync(ck);
    fs.writeFileSync(path.join(ck, 'config.json'), JSON.stringify({ preset: 'pi0', base_checkpoint: dir, cameras: ['cam_high'] }));
    const f = await startPolicy([ck]).then(() => null, (x) => x);
    expect(f?.code).toBe(1);
    expect(f.stderr).toContain(`${cfgFile}: "type" is "pi0" but "vela_real_pi_config.variant" is "pi05"; make the two fields agree`);

    // A consistent pi05 base under a pi0 checkpoint: the checkpoint's field and the base's, named.
    const good = await writeTinyBase('pi05', { dir: path.join(tmp, 'good_pi05') });
    fs.writeFileSync(path.join(ck, 'config.json'), JSON.stringify({ preset: 'pi0', base_checkpoint: good, cameras: ['cam_high'] }));
    const g = await startPolicy([ck]).then(() => null, (x) => x);
    expect(g?.code).toBe(1);
    expect(g.stderr).toContain(`${path.join(ck, 'config.json')} "preset" is "pi0" but its base's ${path.join(good, 'config.json')} "vela_real_pi_config.variant" is "pi05": serve it on a pi0 base (--base), or fix the field`);
  });
});
