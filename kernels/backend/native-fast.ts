/**
 * Kernels of tfjs-node (the `tensorflow` backend) that TF.js's own gradients call as no-ops:
 * every Add, Sub, Mul and Div gradient ends with a reshape to its input's shape, most often the
 * shape it already has, and some ops cast to the dtype their input already has. tfjs-node runs
 * each as a TensorFlow op (a Reshape also makes a shape tensor first): ~60 us of dispatch, 330+
 * times in a flow05-tiny training step. These versions share the input's data (refcounted, as the
 * cpu and wasm backends' Reshape and Identity do) when nothing changes, and otherwise run the
 * package's kernel, except that a Reshape reuses one int32 shape tensor per shape instead of
 * making and freeing one each time. Same outputs. Installed once by initBackend when tfjs-node is
 * chosen.
 */
import * as tf from '@tensorflow/tfjs';

type Info = { dataId: object; shape: number[]; dtype: tf.DataType };
/** The parts of tfjs-node's backend that a Reshape with a kept shape tensor needs (internal API). */
type Internals = {
  incRef(dataId: object): void;
  /** Per data id, the TensorFlow dtype of its handle (a TF_DataType number). */
  tensorMap?: { get(dataId: object): { dtype: number } | undefined };
  binding?: {
    createTensor(shape: number[], dtype: number, values: Int32Array): number;
    executeOp(name: string, attrs: object[], inputs: number[], outputs: number): unknown[];
    TF_INT32: number;
    TF_FLOAT: number;
    TF_BOOL: number;
    TF_ATTR_TYPE: number;
  };
  getInputTensorIds?(ts: Info[]): number[];
  createOutputTensor?(metadata: unknown): tf.TensorInfo;
};

/** Shape tensors made once per backend, by shape: each Reshape of tfjs-node makes and frees one. */
const shapeTensors = new WeakMap<object, Map<string, { id: number; values: Int32Array }>>();
const MAX_SHAPES = 4096;

/**
 * A shape-changing Reshape as one TensorFlow op over a kept int32 shape tensor, or null where
 * tfjs-node's internals are not as expected or the cache is full (the stock kernel then runs).
 */
function reshapeKept(backend: Internals, x: Info, shape: number[]): tf.TensorInfo | null {
  const b = backend.binding;
  if (!b || !backend.getInputTensorIds || !backend.createOutputTensor || (x.dtype !== 'float32' && x.dtype !== 'int32')) return null;
  let cache = shapeTensors.get(backend);
  if (!cache) shapeTensors.set(backend, (cache = new Map()));
  const key = shape.join(',');
  let kept = cache.get(key);
  if (!kept) {
    if (cache.size >= MAX_SHAPES) return null;
    const values = Int32Array.from(shape);
    kept = { id: b.createTensor([shape.length], b.TF_INT32, values), values }; // values stay referenced: TensorFlow may read them in place
    cache.set(key, kept);
  }
  const attrs = [
    { name: 'T', type: b.TF_ATTR_TYPE, value: x.dtype === 'float32' ? b.TF_FLOAT : b.TF_INT32 },
    { name: 'Tshape', type: b.TF_ATTR_TYPE, value: b.TF_INT32 },
  ];
  const [xId] = backend.getInputTensorIds([x]);
  return backend.createOutputTensor(b.executeOp('Reshape', attrs, [xId!, kept.id], 1)[0]);
}

let installed = false;

/** x's data under `shape` (the same size), shared and refcounted, as the cpu backend's Reshape. */
function share(backend: Internals, x: Info, shape: number[]): tf.TensorInfo {
  backend.incRef(x.dataId);
  return { dataId: x.dataId, shape, dtype: x.dtype } as tf.TensorInfo;
}

/** Registers the fast paths of Reshape and Cast on the `tensorflow` backend (idempotent). */
export function installFastNativeKernels(): void {
  if (installed) return;
  installed = true;
  /** Puts `fast` before the package's kernel, which runs wherever `fast` answers null. */
  const wrap = (kernelName: string, fast: (x: Info, attrs: tf.NamedAttrMap, backend: Internals) => tf.TensorInfo | null) => {
    const stock = tf.getKernel(kernelName, 'tensorflow');
    if (!stock) return; // not a tfjs-node this module knows: keep whatever is registered
    tf.unregisterKernel(kernelName, 'tensorflow');
    tf.registerKernel({
      kernelName,
      backendName: 'tensorflow',
      kernelFunc: (args) => fast((args.inputs as { x: Info }).x, args.attrs ?? {}, args.backend as unknown as Internals) ?? stock.kernelFunc(args),
    });
  };
  wrap('Reshape', (x, attrs, backend) => {
    const shape = tf.util.inferFromImplicitShape([...(attrs.shape as number[])], tf.util.sizeFromShape(x.shape));
    return tf.util.arraysEqual(shape, x.shape) ? share(backend, x, shape) : reshapeKept(backend, x, shape);
  });
  // TF.js's dtype is a label: tfjs-node calls a TensorFlow uint8 or int64 handle (its image
  // decoders' outputs) 'int32', and casting one to int32 must run. Share only when the handle's
  // own dtype is the one asked for.
  wrap('Cast', (x, attrs, backend) => {
    const b = backend.binding;
    const want = b && ({ float32: b.TF_FLOAT, int32: b.TF_INT32, bool: b.TF_BOOL } as Record<string, number>)[x.dtype];
    return attrs.dtype === x.dtype && want !== undefined && backend.tensorMap?.get(x.dataId)?.dtype === want ? share(backend, x, [...x.shape]) : null;
  });
}
