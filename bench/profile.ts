/**
 * Where a training step (or a sample) spends its time on the active backend: runs
 * forward_backward + optim_step (`--what sample`: one 10-step sample) eagerly under tf.profile on
 * the main thread and sums kernel time by kernel name (and by name + input shapes for the top
 * rows); wall time beyond the kernel time is dispatch. Wasm kernels are timed by wall clock each.
 * On native TensorFlow it then times the same work with graphs (kernels/backend/graph.ts) in
 * turns with the eager run, and prints how many ops the graphs hold.
 *
 *   npx tsx bench/profile.ts --preset flow05-tiny --batch 8 --cameras 1 [--finetune full] [--top 25]
 *   npx tsx bench/profile.ts --what sample --batch 1
 */
import { parseArgs } from 'node:util';
import * as tf from '@tensorflow/tfjs';
import { initBackend } from '../kernels/backend/backend.ts';
import { makeConfig } from '../kernels/small/config.ts';
import { fakeBatch } from '../kernels/small/batch.ts';
import { BaseWeights, TrainingState } from '../kernels/trainer.ts';
import { graphsAvailable } from '../kernels/backend/graph.ts';
import { sampleGraphStats } from '../kernels/sample-graph.ts';
import { lossGraphStats } from '../kernels/step-graph.ts';

const USAGE = `usage: npx tsx bench/profile.ts [options]
  --what step|sample   a training step (forward_backward + optim_step) or a 10-step sample (default step)
  --preset NAME        a small preset (default flow05-tiny)
  --batch N            datums (default 8)
  --cameras N          camera slots filled (default 1)
  --finetune full|lora (default full)
  --top N              rows per table (default 25)
Kernel times are taken one kernel at a time (tf.profile waits for each), so their sum overstates
the wall time; on native TensorFlow the last line times the same work as graphs in turns with eager.
`;
/** Stops with one line (and the usage) instead of a stack trace. */
function usageError(message: string): never {
  process.stderr.write(`bench/profile.ts: ${message}\n${USAGE}`);
  process.exit(2);
}
let parsed: ReturnType<typeof parseArgs<{ options: Record<string, { type: 'string' | 'boolean'; default?: string | boolean }> }>>;
try {
  parsed = parseArgs({
    options: {
      preset: { type: 'string', default: 'flow05-tiny' },
      batch: { type: 'string', default: '8' },
      cameras: { type: 'string', default: '1' },
      finetune: { type: 'string', default: 'full' },
      top: { type: 'string', default: '25' },
      what: { type: 'string', default: 'step' },
      help: { type: 'boolean', default: false },
    },
  });
} catch (e) {
  usageError((e as Error).message);
}
const values = parsed.values as Record<string, string> & { help: boolean };
if (values.help) {
  process.stdout.write(USAGE);
  process.exit(0);
}
if (values.what !== 'step' && values.what !== 'sample') usageError(`--what is '${values.what}'; expected step or sample`);
const backend = await initBackend();
const config = makeConfig(values.preset!);
const B = Number(values.batch);
const cams = Number(values.cameras);
const batch = fakeBatch(config, B, 1);
// Keep only the first `cams` slots filled, like a robot with that many cameras (D13).
for (let i = 0; i < B; i++) for (let k = cams; k < config.slots; k++) batch.imageMask[i * config.slots + k] = 0;
const base = BaseWeights.create(config, 0);
const state = new TrainingState(base, { finetune: values.finetune as 'full' | 'lora', seed: 0 });
const step = values.what === 'sample'
  ? () => void state.sample(batch, { seed: 1 })
  : () => {
      state.forwardBackward(batch);
      state.optimStep({ learningRate: 1e-5 });
    };
/** Best wall and CPU ms of `n` calls of `f` with graphs on or off. */
const best = (graphs: boolean, n: number) => {
  process.env.VELA_GRAPHS = graphs ? '1' : '0';
  let wall = Infinity;
  let cpu = Infinity;
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    const c0 = process.cpuUsage();
    step();
    const c = process.cpuUsage(c0);
    wall = Math.min(wall, performance.now() - t0);
    cpu = Math.min(cpu, (c.user + c.system) / 1000);
  }
  return { wall, cpu };
};
process.env.VELA_GRAPHS = '0'; // the kernel table is of the eager ops
for (let i = 0; i < 3; i++) step();
// Wall time suffers from other processes on a shared machine; CPU time (user + system of this
// single-threaded process) much less, so both are shown, each the best of 8 steps.
const { wall: wallMs, cpu: cpuMs } = best(false, 8);
const info = await tf.profile(step);
const byName = new Map<string, { ms: number; n: number }>();
const byShape = new Map<string, { ms: number; n: number }>();
let total = 0;
for (const k of info.kernels) {
  const ms = Number(k.kernelTimeMs) || 0;
  // tf.customGrad's forward (kernels/layers.ts: matmul with its transposed-operand gradients, embed) has no kernel name of its own.
  if (k.name === 'unnamed scope') k.name = 'customGrad op (matmul, embed)';
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
const what = values.what === 'sample' ? 'sample (10 steps)' : `${values.finetune} step`;
process.stdout.write(`backend ${backend.name}, ${config.preset} ${what} b${B} ${cams} camera(s), eager: ${wallMs.toFixed(1)} ms wall, ${cpuMs.toFixed(1)} ms CPU (best of 8); profiled: ${info.kernels.length} kernels, ${total.toFixed(1)} ms kernel time, ${info.peakBytes} peak bytes\n`);
print('by kernel', byName);
print('by kernel and input shapes', byShape);
if (graphsAvailable()) {
  // Taking turns, so that other load on the machine lands on both alike.
  best(true, 2);
  const runs = { eager: [] as number[], graph: [] as number[] };
  for (let r = 0; r < 4; r++) {
    runs.eager.push(best(false, 4).cpu);
    runs.graph.push(best(true, 4).cpu);
  }
  const min = (a: number[]) => Math.min(...a).toFixed(1);
  const s = sampleGraphStats();
  const l = lossGraphStats();
  process.stdout.write(`\nas graphs (kernels/backend/graph.ts): ${min(runs.graph)} ms CPU against ${min(runs.eager)} eager (best of 16 each, in turns); graphs traced in this process: ${s.traces} sampling, ${l.traces} forward_backward\n`);
}
state.dispose();
base.dispose();
