/**
 * The dashboard's only way to the server: `fetch` with `Authorization: Bearer <key>`. The key
 * lives in this module (and, when the user asks, in sessionStorage, which dies with the tab); it
 * is never put in a URL, so it does not land in server logs, history or Referer headers.
 */
import type { FineTuneJob } from '../../protocol/jobs.ts';

const STORAGE_KEY = 'vela.apiKey';

/** A failed call: `status` is the HTTP status (0 when the server could not be reached). */
export class ApiError extends Error {
  constructor(readonly status: number, message: string) {
    super(message);
    this.name = 'ApiError';
  }
}

let key: string | null = null;
let onUnauthorized: (message: string) => void = () => {};

/** The key in use: memory first, then this tab's sessionStorage. */
export function currentKey(): string | null {
  if (key) return key;
  try {
    key = sessionStorage.getItem(STORAGE_KEY);
  } catch {
    // storage can be disabled (privacy settings); memory alone still works
  }
  return key;
}

export function setKey(k: string, remember: boolean): void {
  key = k;
  try {
    if (remember) sessionStorage.setItem(STORAGE_KEY, k);
    else sessionStorage.removeItem(STORAGE_KEY);
  } catch {
    // see currentKey
  }
}

export function clearKey(): void {
  key = null;
  try {
    sessionStorage.removeItem(STORAGE_KEY);
  } catch {
    // see currentKey
  }
}

/** Called with the server's message whenever an answer is 401 (the key was revoked or is wrong). */
export function setUnauthorizedHandler(fn: (message: string) => void): void {
  onUnauthorized = fn;
}

/**
 * fetch `path` (same origin) with the key. Resolves with the Response when it is 2xx.
 * @throws ApiError with the server's `{"error"}` message and status; 0 when unreachable.
 */
export async function send(path: string, init: RequestInit = {}, k: string | null = currentKey()): Promise<Response> {
  const headers = new Headers(init.headers);
  if (k) headers.set('authorization', `Bearer ${k}`);
  let res: Response;
  try {
    res = await fetch(path, { ...init, headers, cache: 'no-store' });
  } catch (e) {
    if ((e as Error).name === 'AbortError') throw e;
    throw new ApiError(0, `cannot reach the server (${(e as Error).message})`);
  }
  if (res.ok) return res;
  const text = await res.text().catch(() => '');
  let message = `${res.status} ${res.statusText}`.trim();
  try {
    const body = JSON.parse(text) as { error?: unknown; request_id?: unknown };
    if (typeof body.error === 'string') message = body.error;
    // A 500 names the request in the server log: worth quoting to whoever runs the server.
    if (typeof body.request_id === 'string') message += ` (request ${body.request_id})`;
  } catch {
    if (text) message += `: ${text.slice(0, 200)}`;
  }
  if (res.status === 401 && k === currentKey()) onUnauthorized(message);
  throw new ApiError(res.status, message);
}

/** GET or POST a JSON route; the answer parsed. */
export async function json<T>(method: 'GET' | 'POST', path: string, body?: unknown, k?: string | null): Promise<T> {
  const init: RequestInit = { method };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers = { 'content-type': 'application/json' };
  }
  const res = await send(path, init, k === undefined ? currentKey() : k);
  return (await res.json()) as T;
}

/** A fine-tune job as PROTOCOL.md section 1 returns it (config fields included). */
export type Job = FineTuneJob;

/** A training session as PROTOCOL.md section 2 returns it. */
export interface Session {
  id: string;
  status: 'starting' | 'ready' | 'closed' | 'error';
  created_at: number;
  base_model: string;
  finetune?: string;
  rank?: number;
  error: string | null;
  closed_at?: number | null;
  [field: string]: unknown;
}

export interface JobFile {
  path: string;
  bytes: number;
  sha256: string;
}

export const TERMINAL = new Set(['succeeded', 'failed', 'cancelled']);
