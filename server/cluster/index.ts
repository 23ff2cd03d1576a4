export { ClusterNode, type NodeOptions } from './node.ts';
export { forward, wasForwarded, FORWARDED_HEADER } from './forward.ts';
export { mountNodeRoutes } from './routes.ts';
