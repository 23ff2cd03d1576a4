/**
 * Test helper: the TF.js backends present in this process and a way to run a suite on each.
 * Native TensorFlow (`node`, tfjs-node) is present when `npm ci` could set it up; wasm always is.
 * `VELA_TEST_BACKENDS=wasm` (or `node`) narrows the list for a quick local run; under CI=true a
 * missing native backend fails kernels-backend.test.ts instead of shrinking the list silently.
 *
 *   forEachBackend('training state', (kind) => { it(...) });   // describe per backend, activated in beforeAll
 */
import { beforeAll, describe } from 'vitest';
import { activateBackend, type BackendKind } from '../../kernels/backend/backend.ts';
import { applyNativeEnv, pinNativeLibrary } from '../../kernels/backend/native.ts';

// Known at collection time (describe.each needs the list): loading the package is synchronous.
applyNativeEnv();
const nativePresent = pinNativeLibrary('node') !== null;
const only = process.env.VELA_TEST_BACKENDS?.split(',').map((s) => s.trim()).filter(Boolean);

/** The backends tests run on, best first: `node` when present, then `wasm`. */
export const TEST_BACKENDS: BackendKind[] = (['node', 'wasm'] as BackendKind[]).filter((k) => (k !== 'node' || nativePresent) && (!only || only.includes(k)));

/** The TF.js backend name of TEST_BACKENDS[0] (`tensorflow` or `wasm`), as session info reports it. */
export const BEST_BACKEND_NAME = TEST_BACKENDS[0] === 'node' ? 'tensorflow' : TEST_BACKENDS[0]!;

/** True when the native runtime loads in this process (whatever VELA_TEST_BACKENDS says). */
export const NATIVE_PRESENT = nativePresent;

/** Makes `kind` the active backend (initialised once per process). */
export async function useBackend(kind: BackendKind): Promise<void> {
  await activateBackend(kind);
}

/** The best backend present (native when it loads): for tests that need one, not all. */
export function useBestBackend(): Promise<void> {
  return useBackend(TEST_BACKENDS[0]!);
}

/** A describe block per backend present, named `title [kind]`, with that backend active. */
export function forEachBackend(title: string, body: (kind: BackendKind) => void): void {
  describe.each(TEST_BACKENDS)(`${title} [%s]`, (kind) => {
    beforeAll(() => useBackend(kind));
    body(kind);
  });
}

/** Runs `fn` with traced graphs on (`VELA_GRAPHS=1`) or off (`0`), restoring the variable after. */
export function withGraphs<T>(on: boolean, fn: () => T): T {
  const before = process.env.VELA_GRAPHS;
  process.env.VELA_GRAPHS = on ? '1' : '0';
  try {
    return fn();
  } finally {
    if (before === undefined) delete process.env.VELA_GRAPHS;
    else process.env.VELA_GRAPHS = before;
  }
}
