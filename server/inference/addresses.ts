/**
 * IP address arithmetic for egress.ts, without I/O: the canonical form of an address (IPv4
 * hidden in IPv6 comes out as IPv4), the ranges refused by default and the operator's allowlist
 * (`--allow-endpoint`, parsed here so that config.ts can check it at start).
 */
import net from 'node:net';

/** An IPv4 range refused by default: [first address as a 32-bit number, prefix length, what it is]. */
const V4_REFUSED: [number, number, string][] = [
  [v4('0.0.0.0'), 8, 'an unspecified ("this network") address'],
  [v4('10.0.0.0'), 8, 'a private address (10.0.0.0/8)'],
  [v4('100.64.0.0'), 10, 'a carrier-grade NAT address (100.64.0.0/10)'],
  [v4('127.0.0.0'), 8, 'a loopback address (127.0.0.0/8)'],
  [v4('169.254.0.0'), 16, 'a link-local address (169.254.0.0/16, where cloud metadata services answer)'],
  [v4('172.16.0.0'), 12, 'a private address (172.16.0.0/12)'],
  [v4('192.0.0.0'), 24, 'an IETF protocol address (192.0.0.0/24)'],
  [v4('192.168.0.0'), 16, 'a private address (192.168.0.0/16)'],
  [v4('198.18.0.0'), 15, 'a benchmarking address (198.18.0.0/15)'],
  [v4('224.0.0.0'), 4, 'a multicast address (224.0.0.0/4)'],
  [v4('240.0.0.0'), 4, 'a reserved address (240.0.0.0/4)'],
];

function v4(s: string): number {
  return s.split('.').reduce((n, part) => n * 256 + Number(part), 0);
}

/** 16 bytes of an IPv6 literal (as net.isIPv6 accepts it, a trailing dotted quad included). */
function v6Bytes(s: string): number[] {
  let text = s.split('%')[0]!;
  const quad = /(\d+\.\d+\.\d+\.\d+)$/.exec(text);
  if (quad) {
    const n = v4(quad[1]!);
    text = `${text.slice(0, quad.index)}${(n >>> 16).toString(16)}:${(n & 0xffff).toString(16)}`;
  }
  const [head, tail] = text.includes('::') ? text.split('::') : [text, undefined];
  const words = (x: string | undefined) => (x ? x.split(':').map((w) => parseInt(w, 16)) : []);
  const h = words(head);
  const t = words(tail);
  const all = tail === undefined ? h : [...h, ...new Array(8 - h.length - t.length).fill(0), ...t];
  return all.flatMap((w) => [w >> 8, w & 0xff]);
}

/**
 * An address in the form the checks use: IPv4 dotted, or IPv6 whose embedded IPv4 address (if
 * any: ::ffff:a.b.c.d, ::a.b.c.d, 64:ff9b::a.b.c.d, 2002:AABB:CCDD::) comes out as IPv4.
 */
export function canonicalAddress(address: string): string {
  const ip = address.replace(/^\[|\]$/g, '');
  if (net.isIPv4(ip)) return ip;
  if (!net.isIPv6(ip)) return ip;
  const b = v6Bytes(ip);
  const dotted = (at: number) => b.slice(at, at + 4).join('.');
  const zero = (from: number, to: number) => b.slice(from, to).every((x) => x === 0);
  if (zero(0, 10) && b[10] === 0xff && b[11] === 0xff) return dotted(12); // IPv4-mapped
  if (zero(0, 12) && !zero(12, 14)) return dotted(12); // IPv4-compatible (deprecated); not :: or ::1
  if (b[0] === 0x00 && b[1] === 0x64 && b[2] === 0xff && b[3] === 0x9b && zero(4, 12)) return dotted(12); // NAT64
  if (b[0] === 0x20 && b[1] === 0x02) return dotted(2); // 6to4
  return ip.toLowerCase();
}

/** Why an address is refused by default, or null when it is a public address. */
export function categoryOf(address: string): string | null {
  const ip = canonicalAddress(address);
  if (net.isIPv4(ip)) {
    const n = v4(ip);
    for (const [first, prefix, what] of V4_REFUSED) {
      if (prefix === 0 || Math.floor(n / 2 ** (32 - prefix)) === Math.floor(first / 2 ** (32 - prefix))) return what;
    }
    if (n === 0xffffffff) return 'the broadcast address';
    return null;
  }
  const b = v6Bytes(ip);
  if (b.every((x) => x === 0)) return 'the unspecified address (::)';
  if (b.slice(0, 15).every((x) => x === 0) && b[15] === 1) return 'a loopback address (::1)';
  if ((b[0]! & 0xfe) === 0xfc) return 'a unique-local (private) address (fc00::/7)';
  if (b[0] === 0xfe && (b[1]! & 0xc0) === 0x80) return 'a link-local address (fe80::/10)';
  if (b[0] === 0xfe && (b[1]! & 0xc0) === 0xc0) return 'a site-local address (fec0::/10)';
  if (b[0] === 0xff) return 'a multicast address (ff00::/8)';
  return null;
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

