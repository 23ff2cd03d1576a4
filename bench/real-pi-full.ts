/**
 * The full-size pi0.5 on this CPU, Vela against the PyTorch reference (Vela issue 23): a Hub-layout
 * checkpoint (`vela models init DIR --variant pi05 --size full`, or scripts/real_pi/write_random_checkpoint.py) loaded by Vela (server/models/
 * hub-checkpoint.ts into kernels/pi/), its load time and peak RSS against the float32 weights, and
 * `sample()` (10 Euler steps, prefix K/V cached) on 1 and on 3 cameras; then the same on
 * scripts/real_pi/bench_sample.py with torch.set_num_threads equal to Vela's TF intra-op threads.
 * Each side runs in its own child process, one at a time, in turns (Vela, PyTorch, Vela, ...):
 * both 13 GB models do not fit in memory together, and each side's RSS is its own.
 *
 * Both sides get the same inputs from one file the parent writes: 224x224 images, a pi0.5 prompt
 * (task and state bins) tokenized and padded to 200, and the initial noise; their actions are
 * compared as a check that they ran the same model.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import * as tf from '@tensorflow/tfjs';
import { initBackend } from '../kernels/backend/backend.ts';
import { REAL_PI05, REAL_PI_TINY_PI05, createRealPiParams, disposeRealPiParams, realPiParamCount, sample, type RealPiConfig, type RealPiParams } from '../kernels/pi/index.ts';
import { Rng } from '../kernels/rng.ts';
import { readHubConfig } from '../server/models/hub-checkpoint.ts';
import { loadHubTensors } from '../server/models/load-tensors.ts';
import { findPaligemmaTokenizer, loadPaligemmaTokenizer } from '../server/models/tokenizer.ts';
import { TEST_TOKENIZER_ASSET_DIR } from '../server/models/init-checkpoint.ts';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(HERE, '..');
const PY_SCRIPT = path.join(ROOT, 'scripts/real_pi/bench_sample.py');
const TEST_TOKENIZER = path.join(TEST_TOKENIZER_ASSET_DIR, 'tokenizer.json');

const USAGE = `Usage: npx tsx bench/real-pi-full.ts --checkpoint DIR [options]

Loads a Hub-layout pi0.5 checkpoint (config.json + model.safetensors, e.g. written by
npx vela models init DIR --variant pi05 --size full, or scripts/real_pi/write_random_checkpoint.py
--variant pi05 --dtype bfloat16) in Vela and in the
PyTorch reference, each in its own process and in turns, and times load and sample().
Full size needs ~15 GB of free memory per side (one side at a time) and several minutes per side.

Options:
  --checkpoint DIR    the checkpoint folder (required); a --size tiny one (config.json has
                      vela_real_pi_config) runs the tiny pi0.5 of FACTS 5.2, for a smoke run
  --threads N         TF intra-op threads = torch.set_num_threads (default: all cores, ${os.availableParallelism()})
  --rounds N          Vela-then-PyTorch pairs (default 2)
  --cameras LIST      camera counts to sample with, in order (default 1,3)
  --runs N            timed sample() calls per camera count (default 1)
  --warmup N          untimed sample() calls before them (default 0)
  --only SIDE         vela, torch or both (default both)
  --python PATH       Python with torch, numpy (default $VELA_PYTHON, else python3)
  --out FILE          result JSON (default bench/results/real-pi-full.json)
  --help              this text
`;

/** What one child process reports (both sides write this shape). */
interface SideResult {
  side: 'vela' | 'torch';
  threads: number;
  loadMs: number;
  peakRssAfterLoadBytes: number;
  peakRssBytes: number;
  float32WeightBytes: number;
  /** Per camera count: wall and CPU (user + system, all threads) ms of each timed sample(). */
  samples: { cameras: number; warmupMs: number[]; ms: number[]; cpuMs: number[]; actions: number[] }[];
  [extra: string]: unknown;
}

interface Inputs {
  size: 'full' | 'tiny';
  imageSize: number;
  numCameras: number;
  images: string;
  tokens: number[];
  tokenMasks: number[];
  noise: number[];
  cameras: number[];
  runs: number;
  warmup: number;
  prompt: { text: string; tokenizer: string; realTokens: number };
}

function positiveInt(name: string, v: string, hi: number): number {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1 || n > hi) throw new Error(`--${name} is '${v}'; expected an integer in 1..${hi}`);
  return n;
}

/** Peak resident set (VmHWM) of a process, in bytes. */
function vmHwmBytes(pid: number | 'self' = 'self'): number {
  const m = /VmHWM:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
  if (!m) throw new Error(`/proc/${pid}/status has no VmHWM line`);
  return Number(m[1]) * 1024;
}

function memAvailableBytes(): number {
  const m = /MemAvailable:\s+(\d+) kB/.exec(fs.readFileSync('/proc/meminfo', 'utf8'));
  return m ? Number(m[1]) * 1024 : Infinity;
}

/** The config the checkpoint holds: the tiny pi0.5 when config.json carries vela_real_pi_config. */
async function checkpointConfig(dir: string): Promise<{ size: 'full' | 'tiny'; config: RealPiConfig }> {
  const json = await readHubConfig(dir);
  if (json.type !== 'pi05') throw new Error(`${dir}/config.json says type ${JSON.stringify(json.type)}; this bench runs pi05`);
  return json.vela_real_pi_config ? { size: 'tiny', config: REAL_PI_TINY_PI05 } : { size: 'full', config: REAL_PI05 };
}

// ---------------------------------------------------------------- the Vela side (child process)

/**
 * Parameters whose values tfjs-node still keeps in a JS array, not yet in TensorFlow's memory
 * (its internal `tensorMap`; an empty list when the backend has none).
 */
function valuesStillInJs(params: RealPiParams): string[] {
  const map = (tf.backend() as unknown as { tensorMap?: { get(id: object): { values: unknown } | undefined } }).tensorMap;
  if (!map) return [];
  return [...params].filter(([, t]) => map.get(t.dataId)?.values != null).map(([name]) => name);
}

async function velaSide(checkpoint: string, inputsFile: string, threads: number, outFile: string): Promise<void> {
  const backend = await initBackend('node', (line) => process.stderr.write(`${line}\n`), { intraOp: threads, interOp: 1 });
  const inp = JSON.parse(fs.readFileSync(inputsFile, 'utf8')) as Inputs;
  const { config } = await checkpointConfig(checkpoint);
  const gc = (globalThis as { gc?: () => void }).gc;
  if (!gc) throw new Error('the Vela side needs node --expose-gc (the bench passes it to its child)');

  const t0 = performance.now();
  const { tensors: loaded, intoTfMs } = await loadHubTensors(checkpoint, config); // intoTfMs: the copies into TensorFlow and the collections
  const params: RealPiParams = createRealPiParams(config, loaded); // checks names and shapes; reshapes share buffers
  for (const t of loaded.values()) t.dispose();
  loaded.clear();
  gc();
  const inJs = valuesStillInJs(params);
  if (inJs.length > 0) throw new Error(`${inJs.length} parameters still hold their values in JS, e.g. ${inJs[0]}: a second copy would be made at their first use`);
  const loadMs = performance.now() - t0;
  const peakRssAfterLoadBytes = vmHwmBytes();
  const float32WeightBytes = realPiParamCount(config) * 4;
  process.stderr.write(`vela: loaded in ${(loadMs / 1e3).toFixed(1)} s (${(intoTfMs / 1e3).toFixed(1)} s of it into TensorFlow), peak RSS ${gib(peakRssAfterLoadBytes)} (${(peakRssAfterLoadBytes / float32WeightBytes).toFixed(3)}x the float32 weights)\n`);

  const S = config.vision.imageSize;
  const raw = fs.readFileSync(path.join(path.dirname(inputsFile), inp.images));
  const allImages = new Float32Array(raw.length / 4);
  new Uint8Array(allImages.buffer).set(raw);
  const model = { config, params };
  const tensorsBefore = tf.memory().numTensors;
  const samples: SideResult['samples'] = [];
  for (const cams of inp.cameras) {
    const batch = {
      size: 1,
      numCameras: cams,
      images: allImages.subarray(0, cams * 3 * S * S),
      imageMasks: new Array(cams).fill(1),
      tokens: Int32Array.from(inp.tokens),
      tokenMasks: inp.tokenMasks,
    };
    const ms: number[] = [];
    const cpuMs: number[] = [];
    const warmupMs: number[] = [];
    let actions: number[] = [];
    for (let r = 0; r < inp.warmup + inp.runs; r++) {
      const t1 = performance.now();
      const c1 = process.cpuUsage();
      const out = sample(model, batch, Float32Array.from(inp.noise));
      const values = await out.data(); // the clock stops when the actions are in JS
      const cpu = process.cpuUsage(c1);
      (r < inp.warmup ? warmupMs : ms).push(performance.now() - t1);
      if (r >= inp.warmup) cpuMs.push((cpu.user + cpu.system) / 1e3); // every thread of the process
      out.dispose();
      actions = Array.from(values);
    }
    samples.push({ cameras: cams, warmupMs, ms, cpuMs, actions });
    process.stderr.write(`vela: ${cams} camera(s): sample ${ms.map((t) => t.toFixed(0)).join(', ')} ms\n`);
  }
  const leaked = tf.memory().numTensors - tensorsBefore;
  const result: SideResult = {
    side: 'vela',
    threads,
    backend: backend.line,
    loadMs,
    intoTfMs,
    peakRssAfterLoadBytes,
    peakRssBytes: vmHwmBytes(),
    float32WeightBytes,
    params: realPiParamCount(config),
    leakedTensors: leaked,
    samples,
  };
  disposeRealPiParams(params);
  fs.writeFileSync(outFile, JSON.stringify(result));
}

// ---------------------------------------------------------------- the parent

function gib(bytes: number): string {
  return `${(bytes / 2 ** 30).toFixed(2)} GiB`;
}

/** Images, prompt and noise for both sides, in `dir`. */
async function writeInputs(dir: string, size: 'full' | 'tiny', config: RealPiConfig, cameras: number[], runs: number, warmup: number): Promise<string> {
  const S = config.vision.imageSize;
  const nc = Math.max(...cameras);
  // Smooth colour fields in [-1, 1], a different one per camera (values as a resized, scaled RGB frame).
  const images = new Float32Array(nc * 3 * S * S);
  for (let c = 0; c < nc; c++) {
    for (let ch = 0; ch < 3; ch++) {
      for (let y = 0; y < S; y++) {
        for (let x = 0; x < S; x++) images[((c * 3 + ch) * S + y) * S + x] = Math.fround(Math.sin(0.05 * x * (ch + 1) + 0.031 * y * (c + 1) + ch));
      }
    }
  }
  fs.writeFileSync(path.join(dir, 'images.f32'), new Uint8Array(images.buffer));
  // The real PaliGemma tokenizer when it is in the Hugging Face cache; else the SentencePiece
  // model of the tokenizer tests (same kind, 1,000 pieces): the cost is the same, since the
  // prompt is padded to maxTokenLen (200) and every position runs.
  const tokFile = findPaligemmaTokenizer() ?? TEST_TOKENIZER;
  const tok = await loadPaligemmaTokenizer(tokFile);
  const task = 'pick up the red block and put it in the blue bowl';
  const state = Array.from({ length: 14 }, (_, i) => Math.sin(1.3 * i) * 0.8); // an ALOHA-sized state, normalised
  const prompt = tok.pi05Prompt(task, state, config.maxTokenLen);
  const noise = new Rng(23).normals(config.actionHorizon * config.actionDim);
  const inputs: Inputs = {
    size,
    imageSize: S,
    numCameras: nc,
    images: 'images.f32',
    tokens: Array.from(prompt.tokens),
    tokenMasks: Array.from(prompt.mask),
    noise: Array.from(noise),
    cameras,
    runs,
    warmup,
    prompt: { text: `Task: ${task}, State: <14 bins>;\\nAction: `, tokenizer: path.relative(ROOT, tokFile), realTokens: prompt.length },
  };
  const file = path.join(dir, 'inputs.json');
  fs.writeFileSync(file, JSON.stringify(inputs));
  return file;
}

/** Runs one side in its own process; its stderr passes through. Resolves to its result. */
function runSide(side: 'vela' | 'torch', args: { checkpoint: string; inputs: string; threads: number; python: string }, outFile: string): Promise<SideResult> {
  const cmd = side === 'vela' ? process.execPath : args.python;
  const argv = side === 'vela'
    ? ['--expose-gc', '--import', 'tsx', fileURLToPath(import.meta.url), '--role', 'vela', '--checkpoint', args.checkpoint, '--inputs', args.inputs, '--threads', String(args.threads), '--out', outFile]
    : [PY_SCRIPT, '--checkpoint', args.checkpoint, '--inputs', args.inputs, '--threads', String(args.threads), '--out', outFile];
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, argv, { stdio: ['ignore', 'inherit', 'inherit'], cwd: ROOT });
    child.on('error', (e) => reject(new Error(`${side}: cannot start ${cmd}: ${e.message}`)));
    child.on('close', (code, signal) => {
      if (code !== 0) return reject(new Error(`${side}: the child exited with code ${code}${signal ? ` (signal ${signal}${signal === 'SIGKILL' ? ', out of memory?' : ''})` : ''}`));
      const res = JSON.parse(fs.readFileSync(outFile, 'utf8')) as SideResult;
      res.side = side;
      resolve(res);
    });
  });
}

/**
 * Floating-point operations of one sample() (2 per multiply-add, matMuls only: norms, softmax and
 * elementwise work are a few percent), by part, for `cams` cameras and the prompt padded to
 * maxTokenLen: SigLIP per camera, the VLM over the prefix once, the expert over the suffix per step.
 */
function sampleFlops(c: RealPiConfig, cams: number): { siglip: number; prefix: number; steps: number } {
  const v = c.vision;
  const T = (v.imageSize / v.patchSize) ** 2;
  const siglipLayer = T * (4 * v.width * v.width + 2 * v.width * v.mlpDim) + 2 * T * T * v.width;
  const siglip = cams * 2 * (T * 3 * v.patchSize ** 2 * v.width + v.depth * siglipLayer + T * v.width * c.vlm.width);
  const gemmaLayer = (d: RealPiConfig['expert'], n: number, keys: number) =>
    n * d.width * (2 * d.numHeads * d.headDim + 2 * d.numKvHeads * d.headDim + 3 * d.mlpDim) + 2 * n * keys * d.numHeads * d.headDim;
  const p = cams * T + c.maxTokenLen;
  const s = c.variant === 'pi0' ? c.actionHorizon + 1 : c.actionHorizon;
  const prefix = 2 * c.vlm.depth * gemmaLayer(c.vlm, p, p);
  const steps = 2 * c.numSteps * c.expert.depth * gemmaLayer(c.expert, s, p + s);
  return { siglip, prefix, steps };
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      checkpoint: { type: 'string' },
      threads: { type: 'string', default: String(os.availableParallelism()) },
      rounds: { type: 'string', default: '2' },
      cameras: { type: 'string', default: '1,3' },
      runs: { type: 'string', default: '1' },
      warmup: { type: 'string', default: '0' },
      only: { type: 'string', default: 'both' },
      python: { type: 'string', default: process.env.VELA_PYTHON ?? 'python3' },
      out: { type: 'string', default: path.join(ROOT, 'bench/results/real-pi-full.json') },
      role: { type: 'string' },
      inputs: { type: 'string' },
      help: { type: 'boolean', default: false },
    },
  });
  if (values.help) {
    process.stdout.write(USAGE);
    return;
  }
  if (!values.checkpoint) throw new Error(`--checkpoint is missing\n\n${USAGE}`);
  const checkpoint = path.resolve(values.checkpoint);
  const threads = positiveInt('threads', values.threads, 1024);
  if (values.role === 'vela') return velaSide(checkpoint, values.inputs!, threads, values.out);
  const rounds = positiveInt('rounds', values.rounds, 100);
  const runs = positiveInt('runs', values.runs, 100);
  const warmup = values.warmup === '0' ? 0 : positiveInt('warmup', values.warmup, 100);
  const cameras = values.cameras.split(',').map((c) => positiveInt('cameras', c.trim(), 3));
  const sides = ({ both: ['vela', 'torch'], vela: ['vela'], torch: ['torch'] } as const)[values.only as 'both'];
  if (!sides) throw new Error(`--only is '${values.only}'; expected vela, torch or both`);

  const { size, config } = await checkpointConfig(checkpoint);
  const weightBytes = realPiParamCount(config) * 4;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-real-pi-full-'));
  try {
    const inputs = await writeInputs(dir, size, config, cameras, runs, warmup);
    const results: SideResult[] = [];
    for (let round = 1; round <= rounds; round++) {
      for (const side of sides) {
        const free = memAvailableBytes();
        // A side needs the float32 weights and some; refuse rather than push the machine into the OOM killer.
        if (free < weightBytes * 1.1) throw new Error(`round ${round} ${side}: ${gib(free)} of memory is available; the ${size} pi0.5 needs ~${gib(weightBytes * 1.15)}`);
        process.stderr.write(`round ${round}/${rounds}: ${side} (${gib(free)} available)\n`);
        const res = await runSide(side, { checkpoint, inputs, threads, python: values.python }, path.join(dir, `${side}-${round}.json`));
        res.round = round;
        results.push(res);
      }
    }
    report(results, { size, config, threads, cameras, runs, warmup, checkpoint, inputs: JSON.parse(fs.readFileSync(inputs, 'utf8')) as Inputs }, values.out);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

function sidesPresent(results: SideResult[]): string[] {
  return [...new Set(results.map((r) => r.side))];
}

/** The table on stdout and the JSON file. */
function report(results: SideResult[], run: { size: string; config: RealPiConfig; threads: number; cameras: number[]; runs: number; warmup: number; checkpoint: string; inputs: Inputs }, outFile: string): void {
  const weightBytes = realPiParamCount(run.config) * 4;
  const rows: string[] = ['| round | side | load s | peak RSS after load | peak RSS overall | / float32 weights | ' + run.cameras.map((c) => `sample ${c} cam s (CPU s)`).join(' | ') + ' |'];
  rows.push('|' + ' - |'.repeat(6 + run.cameras.length));
  for (const r of results) {
    const cells = run.cameras.map((c) => {
      const s = r.samples.find((x) => x.cameras === c)!;
      return `${(median(s.ms) / 1e3).toFixed(1)} (${(median(s.cpuMs) / 1e3).toFixed(1)})`;
    });
    rows.push(`| ${r.round} | ${r.side} | ${(r.loadMs / 1e3).toFixed(1)} | ${gib(r.peakRssAfterLoadBytes)} | ${gib(r.peakRssBytes)} | ${(r.peakRssBytes / weightBytes).toFixed(3)} | ${cells.join(' | ')} |`);
  }
  const by = (side: string) => results.filter((r) => r.side === side);
  const ratios: Record<string, number> = {};
  if (by('vela').length && by('torch').length) {
    ratios.load = median(by('vela').map((r) => r.loadMs)) / median(by('torch').map((r) => r.loadMs));
    // On a shared machine a run that loses a core doubles its wall time: the fastest run and
    // the CPU time (which such a run does not inflate, except by spinning) are shown beside the median.
    const all = (side: string, c: number, key: 'ms' | 'cpuMs') => by(side).flatMap((r) => r.samples.find((s) => s.cameras === c)![key]);
    for (const c of run.cameras) {
      ratios[`sample_${c}cam_wall_median`] = median(all('vela', c, 'ms')) / median(all('torch', c, 'ms'));
      ratios[`sample_${c}cam_wall_best`] = Math.min(...all('vela', c, 'ms')) / Math.min(...all('torch', c, 'ms'));
      ratios[`sample_${c}cam_cpu_median`] = median(all('vela', c, 'cpuMs')) / median(all('torch', c, 'cpuMs'));
    }
  }
  // Same inputs, same weights: the actions should agree to float32 rounding over 3.4 G parameters.
  const agreement = run.cameras.map((c) => {
    const a = by('vela')[0]?.samples.find((s) => s.cameras === c)?.actions;
    const b = by('torch')[0]?.samples.find((s) => s.cameras === c)?.actions;
    if (!a || !b) return null;
    let diff = 0;
    let scale = 0;
    for (let i = 0; i < a.length; i++) {
      diff = Math.max(diff, Math.abs(a[i]! - b[i]!));
      scale = Math.max(scale, Math.abs(b[i]!));
    }
    return { cameras: c, maxAbsDiff: diff, maxAbs: scale };
  });
  const flops = run.cameras.map((c) => ({ cameras: c, ...sampleFlops(run.config, c) }));
  const gflopsLine = (side: string) => run.cameras.map((c) => {
    const f = flops.find((x) => x.cameras === c)!;
    const ms = median(by(side).flatMap((r) => r.samples.find((s) => s.cameras === c)!.ms));
    return `${c} cam ${((f.siglip + f.prefix + f.steps) / ms / 1e6).toFixed(0)}`;
  }).join(', ');
  const lines = [
    `pi0.5 ${run.size} (${realPiParamCount(run.config).toLocaleString('en-US')} parameters, float32 weights ${gib(weightBytes)}), ${run.threads} thread(s), ${os.cpus()[0]?.model ?? '?'} x ${os.availableParallelism()}`,
    `prompt: ${run.inputs.prompt.realTokens} real tokens of ${run.inputs.tokens.length} (${run.inputs.prompt.tokenizer}); ${run.runs} timed sample() per camera count after ${run.warmup} untimed`,
    ...rows,
    ...Object.entries(ratios).map(([k, v]) => `Vela / PyTorch ${k}: ${v.toFixed(2)}x`),
    ...flops.map((f) => `sample() FLOPs, ${f.cameras} camera(s): SigLIP ${(f.siglip / 1e9).toPrecision(3)} G, VLM prefix ${(f.prefix / 1e9).toPrecision(3)} G, expert x ${run.config.numSteps} steps ${(f.steps / 1e9).toPrecision(3)} G`),
    ...sidesPresent(results).map((side) => `${side}: GFLOP/s ${gflopsLine(side)}`),
    ...agreement.filter((a) => a).map((a) => `actions, ${a!.cameras} camera(s): max |Vela - PyTorch| ${a!.maxAbsDiff.toExponential(2)} (max |action| ${a!.maxAbs.toFixed(3)})`),
  ];
  process.stdout.write(`${lines.join('\n')}\n`);
  const json = {
    date: new Date().toISOString(),
    machine: { cpu: os.cpus()[0]?.model, cores: os.availableParallelism(), memBytes: os.totalmem(), node: process.version },
    size: run.size,
    params: realPiParamCount(run.config),
    float32WeightBytes: weightBytes,
    threads: run.threads,
    cameras: run.cameras,
    runs: run.runs,
    warmup: run.warmup,
    prompt: run.inputs.prompt,
    ratios,
    agreement,
    flops,
    results: results.map(({ samples, ...r }) => ({ ...r, samples: samples.map(({ actions, ...s }) => ({ ...s, firstActions: actions.slice(0, 8) })) })),
  };
  fs.mkdirSync(path.dirname(outFile), { recursive: true });
  fs.writeFileSync(outFile, `${JSON.stringify(json, null, 2)}\n`);
  process.stdout.write(`wrote ${path.relative(process.cwd(), outFile)}\n`);
}

main().catch((e: Error) => {
  process.stderr.write(`real-pi-full: ${e.message}\n`);
  process.exit(1);
});
