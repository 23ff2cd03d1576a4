/**
 * The softmax's backward pass over the last axis, ds = p (dp - sum_j dp_j p_j) per row, as one
 * pass per row instead of four TF.js kernels over the whole [heads, tq, tk] tensor (attention's
 * backward, kernels/layers.ts). On wasm, when tk is a multiple of 4, it is a SIMD loop on the
 * backend's heap (kernels/backend/wasm-asm.ts); on the cpu backend (and for other tk) a JavaScript loop
 * that sums in the same order (four lanes j mod 4, then (l0 + l1) + (l2 + l3)), so the two agree
 * bit for bit; elsewhere the TF.js ops, whose sum may round differently in the last bits.
 */
import * as tf from '@tensorflow/tfjs';
import { hostMemory } from './host-memory.ts';
import { I32, V128, add, assemble, at, extractLane, f32add, get, i32add, i32const, instantiate, load, loop16, loopStep, mul, set, splat, store, sub, zero4 } from './wasm-asm.ts';

type GradFn = (dp: number, p: number, out: number, rows: number, rowBytes: number) => void;

function module(): Uint8Array {
  // Params: dp, p, out, rows, rowBytes. Locals: r, i (i32), row pointers DPR, PR, OR (i32); ACC, D (v128).
  const [DP, P, OUT, ROWS, ROWB, R, I, DPR, PR, OR, ACC, D] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11];
  const lane = (k: number) => [...get(ACC), ...extractLane(k)];
  const code = [
    ...get(DP), ...set(DPR), ...get(P), ...set(PR), ...get(OUT), ...set(OR),
    ...i32const(0), ...set(R),
    ...loopStep(R, ROWS, 1, [
      ...zero4, ...set(ACC),
      ...loop16(I, ROWB, [...get(ACC), ...at(DPR, I), ...load, ...at(PR, I), ...load, ...mul, ...add, ...set(ACC)]),
      ...lane(0), ...lane(1), ...f32add, ...lane(2), ...lane(3), ...f32add, ...f32add, ...splat, ...set(D),
      ...loop16(I, ROWB, [...at(OR, I), ...at(PR, I), ...load, ...at(DPR, I), ...load, ...get(D), ...sub, ...mul, ...store]),
      ...get(DPR), ...get(ROWB), ...i32add, ...set(DPR),
      ...get(PR), ...get(ROWB), ...i32add, ...set(PR),
      ...get(OR), ...get(ROWB), ...i32add, ...set(OR),
    ]),
  ];
  return assemble([{ name: 'grad', params: [I32, I32, I32, I32, I32], locals: [{ count: 5, type: I32 }, { count: 2, type: V128 }], code }]);
}

const instances = new WeakMap<object, { grad: GradFn }>();

/** The same operations as the SIMD loop, row by row, in JavaScript (any row length). */
function rowsJs(dp: Float32Array, p: Float32Array, out: Float32Array, k: number): void {
  const f = Math.fround;
  const lanes = [0, 0, 0, 0];
  for (let o = 0; o < out.length; o += k) {
    lanes.fill(0);
    for (let j = 0; j < k; j++) lanes[j & 3] = f(lanes[j & 3]! + f(dp[o + j]! * p[o + j]!));
    const dot = f(f(lanes[0]! + lanes[1]!) + f(lanes[2]! + lanes[3]!));
    for (let j = 0; j < k; j++) out[o + j] = f(p[o + j]! * f(dp[o + j]! - dot));
  }
}

/** softmaxGrad as TF.js ops: what tfjs-node runs. */
export function softmaxGradOps(dp: tf.Tensor, p: tf.Tensor): tf.Tensor {
  return tf.tidy(() => tf.mul(p, tf.sub(dp, tf.sum(tf.mul(dp, p), -1, true))));
}

/**
 * ds = p (dp - rowsum(dp p)) over the last axis: dp (the gradient of the softmax's output) and p
 * (its output), float32 of one shape -> float32 of that shape.
 * @throws Error for operands of other dtypes or shapes.
 */
export function softmaxGrad(dp: tf.Tensor, p: tf.Tensor): tf.Tensor {
  if (dp.dtype !== 'float32' || p.dtype !== 'float32' || dp.shape.length !== p.shape.length || dp.shape.some((d, i) => d !== p.shape[i])) {
    throw new Error(`softmaxGrad: dp and p must be float32 of one shape; got ${dp.dtype}[${dp.shape}] and ${p.dtype}[${p.shape}]`);
  }
  const host = hostMemory();
  if (!host) return softmaxGradOps(dp, p);
  const k = p.shape[p.rank - 1]!;
  const out = host.alloc(p.shape);
  if (host.heap && k % 4 === 0 && p.size > 0) {
    const { memory, offset } = host.heap;
    instantiate(instances, memory, module).grad(offset(dp), offset(p), offset(out), p.size / k, k * 4);
  } else if (p.size > 0) {
    rowsJs(host.view(dp), host.view(p), host.view(out), k);
  }
  return out;
}
