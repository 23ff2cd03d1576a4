/**
 * The full-size real pi0 / pi0.5 as a user runs it (issue 24), each side in its own process so
 * its peak RSS (VmHWM of the whole process: main thread, engine worker, TensorFlow) is its own:
 *
 * 1. `vela policy --base DIR`: start-up (load) time, then OpenPI observations (G1 frames, 480x640
 *    JPEG, 1 and 3 cameras, the 26-dim state, the task) over the websocket with
 *    protocol/policy-client.ts (OpenPI's wire protocol); round trip per request and peak RSS.
 * 2. `vela serve` and a LoRA training session on the same base (openpi's ranks 16 / 32, the
 *    server's default): forward_backward + optim_step at batch 1 (one G1 datum, one camera)
 *    through the session websocket; step time and peak RSS. Skipped, with the memory estimate
 *    that explains why, when the machine cannot hold it (--train force runs it anyway).
 *
 *   npx tsx bench/real-pi-serve.ts --checkpoint DIR [--requests 3] [--cameras 1,3] [--steps 2]
 *
 * DIR is a Hub-layout checkpoint (config.json + model.safetensors), e.g. the random-weight one
 * `npx vela models init DIR --variant pi05 --size full` writes (with the test tokenizer; or
 * scripts/real_pi/write_random_checkpoint.py, the torch version). The prompt needs a tokenizer:
 * the folder's, PaliGemma's from the HF cache (gated), or `--test-tokenizer` copies the shipped test tokenizer into DIR (prompt
 * ids differ from PaliGemma's; the cost does not: the prompt is <= 200 of the 456-968 prefix tokens).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { fileURLToPath } from 'node:url';
import { VelaClient } from '../protocol/client.ts';
import { encodeFrame } from '../protocol/frames.ts';
import { ndarray, packNumpy } from '../protocol/ndarray.ts';
import { CAMERA_NAMES, g1Samples, toDatums } from './data.ts';
import { PolicyConnection } from '../protocol/policy-client.ts';
import { realPiConfigFromHub } from '../kernels/pi/config.ts';
import { estimateMemory } from '../kernels/pi/memory.ts';
import { availableMemory, checkFits } from '../server/models/memory.ts';
import { TEST_TOKENIZER_ASSET_DIR, TEST_TOKENIZER_FILES } from '../server/models/init-checkpoint.ts';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const USAGE = `Usage: npx tsx bench/real-pi-serve.ts --checkpoint DIR [options]

  --checkpoint DIR     Hub-layout pi0 / pi0.5 checkpoint folder (required)
  --requests N         timed policy requests per camera count, after one warm-up (default 3)
  --cameras LIST       camera counts for the policy part (default 1,3)
  --steps N            timed LoRA steps after one warm-up (default 2)
  --only PART          policy, train or both (default both)
  --train force        run the training part even when the memory estimate says it does not fit
  --backend B          VELA_BACKEND for both servers (default node)
  --test-tokenizer     copy the test tokenizer (server/models/assets/test-tokenizer) into DIR when it has no tokenizer.json
  --out FILE           result JSON (default bench/results/real-pi-serve.json)`;

const { values } = parseArgs({
  options: {
    checkpoint: { type: 'string' }, requests: { type: 'string', default: '3' }, cameras: { type: 'string', default: '1,3' },
    steps: { type: 'string', default: '2' }, only: { type: 'string', default: 'both' }, train: { type: 'string', default: '' },
    backend: { type: 'string', default: 'node' }, 'test-tokenizer': { type: 'boolean', default: false },
    out: { type: 'string', default: path.join(ROOT, 'bench/results/real-pi-serve.json') }, help: { type: 'boolean', default: false },
  },
});
if (values.help || !values.checkpoint) {
  console.log(USAGE);
  process.exit(values.help ? 0 : 2);
}
const dir = path.resolve(values.checkpoint);
const GiB = 2 ** 30;

/** Peak and current resident memory of a process, from /proc (bytes). */
function rss(pid: number): { peak: number; now: number } {
  const s = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (k: string) => Number(new RegExp(`${k}:\\s+(\\d+) kB`).exec(s)?.[1] ?? NaN) * 1024;
  return { peak: kb('VmHWM'), now: kb('VmRSS') };
}

/** Spawns `vela ARGS` and resolves once a stdout line matches `ready` (with the match). */
function start(args: string[], ready: RegExp, env: NodeJS.ProcessEnv = {}): Promise<{ proc: ChildProcess; match: RegExpExecArray; ms: number }> {
  const t0 = performance.now();
  const proc = spawn(process.execPath, [path.join(ROOT, 'bin/vela.js'), ...args], { env: { ...process.env, VELA_BACKEND: values.backend, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let err = '';
  proc.stderr!.on('data', (b) => {
    err += b;
    if (err.length > 20_000) err = err.slice(-10_000);
  });
  return new Promise((resolve, reject) => {
    let out = '';
    proc.stdout!.on('data', (b) => {
      out += b;
      const m = ready.exec(out);
      if (m) resolve({ proc, match: m, ms: performance.now() - t0 });
    });
    proc.once('exit', (code, signal) => reject(new Error(`vela ${args[0]} exited (${code ?? signal}): ${err.trim().split('\n').slice(-5).join(' | ')}`)));
  });
}

function stop(proc: ChildProcess): Promise<void> {
  return new Promise((r) => {
    if (proc.exitCode !== null) return r();
    proc.once('exit', () => r());
    proc.kill('SIGTERM');
  });
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

async function policyPart(result: Record<string, unknown>): Promise<void> {
  const { proc, match, ms } = await start(['policy', '--base', dir, '--port', '0', '--log-level', 'warn'], /Vela policy server on (ws:\/\/\S+)/);
  console.log(`policy: vela policy --base up in ${(ms / 1000).toFixed(1)} s, RSS ${(rss(proc.pid!).now / GiB).toFixed(2)} GiB`);
  const rows: Record<string, unknown>[] = [];
  try {
    const samples = await g1Samples(Number(values.requests) + 1, 3, 10);
    for (const cameras of values.cameras.split(',').map(Number)) {
      const client = await PolicyConnection.open(match[1]!);
      const times: number[] = [];
      for (let i = 0; i < samples.length; i++) {
        const s = samples[i]!;
        const obs: Record<string, unknown> = { 'observation/state': ndarray(s.state, [s.state.length]), prompt: s.prompt, image_codec: 'JPEG' };
        for (let k = 0; k < cameras; k++) obs[`observation/${['base_0_rgb', 'left_wrist_0_rgb', 'right_wrist_0_rgb'][k]}`] = await encodeFrame('JPEG', s.frames[k]!);
        const t0 = performance.now();
        const answer = await client.infer(packNumpy(obs));
        const t = performance.now() - t0;
        if (i === 0) console.log(`policy: ${cameras} camera(s): actions [${answer.actions.shape}] (warm-up ${t.toFixed(0)} ms)`);
        else times.push(t);
      }
      await client.close();
      const r = rss(proc.pid!);
      console.log(`policy: ${cameras} camera(s): round trip median ${median(times).toFixed(0)} ms (${times.map((t) => t.toFixed(0)).join(', ')}), peak RSS ${(r.peak / GiB).toFixed(2)} GiB`);
      rows.push({ cameras, round_trip_ms: times, median_ms: median(times), peak_rss_bytes: r.peak });
    }
  } finally {
    await stop(proc);
  }
  result.policy = { startup_ms: ms, rows };
}

async function trainPart(result: Record<string, unknown>): Promise<void> {
  // Planned, not discovered: the server refuses a step that would not fit; the bench says so
  // first, with the estimate (kernels/pi/memory.ts), rather than letting the kernel kill it.
  const config = realPiConfigFromHub(JSON.parse(fs.readFileSync(path.join(dir, 'config.json'), 'utf8')));
  const est = estimateMemory(config, { use: 'lora', batch: 1, cameras: 1 });
  const avail = await availableMemory();
  const why = checkFits(est, { ...avail, rssBytes: 0, bytes: avail.limitBytes }, 'one LoRA step of this model at batch 1 with 1 camera', { batch: 1 });
  result.train_estimate = { total_bytes: est.totalBytes, parts: est.parts, limit_bytes: avail.limitBytes, source: avail.source };
  if (why && values.train !== 'force') {
    console.log(`train: skipped: ${why}`);
    result.train = { skipped: why };
    return;
  }
  const data = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-bench-serve-'));
  const key = 'bench-key';
  const { proc, match, ms } = await start(['serve', '--port', '0', '--log-level', 'warn'], /(http:\/\/\S+)/, { VELA_DATA_DIR: data, VELA_API_KEY: key, VELA_ALLOW_ABSOLUTE_BASES: '1' });
  try {
    const client = new VelaClient(match[1]!.replace(/\/$/, ''), key);
    const t0 = performance.now();
    const s = await client.waitReady((await client.createSession({ base_model: JSON.parse(fs.readFileSync(path.join(dir, 'config.json'), 'utf8')).type, base: dir } as never)).id, 900_000);
    const loadMs = performance.now() - t0;
    const conn = await client.connect(s);
    console.log(`train: session ready in ${(loadMs / 1000).toFixed(1)} s (trainable ${s.trainable_params} params), RSS ${(rss(proc.pid!).now / GiB).toFixed(2)} GiB`);
    const datums = await toDatums(await g1Samples(1, 1, 10), 'JPEG');
    const steps: { forward_backward_ms: number; optim_step_ms: number; loss: number }[] = [];
    for (let i = 0; i <= Number(values.steps); i++) {
      const a = performance.now();
      const fb = await conn.forwardBackward(datums, { codec: 'JPEG' });
      const b = performance.now();
      await conn.optimStep({ learning_rate: 1e-4 });
      const c = performance.now();
      console.log(`train: step ${i}${i === 0 ? ' (warm-up)' : ''}: forward_backward ${(b - a).toFixed(0)} ms, optim_step ${(c - b).toFixed(0)} ms, loss ${fb.loss.toFixed(4)}, peak RSS ${(rss(proc.pid!).peak / GiB).toFixed(2)} GiB`);
      if (i > 0) steps.push({ forward_backward_ms: b - a, optim_step_ms: c - b, loss: fb.loss });
    }
    conn.close();
    result.train = { server_start_ms: ms, session_ready_ms: loadMs, trainable_params: s.trainable_params, steps, peak_rss_bytes: rss(proc.pid!).peak };
  } finally {
    await stop(proc);
    fs.rmSync(data, { recursive: true, force: true });
  }
}

async function main(): Promise<void> {
  if (!fs.existsSync(path.join(dir, 'tokenizer.json')) && values['test-tokenizer']) {
    for (const f of TEST_TOKENIZER_FILES) fs.copyFileSync(path.join(TEST_TOKENIZER_ASSET_DIR, f), path.join(dir, f));
    console.log(`copied the test tokenizer into ${dir}`);
  }
  const result: Record<string, unknown> = { checkpoint: dir, machine: { cpus: os.availableParallelism(), total_memory_bytes: os.totalmem() }, at: new Date().toISOString(), backend: values.backend, camera_names: CAMERA_NAMES };
  if (values.only !== 'train') await policyPart(result);
  if (values.only !== 'policy') await trainPart(result);
  fs.mkdirSync(path.dirname(values.out), { recursive: true });
  fs.writeFileSync(values.out, `${JSON.stringify(result, null, 2)}\n`);
  console.log(`wrote ${values.out}`);
}

main().catch((e) => {
  console.error(`bench/real-pi-serve: ${(e as Error).message}`);
  process.exit(1);
});
