/**
 * The sidecar's fields (issue 33 items 9 and 10), on the real server with a G1 subset under the
 * datasets root.
 *
 * job_start takes every one of POST /v1/fine-tunes' other fields (PROTOCOL.md
 * section 10; issue 33 item 10): eval_fraction, warmup_steps, lr_floor, adam_eps, weight_decay,
 * ema_decay, augment, time_sampling, rtc_max_delay (and the eval split's) were 400s, "job_start
 * has no field", while the docs said section 1's other fields were taken. Each job is cancelled
 * once its config is read back.
 *
 * infer/query answers the document's input_tokens / output_tokens: the prompt's tokens as the
 * model read them (a small preset's UTF-8 bytes, cut at max_token_len; the real pi0's PaliGemma
 * ids with BOS, on a tiny pi0 base with the committed test tokenizer) and the action expert's
 * tokens, one per step of the model's chunk (its horizon).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeConfig } from '../kernels/small/config.ts';
import { loadPaligemmaTokenizer } from '../server/models/tokenizer.ts';
import { g1Datums, g1Subset } from '../bench/harness/g1.ts';
import { TEST_TOKENIZER_DIR, tinyRealConfig, writeTinyBase } from './helpers/real-pi-base.ts';
import { api, startTestServer, type TestServer } from './helpers/server.ts';

const SUBSET = g1Subset(3);
let server: TestServer;
beforeAll(async () => {
  server = await startTestServer({ env: { VELA_DATASETS_DIR: SUBSET.root } });
}, 60_000);
afterAll(() => server?.close());

/** Fields of section 1 with values other than their defaults, as a client would send them. */
const SCHEDULE = {
  warmup_steps: 3, lr_floor: 0.25, adam_eps: 1e-6, weight_decay: 0.01, ema_decay: 0.5, augment: false, time_sampling: 'uniform', rtc_max_delay: 4,
};

async function startAndCancel(fields: Record<string, unknown>): Promise<Record<string, unknown>> {
  const start = await api(server, 'POST', '/training/job_start', { dataset: SUBSET.name, model_size: 'flow0-tiny', num_train_steps: 20, ...fields });
  expect(start.status, JSON.stringify(start.json)).toBe(200);
  const id = start.json.job_id as string;
  const { json } = await api(server, 'GET', `/v1/fine-tunes/${id}`);
  await api(server, 'POST', '/training/job_cancel', { job_id: id });
  return json;
}

describe("job_start: section 1's other fields", () => {
  it('passes the schedule and optimiser fields and eval_fraction / eval_stride through to the fine-tune', async () => {
    const job = await startAndCancel({ ...SCHEDULE, eval_fraction: 0.34, eval_stride: 2 });
    expect(job).toMatchObject({ model: 'flow0-tiny', dataset_name: SUBSET.name, steps: 20, ...SCHEDULE, eval_fraction: 0.34, eval_stride: 2 });
  }, 60_000);

  it('passes eval_episodes through (held out of dataset)', async () => {
    const job = await startAndCancel({ eval_episodes: [2] });
    expect(job).toMatchObject({ eval_episodes: [2], eval_fraction: 0 });
  }, 60_000);

  it('checks them as POST /v1/fine-tunes does, in the same words', async () => {
    const cases: Record<string, unknown>[] = [{ lr_floor: -1 }, { ema_decay: 1 }, { time_sampling: 'normal' }, { augment: 'yes' }, { warmup_steps: 21 }, { rtc_max_delay: 64 }, { adam_eps: 0 }, { eval_fraction: 0.2, eval_episodes: [1] }];
    for (const fields of cases) {
      const side = await api(server, 'POST', '/training/job_start', { dataset: SUBSET.name, model_size: 'flow0-tiny', num_train_steps: 20, ...fields });
      const ft = await api(server, 'POST', '/v1/fine-tunes', { dataset_name: SUBSET.name, model: 'flow0-tiny', steps: 20, ...fields });
      expect(side.status, JSON.stringify(fields)).toBe(400);
      expect(ft.status).toBe(400);
      expect(side.json.error).toBe(ft.json.error);
    }
    // An unknown field is still refused, listing what job_start takes.
    const unknown = await api(server, 'POST', '/training/job_start', { dataset: SUBSET.name, colour: 'red' });
    expect(unknown.status).toBe(400);
    expect(unknown.json.error).toMatch(/^job_start has no field "colour"; it takes dataset, num_train_steps, model_size, dataset_content and Vela's base, batch_size, .*eval_fraction, .*warmup_steps, lr_floor, adam_eps, weight_decay, ema_decay, augment, time_sampling, rtc_max_delay, push_to_hub$/);
  }, 60_000);
});

describe('infer/query: input_tokens and output_tokens', () => {
  let modelPath = '';
  beforeAll(async () => {
    const start = await api(server, 'POST', '/training/job_start', { dataset: SUBSET.name, model_size: 'flow0-tiny', num_train_steps: 2, batch_size: 2, eval_every: 0 });
    expect(start.status, JSON.stringify(start.json)).toBe(200);
    for (const deadline = Date.now() + 120_000; Date.now() < deadline; await new Promise((r) => setTimeout(r, 250))) {
      const { json } = await api(server, 'GET', `/v1/fine-tunes/${start.json.job_id}`);
      if (json.status === 'succeeded') break;
      expect(['queued', 'running']).toContain(json.status);
    }
    modelPath = `trained/${start.json.job_id}`;
  }, 150_000);

  it('counts the prompt as flow0-tiny reads it (UTF-8 bytes, at most max_token_len) and the chunk as its horizon', async () => {
    const { maxTokenLen, horizon } = makeConfig('flow0-tiny');
    expect([maxTokenLen, horizon]).toEqual([48, 16]);
    const o = (await g1Datums(1))[0]!.observation;
    const obs = { 'observation/cam_high': Buffer.from(o.image!.cam_high as Uint8Array).toString('base64'), image_codec: 'JPEG', 'observation/state': Array.from(o.state!.data as Float32Array), seed: 1 };
    // [prompt, its UTF-8 bytes, what the model reads]; "é" is 2 bytes; 60 bytes are cut to 48.
    const cases: [string, number][] = [['pick up the bottle', 18], ['café au lait', 13], ['', 0], ['x'.repeat(60), 48]];
    for (const [prompt, tokens] of cases) {
      const r = await api(server, 'POST', '/infer/query', { model_path: modelPath, prompt, max_tokens: 5, temperature: 0.7, ...obs });
      expect(r.status, JSON.stringify(r.json)).toBe(200);
      expect(r.json.actions.shape[0]).toBe(horizon);
      expect({ input_tokens: r.json.input_tokens, output_tokens: r.json.output_tokens }).toEqual({ input_tokens: tokens, output_tokens: horizon });
    }
  }, 60_000);
});

describe('infer/query on the real pi0 (a tiny base): input_tokens are the PaliGemma prompt ids with BOS', () => {
  let modelPath = '';
  beforeAll(async () => {
    const base = await writeTinyBase('pi0');
    const start = await api(server, 'POST', '/training/job_start', { dataset: SUBSET.name, model_size: 'pi0', base, num_train_steps: 1, batch_size: 1, eval_every: 0, eval_fraction: 0 });
    expect(start.status, JSON.stringify(start.json)).toBe(200);
    let status = '';
    for (const deadline = Date.now() + 240_000; Date.now() < deadline && status !== 'succeeded'; await new Promise((r) => setTimeout(r, 500))) {
      const { json } = await api(server, 'GET', `/v1/fine-tunes/${start.json.job_id}`);
      status = json.status;
      expect(['queued', 'running', 'succeeded'], json.error).toContain(status);
    }
    expect(status).toBe('succeeded');
    modelPath = `trained/${start.json.job_id}`;
  }, 300_000);

  it("counts BOS + the ids of the task and LeRobot's newline, as the test tokenizer encodes them; output_tokens the base's horizon", async () => {
    const tok = await loadPaligemmaTokenizer(TEST_TOKENIZER_DIR);
    const { actionHorizon, maxTokenLen } = tinyRealConfig('pi0');
    const o = (await g1Datums(1))[0]!.observation;
    const obs = { 'observation/cam_high': Buffer.from(o.image!.cam_high as Uint8Array).toString('base64'), image_codec: 'JPEG', 'observation/state': Array.from(o.state!.data as Float32Array), seed: 1 };
    for (const prompt of ['pick up the bottle', 'put the red cube in the bowl, then 12 more']) {
      const ids = [tok.bosId, ...tok.encode(`${prompt}\n`)];
      expect(ids.length).toBeLessThanOrEqual(maxTokenLen);
      const r = await api(server, 'POST', '/infer/query', { model_path: modelPath, prompt, ...obs });
      expect(r.status, JSON.stringify(r.json)).toBe(200);
      expect({ input_tokens: r.json.input_tokens, output_tokens: r.json.output_tokens }).toEqual({ input_tokens: ids.length, output_tokens: actionHorizon });
    }
  }, 120_000);
});
