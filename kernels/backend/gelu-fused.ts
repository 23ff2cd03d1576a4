/**
 * The arithmetic around GELU's sigmoid as single passes over memory (kernels/layers.ts geluTanh):
 *
 *   z(x)        = x * (c + c a x^2)                         the sigmoid's argument, 2 sqrt(2/pi) (x + a x^3)
 *   dx(dy, x, s) = dy * (s * (1 + x (1 - s) (c + 3 c a x^2)))   with s = sigmoid(z(x)) kept from the forward
 *
 * with c = 2 sqrt(2/pi), a = 0.044715 (MODEL.md: GELU, tanh approximation, as x sigmoid(2 z)).
 * As TF.js ops these were 4 and 9 elementwise kernels over [b, t, mlp] (the backward recomputed
 * the sigmoid too): ~11 ms of every flow05-tiny prefix MLP's forward + backward on wasm, memory
 * traffic and kernel dispatch. On wasm each is one SIMD loop on the backend's heap
 * (kernels/backend/wasm-asm.ts), on the cpu backend one JavaScript loop, elsewhere the TF.js ops; all
 * three do the same float32 operations in the same order, so they agree bit for bit
 * (test/wasm-fast.test.ts).
 */
import * as tf from '@tensorflow/tfjs';
import { hostMemory, type HostMemory } from './host-memory.ts';
import { F32, I32, V128, add, assemble, at, get, instantiate, load, loop16, mul, set, splat, store, sub } from './wasm-asm.ts';

const C = 2 * Math.sqrt(2 / Math.PI);
const A = 0.044715;
const f = Math.fround;
// The float32 constants every path uses.
const C32 = f(C);
const CA32 = f(C * A);
const CA3_32 = f(3 * C * A);

type ZFn = (x: number, out: number, bytes: number, c: number, ca: number) => void;
type GradFn = (dy: number, x: number, s: number, out: number, bytes: number, c: number, ca3: number, one: number) => void;

function module(): Uint8Array {
  // z: params x, out, bytes (i32), c, ca (f32); locals i, C, CA, X.
  const z = (() => {
    const [X, OUT, BYTES, I, CS, CAS, XV] = [0, 1, 2, 5, 6, 7, 8];
    return {
      name: 'z', params: [I32, I32, I32, F32, F32], locals: [{ count: 1, type: I32 }, { count: 3, type: V128 }],
      code: [
        ...get(3), ...splat, ...set(CS), ...get(4), ...splat, ...set(CAS),
        ...loop16(I, BYTES, [
          ...at(OUT, I),
          ...at(X, I), ...load, ...set(XV),
          ...get(XV), ...get(CAS), ...get(XV), ...get(XV), ...mul, ...mul, ...get(CS), ...add, ...mul, // x * (ca * (x x) + c)
          ...store,
        ]),
      ],
    };
  })();
  // grad: params dy, x, s, out, bytes (i32), c, ca3, one (f32); locals i, C, CA3, ONE, X, S.
  const grad = (() => {
    const [DY, X, S, OUT, BYTES, I, CS, CA3S, ONES, XV, SV] = [0, 1, 2, 3, 4, 8, 9, 10, 11, 12, 13];
    return {
      name: 'grad', params: [I32, I32, I32, I32, I32, F32, F32, F32], locals: [{ count: 1, type: I32 }, { count: 5, type: V128 }],
      code: [
        ...get(5), ...splat, ...set(CS), ...get(6), ...splat, ...set(CA3S), ...get(7), ...splat, ...set(ONES),
        ...loop16(I, BYTES, [
          ...at(OUT, I),
          ...at(X, I), ...load, ...set(XV),
          ...at(S, I), ...load, ...set(SV),
          ...at(DY, I), ...load,
          ...get(SV),
          ...get(XV), ...get(ONES), ...get(SV), ...sub, ...mul, // r = x (1 - s)
          ...get(CA3S), ...get(XV), ...get(XV), ...mul, ...mul, ...get(CS), ...add, // p = ca3 (x x) + c
          ...mul, ...get(ONES), ...add, // v = r p + 1
          ...mul, // d = s v
          ...mul, // dy d
          ...store,
        ]),
      ],
    };
  })();
  return assemble([z, grad]);
}

const instances = new WeakMap<object, { z: ZFn; grad: GradFn }>();

/** One pass over `inputs` into a new tensor shaped like the first: SIMD body, JavaScript tail. */
function mapHost(host: HostMemory, inputs: tf.Tensor[], simd: ((offsets: number[], bytes: number) => void) | null, js: (views: Float32Array[], out: Float32Array, start: number) => void): tf.Tensor {
  const out = host.alloc(inputs[0]!.shape);
  const n = out.size;
  let start = 0;
  if (simd && host.heap) {
    start = n - (n % 4);
    simd([...inputs, out].map(host.heap.offset), start * 4);
  }
  // Views after the alloc (a growing wasm heap detaches older views).
  js(inputs.map((t) => host.view(t)), host.view(out), start);
  return out;
}

function checkSame(what: string, ts: tf.Tensor[]): void {
  for (const t of ts) {
    if (t.dtype !== 'float32' || t.size !== ts[0]!.size) throw new Error(`${what}: operands must be float32 of one size; got ${ts.map((x) => `${x.dtype}[${x.shape}]`).join(', ')}`);
  }
}

/** geluArgument as TF.js ops, whatever the backend: what tfjs-node runs; the reference in tests. */
export function geluArgumentOps(x: tf.Tensor): tf.Tensor {
  return tf.tidy(() => tf.mul(x, tf.add(tf.mul(tf.scalar(CA32), tf.mul(x, x)), tf.scalar(C32))));
}

/** geluGradient as TF.js ops, whatever the backend: what tfjs-node runs; the reference in tests. */
export function geluGradientOps(dy: tf.Tensor, x: tf.Tensor, s: tf.Tensor): tf.Tensor {
  return tf.tidy(() => {
    const r = tf.mul(x, tf.sub(tf.scalar(1), s));
    const p = tf.add(tf.mul(tf.scalar(CA3_32), tf.mul(x, x)), tf.scalar(C32));
    return tf.mul(dy, tf.mul(s, tf.add(tf.mul(r, p), tf.scalar(1))));
  });
}

/**
 * z(x) = x (c + c a x^2): x float32 of any shape -> float32 of the same shape.
 * @throws Error for a non-float32 operand.
 */
export function geluArgument(x: tf.Tensor): tf.Tensor {
  checkSame('geluArgument', [x]);
  const host = hostMemory();
  if (!host) return geluArgumentOps(x);
  const fns = host.heap ? instantiate(instances, host.heap.memory, module) : null;
  return mapHost(host, [x], fns ? ([xo, oo], bytes) => fns.z(xo!, oo!, bytes, C32, CA32) : null, ([xv], o, start) => {
    for (let i = start; i < o.length; i++) {
      const xi = xv![i]!;
      o[i] = f(xi * f(f(CA32 * f(xi * xi)) + C32));
    }
  });
}

/**
 * dx = dy s (1 + x (1 - s) (c + 3 c a x^2)) for s = sigmoid(z(x)): dy, x, s float32 of one size
 * (dy's shape is the result's). @throws Error for operands of other dtypes or sizes.
 */
export function geluGradient(dy: tf.Tensor, x: tf.Tensor, s: tf.Tensor): tf.Tensor {
  checkSame('geluGradient', [dy, x, s]);
  const host = hostMemory();
  if (!host) return geluGradientOps(dy, x, s);
  const fns = host.heap ? instantiate(instances, host.heap.memory, module) : null;
  return mapHost(host, [dy, x, s], fns ? ([d, xo, so, oo], bytes) => fns.grad(d!, xo!, so!, oo!, bytes, C32, CA3_32, 1) : null, ([dv, xv, sv], o, start) => {
    for (let i = start; i < o.length; i++) {
      const xi = xv![i]!;
      const si = sv![i]!;
      const r = f(xi * f(1 - si));
      const p = f(f(CA3_32 * f(xi * xi)) + C32);
      o[i] = f(dv![i]! * f(si * f(f(r * p) + 1)));
    }
  });
}
