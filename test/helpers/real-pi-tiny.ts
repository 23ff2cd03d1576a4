/**
 * Test helper: small real-pi shape configurations for checkpoint tests, and deterministic
 * parameter values (a cheap integer hash, not the parity-vector init rule).
 */
import type { PiShapeConfig } from '../../kernels/pi/keys.ts';

/** Full-size pi0 / pi0.5 shapes (FACTS.md section 0). */
export function realShapes(variant: 'pi0' | 'pi05'): PiShapeConfig {
  return {
    variant,
    vlm: { width: 2048, depth: 18, mlpDim: 16384, numHeads: 8, numKvHeads: 1, headDim: 256, vocabSize: 257152 },
    expert: { width: 1024, depth: 18, mlpDim: 4096, numHeads: 8, numKvHeads: 1, headDim: 256 },
    vision: { width: 1152, depth: 27, mlpDim: 4304, patchSize: 14, imageSize: 224 },
    actionDim: 32,
  };
}

/** FACTS.md 5.2's tiny configuration, with a smaller vocabulary unless one is given. */
export function tinyShapes(variant: 'pi0' | 'pi05', vocabSize = 1000): PiShapeConfig {
  return {
    variant,
    vlm: { width: 64, depth: 4, mlpDim: 128, numHeads: 8, numKvHeads: 1, headDim: 16, vocabSize },
    expert: { width: 32, depth: 4, mlpDim: 64, numHeads: 8, numKvHeads: 1, headDim: 16 },
    vision: { width: 32, depth: 2, mlpDim: 64, patchSize: 14, imageSize: 56 },
    actionDim: 32,
  };
}

/** Deterministic values in (-1, 1) for a parameter, from its name and index (fast, no RNG state). */
export function fakeParam(name: string, n: number): Float32Array {
  let h = 2166136261;
  for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 16777619);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    let x = Math.imul(h ^ i, 0x9e3779b1);
    x ^= x >>> 15;
    x = Math.imul(x, 0x85ebca6b);
    x ^= x >>> 13;
    out[i] = ((x >>> 8) / 8388608 - 1) * 0.999;
  }
  return out;
}
