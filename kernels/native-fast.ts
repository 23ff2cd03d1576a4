/**
 * Kernels of tfjs-node (the `tensorflow` backend) that TF.js's own gradients call as no-ops:
 * every Add, Sub, Mul and Div gradient ends with a reshape to its input's shape, most often the
 * shape it already has, and some ops cast to the dtype their input already has. tfjs-node runs
 * each as a TensorFlow op (a Reshape also makes a shape tensor first): ~60 us of dispatch, 330+
 * times in a pi05-tiny training step. These versions share the input's data (refcounted, as the
 * cpu and wasm backends' Reshape and Identity do) when nothing changes, and otherwise run the
 * package's kernel. Same outputs. Installed once by initBackend when tfjs-node is chosen.
 */
import * as tf from '@tensorflow/tfjs';

type Native = { incRef(dataId: object): void };
type Info = { dataId: object; shape: number[]; dtype: tf.DataType };

let installed = false;

/** Registers the no-op paths of Reshape and Cast on the `tensorflow` backend (idempotent). */
export function installFastNativeKernels(): void {
  if (installed) return;
  installed = true;
  const wrap = (kernelName: string, noop: (x: Info, attrs: tf.NamedAttrMap) => number[] | null) => {
    const stock = tf.getKernel(kernelName, 'tensorflow');
    if (!stock) return; // not a tfjs-node this module knows: keep whatever is registered
    tf.unregisterKernel(kernelName, 'tensorflow');
    tf.registerKernel({
      kernelName,
      backendName: 'tensorflow',
      kernelFunc: (args) => {
        const x = (args.inputs as { x: Info }).x;
        const shape = noop(x, args.attrs ?? {});
        if (!shape) return stock.kernelFunc(args);
        (args.backend as unknown as Native).incRef(x.dataId);
        return { dataId: x.dataId, shape, dtype: x.dtype } as tf.TensorInfo;
      },
    });
  };
  wrap('Reshape', (x, attrs) => {
    const shape = tf.util.inferFromImplicitShape([...(attrs.shape as number[])], tf.util.sizeFromShape(x.shape));
    return tf.util.arraysEqual(shape, x.shape) ? shape : null;
  });
  wrap('Cast', (x, attrs) => (attrs.dtype === x.dtype && x.dtype !== 'string' ? [...x.shape] : null));
}
