/**
 * Test helper: puts TF.js on the wasm backend (the tested path, MODEL.md "Backends").
 * Call `await useWasm()` in a `beforeAll`; repeated calls are cheap.
 */
import * as tf from '@tensorflow/tfjs';
import { setWasmPaths } from '@tensorflow/tfjs-backend-wasm';
import { createRequire } from 'node:module';
import path from 'node:path';

let ready: Promise<void> | undefined;

export function useWasm(): Promise<void> {
  ready ??= (async () => {
    const require = createRequire(import.meta.url);
    // The resolved entry sits in .../tfjs-backend-wasm/dist/, beside the .wasm binaries.
    setWasmPaths(path.dirname(require.resolve('@tensorflow/tfjs-backend-wasm')) + path.sep);
    if (!(await tf.setBackend('wasm'))) throw new Error('the wasm backend did not initialise');
    await tf.ready();
  })();
  return ready;
}
