/**
 * Backend selection for the kernels. TF.js runs the same ops on every backend; `auto` prefers,
 * in order, `tensorflow` from @tensorflow/tfjs-node-gpu (CUDA; only when a GPU is visible),
 * `tensorflow` from @tensorflow/tfjs-node (CPU), the wasm backend (SIMD, one thread under Node)
 * and the plain cpu backend. `VELA_BACKEND` (`auto`, `node-gpu`, `node`, `wasm`, `cpu`) forces
 * one. The choice is logged once as one calm line that names the backend, where it runs, and
 * briefly why a faster one is not in use (MODEL.md "Backends": never silent).
 */
import * as tf from '@tensorflow/tfjs';
import { setWasmPaths } from '@tensorflow/tfjs-backend-wasm';
import { createRequire } from 'node:module';
import path from 'node:path';
import { graphsOff } from './graph.ts';
import { installFastNativeKernels } from './native-fast.ts';
import { installFastWasmKernels } from './wasm-fast.ts';
import { applyNativeEnv, installStatus, visibleGpus, type NativeThreads } from './native.ts';

export type BackendChoice = 'auto' | 'node-gpu' | 'node' | 'wasm' | 'cpu';
export type BackendKind = Exclude<BackendChoice, 'auto'>;

export interface BackendReport {
  /** The TF.js backend in use: `tensorflow` (tfjs-node / tfjs-node-gpu), `wasm` or `cpu`. */
  name: string;
  /** The kind we chose, as VELA_BACKEND spells it. */
  kind: BackendKind;
  /** Where ops run, e.g. "CPU, libtensorflow 2.21.0, threads 1 intra-op, 1 inter-op, graphs on". */
  device: string;
  /** TensorFlow's thread pools (native kinds only). */
  threads?: NativeThreads;
  /** Faster backends not in use and why, in preference order. */
  fallbacks: { backend: string; reason: string }[];
  /** The calm line ("backend tensorflow (tfjs-node) on CPU, ...; not used: node-gpu (no NVIDIA GPU is visible)"). */
  line: string;
}

const ORDER: BackendKind[] = ['node-gpu', 'node', 'wasm', 'cpu'];
const PACKAGE = { 'node-gpu': '@tensorflow/tfjs-node-gpu', node: '@tensorflow/tfjs-node' } as const;
let report: BackendReport | undefined;
let pending: Promise<BackendReport> | undefined;

function wasmDir(): string {
  const require = createRequire(import.meta.url);
  const entry = require.resolve('@tensorflow/tfjs-backend-wasm');
  // entry is .../tfjs-backend-wasm/dist/<file>.js; the .wasm binaries sit in dist/ beside it.
  return path.dirname(entry) + path.sep;
}

/** A load error in a few words: the first line, without the require stack. */
function brief(err: unknown): string {
  const msg = (err instanceof Error ? err.message : String(err)).split('\n')[0]!;
  if (/Cannot find (package|module) '@tensorflow\/tfjs-node(-gpu)?'/.test(msg)) return 'its package is not installed';
  if (/tfjs_binding\.node/.test(msg)) return 'its native library is not set up: run npm run setup:native';
  return msg.slice(0, 200);
}

/** Why the native runtime is missing, as the install recorded it (one short clause). */
function installReason(kind: 'node' | 'node-gpu', loadError: string): string {
  const st = installStatus()?.[kind];
  if (st && !st.ok && st.reason) return st.reason.slice(0, 240);
  return loadError;
}

type Activated = Omit<BackendReport, 'fallbacks' | 'line' | 'kind'>;
const activated = new Map<BackendKind, Activated>();

/**
 * Makes one backend active for this process's TF.js (initialising it the first time), without
 * touching the once-per-process report: for tests and benches that run the same computation on
 * every backend present. Tensors made on another backend move over when next used.
 * @throws Error when that backend cannot start (the reason as initBackend reports it).
 */
export async function activateBackend(kind: BackendKind, threads: Partial<NativeThreads> = {}): Promise<Activated> {
  tf.env().set('PROD', true);
  let got = activated.get(kind);
  if (!got) {
    got = await tryOne(kind, threads);
    activated.set(kind, got);
  } else if (!(await tf.setBackend(got.name))) throw new Error(`backend ${got.name} did not initialise`);
  await tf.ready();
  return got;
}

async function tryOne(kind: BackendKind, threads: Partial<NativeThreads>): Promise<Activated> {
  switch (kind) {
    case 'node-gpu':
    case 'node': {
      let gpus: string[] = [];
      if (kind === 'node-gpu') {
        gpus = visibleGpus();
        if (gpus.length === 0) throw new Error('no NVIDIA GPU is visible');
      }
      const t = applyNativeEnv(threads);
      // A variable specifier keeps bundlers and tsc from resolving a package that is optional.
      await import(/* @vite-ignore */ PACKAGE[kind] as string);
      if (!(await tf.setBackend('tensorflow'))) throw new Error(`${PACKAGE[kind]} loaded but backend 'tensorflow' did not initialise`);
      installFastNativeKernels();
      const native = tf.backend() as unknown as { binding?: { TF_Version?: string }; isUsingGpuDevice?: boolean };
      const version = native.binding?.TF_Version ?? '?';
      // tfjs-node-gpu runs on the CPU when TensorFlow registers no GPU device (CUDA or cuDNN
      // libraries missing): that is the node backend with extra weight, so say so and move on.
      if (kind === 'node-gpu' && native.isUsingGpuDevice === false) throw new Error(`libtensorflow ${version} registered no GPU device (are CUDA and cuDNN installed?)`);
      // Read once for the report; kernels/backend/graph.ts reads VELA_GRAPHS at each call.
      const pools = `threads ${t.intraOp} intra-op, ${t.interOp} inter-op, graphs ${graphsOff() ? `off (VELA_GRAPHS=${process.env.VELA_GRAPHS})` : 'on'}`;
      const device = kind === 'node-gpu'
        ? `GPU ${gpus[0]}${gpus.length > 1 ? ` (+${gpus.length - 1} more visible, unused)` : ''}, libtensorflow ${version}, memory ${process.env.TF_FORCE_GPU_ALLOW_GROWTH === 'true' ? 'taken as needed' : 'reserved at start'}; ${pools} on the CPU`
        : `CPU, libtensorflow ${version}, ${pools}`;
      return { name: 'tensorflow', device, threads: t };
    }
    case 'wasm': {
      setWasmPaths(wasmDir());
      if (!(await tf.setBackend('wasm'))) throw new Error('wasm backend did not initialise');
      installFastWasmKernels();
      return { name: 'wasm', device: 'CPU, SIMD, 1 thread' };
    }
    case 'cpu': {
      if (!(await tf.setBackend('cpu'))) throw new Error('cpu backend did not initialise');
      return { name: 'cpu', device: 'CPU, plain JavaScript' };
    }
  }
}

/** The calm line: what runs, then (briefly) why not something faster. */
function describe(kind: BackendKind, device: string, fallbacks: { backend: string; reason: string }[]): string {
  const label = kind === 'node-gpu' ? 'tensorflow (tfjs-node-gpu)' : kind === 'node' ? 'tensorflow (tfjs-node)' : kind;
  const why = fallbacks.map((f) => `${f.backend} (${f.reason})`).join(', ');
  return `backend ${label} on ${device}${why ? `; not used: ${why}` : ''}`;
}

/**
 * Selects and initialises the TF.js backend once per process; later calls return the same
 * report (a different `prefer` after the first call is ignored, since TF.js has one global
 * backend). Throws an Error when a forced backend fails to load.
 *
 * @param prefer `auto` (default from VELA_BACKEND, else `auto`) or one backend to force.
 * @param log where the one line is written (default console.log); pass null for silence.
 * @param threads TensorFlow thread counts (native kinds; default applyNativeEnv's).
 */
export function initBackend(
  prefer: string = process.env.VELA_BACKEND ?? 'auto',
  log: ((line: string) => void) | null = (line) => console.log(line),
  threads: Partial<NativeThreads> = {},
): Promise<BackendReport> {
  const choice = prefer.trim().toLowerCase() as BackendChoice;
  if (choice !== 'auto' && !ORDER.includes(choice as never)) {
    return Promise.reject(new Error(`VELA_BACKEND is '${prefer}'; expected one of auto, ${ORDER.join(', ')}`));
  }
  if (report) return Promise.resolve(report);
  if (pending) return pending;
  // TF.js's own notices ("Hi, looks like you are running TensorFlow.js in Node.js", flag
  // overrides) go to the console from library code; the line below says what a reader needs.
  tf.env().set('PROD', true);
  pending = (async () => {
    const candidates = choice === 'auto' ? ORDER : [choice as BackendKind];
    const fallbacks: { backend: string; reason: string }[] = [];
    for (const kind of candidates) {
      try {
        const got = await activateBackend(kind, threads);
        const line = describe(kind, got.device, fallbacks);
        report = { ...got, kind, fallbacks, line };
        log?.(`vela kernels: ${line}`);
        return report;
      } catch (err) {
        const why = brief(err);
        const reason = kind === 'node' || (kind === 'node-gpu' && why !== 'no NVIDIA GPU is visible') ? installReason(kind, why) : why;
        fallbacks.push({ backend: kind, reason });
      }
    }
    pending = undefined;
    throw new Error(`no TF.js backend could start: ${fallbacks.map((f) => `${f.backend}: ${f.reason}`).join('; ')}`);
  })();
  return pending;
}

/** The report of the backend in use, or undefined before initBackend resolved. */
export function backendReport(): BackendReport | undefined {
  return report;
}
