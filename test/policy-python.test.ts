/**
 * The policy server against a Python client that follows OpenPI's WebsocketClientPolicy
 * (test/python/openpi_client_check.py), run by the test virtualenv's Python (websockets, msgpack,
 * numpy, zstandard; made by test/setup/python-env.ts).
 */
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ndarray, type NDArray } from '../protocol/ndarray.ts';
import { dictionaryId, loadObservationDictionary } from '../protocol/zstd.ts';
import { startPolicyServer, type PolicyServerHandle } from '../server/policy/index.ts';
import { log } from '../server/log.ts';
import { PolicyClient, STUB_CONFIG, stubEngine, type StubEngine } from '../bench/harness/policy-stub.ts';
import { missing, pythonEnv } from './helpers/requires.ts';

const run = promisify(execFile);
const SCRIPT = fileURLToPath(new URL('./python/openpi_client_check.py', import.meta.url));
const KEY = 'python-client-key';
const PY = pythonEnv();

function pattern(n: number, mul: number): Uint8Array {
  const out = new Uint8Array(n);
  for (let i = 0; i < n; i++) out[i] = (i * mul) % 256;
  return out;
}

/** The observation the Python script sends, built here the same way. */
const observation = {
  'observation/image': ndarray(pattern(20 * 30 * 3, 7), [20, 30, 3]),
  'observation/wrist_image': ndarray(pattern(3 * 24 * 16, 13), [3, 24, 16]),
  'observation/state': ndarray(Float32Array.of(0.5, -1.25, 2, 0.75, -3, 1.5, 0.125), [7]),
  prompt: 'pick up the bottle 0',
};

let engine: StubEngine;
let server: PolicyServerHandle;
let seen: any;

describe.skipIf(missing('the Python test environment', PY.reason))('an OpenPI-style Python client', () => {
  beforeAll(async () => {
    log.setLevel('error');
    engine = stubEngine();
    server = await startPolicyServer({ engine, checkpointDir: '/ckpt', policyId: 'p', seed: 11, apiKey: KEY, batchWindowMs: 0, maxBatch: 4, port: 0 });
    let stdout: string;
    try {
      ({ stdout } = await run(PY.python!, [SCRIPT, server.wsUrl, server.baseUrl, KEY], { timeout: 60_000 }));
    } catch (e) {
      const err = e as { stderr?: string; message: string };
      throw new Error(`the Python client failed:\n${err.stderr ?? err.message}`);
    }
    seen = JSON.parse(stdout);
  });
  afterAll(() => server?.close());

  it('gets the metadata first', () => {
    expect(seen.metadata).toMatchObject({ model: 'flow0-tiny', action_horizon: 5, action_dim: 6, cameras: STUB_CONFIG.cameras, state_dim: 7 });
    expect(seen.metadata.zstd_dictionary_id).toBe(dictionaryId(loadObservationDictionary()));
    expect(seen.dict_id).toBe(seen.metadata.zstd_dictionary_id);
  });

  it('gets actions [H, A] float32 with OpenPI timing for two cameras, equal to a TS client\'s', async () => {
    // The state's dim 6 (0.125) is 11 std from the stub stats' mean (-1, std 0.1): the answer
    // carries the out-of-range warning (PROTOCOL.md section 6, item 4) next to OpenPI's keys.
    expect(seen.plain).toMatchObject({
      type: 'ndarray', dtype: '<f4', shape: [5, 6], keys: ['actions', 'policy_timing', 'server_timing', 'warnings'],
      policy_timing: ['infer_ms'], server_timing: ['infer_ms'], timing_are_numbers: true,
    });
    expect(seen.second.server_timing).toEqual(['infer_ms', 'prev_total_ms']);
    const c = await PolicyClient.connect(server.wsUrl, { authorization: `Bearer ${KEY}` });
    const mine = (await c.infer(observation)).actions as NDArray;
    c.close();
    expect(seen.plain.values).toEqual([...mine.data]);
    expect(engine.infers[0]!.batch.imageMask.subarray(0, 3)).toEqual(Uint8Array.of(1, 1, 0));
  });

  it('gets the same actions for zstd with the dictionary, zstd without it and plain msgpack', () => {
    expect(seen.zstd_dict.values).toEqual(seen.plain.values);
    expect(seen.zstd_plain.values).toEqual(seen.plain.values);
    expect(seen.second.values).not.toEqual(seen.plain.values); // the next seed of the stream
  });

  it('sees an error as a text frame, then close 1011', () => {
    expect(seen.error).toMatch(/^Error in inference server:\nimages\.cam_left: camera "cam_left" is not one of this policy's cameras/);
    expect(seen.close_code).toBe(1011);
  });
});
