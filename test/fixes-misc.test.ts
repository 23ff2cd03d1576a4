/**
 * Small findings of issue 24's fresh user and breaker, each through the real server (uWS + engine
 * worker) where it is a route: a real model's prompt over its token limit is refused, not cut (the
 * cut dropped pi0.5's state); LoRA alpha is bounded (1e308 made every output NaN); a fine-tune's
 * base of the other variant is a 400 at submission; no job JSON shows the server's engine_model;
 * policy latency buckets reach the full-size model's 10-50 s; `vela models inspect` says what
 * serving without norm stats does and where the tokenizer comes from.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { VelaClient } from '../protocol/client.ts';
import { g1Datums, g1Subset } from '../bench/harness/g1.ts';
import { startPolicyProc } from './helpers/policy-proc.ts';
import { writeTinyBase } from './helpers/real-pi-base.ts';
import { api, startTestServer, type TestServer } from './helpers/server.ts';
import { FuturesClient } from './helpers/futures-client.ts';
import { PolicyClient } from '../bench/harness/policy-stub.ts';
import { PolicyConnectionMetrics } from '../server/metrics/policy.ts';
import { metricsText } from '../server/metrics/registry.ts';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const g1 = g1Subset(2);
let server: TestServer;
let client: VelaClient;
const bases: Record<'pi0' | 'pi05', string> = { pi0: '', pi05: '' };

beforeAll(async () => {
  server = await startTestServer({ env: { VELA_DATASETS_DIR: g1.root } });
  client = new VelaClient(server.baseUrl, server.apiKey);
  bases.pi0 = await writeTinyBase('pi0');
  bases.pi05 = await writeTinyBase('pi05');
}, 60_000);
afterAll(async () => {
  await server?.close();
  fs.rmSync(g1.root, { recursive: true, force: true });
});

// 1000 bytes of ordinary words: under the 1024-byte prompt limit, far over 200 tokens.
const LONG_TASK = 'pick up the red bottle and place it '.repeat(28).slice(0, 1000);

describe('a real model\'s prompt over its token limit', () => {
  for (const [variant, limit] of [['pi05', 200], ['pi0', 48]] as const) {
    it(`${variant}: refused per request naming the token count and the limit; the session goes on`, { timeout: 120_000 }, async () => {
      expect(Buffer.byteLength(LONG_TASK)).toBe(1000);
      const s = await client.waitReady((await client.createSession({ base_model: variant, base: bases[variant] })).id);
      const conn = await client.connect(s);
      const data = await g1Datums(1, { episode: 0, horizon: 10 });
      const long = [{ ...data[0]!, observation: { ...data[0]!.observation, prompt: LONG_TASK } }];
      const withState = variant === 'pi05' ? ' with its state' : '';
      const err = await conn.sample(long, { codec: 'JPEG', seed: 1 }).then(() => null, (e: Error) => e);
      expect(err?.message).toMatch(new RegExp(`^prompt is (\\d+) tokens${withState}.*; ${variant}'s limit is ${limit} \\(max_token_len\\): shorten the task$`));
      const n = Number(/prompt is (\d+) tokens/.exec(err!.message)![1]);
      expect(n).toBeGreaterThan(limit);
      expect((err as Error & { code?: string }).code ?? 'too_large').toBe('too_large');
      await expect(conn.forwardBackward(long, { codec: 'JPEG' })).rejects.toThrow(/shorten the task/);
      // The same session answers the next request.
      const ok = await conn.sample(data, { codec: 'JPEG', seed: 1 });
      expect(ok.actions.shape).toEqual([1, 10, 32]);
      conn.close();
      await client.closeSession(s.id);
    });
  }
});

describe('vela policy on a real base, a prompt over the token limit', () => {
  it('answers that request an error frame naming the count and the limit; other connections go on', { timeout: 120_000 }, async () => {
    const { url, proc } = await startPolicyProc(['--base', bases.pi05, '--cameras', 'cam_high']);
    try {
      const d = (await g1Datums(1, { episode: 0, horizon: 10 }))[0]!.observation;
      const obs = (prompt: string) => ({ 'observation/cam_high': d.image!.cam_high, image_codec: 'JPEG', 'observation/state': d.state, prompt });
      const other = await PolicyClient.connect(url);
      const bad = await PolicyClient.connect(url);
      const err = await bad.infer(obs(LONG_TASK)).then(() => null, (e: Error) => e);
      expect(err?.message).toMatch(/^Error in inference server:\nprompt is \d+ tokens with its state .*; pi05's limit is 200 \(max_token_len\): shorten the task$/);
      expect((await other.infer(obs(d.prompt as string))).actions.shape).toEqual([10, 32]);
      other.close();
      bad.close();
    } finally {
      proc.kill('SIGTERM');
    }
  });
});

describe('LoRA alpha is bounded (alpha / rank scales the adapter output)', () => {
  it('sessions, fine-tunes and xorl lora_config answer 400 naming the field and the limit', async () => {
    const session = await api(server, 'POST', '/v1/training_sessions', { base_model: 'flow05-tiny', alpha: 1e308 });
    expect(session.status).toBe(400);
    expect(session.json.error).toMatch(/^alpha must be <= 65536 \(alpha \/ rank scales the adapter's output: .*NaN\), got 1e\+308$/);
    const job = await api(server, 'POST', '/v1/fine-tunes', { model: 'flow05-tiny', dataset_name: g1.name, finetune: 'lora', lora_alpha: 1e308 });
    expect(job.status).toBe(400);
    expect(job.json.error).toMatch(/^lora_alpha must be <= 65536 \(alpha \/ rank scales/);
    const xorl = await new FuturesClient(server.baseUrl, server.apiKey).raw('POST', 'create_model', { base_model: 'flow05-tiny', model_id: 'big-alpha', lora_config: { rank: 8, alpha: 1e308 } });
    expect(xorl.status).toBe(400);
    expect(xorl.body.error).toMatch(/^alpha must be <= 65536/);
    // The bound itself is accepted.
    const edge = await api(server, 'POST', '/v1/training_sessions', { base_model: 'flow05-tiny', alpha: 65536 });
    expect(edge.status, JSON.stringify(edge.json)).toBe(200);
    await api(server, 'DELETE', `/v1/training_sessions/${edge.json.id}`);
  });
});

describe('fine-tunes of the real models at submission', () => {
  it('a pi0 base given as model pi05 is a 400 naming both', async () => {
    const r = await api(server, 'POST', '/v1/fine-tunes', { model: 'pi05', base: bases.pi0, dataset_name: g1.name, steps: 2 });
    expect(r.status).toBe(400);
    expect(r.json.error).toBe(`base ${bases.pi0} is a pi0 checkpoint and model is pi05: use model "pi0" with this base, or a pi05 base (e.g. lerobot/pi05_base)`);
  });

  it('a missing base folder is one "base ..." line, not "base: base ..."', async () => {
    const r = await api(server, 'POST', '/v1/fine-tunes', { model: 'pi05', base: '/nonexistent/base-folder', dataset_name: g1.name });
    expect(r.status).toBe(400);
    expect(r.json.error).toMatch(/^base \/nonexistent\/base-folder: no such folder/);
  });

  it('a dataset whose task is over the token limit: the job fails at its first step naming the prompt\'s tokens and the limit', { timeout: 180_000 }, async () => {
    const long = g1Subset(2, g1.root, 'g1_long_task');
    const tasks = fs.readFileSync(path.join(long.dir, 'meta', 'tasks.jsonl'), 'utf8').split('\n').filter((l) => l.trim());
    fs.writeFileSync(path.join(long.dir, 'meta', 'tasks.jsonl'), tasks.map((l) => JSON.stringify({ ...JSON.parse(l), task: LONG_TASK })).join('\n') + '\n');
    const created = await api(server, 'POST', '/v1/fine-tunes', { model: 'pi05', base: bases.pi05, dataset_name: long.name, steps: 2, batch_size: 2 });
    expect(created.status, JSON.stringify(created.json)).toBe(200);
    let job: any;
    for (const t0 = Date.now(); Date.now() - t0 < 170_000; await new Promise((r) => setTimeout(r, 200))) {
      job = (await api(server, 'GET', `/v1/fine-tunes/${created.json.id}`)).json;
      if (['succeeded', 'failed', 'cancelled'].includes(job.status)) break;
    }
    expect(job.status).toBe('failed');
    expect(job.error).toMatch(/prompt is \d+ tokens with its state .*; pi05's limit is 200 \(max_token_len\): shorten the task/);
    expect(job.step).toBe(0);
  });

  it('no job JSON (create, get, list, cancel) shows engine_model, the server\'s folder', { timeout: 120_000 }, async () => {
    const created = await api(server, 'POST', '/v1/fine-tunes', { model: 'pi05', base: bases.pi05, dataset_name: g1.name, steps: 50, batch_size: 2 });
    expect(created.status, JSON.stringify(created.json)).toBe(200);
    const id = created.json.id as string;
    expect(created.json).toMatchObject({ model: 'pi05', base: bases.pi05 });
    const got = await api(server, 'GET', `/v1/fine-tunes/${id}`);
    const list = await api(server, 'GET', '/v1/fine-tunes');
    const cancelled = await api(server, 'POST', `/v1/fine-tunes/${id}/cancel`);
    const events = await api(server, 'GET', `/v1/fine-tunes/${id}/events`);
    for (const body of [created.json, got.json, list.json, cancelled.json, events.json]) {
      expect(JSON.stringify(body)).not.toContain('engine_model');
      expect(JSON.stringify(body)).not.toContain('pi05@');
    }
    expect(list.json.data.map((j: { id: string }) => j.id)).toContain(id);
  });
});

describe('policy latency buckets', () => {
  it('vela_policy_request_seconds reaches 120 s (the full-size model takes 10-50 s)', async () => {
    const m = new PolicyConnectionMetrics('test-policy');
    m.answered({ decodeMs: 1, queueMs: 1, computeMs: 25_000, sendMs: 1, totalMs: 25_003, batchSize: 1 });
    m.close();
    const text = await metricsText();
    const bucket = (le: string) => Number(new RegExp(`^vela_policy_request_seconds_bucket\\{le="${le}",stage="compute"\\} (\\d+)$`, 'm').exec(text)?.[1]);
    expect(bucket('10')).toBe(0);
    expect(bucket('20')).toBe(0);
    expect(bucket('30')).toBe(1);
    expect(bucket('60')).toBe(1);
    expect(bucket('120')).toBe(1);
  });
});

describe('vela models inspect', () => {
  const run = (args: string[], env: Record<string, string>) => {
    const base = { ...process.env };
    for (const k of ['HF_HOME', 'HF_HUB_CACHE', 'HF_TOKEN', 'HF_ENDPOINT', 'XDG_CACHE_HOME']) delete base[k];
    const child = spawn(process.execPath, [path.join(ROOT, 'bin/vela.js'), ...args], { cwd: ROOT, env: { ...base, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    return new Promise<{ code: number | null; stdout: string }>((resolve) => child.once('close', (code) => resolve({ code, stdout })));
  };

  it('says serving without norm stats runs unnormalised, and where the tokenizer comes from', { timeout: 60_000 }, async () => {
    const home = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-hf-empty-'));
    const bare = await writeTinyBase('pi05', { tokenizer: false });
    const own = await run(['models', 'inspect', bases.pi05], { HF_HOME: home });
    expect(own.code).toBe(0);
    expect(own.stdout).toContain('norm stats  none (a fine-tune computes its dataset\'s; serving this base as it is runs unnormalised, with a warning)');
    expect(own.stdout).toContain('tokenizer   tokenizer.json in the folder');
    const none = await run(['models', 'inspect', bare], { HF_HOME: home });
    expect(none.code).toBe(0);
    expect(none.stdout).toMatch(/tokenizer {3}none in the folder, nor PaliGemma's in the Hugging Face cache: serving and training refuse without one; google\/paligemma-3b-pt-224 is gated/);
    // PaliGemma's tokenizer in the cache is found as serving finds it.
    const snap = path.join(home, 'hub', 'models--google--paligemma-3b-pt-224', 'snapshots', 'abc');
    fs.mkdirSync(snap, { recursive: true });
    fs.copyFileSync(path.join(bases.pi05, 'tokenizer.json'), path.join(snap, 'tokenizer.json'));
    const cached = await run(['models', 'inspect', bare], { HF_HOME: home });
    expect(cached.stdout).toContain(`tokenizer   none in the folder; PaliGemma's from the Hugging Face cache (${path.join(snap, 'tokenizer.json')})`);
    fs.rmSync(home, { recursive: true, force: true });
  });
});
