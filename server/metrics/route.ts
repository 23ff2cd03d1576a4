/** `GET /metrics` (PROTOCOL.md section 12): this process's metrics in Prometheus' text format. */
import type { TemplatedApp } from 'uWebSockets.js';
import { route, sendText, type Req } from '../http.ts';
import { METRICS_CONTENT_TYPE, metricsText } from './registry.ts';

/**
 * Mounts `GET /metrics`. `authorize` checks the request's key (throwing HttpError 401); null
 * when the operator made the route public (`--metrics-public`).
 */
export function mountMetrics(app: TemplatedApp, authorize: ((r: Req) => void | Promise<void>) | null): void {
  app.get('/metrics', route(0, async (r) => {
    if (authorize) await authorize(r);
    sendText(r, 200, await metricsText(), METRICS_CONTENT_TYPE);
  }));
}
