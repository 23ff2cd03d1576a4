/**
 * Admission for websocket connections (issue 32, item 8): caps on open connections and on the
 * bytes they may make the server hold, per key and in total, shared by every websocket route of
 * one server (the policy websocket, `vela policy`'s, the session websocket).
 *
 * A connection reserves, at its upgrade, the most it can make us buffer: one incoming message
 * (uWS's maxPayloadLength, which is the route's message limit: uWS closes a connection whose
 * frame header declares more, before reading it) plus its outgoing backpressure limit. A request
 * past a cap is answered 429 with the reason before the upgrade; the reservation is released when
 * the connection closes. The key is the credential presented (hashed; never kept in clear), or
 * the remote address where the route takes none (`vela policy` without --api-key).
 */
import { createHash } from 'node:crypto';
import { bytesText } from './http.ts';

/** The caps; all counts are connections, all sizes bytes. */
export interface WsCaps {
  connectionsPerKey: number;
  connections: number;
  bufferedBytesPerKey: number;
  bufferedBytes: number;
}

/** Defaults: 16 connections and 4 GiB per key, 256 connections and 16 GiB in all. */
export const DEFAULT_WS_CAPS: WsCaps = { connectionsPerKey: 16, connections: 256, bufferedBytesPerKey: 4 * 2 ** 30, bufferedBytes: 16 * 2 ** 30 };

/** A granted reservation; `release` it once (further calls do nothing). */
export interface WsTicket {
  release(): void;
}

/** The flags that set each cap, for refusal texts (the main server's and `vela policy`'s are the same). */
const FLAG: Record<keyof WsCaps, string> = {
  connectionsPerKey: '--max-ws-connections-per-key', connections: '--max-ws-connections',
  bufferedBytesPerKey: '--max-ws-buffered-bytes-per-key', bufferedBytes: '--max-ws-buffered-bytes',
};

/** The admission key of an upgrade: the credential (sha256, so no key sits in memory in clear) or the remote address. */
export function wsKeyOf(credential: string | null | undefined, remoteAddress: string): string {
  return credential ? 'key:' + createHash('sha256').update(credential).digest('hex') : 'addr:' + remoteAddress;
}

/** Counts connections and reserved bytes per key and in total. */
export class WsAdmission {
  readonly caps: WsCaps;
  private perKey = new Map<string, { connections: number; bytes: number }>();
  private connections = 0;
  private bytes = 0;

  constructor(caps: Partial<WsCaps> = {}) {
    this.caps = { ...DEFAULT_WS_CAPS, ...caps };
  }

  /** Open connections and reserved bytes: in total, and for `key` when given. */
  usage(key?: string): { connections: number; bytes: number } {
    if (key !== undefined) return { ...(this.perKey.get(key) ?? { connections: 0, bytes: 0 }) };
    return { connections: this.connections, bytes: this.bytes };
  }

  /**
   * Reserve one connection holding up to `bytes` for `key`.
   * @returns a ticket, or the refusal (`status` 429 and a message naming the cap, its flag and what to do).
   */
  admit(key: string, bytes: number): WsTicket | { status: 429; message: string } {
    const mine = this.perKey.get(key) ?? { connections: 0, bytes: 0 };
    const who = key.startsWith('addr:') ? `address ${key.slice(5)}` : 'this key';
    const c = this.caps;
    const over = (cap: keyof WsCaps, text: string) => ({ status: 429 as const, message: `${text} (${FLAG[cap]}); close a connection before opening another` });
    if (mine.connections + 1 > c.connectionsPerKey) return over('connectionsPerKey', `${who} has ${mine.connections} open websocket connections; the limit is ${c.connectionsPerKey}`);
    if (this.connections + 1 > c.connections) return over('connections', `the server has ${this.connections} open websocket connections; the limit is ${c.connections}`);
    if (mine.bytes + bytes > c.bufferedBytesPerKey) {
      return over('bufferedBytesPerKey', `${who}'s connections may buffer ${bytesText(mine.bytes)}; another (${bytesText(bytes)}) would pass the limit of ${bytesText(c.bufferedBytesPerKey)}`);
    }
    if (this.bytes + bytes > c.bufferedBytes) {
      return over('bufferedBytes', `the server's connections may buffer ${bytesText(this.bytes)}; another (${bytesText(bytes)}) would pass the limit of ${bytesText(c.bufferedBytes)}`);
    }
    mine.connections++;
    mine.bytes += bytes;
    this.perKey.set(key, mine);
    this.connections++;
    this.bytes += bytes;
    let released = false;
    return {
      release: () => {
        if (released) return;
        released = true;
        mine.connections--;
        mine.bytes -= bytes;
        if (mine.connections === 0) this.perKey.delete(key);
        this.connections--;
        this.bytes -= bytes;
      },
    };
  }
}
