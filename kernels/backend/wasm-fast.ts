/**
 * Faster Slice, SplitV and Unpack kernels for the TF.js wasm backend. The stock kernels read
 * the whole input out of the wasm heap (a full copy, `HEAPU8.slice`) for every piece they cut,
 * so cutting a tensor into n pieces costs n full copies (unstacking a [32, 156, 156] tensor took
 * ~290 ms). These versions read the input through a heap view and copy only the piece, which
 * makes per-head / per-datum 2-D matMuls (XNNPACK's fast path) affordable. Pack (tf.stack)
 * copies each input once into the output instead of going through ExpandDims + Concat, and
 * Identity shares its input's data (refcounted, as the cpu backend does) instead of copying it:
 * a training step runs ~1,700 Identities (gradient bookkeeping). Same outputs.
 * Installed once by initBackend when the wasm backend is chosen.
 */
import * as tf from '@tensorflow/tfjs';

type Heap = {
  typedArrayFromHeap(t: { shape: number[]; dtype: string; dataId: object }): Float32Array | Int32Array | Uint8Array;
  makeOutput(shape: number[], dtype: string): tf.TensorInfo;
  incRef(dataId: object): void;
};
interface SliceInfo { shape: number[]; dtype: string; dataId: object }

function sliceInto(x: SliceInfo, begin: number[], size: number[], backend: Heap): tf.TensorInfo {
  if (x.dtype === 'string') throw new Error('the fast wasm Slice kernel does not handle string tensors');
  const out = backend.makeOutput(size, x.dtype);
  // Views are taken after makeOutput, which may grow (and so detach) the heap.
  const xv = backend.typedArrayFromHeap(x);
  const ov = backend.typedArrayFromHeap(out as unknown as SliceInfo);
  const rank = x.shape.length;
  const strides = new Array<number>(rank).fill(1);
  for (let i = rank - 2; i >= 0; i--) strides[i] = strides[i + 1]! * x.shape[i + 1]!;
  // Merge the trailing axes that are taken whole into one contiguous run.
  let inner = rank - 1;
  while (inner > 0 && begin[inner] === 0 && size[inner] === x.shape[inner]) inner--;
  const run = size.slice(inner).reduce((a, b) => a * b, 1);
  const outer = size.slice(0, inner);
  const count = outer.reduce((a, b) => a * b, 1);
  const idx = new Array<number>(inner).fill(0);
  let o = 0;
  for (let n = 0; n < count; n++) {
    let off = begin[inner]! * strides[inner]!;
    for (let d = 0; d < inner; d++) off += (begin[d]! + idx[d]!) * strides[d]!;
    ov.set(xv.subarray(off, off + run), o);
    o += run;
    for (let d = inner - 1; d >= 0; d--) {
      if (++idx[d]! < outer[d]!) break;
      idx[d] = 0;
    }
  }
  return out;
}

let installed = false;

/** Replaces the wasm backend's Slice, SplitV, Identity, Pack and Unpack kernels (idempotent). */
export function installFastWasmKernels(): void {
  if (installed) return;
  installed = true;
  const reg = (kernelName: string, kernelFunc: tf.KernelFunc) => {
    tf.unregisterKernel(kernelName, 'wasm');
    tf.registerKernel({ kernelName, backendName: 'wasm', kernelFunc });
  };
  reg('Slice', ({ inputs, attrs, backend }) => {
    const x = (inputs as { x: SliceInfo }).x;
    const [b, s] = tf.slice_util.parseSliceParams(x as unknown as tf.TensorInfo, (attrs as { begin: number[] }).begin, (attrs as { size: number[] }).size);
    return sliceInto(x, b, s, backend as unknown as Heap);
  });
  reg('SplitV', ({ inputs, attrs, backend }) => {
    const x = (inputs as { x: SliceInfo }).x;
    const { numOrSizeSplits, axis } = attrs as { numOrSizeSplits: number | number[]; axis: number };
    const ax = tf.util.parseAxisParam(axis, x.shape)[0]!;
    const sizes = tf.backend_util.prepareSplitSize(x as unknown as tf.TensorInfo, numOrSizeSplits, ax);
    const begin = new Array<number>(x.shape.length).fill(0);
    return sizes.map((n) => {
      const size = [...x.shape];
      size[ax] = n;
      const out = sliceInto(x, [...begin], size, backend as unknown as Heap);
      begin[ax]! += n;
      return out;
    });
  });
  reg('Identity', ({ inputs, backend }) => {
    const x = (inputs as { x: SliceInfo }).x;
    if (x.dtype === 'string') throw new Error('the fast wasm Identity kernel does not handle string tensors');
    (backend as unknown as Heap).incRef(x.dataId);
    return { dataId: x.dataId, shape: [...x.shape], dtype: x.dtype } as tf.TensorInfo;
  });
  reg('Pack', ({ inputs, attrs, backend }) => {
    const xs = inputs as unknown as SliceInfo[];
    const first = xs[0]!;
    if (first.dtype === 'string') throw new Error('the fast wasm Pack kernel does not handle string tensors');
    for (const x of xs) {
      if (x.dtype !== first.dtype || x.shape.length !== first.shape.length || x.shape.some((d, i) => d !== first.shape[i])) {
        throw new Error(`stack: every tensor must have shape [${first.shape}] and dtype ${first.dtype}; got [${x.shape}] ${x.dtype}`);
      }
    }
    let axis = (attrs as { axis: number }).axis;
    if (axis < 0) axis += first.shape.length + 1;
    const outShape = [...first.shape.slice(0, axis), xs.length, ...first.shape.slice(axis)];
    const heap = backend as unknown as Heap;
    const out = heap.makeOutput(outShape, first.dtype);
    // Views after makeOutput, which may grow (and so detach) the heap.
    const ov = heap.typedArrayFromHeap(out as unknown as SliceInfo);
    const views = xs.map((x) => heap.typedArrayFromHeap(x));
    const inner = first.shape.slice(axis).reduce((a, b) => a * b, 1);
    const outer = first.shape.slice(0, axis).reduce((a, b) => a * b, 1);
    let o = 0;
    for (let n = 0; n < outer; n++) {
      for (const v of views) {
        ov.set(v.subarray(n * inner, (n + 1) * inner), o);
        o += inner;
      }
    }
    return out;
  });
  reg('Unpack', ({ inputs, attrs, backend }) => {
    const x = (inputs as { value: SliceInfo }).value;
    let axis = (attrs as { axis: number }).axis;
    if (axis < 0) axis += x.shape.length;
    const outShape = x.shape.filter((_, i) => i !== axis);
    const size = [...x.shape];
    size[axis] = 1;
    const outs: tf.TensorInfo[] = [];
    for (let i = 0; i < x.shape[axis]!; i++) {
      const begin = new Array<number>(x.shape.length).fill(0);
      begin[axis] = i;
      const out = sliceInto(x, begin, size, backend as unknown as Heap);
      outs.push({ dataId: out.dataId, dtype: out.dtype, shape: outShape });
    }
    return outs;
  });
}
