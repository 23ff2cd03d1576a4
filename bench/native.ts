/**
 * Native TensorFlow vs wasm, in turns, in one process: for each row (preset, fine-tune mode,
 * cameras) both backends build the same model and take training steps (forward_backward +
 * optim_step, batch 8) in alternating blocks, so load from other processes on a shared machine
 * lands on both alike; then optionally native vs PyTorch (bench/torch_reference.py) in turns at
 * TensorFlow's intra-op thread count. Prints a table and writes bench/results/native.json.
 *
 *   VELA_TF_INTRA_OP_THREADS=1 npm run bench:native -- --rows flow05-tiny:full:1,flow05-tiny:lora:3 --steps 12 --torch
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { activateBackend, type BackendKind } from '../kernels/backend/backend.ts';
import { applyNativeEnv } from '../kernels/backend/native.ts';
import { makeConfig } from '../kernels/small/config.ts';
import { fakeBatch } from '../kernels/small/batch.ts';
import { BaseWeights, TrainingState } from '../kernels/trainer.ts';
import { summarize } from './stats.ts';
import { runTorch, torchUnavailable } from './torch.ts';

const USAGE = `Usage: npm run bench:native -- [options]

Options:
  --rows LIST      preset:finetune:cameras,... (default flow05-tiny:full:1,flow05-tiny:lora:1,flow05-tiny:full:3,flow05-tiny:lora:3)
  --batch N        datums per step (default 8)
  --steps N        timed steps per backend and row (default 12)
  --block N        steps per turn (default 3)
  --burn-in N      untimed steps per backend first (default 2)
  --torch          also time PyTorch in turns with native, full fine-tune rows only
  --out FILE       JSON output (default bench/results/native.json)
  --help           this text
`;

interface Side {
  kind: BackendKind;
  step: () => void;
  dispose: () => void;
}

/** Builds the row's model on one backend (made active first) and returns its step. */
async function side(kind: BackendKind, preset: string, finetune: 'full' | 'lora', cameras: number, batchSize: number): Promise<Side> {
  await activateBackend(kind);
  const config = makeConfig(preset);
  const batch = fakeBatch(config, batchSize, 1);
  // Only the first `cameras` slots filled, as a robot with that many cameras (D13).
  for (let i = 0; i < batchSize; i++) for (let k = cameras; k < config.slots; k++) batch.imageMask[i * config.slots + k] = 0;
  const base = BaseWeights.create(config, 0);
  const state = new TrainingState(base, { finetune, seed: 0 });
  return {
    kind,
    step: () => {
      state.forwardBackward(batch);
      state.optimStep({ learningRate: 1e-5 });
    },
    dispose: () => {
      state.dispose();
      base.dispose();
    },
  };
}

/** Wall ms and process CPU ms of each step (CPU time is what a busy shared machine distorts least). */
async function timeBlock(s: Side, n: number, wall: number[], cpu: number[]): Promise<void> {
  await activateBackend(s.kind);
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    const c0 = process.cpuUsage();
    s.step();
    const c = process.cpuUsage(c0);
    wall.push(performance.now() - t0);
    cpu.push((c.user + c.system) / 1000);
  }
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      rows: { type: 'string', default: 'flow05-tiny:full:1,flow05-tiny:lora:1,flow05-tiny:full:3,flow05-tiny:lora:3' },
      batch: { type: 'string', default: '8' },
      steps: { type: 'string', default: '12' },
      block: { type: 'string', default: '3' },
      'burn-in': { type: 'string', default: '2' },
      torch: { type: 'boolean', default: false },
      out: { type: 'string', default: 'bench/results/native.json' },
      help: { type: 'boolean', default: false },
    },
  });
  if (values.help) return void process.stdout.write(USAGE);
  const threads = applyNativeEnv();
  const [B, steps, block, burnIn] = [values.batch, values.steps, values.block, values['burn-in']].map(Number) as [number, number, number, number];
  const out: Record<string, unknown>[] = [];
  const load = () => os.loadavg().map((x) => x.toFixed(2)).join(' ');
  process.stdout.write(`native (TF intra-op ${threads.intraOp}, inter-op ${threads.interOp}) vs wasm (1 thread), batch ${B}, ${steps} steps each in blocks of ${block}; load ${load()}\n`);
  for (const row of values.rows!.split(',')) {
    const [preset, finetune, cams] = row.split(':') as [string, 'full' | 'lora', string];
    const cameras = Number(cams);
    const sides: Side[] = [];
    const errors: Record<string, string> = {};
    for (const kind of ['node', 'wasm'] as BackendKind[]) {
      try {
        const s = await side(kind, preset, finetune, cameras, B);
        for (let i = 0; i < burnIn; i++) s.step();
        sides.push(s);
      } catch (e) {
        errors[kind] = (e as Error).message.split('\n')[0]!.slice(0, 200);
      }
    }
    const wall = new Map<BackendKind, number[]>(sides.map((s) => [s.kind, []]));
    const cpu = new Map<BackendKind, number[]>(sides.map((s) => [s.kind, []]));
    const loadBefore = load();
    for (let done = 0; done < steps; done += block) {
      for (const s of sides) await timeBlock(s, Math.min(block, steps - done), wall.get(s.kind)!, cpu.get(s.kind)!);
    }
    const summary = Object.fromEntries([...wall].map(([k, v]) => [k, summarize(v)]));
    const cpuSummary = Object.fromEntries([...cpu].map(([k, v]) => [k, summarize(v)]));
    const [native, wasm] = [summary.node?.p50, summary.wasm?.p50];
    const [nativeCpu, wasmCpu] = [cpuSummary.node?.p50, cpuSummary.wasm?.p50];
    const rec: Record<string, unknown> = {
      preset, finetune, cameras, batch: B, steps, block, threads, load: { before: loadBefore, after: load() }, stepMs: summary, cpuMs: cpuSummary, errors,
      speedup: native && wasm ? wasm / native : null, cpuSpeedup: nativeCpu && wasmCpu ? wasmCpu / nativeCpu : null,
    };
    const f = (x?: number) => x?.toFixed(0) ?? '-';
    process.stdout.write(`${preset} ${finetune} ${cameras} cam: wall p50 native ${f(native)} / wasm ${f(wasm)} ms = ${native && wasm ? (wasm / native).toFixed(2) : '-'}x; CPU p50 native ${f(nativeCpu)} / wasm ${f(wasmCpu)} ms = ${nativeCpu && wasmCpu ? (wasmCpu / nativeCpu).toFixed(2) : '-'}x${Object.keys(errors).length ? `; errors ${JSON.stringify(errors)}` : ''}; load ${load()}\n`);
    if (values.torch && finetune === 'full' && sides[0]?.kind === 'node') {
      const why = torchUnavailable();
      if (why) rec.torch = { skipped: why };
      else {
        await activateBackend('node');
        const t = await runTorch(preset, B, cameras, steps, burnIn, async () => sides[0]!.step());
        const same = t.rows.find((r) => r.threads === threads.intraOp);
        rec.torch = { ...t, sameThreads: threads.intraOp, ratioSameThreads: same ? t.velaStepMs.p50 / same.stepMs.p50 : null };
        process.stdout.write(`  vs PyTorch ${t.torchVersion}: native p50 ${t.velaStepMs.p50.toFixed(0)} ms; ${t.rows.map((r) => `torch ${r.threads} thread(s) p50 ${r.stepMs.p50.toFixed(0)} ms`).join(', ')}; native/torch at ${threads.intraOp} thread(s) ${same ? (t.velaStepMs.p50 / same.stepMs.p50).toFixed(2) : '-'}x; load ${load()}\n`);
      }
    }
    for (const s of sides) {
      await activateBackend(s.kind);
      s.dispose();
    }
    out.push(rec);
  }
  fs.mkdirSync(path.dirname(values.out!), { recursive: true });
  fs.writeFileSync(values.out!, JSON.stringify({ at: new Date().toISOString(), node: process.version, cpus: os.cpus().length, cpuModel: os.cpus()[0]?.model, rows: out }, null, 2) + '\n');
  process.stdout.write(`wrote ${values.out}\n`);
}

main().catch((e) => {
  process.stderr.write(`bench:native: ${(e as Error).stack ?? e}\n`);
  process.exitCode = 1;
});
