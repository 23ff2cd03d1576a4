/**
 * The real pi0.5 the way a user goes through Vela (issue 24), end to end on the tiny
 * configuration of the same architecture: a LoRA fine-tune job from a base folder in the Hub
 * layout on the shipped G1 sample (REST, the engine worker), its weights served by `vela policy`
 * (its own process) to OpenPI's Python client, and the job's `model_dir` opened again as the base
 * of a training session over the websocket, which takes a forward_backward and an optimizer step.
 * (That the session's sample equals the policy's answer for the same observation and noise is
 * not checked here.)
 */
import type { ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { VelaClient } from '../protocol/client.ts';
import { decodeFrame } from '../protocol/frames.ts';
import { g1Datums, g1Subset } from '../bench/harness/g1.ts';
import { runPythonJson } from './helpers/python.ts';
import { missing, pythonEnv } from './helpers/requires.ts';
import { writeTinyBase } from './helpers/real-pi-base.ts';
import { startPolicyProc } from './helpers/policy-proc.ts';
import { api, startTestServer, type TestServer } from './helpers/server.ts';

const SKIP = missing('the test virtualenv (websockets, msgpack, numpy, zstandard)', pythonEnv().reason);
const KEY = 'chain-key';

let tmp: string;
let server: TestServer;
let policy: ChildProcess | null = null;

beforeAll(async () => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-chain-'));
  server = await startTestServer({ env: { VELA_DATASETS_DIR: g1Subset(2, path.join(tmp, 'datasets')).root, VELA_BACKEND: 'wasm' } });
});

afterAll(async () => {
  policy?.kill('SIGTERM');
  await server?.close();
  if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
});

async function finished(id: string): Promise<Record<string, any>> {
  for (const deadline = Date.now() + 240_000; Date.now() < deadline; await new Promise((r) => setTimeout(r, 250))) {
    const { json } = await api(server, 'GET', `/v1/fine-tunes/${id}`);
    if (['succeeded', 'failed', 'cancelled'].includes(json.status)) return json;
  }
  throw new Error(`fine-tune ${id} did not finish`);
}


describe.skipIf(SKIP)('base folder -> LoRA job on G1 -> vela policy -> OpenPI client; model_dir -> session', () => {
  it('runs the chain', { timeout: 300_000 }, async () => {
    const base = await writeTinyBase('pi05', { dir: path.join(tmp, 'tiny_pi05_base') });
    // What follows checks the chain, not how well it trains: 2 steps, and the held-out evaluation
    // on every 60th frame (5 frames; every 4th, the default, is 73 frames, 9 s here on wasm).
    const created = await api(server, 'POST', '/v1/fine-tunes', { model: 'pi05', base, dataset_name: 'g1_subset', steps: 2, batch_size: 2, eval_every: 2, eval_stride: 60, checkpoint_every: 2, seed: 1 });
    expect(created.status, JSON.stringify(created.json)).toBe(200);
    expect(created.json).toMatchObject({ finetune: 'lora', lora_rank: 16, lora_action_rank: 32 });
    const job = await finished(created.json.id);
    expect(job.status, job.error).toBe('succeeded');

    // The policy process and the session on model_dir are independent: they run side by side.
    await Promise.all([
      (async () => {
        // The job's weights, served by vela policy to OpenPI's client: a G1 frame as numpy uint8.
        const probe = (await g1Datums(1, { horizon: 10 }))[0]!;
        const frame = await decodeFrame('JPEG', probe.observation.image!.cam_high as Uint8Array);
        const frameFile = path.join(tmp, 'frame.bin');
        const obsFile = path.join(tmp, 'obs.json');
        fs.writeFileSync(frameFile, frame.data);
        fs.writeFileSync(obsFile, JSON.stringify({ shape: [frame.height, frame.width, 3], state: Array.from(probe.observation.state!.data as Float32Array), prompt: probe.observation.prompt }));
        const served = await startPolicyProc([job.output_dir, '--api-key', KEY]);
        policy = served.proc;
        const url = served.url;
        const seen = await runPythonJson('openpi_real_check.py', [url, '5', frameFile, obsFile, KEY], 60_000);
        expect(seen.metadata).toMatchObject({ server: 'vela', model: 'pi05', action_horizon: 10, action_dim: 26, image_size: 56 });
        expect(seen.first).toMatchObject({ dtype: '<f4', shape: [10, 26], finite: true });
        expect(seen.again.values).toEqual(seen.first.values); // same seed, same request number
        expect(seen.misfit.close_code).toBe(1011); // a state of too many dims: one error, the server goes on
        expect(seen.new_connection_after_misfit.values).toEqual(seen.first.values);
      })(),
      (async () => {
        // The job's model_dir is a base: a session on it opens over the websocket and trains.
        const client = new VelaClient(server.baseUrl, server.apiKey);
        const s = await client.waitReady((await client.createSession({ base_model: 'pi05', base: job.model_dir } as never)).id);
        const conn = await client.connect(s);
        expect(conn.info).toMatchObject({ model: 'pi05', base: job.model_dir, image_size: 56, action_horizon: 10 });
        const fb = await conn.forwardBackward(await g1Datums(2, { horizon: 10 }), { codec: 'JPEG' });
        expect(fb.loss).toBeGreaterThan(0);
        expect((await conn.optimStep({ learning_rate: 1e-3 })).skipped).toBe(false);
        conn.close();
      })(),
    ]);
  });
});
