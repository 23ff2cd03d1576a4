// The real pi0 / pi0.5 family's public names (re-exports only).
export { REAL_PI0, REAL_PI05, REAL_PI_TINY_PI0, REAL_PI_TINY_PI05, makeRealPiConfig, realPiConfigFromHub, tokensPerCamera, type GemmaDims, type RealPiConfig, type RealPiConfigInput, type RealPiVariant, type VisionDims } from './config.ts';
export { NAMES, contractInitValues, createRealPiParams, disposeRealPiParams, realPiParamCount, realPiParamSpecs, type RealPiParamSource, type RealPiParamSpec, type RealPiParams } from './params.ts';
export { MASKED_LOGIT, checkBatch, computeLoss, drawRealPiNoiseTime, sample, velocity, type RealPiBatch, type RealPiModel, type RealPiWeights } from './model.ts';
export { OPENPI_LORA, realPiLinears, realPiPolicy } from './policy.ts';
export { fakeRealPiBatch } from './fake.ts';
export { toRealPiBatch } from './batch.ts';
export { estimateMemory, loraParamCount, passTokens, type MemoryEstimate, type MemoryPlan } from './memory.ts';
