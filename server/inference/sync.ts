/**
 * Pushing a model's weights to registered policy servers (xorl's sync_inference_weights): the
 * weights URL of an endpoint, a reachability probe, and one push with its outcome. Every
 * request goes through egress.ts, which refuses loopback, private and the server's own addresses.
 */
import type { EndpointRow } from '../store/store.ts';
import { HttpError } from '../http/http.ts';
import { egressRequest, EgressRefused, type EgressPolicy } from './egress.ts';

/** Transfer precisions of set_sync_quantization and the safetensors dtype each sends. */
export const SYNC_QUANTIZATIONS = { none: 'F32', bf16: 'BF16', fp16: 'F16' } as const;
export type SyncQuantization = keyof typeof SYNC_QUANTIZATIONS;

/**
 * An endpoint's URL checked and normalised: `ws(s)://` or `http(s)://` (stored as given, minus a
 * query or fragment), or `host` + `port` (SGLang-style registration) as `http://host:port`.
 * @throws HttpError 400 naming what is wrong.
 */
export function endpointUrl(body: Record<string, unknown>): string {
  let raw = body.url;
  if (raw === undefined && body.host !== undefined) {
    const port = body.port;
    if (typeof body.host !== 'string' || body.host === '' || typeof port !== 'number' || !Number.isInteger(port) || port < 1 || port > 65535) {
      throw new HttpError(400, `host must be a host name and port an integer in 1..65535, got ${JSON.stringify(body.host)} and ${JSON.stringify(port)}`);
    }
    raw = `http://${body.host.includes(':') ? `[${body.host}]` : body.host}:${port}/`;
  }
  if (typeof raw !== 'string') throw new HttpError(400, 'url is required: the policy server\'s URL (ws://host:port/ for vela policy, or a /v1/.../policy URL of a Vela server)');
  let u: URL;
  try {
    u = new URL(raw);
  } catch {
    throw new HttpError(400, `url ${JSON.stringify(raw)} is not a URL`);
  }
  if (!['ws:', 'wss:', 'http:', 'https:'].includes(u.protocol)) throw new HttpError(400, `url must be ws://, wss://, http:// or https://, got ${u.protocol}`);
  if (u.username || u.password) throw new HttpError(400, 'url must not carry credentials: give api_key instead');
  u.search = '';
  u.hash = '';
  return u.toString();
}

/** `PUT <policy URL>/weights` over http(s): ws -> http, wss -> https. */
export function weightsUrl(policyUrl: string): string {
  const u = new URL(policyUrl);
  u.protocol = u.protocol === 'wss:' || u.protocol === 'https:' ? 'https:' : 'http:';
  u.pathname = u.pathname.endsWith('/') ? `${u.pathname}weights` : `${u.pathname}/weights`;
  return u.toString();
}

/**
 * Whether `GET <origin>/healthz` answers 2xx, or 503 `WARMING: ...` (a `vela policy` still
 * tracing a graph: up, and it takes weights), within `timeoutMs`; false also when `egress`
 * refuses the address.
 */
export async function probe(egress: EgressPolicy, policyUrl: string, timeoutMs = 3000): Promise<boolean> {
  const u = new URL(weightsUrl(policyUrl));
  try {
    const res = await egressRequest(egress, `${u.origin}/healthz`, { method: 'GET', timeoutMs, maxAnswerBytes: 1024 });
    return (res.status >= 200 && res.status < 300) || (res.status === 503 && res.body.subarray(0, 8).toString() === 'WARMING:');
  } catch {
    return false;
  }
}

/** One endpoint's outcome of a sync. */
export interface PushOutcome {
  endpoint_id: string;
  url: string;
  name: string | null;
  status: 'ok' | 'error';
  weights_version?: unknown;
  previous_version?: unknown;
  load_seconds?: number;
  seconds: number;
  http_status?: number;
  error?: string;
}

/** A version as a policy server reports it: a number or a short string; anything else is dropped. */
function versionOf(v: unknown): number | string | null | undefined {
  if (v === null || typeof v === 'number') return v;
  if (typeof v === 'string' && v.length <= 128) return v;
  return undefined;
}

/**
 * Push `body` (an encoded weights push) to one endpoint; never throws: failures are outcomes.
 * Only the answer's status and its typed version fields are kept: the endpoint's own text is
 * never passed on to the client (it could be anything the URL points at).
 */
export async function pushTo(egress: EgressPolicy, ep: EndpointRow, body: Buffer, timeoutMs = 300_000): Promise<PushOutcome> {
  const t0 = Date.now();
  const base = { endpoint_id: ep.id, url: ep.url, name: ep.name };
  try {
    const res = await egressRequest(egress, weightsUrl(ep.url), {
      method: 'PUT',
      headers: { 'content-type': 'application/msgpack', ...(ep.api_key ? { authorization: `Bearer ${ep.api_key}` } : {}) },
      body,
      timeoutMs,
    });
    const seconds = (Date.now() - t0) / 1000;
    if (res.status < 200 || res.status >= 300) return { ...base, status: 'error', http_status: res.status, error: `the endpoint answered HTTP ${res.status}`, seconds };
    let answer: Record<string, unknown> = {};
    try {
      answer = JSON.parse(res.body.toString('utf8'));
    } catch {
      // not a Vela policy server's answer: the versions stay unknown
    }
    const loadSeconds = typeof answer?.load_seconds === 'number' ? answer.load_seconds : undefined;
    return { ...base, status: 'ok', weights_version: versionOf(answer?.weights_version), previous_version: versionOf(answer?.previous_version), load_seconds: loadSeconds, seconds };
  } catch (e) {
    return { ...base, status: 'error', error: e instanceof EgressRefused ? e.message : `could not reach the endpoint: ${(e as Error).message}`, seconds: (Date.now() - t0) / 1000 };
  }
}
