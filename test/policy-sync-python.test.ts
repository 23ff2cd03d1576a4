/**
 * Weights flowing from training into a running policy server, as robots and trainers see it:
 * a real `vela policy` process (started from the model's first weights), OpenPI-style Python
 * clients connected to it the whole time, and an xorl-style Python client that trains the model
 * on the real server and syncs its weights into the policy server 5 times
 * (test/python/policy_sync_check.py). After each sync the policy's actions equal the model's own
 * `sample` with the same seed; no connection drops, no request fails. Needs python3 with
 * websockets, msgpack, numpy and zstandard.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runPythonJson } from './helpers/python.ts';
import { missing, pythonEnv } from './helpers/requires.ts';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { FuturesClient } from './helpers/futures-client.ts';
import { syntheticDatum } from './helpers/synthetic.ts';

const POLICY_KEY = 'robot-policy-key';
const POLICY_SEED = 7;
const SKIP = missing('the test virtualenv (websockets, msgpack, numpy, zstandard)', pythonEnv().reason);

let server: TestServer;
let policy: ChildProcess | null = null;
let policyUrl = '';
let seen: any;

/** Start `vela policy CHECKPOINT --port 0` on wasm, the training server's backend here, and read the URL it prints. */
async function startPolicy(checkpoint: string): Promise<string> {
  policy = spawn(process.execPath, ['bin/vela.js', 'policy', checkpoint, '--port', '0', '--api-key', POLICY_KEY, '--seed', String(POLICY_SEED), '--backend', 'wasm', '--log-level', 'warn'], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  policy.stderr!.on('data', (b) => (stderr += b));
  return new Promise((resolve, reject) => {
    let out = '';
    policy!.stdout!.on('data', (b) => {
      out += b;
      const m = /Vela policy server on (ws:\/\/\S+)/.exec(out);
      if (m) resolve(m[1]!);
    });
    policy!.once('exit', (code) => reject(new Error(`vela policy exited with ${code}: ${stderr}`)));
  });
}

beforeAll(async () => {
  if (SKIP) return;
  // Both servers on wasm (one thread, deterministic): native TensorFlow's multi-threaded kernels
  // sum in an order that depends on its thread pool, so two processes can differ by ~5e-7.
  // The policy server listens on 127.0.0.1: loopback endpoints need the operator's allowlist.
  server = await startTestServer({ env: { VELA_FUTURE_WAIT_S: '1', VELA_BACKEND: 'wasm', VELA_ALLOW_ENDPOINT: '127.0.0.0/8' } });
  const c = new FuturesClient(server.baseUrl, server.apiKey);
  await c.createModel({ model_id: 'arm', base_model: 'flow05-tiny', lora_config: { rank: 4, alpha: 8 } });
  await c.run('sample', { model_id: 'arm', data: [{ observation: syntheticDatum(0).observation }], codec: 'RAW', seed: 1 }); // binds the camera
  const first = await c.run('save_weights_for_sampler', { model_id: 'arm', name: 'v0' });
  policyUrl = await startPolicy(first.path);
  seen = await runPythonJson('policy_sync_check.py', [server.baseUrl, server.apiKey, 'arm', policyUrl, POLICY_KEY, String(POLICY_SEED)], 400_000);
}, 500_000);
afterAll(async () => {
  policy?.kill('SIGTERM');
  await server?.close();
});

describe.skipIf(SKIP)('syncing weights into a running vela policy', () => {
  it('registers the policy server as an inference endpoint', () => {
    expect(seen.endpoint).toMatchObject({ url: policyUrl, name: 'robot-1', has_api_key: true, reachable: true });
    expect(seen.endpoints.endpoints).toHaveLength(1);
    expect(seen.endpoints.endpoints[0]).not.toHaveProperty('api_key');
  });

  it('after each of 5 syncs, the policy answers exactly what the model samples with the same seed', () => {
    const syncs = seen.syncs.filter((s: any) => /^(initial|sync \d)$/.test(s.label));
    expect(syncs.map((s: any) => s.label)).toEqual(['initial', 'sync 1', 'sync 2', 'sync 3', 'sync 4', 'sync 5']);
    for (const s of syncs) {
      expect(s).toMatchObject({ equal: true, max_abs_diff: 0, shape: [16, 32], dtype: '<f4' });
    }
    // Each sync brought new weights: the actions moved every time.
    expect(new Set(syncs.map((s: any) => s.first)).size).toBe(6);
    syncs.slice(1).forEach((s: any, i: number) => {
      expect(s.sync).toMatchObject({ model_id: 'arm', weights_version: i + 1, quantization: 'none' });
      expect(s.sync.endpoints).toEqual([expect.objectContaining({ url: policyUrl, status: 'ok', weights_version: i + 1, previous_version: i === 0 ? null : i })]);
    });
    for (const step of seen.steps) expect(step.skipped).toBe(false);
  });

  it('keeps every connection open and every request answered through the syncs', () => {
    expect(seen.background.errors).toEqual([]);
    expect(seen.background.answers).toBeGreaterThan(5);
    expect(seen.closed_cleanly).toBe(true);
  });

  it('serves the model\'s live weights over HTTP and its websocket, equal to its sample', () => {
    expect(seen.live_http).toEqual({ equal: true, cold_start: true, weights_version: 5, keys: ['actions', 'cold_start', 'infer_ms', 'load_seconds', 'model', 'seed', 'weights_version'] });
    expect(seen.live_ws).toEqual({ equal: true, live: true });
  });

  it('sends bfloat16 weights when asked: close, and fp8 is refused', async () => {
    const bf16 = seen.syncs.find((s: any) => s.label === 'bf16');
    expect(bf16.sync).toMatchObject({ quantization: 'bf16', endpoints: [expect.objectContaining({ status: 'ok' })] });
    expect(bf16.max_abs_diff).toBeLessThan(0.05);
    expect(seen.fp8).toEqual({ status: 400, error: 'quantization must be one of none, bf16, fp16, got "fp8" (Vela sends float32, bfloat16 or float16; there is no fp8)' });
    const stats = await (await fetch(policyUrl.replace('ws', 'http') + 'stats', { headers: { authorization: `Bearer ${POLICY_KEY}` } })).json();
    expect(stats).toMatchObject({ swaps: 6, weights_version: 5, errors: 0 });
  });
});
