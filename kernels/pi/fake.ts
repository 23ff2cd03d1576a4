/**
 * A fake batch for tests and benches, as openpi's configs offer fake inputs: deterministic real
 * values (no RNG), batch 2, 3 cameras with datum 0's second camera masked, a prompt of `L` tokens
 * whose datum 1 is padded after 7, and actions `actionScale * sin(0.1 i)`.
 */
import type { RealPiConfig } from './config.ts';
import type { RealPiBatch } from './model.ts';

/**
 * @param c the configuration (image size, vocabulary, state dim, action horizon and dim).
 * @param L prompt tokens per datum (12 by default).
 * @param actionScale amplitude of the actions (1 by default).
 * @returns a RealPiBatch of 2 datums: images float32 [2, 3, 3, S, S] in [-1, 1], tokens int32 [2, L].
 */
export function fakeRealPiBatch(c: RealPiConfig, L = 12, actionScale = 1): RealPiBatch {
  const b = 2;
  const nc = 3;
  const S = c.vision.imageSize;
  return {
    size: b,
    numCameras: nc,
    images: new Float32Array(b * nc * 3 * S * S).map((_, i) => Math.sin(i * 0.37)),
    imageMasks: [1, 0, 1, 1, 1, 1],
    tokens: Int32Array.from({ length: b * L }, (_, i) => (i * 7919 + 2) % c.vlm.vocabSize),
    tokenMasks: Array.from({ length: b * L }, (_, i) => (i < L || i % L < 7 ? 1 : 0)),
    state: new Float32Array(b * c.stateDim).map((_, i) => Math.cos(i)),
    actions: new Float32Array(b * c.actionHorizon * c.actionDim).map((_, i) => actionScale * Math.sin(i * 0.1)),
  };
}
