/**
 * A small seeded generator, so noise and time are drawn in JS: identical on every backend, and
 * the state can be saved with a training state (PROTOCOL.md section 4, trainer_state.json).
 * xoshiro128** (Blackman & Vigna) seeded through splitmix32; uniforms have 24 random bits;
 * normals use Box-Muller on pairs (no cached spare, so the state is the four words alone).
 */

/** The serialisable state: four unsigned 32-bit words, not all zero. */
export type RngState = [number, number, number, number];

function splitmix32(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x9e3779b9) >>> 0;
    let z = s;
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
    return (z ^ (z >>> 16)) >>> 0;
  };
}

export class Rng {
  private s: Uint32Array;

  /** @param seed any finite number; its low 32 bits and the high bits of larger integers are mixed in. */
  constructor(seed: number) {
    if (!Number.isFinite(seed)) throw new RangeError(`Rng seed is ${seed}; it must be a finite number`);
    const hi = Math.floor(Math.abs(seed) / 2 ** 32) >>> 0;
    const sm = splitmix32((seed >>> 0) ^ Math.imul(hi, 0x27d4eb2d));
    this.s = new Uint32Array([sm(), sm(), sm(), sm()]);
    if (this.s.every((x) => x === 0)) this.s[0] = 1;
  }

  /** A generator resumed from a saved state. Throws RangeError for a malformed state. */
  static fromState(state: readonly number[]): Rng {
    if (state.length !== 4 || state.some((x) => !Number.isInteger(x) || x < 0 || x > 0xffffffff) || state.every((x) => x === 0)) {
      throw new RangeError(`Rng state is ${JSON.stringify(state)}; expected four uint32 words, not all zero`);
    }
    const r = new Rng(0);
    r.s.set(state);
    return r;
  }

  /** The current state (a copy), for trainer_state.json. */
  getState(): RngState {
    return [this.s[0]!, this.s[1]!, this.s[2]!, this.s[3]!];
  }

  /** The next uint32. */
  nextU32(): number {
    const s = this.s;
    const result = Math.imul(rotl(Math.imul(s[1]!, 5), 7), 9) >>> 0;
    const t = (s[1]! << 9) >>> 0;
    s[2]! ^= s[0]!;
    s[3]! ^= s[1]!;
    s[1]! ^= s[2]!;
    s[0]! ^= s[3]!;
    s[2]! ^= t;
    s[3] = rotl(s[3]!, 11);
    return result;
  }

  /** A uniform float in [0, 1) with 24 random bits (exact in float32). */
  uniform(): number {
    return (this.nextU32() >>> 8) / 16777216;
  }

  /** `n` uniforms in [0, 1) as float32. */
  uniforms(n: number): Float32Array {
    const out = new Float32Array(n);
    for (let i = 0; i < n; i++) out[i] = this.uniform();
    return out;
  }

  /** `n` standard normals (Box-Muller on pairs; an odd n drops the last pair's second value). */
  normals(n: number): Float32Array {
    const out = new Float32Array(n);
    for (let i = 0; i < n; i += 2) {
      const u1 = 1 - this.uniform(); // (0, 1]: log is finite
      const u2 = this.uniform();
      const r = Math.sqrt(-2 * Math.log(u1));
      out[i] = r * Math.cos(2 * Math.PI * u2);
      if (i + 1 < n) out[i + 1] = r * Math.sin(2 * Math.PI * u2);
    }
    return out;
  }
}

function rotl(x: number, k: number): number {
  return ((x << k) | (x >>> (32 - k))) >>> 0;
}
