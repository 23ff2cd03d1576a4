/**
 * Command-line options of `npm run bench` (node:util parseArgs), validated, with the defaults
 * that keep a full run under 10 minutes on 2 cores.
 */
import { parseArgs } from 'node:util';

export const PARTS = ['step', 'codecs', 'policy', 'load', 'torch', 'infer', 'rtc'] as const;
export type Part = (typeof PARTS)[number];

export interface BenchOptions {
  preset: string;
  batch: number;
  cameras: number; // 1..3 cameras per datum in the step and load runs
  codec: string; // frame codec of the session requests
  finetune: 'lora' | 'full';
  steps: number; // timed steps per step measurement
  burnIn: number;
  clients: number; // concurrent training sessions in the load run
  policyClients: number; // concurrent policy clients in the load run
  policyHz: number; // requests a second per policy client in the load run (0: closed loops)
  idleRequests: number; // timed requests of the load run's idle phase (one policy client alone)
  durationS: number; // load run length
  policyRequests: number; // timed requests per policy row
  inferCalls: number; // timed calls per row of the infer part
  codecReps: number; // repetitions per codec row
  parts: Part[];
  name: string; // bench/results/<name>.json and .svg
  outDir: string;
  quick: boolean;
}

export const USAGE = `Usage: npm run bench -- [options]

Benchmarks Vela on 127.0.0.1 only: training step latency in-process vs over the session
websocket (the TS client, and the Python package with .venv's or $VELA_BENCH_PYTHON's Python), encode/decode costs, policy inference over the OpenPI protocol, a load run of
concurrent sessions and policy clients, and a PyTorch reference of the same model (when
python3 can import torch), and what a robot waits for (infer: the engine's sample() alone on
every backend, PyTorch sampling the same models, and the policy server's round trip, in turns).
Writes a table on stdout, bench/results/<name>.json and .svg.

Options:
  --preset NAME          model preset (default flow05-tiny)
  --batch N              datums per training request (default 8)
  --cameras N            JPEG cameras per datum, 1..3 (default 1)
  --codec NAME           frame codec of session requests: JPEG, LOSSLESS, PNG, RAW (default JPEG)
  --finetune MODE        full or lora for the step and load runs (default full)
  --steps N              timed steps per step measurement (default 50)
  --burn-in N            untimed steps first (default 3)
  --clients N            concurrent training sessions in the load run (default 8)
  --policy-clients N     concurrent policy clients in the load run (default 24: issue 25's robots)
  --policy-hz H          each policy client of the load run sends every 1/H s, as a robot's
                         control loop (default 0: closed loops, the next request at each answer)
  --idle-requests N      the load run first times N requests of one policy client alone, the
                         idle p99 its loaded p99 is compared with (default 60)
  --duration S           load run length in seconds (default 60)
  --policy-requests N    timed requests per policy row (default 30)
  --infer-calls N        timed calls per row of the infer part (default 40)
  --only LIST            parts to run, comma-separated: ${PARTS.join(',')} (default all;
                         rtc replays the policies bench/rtc.ts trained and cached, skipped
                         without them and in --quick)
  --name NAME            result name (default latest)
  --out-dir DIR          result folder (default bench/results)
  --quick                small settings for a smoke run (steps 3, batch 2, duration 10 s, clients
                         2, ...); its numbers and target checks are not comparable with a full run
  --help                 this text
`;

function int(name: string, v: string, lo: number, hi: number): number {
  const n = Number(v);
  if (!Number.isInteger(n) || n < lo || n > hi) throw new Error(`--${name} is '${v}'; expected an integer in ${lo}..${hi}`);
  return n;
}

function rate(name: string, v: string): number {
  const n = Number(v);
  if (!Number.isFinite(n) || n < 0 || n > 1000) throw new Error(`--${name} is '${v}'; expected a number in 0..1000`);
  return n;
}

/**
 * Parses argv (without node and the script). Returns null for --help.
 * @throws Error naming the option and its value for a bad value or an unknown option.
 */
export function parseBenchArgs(argv: string[]): BenchOptions | null {
  const { values } = parseArgs({
    args: argv,
    strict: true,
    options: {
      preset: { type: 'string', default: 'flow05-tiny' },
      batch: { type: 'string' },
      cameras: { type: 'string', default: '1' },
      codec: { type: 'string', default: 'JPEG' },
      finetune: { type: 'string', default: 'full' },
      steps: { type: 'string' },
      'burn-in': { type: 'string' },
      clients: { type: 'string' },
      'policy-clients': { type: 'string' },
      'idle-requests': { type: 'string' },
      'policy-hz': { type: 'string', default: '0' },
      duration: { type: 'string' },
      'policy-requests': { type: 'string' },
      'infer-calls': { type: 'string' },
      only: { type: 'string', default: PARTS.join(',') },
      name: { type: 'string', default: 'latest' },
      'out-dir': { type: 'string', default: 'bench/results' },
      quick: { type: 'boolean', default: false },
      help: { type: 'boolean', default: false },
    },
  });
  if (values.help) return null;
  const quick = values.quick!;
  const parts = values.only!.split(',').map((p) => p.trim()).filter(Boolean);
  for (const p of parts) if (!(PARTS as readonly string[]).includes(p)) throw new Error(`--only names '${p}'; parts are ${PARTS.join(', ')}`);
  if (values.finetune !== 'full' && values.finetune !== 'lora') throw new Error(`--finetune is '${values.finetune}'; expected full or lora`);
  if (!/^[A-Za-z0-9._-]+$/.test(values.name!)) throw new Error(`--name is '${values.name}'; use letters, digits, '.', '_' or '-'`);
  return {
    preset: values.preset!,
    batch: int('batch', values.batch ?? (quick ? '2' : '8'), 1, 256),
    cameras: int('cameras', values.cameras!, 1, 3),
    codec: values.codec!,
    finetune: values.finetune,
    steps: int('steps', values.steps ?? (quick ? '3' : '50'), 1, 10_000),
    burnIn: int('burn-in', values['burn-in'] ?? (quick ? '1' : '3'), 0, 1000),
    clients: int('clients', values.clients ?? (quick ? '2' : '8'), 0, 64),
    policyClients: int('policy-clients', values['policy-clients'] ?? (quick ? '2' : '24'), 0, 64),
    policyHz: rate('policy-hz', values['policy-hz']!),
    idleRequests: int('idle-requests', values['idle-requests'] ?? (quick ? '5' : '60'), 0, 10_000),
    durationS: int('duration', values.duration ?? (quick ? '10' : '60'), 1, 3600),
    policyRequests: int('policy-requests', values['policy-requests'] ?? (quick ? '5' : '30'), 1, 10_000),
    inferCalls: int('infer-calls', values['infer-calls'] ?? (quick ? '3' : '40'), 1, 10_000),
    codecReps: quick ? 5 : 30,
    parts: parts as Part[],
    name: values.name!,
    outDir: values['out-dir']!,
    quick,
  };
}
