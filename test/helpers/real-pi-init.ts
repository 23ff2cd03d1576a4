/**
 * Test helper: the parity vectors' parameter init rule (pi-common.md contract item 3), written
 * from the contract's text so tests can build the same weights as scripts/real_pi/make_vectors.py:
 *
 *   seed  = FNV-1a 32-bit of the UTF-8 bytes of the parameter name (offset 2166136261, prime 16777619)
 *   u_i   = mulberry32 stream from seed: state += 0x6D2B79F5; t = state; t = imul(t ^ t>>>15, t|1);
 *           t ^= t + imul(t ^ t>>>7, t|61); u = ((t ^ t>>>14) >>> 0) / 2^32
 *   value = float32((2 u_i - 1) * 0.05), row-major over the parameter's shape
 */

/** FNV-1a 32-bit hash of a string's UTF-8 bytes, as an unsigned integer. */
export function fnv1a32(text: string): number {
  let hash = 2166136261;
  for (const byte of Buffer.from(text, 'utf8')) {
    hash ^= byte;
    hash = Math.imul(hash, 16777619) >>> 0;
  }
  return hash >>> 0;
}

/** `n` uniforms in [0, 1) from mulberry32 seeded with `seed`. */
export function mulberry32(seed: number, n: number): Float64Array {
  let state = seed >>> 0;
  const out = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    out[i] = ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }
  return out;
}

/** The `size` values of parameter `name` by the rule, float32. */
export function realPiInitValues(name: string, size: number): Float32Array {
  const u = mulberry32(fnv1a32(name), size);
  const out = new Float32Array(size);
  for (let i = 0; i < size; i++) out[i] = (2 * u[i]! - 1) * 0.05;
  return out;
}

/** Every parameter of a table by the rule: name -> values. */
export function realPiInitParams(specs: readonly { name: string; shape: readonly number[] }[]): Map<string, Float32Array> {
  return new Map(specs.map((s) => [s.name, realPiInitValues(s.name, s.shape.reduce((a, b) => a * b, 1))]));
}
