/**
 * Fine-tune jobs on the real G1 dataset (issue 5): a job that succeeds with a falling loss and
 * held-out evaluation next to its baselines (issue 16: MSE of sampled chunks against holding the
 * state and the mean chunk, per arm and hand), SSE resumption with `from=`, cancel, validation,
 * and a server killed mid-job that resumes the job from its checkpoint.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { log } from '../server/log.ts';
import { api, startTestServer, TEST_KEY, type TestServer } from './helpers/server.ts';
import { g1Datums, g1Subset } from '../bench/harness/g1.ts';
import { PolicyClient } from '../bench/harness/policy-stub.ts';
import { TEST_BACKENDS } from './helpers/tf.ts';
import { readSse } from './helpers/sse.ts';

// The shipped sample's 3 real G1 episodes (2 train, 1 held out), copied to a temp datasets root.
const SUBSET = g1Subset(3);
let server: TestServer;

async function waitFor<T>(fn: () => Promise<T | null | undefined | false>, timeoutMs = 300_000, pollMs = 200): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline) throw new Error('timed out waiting');
    await new Promise((r) => setTimeout(r, pollMs));
  }
}

const finished = (base: { baseUrl: string }, id: string) =>
  waitFor(async () => {
    const { json } = await api(base, 'GET', `/v1/fine-tunes/${id}`);
    return ['succeeded', 'failed', 'cancelled'].includes(json.status) ? json : null;
  });

// Batch 2: the loss still halves over the 60 steps (the falling-loss check asks for a quarter),
// at half of batch 8's step time; no check here depends on the batch size.
const job = (over: Record<string, unknown> = {}) => ({ model: 'flow05-tiny', dataset_name: SUBSET.name, steps: 60, batch_size: 2, learning_rate: 3e-3, eval_every: 30, checkpoint_every: 20, ...over });

// Not datasets: an empty folder and a file, beside the subset (eval_dataset's errors).
const NOT_DATASETS = ['empty-eval', 'file-eval'];
beforeAll(async () => {
  fs.mkdirSync(path.join(SUBSET.root, 'empty-eval'), { recursive: true });
  fs.writeFileSync(path.join(SUBSET.root, 'file-eval'), 'not a dataset');
  server = await startTestServer({ env: { VELA_DATASETS_DIR: SUBSET.root } });
});
afterAll(async () => {
  for (const n of NOT_DATASETS) fs.rmSync(path.join(SUBSET.root, n), { recursive: true, force: true });
  await server.close();
});

describe('fine-tunes on g1_pick_bottle', () => {
  it('validates before any work, with 400s that name what is wrong', async () => {
    const cases: [Record<string, unknown>, RegExp][] = [
      [{ ...job(), model: 'pi9' }, /model must be one of/],
      [{ ...job(), dataset_name: '../etc' }, /plain relative segments/],
      [{ ...job(), dataset_name: '/abs/path' }, /absolute path; the operator has not allowed/],
      [{ ...job(), dataset_name: 'nope/missing' }, /^dataset_name "nope\/missing" not found: no such dataset folder under this server's datasets root/],
      [{ ...job(), cameras: ['wrist'] }, /camera "wrist" is not in the dataset; its cameras are cam_high/],
      [{ ...job(), steps: 0 }, /steps must be an integer in 1..1000000/],
      [{ ...job(), batch_size: 2000 }, /batch_size must be an integer in 1..1024/],
      [{ ...job(), learning_rate: 2 }, /learning_rate must be > 0 and <= 1/],
      [{ ...job(), lr: 1 }, /unknown field "lr"/],
      [{ ...job(), eval_episodes: [0, 7] }, /^eval_episodes must be episodes of the dataset \(episodes 0..2, 3 of them\); not in it, got \[7\]$/],
      [{ ...job(), eval_dataset: 'nope' }, /eval_dataset "nope" not found/],
      // Errors about the second dataset name it, never the training dataset or a server path.
      [{ ...job(), eval_dataset: 'empty-eval' }, /^eval_dataset is not a usable dataset: .*meta\/info\.json.*, got "empty-eval"$/],
      [{ ...job(), eval_dataset: 'file-eval' }, /^eval_dataset is not a usable dataset: .*, got "file-eval"$/],
      [{ ...job(), eval_dataset: SUBSET.name }, /^eval_dataset must be a second dataset, not dataset_name/],
      [{ ...job(), lr_floor: -1 }, /lr_floor must be a number in \[0, 1\], got -1/],
      [{ ...job(), step: 5 }, /^unknown field "step" \(did you mean "steps"\?\)/],
      // LoRA settings on the default full fine-tune, and LoRA that cannot reach pi0.5's zero gates.
      [{ ...job(), lora_rank: 8 }, /^lora_rank applies to finetune "lora" only, got 8: this fine-tune is "full"/],
      [{ ...job(), finetune: 'lora', targets: ['attn'] }, /^targets must include action_expert or all for LoRA on pi0\.5 with seeded base weights/],
    ];
    for (const [body, re] of cases) {
      const { status, json } = await api(server, 'POST', '/v1/fine-tunes', body);
      expect(status, JSON.stringify(body)).toBe(400);
      expect(json.error).toMatch(re);
    }
  });

  it('runs to succeeded with a falling loss, held-out evals beside baselines, and downloadable outputs; SSE resumes with from=', { timeout: 400_000 }, async () => {
    // Decoding the G1 frame for the policy check takes seconds: begun now, it overlaps the training.
    const datumP = g1Datums(1);
    datumP.catch(() => undefined); // awaited below; not an unhandled rejection meanwhile
    const { status, json: created } = await api(server, 'POST', '/v1/fine-tunes', job());
    expect(status).toBe(200);
    // The default on the seeded base is a full fine-tune; the schedule and split settings are echoed.
    expect(created).toMatchObject({ model: 'flow05-tiny', finetune: 'full', steps: 60, eval_fraction: 0.1, eval_stride: 4, warmup_steps: 6, lr_floor: 0.1 });
    // Read part of the stream live, drop it, then resume from the next index.
    const head = await readSse(server, created.id, '', 12);
    const tail = await readSse(server, created.id, `?from=${head.at(-1).index + 1}`);
    const done = await finished(server, created.id);
    expect(done.status).toBe('succeeded');
    const { json: all } = await api(server, 'GET', `/v1/fine-tunes/${created.id}/events`);
    expect([...head, ...tail].map((e) => e.index)).toEqual(all.data.map((e: any) => e.index));
    expect(tail.at(-1)).toMatchObject({ type: 'status', status: 'succeeded' });
    // Last-Event-ID resumes too.
    const res = await fetch(`${server.baseUrl}/v1/fine-tunes/${created.id}/events?stream=true`, { headers: { authorization: `Bearer ${TEST_KEY}`, 'last-event-id': String(all.data.length - 2) } });
    expect((await res.text()).match(/^id: /gm)).toHaveLength(1);

    const progress = all.data.filter((e: any) => e.type === 'progress');
    expect(progress.map((p: any) => p.step)).toEqual(Array.from({ length: 60 }, (_, i) => i + 1));
    const mean = (xs: any[]) => xs.reduce((s, p) => s + p.loss, 0) / xs.length;
    expect(mean(progress.slice(-20))).toBeLessThan(0.75 * mean(progress.slice(0, 20)));
    for (const p of progress) expect(p).toMatchObject({ learning_rate: expect.any(Number), epoch: expect.any(Number), grad_norm: expect.any(Number), elapsed_seconds: expect.any(Number) });
    const evals = progress.filter((p: any) => p.eval_loss !== undefined);
    expect(evals.map((p: any) => p.step)).toEqual([30, 60]);
    for (const e of evals) {
      for (const k of ['eval_loss', 'eval_mse', 'eval_mse_hold_state', 'eval_mse_mean_chunk', 'eval_ratio_hold_state', 'eval_ratio_mean_chunk']) {
        expect(Number.isFinite(e[k]), k).toBe(true);
      }
      expect(e.eval_ratio_hold_state).toBeCloseTo(e.eval_mse / e.eval_mse_hold_state, 12);
      // Held-out episode 1 of the 3 (the seed-0 10% split), every 4th of its 421 frames.
      expect(e.eval_frames).toBe(106);
      expect(e.eval_groups.map((g: any) => [g.group, g.dims.length])).toEqual([['left arm', 7], ['right arm', 7], ['left hand', 6], ['right hand', 6]]);
      expect(e.eval_groups[0].dims[0]).toBe('kLeftShoulderPitch');
      expect(Number.isFinite(e.eval_raw.mse_hold_state)).toBe(true);
    }
    // The same numbers reach a live SSE reader.
    expect(tail.find((x) => x.type === 'progress' && x.step === 60).eval_mse).toBe(evals.at(-1).eval_mse);
    expect(done.eval_loss).toBe(evals.at(-1).eval_loss);

    const { json: files } = await api(server, 'GET', `/v1/fine-tunes/${created.id}/files`);
    expect(files.data.map((f: any) => f.path)).toEqual(['config.json', 'model.safetensors', 'norm_stats.json', 'vela_training.json']);
    for (const f of files.data) {
      const r = await fetch(`${server.baseUrl}/v1/fine-tunes/${created.id}/files/${f.path}`, { headers: { authorization: `Bearer ${TEST_KEY}` } });
      expect(r.headers.get('content-type')).toBe('application/octet-stream');
      const bytes = Buffer.from(await r.arrayBuffer());
      expect(bytes.length).toBe(f.bytes);
      expect(crypto.createHash('sha256').update(bytes).digest('hex')).toBe(f.sha256);
    }
    expect((await api(server, 'GET', `/v1/fine-tunes/${created.id}/files/..%2Fsecret`)).status).toBe(400);
    expect((await api(server, 'GET', `/v1/fine-tunes/${created.id}/files/missing.bin`)).status).toBe(404);
    expect((await api(server, 'POST', `/v1/fine-tunes/${created.id}/cancel`)).status).toBe(409);

    // The finished job serves its policy over OpenPI's protocol, on the real engine.
    const wsUrl = `${server.baseUrl.replace('http', 'ws')}/v1/fine-tunes/${created.id}/policy`;
    await expect(PolicyClient.connect(wsUrl)).rejects.toMatchObject({ status: 401 });
    const robot = await PolicyClient.connect(wsUrl, { authorization: `Api-Key ${TEST_KEY}` });
    expect(robot.metadata).toMatchObject({ action_horizon: 16, action_dim: 26, cameras: ['cam_high'] });
    const datum = (await datumP)[0]!;
    const obs = { 'observation/image': datum.observation.image!.cam_high, 'observation/state': datum.observation.state, prompt: datum.observation.prompt, image_codec: 'JPEG' };
    const a1 = await robot.infer(obs);
    expect(a1.actions.shape).toEqual([16, 26]);
    expect(a1.actions.dtype).toBe('<f4');
    expect(Array.from(a1.actions.data as Float32Array).every(Number.isFinite)).toBe(true);
    expect(a1.policy_timing.infer_ms).toBeGreaterThan(0);
    robot.close();
  });

  it('cancels a queued job at once and a running job within one step; the server log follows both', { timeout: 300_000 }, async () => {
    // The operator's view: the server log at its default level (info), read off stderr.
    const lines: string[] = [];
    const write = process.stderr.write.bind(process.stderr);
    const spy = vi.spyOn(process.stderr, 'write').mockImplementation((chunk: any, ...rest: any[]) => {
      lines.push(String(chunk));
      return write(chunk, ...rest);
    });
    log.setLevel('info');
    const t0 = performance.now();
    try {
      const { json: a } = await api(server, 'POST', '/v1/fine-tunes', job({ steps: 1000, eval_every: 0 }));
      const { json: b } = await api(server, 'POST', '/v1/fine-tunes', job({ steps: 5 }));
      const cb = await api(server, 'POST', `/v1/fine-tunes/${b.id}/cancel`);
      expect(cb.json.status).toBe('cancelled');
      await waitFor(async () => (await api(server, 'GET', `/v1/fine-tunes/${a.id}`)).json.step >= 3);
      // The one node's view lists the job it is running (it listed none), and when it started.
      const { json: nodes } = await api(server, 'GET', '/v1/nodes');
      expect(nodes.data).toHaveLength(1);
      expect(nodes.data[0]).toMatchObject({ id: 'local', status: 'up', running_jobs: [a.id], self: true, load: { jobs: 1 } });
      expect(nodes.data[0].started_at).toBeGreaterThan(Date.now() / 1000 - 3600);
      const stepAtCancel = (await api(server, 'POST', `/v1/fine-tunes/${a.id}/cancel`)).json.step;
      const done = await finished(server, a.id);
      expect(done.status).toBe('cancelled');
      expect(done.step).toBeLessThanOrEqual(stepAtCancel + 1);
      const { json: ev } = await api(server, 'GET', `/v1/fine-tunes/${a.id}/events`);
      expect(ev.data.at(-1)).toMatchObject({ type: 'status', status: 'cancelled' });
      expect(fs.existsSync(done.output_dir)).toBe(false); // no final weights
      // One line per status, the first step's progress (then at most one every 30 s), no job log lines.
      const about = (id: string) => lines.filter((l) => l.includes(`job ${id}`)).map((l) => l.replace(/^\S+ /, '').trimEnd());
      expect(about(b.id)).toEqual([`info  job ${b.id} queued`, `info  job ${b.id} cancelled before it started`]);
      const ofA = about(a.id);
      expect(ofA.slice(0, 2)).toEqual([`info  job ${a.id} queued`, `info  job ${a.id} running (flow05-tiny, 1000 steps on ${SUBSET.name})`]);
      expect(ofA[2]).toMatch(new RegExp(`^info  job ${a.id}: step 1/1000 loss \\d+\\.\\d{4}$`));
      expect(ofA.at(-1)).toBe(`info  job ${a.id} cancelled at step ${done.step}`);
      expect(ofA.filter((l) => l.includes(': step ')).length).toBeLessThanOrEqual(1 + Math.floor((performance.now() - t0) / 30_000));
    } finally {
      spy.mockRestore();
      log.setLevel(process.env.VELA_TEST_LOG ?? 'error');
    }
  });
});

describe('a server killed mid-job', () => {
  // One episode: the fresh server decodes the frames it trains on (seconds an episode), twice here.
  const ONE = g1Subset(1);
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-kill-'));
  let child: ChildProcess | null = null;
  const port = 20000 + Math.floor(Math.random() * 20000);
  const base = { baseUrl: `http://127.0.0.1:${port}` };
  const startChild = async () => {
    child = spawn(process.execPath, ['bin/vela.js', 'serve'], {
      env: { ...process.env, VELA_PORT: String(port), VELA_DATA_DIR: dataDir, VELA_API_KEY: TEST_KEY, VELA_DATASETS_DIR: ONE.root, VELA_BACKEND: TEST_BACKENDS[0]!, VELA_LOG_LEVEL: 'warn' },
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    await waitFor(async () => (await fetch(`${base.baseUrl}/healthz`).catch(() => null))?.ok, 60_000);
  };
  afterAll(() => child?.kill('SIGKILL'));

  it('resumes the job from its last checkpoint and finishes it, the events continuing', { timeout: 300_000 }, async () => {
    await startChild();
    const { json: j } = await api(base, 'POST', '/v1/fine-tunes', job({ dataset_name: ONE.name, steps: 30, checkpoint_every: 5, eval_every: 0, eval_fraction: 0 }));
    await waitFor(async () => (await api(base, 'GET', `/v1/fine-tunes/${j.id}`)).json.step >= 12);
    child!.kill('SIGKILL');
    await new Promise((r) => child!.once('exit', r));
    await startChild();
    const done = await finished(base, j.id);
    expect(done.status).toBe('succeeded');
    const { json: ev } = await api(base, 'GET', `/v1/fine-tunes/${j.id}/events`);
    const indices = ev.data.map((e: any) => e.index);
    expect(indices).toEqual(Array.from({ length: indices.length }, (_, i) => i));
    const resumed = ev.data.find((e: any) => e.type === 'log' && /resumed from the checkpoint at step (\d+)/.test(e.message));
    const from = Number(/step (\d+)/.exec(resumed.message)![1]);
    expect(from).toBeGreaterThanOrEqual(10);
    expect(from % 5).toBe(0);
    const after = ev.data.filter((e: any) => e.type === 'progress' && e.index > resumed.index).map((e: any) => e.step);
    expect(after).toEqual(Array.from({ length: 30 - from }, (_, i) => from + 1 + i));
  });
});
