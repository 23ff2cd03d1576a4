/**
 * Requests that belong to another node (a session's futures ops, a placement on another node)
 * are forwarded to it over HTTP and its answer passed back unchanged, so a client may send any
 * request to any node (through a load balancer). A forwarded request carries
 * `x-vela-forwarded-by: <node>` and is never forwarded again, so two nodes that disagree about
 * where a session is cannot bounce a request between them.
 */
import { statusLine, type Req } from '../http/http.ts';
import { HttpError } from '../http/http.ts';

export const FORWARDED_HEADER = 'x-vela-forwarded-by';

/** Request headers that travel with a forwarded request. */
const PASS = ['authorization', 'content-type', 'accept', 'last-event-id'];

/** True when the request was forwarded here by another node. */
export function wasForwarded(r: Req): boolean {
  return r.headers[FORWARDED_HEADER] !== undefined;
}

/**
 * Send `r` (its method, path, query, the listed headers and `body`) to the node at `baseUrl`
 * and answer with what it answered (status, content type, bytes).
 * @throws HttpError 502 when that node cannot be reached.
 */
export async function forward(r: Req, baseUrl: string, fromNode: string, body: Buffer | null, timeoutMs = 120_000): Promise<void> {
  const headers: Record<string, string> = { [FORWARDED_HEADER]: fromNode };
  for (const h of PASS) if (r.headers[h] !== undefined) headers[h] = r.headers[h]!;
  const query = r.query.toString();
  let res: Response;
  let bytes: Buffer;
  try {
    res = await fetch(`${baseUrl.replace(/\/$/, '')}${r.url}${query ? `?${query}` : ''}`, {
      method: r.method,
      headers,
      body: body && r.method !== 'GET' && r.method !== 'HEAD' ? body : undefined,
      signal: AbortSignal.timeout(timeoutMs),
    });
    bytes = Buffer.from(await res.arrayBuffer());
  } catch (e) {
    throw new HttpError(502, `the node at ${baseUrl} that holds this did not answer: ${(e as Error).message}`);
  }
  if (r.aborted) return;
  r.aborted = true;
  r.res.cork(() => {
    r.res.writeStatus(statusLine(res.status)).writeHeader('content-type', res.headers.get('content-type') ?? 'application/octet-stream');
    r.res.end(bytes);
  });
}
