/**
 * What a kept sampling graph holds (issue 33 item 1): flow0-tiny on native TensorFlow, one LoRA
 * session's sample at batch B (default 8) for each step count in STEPS (default 10,100,300), each
 * traced as its own graph (graphs on) or eager (EAGER=1), the process RSS before, after the first
 * call (the trace) and after a second call, with GC forced. Numbers of record:
 * bench/results/graph-memory.json (kernels/backend/graph.ts GRAPH_BYTES_PER_OP is fitted on them).
 *
 *   node --expose-gc --import tsx bench/graph-memory.ts              # graphs, as before issue 33
 *   EAGER=1 node --expose-gc --import tsx bench/graph-memory.ts      # the eager sampler
 *   B=1 STEPS=10,20 VELA_GRAPH_DEBUG=1 node --expose-gc --import tsx bench/graph-memory.ts
 *
 * It calls the kernels directly (TrainingState.sample traces every layout it is given): the
 * server's session sample no longer traces these layouts (server/engine/worker.ts).
 */
import * as tf from '@tensorflow/tfjs';
import { activateBackend } from '../kernels/backend/backend.ts';
import { applyNativeEnv, pinNativeLibrary } from '../kernels/backend/native.ts';
import { makeConfig } from '../kernels/small/config.ts';
import { fakeBatch } from '../kernels/small/batch.ts';
import { BaseWeights, TrainingState } from '../kernels/trainer.ts';
import { sampleGraphStats } from '../kernels/sample-graph.ts';
import { graphCacheStats } from '../kernels/graph-cache.ts';

applyNativeEnv();
pinNativeLibrary('node');
await activateBackend('node');
const eager = process.env.EAGER === '1';
if (eager) process.env.VELA_GRAPHS = '0';
// Every layout is kept for the measurement (the default budget would stop the longer traces).
process.env.VELA_GRAPH_CACHE_BYTES ??= String(64 * 2 ** 30);
const c = makeConfig('flow0-tiny');
const s = new TrainingState(BaseWeights.create(c, 0), { finetune: 'lora', rank: 8, seed: 1 });
const gib = (n: number) => Number((n / 2 ** 30).toFixed(3));
const rss = () => {
  (globalThis as { gc?: () => void }).gc?.();
  return process.memoryUsage.rss();
};
const B = Number(process.env.B ?? 8);
const batch = fakeBatch(c, B, 3);
console.log(JSON.stringify({ start_rss_gib: gib(rss()) }));
for (const n of (process.env.STEPS ?? '10,100,300').split(',').map(Number)) {
  const r0 = rss();
  const t0 = performance.now();
  s.sample(batch, { numSteps: n, seed: 1 });
  const ms = performance.now() - t0;
  const r1 = rss();
  s.sample(batch, { numSteps: n, seed: 2 });
  const r2 = rss();
  console.log(JSON.stringify({ batch: B, steps: n, mode: eager ? 'eager' : 'graph', rss_before_gib: gib(r0), rss_after_first_gib: gib(r1), rss_after_second_gib: gib(r2), first_call_ms: Math.round(ms), ...sampleGraphStats(), cache: graphCacheStats() }));
}
