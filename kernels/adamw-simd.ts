/**
 * The AdamW update as a WebAssembly SIMD loop that runs on the TF.js wasm backend's own heap (it
 * imports the backend's WebAssembly.Memory), so parameters, gradients and moments are read and
 * written where they live, four float32 lanes at a time, with no copy and no kernel dispatch.
 *
 * The module is assembled at first use from the instruction list below (kernels/wasm-asm.ts; about
 * 200 bytes, no toolchain, nothing binary in the repository). Its arithmetic is kernels/adamw-fused.ts's
 * float32 sequence: wasm's f32x4 add, sub, mul, div and sqrt are IEEE-754 single precision with
 * round-to-nearest, and no operation is fused (no FMA), so the results are bit-identical to the
 * TF.js ops and to the JavaScript loop. Spec: WebAssembly core 2.0, section 5 (binary format).
 */
import { F32, I32, V128, add, assemble, at as addr, div, get, instantiate, load, loop16, mul, set, splat, sqrt, store, sub } from './wasm-asm.ts';

/** The exported function: (p, g, m, v, pOut, mOut, vOut, bytes, d, clip, decay, w, b2, 1-b2, bc2, eps, -step). */
export type AdamWSimd = (
  p: number, g: number, m: number, v: number, pOut: number, mOut: number, vOut: number, bytes: number,
  divisor: number, clip: number, decay: number, lerpWeight: number, beta2: number, oneMinusBeta2: number, bc2Sqrt: number, eps: number, negStepSize: number,
) => void;

// Parameters 0..7: the seven byte offsets and the byte count; 8..16: the float32 scalars.
const [P, G, M, V, PO, MO, VO, BYTES] = [0, 1, 2, 3, 4, 5, 6, 7];
const SCALARS = 9;
// Locals: i (byte index), one splat per scalar, then temporaries.
const I = 8 + SCALARS;
const S = (k: number) => I + 1 + k; // splat of scalar parameter 8 + k
const [D, CLIP, DECAY, W, B2, OMB2, BC2, EPS, NEG] = [0, 1, 2, 3, 4, 5, 6, 7, 8].map(S) as number[];
const [GI, MI, DIFF, MNEXT, VNEXT] = [0, 1, 2, 3, 4].map((k) => S(SCALARS) + k) as number[];

const at = (base: number) => addr(base, I);

/** The function body for one of torch's two lerp formulas (weight < 0.5 or not). */
function body(lerpLow: boolean): number[] {
  const code: number[] = [];
  for (let k = 0; k < SCALARS; k++) code.push(...get(8 + k), ...splat, ...set(S(k)));
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
    ...div, ...add, ...store,
  ]));
  return code;
}

/** The module's bytes: imports env.memory, exports `low` and `high` (the two lerp branches). */
export function adamwSimdModule(): Uint8Array {
  const params = [...Array<number>(8).fill(I32), ...Array<number>(SCALARS).fill(F32)];
  const locals = [{ count: 1, type: I32 }, { count: SCALARS + 5, type: V128 }];
  return assemble([
    { name: 'low', params, locals, code: body(true) },
    { name: 'high', params, locals, code: body(false) },
  ]);
}

const instances = new WeakMap<object, { low: AdamWSimd; high: AdamWSimd }>();

/**
 * The update functions bound to `memory`, a WebAssembly.Memory (compiled once per memory). `low`
 * is for lerp weight 1 - beta1 < 0.5, `high` otherwise. Offsets are byte addresses of
 * 16-byte-multiple runs; `bytes` must be a multiple of 16. @throws WebAssembly.CompileError
 * where SIMD is missing.
 */
export function adamwSimd(memory: object): { low: AdamWSimd; high: AdamWSimd } {
  return instantiate(instances, memory, adamwSimdModule);
}
