/**
 * RMSNorm (MODEL.md D3) forward and backward as row passes over memory, for kernels/layers.ts:
 *
 *   r = 1 / sqrt(sum(x^2) / w + eps),  y = x r (* weight)                     per row of w values
 *   g = dy (* weight),  k = r^3 sum(g x) / w,  dx = g r - x k,  dweight += dy (x r)
 *
 * As TF.js ops these were ~6 kernels forward and ~12 backward per norm, each a pass over
 * [rows, w]. On wasm, when w is a multiple of 4, each direction is one SIMD loop per row on the
 * backend's heap (kernels/backend/wasm-asm.ts); on the cpu backend (and for other w) a JavaScript loop
 * that does the same float32 operations in the same order (sums over four lanes j mod 4, then
 * (l0 + l1) + (l2 + l3)), so the two agree bit for bit (test/rms-fused.test.ts); elsewhere the
 * TF.js ops, whose sums and power may round differently in the last bits.
 */
import * as tf from '@tensorflow/tfjs';
import { hostMemory, type HostMemory } from './host-memory.ts';
import {
  F32, I32, V128, add, assemble, at, extractLane, f32add, f32div, f32load, f32mul, f32sqrt, f32store, get, i32add, i32const, instantiate, load, loop16, loopStep, mul, set, splat, store, sub, tee, zero4,
} from './wasm-asm.ts';

export const RMS_EPS = 1e-6;

type FwdFn = (x: number, wt: number, y: number, r: number, rows: number, rowBytes: number, invW: number, eps: number, one: number) => void;
type BwdFn = (dy: number, x: number, r: number, wt: number, dx: number, dw: number, rows: number, rowBytes: number, invW: number) => void;

/** Local indices by name after `params` parameters: i32 names first, then v128, then f32. */
function locals(params: number, i32: string[], v128: string[], f32: string[]) {
  const idx: Record<string, number> = {};
  [...i32, ...v128, ...f32].forEach((n, k) => (idx[n] = params + k));
  return { idx, decl: [{ count: i32.length, type: I32 }, { count: v128.length, type: V128 }, { count: f32.length, type: F32 }] };
}

/** Horizontal sum of a v128 local: (l0 + l1) + (l2 + l3). */
const hsum = (v: number) => [...get(v), ...extractLane(0), ...get(v), ...extractLane(1), ...f32add, ...get(v), ...extractLane(2), ...get(v), ...extractLane(3), ...f32add, ...f32add];

function forward(weighted: boolean) {
  const [X, WT, Y, ROUT, ROWS, ROWB, INVW, EPS, ONE] = [0, 1, 2, 3, 4, 5, 6, 7, 8];
  const { idx: L, decl } = locals(9, ['row', 'i', 'xr', 'yr', 'rp'], ['acc', 'rv', 'xv'], ['rs']);
  const code = [
    ...get(X), ...set(L.xr!), ...get(Y), ...set(L.yr!), ...get(ROUT), ...set(L.rp!), ...i32const(0), ...set(L.row!),
    ...loopStep(L.row!, ROWS, 1, [
      ...zero4, ...set(L.acc!),
      ...loop16(L.i!, ROWB, [...get(L.acc!), ...at(L.xr!, L.i!), ...load, ...tee(L.xv!), ...get(L.xv!), ...mul, ...add, ...set(L.acc!)]),
      // r = one / sqrt(sum * invW + eps)
      ...get(ONE), ...hsum(L.acc!), ...get(INVW), ...f32mul, ...get(EPS), ...f32add, ...f32sqrt, ...f32div, ...set(L.rs!),
      ...get(L.rp!), ...get(L.rs!), ...f32store,
      ...get(L.rs!), ...splat, ...set(L.rv!),
      ...loop16(L.i!, ROWB, [
        ...at(L.yr!, L.i!), ...at(L.xr!, L.i!), ...load, ...get(L.rv!), ...mul,
        ...(weighted ? [...at(WT, L.i!), ...load, ...mul] : []),
        ...store,
      ]),
      ...get(L.xr!), ...get(ROWB), ...i32add, ...set(L.xr!),
      ...get(L.yr!), ...get(ROWB), ...i32add, ...set(L.yr!),
      ...get(L.rp!), ...i32const(4), ...i32add, ...set(L.rp!),
    ]),
  ];
  return { name: weighted ? 'fwd_w' : 'fwd_n', params: [I32, I32, I32, I32, I32, I32, F32, F32, F32], locals: decl, code };
}

function backward(weighted: boolean) {
  const [DY, X, R, WT, DX, DW, ROWS, ROWB, INVW] = [0, 1, 2, 3, 4, 5, 6, 7, 8];
  const { idx: L, decl } = locals(9, ['row', 'i', 'dyr', 'xr', 'dxr', 'rp'], ['acc', 'rv', 'kv'], ['rs']);
  const g = [...at(L.dyr!, L.i!), ...load, ...(weighted ? [...at(WT, L.i!), ...load, ...mul] : [])]; // dy (* weight)
  const code = [
    ...get(DY), ...set(L.dyr!), ...get(X), ...set(L.xr!), ...get(DX), ...set(L.dxr!), ...get(R), ...set(L.rp!), ...i32const(0), ...set(L.row!),
    ...loopStep(L.row!, ROWS, 1, [
      ...zero4, ...set(L.acc!),
      ...loop16(L.i!, ROWB, [...get(L.acc!), ...g, ...at(L.xr!, L.i!), ...load, ...mul, ...add, ...set(L.acc!)]),
      ...get(L.rp!), ...f32load, ...set(L.rs!),
      // k = ((r r) r) (sum * invW)
      ...get(L.rs!), ...get(L.rs!), ...f32mul, ...get(L.rs!), ...f32mul, ...hsum(L.acc!), ...get(INVW), ...f32mul, ...f32mul, ...splat, ...set(L.kv!),
      ...get(L.rs!), ...splat, ...set(L.rv!),
      ...loop16(L.i!, ROWB, [
        ...at(L.dxr!, L.i!), ...g, ...get(L.rv!), ...mul, ...at(L.xr!, L.i!), ...load, ...get(L.kv!), ...mul, ...sub, ...store,
        ...(weighted ? [...at(DW, L.i!), ...at(DW, L.i!), ...load, ...at(L.dyr!, L.i!), ...load, ...at(L.xr!, L.i!), ...load, ...get(L.rv!), ...mul, ...mul, ...add, ...store] : []),
      ]),
      ...get(L.dyr!), ...get(ROWB), ...i32add, ...set(L.dyr!),
      ...get(L.xr!), ...get(ROWB), ...i32add, ...set(L.xr!),
      ...get(L.dxr!), ...get(ROWB), ...i32add, ...set(L.dxr!),
      ...get(L.rp!), ...i32const(4), ...i32add, ...set(L.rp!),
    ]),
  ];
  return { name: weighted ? 'bwd_w' : 'bwd_n', params: [I32, I32, I32, I32, I32, I32, I32, I32, F32], locals: decl, code };
}

const instances = new WeakMap<object, { fwd_w: FwdFn; fwd_n: FwdFn; bwd_w: BwdFn; bwd_n: BwdFn }>();
const module = () => assemble([forward(true), forward(false), backward(true), backward(false)]);

const fr = Math.fround;

function laneSum(lanes: number[]): number {
  return fr(fr(lanes[0]! + lanes[1]!) + fr(lanes[2]! + lanes[3]!));
}

function forwardJs(x: Float32Array, wt: Float32Array | null, y: Float32Array, r: Float32Array, w: number): void {
  const invW = fr(1 / w);
  const eps = fr(RMS_EPS);
  const lanes = [0, 0, 0, 0];
  for (let row = 0, o = 0; o < x.length; row++, o += w) {
    lanes.fill(0);
    for (let j = 0; j < w; j++) lanes[j & 3] = fr(lanes[j & 3]! + fr(x[o + j]! * x[o + j]!));
    const rs = fr(1 / fr(Math.sqrt(fr(fr(laneSum(lanes) * invW) + eps))));
    r[row] = rs;
    for (let j = 0; j < w; j++) y[o + j] = wt ? fr(fr(x[o + j]! * rs) * wt[j]!) : fr(x[o + j]! * rs);
  }
}

function backwardJs(dy: Float32Array, x: Float32Array, r: Float32Array, wt: Float32Array | null, dx: Float32Array, dw: Float32Array | null, w: number): void {
  const invW = fr(1 / w);
  const lanes = [0, 0, 0, 0];
  const g = (k: number, j: number) => (wt ? fr(dy[k]! * wt[j]!) : dy[k]!);
  for (let row = 0, o = 0; o < x.length; row++, o += w) {
    lanes.fill(0);
    for (let j = 0; j < w; j++) lanes[j & 3] = fr(lanes[j & 3]! + fr(g(o + j, j) * x[o + j]!));
    const rs = r[row]!;
    const k = fr(fr(fr(rs * rs) * rs) * fr(laneSum(lanes) * invW));
    for (let j = 0; j < w; j++) {
      dx[o + j] = fr(fr(g(o + j, j) * rs) - fr(x[o + j]! * k));
      if (dw) dw[j] = fr(dw[j]! + fr(dy[o + j]! * fr(x[o + j]! * rs)));
    }
  }
}

function simdFor(host: HostMemory, w: number) {
  return host.heap && w % 4 === 0 ? instantiate(instances, host.heap.memory, module) : null;
}

function check(what: string, x: tf.Tensor, weight: tf.Tensor | null, others: tf.Tensor[] = []): number {
  const w = x.shape[x.rank - 1]!;
  if (x.dtype !== 'float32' || others.some((t) => t.dtype !== 'float32' || t.size !== x.size)) {
    throw new Error(`${what}: operands must be float32 of x's size; got ${[x, ...others].map((t) => `${t.dtype}[${t.shape}]`).join(', ')}`);
  }
  if (weight && (weight.dtype !== 'float32' || weight.size !== w)) throw new Error(`${what}: weight is ${weight.dtype}[${weight.shape}]; expected float32 [${w}]`);
  return w;
}

/**
 * Forward: x [..., w] float32, weight [w] or null -> y [..., w] and r [..., 1] (the reciprocal
 * RMS per row, kept for the backward pass). @throws Error for bad dtypes or shapes.
 */
export function rmsForward(x: tf.Tensor, weight: tf.Tensor | null): { y: tf.Tensor; r: tf.Tensor } {
  const w = check('rmsForward', x, weight);
  const host = hostMemory();
  const rShape = [...x.shape.slice(0, -1), 1];
  if (!host || x.size === 0) {
    return tf.tidy(() => {
      const r = tf.rsqrt(tf.add(tf.mean(tf.square(x), -1, true), RMS_EPS));
      const n = tf.mul(x, r);
      return { y: weight ? tf.mul(n, weight) : n, r };
    });
  }
  const y = host.alloc(x.shape);
  const r = host.alloc(rShape);
  const fns = simdFor(host, w);
  if (fns && host.heap) {
    const o = host.heap.offset;
    (weight ? fns.fwd_w : fns.fwd_n)(o(x), weight ? o(weight) : 0, o(y), o(r), x.size / w, w * 4, fr(1 / w), fr(RMS_EPS), 1);
  } else {
    forwardJs(host.view(x), weight ? host.view(weight) : null, host.view(y), host.view(r), w);
  }
  return { y, r };
}

/**
 * Backward: dy and x [..., w], r [..., 1] from rmsForward, weight [w] or null -> dx [..., w] and
 * dweight [w] (null without a weight). @throws Error for bad dtypes or shapes.
 */
export function rmsBackward(dy: tf.Tensor, x: tf.Tensor, r: tf.Tensor, weight: tf.Tensor | null): { dx: tf.Tensor; dw: tf.Tensor | null } {
  const w = check('rmsBackward', x, weight, [dy]);
  if (r.size * w !== x.size) throw new Error(`rmsBackward: r has ${r.size} rows; x [${x.shape}] has ${x.size / w}`);
  const host = hostMemory();
  if (!host || x.size === 0) {
    const [dx, dw] = tf.tidy(() => {
      const g = weight ? tf.mul(dy, weight) : dy;
      const proj = tf.mean(tf.mul(g, x), -1, true);
      const dxOps = tf.sub(tf.mul(g, r), tf.mul(x, tf.mul(tf.pow(r, 3), proj)));
      return weight ? [dxOps, tf.sum(tf.reshape(tf.mul(dy, tf.mul(x, r)), [-1, w]), 0)] : [dxOps];
    });
    return { dx: dx!, dw: dw ?? null };
  }
  const dx = host.alloc(x.shape);
  const dw = weight ? host.alloc([w]) : null;
  // Views after the last alloc (a growing wasm heap detaches older views).
  if (dw) host.view(dw).fill(0);
  const fns = simdFor(host, w);
  if (fns && host.heap) {
    const o = host.heap.offset;
    (weight ? fns.bwd_w : fns.bwd_n)(o(dy), o(x), o(r), weight ? o(weight) : 0, o(dx), dw ? o(dw) : 0, x.size / w, w * 4, fr(1 / w));
  } else {
    backwardJs(host.view(dy), host.view(x), host.view(r), weight ? host.view(weight) : null, host.view(dx), dw ? host.view(dw) : null, w);
  }
  return { dx, dw };
}
