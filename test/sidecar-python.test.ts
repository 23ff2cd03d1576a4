/**
 * A sidecar-API Python client (test/python/sidecar_client_check.py, written from the sidecar
 * document alone) against the real server: job_start with the dataset sent as dataset_content,
 * job_events to `completed`, every file of the trained model through /models/file with size and
 * sha256 checked, cancel, evals and infer/query. The dataset is the repository's small LeRobot
 * image fixture (2 episodes). Needs python3 (standard library only).
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PRESETS, PRESET_ALIASES } from '../kernels/small/config.ts';
import { runPythonJson } from './helpers/python.ts';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { ownerUploadsDir } from '../server/datasets/owned.ts';

const FIXTURE = fileURLToPath(new URL('./fixtures/lerobot_image', import.meta.url));

let server: TestServer;
let datasets: string;
let seen: any;
let owner: string;
beforeAll(async () => {
  datasets = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-sidecar-datasets-'));
  server = await startTestServer({ env: { VELA_DATASETS_DIR: datasets }, start: { sseKeepaliveS: 0.5 } });
  owner = (await server.store.findApiKey(server.apiKey))!;
  seen = await runPythonJson('sidecar_client_check.py', [server.baseUrl, server.apiKey, FIXTURE], 400_000);
}, 500_000);
afterAll(() => server?.close());

describe('a sidecar-API Python client', () => {
  it('gets the document\'s 400s, naming what is wrong; model_size lists Vela\'s presets', () => {
    const r = seen.refused;
    for (const v of Object.values(r) as [number, any][]) expect(v[0]).toBe(400);
    expect(r.size_4b[1].error).toBe(`model_size must be pi0 or pi05 (the real models, on \`base\`: a Hub id or a checkpoint folder) or a Vela preset: ${Object.keys(PRESETS).join(', ')} (or a deprecated name: ${Object.keys(PRESET_ALIASES).join(', ')}); got "4b" (the sidecar's 4b, 12b and 31b are not Vela models)`);
    expect(r.steps_zero[1].error).toBe('num_train_steps must be a positive integer, got 0');
    expect(r.no_dataset[1].error).toMatch(/^dataset is required/);
    expect(r.dataset_path[1].error).toMatch(/^dataset must be a plain name/);
    expect(r.not_base64[1].error).toBe('dataset_content is not valid base64 (" " at character 3)');
    expect(r.empty_content[1].error).toMatch(/^dataset_content is empty/);
    expect(r.not_archive[1].error).toMatch(/^the archive is neither a tar \(optionally gzipped\) nor a zip file/);
    expect(r.escaping_archive[1].error).toBe('the archive holds an entry with an unsafe path: "../escaped.txt"');
    expect(r.unknown_dataset[1].error).toBe('dataset "nowhere" is not under the datasets root and no dataset_content was sent');
    expect(fs.existsSync(path.join(datasets, '..', 'escaped.txt'))).toBe(false);
    // The job config is checked before an upload is installed, in the sidecar's names.
    expect(r.lora_on_full[1].error).toMatch(/^lora_rank applies to finetune "lora" only, got 8: /);
    expect(r.steps_huge[1].error).toBe('num_train_steps must be an integer in 1..1000000, got 2000000');
    expect(fs.existsSync(path.join(datasets, 'refused_up'))).toBe(false);
  });

  it('starts a job whose dataset came in the request, stored under the datasets root', () => {
    expect(seen.job_start.status).toBe(200);
    expect(seen.job_start.job).toMatchObject({ job_id: expect.stringMatching(/^ft-/), dataset: 'pick', model_size: 'flow05-tiny', num_train_steps: 6, dataset_upload: { reused: false, episodes: 2, frames: 7 } });
    expect(fs.existsSync(path.join(ownerUploadsDir(datasets, owner), 'pick', 'meta', 'info.json'))).toBe(true); // the key's own folder
    expect(seen.second_start.job.dataset_upload.reused).toBe(true);
  });

  it('follows job_events to completed: running, training, one progress per step, completed with final_loss and the model', () => {
    const data = seen.events.map((e: any) => e.data);
    expect(seen.events.map((e: any) => e.id)).toEqual(seen.events.map((_: any, i: number) => i));
    for (const e of seen.events) expect(e.event).toBe(e.data.type);
    const statuses = data.filter((d: any) => d.type === 'status').map((d: any) => d.status);
    expect(statuses).toEqual(['running', 'training', 'completed']);
    expect(data.find((d: any) => d.status === 'running')).toMatchObject({ model_size: 'flow05-tiny', num_train_steps: 6 });
    expect(data.find((d: any) => d.status === 'training')).toMatchObject({ max_steps: 6 });
    // The document's three kinds, and no other: log events say what the job does in a message.
    expect(new Set(data.map((d: any) => d.type))).toEqual(new Set(['status', 'log', 'progress']));
    for (const l of data.filter((d: any) => d.type === 'log')) expect(typeof l.message).toBe('string');
    const progress = data.filter((d: any) => d.type === 'progress');
    expect(progress.map((p: any) => p.step)).toEqual([1, 2, 3, 4, 5, 6]);
    for (const p of progress) expect(Object.keys(p)).toEqual(expect.arrayContaining(['step', 'loss', 'learning_rate', 'epoch', 'timestamp', 'elapsed_seconds']));
    const done = data.at(-1);
    expect(done.final_loss).toBe(progress.at(-1).loss);
    expect(done.model.path).toBe(`trained/${seen.job_start.job.job_id}`);
    expect(done.model.files.map((f: any) => f.path).sort()).toEqual(['config.json', 'model.safetensors', 'norm_stats.json', 'vela_training.json']); // the recipe's full fine-tune
    expect(seen.resumed_from_3.map((e: any) => e.id)).toEqual(seen.events.slice(3).map((e: any) => e.id));
    expect(seen.progress).toEqual([200, { progress: data }]);
  });

  it('downloads every file of the trained model with the recorded size and sha256; refuses escapes', () => {
    expect(seen.files).toHaveLength(4); // config.json, model.safetensors, norm_stats.json, vela_training.json
    for (const f of seen.files) expect(f).toMatchObject({ status: 200, content_type: 'application/octet-stream', size_ok: true, sha256_ok: true });
    expect(seen.file_errors).toEqual({ escape: 400, absolute: 400, bad_model_path: 400, missing: 404 });
  });

  it('cancels: stopping, then a cancelled event; 409 once over, 400 and 404 for bad ids', () => {
    expect(seen.cancel).toEqual([200, { job_id: seen.second_start.job.job_id, status: 'stopping' }]);
    expect(seen.second_last).toMatchObject({ type: 'status', status: 'cancelled' });
    expect(seen.cancel_over[0]).toBe(409);
    expect(seen.cancel_bad).toBe(400);
    expect(seen.cancel_unknown).toBe(404);
    expect(seen.events_no_job).toBe(400);
  });

  it('adds and counts eval examples', () => {
    expect(seen.evals.map((e: any) => e[0])).toEqual([200, 200, 400]);
    expect(seen.evals[2][1].error).toBe('response is required (a non-empty string)');
    expect(seen.eval_count).toEqual([200, { count: 2 }]);
  });

  it('answers infer/query from the trained model, loading it once', () => {
    const [a, b] = seen.infer;
    expect(a[0]).toBe(200);
    expect(a[1].actions.shape).toEqual([16, 3]);
    expect(a[1]).toMatchObject({ cold_start: true, model: 'flow05-tiny', seed: 3, weights_version: 'final' });
    // The document's token counts: "pick up the bottle" is 18 UTF-8 bytes, flow05-tiny's chunk 16 action tokens.
    expect([a[1].input_tokens, a[1].output_tokens]).toEqual([18, 16]);
    expect(a[1].load_seconds).toBeGreaterThan(0);
    expect(b[1]).toMatchObject({ cold_start: false, load_seconds: 0 });
    expect(b[1].actions.data).toEqual(a[1].actions.data); // same seed, same weights
  });
});
