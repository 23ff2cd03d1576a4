/** API-key and session-token checks. Keys are looked up by hash; tokens compared in constant time. */
import crypto from 'node:crypto';
import { HttpError, type Req } from './http.ts';
import type { Store } from '../store/store.ts';

/** The bearer credential of a request: `Authorization: Bearer <k>` or OpenPI's `Api-Key <k>`. */
export function credentialOf(headers: Record<string, string>): string | null {
  const h = headers['authorization'];
  if (!h) return null;
  const m = /^(?:Bearer|Api-Key)\s+(\S+)\s*$/i.exec(h);
  return m ? m[1]! : null;
}

/**
 * The owner id of the request's API key.
 * @throws HttpError 401 when there is no key or it is unknown.
 */
export async function requireOwner(store: Store, r: Req): Promise<string> {
  const key = credentialOf(r.headers);
  if (!key) throw new HttpError(401, 'missing API key: send "Authorization: Bearer <key>"');
  const owner = await store.findApiKey(key);
  if (!owner) throw new HttpError(401, 'invalid API key');
  return owner;
}

/** Constant-time string equality (for session tokens). */
export function safeEqual(a: string, b: string): boolean {
  const ha = crypto.createHash('sha256').update(a).digest();
  const hb = crypto.createHash('sha256').update(b).digest();
  return crypto.timingSafeEqual(ha, hb) && a.length === b.length;
}

/** A new session token: `tok-` + 24 random bytes, base64url. */
export function newToken(): string {
  return 'tok-' + crypto.randomBytes(24).toString('base64url');
}
