/**
 * The real pi0 / pi0.5 in the Hugging Face Hub layout (issue 23): the key map (kernels/pi/keys.ts)
 * against FACTS.md's key lists, and the streaming reader/writer (server/models/hub-checkpoint.ts):
 * round trips in F32, BF16 and shards, errors naming every bad tensor, and the peak resident
 * memory of loading a ~1 GB checkpoint in a child process.
 */
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';
import {
  EMBEDDING_PARAM,
  HUB_EMBEDDING_KEY,
  HUB_EXPERT_LM_HEAD_KEY,
  paramToHubKey,
  piParamShapes,
  planHubLoad,
  type PiShapeConfig,
} from '../kernels/pi/keys.ts';
import { bf16BitsToF32, CheckpointError, decodeSafetensors, encodeSafetensors, f32ToBf16Bits, type SafeTensor } from '../kernels/safetensors.ts';
import { HubCheckpointError, readHubCheckpoint, writeHubCheckpoint } from '../server/models/hub-checkpoint.ts';
import { fakeParam, realShapes, tinyShapes } from './helpers/real-pi-tiny.ts';

const FIX = path.resolve(import.meta.dirname, 'fixtures/real-pi');
const rows = (file: string): [string, number[]][] => (JSON.parse(fs.readFileSync(path.join(FIX, file), 'utf8')) as [string, number[], string][]).map(([n, s]) => [n, s]);
const tmpRoot = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-hub-'));
afterAll(() => fs.rmSync(tmpRoot, { recursive: true, force: true }));
const numel = (shape: number[]): number => shape.reduce((a, b) => a * b, 1);
const source = (name: string, shape: number[]): Float32Array => fakeParam(name, numel(shape));

describe('Hub keys <-> LeRobot parameter names (FACTS.md key lists, full size)', () => {
  for (const variant of ['pi0', 'pi05'] as const) {
    const cfg = realShapes(variant);
    const stateDict = rows(`${variant}_state_dict.json`);
    const hubKeys = rows(`${variant}_hub_checkpoint_keys.json`);

    it(`${variant}: the model's parameters are LeRobot's state dict less the two LM heads, names and shapes in order`, () => {
      const expected = stateDict.filter(([n]) => !n.endsWith('lm_head.weight'));
      expect(expected.length).toBe(variant === 'pi0' ? 776 : 811);
      expect(piParamShapes(cfg)).toEqual(expected);
      const used = piParamShapes(cfg).reduce((a, [, s]) => a + numel(s), 0);
      expect(used).toBe(variant === 'pi0' ? 3_238_048_528 : 3_353_433_872); // FACTS.md 2.4
    });

    for (const spelling of ['with vision_model.', 'without vision_model.'] as const) {
      it(`${variant}: every Hub key (${spelling}) maps to a parameter of the right shape, none left over`, () => {
        const keys = hubKeys.map(([k, s]): [string, number[]] => [spelling === 'with vision_model.' ? k : k.replace('vision_tower.vision_model.', 'vision_tower.'), s]);
        if (spelling === 'with vision_model.') expect(keys.filter(([k]) => k.includes('vision_model.')).length).toBe(3 + 27 * 16 + 2);
        const plan = planHubLoad(new Map(keys), cfg);
        expect(plan.missing).toEqual([]);
        expect(plan.unexpected).toEqual([]);
        expect(plan.misshapen).toEqual([]);
        expect(plan.skipped.map((s) => s.key)).toEqual([HUB_EXPERT_LM_HEAD_KEY]);
        expect(plan.load.length).toBe(keys.length - 1);
        expect(new Set(plan.load.map((l) => l.name))).toEqual(new Set(piParamShapes(cfg).map(([n]) => n)));
        expect(plan.load.find((l) => l.key === HUB_EMBEDDING_KEY)?.name).toBe(EMBEDDING_PARAM);
      });
    }

    it(`${variant}: LeRobot-saved fine-tune layout (model. prefix, embed_tokens and lm_head both present) maps too`, () => {
      const keys = new Map(stateDict.map(([n, s]) => [n, s]));
      const plan = planHubLoad(keys, cfg);
      expect([plan.missing, plan.unexpected, plan.misshapen]).toEqual([[], [], []]);
      expect(plan.skipped.map((s) => s.key).sort()).toEqual([`model.${HUB_EMBEDDING_KEY}`, `model.${HUB_EXPERT_LM_HEAD_KEY}`].sort());
    });

    it(`${variant}: written back under exactly the Hub keys of the base checkpoint`, () => {
      const written = [...piParamShapes(cfg).map(([n, s]): [string, number[]] => [paramToHubKey(n), s]), [HUB_EXPERT_LM_HEAD_KEY, [cfg.vlm.vocabSize, cfg.expert.width]] as [string, number[]]];
      const sort = (l: [string, number[]][]) => [...l].sort((a, b) => (a[0] < b[0] ? -1 : 1));
      expect(sort(written)).toEqual(sort(hubKeys));
    });
  }

  it('accepts time_mlp_* and action_time_mlp_* by variant, and drops pi0.5 strays and old normaliser buffers as LeRobot does', () => {
    const cfg = realShapes('pi05');
    const keys = new Map(rows('pi05_hub_checkpoint_keys.json').map(([k, s]) => [k.replace(/^time_mlp_/, 'action_time_mlp_'), s]));
    keys.set('state_proj.weight', [1024, 32]);
    keys.set('paligemma_with_expert.gemma_expert.model.layers.3.input_layernorm.weight', [1024]);
    keys.set('normalize_inputs.buffer_observation_state.mean', [8]);
    const plan = planHubLoad(keys, cfg);
    expect([plan.missing, plan.unexpected, plan.misshapen]).toEqual([[], [], []]);
    expect(plan.load.find((l) => l.key === 'action_time_mlp_in.weight')?.name).toBe('model.time_mlp_in.weight');
    expect(plan.skipped.length).toBe(4);
    // The same strays are errors for pi0, where they would be parameters of another shape or none.
    const pi0 = planHubLoad(new Map([...rows('pi0_hub_checkpoint_keys.json'), ['time_mlp_in.weight', [1024, 1024]] as [string, number[]]]), realShapes('pi0'));
    expect(pi0.unexpected.map((u) => u.key)).toEqual(['time_mlp_in.weight']);
    expect(pi0.unexpected[0]!.why).toMatch(/action_time_mlp_in\.weight already supplies model\.action_time_mlp_in\.weight/);
  });
});

describe('Hub checkpoint files (tiny random model)', () => {
  for (const variant of ['pi0', 'pi05'] as const) {
    const cfg = tinyShapes(variant);
    const names = piParamShapes(cfg);

    it(`${variant}: F32 round trip is exact; the file holds the Hub keys and the Python layout`, async () => {
      const dir = path.join(tmpRoot, `${variant}-f32`);
      await writeHubCheckpoint(dir, { ...cfg, actionHorizon: 10 }, source);
      const back = await readHubCheckpoint(dir, cfg);
      expect(back.params!.size).toBe(names.length);
      for (const [name, shape] of names) {
        expect(back.params!.get(name)!.shape, name).toEqual(shape);
        expect(back.params!.get(name)!.data, name).toEqual(source(name, shape));
      }
      expect(back.dtypes).toEqual({ F32: names.length });
      const file = decodeSafetensors(fs.readFileSync(path.join(dir, 'model.safetensors')));
      expect(Object.keys(file.tensors).sort()).toEqual([...names.map(([n]) => paramToHubKey(n)), HUB_EXPERT_LM_HEAD_KEY].sort());
      expect(file.metadata).toEqual({ format: 'pt' });
      expect(file.tensors[HUB_EXPERT_LM_HEAD_KEY]!.data.every((v) => v === 0)).toBe(true);
      const config = JSON.parse(fs.readFileSync(path.join(dir, 'config.json'), 'utf8'));
      expect([config.type, config.chunk_size, config.tokenizer_max_length]).toEqual([variant, 10, variant === 'pi0' ? 48 : 200]);
    });

    it(`${variant}: BF16 round trip gives the values rounded to bfloat16 (nearest even), sharded too`, async () => {
      for (const maxShardBytes of [undefined, 50_000]) {
        const dir = path.join(tmpRoot, `${variant}-bf16-${maxShardBytes ?? 'one'}`);
        const res = await writeHubCheckpoint(dir, cfg, source, { dtype: 'BF16', maxShardBytes, expertLmHead: 'omit' });
        if (maxShardBytes) {
          const index = JSON.parse(fs.readFileSync(path.join(dir, 'model.safetensors.index.json'), 'utf8'));
          const shards = new Set(Object.values(index.weight_map));
          expect(shards.size).toBeGreaterThan(3);
          expect(res.files.filter((f) => f.endsWith('.safetensors')).length).toBe(shards.size);
          expect(fs.existsSync(path.join(dir, 'model.safetensors'))).toBe(false);
        }
        const back = await readHubCheckpoint(dir, cfg);
        expect(back.dtypes).toEqual({ BF16: names.length });
        for (const [name, shape] of names) {
          const want = source(name, shape).map((v) => bf16BitsToF32(f32ToBf16Bits(v)));
          expect(back.params!.get(name)!.data, name).toEqual(want);
        }
      }
    });
  }

  it('a source that gives each tensor in chunks writes the same bytes as one that gives it whole; a wrong count is refused', async () => {
    const cfg = tinyShapes('pi05');
    // Odd-sized chunks, so chunk edges fall inside BF16 pairs and CHUNK_BYTES-aligned runs alike.
    const chunked = (name: string, shape: number[]) => (function* () {
      const all = source(name, shape);
      for (let i = 0; i < all.length; i += 333) yield all.slice(i, i + 333);
    })();
    for (const dtype of ['F32', 'BF16'] as const) {
      const whole = path.join(tmpRoot, `pi05-whole-${dtype}`);
      const parts = path.join(tmpRoot, `pi05-chunked-${dtype}`);
      await writeHubCheckpoint(whole, cfg, source, { dtype });
      await writeHubCheckpoint(parts, cfg, chunked, { dtype });
      expect(fs.readFileSync(path.join(parts, 'model.safetensors')).equals(fs.readFileSync(path.join(whole, 'model.safetensors'))), dtype).toBe(true);
    }
    const [first, shape] = piParamShapes(cfg)[0]!;
    const n = shape.reduce((a, b) => a * b, 1);
    const short = (name: string, sh: number[]) => (function* () {
      const all = source(name, sh);
      yield name === first ? all.slice(0, all.length - 1) : all;
    })();
    await expect(writeHubCheckpoint(path.join(tmpRoot, 'pi05-short'), cfg, short)).rejects.toThrow(`parameter ${first} has ${n - 1} values; its shape [${shape.join(', ')}] needs ${n} float32 values`);
    expect(fs.existsSync(path.join(tmpRoot, 'pi05-short'))).toBe(false);
  });

  it('a sharded F32 checkpoint streams to a sink tensor by tensor, equal to the single-file one', async () => {
    const cfg = tinyShapes('pi0');
    const dir = path.join(tmpRoot, 'pi0-f32-shards');
    await writeHubCheckpoint(dir, cfg, source, { maxShardBytes: 100_000 });
    const seen: string[] = [];
    const res = await readHubCheckpoint(dir, cfg, {
      onTensor: (name, data, shape) => {
        seen.push(name);
        expect(data).toEqual(source(name, shape));
      },
    });
    expect(res.params).toBeNull();
    expect(res.files.length).toBeGreaterThan(2);
    expect(seen.sort()).toEqual(piParamShapes(cfg).map(([n]) => n).sort());
  });

  describe('errors name the tensor and the shape', () => {
    const cfg = tinyShapes('pi05');
    /** A checkpoint written by hand from the Hub keys of `cfg`, after `edit`. */
    function handMade(name: string, edit: (t: Record<string, SafeTensor>) => void, config: Record<string, unknown> = { type: 'pi05' }): string {
      const dir = path.join(tmpRoot, `bad-${name}`);
      fs.mkdirSync(dir, { recursive: true });
      const tensors: Record<string, SafeTensor> = {};
      for (const [n, shape] of piParamShapes(cfg)) tensors[paramToHubKey(n)] = { dtype: 'F32', shape, data: source(n, shape) };
      edit(tensors);
      fs.writeFileSync(path.join(dir, 'model.safetensors'), encodeSafetensors(tensors));
      fs.writeFileSync(path.join(dir, 'config.json'), JSON.stringify(config));
      return dir;
    }
    const fails = async (dir: string): Promise<HubCheckpointError> => {
      const err = await readHubCheckpoint(dir, cfg).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(HubCheckpointError);
      expect((err as CheckpointError).code).toBe('tensor_mismatch');
      expect((err as Error).message).not.toContain('\n');
      return err as HubCheckpointError;
    };

    it('missing', async () => {
      const err = await fails(handMade('missing', (t) => delete t['paligemma_with_expert.gemma_expert.model.layers.2.mlp.up_proj.weight']));
      expect(err.message).toContain('1 missing: model.paligemma_with_expert.gemma_expert.model.layers.2.mlp.up_proj.weight (expected [64, 32])');
    });

    it('extra', async () => {
      const err = await fails(handMade('extra', (t) => (t['paligemma_with_expert.gemma_expert.model.layers.9.mlp.up_proj.weight'] = { dtype: 'F32', shape: [2, 3], data: new Float32Array(6) })));
      expect(err.message).toContain('1 unexpected: paligemma_with_expert.gemma_expert.model.layers.9.mlp.up_proj.weight [2, 3]');
    });

    it('misshapen', async () => {
      const err = await fails(handMade('misshapen', (t) => (t['action_in_proj.weight'] = { dtype: 'F32', shape: [16, 32], data: new Float32Array(512) })));
      expect(err.message).toContain('1 misshapen: action_in_proj.weight is [16, 32], expected [32, 32] for model.action_in_proj.weight');
      expect(err.plan.misshapen).toEqual([{ key: 'action_in_proj.weight', name: 'model.action_in_proj.weight', shape: [16, 32], expected: [32, 32] }]);
    });

    it('all at once, and both vision spellings for one tensor', async () => {
      const dir = handMade('many', (t) => {
        delete t['time_mlp_in.bias'];
        t['paligemma_with_expert.paligemma.model.vision_tower.embeddings.patch_embedding.bias'] = t['paligemma_with_expert.paligemma.model.vision_tower.vision_model.embeddings.patch_embedding.bias']!;
        t['action_out_proj.bias'] = { dtype: 'F32', shape: [31], data: new Float32Array(31) };
      });
      const err = await fails(dir);
      expect(err.plan.missing).toEqual([{ name: 'model.time_mlp_in.bias', shape: [32] }]);
      expect(err.plan.misshapen.map((m) => [m.key, m.shape, m.expected])).toEqual([['action_out_proj.bias', [31], [32]]]);
      expect(err.plan.unexpected.length).toBe(1);
      expect(err.plan.unexpected[0]!.why).toMatch(/already supplies model\.paligemma_with_expert\.paligemma\.model\.vision_tower\.embeddings\.patch_embedding\.bias/);
      expect(err.message).toMatch(/1 missing: .*\| 1 misshapen: .*\| 1 unexpected: /);
    });

    it('the other variant, a missing config.json, a truncated file', async () => {
      const wrong = handMade('variant', () => undefined, { type: 'pi0' });
      await expect(readHubCheckpoint(wrong, cfg)).rejects.toThrow(/says type "pi0"; this model is pi05/);
      fs.rmSync(path.join(wrong, 'config.json'));
      await expect(readHubCheckpoint(wrong, cfg)).rejects.toThrow(/config\.json does not exist/);
      const cut = handMade('cut', () => undefined);
      const file = path.join(cut, 'model.safetensors');
      fs.truncateSync(file, fs.statSync(file).size - 4);
      await expect(readHubCheckpoint(cut, cfg)).rejects.toThrow(/outside the \d+ data bytes/);
    });

    it('a source giving the wrong number of values is refused by name, and nothing is left behind', async () => {
      const dir = path.join(tmpRoot, 'write-bad');
      const err = await writeHubCheckpoint(dir, cfg, (name, shape) => (name === 'model.action_out_proj.bias' ? new Float32Array(3) : source(name, shape))).catch((e: unknown) => e);
      expect((err as Error).message).toBe('parameter model.action_out_proj.bias has 3 values; its shape [32] needs 32 float32 values');
      expect(fs.existsSync(dir)).toBe(false);
      expect(fs.readdirSync(tmpRoot).filter((f) => f.includes('write-bad'))).toEqual([]);
    });
  });
});

describe('peak memory of a ~1 GB load (child process)', () => {
  // ~250 M parameters: a 257,152-row vocabulary at width 512 and a 12-layer 768-wide vision tower.
  const cfg: PiShapeConfig = {
    variant: 'pi05',
    vlm: { width: 512, depth: 4, mlpDim: 4096, numHeads: 8, numKvHeads: 1, headDim: 64, vocabSize: 257152 },
    expert: { width: 256, depth: 4, mlpDim: 1024, numHeads: 8, numKvHeads: 1, headDim: 64 },
    vision: { width: 768, depth: 12, mlpDim: 3072, patchSize: 14, imageSize: 224 },
    actionDim: 32,
  };
  const f32Bytes = piParamShapes(cfg).reduce((a, [, s]) => a + numel(s) * 4, 0);

  for (const dtype of ['F32', 'BF16'] as const) {
    it(`${dtype}: peak RSS stays within 1.15x the float32 parameters`, async () => {
      expect(f32Bytes).toBeGreaterThan(0.95e9);
      const dir = path.join(tmpRoot, `big-${dtype}`);
      await writeHubCheckpoint(dir, cfg, source, { dtype, expertLmHead: 'omit' });
      const { stdout } = await promisify(execFile)(process.execPath, ['--import', 'tsx', path.resolve(import.meta.dirname, 'helpers/hub-load-child.ts'), dir, JSON.stringify(cfg)], { timeout: 280_000, maxBuffer: 1 << 20 });
      const r = JSON.parse(stdout) as { baselineRss: number; peakRss: number; f32Bytes: number; loadMs: number; tensors: number };
      fs.rmSync(dir, { recursive: true, force: true });
      expect(r.f32Bytes).toBe(f32Bytes);
      const ratio = r.peakRss / f32Bytes;
      const overBaseline = (r.peakRss - r.baselineRss) / f32Bytes;
      console.log(`hub load ${dtype}: ${(f32Bytes / 1e9).toFixed(3)} GB float32, peak RSS ${(r.peakRss / 1e9).toFixed(3)} GB = ${ratio.toFixed(3)}x (${overBaseline.toFixed(3)}x above the ${(r.baselineRss / 1e6).toFixed(0)} MB baseline), ${r.loadMs.toFixed(0)} ms`);
      expect(ratio).toBeLessThanOrEqual(1.15);
    });
  }
});
