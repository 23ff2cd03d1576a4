/**
 * Facts and settings of TensorFlow's native runtime (@tensorflow/tfjs-node and -gpu) that must be
 * known before the library loads: its thread pools, whether a GPU is visible, and what
 * `npm ci` managed to set up (scripts/setup-native.mjs writes node_modules/.vela-native.json).
 *
 * TensorFlow reads its thread counts from the process environment once, when the first eager
 * context is made, and keeps one intra-op pool for the whole process (every engine worker shares
 * it). Node's worker threads see a copy of the environment, so the main thread applies these
 * (applyNativeEnv) before it starts any worker.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import { isMainThread } from 'node:worker_threads';
import { fileURLToPath } from 'node:url';

/** Thread counts of TensorFlow's pools (MODEL.md "Backends"). */
export interface NativeThreads {
  /** Threads one op may use (Eigen / oneDNN parallel-for); 1 runs each op on the calling thread. */
  intraOp: number;
  /** Threads that run independent ops at once (graph functions; eager ops run in order). */
  interOp: number;
}

/**
 * Defaults for one training engine and one policy engine per preset: half the cores for one op
 * (so the two workers each keep a core on a 2-core machine), one inter-op thread.
 */
export function defaultThreads(cores: number = os.availableParallelism()): NativeThreads {
  return { intraOp: Math.max(1, Math.floor(cores / 2)), interOp: 1 };
}

function positive(name: string, raw: string | undefined): number | undefined {
  if (raw === undefined || raw.trim() === '') return undefined;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 1 || n > 1024) throw new Error(`${name} must be an integer in 1..1024, got "${raw}"`);
  return n;
}

/**
 * The thread counts in force: explicit values, else VELA_TF_INTRA_OP_THREADS /
 * VELA_TF_INTER_OP_THREADS, else TensorFlow's own TF_NUM_INTRAOP_THREADS / TF_NUM_INTEROP_THREADS,
 * else defaultThreads(). On the main thread it also writes them, and TF_CPP_MIN_LOG_LEVEL=2
 * (TensorFlow's start-up notices) unless set, into the process environment for the library to
 * read; elsewhere it only reports. (Two lines ignore that variable: absl's "All log messages
 * before absl::InitializeLog()" and port.cc's "oneDNN custom operations are on", written as the
 * library loads; bin/vela.js drops them from the command's stderr.) The first load of the library fixes them for the process.
 * @throws Error naming the variable when a value is not an integer in 1..1024.
 */
export function applyNativeEnv(explicit: Partial<NativeThreads> = {}, env: NodeJS.ProcessEnv = process.env): NativeThreads {
  const def = defaultThreads();
  const intraOp = explicit.intraOp ?? positive('VELA_TF_INTRA_OP_THREADS', env.VELA_TF_INTRA_OP_THREADS) ?? positive('TF_NUM_INTRAOP_THREADS', env.TF_NUM_INTRAOP_THREADS) ?? def.intraOp;
  const interOp = explicit.interOp ?? positive('VELA_TF_INTER_OP_THREADS', env.VELA_TF_INTER_OP_THREADS) ?? positive('TF_NUM_INTEROP_THREADS', env.TF_NUM_INTEROP_THREADS) ?? def.interOp;
  if (isMainThread && env === process.env) {
    env.TF_NUM_INTRAOP_THREADS = String(intraOp);
    env.TF_NUM_INTEROP_THREADS = String(interOp);
    env.TF_CPP_MIN_LOG_LEVEL ??= '2';
    // Several engines (and processes) share one GPU: take memory as needed, not all at start.
    env.TF_FORCE_GPU_ALLOW_GROWTH ??= 'true';
  }
  return { intraOp, interOp };
}

/** The NVIDIA GPUs the driver lists and CUDA_VISIBLE_DEVICES leaves visible, by model name. */
export function visibleGpus(env: NodeJS.ProcessEnv = process.env, procDir = '/proc/driver/nvidia/gpus'): string[] {
  const cvd = env.CUDA_VISIBLE_DEVICES?.trim();
  if (cvd === '' || cvd === '-1') return [];
  let ids: string[];
  try {
    ids = fs.readdirSync(procDir).sort();
  } catch {
    return [];
  }
  const names = ids.map((id) => {
    try {
      return /Model:\s*(.+)/.exec(fs.readFileSync(path.join(procDir, id, 'information'), 'utf8'))?.[1]?.trim() ?? `GPU ${id}`;
    } catch {
      return `GPU ${id}`;
    }
  });
  if (cvd === undefined) return names;
  // Numeric indices select; UUID forms are not resolved here and count as one visible GPU each.
  return cvd.split(',').map((s) => s.trim()).filter(Boolean).map((s) => (/^\d+$/.test(s) ? names[Number(s)] : s)).filter((n): n is string => !!n);
}

/** What scripts/setup-native.mjs recorded at install time, per package kind. */
export interface InstallStatus {
  best: 'node' | 'node-gpu' | null;
  node?: { ok: boolean; reason?: string; source?: string; dir?: string };
  'node-gpu'?: { ok: boolean; reason?: string; source?: string; dir?: string };
}

/** Reads node_modules/.vela-native.json, or null when the set-up never ran (npm ci --ignore-scripts). */
export function installStatus(file = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../node_modules/.vela-native.json')): InstallStatus | null {
  try {
    return JSON.parse(fs.readFileSync(file, 'utf8')) as InstallStatus;
  } catch {
    return null;
  }
}

let pinned: string | null | undefined;

/**
 * Loads the native package once on the main thread, where it stays for the life of the process.
 * Node unloads an addon when the last worker that loaded it exits, and libtensorflow leaves exit
 * handlers behind that then point at unmapped code: the process crashes as it exits (SIGSEGV).
 * Holding one reference here keeps the library mapped. Call it (after applyNativeEnv, since
 * loading makes TensorFlow read its thread settings) before starting workers that may load it.
 * Returns the package it holds, or null when neither loads (the workers then say why).
 *
 * @param backend the VELA_BACKEND choice the workers will make (`auto`, `node-gpu`, `node`, ...).
 */
export function pinNativeLibrary(backend: string): string | null {
  if (pinned !== undefined || !isMainThread) return pinned ?? null;
  const kinds = backend === 'auto' ? [...(visibleGpus().length ? ['node-gpu'] : []), 'node'] : ['node-gpu', 'node'].filter((k) => k === backend);
  if (kinds.length === 0) return null; // wasm or cpu: nothing native to hold
  const require = createRequire(import.meta.url);
  pinned = null;
  for (const kind of kinds) {
    const pkg = kind === 'node-gpu' ? '@tensorflow/tfjs-node-gpu' : '@tensorflow/tfjs-node';
    try {
      require(pkg);
      return (pinned = pkg);
    } catch {
      // The worker's own attempt reports the reason.
    }
  }
  return null;
}
