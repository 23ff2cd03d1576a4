/**
 * The AdamW update as a WebAssembly SIMD loop that runs on the TF.js wasm backend's own heap (it
 * imports the backend's WebAssembly.Memory), so parameters, gradients and moments are read and
 * written where they live, four float32 lanes at a time, with no copy and no kernel dispatch.
 *
 * The module is assembled here, at first use, from the instruction list below (about 200 bytes;
 * no toolchain, nothing binary in the repository). Its arithmetic is kernels/adamw-fused.ts's
 * float32 sequence: wasm's f32x4 add, sub, mul, div and sqrt are IEEE-754 single precision with
 * round-to-nearest, and no operation is fused (no FMA), so the results are bit-identical to the
 * TF.js ops and to the JavaScript loop. Spec: WebAssembly core 2.0, section 5 (binary format).
 */

/** The exported function: (p, g, m, v, pOut, mOut, vOut, bytes, d, clip, decay, w, b2, 1-b2, bc2, eps, -step). */
export type AdamWSimd = (
  p: number, g: number, m: number, v: number, pOut: number, mOut: number, vOut: number, bytes: number,
  divisor: number, clip: number, decay: number, lerpWeight: number, beta2: number, oneMinusBeta2: number, bc2Sqrt: number, eps: number, negStepSize: number,
) => void;

const I32 = 0x7f;
const F32 = 0x7d;
const V128 = 0x7b;

function uleb(n: number): number[] {
  const out: number[] = [];
  do {
    let byte = n & 0x7f;
    n >>>= 7;
    if (n !== 0) byte |= 0x80;
    out.push(byte);
  } while (n !== 0);
  return out;
}
const str = (s: string) => [...uleb(s.length), ...Buffer.from(s, 'utf8')];
const vec = (items: number[][]) => [...uleb(items.length), ...items.flat()];
const section = (id: number, body: number[]) => [id, ...uleb(body.length), ...body];

// Instructions (opcodes from the spec's binary format; SIMD ones after the 0xfd prefix).
const get = (i: number) => [0x20, ...uleb(i)];
const set = (i: number) => [0x21, ...uleb(i)];
const simd = (op: number) => [0xfd, ...uleb(op)];
const load = [...simd(0x00), 4, 0]; // v128.load align=16 (hint), offset 0
const store = [...simd(0x0b), 4, 0];
const splat = simd(0x13);
const [sqrt, add, sub, mul, div] = [0xe3, 0xe4, 0xe5, 0xe6, 0xe7].map(simd) as [number[], number[], number[], number[], number[]];
const i32add = [0x6a];

// Parameters 0..7: the seven byte offsets and the byte count; 8..16: the float32 scalars.
const [P, G, M, V, PO, MO, VO, BYTES] = [0, 1, 2, 3, 4, 5, 6, 7];
const SCALARS = 9;
// Locals: i (byte index), one splat per scalar, then temporaries.
const I = 8 + SCALARS;
const S = (k: number) => I + 1 + k; // splat of scalar parameter 8 + k
const [D, CLIP, DECAY, W, B2, OMB2, BC2, EPS, NEG] = [0, 1, 2, 3, 4, 5, 6, 7, 8].map(S) as number[];
const [GI, MI, DIFF, MNEXT, VNEXT] = [0, 1, 2, 3, 4].map((k) => S(SCALARS) + k) as number[];

const at = (base: number) => [...get(base), ...get(I), ...i32add];

/** The function body for one of torch's two lerp formulas (weight < 0.5 or not). */
function body(lerpLow: boolean): number[] {
  const code: number[] = [];
  for (let k = 0; k < SCALARS; k++) code.push(...get(8 + k), ...splat, ...set(S(k)));
  const mNext = lerpLow
    ? [...get(MI), ...get(W), ...get(DIFF), ...mul, ...add] // m + w * (g - m)
    : [...get(GI), ...get(DIFF), ...get(W), ...mul, ...sub]; // g - (g - m) * (1 - w)
  code.push(
    0x02, 0x40, 0x03, 0x40, // block, loop
    ...get(I), ...get(BYTES), 0x4f, 0x0d, 1, // i >= bytes: break
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
    ...get(I), 0x41, 16, ...i32add, ...set(I), // i += 16
    0x0c, 0, 0x0b, 0x0b, // br loop; end loop; end block
  );
  const locals = vec([[...uleb(1), I32], [...uleb(SCALARS + 5), V128]]);
  const fn = [...locals, ...code, 0x0b];
  return [...uleb(fn.length), ...fn];
}

/** The module's bytes: imports env.memory, exports `low` and `high` (the two lerp branches). */
export function adamwSimdModule(): Uint8Array {
  const type = [0x60, ...vec([...Array(8).fill([I32]), ...Array(SCALARS).fill([F32])]), 0];
  return new Uint8Array([
    0x00, 0x61, 0x73, 0x6d, 1, 0, 0, 0,
    ...section(1, vec([type])),
    ...section(2, vec([[...str('env'), ...str('memory'), 0x02, 0x00, 0x00]])), // memory, min 0 pages, no max
    ...section(3, vec([[0], [0]])),
    ...section(7, vec([[...str('low'), 0x00, 0], [...str('high'), 0x00, 1]])),
    ...section(10, vec([body(true), body(false)])),
  ]);
}

// The project's lib setting has no WebAssembly JS API types; the three calls used here.
interface WasmApi {
  Module: new (bytes: Uint8Array) => object;
  Instance: new (module: object, imports: object) => { exports: Record<string, unknown> };
}
const wasmApi = (globalThis as unknown as { WebAssembly: WasmApi }).WebAssembly;

const instances = new WeakMap<object, { low: AdamWSimd; high: AdamWSimd }>();

/**
 * The update functions bound to `memory`, a WebAssembly.Memory (compiled once per memory). `low` is for lerp weight
 * 1 - beta1 < 0.5, `high` otherwise. Offsets are byte addresses of 16-byte-multiple runs;
 * `bytes` must be a multiple of 16. @throws WebAssembly.CompileError where SIMD is missing.
 */
export function adamwSimd(memory: object): { low: AdamWSimd; high: AdamWSimd } {
  let fns = instances.get(memory);
  if (!fns) {
    const instance = new wasmApi.Instance(new wasmApi.Module(adamwSimdModule()), { env: { memory } });
    fns = instance.exports as unknown as { low: AdamWSimd; high: AdamWSimd };
    instances.set(memory, fns);
  }
  return fns;
}
