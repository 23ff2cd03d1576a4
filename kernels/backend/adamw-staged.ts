/**
 * AdamW on tfjs-node running on the CPU, where JavaScript cannot reach tensor memory and every
 * TensorFlow eager op costs 15-40 us of dispatch through the addon. As TF.js ops a step ran ~15
 * kernels per parameter plus a finite check (77 ms of a 390 ms flow05-tiny full step); a plain
 * JavaScript loop over copies was slower still (every operation rounded with Math.fround).
 * Here each parameter's p, g, m, v are copied into a WebAssembly.Memory of this module's own,
 * updated there by kernels/backend/adamw-simd.ts's SIMD loop (bit-identical to the TF.js ops, so to the
 * wasm backend's update), and the new p, m, v copied out into fresh tensors. Copies are plain
 * memcpys: ~7 per value, against ~15 kernel launches.
 */
import * as tf from '@tensorflow/tfjs';
import { flagFinite, runSimd, type AdamWScalars } from './adamw-fused.ts';
import { newWasmMemory } from './wasm-asm.ts';

type NativeBackend = { readSync(dataId: object): unknown; isUsingGpuDevice?: boolean };

const PAGE = 65536;
/** wasm32's ceiling: 4 GiB, 65,536 pages. One parameter needs 7 x its size x 4 bytes. */
const MAX_PAGES = 65536;

let memory: ReturnType<typeof newWasmMemory> | null = null;

/** The staging memory, grown to at least `bytes`. */
function memoryOf(bytes: number): ReturnType<typeof newWasmMemory> {
  const pages = Math.ceil(bytes / PAGE);
  if (pages > MAX_PAGES) throw new RangeError(`AdamW staging: a parameter of ${bytes / 28} values needs ${bytes} bytes, above wasm32's 4 GiB`);
  memory ??= newWasmMemory(Math.max(pages, 16), MAX_PAGES);
  const have = memory.buffer.byteLength / PAGE;
  if (pages > have) memory.grow(pages - have);
  return memory;
}

/**
 * Whether the active backend is tfjs-node on the CPU, the one this path serves (the wasm and cpu
 * backends update in place, kernels/backend/adamw-fused.ts; tfjs-node-gpu's tensors live on the device).
 */
export function stagedAdamWApplies(): boolean {
  return tf.getBackend() === 'tensorflow' && !(tf.backend() as unknown as NativeBackend).isUsingGpuDevice;
}

/**
 * A tensor's float32 values, never to be written: tfjs-node's readSync, which copies them out of
 * TensorFlow, or gives the array a tensor was made from while no op has used it yet (the
 * moments: they never reach a TensorFlow op, so reading them costs no copy).
 */
export function readFloat32(t: tf.Tensor): Float32Array {
  if (t.dtype !== 'float32') throw new Error(`AdamW staging: a ${t.dtype} tensor [${t.shape}]; only float32 is supported`);
  return (tf.backend() as unknown as NativeBackend).readSync(t.dataId) as Float32Array;
}

/**
 * New parameter and moments of one tensor, [p', m', v'] as fresh float32 tensors of p's shape,
 * and whether all of them are finite (the SIMD loop's flag). Inputs are read, never written;
 * `read` gives a tensor's values (readFloat32, or copies already made).
 * Call only where stagedAdamWApplies(). @throws RangeError above 4 GiB of staging for one tensor.
 */
export function adamwStaged(p: tf.Tensor, g: tf.Tensor, m: tf.Tensor, v: tf.Tensor, s: AdamWScalars, read: (t: tf.Tensor) => Float32Array = readFloat32): { out: [tf.Tensor, tf.Tensor, tf.Tensor]; finite: boolean } {
  const n = p.size;
  const padded = Math.ceil(n / 4) * 4; // the loop runs 4 lanes at a time; padding is zeros
  const mem = memoryOf(7 * padded * 4 + 16);
  const heap = new Float32Array(mem.buffer);
  [p, g, m, v].forEach((t, k) => {
    heap.set(read(t), k * padded);
    heap.fill(0, k * padded + n, (k + 1) * padded);
  });
  // The finite flag's 16 bytes follow the seven runs.
  runSimd(mem, [0, 1, 2, 3, 4, 5, 6].map((k) => k * padded * 4) as [number, number, number, number, number, number, number], padded * 4, 7 * padded * 4, s);
  const finite = flagFinite(heap.subarray(7 * padded, 7 * padded + 4));
  // Copies out of the staging memory, which the next parameter reuses.
  const out = [4, 5, 6].map((k) => tf.tensor(heap.slice(k * padded, k * padded + n), p.shape, 'float32')) as [tf.Tensor, tf.Tensor, tf.Tensor];
  return { out, finite };
}
