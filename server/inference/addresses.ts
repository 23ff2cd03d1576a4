/**
 * IP address arithmetic for egress.ts, without I/O: the canonical form of an address (IPv4
 * hidden in IPv6 comes out as IPv4), the ranges refused by default and the operator's allowlist
 * (`--allow-endpoint`, parsed here so that config.ts can check it at start).
 */
import net from 'node:net';
import ipaddr from 'ipaddr.js';

/**
 * The words a refusal uses for ipaddr.js's named ranges (its tables follow IANA's special-purpose
 * registries), for IPv4 and IPv6; every range but `unicast` is refused by default.
 */
const RANGE_WORDS: Record<'ipv4' | 'ipv6', Record<string, string>> = {
  ipv4: {
    unspecified: 'an unspecified ("this network") address (0.0.0.0/8)',
    broadcast: 'the broadcast address',
    multicast: 'a multicast address (224.0.0.0/4)',
    linkLocal: 'a link-local address (169.254.0.0/16, where cloud metadata services answer)',
    loopback: 'a loopback address (127.0.0.0/8)',
    carrierGradeNat: 'a carrier-grade NAT address (100.64.0.0/10)',
    reserved: 'a reserved address',
  },
  ipv6: {
    unspecified: 'the unspecified address (::)',
    loopback: 'a loopback address (::1)',
    linkLocal: 'a link-local address (fe80::/10)',
    multicast: 'a multicast address (ff00::/8)',
    uniqueLocal: 'a unique-local (private) address (fc00::/7)',
    deprecatedSiteLocal: 'a site-local address (fec0::/10)',
    reserved: 'a reserved address',
  },
};

/** The IPv4 address in the low 32 bits of IPv6 words `w` (as ipaddr.js gives them), dotted. */
function low32(w: number[]): string {
  return [w[6]! >> 8, w[6]! & 0xff, w[7]! >> 8, w[7]! & 0xff].join('.');
}

/**
 * An address in the form the checks use: IPv4 dotted, or IPv6 whose embedded IPv4 address (if
 * any: ::ffff:a.b.c.d, ::ffff:0:a.b.c.d, ::a.b.c.d, 64:ff9b::a.b.c.d, 2002:AABB:CCDD::) comes out as IPv4, since
 * those reach the IPv4 host. Anything that is not an address comes back as given.
 */
export function canonicalAddress(address: string): string {
  const ip = address.replace(/^\[|\]$/g, '').split('%')[0]!;
  if (!ipaddr.isValid(ip) || !net.isIP(ip)) return address.replace(/^\[|\]$/g, '');
  const parsed = ipaddr.parse(ip);
  if (parsed.kind() === 'ipv4') return parsed.toString();
  const v6 = parsed as ipaddr.IPv6;
  const w = v6.parts;
  const range = v6.range();
  if (range === 'ipv4Mapped' || range === 'rfc6145' || range === 'rfc6052') return low32(w); // mapped; translated (::ffff:0:0/96); NAT64 (64:ff9b::/96)
  if (range === '6to4') return [w[1]! >> 8, w[1]! & 0xff, w[2]! >> 8, w[2]! & 0xff].join('.');
  if (w.slice(0, 6).every((x) => x === 0) && (w[6] !== 0 || w[7]! > 1)) return low32(w); // IPv4-compatible (deprecated), not :: or ::1
  return v6.toString(); // RFC 5952's compact form
}

/** Why an address is refused by default, or null when it is a public (unicast) address. */
export function categoryOf(address: string): string | null {
  const ip = canonicalAddress(address);
  if (!net.isIP(ip)) return null;
  const parsed = ipaddr.parse(ip);
  const range = parsed.range();
  if (range === 'unicast') return null;
  if (range === 'private') {
    const block = ['10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16'].find((cidr) => (parsed as ipaddr.IPv4).match(ipaddr.IPv4.parseCIDR(cidr)));
    return `a private address (${block})`;
  }
  return RANGE_WORDS[parsed.kind()][range] ?? `a special-purpose address (${range})`;
}

/** A host name as an allowlist compares it: lower case, no trailing dot, no brackets. */
export function hostKey(host: string): string {
  return host.replace(/^\[|\]$/g, '').replace(/\.$/, '').toLowerCase();
}

/** Whether `s` is a DNS host name: dot-separated labels of letters, digits and inner hyphens. */
function isHostName(s: string): boolean {
  const labels = s.replace(/\.$/, '').split('.');
  // An all-digit last label is a mistyped address (300.1.1.1), not a name.
  return s.length <= 253 && !/^\d+$/.test(labels.at(-1)!) && labels.every((l) => /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/i.test(l));
}

/**
 * Parse `--allow-endpoint`: comma-separated CIDRs (`127.0.0.0/8`, `fd00::/8`), addresses or host
 * names. @throws Error naming the entry that is none of these (config.ts reports it).
 */
export function parseAllowlist(text: string | undefined): { list: net.BlockList; hosts: Set<string>; entries: string[] } {
  const list = new net.BlockList();
  const hosts = new Set<string>();
  const entries = (text ?? '').split(',').map((e) => e.trim()).filter((e) => e !== '');
  for (const entry of entries) {
    const [addr, prefix, extra] = entry.replace(/^\[|\](?=\/|$)/g, '').split('/');
    const family = net.isIP(addr!);
    if (family && prefix === undefined) {
      list.addAddress(canonicalAddress(addr!), net.isIPv4(canonicalAddress(addr!)) ? 'ipv4' : 'ipv6');
    } else if (family && extra === undefined && /^\d{1,3}$/.test(prefix!) && Number(prefix) <= (family === 4 ? 32 : 128)) {
      list.addSubnet(addr!, Number(prefix), family === 4 ? 'ipv4' : 'ipv6');
    } else if (prefix === undefined && isHostName(addr!)) {
      hosts.add(hostKey(addr!));
    } else {
      throw new Error(`"${entry}" is not a CIDR (127.0.0.0/8), an address or a host name`);
    }
  }
  return { list, hosts, entries };
}

