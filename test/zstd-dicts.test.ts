/**
 * The operator's zstd dictionaries (issue 33 item 2): Relay's inference websocket compresses
 * observations with Relay's own observation.zdict, which Vela did not hold, so a stock Relay
 * client got a 1011 ("zstd dictionary mismatch") on its first observation. `--zstd-dict FILE`
 * (repeatable or comma-separated; VELA_ZSTD_DICT) on `vela serve` and `vela policy` installs
 * more dictionaries beside Vela's own, each frame decoded with the one its header's
 * Dictionary_ID names; Vela's own stays the default and the one served at
 * GET /v1/observation.zdict. Relay's file is not public: the test trains stand-ins with the zstd
 * CLI (one with Relay's id, 1838312394, as the error quotes it), compresses with the
 * wasm library, and sends the frames through the real servers.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ndarray, NDArray, packNumpy } from '../protocol/ndarray.ts';
import { dictionaryId, initZstd, loadObservationDictionary, MAX_DICTIONARY_BYTES, MAX_EXTRA_DICTIONARIES, parseZstdFrame, zstdCompress } from '../protocol/zstd.ts';
import type { NormStatsSet } from '../kernels/normalize.ts';
import { loadConfig } from '../server/config.ts';
import { FuturesClient } from './helpers/futures-client.ts';
import { startPolicyProc, tinyLoraCheckpoint, type PolicyProc } from './helpers/policy-proc.ts';
import { PolicyClient } from '../bench/harness/policy-stub.ts';
import { missing, zstdCliReason } from './helpers/requires.ts';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { syntheticDatum } from './helpers/synthetic.ts';

const SKIP = missing('the zstd CLI (it trains the test dictionaries)', zstdCliReason());
const VELA_ID = 0x56454c41; // 1447382081, scripts/train_zdict.py
const RELAY_ID = 1838312394; // the id of Relay's observation.zdict, from the error line
const SECOND_ID = 40001;
const UNKNOWN_ID = 40002;

let tmp = '';
/** Dictionary files by id, trained in beforeAll. */
const files = new Map<number, string>();
const dicts = new Map<number, Uint8Array>();

/** An OpenPI observation for one camera `cam` (uint8 HWC), an 8-value state and a prompt. */
function observation(cam: string, i: number, stateDim: number): Record<string, unknown> {
  const img = new Uint8Array(24 * 32 * 3);
  for (let k = 0; k < img.length; k++) img[k] = (k * 7 + i * 13) & 255;
  return {
    [`observation/${cam}`]: ndarray(img, [24, 32, 3]),
    'observation/state': ndarray(Float32Array.from({ length: stateDim }, (_, k) => ((k + i) % 5) * 0.25 - 0.5), [stateDim]),
    prompt: `pick up the bottle ${i}`,
  };
}

/** Trains a dictionary of id `id` on msgpack observations with the zstd CLI (its --train). */
function train(id: number, salt: number): void {
  const dir = path.join(tmp, `samples-${id}`);
  fs.mkdirSync(dir);
  for (let i = 0; i < 150; i++) fs.writeFileSync(path.join(dir, `s${i}`), packNumpy(observation(i % 2 ? 'cam_high' : 'cam_wrist', i * 31 + salt, 8)));
  const out = path.join(tmp, `dict-${id}.zdict`);
  execFileSync('zstd', ['--train', '-q', '-r', dir, '-o', out, '--dictID', String(id), '--maxdict', '16384'], { stdio: 'pipe' });
  files.set(id, out);
  dicts.set(id, new Uint8Array(fs.readFileSync(out)));
}

beforeAll(async () => {
  if (SKIP) return;
  await initZstd();
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-zdicts-'));
  train(RELAY_ID, 0);
  train(SECOND_ID, 1);
  train(UNKNOWN_ID, 2);
  for (const [id, d] of dicts) expect(dictionaryId(d)).toBe(id);
}, 60_000);
afterAll(() => {
  if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
});

/** The same observation four ways: plain msgpack, and zstd with Vela's, Relay's stand-in and the second dictionary. */
function encodings(obs: Record<string, unknown>): { name: string; bytes: Uint8Array; id: number }[] {
  const plain = packNumpy(obs);
  return [
    { name: 'plain', bytes: plain, id: 0 },
    { name: 'vela', bytes: zstdCompress(plain, { dict: loadObservationDictionary() }), id: VELA_ID },
    { name: 'relay', bytes: zstdCompress(plain, { dict: dicts.get(RELAY_ID)! }), id: RELAY_ID },
    { name: 'second', bytes: zstdCompress(plain, { dict: dicts.get(SECOND_ID)! }), id: SECOND_ID },
  ];
}

/** Each encoding on its own connection with the same seed stream: the same observation must give the same actions. */
async function answersAlike(url: string, headers: Record<string, string>, obs: Record<string, unknown>): Promise<number[][]> {
  const out: number[][] = [];
  for (const e of encodings(obs)) {
    if (e.id) expect(parseZstdFrame(e.bytes).dictionaryId).toBe(e.id);
    const c = await PolicyClient.connect(url, headers);
    try {
      const a = (await c.infer(e.bytes)).actions as NDArray;
      out.push(Array.from(a.data as Float32Array));
    } finally {
      c.close();
    }
  }
  for (const a of out.slice(1)) expect(a).toEqual(out[0]);
  return out;
}

/** A frame of a dictionary the server does not hold: the clear error, then 1011. */
async function unknownRefused(url: string, headers: Record<string, string>, obs: Record<string, unknown>): Promise<string> {
  const c = await PolicyClient.connect(url, headers);
  c.send(zstdCompress(packNumpy(obs), { dict: dicts.get(UNKNOWN_ID)! }));
  const m = await c.recv();
  expect(m?.binary).toBe(false);
  expect(await c.closed()).toBe(1011);
  return m!.data.toString();
}

describe.skipIf(SKIP)('vela serve --zstd-dict (VELA_ZSTD_DICT), on a sampling session\'s policy websocket', () => {
  let server: TestServer;
  let url = '';
  const headers = () => ({ authorization: `Bearer ${server.apiKey}` });
  const obs = observation('cam_high', 5, 8);
  beforeAll(async () => {
    server = await startTestServer({ env: { VELA_ZSTD_DICT: `${files.get(RELAY_ID)},${files.get(SECOND_ID)}` } });
    const c = new FuturesClient(server.baseUrl, server.apiKey);
    await c.createModel({ model_id: 'arm', base_model: 'flow05-tiny', lora_config: { rank: 4, alpha: 8 } });
    await c.run('sample', { model_id: 'arm', data: [{ observation: syntheticDatum(0).observation }], codec: 'RAW', seed: 1 }); // binds cam_high
    const saved = await c.run('save_weights_for_sampler', { model_id: 'arm', name: 'zd' });
    url = `${(await c.call('create_sampling_session', { checkpoint_id: saved.checkpoint_id })).url}?seed=4`;
  }, 180_000);
  afterAll(() => server?.close());

  it('decodes frames of the operator\'s dictionaries beside Vela\'s own and plain msgpack: the same actions', async () => {
    const c = await PolicyClient.connect(url, headers());
    expect(c.metadata).toMatchObject({ zstd_dictionary_id: VELA_ID, zstd_dictionary_path: '/v1/observation.zdict', zstd_dictionary_ids: [VELA_ID, RELAY_ID, SECOND_ID] });
    c.close();
    const answers = await answersAlike(url, headers(), obs);
    expect(answers[0]!.length).toBe(c.metadata.action_horizon * c.metadata.action_dim);
  }, 60_000);

  it('still serves Vela\'s own dictionary at GET /v1/observation.zdict', async () => {
    const res = await fetch(`${server.baseUrl}/v1/observation.zdict`, { headers: headers() });
    expect(res.status).toBe(200);
    expect(Buffer.from(await res.arrayBuffer()).equals(Buffer.from(loadObservationDictionary()))).toBe(true);
  });

  it('refuses a frame of a dictionary it does not hold with the ids it has', async () => {
    expect(await unknownRefused(url, headers(), obs)).toBe(
      `zstd dictionary mismatch: the frame was made with dictionary id ${UNKNOWN_ID}; the given dictionaries have ids ${VELA_ID}, ${RELAY_ID}, ${SECOND_ID}`,
    );
  }, 30_000);
});

describe.skipIf(SKIP)('vela policy --zstd-dict, as its own process', () => {
  const STATS: NormStatsSet = {
    state: { mean: new Array(8).fill(0), std: new Array(8).fill(0.5), q01: new Array(8).fill(-1.2), q99: new Array(8).fill(1.2) },
    actions: { mean: new Array(6).fill(0), std: new Array(6).fill(0.5), q01: new Array(6).fill(-1.2), q99: new Array(6).fill(1.2) },
  };
  let ck = '';
  let policy: PolicyProc | null = null;
  const obs = observation('cam_high', 9, 8);
  beforeAll(async () => {
    ck = path.join(tmp, 'ck');
    await tinyLoraCheckpoint(ck, { cameras: ['cam_high'], action_dim: 6, action_horizon: 4, state_dim: 8 }, STATS);
    // Repeated: the flag's values add up.
    policy = await startPolicyProc([ck, '--seed', '3', '--zstd-dict', files.get(RELAY_ID)!, '--zstd-dict', files.get(SECOND_ID)!]);
  }, 120_000);
  afterAll(() => {
    policy?.proc.kill('SIGTERM');
  });

  it('decodes Relay\'s and the second dictionary\'s frames beside Vela\'s own; unknown ids get the clear error', async () => {
    const c = await PolicyClient.connect(policy!.url);
    expect(c.metadata.zstd_dictionary_ids).toEqual([VELA_ID, RELAY_ID, SECOND_ID]);
    c.close();
    const answers = await answersAlike(policy!.url, {}, obs);
    expect(answers[0]!.length).toBe(4 * 6);
    expect(await unknownRefused(policy!.url, {}, obs)).toMatch(new RegExp(`^zstd dictionary mismatch: the frame was made with dictionary id ${UNKNOWN_ID}; the given dictionaries have ids ${VELA_ID}, ${RELAY_ID}, ${SECOND_ID}$`));
    const res = await fetch(`${policy!.url.replace(/^ws/, 'http').replace(/\/$/, '')}/v1/observation.zdict`);
    expect(Buffer.from(await res.arrayBuffer()).equals(Buffer.from(loadObservationDictionary()))).toBe(true);
  }, 60_000);

  it('without --zstd-dict, a Relay frame is the mismatch it was (Vela\'s own only)', async () => {
    const plain = await startPolicyProc([ck, '--seed', '3']);
    try {
      expect(await unknownRefused(plain.url, {}, obs)).toBe(`zstd dictionary mismatch: the frame was made with dictionary id ${UNKNOWN_ID}; the given dictionary has id ${VELA_ID}`);
      const c = await PolicyClient.connect(plain.url);
      c.send(zstdCompress(packNumpy(obs), { dict: dicts.get(RELAY_ID)! }));
      expect((await c.recv())!.data.toString()).toBe(`zstd dictionary mismatch: the frame was made with dictionary id ${RELAY_ID}; the given dictionary has id ${VELA_ID}`);
      expect(await c.closed()).toBe(1011);
    } finally {
      plain.proc.kill('SIGTERM');
    }
  }, 120_000);

  it('refuses a bad --zstd-dict at start, one line naming the file (exit 2)', async () => {
    const notDict = path.join(tmp, 'not-a-dict.bin');
    fs.writeFileSync(notDict, 'raw bytes, no dictionary header');
    const big = path.join(tmp, 'big.zdict');
    fs.writeFileSync(big, Buffer.concat([Buffer.from(dicts.get(SECOND_ID)!), Buffer.alloc(MAX_DICTIONARY_BYTES)]));
    const cases: [string[], RegExp][] = [
      [['--zstd-dict', notDict], /--zstd-dict: zstd dictionary .*not-a-dict\.bin is not a trained zstd dictionary with an id/],
      [['--zstd-dict', big], new RegExp(`--zstd-dict: zstd dictionary .*big\\.zdict is ${MAX_DICTIONARY_BYTES + dicts.get(SECOND_ID)!.byteLength} bytes; the limit is ${MAX_DICTIONARY_BYTES} \\(1 MiB\\)`)],
      [['--zstd-dict', `${files.get(RELAY_ID)},${files.get(RELAY_ID)}`], new RegExp(`has id ${RELAY_ID}, the id of .*dict-${RELAY_ID}\\.zdict: frames could not say which one`)],
      [['--zstd-dict', path.join(tmp, 'nowhere.zdict')], /--zstd-dict: zstd dictionary .*nowhere\.zdict: no such file/],
    ];
    for (const [args, re] of cases) {
      const err = await startPolicyProc([ck, ...args]).then(() => null, (e) => e as { code: number; stderr: string });
      expect(err, args.join(' ')).not.toBeNull();
      expect(err!.code).toBe(2);
      expect(err!.stderr).toMatch(re);
    }
  }, 120_000);
});

describe.skipIf(SKIP)('--zstd-dict settings', () => {
  it('vela serve: comma list and repeats add up; the flag replaces VELA_ZSTD_DICT', () => {
    expect(loadConfig([], { VELA_ZSTD_DICT: 'a.zdict, b.zdict' }).config.zstdDicts).toEqual(['a.zdict', 'b.zdict']);
    expect(loadConfig(['--zstd-dict', 'c.zdict,d.zdict', '--zstd-dict=e.zdict'], { VELA_ZSTD_DICT: 'a.zdict' }).config.zstdDicts).toEqual(['c.zdict', 'd.zdict', 'e.zdict']);
    expect(loadConfig([], {}).config.zstdDicts).toEqual([]);
  });

  it(`vela serve refuses more than ${MAX_EXTRA_DICTIONARIES} files, and an id that is Vela's own, before it starts`, async () => {
    const many = Array.from({ length: MAX_EXTRA_DICTIONARIES + 1 }, () => files.get(SECOND_ID)!).join(',');
    await expect(startTestServer({ env: { VELA_ZSTD_DICT: many } })).rejects.toThrow(`--zstd-dict (VELA_ZSTD_DICT): ${MAX_EXTRA_DICTIONARIES + 1} zstd dictionaries given; at most ${MAX_EXTRA_DICTIONARIES} are taken`);
    const own = new URL('../protocol/observation.zdict', import.meta.url).pathname;
    await expect(startTestServer({ env: { VELA_ZSTD_DICT: own } })).rejects.toThrow(`has id ${VELA_ID}, the id of Vela's own (GET /v1/observation.zdict)`);
  });
});
