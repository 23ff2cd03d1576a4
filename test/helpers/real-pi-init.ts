/**
 * The deterministic parameter init of the real pi0 / pi0.5 parity vectors (issue 23, contract 3),
 * the TS twin of `init_values` in scripts/real_pi/reference.py. The vectors store no parameters:
 * both sides generate every parameter from its name.
 *
 * For parameter `name` with n elements (row-major over its PyTorch shape): seed = FNV-1a 32-bit of
 * the UTF-8 bytes of `name`; u_i = the i-th draw of mulberry32(seed); value_i =
 * fround((2 u_i - 1) * 0.05), so every value lies in [-0.05, 0.05).
 *
 *   const w = realPiInitValues('model.action_out_proj.weight', 32 * 32); // Float32Array(1024)
 */

/** FNV-1a 32-bit hash (offset 2166136261, prime 16777619) of the UTF-8 bytes of `text`, as uint32. */
export function fnv1a32(text: string): number {
  let h = 2166136261;
  for (const byte of new TextEncoder().encode(text)) {
    h ^= byte;
    h = Math.imul(h, 16777619) >>> 0;
  }
  return h >>> 0;
}

/** A mulberry32 stream: each call returns the next uniform draw in [0, 1) (multiples of 2^-32). */
export function mulberry32(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * The n initial values of parameter `name`, row-major. n is the element count (the product of the
 * parameter's shape); throws RangeError when n is not a non-negative integer. The 16.5 M-element
 * token embedding of the tiny config takes about a second.
 */
export function realPiInitValues(name: string, n: number): Float32Array {
  if (!Number.isInteger(n) || n < 0) throw new RangeError(`realPiInitValues: n is ${n}; expected a non-negative integer element count`);
  const next = mulberry32(fnv1a32(name));
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = (2 * next() - 1) * 0.05;
  return out;
}
