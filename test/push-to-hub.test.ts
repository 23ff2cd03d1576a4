/**
 * A job's `push_to_hub` (issue 35 item 6): once it succeeded, the job uploads its model to a Hub
 * model repo with the server's write token, and its events say so before its terminal status.
 * Through the real server (REST, the jobs runner, the real engine) against the fake Hub on
 * 127.0.0.1 (test/helpers/fake-hub.ts), which keeps what it was sent. The card's Training section
 * comes from the `vela_training.json` the job leaves beside its model, so `vela models upload` of
 * that folder later writes the same one.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import os from 'node:os';
import { startFakeHub, type FakeHub } from './helpers/fake-hub.ts';
import { startPolicyProc } from './helpers/policy-proc.ts';
import { PolicyClient } from '../bench/harness/policy-stub.ts';
import { runPythonJson } from './helpers/python.ts';
import { missing, pythonEnv } from './helpers/requires.ts';
import { g1Subset } from '../bench/harness/g1.ts';
import { api, startTestServer, type TestServer } from './helpers/server.ts';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const REPO = 'lab/g1-flow0-tiny';
const saved = { token: process.env.HF_TOKEN, endpoint: process.env.HF_ENDPOINT };
let hub: FakeHub;
let server: TestServer;
const subset = g1Subset(2);

beforeAll(async () => {
  hub = await startFakeHub({ models: [], readOnly: new Set(['someone/else']) });
  process.env.HF_ENDPOINT = hub.url;
  server = await startTestServer({ env: { VELA_DATASETS_DIR: subset.root } });
}, 120_000);
afterAll(async () => {
  await server?.close();
  await hub?.close();
  for (const [k, v] of [['HF_TOKEN', saved.token], ['HF_ENDPOINT', saved.endpoint]] as const) {
    if (v === undefined) delete process.env[k];
    else process.env[k] = v;
  }
});

/** `vela ARGS` as a child process (async: this process's server keeps answering meanwhile). */
function vela(args: string[], env: Record<string, string>): Promise<{ code: number | null; stderr: string }> {
  const child = spawn(process.execPath, [path.join(ROOT, 'bin/vela.js'), ...args], { cwd: ROOT, env: { ...process.env, ...env }, stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  return new Promise((resolve) => child.on('close', (code) => resolve({ code, stderr })));
}

async function finished(id: string): Promise<any> {
  for (let i = 0; i < 1500; i++) {
    const j = (await api(server, 'GET', `/v1/fine-tunes/${id}`)).json;
    if (['succeeded', 'failed', 'cancelled'].includes(j.status)) return j;
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`job ${id} did not finish`);
}

describe('POST /v1/fine-tunes with push_to_hub', () => {
  const body = { model: 'flow0-tiny', dataset_name: subset.name, steps: 2, batch_size: 2, eval_fraction: 0 }; // nothing held out: no evaluation to wait for

  it('refuses a bad repo id, and any push without a write token on the server, before anything runs', async () => {
    delete process.env.HF_TOKEN;
    const bad = await api(server, 'POST', '/v1/fine-tunes', { ...body, push_to_hub: 'no-namespace' });
    expect(bad.status).toBe(400);
    expect(bad.json.error).toMatch(/^push_to_hub must be a Hub model repo "namespace\/name"/);
    const noToken = await api(server, 'POST', '/v1/fine-tunes', { ...body, push_to_hub: REPO });
    expect(noToken.status).toBe(400);
    expect(noToken.json.error).toMatch(/^push_to_hub needs a Hub write token on this server.*HF_TOKEN.*vela models upload/);
    expect((await api(server, 'GET', '/v1/fine-tunes')).json.data).toEqual([]);
  });

  it('uploads the succeeded job\'s model: every file byte-equal, a model card, and its events say the commit before the end', async () => {
    process.env.HF_TOKEN = 'hf_vela_test_write_token';
    // One of the two episodes held out (every 100th frame scored): the card carries its numbers.
    const { status, json: job } = await api(server, 'POST', '/v1/fine-tunes', { ...body, eval_fraction: 0.5, eval_stride: 100, push_to_hub: REPO });
    expect(status, JSON.stringify(job)).toBe(200);
    expect(job.config?.push_to_hub ?? job.push_to_hub).toBe(REPO);
    const done = await finished(job.id);
    expect(done.status, done.error).toBe('succeeded');
    const events = (await api(server, 'GET', `/v1/fine-tunes/${job.id}/events`)).json.data as any[];
    const push = events.filter((e) => e.stage === 'push');
    expect(push.map((e) => e.message)).toEqual([`uploading the model to the Hub repo ${REPO}`, expect.stringMatching(new RegExp(`^uploaded to ${REPO} at commit [0-9a-f]{40}: \\d+ files$`))]);
    expect(push[1].commit).toBe(hub.commitOf(REPO));
    // The terminal status comes after the upload's record.
    expect(events.indexOf(push[1])).toBeLessThan(events.length - 1);
    expect(events.at(-1)).toMatchObject({ type: 'status', status: 'succeeded' });

    const held = hub.filesOf(REPO);
    const listing = (await api(server, 'GET', `/v1/fine-tunes/${job.id}/files`)).json.data as { path: string; bytes: number }[];
    expect(listing.length).toBeGreaterThan(0);
    // Buffer.equals, not toEqual: a deep comparison of a 7 MB buffer takes vitest tens of seconds.
    for (const f of listing) expect(held.get(f.path)?.equals(fs.readFileSync(path.join(done.output_dir ?? job.output_dir, f.path))), f.path).toBe(true);
    // The card: the recipe as the server ran it, and the last held-out evaluation's own numbers.
    const card = held.get('README.md')!.toString();
    const last = events.filter((e) => e.type === 'progress' && e.eval_mse !== undefined).at(-1);
    const p4 = (v: number) => String(Number(v.toPrecision(4)));
    expect(card).toContain(`Fine-tuned by the Vela job ${job.id}:`);
    expect(card).toContain(`- model: flow0-tiny; dataset: ${subset.name}; held out: a seeded 0.5 of the episodes`);
    expect(card).toMatch(/- recipe: full, 2 steps, batch 2, learning rate [0-9.e-]+ \(warm-up 1, cosine to [0-9.]+x\)/);
    expect(card).toContain(`- held-out evaluation at step 2: eval_mse ${p4(last.eval_mse)} (normalised), ${p4(last.eval_ratio_hold_state)}x the hold-the-state baseline, ${p4(last.eval_ratio_mean_chunk)}x the mean-chunk baseline, on ${last.eval_frames} frames`);

    // The folder keeps the record the card was written from: `vela models upload` of it later
    // writes the same Training section (the title names the new repo).
    const record = JSON.parse(fs.readFileSync(path.join(done.output_dir, 'vela_training.json'), 'utf8'));
    expect(record).toMatchObject({ job_id: job.id, model: 'flow0-tiny', base: null, dataset_name: subset.name, held_out: 'a seeded 0.5 of the episodes' });
    expect(record.recipe).toMatchObject({ finetune: 'full', steps: 2, batch_size: 2, lora_rank: null });
    expect(record.held_out_eval).toEqual({ step: 2, eval_mse: last.eval_mse, eval_ratio_hold_state: last.eval_ratio_hold_state, eval_ratio_mean_chunk: last.eval_ratio_mean_chunk, eval_frames: last.eval_frames });
    const again = await vela(['models', 'upload', done.output_dir, 'lab/again'], { HF_TOKEN: 'hf_vela_test_write_token', HF_ENDPOINT: hub.url });
    expect(again.code, again.stderr).toBe(0);
    const cardAgain = hub.filesOf('lab/again').get('README.md')!.toString();
    const training = (c: string) => c.slice(c.indexOf('## Training'));
    expect(training(card)).toContain(`Fine-tuned by the Vela job ${job.id}:`);
    expect(training(cardAgain)).toBe(training(card));
    expect(cardAgain).toContain('# lab/again');

    // What Python's huggingface_hub downloads of the repo is served by `vela policy` again.
    if (missing('huggingface_hub (the test virtualenv)', pythonEnv().reason)) return;
    const cache = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-push-hf-'));
    try {
      const { snapshot } = await runPythonJson('hf_cache_check.py', ['download', hub.url, cache, REPO], 120_000);
      for (const f of listing) expect(fs.readFileSync(path.join(snapshot, f.path)).equals(held.get(f.path)!), f.path).toBe(true);
      const served = await startPolicyProc([snapshot]);
      try {
        const robot = await PolicyClient.connect(served.url);
        expect(robot.metadata).toMatchObject({ model: 'flow0-tiny', ready: true });
        robot.close();
      } finally {
        served.proc.kill('SIGTERM');
      }
    } finally {
      fs.rmSync(cache, { recursive: true, force: true });
    }
  }, 300_000);

  it('a push the Hub refuses (403) is a log record with the reason; the job still succeeds', async () => {
    process.env.HF_TOKEN = 'hf_vela_test_write_token';
    const { json: job } = await api(server, 'POST', '/v1/fine-tunes', { ...body, push_to_hub: 'someone/else' });
    const done = await finished(job.id);
    expect(done.status).toBe('succeeded');
    const events = (await api(server, 'GET', `/v1/fine-tunes/${job.id}/events`)).json.data as any[];
    const failed = events.find((e) => e.stage === 'push' && e.error);
    expect(failed?.message).toMatch(/^the upload to someone\/else failed: .*; the model stays on the server \(vela models upload sends it again\)$/);
  }, 300_000);
});
