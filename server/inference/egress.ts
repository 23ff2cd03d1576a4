/**
 * Which addresses the server may contact on a client's behalf (inference endpoints: the probe of
 * add_inference_endpoint and sync_inference_weights' `PUT .../weights`), and the one way it
 * contacts them. A URL that a client registers could otherwise aim the server at itself, at
 * services on its loopback or at the private network it sits in (server-side request forgery).
 *
 * Refused unless the operator allows them (`--allow-endpoint`, VELA_ALLOW_ENDPOINT: a comma
 * list of CIDRs, addresses or host names): loopback, unspecified, private (RFC 1918, CGNAT,
 * IPv6 unique-local), link-local, multicast and reserved addresses, IPv4 addresses spelled as
 * IPv6 (mapped, compatible, NAT64, 6to4), this machine's own interface addresses and the host
 * of `--public-url`. The check is on the address a connection is about to use: a literal after
 * WHATWG URL parsing (2130706433, 0x7f.1 and 0177.0.0.1 are 127.0.0.1 by then), or every
 * address a name resolves to, inside the connection's own DNS lookup, so that a name cannot
 * resolve to a public address when registered and to 127.0.0.1 when used (DNS rebinding).
 * Redirects are never followed; answers are read up to a small cap and never echoed.
 */
import dns from 'node:dns';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import os from 'node:os';
import { HttpError } from '../http/http.ts';
import { canonicalAddress, categoryOf, hostKey, parseAllowlist } from './addresses.ts';

/** The flag that opens refused addresses, named in every refusal. */
export const ALLOW_FLAG = '--allow-endpoint';

/** A connection that the policy refused, before it was made. */
export class EgressRefused extends Error {
  constructor(
    readonly url: string,
    readonly address: string,
    readonly reason: string,
  ) {
    super(
      `url ${JSON.stringify(url)} resolves to ${address}, ${reason}: the server does not contact loopback, private, link-local or its own addresses for a client; ` +
        `an operator can allow it with ${ALLOW_FLAG} ${canonicalAddress(address)} (or a CIDR that holds it; VELA_ALLOW_ENDPOINT)`,
    );
    this.name = 'EgressRefused';
  }
}

/** What the server may contact for clients; built once from the operator's settings. */
export class EgressPolicy {
  private readonly allow: ReturnType<typeof parseAllowlist>;
  private readonly ownHosts: Set<string>;

  /**
   * @param allowText `--allow-endpoint` as given.
   * @param ownHosts host names that are this server (`--public-url`'s host), refused like its addresses.
   * @throws Error for a bad allowlist entry.
   */
  constructor(allowText: string | undefined, ownHosts: string[] = []) {
    this.allow = parseAllowlist(allowText);
    this.ownHosts = new Set(ownHosts.map(hostKey));
  }

  /** Whether `host` is this server's public host name (and not allowed by the operator). */
  namesSelf(host: string): boolean {
    return this.ownHosts.has(hostKey(host)) && !this.allowsHost(host);
  }

  /** Whether the operator allowed host name `host` whatever it resolves to. */
  allowsHost(host: string): boolean {
    return this.allow.hosts.has(hostKey(host));
  }

  /** Why `address` may not be contacted (one phrase), or null when it may. */
  refusal(address: string): string | null {
    const raw = address.replace(/^\[|\]$/g, '');
    const ip = canonicalAddress(raw);
    if (!net.isIP(ip)) return 'not an IP address';
    const allowed = (a: string) => this.allow.list.check(a, net.isIPv4(a) ? 'ipv4' : 'ipv6');
    if (allowed(ip) || allowed(raw)) return null;
    const category = categoryOf(ip);
    if (category) return category;
    if (ownAddresses().has(ip)) return 'an address of this server\'s own machine';
    return null;
  }

  /**
   * Check a URL's host before anything is sent: a literal address, or every address its name
   * resolves to now (the connection checks again when it resolves). A name that does not resolve
   * passes: the connection refuses it later if it then resolves to a refused address.
   * @throws HttpError 403 naming the URL as given, the address, why and the flag that allows it.
   */
  async checkUrl(given: string, url: string): Promise<void> {
    const host = new URL(url).hostname;
    if (this.allowsHost(host)) return;
    const bare = host.replace(/^\[|\]$/g, '');
    if (this.namesSelf(bare)) {
      throw new HttpError(403, `url ${JSON.stringify(given)} names this server itself (its --public-url host ${bare}): an operator can allow it with ${ALLOW_FLAG} ${bare}`);
    }
    let addresses: string[];
    if (net.isIP(bare)) addresses = [bare];
    else {
      try {
        addresses = (await dns.promises.lookup(bare, { all: true, verbatim: true })).map((a) => a.address);
      } catch {
        return;
      }
    }
    for (const a of addresses) {
      const why = this.refusal(a);
      if (why) throw new HttpError(403, new EgressRefused(given, a, why).message);
    }
  }

  /** A `lookup` for net.connect that fails when any resolved address is refused. */
  lookupFor(url: string): net.LookupFunction {
    return ((hostname: string, options: dns.LookupOptions, callback: (err: Error | null, address: string | dns.LookupAddress[], family?: number) => void) => {
      dns.lookup(hostname, { ...options, all: true }, (err, addresses) => {
        if (err) return callback(err, '', 0);
        for (const a of addresses) {
          const why = this.allowsHost(hostname) ? null : this.refusal(a.address);
          if (why) return callback(new EgressRefused(url, a.address, why), '', 0);
        }
        if (options.all) callback(null, addresses);
        else if (addresses.length === 0) callback(Object.assign(new Error(`${hostname} has no address`), { code: 'ENOTFOUND' }), '', 0);
        else callback(null, addresses[0]!.address, addresses[0]!.family);
      });
    }) as net.LookupFunction;
  }
}

/** This machine's interface addresses, canonical (read each time: interfaces come and go). */
function ownAddresses(): Set<string> {
  const out = new Set<string>();
  for (const list of Object.values(os.networkInterfaces())) for (const a of list ?? []) out.add(canonicalAddress(a.address));
  return out;
}

/** What an endpoint answered: its status and at most `maxAnswerBytes` of its body. */
export interface EgressAnswer {
  status: number;
  body: Buffer;
}

/**
 * One request to a client-given URL under `policy`: no redirect is followed (a 3xx is an answer
 * like any other), the address is checked as the connection is made, the answer is read up to
 * `maxAnswerBytes` (the rest is dropped).
 * @throws EgressRefused before connecting to a refused address; Error on network failure or
 *   after `timeoutMs`.
 */
export function egressRequest(policy: EgressPolicy, url: string, opts: { method: string; headers?: Record<string, string>; body?: Buffer; timeoutMs: number; maxAnswerBytes?: number }): Promise<EgressAnswer> {
  const u = new URL(url);
  const host = u.hostname.replace(/^\[|\]$/g, '');
  if (policy.namesSelf(host)) return Promise.reject(new EgressRefused(url, host, 'this server\'s own --public-url host'));
  // A literal address is connected to without a lookup: check it here.
  if (net.isIP(host) && !policy.allowsHost(host)) {
    const why = policy.refusal(host);
    if (why) return Promise.reject(new EgressRefused(url, host, why));
  }
  const maxBytes = opts.maxAnswerBytes ?? 64 * 1024;
  const lib = u.protocol === 'https:' ? https : http;
  return new Promise((resolve, reject) => {
    const req = lib.request(u, {
      method: opts.method,
      headers: { ...opts.headers, ...(opts.body ? { 'content-length': String(opts.body.length) } : {}) },
      agent: false, // a fresh connection each time, so every one goes through lookup
      lookup: policy.lookupFor(url),
      signal: AbortSignal.timeout(opts.timeoutMs),
    }, (res) => {
      const chunks: Buffer[] = [];
      let kept = 0;
      res.on('data', (c: Buffer) => {
        if (kept >= maxBytes) return;
        chunks.push(c.subarray(0, maxBytes - kept));
        kept += Math.min(c.length, maxBytes - kept);
        if (kept >= maxBytes) res.destroy();
      });
      const done = () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks) });
      res.on('end', done);
      res.on('close', done);
      res.on('error', (e) => (kept >= maxBytes ? done() : reject(e)));
    });
    req.on('error', reject);
    req.end(opts.body);
  });
}
