/**
 * `vela models init` (issue 35 item 5): random-weight pi0 / pi0.5 checkpoints in the Hub base
 * layout, written offline, as a user runs it:
 * - tiny pi0 and pi0.5 in BF16 by the real CLI process; `vela models inspect` (a process) reads the
 *   variant and the parameter count; every tensor is the contract's init rounded to BF16; `vela
 *   policy --base` (a process) serves the pi0.5 one and answers an OpenPI request;
 * - `--size full --dry-run` for both variants: tensors and bytes equal the committed key lists of
 *   lerobot/pi0_base and pi05_base (so CI never writes 7 GB), and nothing is written;
 * - --seed, the refusal of a non-empty folder, --force, and the shipped test tokenizer's marks.
 */
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { decodeSafetensors } from '../kernels/safetensors.ts';
import { piParamShapes, paramToHubKey } from '../kernels/pi/keys.ts';
import { contractInitChunks, contractInitValues } from '../kernels/pi/params.ts';
import { initCheckpoint, initRealConfig, TEST_TOKENIZER_ASSET_DIR } from '../server/models/init-checkpoint.ts';
import { g1Datums } from '../bench/harness/g1.ts';
import { PolicyClient } from '../bench/harness/policy-stub.ts';
import { startPolicyProc, type PolicyProc } from './helpers/policy-proc.ts';

const ROOT = path.resolve(import.meta.dirname, '..');
const run = promisify(execFile);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-models-init-'));
const procs: PolicyProc[] = [];
afterAll(() => {
  for (const p of procs) p.proc.kill('SIGKILL');
  fs.rmSync(tmp, { recursive: true, force: true });
});

/** `vela ARGS` as a process: exit code, stdout, stderr. */
async function vela(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const r = await run(process.execPath, [path.join(ROOT, 'bin/vela.js'), ...args], { cwd: ROOT, timeout: 120_000 });
    return { code: 0, stdout: r.stdout, stderr: r.stderr };
  } catch (e) {
    const x = e as { code?: number; stdout?: string; stderr?: string };
    return { code: typeof x.code === 'number' ? x.code : -1, stdout: x.stdout ?? '', stderr: x.stderr ?? '' };
  }
}

/** Totals of a committed Hub key list ([key, shape, dtype] rows). */
function keyListTotals(file: string): { tensors: number; values: number } {
  const rows = JSON.parse(fs.readFileSync(path.join(ROOT, 'test/fixtures/real-pi', file), 'utf8')) as [string, number[], string][];
  return { tensors: rows.length, values: rows.reduce((a, [, s]) => a + s.reduce((x, d) => x * d, 1), 0) };
}

/** float32 values of `x` whose low 16 bits are all zero (exactly representable in BF16). */
const isBf16 = (x: Float32Array) => new Uint32Array(x.buffer, x.byteOffset, x.length).every((u) => (u & 0xffff) === 0);

describe('vela models init --size tiny (BF16), through the CLI', () => {
  const dirs = { pi0: path.join(tmp, 'tiny_pi0'), pi05: path.join(tmp, 'tiny_pi05') };
  const out: Record<string, { code: number; stdout: string; stderr: string }> = {};

  beforeAll(async () => {
    for (const v of ['pi0', 'pi05'] as const) out[v] = await vela(['models', 'init', dirs[v], '--variant', v, '--size', 'tiny']);
  }, 120_000);

  it('writes the Hub base layout, with the test tokenizer and a card that says what it is', () => {
    for (const v of ['pi0', 'pi05'] as const) {
      expect(out[v]!.code, out[v]!.stderr).toBe(0);
      expect(out[v]!.stdout).toBe(`${dirs[v]}\n`);
      expect(out[v]!.stderr).toContain(`serve it: vela policy --base ${dirs[v]}`);
      expect(fs.readdirSync(dirs[v]).sort()).toEqual(['README.md', 'config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json']);
      // No temporary folder is left beside it.
      expect(fs.readdirSync(tmp).filter((f) => f.startsWith('.'))).toEqual([]);
      const config = JSON.parse(fs.readFileSync(path.join(dirs[v], 'config.json'), 'utf8'));
      expect(config).toMatchObject({ type: v, dtype: 'bfloat16', paligemma_variant: 'gemma_2b', chunk_size: 10, vela_real_pi_config: { variant: v } });
      expect(fs.readFileSync(path.join(dirs[v], 'README.md'), 'utf8')).toMatch(/NOT a trained model[\s\S]*NOT PaliGemma's/);
      expect(JSON.parse(fs.readFileSync(path.join(dirs[v], 'tokenizer_config.json'), 'utf8')).vela_note).toMatch(/NOT PaliGemma's/);
    }
  });

  it('every tensor is the contract init rule rounded to BF16 (the expert LM head: zeros)', () => {
    for (const v of ['pi0', 'pi05'] as const) {
      const c = initRealConfig(v, 'tiny');
      const { tensors } = decodeSafetensors(fs.readFileSync(path.join(dirs[v], 'model.safetensors')));
      const shapes = piParamShapes(c);
      expect(Object.keys(tensors)).toHaveLength(shapes.length + 1);
      for (const [name, shape] of shapes) {
        const t = tensors[paramToHubKey(name)]!;
        expect(t.dtype).toBe('BF16');
        expect(t.shape).toEqual(shape);
        const got = t.data as Float32Array;
        const want = contractInitValues(name, got.length);
        expect(isBf16(got), name).toBe(true);
        // BF16 keeps 8 significant bits: rounding to nearest moves a value by at most 2^-8 of itself.
        for (let i = 0; i < got.length; i++) if (Math.abs(got[i]! - want[i]!) > 2 ** -8 * Math.abs(want[i]!)) throw new Error(`${name}[${i}]: ${got[i]} vs ${want[i]}`);
      }
      const head = tensors['paligemma_with_expert.gemma_expert.lm_head.weight']!;
      expect(head.shape).toEqual([c.vlm.vocabSize, c.expert.width]);
      expect((head.data as Float32Array).every((x) => x === 0)).toBe(true);
    }
  });

  it('`vela models inspect` reads the variant, the parameter count, BF16 and the test tokenizer', async () => {
    // Parameter counts of FACTS 5.2's tiny configs with the test tokenizer's 1,011-id vocabulary.
    const expected = { pi0: 343_968, pi05: 370_112 };
    for (const v of ['pi0', 'pi05'] as const) {
      const r = await vela(['models', 'inspect', dirs[v], '--json']);
      expect(r.code, r.stderr).toBe(0);
      const s = JSON.parse(r.stdout);
      expect(s).toMatchObject({ kind: v, config: { variant: v }, dtypes: { BF16: expect.any(Number) } });
      expect(s.parameters).toBe(expected[v]);
      const text = (await vela(['models', 'inspect', dirs[v]])).stdout;
      expect(text).toContain('tokenizer   tokenizer.json in the folder: the small test tokenizer of `vela models init`, NOT PaliGemma\'s');
    }
  });

  it('`vela policy --base` serves the tiny pi0.5 and answers an OpenPI request', { timeout: 120_000 }, async () => {
    const p = await startPolicyProc(['--base', dirs.pi05, '--cameras', 'cam_high']);
    procs.push(p);
    const o = (await g1Datums(1, { horizon: 10 }))[0]!.observation;
    const c = await PolicyClient.connect(`${p.url}?seed=1`);
    try {
      expect(c.metadata).toMatchObject({ model: 'pi05', cameras: ['cam_high'], action_horizon: 10 });
      const a = (await c.infer({ 'observation/cam_high': o.image!.cam_high, image_codec: 'JPEG', 'observation/state': o.state, prompt: o.prompt })).actions;
      expect(a.shape).toEqual([10, 32]);
      expect(Array.from(a.data as Float32Array).every(Number.isFinite)).toBe(true);
    } finally {
      c.close();
    }
  });
});

describe('vela models init --size full --dry-run', () => {
  it('prints the public bases\' tensor counts and BF16 bytes, equal to the committed key lists, and writes nothing', async () => {
    for (const [v, file] of [['pi05', 'pi05_hub_checkpoint_keys.json'], ['pi0', 'pi0_hub_checkpoint_keys.json']] as const) {
      const want = keyListTotals(file);
      const dir = path.join(tmp, `full_${v}`);
      const r = await vela(['models', 'init', dir, '--variant', v, '--size', 'full', '--dry-run']);
      expect(r.code, r.stderr).toBe(0);
      const m = /^(pi0|pi05): (\d+) tensors, (\d+) values \((\d+) parameters\), BF16: (\d+) bytes of tensor data, model\.safetensors (\d+) bytes/.exec(r.stdout);
      expect(m, r.stdout).not.toBeNull();
      expect({ variant: m![1], tensors: Number(m![2]), values: Number(m![3]), dataBytes: Number(m![5]) }).toEqual({ variant: v, tensors: want.tensors, values: want.values, dataBytes: 2 * want.values });
      expect(fs.existsSync(dir)).toBe(false);
    }
    // The numbers for pi0.5: 812 tensors, 7,233,515,040 bytes in BF16.
    expect(keyListTotals('pi05_hub_checkpoint_keys.json')).toEqual({ tensors: 812, values: 7_233_515_040 / 2 });
  });
});

describe('initCheckpoint: seed, existing folders, the tokenizer asset', () => {
  const firstParam = (dir: string) => {
    const [name] = piParamShapes(initRealConfig('pi05', 'tiny'))[0]!;
    return Array.from(decodeSafetensors(fs.readFileSync(path.join(dir, 'model.safetensors'))).tensors[paramToHubKey(name)]!.data as Float32Array);
  };

  it('--seed N gives other values, the same for the same N; without it the contract\'s', async () => {
    const a = path.join(tmp, 'seed-none');
    const b = path.join(tmp, 'seed-7');
    const c = path.join(tmp, 'seed-7-again');
    await initCheckpoint(a, { variant: 'pi05', dtype: 'F32' });
    expect((await vela(['models', 'init', b, '--variant', 'pi05', '--dtype', 'f32', '--seed', '7'])).code).toBe(0);
    await initCheckpoint(c, { variant: 'pi05', dtype: 'F32', seed: 7 });
    const [name, shape] = piParamShapes(initRealConfig('pi05', 'tiny'))[0]!;
    expect(firstParam(a)).toEqual(Array.from(contractInitValues(name, shape.reduce((x, d) => x * d, 1))));
    expect(firstParam(b)).not.toEqual(firstParam(a));
    expect(fs.readFileSync(path.join(b, 'model.safetensors')).equals(fs.readFileSync(path.join(c, 'model.safetensors')))).toBe(true);
    // Same distribution: uniform in [-0.05, 0.05).
    expect(firstParam(b).every((x) => x >= -0.05 && x < 0.05)).toBe(true);
  });

  it('the chunked init gives the contract\'s values across chunk boundaries (full-size tensors are made 4 M values at a time)', () => {
    const name = 'model.paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight';
    const chunks = [...contractInitChunks(name, 1000, { chunk: 7 })];
    expect(chunks.map((c) => c.length)).toEqual([...Array(142).fill(7), 6]);
    expect(Float32Array.from(chunks.flatMap((c) => Array.from(c)))).toEqual(contractInitValues(name, 1000));
  });

  it('refuses a non-empty folder (exit 1, nothing touched) unless --force; an empty one is filled', async () => {
    const dir = path.join(tmp, 'busy');
    fs.mkdirSync(dir);
    fs.writeFileSync(path.join(dir, 'mine.txt'), 'keep');
    const r = await vela(['models', 'init', dir, '--variant', 'pi0']);
    expect(r.code).toBe(1);
    expect(r.stderr).toBe(`vela models init: ${dir} is not empty; pick a new folder, or pass --force to replace what is there\n`);
    expect(fs.readdirSync(dir)).toEqual(['mine.txt']);
    const forced = await vela(['models', 'init', dir, '--variant', 'pi0', '--force']);
    expect(forced.code, forced.stderr).toBe(0);
    expect(fs.readdirSync(dir).sort()).toEqual(['README.md', 'config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json']);
    const empty = path.join(tmp, 'empty');
    fs.mkdirSync(empty);
    await initCheckpoint(empty, { variant: 'pi0', tokenizer: false });
    expect(fs.readdirSync(empty).sort()).toEqual(['README.md', 'config.json', 'model.safetensors']);
  });

  it('the shipped tokenizer is the test vectors\' one, marked NOT PaliGemma\'s', () => {
    const vectors = path.join(ROOT, 'test/vectors/real-pi/tokenizer');
    expect(fs.readFileSync(path.join(TEST_TOKENIZER_ASSET_DIR, 'tokenizer.json')).equals(fs.readFileSync(path.join(vectors, 'tokenizer.json')))).toBe(true);
    const { vela_note: note, ...rest } = JSON.parse(fs.readFileSync(path.join(TEST_TOKENIZER_ASSET_DIR, 'tokenizer_config.json'), 'utf8'));
    expect(rest).toEqual(JSON.parse(fs.readFileSync(path.join(vectors, 'tokenizer_config.json'), 'utf8')));
    expect(note).toMatch(/a small test tokenizer .*NOT PaliGemma's/);
    expect(fs.readFileSync(path.join(TEST_TOKENIZER_ASSET_DIR, 'README.txt'), 'utf8')).toMatch(/^A small test tokenizer, NOT PaliGemma's\./);
  });
});
