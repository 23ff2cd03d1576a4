/**
 * A Hub checkpoint folder read straight into TensorFlow.js tensors (server/models/hub-checkpoint.ts
 * streams it tensor by tensor), keeping the peak near one float32 copy of the model: the engine
 * worker's loader and bench/real-pi-full.ts's.
 *
 * tfjs-node keeps a new tensor's values in JS until an op first reads them, then copies them
 * into TensorFlow's memory and drops its reference. Running that op at load, and collecting the
 * JS arrays every 256 MiB (not one full GC per tensor: 800 of them), keeps one float32 copy of the
 * model plus at most ~256 MiB and one tensor in flight, not two. The op is a rank-changing Reshape
 * and back (TensorFlow's Reshape shares the buffer): a same-shape reshape or a clone shares the JS
 * values without running any op (kernels/backend/native-fast.ts), and every weight would be
 * copied again at its first use.
 */
import v8 from 'node:v8';
import vm from 'node:vm';
import * as tf from '@tensorflow/tfjs';
import type { PiShapeConfig } from '../../kernels/pi/keys.ts';
import { readHubCheckpoint } from './hub-checkpoint.ts';

const COLLECT_EVERY_BYTES = 256 * 2 ** 20;

/** A full garbage collection (the loader frees a model's worth of JS arrays); a no-op where V8 refuses. */
export const collectGarbage: () => void = (() => {
  const exposed = (globalThis as { gc?: () => void }).gc;
  if (exposed) return exposed;
  try {
    v8.setFlagsFromString('--expose-gc');
    return vm.runInNewContext('gc') as () => void;
  } catch {
    return () => {};
  }
})();

/**
 * Every parameter of the checkpoint in `dir` for model `cfg`, as float32 tensors in the
 * PyTorch-layout shapes (keyed by the runtime names of kernels/pi/params.ts), already in
 * TensorFlow's memory. On error the tensors made so far are disposed.
 * @returns the tensors (the caller owns them) and the milliseconds spent moving them into
 *   TensorFlow and collecting (the rest of a load is reading and BF16 widening).
 * @throws readHubCheckpoint's CheckpointError / HubCheckpointError (one line naming the file).
 */
export async function loadHubTensors(dir: string, cfg: PiShapeConfig): Promise<{ tensors: Map<string, tf.Tensor>; intoTfMs: number }> {
  const tensors = new Map<string, tf.Tensor>();
  let garbage = 0;
  let intoTfMs = 0;
  try {
    await readHubCheckpoint(dir, cfg, {
      onTensor: (name, data, shape) => {
        const s0 = performance.now();
        const t = tf.tensor(data, shape, 'float32');
        const flat = tf.reshape(t, [1, ...shape]);
        tensors.set(name, tf.reshape(flat, shape));
        tf.dispose([t, flat]);
        garbage += data.byteLength;
        if (garbage >= COLLECT_EVERY_BYTES) {
          collectGarbage();
          garbage = 0;
        }
        intoTfMs += performance.now() - s0;
      },
    });
  } catch (e) {
    tf.dispose([...tensors.values()]);
    throw e;
  }
  collectGarbage();
  return { tensors, intoTfMs };
}
