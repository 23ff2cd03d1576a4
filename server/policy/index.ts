export { createPolicyServer, createFolderPolicy, type PolicyServer, type PolicyServerOptions, type PolicyAnswer, type PolicyStats, type SwapResult } from './service.ts';
export { applyWeightsPush, decodeWeightsPush, encodeWeightsPush, MAX_PUSH_BYTES, type WeightsPush } from './push.ts';
export { mountPolicySocket, type PolicyResolver, type PolicyUpgrade } from './socket.ts';
export { startPolicyServer, checkPolicyKey, type PolicyServerHandle, type StandaloneOptions } from './standalone.ts';
export { DEFAULT_POLICY_LIMITS, type PolicyLimits } from './observation.ts';
export { PolicyConfigError, type PolicyMeta } from './meta.ts';
export { requestSeed, randomSeed } from './seeds.ts';
export type { BatchStats } from './batcher.ts';
