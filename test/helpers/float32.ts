/**
 * Test helper: float32 error bounds derived from the arithmetic, for tests that compare one
 * computation done two ways (a TensorFlow graph and eager ops, two backends, two CPUs). Such paths
 * may sum the same products in another order (fused kernels, another SIMD width, another
 * blocking): by Higham's bound (Accuracy and Stability of Numerical Algorithms, 2nd ed., eq. 3.4,
 * gamma_{K-1}), reordering a float32 sum of K terms moves it by at most (K - 1) u sum |terms|,
 * u = 2^-24. A bound fitted to what one machine printed is not one of these (issue 32 item 14: an
 * AMD EPYC with AVX-512 rounded past such a bound every time).
 */

import type { RealPiConfig } from '../../kernels/pi/config.ts';

/** float32's unit roundoff, 2^-24. */
export const U32 = 2 ** -24;

/**
 * Relative bound for one pass whose longest reduction has `k` terms (an MLP's hidden width, an
 * attention's sequence length, a weight gradient's batch x tokens): k u of the output's scale.
 */
export function passBound(k: number): number {
  return k * U32;
}

/**
 * Relative bound for an Euler sample of flow matching (x_{n+1} = x_n + dt v(x_n), sum |dt| = 1)
 * whose velocity pass has reductions of at most `k` terms. Each step adds |dt| k u max|v|; an error
 * carried into later steps grows by at most (1 + |dt| L) a step, so the total is at most
 * e^L k u max|v|. For these models L <= 1 (their velocity is close to noise - x, Lipschitz 1 in x)
 * and max|v| <= 2 max|x_0| (v ~ noise - x_0, noise and x_0 of one scale), so 2e k u of the
 * sample's scale, rounded up to 6 k u.
 */
export function sampleBound(k: number): number {
  return 6 * k * U32;
}

/** max |a - b| / max |b| (the absolute difference when b is all zeros): a difference relative to the scale. */
export function relDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  if (a.length !== b.length) throw new Error(`relDiff of ${a.length} and ${b.length} values`);
  let d = 0;
  let s = 0;
  for (let i = 0; i < a.length; i++) {
    d = Math.max(d, Math.abs(a[i]! - b[i]!));
    s = Math.max(s, Math.abs(b[i]!));
  }
  return s === 0 ? d : d / s;
}

/**
 * The longest reduction of one pass of a real pi config: attention over the whole sequence (3
 * cameras' patches, the prompt, the chunk and pi0's state token) or an MLP, whichever is longer.
 */
export function longestRealPiReduction(c: RealPiConfig): number {
  const seq = 3 * (c.vision.imageSize / c.vision.patchSize) ** 2 + c.maxTokenLen + c.actionHorizon + 1;
  return Math.max(seq, c.vlm.mlpDim, c.expert.mlpDim, c.vision.mlpDim);
}
