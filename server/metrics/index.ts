export { registry, metricsText, METRICS_CONTENT_TYPE } from './registry.ts';
export { PolicyConnectionMetrics, recordPolicyBatch, recordObservationOutOfRange, holdPolicySeries, MAX_CONNECTION_SERIES, type PolicyRequestTiming } from './policy.ts';
export { recordJobStep, recordSessionOp, recordSessionRequestRefused } from './training.ts';
export { recordHttpStatus, NO_ROUTE } from './http.ts';
export { watchStore, watchEngine, unwatchEngine, type MetricsEngine, type MetricsStore } from './sources.ts';
export { mountMetrics, type MetricsViewer } from './route.ts';
export { tenantView, OBJECT_LABELS } from './owners.ts';
