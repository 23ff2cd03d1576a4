/**
 * A minimal WebAssembly assembler for the float32 SIMD loops that run on the TF.js wasm backend's
 * own heap (kernels/backend/adamw-simd.ts, kernels/gelu-simd.ts): modules import the backend's
 * WebAssembly.Memory and export functions of i32 byte offsets and f32 scalars. Only the
 * instructions those loops need; encodings from the WebAssembly core spec 2.0, section 5 (binary
 * format). Every f32x4 operation here is IEEE-754 single precision with round-to-nearest and
 * nothing is fused, so a loop gives the same bits as the same operations done one at a time.
 */

/** Value types: i32, f32, v128. */
export const I32 = 0x7f;
export const F32 = 0x7d;
export const V128 = 0x7b;

/** Unsigned LEB128 of a non-negative integer below 2^32. */
export function uleb(n: number): number[] {
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

/** local.get, local.set, local.tee of local `i`. */
export const get = (i: number) => [0x20, ...uleb(i)];
export const set = (i: number) => [0x21, ...uleb(i)];
export const tee = (i: number) => [0x22, ...uleb(i)];
const simd = (op: number) => [0xfd, ...uleb(op)];
/** v128.load / v128.store with a 16-byte alignment hint and offset 0. */
export const load = [...simd(0x00), 4, 0];
export const store = [...simd(0x0b), 4, 0];
export const splat = simd(0x13); // f32x4.splat
/** f32x4 sqrt, add, sub, mul, div. */
export const [sqrt, add, sub, mul, div] = [0xe3, 0xe4, 0xe5, 0xe6, 0xe7].map(simd) as [number[], number[], number[], number[], number[]];
export const i32add = [0x6a];
/** Scalar f32 mul, div, sqrt; f32.load / f32.store with a 4-byte alignment hint, offset 0. */
export const f32mul = [0x94];
export const f32div = [0x95];
export const f32sqrt = [0x91];
export const f32load = [0x2a, 2, 0];
export const f32store = [0x38, 2, 0];
/** f32x4.extract_lane `lane` (0..3) -> f32. */
export const extractLane = (lane: number) => [...simd(0x1f), lane];
/** Scalar f32.add. */
export const f32add = [0x92];
/** i32.const for 0 <= n < 64 (one-byte signed LEB128). */
export const i32const = (n: number) => [0x41, n];
/** f32x4 of zeros: f32.const 0, splat. */
export const zero4 = [0x43, 0, 0, 0, 0, ...simd(0x13)];

/** One exported function: its parameter types, extra locals, and the body's instructions. */
export interface AsmFunction {
  name: string;
  params: number[];
  locals: { count: number; type: number }[];
  code: number[];
}

/**
 * A loop of local `i` from its current value up to local `limit` in steps of `step` (< 64),
 * running `body` each time: block, loop, exit when i >= limit (unsigned), body, i += step, branch
 * back. `i` is not reset: set it before the loop.
 */
export function loopStep(i: number, limit: number, step: number, body: number[]): number[] {
  return [
    0x02, 0x40, 0x03, 0x40,
    ...get(i), ...get(limit), 0x4f, 0x0d, 1,
    ...body,
    ...get(i), ...i32const(step), ...i32add, ...set(i),
    0x0c, 0, 0x0b, 0x0b,
  ];
}

/** loopStep over byte index `i` from 0 to `bytes` in steps of 16 (one f32x4), `i` reset first. */
export function loop16(i: number, bytes: number, body: number[]): number[] {
  return [...i32const(0), ...set(i), ...loopStep(i, bytes, 16, body)];
}

/** `base + i` as an address: local `base` plus local `i`. */
export const at = (base: number, i: number) => [...get(base), ...get(i), ...i32add];

/** Module bytes: imports env.memory (any size, no maximum), exports `fns` (no results). */
export function assemble(fns: AsmFunction[]): Uint8Array {
  const types = fns.map((f) => [0x60, ...vec(f.params.map((t) => [t])), 0]);
  const bodies = fns.map((f) => {
    const b = [...vec(f.locals.map((l) => [...uleb(l.count), l.type])), ...f.code, 0x0b];
    return [...uleb(b.length), ...b];
  });
  return new Uint8Array([
    0x00, 0x61, 0x73, 0x6d, 1, 0, 0, 0,
    ...section(1, vec(types)),
    ...section(2, vec([[...str('env'), ...str('memory'), 0x02, 0x00, 0x00]])),
    ...section(3, vec(fns.map((_, k) => uleb(k)))),
    ...section(7, vec(fns.map((f, k) => [...str(f.name), 0x00, ...uleb(k)]))),
    ...section(10, vec(bodies)),
  ]);
}

// The project's lib setting has no WebAssembly JS API types; the three constructors used here.
interface WasmApi {
  Module: new (bytes: Uint8Array) => object;
  Instance: new (module: object, imports: object) => { exports: Record<string, unknown> };
  Memory: new (descriptor: object) => object;
}
const wasmApi = (globalThis as unknown as { WebAssembly: WasmApi }).WebAssembly;

/**
 * A WebAssembly.Memory of our own (not a backend's) that can grow to `maxPages` 64 KiB pages;
 * `buffer` and `grow` as the JS API's (grow detaches views of the old buffer).
 */
export function newWasmMemory(initialPages: number, maxPages: number): { buffer: ArrayBuffer; grow(pages: number): number } {
  return new wasmApi.Memory({ initial: initialPages, maximum: maxPages }) as { buffer: ArrayBuffer; grow(pages: number): number };
}

/** Whether `x` is a WebAssembly.Memory (what a module here can import). */
export function isWasmMemory(x: unknown): x is object {
  return x instanceof wasmApi.Memory;
}

/**
 * Instantiates `bytes` against `memory` (a WebAssembly.Memory), once per module and memory.
 * @throws WebAssembly.CompileError where SIMD is missing.
 */
export function instantiate<T>(cache: WeakMap<object, T>, memory: object, bytes: () => Uint8Array): T {
  let fns = cache.get(memory);
  if (!fns) {
    fns = new wasmApi.Instance(new wasmApi.Module(bytes()), { env: { memory } }).exports as unknown as T;
    cache.set(memory, fns);
  }
  return fns;
}
