/**
 * The AdamW update as a WebAssembly SIMD loop that runs on the TF.js wasm backend's own heap (it
 * imports the backend's WebAssembly.Memory), so parameters, gradients and moments are read and
 * written where they live, four float32 lanes at a time, with no copy and no kernel dispatch.
 *
 * The module is assembled at first use from the instruction list below (kernels/backend/wasm-asm.ts; about
 * 200 bytes, no toolchain, nothing binary in the repository). Its arithmetic is kernels/backend/adamw-fused.ts's
 * float32 sequence: wasm's f32x4 add, sub, mul, div and sqrt are IEEE-754 single precision with
 * round-to-nearest, and no operation is fused (no FMA), so the results are bit-identical to the
 * TF.js ops and to the JavaScript loop. Spec: WebAssembly core 2.0, section 5 (binary format).
 */
import { F32, I32, V128, add, assemble, at as addr, div, get, instantiate, load, loop16, mul, set, splat, sqrt, store, sub, tee, zero4 } from './wasm-asm.ts';

/**
 * The exported function: (p, g, m, v, pOut, mOut, vOut, bytes, flag, d, clip, decay, w, b2, 1-b2,
 * bc2, eps, -step). `flag` is the byte offset of 16 bytes where the loop leaves the lane sums of
 * x * 0 over every p', m' and v' it wrote: all four are 0 (or -0) when every value is finite, NaN
 * otherwise (inf * 0 and NaN * 0 are NaN, and NaN sticks), so no second pass is needed to check.
 */
export type AdamWSimd = (
  p: number, g: number, m: number, v: number, pOut: number, mOut: number, vOut: number, bytes: number, flag: number,
  divisor: number, clip: number, decay: number, lerpWeight: number, beta2: number, oneMinusBeta2: number, bc2Sqrt: number, eps: number, negStepSize: number,
) => void;

// Parameters 0..8: the seven byte offsets, the byte count and the flag's offset; 9..17: the float32 scalars.
const [P, G, M, V, PO, MO, VO, BYTES, FLAG] = [0, 1, 2, 3, 4, 5, 6, 7, 8];
const FIRST_SCALAR = 9;
const SCALARS = 9;
// Locals: i (byte index), one splat per scalar, then temporaries.
const I = FIRST_SCALAR + SCALARS;
const S = (k: number) => I + 1 + k; // splat of scalar parameter FIRST_SCALAR + k
const [D, CLIP, DECAY, W, B2, OMB2, BC2, EPS, NEG] = [0, 1, 2, 3, 4, 5, 6, 7, 8].map(S) as number[];
const [GI, MI, DIFF, MNEXT, VNEXT, PNEXT, ZERO, ACC] = [0, 1, 2, 3, 4, 5, 6, 7].map((k) => S(SCALARS) + k) as number[];
const TEMPORARIES = 8;

const at = (base: number) => addr(base, I);

/** The function body for one of torch's two lerp formulas (weight < 0.5 or not). */
function body(lerpLow: boolean): number[] {
  const code: number[] = [];
  for (let k = 0; k < SCALARS; k++) code.push(...get(FIRST_SCALAR + k), ...splat, ...set(S(k)));
  code.push(...zero4, ...set(ZERO), ...zero4, ...set(ACC));
  const mNext = lerpLow
    ? [...get(MI), ...get(W), ...get(DIFF), ...mul, ...add] // m + w * (g - m)
    : [...get(GI), ...get(DIFF), ...get(W), ...mul, ...sub]; // g - (g - m) * (1 - w)
  code.push(...loop16(I, BYTES, [
    ...at(G), ...load, ...get(D), ...div, ...get(CLIP), ...mul, ...set(GI),
    ...at(M), ...load, ...set(MI),
    ...get(GI), ...get(MI), ...sub, ...set(DIFF),
    ...mNext, ...set(MNEXT),
    ...at(V), ...load, ...get(B2), ...mul, ...get(GI), ...get(OMB2), ...mul, ...get(GI), ...mul, ...add, ...set(VNEXT),
    ...at(MO), ...get(MNEXT), ...store,
    ...at(VO), ...get(VNEXT), ...store,
    ...at(PO),
    ...at(P), ...load, ...get(DECAY), ...mul,
    ...get(MNEXT), ...get(NEG), ...mul,
    ...get(VNEXT), ...sqrt, ...get(BC2), ...div, ...get(EPS), ...add,
    ...div, ...add, ...tee(PNEXT), ...store,
    ...get(ACC),
    ...get(PNEXT), ...get(ZERO), ...mul, ...add,
    ...get(MNEXT), ...get(ZERO), ...mul, ...add,
    ...get(VNEXT), ...get(ZERO), ...mul, ...add, ...set(ACC),
  ]));
  code.push(...get(FLAG), ...get(ACC), ...store);
  return code;
}

/** The module's bytes: imports env.memory, exports `low` and `high` (the two lerp branches). */
export function adamwSimdModule(): Uint8Array {
  const params = [...Array<number>(FIRST_SCALAR).fill(I32), ...Array<number>(SCALARS).fill(F32)];
  const locals = [{ count: 1, type: I32 }, { count: SCALARS + TEMPORARIES, type: V128 }];
  return assemble([
    { name: 'low', params, locals, code: body(true) },
    { name: 'high', params, locals, code: body(false) },
  ]);
}

const instances = new WeakMap<object, { low: AdamWSimd; high: AdamWSimd }>();

/**
 * The update functions bound to `memory`, a WebAssembly.Memory (compiled once per memory). `low`
 * is for lerp weight 1 - beta1 < 0.5, `high` otherwise. Offsets are byte addresses (alignment is
 * only a hint in WebAssembly: the wasm backend's allocations are 8-byte aligned); the flag takes
 * 16 bytes; `bytes` must be a multiple of 16. @throws WebAssembly.CompileError where SIMD is
 * missing.
 */
export function adamwSimd(memory: object): { low: AdamWSimd; high: AdamWSimd } {
  return instantiate(instances, memory, adamwSimdModule);
}
