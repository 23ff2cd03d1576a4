/**
 * Backend selection for the kernels. TF.js runs the same ops on every backend; we prefer, in
 * order, `tensorflow` from @tensorflow/tfjs-node-gpu (CUDA), `tensorflow` from
 * @tensorflow/tfjs-node, the wasm backend (SIMD, one thread under Node) and the plain cpu
 * backend. `VELA_BACKEND` (`auto`, `node-gpu`, `node`, `wasm`, `cpu`) forces one. The choice
 * and every fallback are returned and logged once (MODEL.md "Backends": never silent).
 */
import * as tf from '@tensorflow/tfjs';
import { setWasmPaths } from '@tensorflow/tfjs-backend-wasm';
import { createRequire } from 'node:module';
import path from 'node:path';
import { installFastWasmKernels } from './wasm-fast.ts';

export type BackendChoice = 'auto' | 'node-gpu' | 'node' | 'wasm' | 'cpu';

export interface BackendReport {
  /** The TF.js backend in use: `tensorflow` (tfjs-node / tfjs-node-gpu), `wasm` or `cpu`. */
  name: string;
  /** The kind we chose, as VELA_BACKEND spells it. */
  kind: Exclude<BackendChoice, 'auto'>;
  /** Backends tried before it and why each failed. */
  fallbacks: { backend: string; reason: string }[];
}

const ORDER: Exclude<BackendChoice, 'auto'>[] = ['node-gpu', 'node', 'wasm', 'cpu'];
let report: BackendReport | undefined;
let pending: Promise<BackendReport> | undefined;

function wasmDir(): string {
  const require = createRequire(import.meta.url);
  const entry = require.resolve('@tensorflow/tfjs-backend-wasm');
  // entry is .../tfjs-backend-wasm/dist/<file>.js; the .wasm binaries sit in dist/ beside it.
  return path.dirname(entry) + path.sep;
}

async function tryOne(kind: Exclude<BackendChoice, 'auto'>): Promise<string> {
  switch (kind) {
    case 'node-gpu':
    case 'node': {
      const pkg = kind === 'node-gpu' ? '@tensorflow/tfjs-node-gpu' : '@tensorflow/tfjs-node';
      // A variable specifier keeps bundlers and tsc from resolving a package that is optional.
      await import(/* @vite-ignore */ pkg as string);
      if (!(await tf.setBackend('tensorflow'))) throw new Error(`${pkg} loaded but backend 'tensorflow' did not initialise`);
      return 'tensorflow';
    }
    case 'wasm': {
      setWasmPaths(wasmDir());
      if (!(await tf.setBackend('wasm'))) throw new Error('wasm backend did not initialise');
      installFastWasmKernels();
      return 'wasm';
    }
    case 'cpu': {
      if (!(await tf.setBackend('cpu'))) throw new Error('cpu backend did not initialise');
      return 'cpu';
    }
  }
}

/**
 * Selects and initialises the TF.js backend once per process; later calls return the same
 * report (a different `prefer` after the first call is ignored, since TF.js has one global
 * backend). Throws an Error when a forced backend fails to load.
 *
 * @param prefer `auto` (default from VELA_BACKEND, else `auto`) or one backend to force.
 * @param log where the one line is written (default console.log); pass null for silence.
 */
export function initBackend(
  prefer: string = process.env.VELA_BACKEND ?? 'auto',
  log: ((line: string) => void) | null = (line) => console.log(line),
): Promise<BackendReport> {
  const choice = prefer.trim().toLowerCase() as BackendChoice;
  if (choice !== 'auto' && !ORDER.includes(choice as never)) {
    return Promise.reject(new Error(`VELA_BACKEND is '${prefer}'; expected one of auto, ${ORDER.join(', ')}`));
  }
  if (report) return Promise.resolve(report);
  if (pending) return pending;
  pending = (async () => {
    const candidates = choice === 'auto' ? ORDER : [choice as Exclude<BackendChoice, 'auto'>];
    const fallbacks: { backend: string; reason: string }[] = [];
    for (const kind of candidates) {
      try {
        const name = await tryOne(kind);
        await tf.ready();
        report = { name, kind, fallbacks };
        if (log) {
          const fb = fallbacks.map((f) => `${f.backend} (${f.reason})`).join('; ');
          log(`vela kernels: backend ${kind}${fallbacks.length ? `; fell back from ${fb}` : ''}`);
        }
        return report;
      } catch (err) {
        const reason = (err instanceof Error ? err.message : String(err)).split('\n')[0]!.slice(0, 200);
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
