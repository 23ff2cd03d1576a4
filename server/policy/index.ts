export { createPolicyServer, type PolicyServer, type PolicyServerOptions, type PolicyAnswer, type PolicyStats } from './service.ts';
export { mountPolicySocket, type PolicyResolver, type PolicyUpgrade } from './socket.ts';
export { startPolicyServer, checkPolicyKey, type PolicyServerHandle, type StandaloneOptions } from './standalone.ts';
export { DEFAULT_POLICY_LIMITS, type PolicyLimits } from './observation.ts';
export { PolicyConfigError, type PolicyMeta } from './meta.ts';
export { requestSeed } from './seeds.ts';
export type { BatchStats } from './batcher.ts';
