/**
 * A checkpoint folder as LeRobot's processor pipeline saves it (issue 32 items 3 and 4): the
 * tokenizer in `tokenizer/`, named by `policy_preprocessor.json`'s tokenizer_processor step, and the
 * normaliser's stats in its state files, applied with LeRobot's arithmetic
 * (kernels/normalize.ts NormConvention). Through the real server (a session on the folder) and
 * `vela policy --base` (a real child process on wasm), with an empty Hugging Face cache so that
 * nothing but the folder can supply the tokenizer. The values LeRobot's own code gives for such a
 * folder are checked in test/lerobot-e2e.test.ts; here the two conventions are told apart.
 */
import { type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { VelaClient, type Datum } from '../protocol/client.ts';
import { ndarray } from '../protocol/ndarray.ts';
import { normStatsToJson, type NormStatsSet } from '../kernels/normalize.ts';
import { checkpointTokenizer } from '../server/models/tokenizer.ts';
import { g1Datums } from '../bench/harness/g1.ts';
import { PolicyClient } from '../bench/harness/policy-stub.ts';
import { startPolicyProc } from './helpers/policy-proc.ts';
import { lerobotPreprocessor, writeLerobotStats, writeTinyBase } from './helpers/real-pi-base.ts';
import { startTestServer, type TestServer } from './helpers/server.ts';

const SEED = 7;
let tmp: string;
let emptyCache: string;
const procs: ChildProcess[] = [];
const savedCache = process.env.HF_HUB_CACHE;

beforeAll(() => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-lerobot-ck-'));
  emptyCache = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-empty-hf-'));
});
afterAll(() => {
  for (const p of procs) p.kill('SIGTERM');
  if (savedCache === undefined) delete process.env.HF_HUB_CACHE;
  else process.env.HF_HUB_CACHE = savedCache;
  fs.rmSync(tmp, { recursive: true, force: true });
  fs.rmSync(emptyCache, { recursive: true, force: true });
});

describe('checkpointTokenizer: the tokenizer a folder carries or names', () => {
  const env = () => ({ HF_HUB_CACHE: emptyCache });
  const dirWith = (name: string, files: Record<string, string>): string => {
    const dir = path.join(tmp, name);
    for (const [f, text] of Object.entries(files)) {
      fs.mkdirSync(path.dirname(path.join(dir, f)), { recursive: true });
      fs.writeFileSync(path.join(dir, f), text);
    }
    return dir;
  };
  const pre = (tokenizerName: string) => JSON.stringify(lerobotPreprocessor(48, tokenizerName));

  it('finds tokenizer.json at the root, the folder policy_preprocessor.json names, or tokenizer/', () => {
    const root = dirWith('root', { 'tokenizer.json': '{}' });
    expect(checkpointTokenizer(root, env())).toEqual({ file: path.join(root, 'tokenizer.json'), from: 'tokenizer.json in the folder' });
    const named = dirWith('named', { 'policy_preprocessor.json': pre('tok_v2'), 'tok_v2/tokenizer.json': '{}', 'tokenizer/tokenizer.json': '{}' });
    expect(checkpointTokenizer(named, env())).toEqual({ file: path.join(named, 'tok_v2', 'tokenizer.json'), from: "tok_v2/ (policy_preprocessor.json's tokenizer_processor)" });
    const bare = dirWith('bare', { 'tokenizer/tokenizer.json': '{}' });
    expect(checkpointTokenizer(bare, env())!.file).toBe(path.join(bare, 'tokenizer', 'tokenizer.json'));
    expect(checkpointTokenizer(dirWith('none', { 'config.json': '{}' }), env())).toBeNull();
  });

  it('a Hub id (older pipelines name google/paligemma-3b-pt-224) is looked up in the HF cache', () => {
    const dir = dirWith('hub-named', { 'policy_preprocessor.json': pre('google/paligemma-3b-pt-224') });
    expect(checkpointTokenizer(dir, env())).toBeNull();
    const cache = path.join(tmp, 'hf-cache');
    const snap = path.join(cache, 'models--google--paligemma-3b-pt-224', 'snapshots', 'abc123');
    fs.mkdirSync(snap, { recursive: true });
    fs.writeFileSync(path.join(snap, 'tokenizer.json'), '{}');
    expect(checkpointTokenizer(dir, { HF_HUB_CACHE: cache })!.file).toBe(path.join(snap, 'tokenizer.json'));
  });

  it('refuses a name that leaves the folder, a link out of it, a named folder without tokenizer.json, and a pipeline that is not JSON', () => {
    const outside = dirWith('outside', { 'tokenizer.json': '{}' });
    expect(() => checkpointTokenizer(dirWith('dotdot', { 'policy_preprocessor.json': pre('../outside') }), env())).toThrow(
      /tokenizer_name "..\/outside": a tokenizer in the checkpoint must be a folder inside it \(LeRobot writes "tokenizer"\)$/,
    );
    expect(() => checkpointTokenizer(dirWith('abs', { 'policy_preprocessor.json': pre(outside) }), env())).toThrow(/must be a folder inside it/);
    const link = dirWith('link', { 'policy_preprocessor.json': pre('tok') });
    fs.symlinkSync(outside, path.join(link, 'tok'));
    expect(() => checkpointTokenizer(link, env())).toThrow(/tokenizer_name "tok", a link that leaves the checkpoint folder$/);
    const empty = dirWith('empty', { 'policy_preprocessor.json': pre('tokenizer'), 'tokenizer/README': 'x' });
    expect(() => checkpointTokenizer(empty, env())).toThrow(/tokenizer_name "tokenizer", a folder without tokenizer.json/);
    expect(() => checkpointTokenizer(dirWith('badjson', { 'policy_preprocessor.json': '{not json' }), env())).toThrow(/policy_preprocessor.json is not a JSON object/);
  });
});

describe('a session on a LeRobot-saved folder (tokenizer/ only, empty HF cache)', () => {
  let server: TestServer;
  beforeAll(async () => {
    process.env.HF_HUB_CACHE = emptyCache;
    server = await startTestServer();
  }, 60_000);
  afterAll(() => server?.close());

  it('opens and samples what the same weights with a root tokenizer.json sample (the same prompt ids)', { timeout: 120_000 }, async () => {
    const [lerobot, root] = await Promise.all([
      writeTinyBase('pi05', { dir: path.join(tmp, 'session_lerobot'), tokenizer: 'lerobot' }),
      writeTinyBase('pi05', { dir: path.join(tmp, 'session_root') }),
    ]);
    expect(fs.existsSync(path.join(lerobot, 'tokenizer.json'))).toBe(false);
    const client = new VelaClient(server.baseUrl, server.apiKey);
    const batch: Datum[] = await g1Datums(2, { episode: 0, horizon: 10 });
    // One engine per base folder: the two start and sample side by side. Two Euler steps: the
    // prompt ids reach the answer at the first step's velocity already.
    const answers = await Promise.all([lerobot, root].map(async (base) => {
      const s = await client.waitReady((await client.createSession({ base_model: 'pi05', base })).id);
      const conn = await client.connect(s);
      const actions = (await conn.sample(batch, { codec: 'JPEG', seed: 3, num_steps: 2 })).actions.data as Float32Array;
      conn.close();
      return actions;
    }));
    // Same weights, inputs and seed; only the tokenizer's place differs, so the answers are identical.
    expect(Array.from(answers[0]!)).toEqual(Array.from(answers[1]!));
  });
});

describe('vela policy --base on a LeRobot fine-tune: LeRobot\'s normalisation arithmetic', () => {
  // pi0 (MEAN_STD). The robot sends the state's mean exactly, so the normalised state is 0 under
  // either arithmetic and the model's normalised actions n are the same in both processes (wasm,
  // one thread, same seed). The action std is 1e-6 and the mean 0: LeRobot unnormalises n * std,
  // openpi n * (std + 1e-6), twice as far. Vela's own outputs (norm_stats.json beside the LeRobot
  // files) keep openpi's arithmetic, which they were trained with.
  const D = 8;
  const stats: NormStatsSet = {
    state: { mean: [0.25, -0.5, 0.125, 1, -1, 0.75, 0.0625, -0.25], std: [0.08, 0.5, 0.25, 1, 2, 0.125, 0.08, 1], q01: new Array(D).fill(-3), q99: new Array(D).fill(3) },
    actions: { mean: new Array(D).fill(0), std: new Array(D).fill(1e-6), q01: new Array(D).fill(-1e-5), q99: new Array(D).fill(1e-5) },
  };

  async function actionsOf(base: string): Promise<number[]> {
    const p = await startPolicyProc(['--base', base, '--cameras', 'cam_high', '--seed', String(SEED)], { HF_HUB_CACHE: emptyCache });
    procs.push(p.proc);
    const probe = (await g1Datums(1, { horizon: 10 }))[0]!;
    const c = await PolicyClient.connect(`${p.url}?seed=${SEED}`);
    try {
      const obs = { 'observation/cam_high': probe.observation.image!.cam_high, image_codec: 'JPEG', 'observation/state': ndarray(Float32Array.from(stats.state.mean), [D]), prompt: 'pick up the bottle' };
      const a = (await c.infer(obs)).actions;
      expect(a.shape).toEqual([10, D]);
      return Array.from(a.data as Float32Array);
    } finally {
      c.close();
    }
  }

  it('unnormalises with std (LeRobot), not std + 1e-6 (openpi), and keeps openpi\'s for Vela\'s own outputs', { timeout: 180_000 }, async () => {
    const lerobot = await writeTinyBase('pi0', { dir: path.join(tmp, 'policy_lerobot'), tokenizer: 'lerobot' });
    writeLerobotStats(lerobot, 48, 'MEAN_STD', stats);
    const vela = path.join(tmp, 'policy_vela');
    fs.cpSync(lerobot, vela, { recursive: true });
    fs.writeFileSync(path.join(vela, 'norm_stats.json'), normStatsToJson(stats));
    const [l, v] = await Promise.all([actionsOf(lerobot), actionsOf(vela)]);
    expect(Math.max(...l.map(Math.abs))).toBeGreaterThan(1e-8);
    // v = fround(n * 2e-6) and l = fround(n * 1e-6) for the same float32 n: 2 l and v are each one
    // rounding (half an ulp, 2^-24 relative) from 2 n * 1e-6, so |v - 2 l| <= 2^-23 |v|.
    v.forEach((x, i) => expect(Math.abs(x - 2 * l[i]!), `dim ${i}: ${x} vs 2 x ${l[i]}`).toBeLessThanOrEqual(2 ** -23 * Math.abs(x)));
  });
});

