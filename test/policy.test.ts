/**
 * The policy server (PROTOCOL.md section 6) with a stub engine injected through EngineLike:
 * the transform pipeline, key styles, compression, batching, seeds, isolation and errors.
 */
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { decodeFrame, encodeFrame, resizeWithPad } from '../protocol/frames.ts';
import { ndarray, NDArray, packNumpy } from '../protocol/ndarray.ts';
import { dictionaryId, initZstd, loadObservationDictionary, zstdCompress } from '../protocol/zstd.ts';
import { startPolicyServer, requestSeed, type PolicyServerHandle, type StandaloneOptions } from '../server/policy/index.ts';
import { policyMeta } from '../server/policy/meta.ts';
import { parsePolicyArgs } from '../server/policy/cli.ts';
import { Batcher } from '../server/policy/batcher.ts';
import { toRobotActions } from '../server/policy/observation.ts';
import { log } from '../server/log.ts';
import { PolicyClient, STUB_CONFIG, STUB_INFO, STUB_STATS, stubEngine, type StubEngine } from '../bench/harness/policy-stub.ts';

const SEED = 7;
const KEY = 'policy-test-key';
const servers: PolicyServerHandle[] = [];

async function start(engine: StubEngine, opts: Partial<StandaloneOptions> = {}): Promise<PolicyServerHandle> {
  const s = await startPolicyServer({ engine, checkpointDir: '/ckpt/run-1', policyId: 'pol-1', seed: SEED, batchWindowMs: 0, maxBatch: 16, port: 0, ...opts });
  servers.push(s);
  return s;
}

function pattern(n: number, mul: number, add: number): Uint8Array {
  const out = new Uint8Array(n);
  for (let i = 0; i < n; i++) out[i] = (i * mul + add) % 256;
  return out;
}

const STATE = Float32Array.of(0.5, -1.25, 2, 0.75, -3, 1.5, 0.125);

/** Two cameras OpenPI-style: the first HWC, the wrist one CHW. */
function observation(i = 0): Record<string, unknown> {
  const state = STATE.map((x) => x + i);
  return {
    'observation/image': ndarray(pattern(20 * 30 * 3, 7, i), [20, 30, 3]),
    'observation/wrist_image': ndarray(pattern(3 * 24 * 16, 13, 2 * i), [3, 24, 16]),
    'observation/state': ndarray(state, [7]),
    prompt: `pick up the bottle ${i}`,
  };
}

function chwToHwc(chw: Uint8Array, c: number, h: number, w: number): Uint8Array {
  const out = new Uint8Array(c * h * w);
  for (let k = 0; k < c; k++) for (let p = 0; p < h * w; p++) out[p * c + k] = chw[k * h * w + p]!;
  return out;
}

/** The answer the server must give for a stub row: unnormalise (z-score), add the state on dims 0..2, trim to [5, 6]. */
function expectedActions(row: Float32Array, state: Float32Array): Float32Array {
  const { mean, std } = STUB_STATS.norm_stats.actions;
  const out = new Float32Array(5 * 6);
  for (let h = 0; h < 5; h++) {
    for (let a = 0; a < 6; a++) {
      const u = Math.fround(row[h * STUB_INFO.actionDim + a]! * (std[a]! + 1e-6) + mean[a]!);
      out[h * 6 + a] = a < 3 ? Math.fround(u + state[a]!) : u;
    }
  }
  return out;
}

function actionsOf(answer: any): Float32Array {
  const a = answer.actions as NDArray;
  expect(a).toBeInstanceOf(NDArray);
  expect(a.dtype).toBe('<f4');
  expect(a.shape).toEqual([5, 6]);
  return a.data as Float32Array;
}

beforeAll(async () => {
  log.setLevel('error');
  await initZstd();
});
afterAll(async () => {
  for (const s of servers) await s.close();
});

describe('policy server: handshake and HTTP routes', () => {
  let engine: StubEngine;
  let server: PolicyServerHandle;
  beforeAll(async () => {
    engine = stubEngine();
    server = await start(engine);
  });

  it('loads the checkpoint through the engine and sends the metadata first', async () => {
    expect(engine.loads).toEqual([{ session: 'pol-1', dir: '/ckpt/run-1' }]);
    const c = await PolicyClient.connect(server.wsUrl);
    expect(c.metadata).toMatchObject({
      server: 'vela', model: 'flow0-tiny', action_horizon: 5, action_dim: 6, action_space: 'delta',
      cameras: STUB_CONFIG.cameras, state_dim: 7, image_size: 32, zstd_dictionary_id: dictionaryId(loadObservationDictionary()),
      max_message_bytes: 16 * 1024 * 1024, seeded: true,
    });
    expect(c.metadata.zstd_dictionary_id).toBeGreaterThan(0);
    // Self-describing: the keys to send (short camera names), their dtypes and shapes, the answer.
    expect(Object.keys(c.metadata.observation_keys)).toEqual(['observation/cam_high', 'observation/cam_wrist', 'observation/state', 'prompt', 'rtc/executed', 'rtc/control_hz', 'rtc/delay']);
    expect(c.metadata.observation_keys['observation/state']).toBe('float32 [7], the robot\'s raw state (normalised by the server)');
    expect(c.metadata.observation_keys['observation/cam_high']).toMatch(/^uint8 \[height, width, 3\] or \[3, height, width\]/);
    expect(c.metadata.observation_keys.prompt).toBe('str, at most 1024 UTF-8 bytes');
    expect(c.metadata.answer_keys.actions).toMatch(/^float32 \[5, 6\]: /);
    c.close();
  });

  it('serves /healthz, the dictionary, stats and 404s; binds 127.0.0.1', async () => {
    expect(server.host).toBe('127.0.0.1');
    const health = await fetch(server.baseUrl + '/healthz');
    expect([health.status, await health.text()]).toEqual([200, 'OK']);
    const dict = await fetch(server.baseUrl + '/v1/observation.zdict');
    expect(dict.status).toBe(200);
    expect(Buffer.from(await dict.arrayBuffer()).equals(Buffer.from(loadObservationDictionary()))).toBe(true);
    const stats = (await (await fetch(server.baseUrl + '/stats')).json()) as any;
    expect(stats).toMatchObject({ queued: 0, running: 0 });
    expect((await fetch(server.baseUrl + '/nope')).status).toBe(404);
  });
});

describe('policy server: one request through the pipeline', () => {
  let engine: StubEngine;
  let server: PolicyServerHandle;
  beforeAll(async () => {
    engine = stubEngine();
    server = await start(engine);
  });

  it('maps cameras to slots, normalises the state, seeds per request, and undoes it all on the actions', async () => {
    const c = await PolicyClient.connect(server.wsUrl);
    const obs = observation(0);
    const answer = await c.infer(obs);
    expect(engine.infers).toHaveLength(1);
    const call = engine.infers[0]!;
    const b = call.batch;
    expect(b.size).toBe(1);
    expect(call.numSteps).toBe(3);
    expect(call.seeds).toEqual([requestSeed(SEED, '0', 0)]);
    expect(requestSeed(SEED, '0', 0)).toBe(2765134953); // SHA-256 rule, value from Python's hashlib
    expect([...b.imageMask]).toEqual([1, 1, 0]);
    const S = 32 * 32 * 3;
    const main = await resizeWithPad(await decodeFrame('RAW', obs['observation/image'] as NDArray), 32);
    const wristHwc = chwToHwc((obs['observation/wrist_image'] as NDArray).data as Uint8Array, 3, 24, 16);
    const wrist = await resizeWithPad({ data: wristHwc, height: 24, width: 16 }, 32);
    expect(Buffer.from(b.images.subarray(0, S)).equals(Buffer.from(main.data))).toBe(true);
    expect(Buffer.from(b.images.subarray(S, 2 * S)).equals(Buffer.from(wrist.data))).toBe(true);
    expect(b.images.subarray(2 * S).every((x) => x === 0)).toBe(true);
    const { mean, std } = STUB_STATS.norm_stats.state;
    const normState = [...STATE].map((x, j) => Math.fround((x - mean[j]!) / (std[j]! + 1e-6)));
    expect([...b.state]).toEqual([...normState, 0]);
    const prompt = Buffer.from('pick up the bottle 0');
    expect([...b.tokens.subarray(0, prompt.length)]).toEqual([...prompt]);
    expect(b.tokens[prompt.length]).toBe(256);
    expect([...actionsOf(answer)]).toEqual([...expectedActions(call.rows[0]!, STATE)]);
    expect(typeof answer.policy_timing.infer_ms).toBe('number');
    expect(typeof answer.server_timing.infer_ms).toBe('number');
    expect('prev_total_ms' in answer.server_timing).toBe(false);

    // The connection's second request: the next seed of its stream, and the previous round trip.
    const second = await c.infer(observation(0));
    expect(engine.infers[1]!.seeds).toEqual([2909562772]);
    expect(second.server_timing.prev_total_ms).toBeGreaterThan(0);
    expect([...actionsOf(second)]).toEqual([...expectedActions(engine.infers[1]!.rows[0]!, STATE)]);
    expect([...actionsOf(second)]).not.toEqual([...actionsOf(answer)]);
    c.close();
  });

  it('accepts images maps (short and full names), LeRobot keys and state keys alike', async () => {
    const obs = observation(0);
    const variants: Record<string, unknown>[] = [
      { images: { cam_high: obs['observation/image'], cam_wrist: obs['observation/wrist_image'] }, state: obs['observation/state'], prompt: obs.prompt },
      { images: { 'observation.images.cam_wrist': obs['observation/wrist_image'], 'observation.images.cam_high': obs['observation/image'] }, 'observation/state': obs['observation/state'], prompt: obs.prompt },
      { 'observation/cam_high': obs['observation/image'], 'observation.images.cam_wrist': obs['observation/wrist_image'], 'observation.state': [...STATE], prompt: obs.prompt },
    ];
    const base = await (await PolicyClient.connect(server.wsUrl)).infer(obs);
    for (const v of variants) {
      const c = await PolicyClient.connect(server.wsUrl);
      expect([...actionsOf(await c.infer(v))]).toEqual([...actionsOf(base)]);
      c.close();
    }
  });

  it('decodes encoded frames named by image_codec', async () => {
    const obs = observation(0);
    const frame = { data: (obs['observation/image'] as NDArray).data as Uint8Array, height: 20, width: 30 };
    const png = await encodeFrame('PNG', frame);
    const zpng = await encodeFrame('LOSSLESS', frame);
    const raw = await (await PolicyClient.connect(server.wsUrl)).infer({ 'observation/image': obs['observation/image'], 'observation/state': obs['observation/state'] });
    for (const [codec, bytes] of [['PNG', png], ['LOSSLESS', zpng]] as const) {
      const c = await PolicyClient.connect(server.wsUrl);
      const got = await c.infer({ 'observation/image': Buffer.from(bytes as Uint8Array), 'observation/state': obs['observation/state'], image_codec: codec });
      expect([...actionsOf(got)]).toEqual([...actionsOf(raw)]);
      c.close();
    }
  });

  it('acknowledges OpenPI control messages', async () => {
    const c = await PolicyClient.connect(server.wsUrl);
    expect(await c.infer({ __ctrl__: 'episode_start', __experiment__: 'x', __task__: '', __episode_id__: 1 })).toEqual({ __ack__: 'episode_start' });
    expect(await c.infer({ __ctrl__: 'what' })).toEqual({ __ack__: 'ignored' });
    c.close();
  });
});

describe('policy server: compression', () => {
  it('plain msgpack, zstd with the dictionary and zstd without it decode alike and give the same actions', async () => {
    const engine = stubEngine();
    const server = await start(engine);
    const plain = packNumpy(observation(3));
    const dict = loadObservationDictionary();
    const withDict = zstdCompress(plain, { level: 1, dict });
    const noDict = zstdCompress(plain, { level: 1 });
    expect(withDict.length).not.toBe(noDict.length);
    const answers: Float32Array[] = [];
    for (const bytes of [plain, withDict, noDict]) {
      const c = await PolicyClient.connect(server.wsUrl);
      answers.push(actionsOf(await c.infer(bytes)));
      c.close();
    }
    expect(engine.infers).toHaveLength(3);
    const [a, b, c] = engine.infers.map((call) => call.batch);
    for (const other of [b!, c!]) {
      expect(Buffer.from(other.images).equals(Buffer.from(a!.images))).toBe(true);
      expect([...other.state]).toEqual([...a!.state]);
      expect([...other.tokens]).toEqual([...a!.tokens]);
    }
    expect([...answers[1]!]).toEqual([...answers[0]!]);
    expect([...answers[2]!]).toEqual([...answers[0]!]);
  });
});

describe('policy server: concurrency', () => {
  it('sends a second client its metadata while the first one\'s inference is still running', async () => {
    const engine = stubEngine();
    let release!: () => void;
    engine.gate = new Promise<void>((r) => (release = r));
    const server = await start(engine);
    const slow = await PolicyClient.connect(server.wsUrl);
    const pendingAnswer = slow.infer(observation(0));
    while (engine.pending === 0) await new Promise((r) => setTimeout(r, 2));
    const fast = await PolicyClient.connect(server.wsUrl);
    expect(engine.pending).toBe(1); // the slow inference has not answered
    expect(fast.metadata.action_horizon).toBe(5);
    release();
    expect(actionsOf(await pendingAnswer)).toHaveLength(30);
    slow.close();
    fast.close();
  });

  it('serves 8 concurrent clients in batches, each with exactly its one-at-a-time actions', async () => {
    const batched = stubEngine();
    // A long window that the 8th request cuts short: the batch leaves as soon as it is full.
    const server = await start(batched, { batchWindowMs: 2000, maxBatch: 8 });
    const clients = await Promise.all(Array.from({ length: 8 }, () => PolicyClient.connect(server.wsUrl)));
    const together = await Promise.all(clients.map((c, i) => c.infer(observation(i))));
    const stats = (await (await fetch(server.baseUrl + '/stats')).json()) as any;
    expect(stats.maxBatchSize).toBeGreaterThan(1);
    expect(stats.requests).toBe(8);
    expect(Math.max(...batched.infers.map((c) => c.batch.size))).toBe(stats.maxBatchSize);
    clients.forEach((c) => c.close());

    const single = stubEngine();
    const alone = await start(single, { batchWindowMs: 0, maxBatch: 1 });
    const oneByOne: any[] = [];
    for (let i = 0; i < 8; i++) {
      const c = await PolicyClient.connect(alone.wsUrl);
      oneByOne.push(await c.infer(observation(i)));
      c.close();
    }
    expect(((await (await fetch(alone.baseUrl + '/stats')).json()) as any).batchSizes).toEqual({ 1: 8 });
    for (let i = 0; i < 8; i++) {
      const got = actionsOf(together[i]);
      expect([...got]).toEqual([...actionsOf(oneByOne[i])]);
      expect([...got]).toEqual([...expectedActions(single.infers[i]!.rows[0]!, STATE.map((x) => x + i))]);
      if (i > 0) expect([...got]).not.toEqual([...actionsOf(together[0])]);
    }
  });

  it('gives each ?stream= its own seeds', async () => {
    const engine = stubEngine();
    const server = await start(engine);
    for (const stream of ['0', '3']) {
      const c = await PolicyClient.connect(`${server.wsUrl}?stream=${stream}`);
      await c.infer(observation(0));
      c.close();
    }
    expect(engine.infers.map((c) => c.seeds[0])).toEqual([2765134953, 277289047]);
  });
});

describe('policy server: errors close one connection with a text frame', () => {
  let engine: StubEngine;
  let server: PolicyServerHandle;
  let healthy: PolicyClient;
  beforeAll(async () => {
    engine = stubEngine();
    server = await start(engine, { limits: { maxMessageBytes: 64 * 1024, maxDecompressedBytes: 1024 * 1024 } });
    healthy = await PolicyClient.connect(server.wsUrl);
  });
  afterAll(() => healthy.close());

  async function expectError(message: Uint8Array, text: RegExp, code = 1011): Promise<string> {
    const c = await PolicyClient.connect(server.wsUrl);
    c.send(message);
    const m = await c.recv();
    expect(m?.binary).toBe(false);
    const got = m!.data.toString();
    expect(got).toMatch(text);
    expect(got).not.toMatch(/\n\s+at /); // no stack trace without --debug
    expect(await c.closed()).toBe(code);
    // Another client goes on.
    expect(actionsOf(await healthy.infer(observation(1)))).toHaveLength(30);
    return got;
  }

  const obs = () => observation(0);

  it('malformed: not msgpack', () => expectError(Uint8Array.of(0x82, 0xa1, 0x61), /message is not valid msgpack: Unexpected end of MessagePack data/));
  it('malformed: not a map', () => expectError(packNumpy([1, 2]), /an observation must be a msgpack map; got an array/));
  it('malformed: a state of the wrong length', () =>
    expectError(packNumpy({ ...obs(), 'observation/state': ndarray(new Float32Array(5), [5]) }), /observation\/state has 5 values; this policy's state has 7/));
  it('malformed: no state', () => {
    const { 'observation/state': _, ...rest } = obs();
    return expectError(packNumpy(rest), /the observation has no state/);
  });
  it('malformed: an unknown key', () => expectError(packNumpy({ ...obs(), 'observaton/state': 1 }), /unknown observation key "observaton\/state"/));
  it('malformed: a frame that is not uint8', () =>
    expectError(packNumpy({ ...obs(), 'observation/image': ndarray(new Float32Array(12), [2, 2, 3]) }), /observation\/image: RAW frames must be uint8/));
  it('a wrong camera', () =>
    expectError(packNumpy({ images: { cam_left: (obs() as any)['observation/image'] }, state: (obs() as any)['observation/state'] }),
      /images\.cam_left: camera "cam_left" is not one of this policy's cameras: observation\.images\.cam_high, observation\.images\.cam_wrist/));
  it('a typo of the state key: the camera error says which key was meant', () => {
    const { 'observation/state': state, ...rest } = obs() as any;
    return expectError(packNumpy({ ...rest, 'observation/stat': state }), /observation\/stat: camera "stat" is not one of this policy's cameras: .* \(did you mean observation\/state\?\)$/);
  });
  it('a camera given twice', () =>
    expectError(packNumpy({ ...obs(), images: { cam_high: (obs() as any)['observation/image'] } }), /are both camera observation\.images\.cam_high/));
  it('a bad codec', () => expectError(packNumpy({ ...obs(), image_codec: 'WEBP' }), /unknown image codec "WEBP"/));
  it('bytes that do not match the codec', () =>
    expectError(packNumpy({ 'observation/image': Buffer.from('not a png'), 'observation/state': (obs() as any)['observation/state'], image_codec: 'PNG' }), /observation\/image: PNG frame does not start with the PNG signature/));
  it('a truncated zstd frame', () => {
    const z = zstdCompress(packNumpy(obs()), { level: 1, dict: loadObservationDictionary() });
    return expectError(z.subarray(0, z.length - 10), /truncated zstd frame/);
  });
  it('a zstd frame that decompresses past the limit', () => {
    const big = zstdCompress(new Uint8Array(2 * 1024 * 1024), { level: 1 });
    return expectError(big, /zstd frame decompresses to 2097152 bytes; the limit is 1048576/);
  });
  it('an oversize message: closed at its header (1006, nothing read: PROTOCOL.md section 8); another client goes on', async () => {
    const c = await PolicyClient.connect(server.wsUrl);
    c.send(new Uint8Array(100 * 1024));
    expect(await c.closed()).toBe(1006);
    expect(actionsOf(await healthy.infer(observation(1)))).toHaveLength(30);
  });
  it('an internal failure shows a request id, not the error', async () => {
    engine.failOnPrompt = 'explode';
    const text = await expectError(packNumpy({ ...obs(), prompt: 'explode' }), /^internal error \(req-[\w-]+; see the server log\)$/);
    expect(text).not.toMatch(/simulated crash/);
    engine.failOnPrompt = null;
  });
  it('counts the errors in /stats', async () => {
    const stats = (await (await fetch(server.baseUrl + '/stats')).json()) as any;
    expect(stats.errors).toBe(15);
    expect(stats.connections).toBe(1);
  });
});

describe('policy server: --debug and API keys', () => {
  it('with --debug, an error frame carries the stack trace', async () => {
    const engine = stubEngine();
    engine.failOnPrompt = 'explode';
    const server = await start(engine, { debug: true });
    const c = await PolicyClient.connect(server.wsUrl);
    c.send(packNumpy({ ...observation(0), prompt: 'explode' }));
    const text = (await c.recv())!.data.toString();
    expect(text).toMatch(/^internal error \(req-[\w-]+\): stub engine: simulated crash in infer\n\nError: stub engine: simulated crash in infer\n\s+at /);
    expect(await c.closed()).toBe(1011);
  });

  it('requires Api-Key or Bearer when a key is configured', async () => {
    const server = await start(stubEngine(), { apiKey: KEY });
    await expect(PolicyClient.connect(server.wsUrl)).rejects.toMatchObject({ status: 401 });
    await expect(PolicyClient.connect(server.wsUrl, { authorization: 'Api-Key wrong' })).rejects.toMatchObject({ status: 401 });
    for (const scheme of ['Api-Key', 'Bearer']) {
      const c = await PolicyClient.connect(server.wsUrl, { authorization: `${scheme} ${KEY}` });
      expect(actionsOf(await c.infer(observation(0)))).toHaveLength(30);
      c.close();
    }
    expect((await fetch(server.baseUrl + '/v1/observation.zdict')).status).toBe(401);
    expect((await fetch(server.baseUrl + '/v1/observation.zdict', { headers: { authorization: `Api-Key ${KEY}` } })).status).toBe(200);
    expect((await fetch(server.baseUrl + '/healthz')).status).toBe(200);
  });
});

describe('policy meta: what a checkpoint must say', () => {
  const meta = (config: Record<string, unknown>, stats: unknown = STUB_STATS) => policyMeta(STUB_INFO, { ...STUB_CONFIG, ...config }, stats);

  it('reads dims from the config, then the names, then the stats', () => {
    const m = meta({ action_dim: undefined, state_dim: undefined, action_names: ['a', 'b', 'c', 'd'], state_names: ['a', 'b', 'x'], delta_mask: undefined });
    expect([m.actionDim, m.stateDim, m.deltaMask]).toEqual([4, 3, [true, true, false, false]]);
    const fromStats = meta({ action_dim: undefined, state_dim: undefined, action_space: 'absolute' });
    expect([fromStats.actionDim, fromStats.stateDim, fromStats.deltaMask]).toEqual([6, 7, [false, false, false, false, false, false]]);
    expect(meta({}, null).norm).toBeNull();
  });

  it('refuses a checkpoint it cannot serve, naming the field', () => {
    expect(() => meta({ cameras: undefined })).toThrow(/cameras is missing/);
    expect(() => meta({ cameras: ['a', 'b', 'c', 'd'] })).toThrow(/cameras has 4 names; the model has 3 image slots/);
    expect(() => meta({ preset: 'flow05-tiny' })).toThrow(/preset is flow05-tiny but the engine runs flow0-tiny/);
    expect(() => meta({ delta_mask: undefined })).toThrow(/neither delta_mask nor state_names and action_names/);
    expect(() => meta({ action_dim: 9 })).toThrow(/action_dim is 9; expected an integer in 1..8/);
    expect(() => meta({ action_space: 'relative' })).toThrow(/action_space is "relative"/);
  });
});

describe('policy meta on a real pi0 / pi0.5 engine', () => {
  const realInfo = (family: 'pi0' | 'pi05') => ({ ...STUB_INFO, preset: family, family, baseDir: '/bases/tiny', imageSize: 56, stateDim: 32, actionDim: 32, actionHorizon: 10, padToken: 0 });
  const layout = (family: 'pi0' | 'pi05') => ({
    family, slots: 3, imageSize: 56, maxTokenLen: 48, stateDim: 32, horizon: 10, actionDim: 32, padToken: 0, tokenizerFile: '/bases/tiny/tokenizer.json',
    encodePrompt: () => ({ tokens: new Int32Array(48), mask: new Uint8Array(48) }),
  });
  const cfg = (preset: string) => ({ preset, cameras: ['cam_high'] });

  it('takes the engine\'s layout and the family\'s transform: pi0 z-score, pi0.5 quantiles, unless the stats say', () => {
    const pi0 = policyMeta(realInfo('pi0'), cfg('pi0'), STUB_STATS, { layout: layout('pi0') });
    expect([pi0.preset, pi0.norm!.normalizer.mode, pi0.model.imageSize, pi0.actionDim, pi0.actionHorizon]).toEqual(['pi0', 'zscore', 56, 6, 10]);
    expect(pi0.model.encodePrompt).toBeTypeOf('function');
    expect(policyMeta(realInfo('pi05'), cfg('pi05'), STUB_STATS, { layout: layout('pi05') }).norm!.normalizer.mode).toBe('quantile');
    expect(policyMeta(realInfo('pi05'), cfg('pi05'), STUB_STATS, { layout: layout('pi05'), normMode: 'zscore' }).norm!.normalizer.mode).toBe('zscore');
    expect(policyMeta(realInfo('pi05'), cfg('pi05'), null, { layout: layout('pi05') })).toMatchObject({ norm: null, actionDim: 32, stateDim: null });
  });

  it('refuses another model\'s checkpoint, naming both', () => {
    expect(() => policyMeta(realInfo('pi05'), cfg('pi0'), null, { layout: layout('pi05') })).toThrow('checkpoint config.json: preset is pi0 but the engine runs the real pi05');
    expect(() => policyMeta(realInfo('pi05'), cfg('flow05-tiny'), null, { layout: layout('pi05') })).toThrow('checkpoint config.json: preset is flow05-tiny but the engine runs the real pi05');
    expect(() => policyMeta(realInfo('pi05'), cfg('pi05'), null)).toThrow(/needs its layout/);
  });
});

describe('vela policy: arguments', () => {
  it('has OpenPI-compatible defaults but binds 127.0.0.1', () => {
    expect(parsePolicyArgs(['ckpt'], {})).toEqual({
      checkpoint: 'ckpt', base: null, modelsDir: path.resolve('vela-data/models'), model: null, cameras: null, port: 8000, host: '127.0.0.1', seed: null, debug: false, batchWindowMs: 5, maxBatch: 16, apiKey: null,
      backend: 'auto', maxMessageBytes: 16 * 1024 * 1024, logLevel: 'info', metricsPublic: false,
      rtc: { mode: 'auto', controlHz: null, delay: null, schedule: 'exp', maxGuidance: 5 },
      wsCaps: { connectionsPerKey: 16, connections: 256, bufferedBytesPerKey: 4 * 2 ** 30, bufferedBytes: 16 * 2 ** 30 },
      zstdDicts: [],
    });
  });

  it('--zstd-dict: comma list and repeats add up; the flag replaces VELA_ZSTD_DICT', () => {
    expect(parsePolicyArgs(['ckpt'], { VELA_ZSTD_DICT: 'a.zdict,b.zdict' }).zstdDicts).toEqual(['a.zdict', 'b.zdict']);
    expect(parsePolicyArgs(['ckpt', '--zstd-dict', 'c.zdict, d.zdict', '--zstd-dict=e.zdict'], { VELA_ZSTD_DICT: 'a.zdict' }).zstdDicts).toEqual(['c.zdict', 'd.zdict', 'e.zdict']);
    expect(() => parsePolicyArgs(['ckpt', '--zstd-dict', ','], {})).toThrow('--zstd-dict ,: must name a dictionary file (or several, comma-separated)');
  });

  it('takes a real base alone, or a checkpoint with a base that overrides its own', () => {
    expect(parsePolicyArgs(['--base', 'lerobot/pi05_base', '--model', 'pi05', '--cameras', 'cam_high,cam_wrist'], {})).toMatchObject({ checkpoint: null, base: 'lerobot/pi05_base', model: 'pi05', cameras: ['cam_high', 'cam_wrist'] });
    expect(parsePolicyArgs(['--checkpoint=ck', '--base', '/b'], {})).toMatchObject({ checkpoint: 'ck', base: '/b', model: null });
  });

  it('reads every flag, in both spellings', () => {
    const a = parsePolicyArgs(['--port', '9000', '--host=0.0.0.0', 'ckpt', '--seed', '42', '--debug', '--batch-window-ms', '2.5', '--max-batch=4', '--api-key', 'k', '--backend', 'wasm'], { VELA_API_KEY: 'env' });
    expect(a).toMatchObject({ checkpoint: 'ckpt', port: 9000, host: '0.0.0.0', seed: 42, debug: true, batchWindowMs: 2.5, maxBatch: 4, apiKey: 'k', backend: 'wasm' });
    expect(parsePolicyArgs(['ckpt'], { VELA_API_KEY: 'env', VELA_BACKEND: 'cpu' })).toMatchObject({ apiKey: 'env', backend: 'cpu' });
    expect(parsePolicyArgs(['ckpt', '--metrics-public'], {}).metricsPublic).toBe(true);
    expect(parsePolicyArgs(['ckpt'], { VELA_METRICS_PUBLIC: '1' }).metricsPublic).toBe(true);
  });

  it('names the bad argument', () => {
    expect(() => parsePolicyArgs([], {})).toThrow(/expected one CHECKPOINT folder or --base <hub id \| folder>, got none/);
    expect(() => parsePolicyArgs(['a', '--checkpoint', 'b'], {})).toThrow(/expected one CHECKPOINT folder, got b a/);
    expect(() => parsePolicyArgs(['--base', 'x', '--model', 'pi1'], {})).toThrow('--model pi1: must be one of pi0, pi05');
    expect(() => parsePolicyArgs(['ckpt', '--cameras', 'a'], {})).toThrow(/--cameras applies to --base alone/);
    expect(() => parsePolicyArgs(['--base', 'x', '--cameras', 'a,b,c,d'], {})).toThrow('--cameras a,b,c,d: must be 1 to 3 distinct camera names');
    expect(() => parsePolicyArgs(['a', 'b'], {})).toThrow(/expected one CHECKPOINT folder, got a b/);
    expect(() => parsePolicyArgs(['ckpt', '--port', '70000'], {})).toThrow('--port 70000: must be an integer in 0..65535');
    expect(() => parsePolicyArgs(['ckpt', '--max-batch', '0'], {})).toThrow('--max-batch 0: must be an integer in 1..256');
    expect(() => parsePolicyArgs(['ckpt', '--sed', '1'], {})).toThrow(/unknown option --sed/);
    expect(() => parsePolicyArgs(['ckpt', '--seed'], {})).toThrow(/--seed needs a value/);
  });
});

describe('batcher', () => {
  /** A run function that answers each datum with [its seed], held until released. */
  function gated() {
    const calls: number[][] = [];
    let release: (() => void)[] = [];
    const run = async (_d: unknown[], seeds: number[]) => {
      calls.push(seeds);
      await new Promise<void>((r) => release.push(r));
      return { rows: seeds.map((s) => Float32Array.of(s)), inferMs: 1 };
    };
    return { calls, run, releaseAll: () => release.splice(0).forEach((r) => r()) };
  }
  const datum = { images: [], state: [], prompt: '' };

  it('leaves at once when every sender has a request queued, splits at maxBatch, and queues behind a running batch', async () => {
    const g = gated();
    let senders = 3;
    const b = new Batcher(g.run, 60_000, 2, () => senders);
    const p1 = b.submit(datum, 1);
    const p2 = b.submit(datum, 2); // maxBatch 2 reached: leaves without waiting the window
    await new Promise((r) => setImmediate(r));
    expect(g.calls).toEqual([[1, 2]]);
    const p3 = b.submit(datum, 3);
    const p4 = b.submit(datum, 4);
    const p5 = b.submit(datum, 5);
    expect(b.stats()).toMatchObject({ queued: 3, running: 2 });
    g.releaseAll();
    expect(await Promise.all([p1, p2])).toEqual([
      { row: Float32Array.of(1), inferMs: 1, batchSize: 2, queueMs: expect.any(Number) },
      { row: Float32Array.of(2), inferMs: 1, batchSize: 2, queueMs: expect.any(Number) },
    ]);
    await new Promise((r) => setImmediate(r));
    expect(g.calls).toEqual([[1, 2], [3, 4]]);
    g.releaseAll();
    await Promise.all([p3, p4]);
    await new Promise((r) => setImmediate(r));
    expect(g.calls).toEqual([[1, 2], [3, 4], [5]]);
    g.releaseAll();
    expect((await p5).row).toEqual(Float32Array.of(5));
    senders = 1;
    const p6 = b.submit(datum, 6); // the only sender: no window
    await new Promise((r) => setImmediate(r));
    expect(g.calls.at(-1)).toEqual([6]);
    g.releaseAll();
    await p6;
    expect(b.stats()).toEqual({ requests: 6, batches: 4, batchSizes: { 1: 2, 2: 2 }, maxBatchSize: 2, queued: 0, running: 0 });
  });

  it('fails every request of a failed batch, and refuses new ones once closed', async () => {
    const b = new Batcher(async () => {
      throw new Error('engine down');
    }, 0, 4);
    await expect(Promise.all([b.submit(datum, 1), b.submit(datum, 2)])).rejects.toThrow('engine down');
    b.close(new Error('shutting down'));
    await expect(b.submit(datum, 3)).rejects.toThrow('shutting down');
  });
});

describe('actions back to robot units', () => {
  it('pi0.5 checkpoints use quantiles; absolute actions are not shifted', () => {
    const info = { ...STUB_INFO, preset: 'flow05-tiny' };
    const m = policyMeta(info, { ...STUB_CONFIG, preset: 'flow05-tiny', action_space: 'absolute', delta_mask: undefined }, STUB_STATS);
    const row = new Float32Array(6 * 8).map((_, i) => (i % 5) / 4 - 0.5);
    const got = toRobotActions(row, m, STATE);
    const { q01, q99 } = STUB_STATS.norm_stats.actions;
    const want = new Float32Array(5 * 6);
    for (let h = 0; h < 5; h++) for (let a = 0; a < 6; a++) want[h * 6 + a] = ((row[h * 8 + a]! + 1) / 2) * (q99[a]! - q01[a]! + 1e-6) + q01[a]!;
    expect([...got]).toEqual([...want]);
  });
});
