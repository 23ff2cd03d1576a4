/**
 * Zero-copy access to float32 tensor memory on the backends whose memory JavaScript can reach:
 * the wasm backend (a view of the wasm heap) and the cpu backend (the backing typed array). Used
 * by loops that TF.js would run as many small kernels (the fused AdamW of kernels/backend/adamw-fused.ts).
 * On other backends (tfjs-node, tfjs-node-gpu) `hostMemory()` is null: callers use TF.js ops, or
 * copies (kernels/backend/adamw-staged.ts).
 */
import * as tf from '@tensorflow/tfjs';
import { isWasmMemory } from './wasm-asm.ts';

/** Float32 memory of tensors on the active backend. */
export interface HostMemory {
  /**
   * A new float32 tensor of `shape` whose memory the caller fills through `view` before anyone
   * else reads it (its initial contents are undefined on wasm).
   */
  alloc(shape: readonly number[]): tf.Tensor;
  /**
   * The tensor's float32 values in place, row-major. Writing is allowed only to tensors from
   * `alloc` that nothing else holds. On wasm, take views after the last `alloc`: allocation may
   * grow the heap, which detaches older views. @throws Error on a non-float32 tensor.
   */
  view(t: tf.Tensor): Float32Array;
  /** On wasm: the backend's WebAssembly.Memory (typed `object`: the project's lib has no wasm types) and a tensor's byte address in it. */
  heap?: { memory: object; offset(t: tf.Tensor): number };
}

type WasmHeap = {
  makeOutput(shape: number[], dtype: 'float32'): tf.TensorInfo;
  typedArrayFromHeap(t: tf.TensorInfo): Float32Array;
  dataIdMap: { get(dataId: object): { memoryOffset: number } };
  wasm: { asm?: { memory?: unknown } };
};
type CpuData = { readSync(dataId: object): unknown };

function float32(t: tf.Tensor): void {
  if (t.dtype !== 'float32') throw new Error(`host memory view of a ${t.dtype} tensor [${t.shape}]; only float32 is supported`);
}

let cached: { backend: object; host: HostMemory | null } | null = null;

/**
 * Host memory for the active backend, or null where tensors live outside JavaScript's reach.
 * Made once per backend instance (every fused op asks).
 */
export function hostMemory(): HostMemory | null {
  const backend = tf.backend();
  if (cached?.backend !== backend) cached = { backend, host: make(tf.getBackend()) };
  return cached.host;
}

function make(name: string): HostMemory | null {
  if (name === 'wasm') {
    const heap = tf.backend() as unknown as WasmHeap;
    const memory = heap.wasm.asm?.memory;
    return {
      heap: isWasmMemory(memory) ? { memory, offset: (t) => heap.dataIdMap.get(t.dataId).memoryOffset } : undefined,
      alloc: (shape) => tf.engine().makeTensorFromTensorInfo(heap.makeOutput([...shape], 'float32')),
      view: (t) => {
        float32(t);
        return heap.typedArrayFromHeap(t);
      },
    };
  }
  if (name === 'cpu') {
    const cpu = tf.backend() as unknown as CpuData;
    return {
      alloc: (shape) => tf.tensor(new Float32Array(shape.reduce((a, b) => a * b, 1)), [...shape], 'float32'),
      // The cpu backend keeps the array it was given and readSync returns it, uncopied.
      view: (t) => {
        float32(t);
        return cpu.readSync(t.dataId) as Float32Array;
      },
    };
  }
  return null;
}
