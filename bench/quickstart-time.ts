/**
 * How long the README quickstart's `vela finetune --steps 300` takes on this machine, measured
 * without running 300 steps (issue 35, item 11c): the quickstart's own command at `--steps N`
 * (default 20) into a temp --output, timed as a process, then extrapolated from its events.jsonl.
 * The default recipe evaluates every quarter of the run, so N steps and 300 steps both make 4
 * held-out evaluations: 300 steps cost the N-step run plus (300 - N) plain steps at the mean time
 * of the N-step run's plain steps (a step's time does not depend on the run's length).
 *
 *     npx tsx bench/quickstart-time.ts [--steps 20]
 *
 * Writes bench/results/quickstart-time.json (committed: the README's quickstart quotes it) with
 * the machine (cores, CPU model, load average at start and end: other work on the machine slows
 * every step) and prints one line. Honest about itself: `method` says it is an extrapolation.
 */
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { fileURLToPath } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const QUICKSTART_STEPS = 300;

interface Event { type: string; timestamp: number; step?: number; message?: string }

/** The extrapolation from one run's events and wall time (seconds); see the file's comment. */
export function extrapolate(events: Event[], wallS: number, steps: number, target = QUICKSTART_STEPS): { plainStepS: number; evalExtraS: number[]; estimateS: number } {
  const progress = events.filter((e) => e.type === 'progress');
  if (progress.length !== steps) throw new Error(`expected ${steps} progress events, got ${progress.length}`);
  const evalSteps = new Set([1, 2, 3, 4].map((q) => Math.round((steps * q) / 4)));
  const gaps = progress.slice(1).map((e, i) => ({ step: e.step!, s: e.timestamp - progress[i]!.timestamp }));
  const plain = gaps.filter((g) => !evalSteps.has(g.step)).map((g) => g.s);
  const plainStepS = plain.reduce((a, b) => a + b, 0) / plain.length;
  const evalExtraS = gaps.filter((g) => evalSteps.has(g.step)).map((g) => g.s - plainStepS);
  return { plainStepS, evalExtraS, estimateS: wallS + (target - steps) * plainStepS };
}

async function main(): Promise<void> {
  const i = process.argv.indexOf('--steps');
  const steps = i >= 0 ? Number(process.argv[i + 1]) : 20;
  if (!Number.isInteger(steps) || steps < 8 || steps % 4 !== 0) throw new Error('--steps must be a multiple of 4, at least 8');
  const out = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-quickstart-time-'));
  const loadBefore = os.loadavg();
  const t0 = performance.now();
  await promisify(execFile)(process.execPath, [path.join(ROOT, 'bin/vela.js'), 'finetune', '--dataset', 'datasets/g1_pick_bottle_sample', '--steps', String(steps), '--output', path.join(out, 'run')], { cwd: ROOT, maxBuffer: 64 << 20 });
  const wallS = (performance.now() - t0) / 1000;
  const loadAfter = os.loadavg();
  const events = fs.readFileSync(path.join(out, 'run/events.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Event);
  fs.rmSync(out, { recursive: true, force: true });
  const x = extrapolate(events, wallS, steps);
  const result = {
    method: `vela finetune --dataset datasets/g1_pick_bottle_sample --steps ${steps} timed as a process; ${QUICKSTART_STEPS} steps extrapolated: that wall time + ${QUICKSTART_STEPS - steps} x the mean plain step (both runs make 4 held-out evaluations)`,
    measured_at: new Date().toISOString(),
    machine: { cores: os.availableParallelism(), cpu: os.cpus()[0]?.model ?? '?', load_average_1m: [Number(loadBefore[0]!.toFixed(1)), Number(loadAfter[0]!.toFixed(1))] },
    steps_timed: steps,
    wall_seconds: Number(wallS.toFixed(1)),
    plain_step_seconds: Number(x.plainStepS.toFixed(3)),
    eval_extra_seconds: x.evalExtraS.map((s) => Number(s.toFixed(1))),
    estimate_300_steps_seconds: Math.round(x.estimateS),
    estimate_300_steps_minutes: Math.round(x.estimateS / 60),
  };
  fs.writeFileSync(path.join(ROOT, 'bench/results/quickstart-time.json'), JSON.stringify(result, null, 2) + '\n');
  process.stdout.write(`quickstart: ${steps} steps in ${result.wall_seconds} s (${result.plain_step_seconds} s a plain step, load ${result.machine.load_average_1m.join(' -> ')} on ${result.machine.cores} cores): ${QUICKSTART_STEPS} steps ~ ${result.estimate_300_steps_seconds} s (${result.estimate_300_steps_minutes} min)\n`);
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) await main();
