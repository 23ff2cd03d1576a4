/**
 * The traced graphs of one kind (sampling, forward_backward; kernels/sample-graph.ts,
 * kernels/step-graph.ts) by layout key and weight structure, within one budget of traced ops
 * shared by every cache in the thread: past it the least recently used graph is freed. A count
 * of layouts alone would not bound memory (a batch-16, 50-step sample is 20,000 ops; a batch-1,
 * 10-step one 3,000), and a count per layout thrashed as soon as more weight structures (LoRA
 * ranks and scales of several tenants) took turns than it held.
 */
import type * as tf from '@tensorflow/tfjs';
import type { GraphFunction } from './backend/graph.ts';
import type { PolicyWeights } from './flow-policy.ts';
import { gather, type Read } from './weights-trace.ts';

/** A cached graph: what it computes with, and which weights it reads. */
export interface CachedGraph {
  graph: GraphFunction;
  reads: Read[];
}

/**
 * Traced ops kept in all caches of a thread (an engine worker) together. A graph holds roughly
 * 10-30 KB of TensorFlow state per op, so this is a few hundred MB at most.
 */
export const MAX_CACHED_OPS = 40_000;
/** Layouts remembered as not traceable (they stay eager), per cache. */
const MAX_REFUSED = 64;

interface Slot {
  cache: GraphCache<CachedGraph>;
  key: string;
  entry: CachedGraph;
}
const lru = new Set<Slot>();
let cachedOps = 0;

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

  /** Adds a graph, then frees the least recently used graphs of any cache past MAX_CACHED_OPS. */
  add(key: string, entry: E): void {
    const slot: Slot = { cache: this as unknown as GraphCache<CachedGraph>, key, entry };
    const list = this.byKey.get(key) ?? [];
    list.push(slot);
    this.byKey.set(key, list);
    lru.add(slot);
    cachedOps += entry.graph.opCount;
    for (const old of lru) {
      if (cachedOps <= MAX_CACHED_OPS) break;
      if (old !== slot) old.cache.drop(old);
    }
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
    slot.entry.graph.dispose();
  }
}
