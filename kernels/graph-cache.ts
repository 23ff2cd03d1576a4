/**
 * The traced graphs of one kind (sampling, forward_backward; kernels/sample-graph.ts,
 * kernels/step-graph.ts) by layout key and weight structure, within one budget of traced ops and
 * one of estimated bytes (GraphFunction.heldBytes; VELA_GRAPH_CACHE_BYTES) shared by every cache
 * in the thread: past either the least recently used graph is freed. A count
 * of layouts alone would not bound memory (a batch-16, 50-step sample is 20,000 ops; a batch-1,
 * 10-step one 3,000), and a count per layout thrashed as soon as more weight structures (LoRA
 * ranks and scales of several tenants) took turns than it held.
 */
import type * as tf from '@tensorflow/tfjs';
import { GRAPH_BYTES_PER_OP, type GraphFunction } from './backend/graph.ts';
import type { PolicyWeights } from './flow-policy.ts';
import { gather, type Read } from './weights-trace.ts';

/** A cached graph: what it computes with, and which weights it reads. */
export interface CachedGraph {
  graph: GraphFunction;
  reads: Read[];
}

/**
 * Traced ops kept in all caches of a thread (an engine worker) together. A graph holds roughly
 * 10-20 KB of TensorFlow state per op (GRAPH_BYTES_PER_OP), so this is a few hundred MB at most.
 */
export const MAX_CACHED_OPS = 40_000;

/** The default of VELA_GRAPH_CACHE_BYTES: 1 GiB (MAX_CACHED_OPS ops are ~0.8 GiB; the rest is for constants). */
export const DEFAULT_GRAPH_CACHE_BYTES = 2 ** 30;

/**
 * The bytes that graphs may hold in all caches of a thread together (GraphFunction.heldBytes:
 * per op and constants): VELA_GRAPH_CACHE_BYTES (a plain byte count, or with a unit: 512MiB,
 * 2GiB; k, m, g are binary), else DEFAULT_GRAPH_CACHE_BYTES. Read at each add, so tests can
 * lower it. A value that does not parse is the default (said once on stderr): a sample must not
 * fail on it.
 */
export function graphCacheBytes(env: NodeJS.ProcessEnv = process.env): number {
  const raw = env.VELA_GRAPH_CACHE_BYTES?.trim();
  if (!raw) return DEFAULT_GRAPH_CACHE_BYTES;
  const m = /^(\d+(?:\.\d+)?)\s*([kmg]i?b?)?$/i.exec(raw);
  const unit = m?.[2] ? 1024 ** ('kmg'.indexOf(m[2][0]!.toLowerCase()) + 1) : 1;
  const n = m ? Math.floor(Number(m[1]) * unit) : NaN;
  if (n > 0) return n;
  if (warnedValue !== raw) console.error(`VELA_GRAPH_CACHE_BYTES is ${JSON.stringify(raw)}; expected bytes, e.g. 1073741824 or 512MiB: using ${DEFAULT_GRAPH_CACHE_BYTES}`);
  warnedValue = raw;
  return DEFAULT_GRAPH_CACHE_BYTES;
}
let warnedValue: string | undefined;

/**
 * The most ops one trace may record (traceGraph's maxOps): a graph that alone would fill the
 * whole budget, in ops or in bytes, is never worth its trace (it would be evicted by the next).
 */
export function maxTraceOps(): number {
  return Math.min(MAX_CACHED_OPS, Math.floor(graphCacheBytes() / GRAPH_BYTES_PER_OP));
}
/** Layouts remembered as not traceable (they stay eager), per cache. */
const MAX_REFUSED = 64;

interface Slot {
  cache: GraphCache<CachedGraph>;
  key: string;
  entry: CachedGraph;
}
const lru = new Set<Slot>();
let cachedOps = 0;
let cachedBytes = 0;

/** What every graph cache of this thread holds together: graphs, traced ops and their estimated bytes (GraphFunction.heldBytes). */
export function graphCacheStats(): { graphs: number; ops: number; bytes: number } {
  return { graphs: lru.size, ops: cachedOps, bytes: cachedBytes };
}

/**
 * One kind of graph for one policy: entries by layout key, several per key (one per weight
 * structure, told apart by replaying their weight reads), and the keys that could not be traced.
 */
export class GraphCache<E extends CachedGraph> {
  private readonly byKey = new Map<string, Slot[]>();
  private readonly refused = new Set<string>();

  /** Whether `key` could not be traced (stays eager). */
  isRefused(key: string): boolean {
    return this.refused.has(key);
  }

  /** Remembers that `key` could not be traced. */
  refuse(key: string): void {
    if (this.refused.size >= MAX_REFUSED) this.refused.delete(this.refused.values().next().value as string);
    this.refused.add(key);
  }

  /** A graph of `key` whose weight reads `W` answers alike, with the tensors to feed; null when none. */
  find(key: string, W: PolicyWeights): { entry: E; weights: tf.Tensor[] } | null {
    for (const slot of this.byKey.get(key) ?? []) {
      const weights = gather(slot.entry.reads, W);
      if (weights) {
        lru.delete(slot);
        lru.add(slot); // most recently used last
        return { entry: slot.entry as E, weights };
      }
    }
    return null;
  }

  /**
   * Adds a graph, then frees the least recently used graphs of any cache while the total is past
   * MAX_CACHED_OPS or graphCacheBytes(). A graph past either budget on its own is not kept:
   * false (the caller runs it once and disposes it; refuse its key so it stays eager).
   */
  add(key: string, entry: E): boolean {
    const budget = graphCacheBytes();
    if (entry.graph.opCount > MAX_CACHED_OPS || entry.graph.heldBytes > budget) return false;
    const slot: Slot = { cache: this as unknown as GraphCache<CachedGraph>, key, entry };
    const list = this.byKey.get(key) ?? [];
    list.push(slot);
    this.byKey.set(key, list);
    lru.add(slot);
    cachedOps += entry.graph.opCount;
    cachedBytes += entry.graph.heldBytes;
    for (const old of lru) {
      if (cachedOps <= MAX_CACHED_OPS && cachedBytes <= budget) break;
      if (old !== slot) old.cache.drop(old);
    }
    return true;
  }

  /** Frees every graph of this cache. */
  dispose(): void {
    for (const list of [...this.byKey.values()]) for (const slot of [...list]) this.drop(slot);
    this.refused.clear();
  }

  private drop(slot: Slot): void {
    const list = this.byKey.get(slot.key);
    const i = list?.indexOf(slot) ?? -1;
    if (i < 0) return;
    list!.splice(i, 1);
    if (list!.length === 0) this.byKey.delete(slot.key);
    lru.delete(slot);
    cachedOps -= slot.entry.graph.opCount;
    cachedBytes -= slot.entry.graph.heldBytes;
    slot.entry.graph.dispose();
  }
}
