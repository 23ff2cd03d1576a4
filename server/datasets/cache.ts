/**
 * A least-recently-used cache bounded by bytes, for decoded episode frames. Concurrent requests
 * for one key share one computation, and at most `maxConcurrent` computations run at once (each
 * is an ffmpeg process or a batch of sharp decodes: unbounded, they would starve the CPUs).
 */
export class ByteLruCache<V extends { data: Uint8Array }> {
  private readonly entries = new Map<string, V>();
  private readonly pending = new Map<string, Promise<V>>();
  private readonly waiters: (() => void)[] = [];
  private running = 0;
  private used = 0;
  hits = 0;
  misses = 0;

  /**
   * @param budgetBytes the most bytes kept; a single value larger than this is returned but not kept.
   * @param maxConcurrent computations in flight at once.
   */
  constructor(readonly budgetBytes: number, readonly maxConcurrent = 2) {}

  get usedBytes(): number {
    return this.used;
  }

  get size(): number {
    return this.entries.size;
  }

  has(key: string): boolean {
    return this.entries.has(key);
  }

  /** The cached value (marking it most recently used), or computes, stores and returns it. */
  async get(key: string, compute: () => Promise<V>): Promise<V> {
    const hit = this.entries.get(key);
    if (hit) {
      this.entries.delete(key);
      this.entries.set(key, hit);
      this.hits++;
      return hit;
    }
    const inFlight = this.pending.get(key);
    if (inFlight) return inFlight;
    this.misses++;
    const p = this.run(compute).then((v) => {
      this.store(key, v);
      return v;
    }).finally(() => this.pending.delete(key));
    this.pending.set(key, p);
    return p;
  }

  clear(): void {
    this.entries.clear();
    this.used = 0;
  }

  private store(key: string, v: V): void {
    const bytes = v.data.byteLength;
    if (bytes > this.budgetBytes) return;
    while (this.used + bytes > this.budgetBytes && this.entries.size > 0) {
      const [oldKey, old] = this.entries.entries().next().value as [string, V];
      this.entries.delete(oldKey);
      this.used -= old.data.byteLength;
    }
    this.entries.set(key, v);
    this.used += bytes;
  }

  private async run(compute: () => Promise<V>): Promise<V> {
    while (this.running >= this.maxConcurrent) await new Promise<void>((r) => this.waiters.push(r));
    this.running++;
    try {
      return await compute();
    } finally {
      this.running--;
      this.waiters.shift()?.();
    }
  }
}
