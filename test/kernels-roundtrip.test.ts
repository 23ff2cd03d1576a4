/** save -> load through checkpoint files (kernels/checkpoint.ts) gives identical outputs and an
 * identical next optimizer step, for a LoRA and a full session; another preset is refused. */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, expect, it } from 'vitest';
import { forEachBackend } from './helpers/tf.ts';
import { makeConfig } from '../kernels/small/config.ts';
import { fakeBatch } from '../kernels/small/batch.ts';
import { BaseWeights, TrainingState, type ExportedState } from '../kernels/trainer.ts';
import { loadCheckpoint, saveCheckpoint, type CheckpointContent } from '../kernels/checkpoint.ts';

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-kernels-'));
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

function toContent(ex: ExportedState): CheckpointContent {
  const content: CheckpointContent = { config: { ...ex.config } };
  if (ex.config.finetune === 'lora') content.adapter = { tensors: ex.weights, config: { r: ex.config.lora_rank, lora_alpha: ex.config.lora_alpha, target_modules: ex.config.lora_targets } };
  else content.weights = ex.weights;
  if (ex.optimizer) content.optimizer = ex.optimizer;
  if (ex.trainerState) content.trainerState = ex.trainerState;
  return content;
}

forEachBackend('kernels: checkpoint round trip', (kind) => {
  it.each(['lora', 'full'] as const)('save_state -> load_state (%s) gives identical outputs and the same next step', async (finetune) => {
    const c = makeConfig('flow05-tiny', { imageSize: 32, width: 32, depth: 2, heads: 2, headDim: 16, mlpDim: 64, maxTokenLen: 8, stateDim: 4, actionDim: 3, horizon: 3 });
    const b = fakeBatch(c, 2, 1);
    const base = BaseWeights.create(c, 5);
    const s1 = new TrainingState(base, { finetune, rank: 4, targets: ['attn', 'action_expert'], seed: 2 });
    for (let i = 0; i < 2; i++) {
      s1.forwardBackward(b);
      s1.optimStep({ learningRate: 1e-2, weightDecay: 0.1 });
    }
    const dir = path.join(tmp, `state-${kind}-${finetune}`);
    await saveCheckpoint(dir, toContent(s1.exportState()));
    const loaded = await loadCheckpoint(dir, { preset: c.preset });
    const s2 = new TrainingState(base, { finetune, rank: 4, targets: ['attn', 'action_expert'], seed: 77 });
    s2.importState({ ...(loaded as unknown as ExportedState), weights: loaded.weights ?? loaded.adapter!.tensors });
    expect(s2.step).toBe(2);
    expect(s2.sample(b, { seed: 9, numSteps: 3 })).toEqual(s1.sample(b, { seed: 9, numSteps: 3 }));
    expect(s2.forwardBackward(b).lossPerDatum).toEqual(s1.forwardBackward(b).lossPerDatum);
    expect(s2.optimStep({ learningRate: 1e-2, weightDecay: 0.1 })).toEqual(s1.optimStep({ learningRate: 1e-2, weightDecay: 0.1 }));
    const w1 = s1.trainableTensors();
    for (const [n, t] of Object.entries(s2.trainableTensors())) expect(t.data, n).toEqual(w1[n]!.data);
    await expect(loadCheckpoint(dir, { preset: 'flow0-tiny' })).rejects.toThrow(/preset/);
    s1.dispose();
    s2.dispose();
    base.dispose();
  });
});
