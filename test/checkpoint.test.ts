import * as tf from '@tensorflow/tfjs';
import { mkdtempSync, readdirSync, readFileSync, rmSync, unlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  CheckpointError,
  checkCompatible,
  loadCheckpoint,
  readCheckpointDir,
  saveCheckpoint,
  writeCheckpointDir,
  type CheckpointContent,
} from '../kernels/checkpoint.ts';
import { AdamWMoments, DEFAULT_ADAMW, adamwStep } from '../kernels/optim.ts';
import { decodeSafetensors } from '../kernels/safetensors.ts';
import { forEachBackend } from './helpers/tf.ts';

const root = mkdtempSync(path.join(tmpdir(), 'vela-ckpt-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));
let counter = 0;
const fresh = () => path.join(root, `ck${counter++}`);

const f32 = (...v: number[]) => Float32Array.from(v);
const stats = { mean: [0.5, -1], std: [2, 0.25], q01: [-3, -1.5], q99: [4, -0.5] };

function fullContent(): CheckpointContent {
  return {
    config: { preset: 'flow0-tiny', action_horizon: 16, action_dim: 32, camera_slots: ['cam_high'], finetune: 'full' },
    weights: { 'layer.w': { shape: [2, 2], data: f32(1, -2, 3.5, 1e-20) }, 'layer.b': { shape: [2], data: f32(0, -0) } },
    optimizer: {
      'layer.w.exp_avg': { shape: [2, 2], data: f32(0.1, 0.2, 0.3, 0.4) },
      'layer.w.exp_avg_sq': { shape: [2, 2], data: f32(1, 2, 3, 4) },
    },
    trainerState: { step: 7, rng: { seed: 42, counter: 99 } },
    normStats: { state: stats, actions: stats },
  };
}

/** The code of the CheckpointError a promise rejects with. */
async function codeOf(p: Promise<unknown>): Promise<string> {
  try {
    await p;
    return 'ok';
  } catch (err) {
    expect(err).toBeInstanceOf(CheckpointError);
    return `${(err as CheckpointError).code}: ${(err as Error).message}`;
  }
}

const parentEntries = (dir: string) => readdirSync(path.dirname(dir)).filter((n) => n.includes(path.basename(dir)));

describe('saveCheckpoint / loadCheckpoint', () => {
  it('round-trips weights, optimizer, trainer state and norm stats; writes the section 4 layout', async () => {
    const dir = fresh();
    const content = fullContent();
    await saveCheckpoint(dir, content);
    expect(readdirSync(dir).sort()).toEqual(['config.json', 'model.safetensors', 'norm_stats.json', 'optimizer.safetensors', 'trainer_state.json']);
    expect(parentEntries(dir)).toEqual([path.basename(dir)]); // no temporary folder left
    expect(await loadCheckpoint(dir)).toEqual(content);
    // model.safetensors is a standard file: F32 tensors, metadata {"format": "pt"}.
    const st = decodeSafetensors(new Uint8Array(readFileSync(path.join(dir, 'model.safetensors'))));
    expect(st.metadata).toEqual({ format: 'pt' });
    expect(st.tensors['layer.w']!.dtype).toBe('F32');
    expect(JSON.parse(readFileSync(path.join(dir, 'norm_stats.json'), 'utf8')).norm_stats.state.q99).toEqual([4, -0.5]);
  });

  it('round-trips a LoRA adapter with adapter_config.json', async () => {
    const dir = fresh();
    const content: CheckpointContent = {
      config: { preset: 'flow05-tiny', finetune: 'lora', lora: { rank: 4, alpha: 8, targets: ['attn'] } },
      adapter: { tensors: { 'q.lora_A': { shape: [1, 3], data: f32(1, 2, 3) } }, config: { r: 4, lora_alpha: 8, target_modules: ['q'] } },
    };
    await saveCheckpoint(dir, content);
    expect(readdirSync(dir).sort()).toEqual(['adapter_config.json', 'adapter_model.safetensors', 'config.json']);
    expect(await loadCheckpoint(dir, { preset: 'flow05-tiny' })).toEqual(content);
  });

  it('refuses a checkpoint of another preset with a clear error', async () => {
    const dir = fresh();
    await saveCheckpoint(dir, fullContent());
    expect(await codeOf(loadCheckpoint(dir, { preset: 'flow05-tiny' }))).toBe(
      'wrong_preset: checkpoint is for preset flow0-tiny; this session runs flow05-tiny',
    );
    expect(() => checkCompatible({ preset: 'pi0' }, { preset: 'flow0-small' })).not.toThrow();
    expect(() => checkCompatible({ preset: 'pi05' }, { preset: 'flow0-small' })).toThrow(/checkpoint is for preset pi05; this session runs flow0-small/);
    expect(await codeOf(loadCheckpoint(dir, { preset: 'flow0-tiny', action_horizon: 50 }))).toBe(
      'bad_config: checkpoint has action_horizon 16; this session has 50',
    );
    expect(await codeOf(loadCheckpoint(dir, { preset: 'flow0-tiny', camera_slots: ['cam_high'] }))).toBe('ok');
  });

  it('refuses incomplete or malformed folders with codes', async () => {
    expect(await codeOf(loadCheckpoint(path.join(root, 'nope')))).toMatch(/^missing_file: .* does not exist/);
    const dir = fresh();
    await saveCheckpoint(dir, fullContent());
    unlinkSync(path.join(dir, 'trainer_state.json'));
    expect(await codeOf(loadCheckpoint(dir))).toMatch(/^missing_file: .* has optimizer.safetensors without its pair/);
    unlinkSync(path.join(dir, 'model.safetensors'));
    expect(await codeOf(loadCheckpoint(dir))).toMatch(/^missing_file: .* neither model.safetensors nor adapter_model.safetensors/);
    writeFileSync(path.join(dir, 'config.json'), '{"preset": 3}');
    expect(await codeOf(readCheckpointDir(dir))).toMatch(/^bad_config: .*no string "preset"/);
    unlinkSync(path.join(dir, 'config.json'));
    expect(await codeOf(readCheckpointDir(dir))).toMatch(/^missing_file: .*no config.json/);
  });

  it('refuses bad content before writing anything', async () => {
    const dir = fresh();
    const { weights: _w, ...noWeights } = fullContent();
    expect(await codeOf(saveCheckpoint(dir, noWeights))).toBe('bad_config: a checkpoint needs weights or an adapter');
    const { trainerState: _t, ...noState } = fullContent();
    expect(await codeOf(saveCheckpoint(dir, noState))).toMatch(/^bad_config: a saved state needs both .* got optimizer only/);
    const bad = fullContent();
    bad.weights!['layer.b'] = { shape: [3], data: f32(1, 2) };
    expect(await codeOf(saveCheckpoint(dir, bad))).toMatch(/^shape_mismatch: tensor layer.b: 2 values for shape \[3\]/);
    expect(await codeOf(writeCheckpointDir(dir, { '../x': 'y' }))).toMatch(/^bad_config: checkpoint file name '..\/x'/);
    expect(parentEntries(dir)).toEqual([]);
  });
});

describe('atomic writes', () => {
  it('a crash mid-write leaves nothing under the final name', async () => {
    const dir = fresh();
    let release!: (err: Error) => void;
    let reached!: () => void;
    const midWrite = new Promise<void>((r) => (reached = r));
    const writing = writeCheckpointDir(dir, { 'config.json': '{"preset":"flow0-tiny"}', 'model.safetensors': new Uint8Array(1000) }, {
      writeFile: async (file, data) => {
        writeFileSync(file, data.subarray(0, data.length >> 1)); // half of the file is on disk
        if (file.endsWith('model.safetensors')) {
          reached();
          await new Promise<void>((_, reject) => (release = reject)); // the process "dies" here
        }
      },
    });
    await midWrite;
    // The disk as a crash would leave it: only the hidden temporary folder, partial contents.
    const entries = parentEntries(dir);
    expect(entries).toHaveLength(1);
    expect(entries[0]).toMatch(new RegExp(`^\\.${path.basename(dir)}\\.tmp-`));
    expect(await codeOf(loadCheckpoint(dir))).toMatch(/^missing_file: .* does not exist/);
    release(new Error('disk full'));
    expect(await codeOf(writing)).toMatch(/^io: writing checkpoint .*: disk full/);
    expect(parentEntries(dir)).toEqual([]); // the temporary folder is cleaned up on failure
  });

  it('overwrite rules: refused by default, replaces on request, a failed overwrite keeps the old one', async () => {
    const dir = fresh();
    await saveCheckpoint(dir, fullContent());
    const before = readFileSync(path.join(dir, 'model.safetensors'));
    const lora: CheckpointContent = {
      config: { preset: 'flow0-tiny', finetune: 'lora' },
      adapter: { tensors: { a: { shape: [1], data: f32(9) } }, config: { r: 1 } },
    };
    expect(await codeOf(saveCheckpoint(dir, lora))).toMatch(/^exists: checkpoint .* exists; pass overwrite to replace it/);
    expect(readFileSync(path.join(dir, 'model.safetensors')).equals(before)).toBe(true);

    const failing = saveCheckpoint(dir, lora, {
      overwrite: true,
      writeFile: async (file) => {
        if (file.endsWith('adapter_model.safetensors')) throw new Error('EIO injected');
        writeFileSync(file, '');
      },
    });
    expect(await codeOf(failing)).toMatch(/^io: .*EIO injected/);
    expect(await loadCheckpoint(dir)).toEqual(fullContent());

    await saveCheckpoint(dir, lora, { overwrite: true });
    expect(readdirSync(dir).sort()).toEqual(['adapter_config.json', 'adapter_model.safetensors', 'config.json']);
    expect(await loadCheckpoint(dir)).toEqual(lora);
    expect(parentEntries(dir)).toEqual([path.basename(dir)]); // old folder removed
  });
});

forEachBackend('optimizer state through a checkpoint', () => {
  it('save -> load -> AdamWMoments.import gives the identical next step', async () => {
    const mk = () => new Map([['w', tf.variable(tf.tensor([[0.5, -1.5], [2, 0.25]]))], ['b', tf.variable(tf.tensor([0.1, 0.2]))]]);
    const grads = (k: number) => new Map([['w', tf.tensor([[k, -0.5], [0.3, 2 * k]])], ['b', tf.tensor([-k, 0.01])]]);
    const opts = { ...DEFAULT_ADAMW, learningRate: 1e-2, weightDecay: 0.1 };
    const params = mk();
    const moments = AdamWMoments.create(params);
    for (const k of [1, 2]) {
      const g = grads(k);
      adamwStep(params, g, moments, opts);
      for (const t of g.values()) t.dispose();
    }
    const exported = moments.export();
    const weights = Object.fromEntries([...params].map(([k, p]) => [k, { shape: p.shape, data: p.dataSync() as Float32Array }]));
    const dir = fresh();
    await saveCheckpoint(dir, { config: { preset: 'flow05-tiny' }, weights, optimizer: exported.tensors, trainerState: { step: exported.step } });

    const loaded = await loadCheckpoint(dir, { preset: 'flow05-tiny' });
    const params2 = new Map(Object.entries(loaded.weights!).map(([k, t]) => [k, tf.variable(tf.tensor(t.data, t.shape))]));
    const moments2 = AdamWMoments.import(params2, { step: loaded.trainerState!.step, tensors: loaded.optimizer! });
    const g = grads(3);
    adamwStep(params, g, moments, opts);
    adamwStep(params2, g, moments2, opts);
    for (const [k, p] of params) expect(params2.get(k)!.dataSync()).toEqual(p.dataSync());
    expect(moments2.step).toBe(3);
    moments.dispose();
    moments2.dispose();
    for (const m of [params, params2, g]) for (const t of m.values()) t.dispose();
  });
});
