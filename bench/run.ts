/**
 * `npm run bench`: Vela's benchmark harness (issue 7). Parts, in order: codecs, step (in-process
 * vs session websocket), torch (PyTorch reference), policy (OpenPI inference), load, infer (what
 * a robot waits for: sample() alone, PyTorch sampling and the policy round trip, in turns), rtc
 * (bench/rtc.ts's replay of held-out G1 episodes with the policies it trained and cached; skipped
 * without them and in --quick). Everything runs on 127.0.0.1: a server process
 * (bench/server-child.ts) and an in-process engine. Writes a
 * table on stdout, bench/results/<name>.json (schema: bench/results/README.md) and <name>.svg.
 * `--help` lists the options.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { makeConfig } from '../kernels/small/config.ts';
import { Engine } from '../server/engine/host.ts';
import { log } from '../server/log.ts';
import { parseBenchArgs, USAGE, type BenchOptions, type Part } from './args.ts';
import { g1Samples, toDatums, toModelBatch } from './data.ts';
import { runCodecs } from './codecs.ts';
import { runStep, inprocSession } from './step.ts';
import { makeCheckpoint, observationMessage, runPolicy } from './policy.ts';
import { runLoad } from './load.ts';
import { TORCH_BLOCK, runTorch, torchUnavailable } from './torch.ts';
import { INFER_BLOCK, runInfer } from './infer.ts';
import { markdown, plotSeries, targets } from './report.ts';
import { SCHEMA, validateResult, type BenchResult } from './schema.ts';
import { ServerProc } from './server-proc.ts';
import { latencySvg } from './svg.ts';
import { RTC_QUICK_SKIP, rtcUnavailable, runRtcChild } from './rtc-train.ts';

function say(line: string): void {
  process.stderr.write(`[bench ${new Date().toISOString().slice(11, 19)}] ${line}\n`);
}

async function main(opts: BenchOptions): Promise<number> {
  const t0 = performance.now();
  log.setLevel('error');
  const want = (p: Part) => opts.parts.includes(p);
  const config = makeConfig(opts.preset);
  const result: Omit<BenchResult, 'targets'> = {
    schema: SCHEMA, name: opts.name, date: new Date().toISOString(), wallS: 0,
    machine: { node: process.version, platform: `${process.platform}-${process.arch}`, cpus: os.cpus().length, cpuModel: os.cpus()[0]?.model ?? 'unknown', backend: '' },
    options: { ...opts }, step: null, codecs: null, policy: null, load: null, torch: null, infer: null, rtc: null, skipped: {},
    notes: opts.quick ? ['--quick: a smoke run (a few steps, small batches, 10 s of load); its numbers and targets are not comparable with a full run'] : [],
  };
  for (const p of ['step', 'codecs', 'policy', 'load', 'torch', 'infer', 'rtc'] as const) if (!want(p)) result.skipped[p] = 'not asked for (--only)';

  say(`loading ${opts.batch} G1 samples with 3 cameras`);
  const samples = await g1Samples(opts.batch, 3, config.horizon);
  const stepSamples = samples.map((s) => ({ ...s, frames: s.frames.slice(0, opts.cameras) }));
  const datums = await toDatums(stepSamples, opts.codec);

  if (want('codecs')) {
    say('codecs');
    result.codecs = await runCodecs(samples[0]!.frames[0]!, datums, opts.codec, config.imageSize, opts.codecReps, result.notes);
  }

  const needEngine = want('step') || want('torch');
  const needServer = want('step') || want('policy') || want('load');
  // The in-process engine and the server take the same choice (the server's default: auto), so
  // that the websocket's overhead is measured against the same kernels.
  const engine = needEngine ? await Engine.start({ preset: opts.preset, backend: process.env.VELA_BACKEND ?? 'auto' }) : null;
  if (engine) result.machine.backend = engine.info.backend;
  const server = needServer ? await ServerProc.start(opts.preset) : null;
  if (server) {
    const health = (await (await fetch(`${server.baseUrl}/health`)).json()) as { backend?: string; backend_kind?: string };
    if (!engine) result.machine.backend = health.backend ?? '?';
    const policy = process.env.VELA_POLICY_BACKEND ?? 'same';
    result.notes.push(`server: backend ${health.backend} (${health.backend_kind}), policy engines: ${policy === 'same' ? 'the same' : policy}`);
  }
  try {
    if (want('step')) {
      say(`step: ${opts.steps} steps in-process, over the websocket (TS client) and through the Python package`);
      result.step = await runStep(engine!, server!, datums, { preset: opts.preset, finetune: opts.finetune, codec: opts.codec, cameras: opts.cameras, steps: opts.steps, burnIn: opts.burnIn }, stepSamples);
      if (result.step.pythonSkipped) result.notes.push(`step: the Python package's row skipped: ${result.step.pythonSkipped}`);
    }
    if (want('torch')) {
      const why = torchUnavailable();
      if (why) result.skipped.torch = why;
      else {
        say(`torch: Vela full fine-tune steps and bench/torch_reference.py in turns of ${TORCH_BLOCK}`);
        const vela = await inprocSession(engine!, await toModelBatch(config, datums, opts.codec), 'full');
        try {
          result.torch = await runTorch(opts.preset, opts.batch, opts.cameras, opts.steps, opts.burnIn, vela.step);
        } finally {
          await vela.close();
        }
      }
    }
    await engine?.close();
    let policyUrl: string | null = null;
    if (want('policy') || (want('load') && opts.policyClients > 0)) {
      say('policy: saving a checkpoint from a 3-camera session and serving it');
      const dir = await makeCheckpoint(server!, opts.preset, samples.slice(0, 2));
      policyUrl = await server!.startPolicy(dir);
    }
    if (want('policy')) {
      say(`policy: ${opts.policyRequests} requests per row`);
      result.policy = await runPolicy(policyUrl!, samples[0]!, opts.policyRequests, result.notes);
    }
    if (want('load')) {
      say(`load: ${opts.idleRequests} requests of one policy client alone, then ${opts.clients} sessions + ${opts.policyClients} policy clients${opts.policyHz > 0 ? ` at ${opts.policyHz} Hz` : ''} for ${opts.durationS} s`);
      result.load = await runLoad(server!, {
        preset: opts.preset, finetune: opts.finetune, codec: opts.codec, sessions: opts.clients, policyClients: opts.policyClients,
        durationS: opts.durationS, datums, policyUrl, idleRequests: opts.idleRequests, policyHz: opts.policyHz, policyMessage: policyUrl ? (await observationMessage(samples[0]!, 1, { codec: 'JPEG', zstd: false })).bytes : null,
        onTick: (t, steps, inf) => Math.round(t) % 10 === 0 && say(`load: ${t.toFixed(0)} s, ${steps} steps, ${inf} inferences`),
      });
    }
  } finally {
    await server?.close();
  }
  if (want('infer')) {
    // After the other parts' server and engine are gone: this part has the machine to itself.
    say(`infer: sample() alone, PyTorch sampling and the policy round trip, ${opts.inferCalls} calls per row in turns of ${INFER_BLOCK}`);
    result.infer = await runInfer({ calls: opts.inferCalls, burnIn: opts.quick ? 2 : 3, samples, say });
    if (!result.machine.backend) result.machine.backend = result.infer.backendName;
  }
  if (want('rtc')) {
    const why = opts.quick ? RTC_QUICK_SKIP : rtcUnavailable();
    if (why) result.skipped.rtc = why;
    else {
      say('rtc: replaying held-out G1 episodes with the cached policies (bench/rtc.ts)');
      result.rtc = await runRtcChild();
    }
  }
  if (!result.machine.backend) result.machine.backend = process.env.VELA_BACKEND ?? 'auto';
  result.wallS = (performance.now() - t0) / 1000;
  const full: BenchResult = { ...result, targets: targets(result) };
  const problems = validateResult(full);
  if (problems.length) throw new Error(`the result does not match its schema: ${problems.join('; ')}`);
  fs.mkdirSync(opts.outDir, { recursive: true });
  const jsonPath = path.join(opts.outDir, `${opts.name}.json`);
  const svgPath = path.join(opts.outDir, `${opts.name}.svg`);
  fs.writeFileSync(jsonPath, JSON.stringify(full, null, 1) + '\n');
  fs.writeFileSync(svgPath, latencySvg(`Vela latency (${opts.preset}, ${full.machine.backend}, ${full.machine.cpus} CPUs)`, plotSeries(full)));
  process.stdout.write(markdown(full));
  process.stdout.write(`\nwrote ${jsonPath} and ${svgPath}\n`);
  return 0;
}

let opts: BenchOptions | null;
try {
  opts = parseBenchArgs(process.argv.slice(2));
} catch (e) {
  process.stderr.write(`bench: ${(e as Error).message}\n\n${USAGE}`);
  process.exit(2);
}
if (!opts) {
  process.stdout.write(USAGE);
  process.exit(0);
}
main(opts).then(
  (code) => process.exit(code),
  (e) => {
    process.stderr.write(`bench: ${(e as Error).stack ?? e}${(e as any).cause ? `\ncause: ${(e as any).cause}` : ""}\n`);
    process.exit(1);
  },
);
