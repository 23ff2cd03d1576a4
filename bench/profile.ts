/**
 * Where a training step spends its time on the active backend: runs forward_backward +
 * optim_step under tf.profile on the main thread and sums kernel time by kernel name (and by
 * name + input shapes for the top rows). Wasm kernels are timed by wall clock each.
 *
 *   npx tsx bench/profile.ts --preset flow05-tiny --batch 8 --cameras 1 [--finetune full] [--top 25]
 */
import { parseArgs } from 'node:util';
import * as tf from '@tensorflow/tfjs';
import { initBackend } from '../kernels/backend/backend.ts';
import { makeConfig } from '../kernels/small/config.ts';
import { fakeBatch } from '../kernels/small/batch.ts';
import { BaseWeights, TrainingState } from '../kernels/trainer.ts';

const { values } = parseArgs({
  options: {
    preset: { type: 'string', default: 'flow05-tiny' },
    batch: { type: 'string', default: '8' },
    cameras: { type: 'string', default: '1' },
    finetune: { type: 'string', default: 'full' },
    top: { type: 'string', default: '25' },
  },
});
const backend = await initBackend();
const config = makeConfig(values.preset!);
const B = Number(values.batch);
const cams = Number(values.cameras);
const batch = fakeBatch(config, B, 1);
// Keep only the first `cams` slots filled, like a robot with that many cameras (D13).
for (let i = 0; i < B; i++) for (let k = cams; k < config.slots; k++) batch.imageMask[i * config.slots + k] = 0;
const base = BaseWeights.create(config, 0);
const state = new TrainingState(base, { finetune: values.finetune as 'full' | 'lora', seed: 0 });
const step = () => {
  state.forwardBackward(batch);
  state.optimStep({ learningRate: 1e-5 });
};
for (let i = 0; i < 3; i++) step();
// Wall time suffers from other processes on a shared machine; CPU time (user + system of this
// single-threaded process) much less, so both are shown, each the best of 8 steps.
let wallMs = Infinity;
let cpuMs = Infinity;
for (let i = 0; i < 8; i++) {
  const t0 = performance.now();
  const c0 = process.cpuUsage();
  step();
  const c = process.cpuUsage(c0);
  wallMs = Math.min(wallMs, performance.now() - t0);
  cpuMs = Math.min(cpuMs, (c.user + c.system) / 1000);
}
const info = await tf.profile(step);
const byName = new Map<string, { ms: number; n: number }>();
const byShape = new Map<string, { ms: number; n: number }>();
let total = 0;
for (const k of info.kernels) {
  const ms = Number(k.kernelTimeMs) || 0;
  total += ms;
  const a = byName.get(k.name) ?? { ms: 0, n: 0 };
  a.ms += ms;
  a.n++;
  byName.set(k.name, a);
  const key = `${k.name} ${k.inputShapes.map((s) => `[${s}]`).join(' ')}`;
  const b = byShape.get(key) ?? { ms: 0, n: 0 };
  b.ms += ms;
  b.n++;
  byShape.set(key, b);
}
const top = Number(values.top);
const print = (title: string, m: Map<string, { ms: number; n: number }>) => {
  process.stdout.write(`\n${title}\n`);
  for (const [k, v] of [...m].sort((x, y) => y[1].ms - x[1].ms).slice(0, top)) {
    process.stdout.write(`${v.ms.toFixed(1).padStart(8)} ms ${((100 * v.ms) / total).toFixed(1).padStart(5)}% ${String(v.n).padStart(5)}x  ${k}\n`);
  }
};
process.stdout.write(`backend ${backend.name}, ${config.preset} ${values.finetune} b${B} ${cams} camera(s): ${wallMs.toFixed(1)} ms/step wall, ${cpuMs.toFixed(1)} ms/step CPU (best of 8); profiled step: ${info.kernels.length} kernels, ${total.toFixed(1)} ms kernel time, ${info.peakBytes} peak bytes\n`);
print('by kernel', byName);
print('by kernel and input shapes', byShape);
state.dispose();
base.dispose();
