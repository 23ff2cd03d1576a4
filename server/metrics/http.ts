/**
 * HTTP answers with a status >= 400 by method, route pattern (`/v1/fine-tunes/:id`, never the raw
 * URL: the label stays bounded; `(none)` for a path no route has) and status. Recorded by the
 * guard (guard.ts), which sees every HTTP answer and websocket upgrade refusal of the apps.
 */
import client from 'prom-client';
import { registry } from './registry.ts';

const httpErrors = new client.Counter({
  name: 'vela_http_errors_total', help: 'HTTP answers with status >= 400, by method, route pattern and status',
  labelNames: ['method', 'route', 'status'], registers: [registry],
});

/** Pattern of answers to paths that no route has. */
export const NO_ROUTE = '(none)';

/** Count an answer with `status` (>= 400; smaller ones are ignored) for a route `pattern`. */
export function recordHttpStatus(method: string, pattern: string, status: number): void {
  if (status >= 400) httpErrors.inc({ method, route: pattern, status: String(status) });
}
