/** `GET /metrics` (PROTOCOL.md section 12): this process's metrics in Prometheus' text format. */
import type { TemplatedApp } from 'uWebSockets.js';
import { route, sendText, type Req } from '../http/http.ts';
import { tenantView } from './owners.ts';
import { METRICS_CONTENT_TYPE, metricsText } from './registry.ts';

/**
 * Whose scrape a request is: null for the operator's (every series), else the owner id of a
 * tenant's API key, whose scrape leaves out the series naming other keys' objects (owners.ts).
 */
export type MetricsViewer = string | null;

/**
 * Mounts `GET /metrics`. `viewer` checks the request's credentials (throwing HttpError 401) and
 * says whose scrape it is.
 */
export function mountMetrics(app: TemplatedApp, viewer: (r: Req) => MetricsViewer | Promise<MetricsViewer>): void {
  app.get('/metrics', route(0, async (r) => {
    const owner = await viewer(r);
    const text = await metricsText();
    sendText(r, 200, owner === null ? text : tenantView(text, owner), METRICS_CONTENT_TYPE);
  }));
}
