/**
 * Step time of the kernels: forward_backward + optim_step per preset and batch size on the
 * active backend (VELA_BACKEND to force one), with burn-in, median ms per step; optional
 * sample() time. Prints a table and writes bench/results/kernels.json.
 *
 *   npm run bench:kernels -- --presets flow0-tiny,flow05-tiny --batch 1,8 --steps 5
 */
import fs from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { initBackend } from '../kernels/backend/backend.ts';
import { countParams, makeConfig } from '../kernels/small/config.ts';
import { fakeBatch } from '../kernels/small/batch.ts';
import { BaseWeights, TrainingState } from '../kernels/trainer.ts';

const USAGE = `Usage: npm run bench:kernels -- [options]

Times forward_backward + optim_step (one training step) per preset and batch size.

Options:
  --presets LIST     comma-separated presets (default flow0-tiny,flow05-tiny)
  --batch LIST       comma-separated batch sizes (default 1,8)
  --steps N          timed steps per row after burn-in (default 5)
  --burn-in N        untimed steps first (default 2)
  --finetune MODE    full or lora (default full)
  --sample-steps N   also time sample() with N Euler steps (default 0 = off)
  --out FILE         JSON output (default bench/results/kernels.json)
  --help             this text
`;

interface Row {
  preset: string;
  params: number;
  finetune: string;
  batch: number;
  steps: number;
  stepMsMedian: number;
  stepMsMin: number;
  stepMsMax: number;
  sampleMs?: number;
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

function positiveList(name: string, value: string): number[] {
  const out = value.split(',').map((x) => Number(x.trim()));
  if (out.some((x) => !Number.isInteger(x) || x < 1)) throw new Error(`--${name} is '${value}'; expected positive integers separated by commas`);
  return out;
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      presets: { type: 'string', default: 'flow0-tiny,flow05-tiny' },
      batch: { type: 'string', default: '1,8' },
      steps: { type: 'string', default: '5' },
      'burn-in': { type: 'string', default: '2' },
      finetune: { type: 'string', default: 'full' },
      'sample-steps': { type: 'string', default: '0' },
      out: { type: 'string', default: 'bench/results/kernels.json' },
      help: { type: 'boolean', default: false },
    },
  });
  if (values.help) return void process.stdout.write(USAGE);
  const presets = values.presets.split(',').map((p) => p.trim());
  const batches = positiveList('batch', values.batch);
  const [steps] = positiveList('steps', values.steps);
  const burnIn = Number(values['burn-in']);
  const sampleSteps = Number(values['sample-steps']);
  const finetune = values.finetune as 'full' | 'lora';
  if (finetune !== 'full' && finetune !== 'lora') throw new Error(`--finetune is '${finetune}'; expected full or lora`);
  const backend = await initBackend();
  const rows: Row[] = [];
  for (const preset of presets) {
    const config = makeConfig(preset);
    const base = BaseWeights.create(config, 0);
    for (const b of batches) {
      const state = new TrainingState(base, { finetune, seed: 0 });
      const batch = fakeBatch(config, b, 1);
      const times: number[] = [];
      for (let i = 0; i < burnIn + steps!; i++) {
        const t0 = performance.now();
        state.forwardBackward(batch); // reads the loss back: the step has finished
        state.optimStep({ learningRate: 1e-5 }); // reads grad_norm back
        if (i >= burnIn) times.push(performance.now() - t0);
      }
      const row: Row = {
        preset: config.preset, params: countParams(config), finetune, batch: b, steps: steps!,
        stepMsMedian: median(times), stepMsMin: Math.min(...times), stepMsMax: Math.max(...times),
      };
      if (sampleSteps > 0) {
        state.sample(batch, { numSteps: sampleSteps, seed: 0 });
        const t0 = performance.now();
        state.sample(batch, { numSteps: sampleSteps, seed: 0 });
        row.sampleMs = performance.now() - t0;
      }
      rows.push(row);
      state.dispose();
      process.stdout.write(`${row.preset.padEnd(11)} batch ${String(b).padStart(3)}  ${row.stepMsMedian.toFixed(1).padStart(9)} ms/step (median of ${steps})${row.sampleMs !== undefined ? `  sample(${sampleSteps}) ${row.sampleMs.toFixed(1)} ms` : ''}\n`);
    }
    base.dispose();
  }
  const header = `| preset | params | finetune | batch | ms/step median | min | max |${sampleSteps > 0 ? ` sample(${sampleSteps}) ms |` : ''}`;
  const lines = [header, header.replace(/[^|]+/g, ' - ')];
  for (const r of rows) {
    lines.push(`| ${r.preset} | ${r.params.toLocaleString('en-US')} | ${r.finetune} | ${r.batch} | ${r.stepMsMedian.toFixed(1)} | ${r.stepMsMin.toFixed(1)} | ${r.stepMsMax.toFixed(1)} |${r.sampleMs !== undefined ? ` ${r.sampleMs.toFixed(1)} |` : ''}`);
  }
  process.stdout.write(`\nbackend: ${backend.name}${backend.fallbacks.length ? ` (fell back from ${backend.fallbacks.map((f) => f.backend).join(', ')})` : ''}\n${lines.join('\n')}\n`);
  const out = path.resolve(values.out);
  fs.mkdirSync(path.dirname(out), { recursive: true });
  const json = { backend: backend.name, fallbacks: backend.fallbacks, node: process.version, date: new Date().toISOString(), burnIn, rows };
  fs.writeFileSync(out, JSON.stringify(json, null, 2) + '\n');
  process.stdout.write(`wrote ${path.relative(process.cwd(), out)}\n`);
}

main().catch((err) => {
  process.stderr.write(`bench:kernels: ${(err as Error).message}\n`);
  process.exit(1);
});
