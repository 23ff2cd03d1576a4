/**
 * What this process may still use, and whether a planned load fits (kernels/pi/memory.ts
 * estimates the plan). The server asks before it loads a base, opens a session or starts a job,
 * and refuses with one line naming the cause and the fix instead of being killed mid-load.
 *
 *   const est = estimateMemory(REAL_PI05, { use: 'lora', batch: 1, cameras: 3 });
 *   const why = checkFits(est, await availableMemory(), 'a LoRA fine-tune of pi05 at batch_size 1');
 *   if (why) throw new HttpError(507, why);
 */
import { readFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import type { MemoryEstimate } from '../../kernels/pi/memory.ts';

const UNITS: Record<string, number> = {
  '': 1, b: 1,
  k: 2 ** 10, kib: 2 ** 10, kb: 1e3,
  m: 2 ** 20, mib: 2 ** 20, mb: 1e6,
  g: 2 ** 30, gib: 2 ** 30, gb: 1e9,
  t: 2 ** 40, tib: 2 ** 40, tb: 1e12,
};

/**
 * A byte count from text: `8GiB`, `512MiB`, `16GB` (decimal), `8g` (binary, as docker's), or a
 * plain number of bytes. `what` names the setting in the error.
 * @throws RangeError: `VELA_MAX_MEMORY is "8 gigs"; expected bytes with a unit, e.g. 8GiB, 512MiB, 16GB`.
 */
export function parseBytes(text: string, what: string): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$/i.exec(text);
  const unit = m ? UNITS[m[2]!.toLowerCase()] : undefined;
  const n = m && unit !== undefined ? Math.floor(Number(m[1]) * unit) : NaN;
  if (!Number.isFinite(n) || n <= 0) throw new RangeError(`${what} is ${JSON.stringify(text)}; expected bytes with a unit, e.g. 8GiB, 512MiB, 16GB`);
  return n;
}

/** Bytes as the messages show them: `13.4 GB (12.49 GiB)`. */
export function bytesHuman(n: number): string {
  if (n >= 2 ** 30) return `${(n / 1e9).toFixed(1)} GB (${(n / 2 ** 30).toFixed(2)} GiB)`;
  return `${(n / 1e6).toFixed(1)} MB`;
}

/** What availableMemory found. */
export interface AvailableMemory {
  /** What this process may still allocate: the limit less its current RSS (>= 0). */
  bytes: number;
  /** The limit: the smallest of the cap, the cgroup's limit and the machine's memory. */
  limitBytes: number;
  rssBytes: number;
  /** What the kernel says the machine could still give (MemAvailable): other processes' use is in it. */
  machineAvailableBytes: number;
  /** Where the limit comes from, for messages: `VELA_MAX_MEMORY`, `cgroup v2 memory.max`, ... */
  source: string;
  /** The name of the cap an operator can raise (the option's flag or VELA_MAX_MEMORY). */
  capName: string;
  /** Bytes reserved by admitted loads that do not hold them yet (MemoryLedger.less; `bytes` is net of them), and how many loads. */
  reservedBytes?: number;
  reservedBy?: number;
}

export interface AvailableOptions {
  /** A cap (bytes or text like `8GiB`); default process.env.VELA_MAX_MEMORY. */
  maxMemory?: number | string;
  /** How an operator sets the cap, for messages (default `VELA_MAX_MEMORY`; the server passes `--max-memory`). */
  capName?: string;
  /** For tests: the cgroup filesystem root (default /sys/fs/cgroup), /proc/self/cgroup's text, RSS and total memory. */
  cgroupRoot?: string;
  procSelfCgroup?: string;
  rssBytes?: number;
  totalMemBytes?: number;
  /** For tests: the machine's MemAvailable (default /proc/meminfo's, unless totalMemBytes describes another machine). */
  machineAvailableBytes?: number;
}

let ownLimit: Promise<{ bytes: number; source: string } | null> | undefined;

/** /proc/meminfo's MemAvailable (bytes), else os.freemem(). */
/**
 * The machine's available memory: os.freemem() is libuv's reading of MemAvailable in
 * /proc/meminfo on Linux (~10 us, no thread-pool round trip; every session pass plans with it).
 */
function machineAvailable(): number {
  return os.freemem();
}

async function readText(file: string): Promise<string | null> {
  try {
    return (await readFile(file, 'utf8')).trim();
  } catch {
    return null;
  }
}

/** A cgroup limit file's value: null for `max`, an absent file, or v1's "no limit" (>= 2^60). */
function limitValue(text: string | null): number | null {
  if (text === null || text === 'max') return null;
  const n = Number(text);
  return Number.isFinite(n) && n > 0 && n < 2 ** 60 ? n : null;
}

/** The memory limit of this process's cgroup (v2 memory.max, else v1 memory.limit_in_bytes), or null. */
async function cgroupLimit(root: string, procSelf: string | null): Promise<{ bytes: number; source: string } | null> {
  // v2: "0::/path"; the limit may sit on the process's own group or (in a container) the root.
  const v2path = procSelf?.split('\n').find((l) => l.startsWith('0::'))?.slice(3) ?? '/';
  for (const dir of new Set([path.join(root, v2path), root])) {
    const v = limitValue(await readText(path.join(dir, 'memory.max')));
    if (v !== null) return { bytes: v, source: 'cgroup v2 memory.max' };
  }
  const v1path = procSelf?.split('\n').map((l) => l.split(':')).find((f) => f[1]?.split(',').includes('memory'))?.[2] ?? '/';
  for (const dir of new Set([path.join(root, 'memory', v1path), path.join(root, 'memory')])) {
    const v = limitValue(await readText(path.join(dir, 'memory.limit_in_bytes')));
    if (v !== null) return { bytes: v, source: 'cgroup v1 memory.limit_in_bytes' };
  }
  return null;
}

/**
 * What this process may still use: the limit (the cgroup's memory.max / v1 limit when set,
 * else the machine's total memory; capped by `maxMemory` / VELA_MAX_MEMORY) less its current
 * RSS, and never more than the machine can still give (MemAvailable: what other processes hold
 * is not there to take). Reads a few small files, asynchronously.
 * @throws RangeError for a cap that does not parse (parseBytes).
 */
export async function availableMemory(opts: AvailableOptions = {}): Promise<AvailableMemory> {
  const capName = opts.capName ?? 'VELA_MAX_MEMORY';
  const capRaw = opts.maxMemory ?? (process.env.VELA_MAX_MEMORY || undefined);
  const cap = capRaw === undefined ? null : typeof capRaw === 'number' ? capRaw : parseBytes(capRaw, capName);
  if (cap !== null && !(cap > 0)) throw new RangeError(`${capName} is ${cap}; it must be > 0 bytes`);
  // A process's cgroup limit does not change while it runs: read once (each real-model pass plans).
  const described = opts.procSelfCgroup !== undefined || opts.cgroupRoot !== undefined;
  const cg = described ? await cgroupLimit(opts.cgroupRoot ?? '/sys/fs/cgroup', opts.procSelfCgroup ?? (await readText('/proc/self/cgroup'))) : await (ownLimit ??= cgroupLimit('/sys/fs/cgroup', await readText('/proc/self/cgroup')));
  const total = opts.totalMemBytes ?? os.totalmem();
  let limit = { bytes: total, source: 'the machine\'s memory' };
  if (cg && cg.bytes < limit.bytes) limit = cg;
  if (cap !== null && cap < limit.bytes) limit = { bytes: cap, source: capName };
  const rss = opts.rssBytes ?? process.memoryUsage.rss();
  const machineFree = opts.machineAvailableBytes ?? (opts.totalMemBytes === undefined ? machineAvailable() : Infinity);
  return { bytes: Math.max(0, Math.min(limit.bytes - rss, machineFree)), limitBytes: limit.bytes, rssBytes: rss, machineAvailableBytes: machineFree, source: limit.source, capName };
}

const PART_NAMES: Record<keyof MemoryEstimate['parts'], string> = {
  weights: 'weights', trainable: 'trainable copy/adapters', optimizer: 'optimizer moments', gradients: 'gradients', activations: 'activations', workspace: 'runtime',
};

/**
 * Whether `estimate` fits in `available`. `what` names the load in the message (`a full
 * fine-tune of pi05 at batch_size 32`).
 * @returns null when it fits; else ONE line naming what, the estimate with its two biggest
 *   parts, what is available and from where, and the fixes that apply: LoRA instead of a full
 *   fine-tune (when trainable is the base's size), a lower batch_size (when activations are a
 *   large part and `opts.batch` is not already 1), a machine with >= N GB, a higher cap (when the cap is what limits).
 *   What admitted loads reserve (available.reservedBytes) is named beside the RSS.
 */
export function checkFits(estimate: MemoryEstimate, available: AvailableMemory, what: string, opts: { batch?: number; use?: 'serve' | 'lora' | 'full' } = {}): string | null {
  if (estimate.totalBytes <= available.bytes) return null;
  const parts = (Object.entries(estimate.parts) as [keyof MemoryEstimate['parts'], number][]).filter(([, v]) => v > 0).sort((a, b) => b[1] - a[1]);
  const biggest = parts.slice(0, 2).map(([k, v]) => `${PART_NAMES[k]} ${bytesHuman(v)}`).join(', ');
  const fixes: string[] = [];
  const { weights, trainable, activations } = estimate.parts;
  // A full fine-tune's trainable copy is the base's size; with the base already loaded `weights` is 0 here, so `use` says it.
  if (opts.use ? opts.use === 'full' : trainable >= 0.5 * weights) fixes.push('use LoRA (the default) instead of a full fine-tune');
  if (activations >= 0.25 * estimate.totalBytes && (opts.batch ?? 2) > 1) fixes.push('lower batch_size');
  const needMachine = estimate.totalBytes + available.rssBytes + (available.reservedBytes ?? 0);
  fixes.push(`free memory or run on a machine with >= ${Math.ceil(needMachine / 1e9)} GB`);
  if (available.source === available.capName) fixes.push(`raise ${available.capName} (now ${bytesHuman(available.limitBytes)})`);
  const others = available.machineAvailableBytes < available.limitBytes - available.rssBytes ? `; other processes hold the rest of the machine` : '';
  const n = available.reservedBy ?? 0;
  const reserved = available.reservedBytes ? ` and ${bytesHuman(available.reservedBytes)} reserved by ${n} pending request${n === 1 ? '' : 's'}` : '';
  return (
    `${what} needs about ${bytesHuman(estimate.totalBytes)} (${biggest}); ` +
    `${bytesHuman(available.bytes)} is available (${available.source} ${bytesHuman(available.limitBytes)} less ${bytesHuman(available.rssBytes)} in use${reserved}${others}): ${fixes.join(', or ')}`
  );
}

/** One pending reservation: bytes planned for a load that does not hold them yet. */
interface Reservation {
  bytes: number;
  /** The engine key whose base the load goes to (sessions.ts keeps such an engine open meanwhile). */
  engine: string | null;
  /** Which admission made it (one request may reserve a base and its own state): messages count requests. */
  admission: number;
}

/**
 * The bytes that admitted loads will hold but do not hold yet (issue 32 item 9). A plan is
 * checked against the limit less the RSS, and the RSS only grows once the engine worker has
 * allocated the load's tensors, an await or more after the check: four sessions asked for at once
 * each saw the same RSS and were all admitted. So the check and the reservation happen in one
 * synchronous step (admit), every later check subtracts what is reserved, and the reservation
 * is released once the tensors are held (the RSS counts them from then on) or the load fails or
 * is closed. One ledger per process, as the memory it plans is.
 *
 * Owners are strings, one reservation each: `session:<id>` (a session's own tensors),
 * `base:<engine key>` (a real base's weights, until its engine has loaded them or failed).
 */
export class MemoryLedger {
  private held = new Map<string, Reservation>();
  private admissions = 0;

  /** Bytes reserved in all. */
  get reservedBytes(): number {
    let n = 0;
    for (const r of this.held.values()) n += r.bytes;
    return n;
  }

  /** How many admitted requests have bytes reserved still. */
  get pending(): number {
    return new Set([...this.held.values()].map((r) => r.admission)).size;
  }

  /** Whether `owner` holds a reservation. */
  has(owner: string): boolean {
    return this.held.has(owner);
  }

  /** Whether a pending reservation is for a load on engine `key` (its engine must not be closed as idle). */
  pendingOn(key: string): boolean {
    for (const r of this.held.values()) if (r.engine === key) return true;
    return false;
  }

  /**
   * `available` less what is reserved now, with the reservation named for messages (checkFits).
   * Synchronous: call it in the same step as the check that uses it (admit does).
   */
  less(available: AvailableMemory): AvailableMemory {
    const reserved = this.reservedBytes;
    return { ...available, bytes: Math.max(0, available.bytes - reserved), reservedBytes: reserved, reservedBy: this.pending };
  }

  /**
   * Checks `estimate` against `available` less what is reserved and, when it fits, reserves its
   * bytes in the same synchronous step, so no other check runs between them: `parts` splits the
   * bytes among owners (`{ 'base:K': weights, 'session:S': rest }`; zero-byte parts take nothing).
   * @returns checkFits's refusal line (nothing reserved), or null (reserved; release each owner later).
   * @throws Error when an owner already holds a reservation (a bug: it would be released once for two loads).
   */
  admit(estimate: MemoryEstimate, available: AvailableMemory, what: string, parts: Record<string, number>, opts: { batch?: number; use?: 'serve' | 'lora' | 'full'; engine?: string } = {}): string | null {
    const why = checkFits(estimate, this.less(available), what, opts);
    if (why) return why;
    const taking = Object.entries(parts).filter(([, bytes]) => bytes > 0);
    for (const [owner] of taking) if (this.held.has(owner)) throw new Error(`memory reservation ${owner} is taken`);
    const admission = ++this.admissions;
    for (const [owner, bytes] of taking) this.held.set(owner, { bytes, engine: opts.engine ?? null, admission });
    return null;
  }

  /** Releases `owner`'s reservation (idempotent). @returns the bytes released (0 when none was held). */
  release(owner: string): number {
    const r = this.held.get(owner);
    this.held.delete(owner);
    return r?.bytes ?? 0;
  }
}

/** This process's ledger: the server's session creation reserves in it, every plan counts it. */
export const memoryLedger = new MemoryLedger();
