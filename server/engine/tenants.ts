/**
 * The sessions of one engine worker (multi-tenant LoRA, xorl-style): every tenant holds only its
 * adapter (or full copy), optimizer moments and gradient buffers on top of the shared base.
 * - A cap on tenants resident at once: past it, the least recently used tenant without pending
 *   gradients is saved to disk and freed, and loaded back on its next op (bit-identical: float32
 *   tensors and generator states round-trip exactly).
 * - `sleep` moves a tenant's tensors to host memory and frees them; `wake_up` brings them back.
 * - A tenant whose optimizer step failed midway is poisoned: its weights may be half-updated, so
 *   only `load_state` (or closing it) clears that; abort is refused.
 */
import fs from 'node:fs';
import path from 'node:path';
import * as tf from '@tensorflow/tfjs';
import { loadCheckpoint, saveCheckpoint } from '../../kernels/checkpoint.ts';
import { BaseWeights, TrainingState, type ExportedState } from '../../kernels/trainer.ts';
import { EngineError } from './messages.ts';

export interface TenantOptions {
  finetune: 'lora' | 'full';
  rank: number;
  alpha: number;
  /** The action expert's LoRA rank and alpha where they differ (openpi's 32 on the real models); default rank / alpha. */
  actionRank?: number;
  actionAlpha?: number;
  targets: string[];
  seed: number;
  /** Moving average of the weights (kernels/trainer.ts TrainingOptions.emaDecay); 0 = none. */
  emaDecay?: number;
  /** Training time distribution (kernels/flow.ts TimeSampling). */
  timeSampling?: 'beta' | 'uniform';
  /** Training-time real-time chunking (TrainingOptions.rtcMaxDelay); 0 = off. */
  rtcMaxDelay?: number;
}

export class Tenant {
  state: TrainingState | null;
  /** Host-memory copy while asleep. */
  sleeping: ExportedState | null = null;
  evicted = false;
  poisoned: string | null = null;
  lastUsed = 0;
  /**
   * Bytes of tensors this tenant holds beside the shared base, measured when it was made: its
   * adapters (or full copy) and AdamW moments (gradients come and go with its ops).
   */
  bytes = 0;
  constructor(
    readonly id: string,
    readonly dir: string,
    readonly opts: TenantOptions,
    state: TrainingState,
  ) {
    this.state = state;
  }
  get evictionDir(): string {
    return path.join(this.dir, '.evicted');
  }
}

export class TenantPool {
  private tenants = new Map<string, Tenant>();
  private clock = 0;
  evictions = 0;
  reloads = 0;

  constructor(private base: BaseWeights, private preset: string, public maxResident: number) {}

  get size(): number {
    return this.tenants.size;
  }

  resident(): number {
    let n = 0;
    for (const t of this.tenants.values()) if (t.state) n++;
    return n;
  }

  has(id: string): boolean {
    return this.tenants.has(id);
  }

  /** A new tenant; may evict others to stay under the cap. */
  async create(id: string, dir: string, opts: TenantOptions): Promise<Tenant> {
    if (this.tenants.has(id)) throw new EngineError('conflict', `session ${id} already exists`);
    const before = tf.memory().numBytes;
    const t = new Tenant(id, dir, opts, new TrainingState(this.base, opts));
    // Counted before enforceCap, whose evictions free other tenants' tensors.
    t.bytes = tf.memory().numBytes - before;
    t.lastUsed = ++this.clock;
    this.tenants.set(id, t);
    await this.enforceCap(t);
    return t;
  }

  /** The tenant without loading it (for ops that do not compute). @throws EngineError not_found. */
  peek(id: string): Tenant {
    const t = this.tenants.get(id);
    if (!t) throw new EngineError('not_found', `session ${id} is not open in this engine`);
    return t;
  }

  /**
   * The tenant's training state, loaded back if it was evicted.
   * @throws EngineError `asleep` (call wake_up first), `not_found`.
   */
  async use(id: string): Promise<{ tenant: Tenant; state: TrainingState }> {
    const t = this.peek(id);
    if (t.sleeping) throw new EngineError('asleep', `session ${id} is asleep: call wake_up first`);
    if (!t.state) {
      const ck = await loadCheckpoint(t.evictionDir, { preset: this.preset });
      const state = new TrainingState(this.base, t.opts);
      state.importState(toExported(ck));
      t.state = state;
      t.evicted = false;
      fs.rmSync(t.evictionDir, { recursive: true, force: true });
      this.reloads++;
    }
    t.lastUsed = ++this.clock;
    await this.enforceCap(t);
    return { tenant: t, state: t.state };
  }

  /** Evict least-recently-used tenants (never `keep`, one asleep, or one with pending gradients). */
  private async enforceCap(keep: Tenant): Promise<void> {
    while (this.resident() > this.maxResident) {
      let victim: Tenant | null = null;
      for (const t of this.tenants.values()) {
        if (t === keep || !t.state || t.state.pendingGradients > 0 || t.poisoned) continue;
        if (!victim || t.lastUsed < victim.lastUsed) victim = t;
      }
      if (!victim) return; // every other tenant is busy: go over the cap rather than lose gradients
      await this.evict(victim);
    }
  }

  private async evict(t: Tenant): Promise<void> {
    const state = t.state!;
    await saveCheckpoint(t.evictionDir, toContent(state.exportState()), { overwrite: true });
    state.dispose();
    t.state = null;
    t.evicted = true;
    this.evictions++;
  }

  /** Move a tenant's tensors to host memory. @throws EngineError busy (pending gradients). */
  async sleep(id: string): Promise<void> {
    const t = this.peek(id);
    if (t.sleeping) return;
    const { state } = await this.use(id);
    if (state.pendingGradients > 0) {
      throw new EngineError('busy', `session ${id} has ${state.pendingGradients} accumulated gradient calls: run optim_step or abort_gradient_epoch before sleep`);
    }
    t.sleeping = state.exportState();
    state.dispose();
    t.state = null;
  }

  /** Bring a sleeping tenant back, unchanged. Idempotent. */
  async wake(id: string): Promise<void> {
    const t = this.peek(id);
    if (!t.sleeping) return;
    const state = new TrainingState(this.base, t.opts);
    state.importState(t.sleeping);
    t.state = state;
    t.sleeping = null;
    t.lastUsed = ++this.clock;
    await this.enforceCap(t);
  }

  close(id: string): void {
    const t = this.tenants.get(id);
    if (!t) return;
    t.state?.dispose();
    if (t.evicted) fs.rmSync(t.evictionDir, { recursive: true, force: true });
    this.tenants.delete(id);
  }

  stats() {
    let asleep = 0;
    let evicted = 0;
    let poisoned = 0;
    for (const t of this.tenants.values()) {
      if (t.sleeping) asleep++;
      if (t.evicted) evicted++;
      if (t.poisoned) poisoned++;
    }
    return { sessions: this.tenants.size, resident: this.resident(), asleep, evicted, poisoned, maxResident: this.maxResident, evictions: this.evictions, reloads: this.reloads };
  }
}

/** A training state's export in checkpoint.ts's layout (weights + optimizer + trainer state). */
export function toContent(ex: ExportedState) {
  return { weights: ex.weights, optimizer: ex.optimizer, trainerState: ex.trainerState, config: ex.config } as const;
}

/** A loaded checkpoint back to the form TrainingState imports. */
export function toExported(ck: { config: Record<string, any>; adapter?: { tensors: ExportedState['weights'] }; weights?: ExportedState['weights']; optimizer?: ExportedState['optimizer']; trainerState?: unknown }): ExportedState {
  const c = ck.config;
  return {
    config: { finetune: c.finetune, lora_rank: c.lora_rank, lora_alpha: c.lora_alpha, lora_targets: c.lora_targets, preset: c.preset },
    weights: ck.adapter?.tensors ?? ck.weights ?? {},
    optimizer: ck.optimizer,
    trainerState: ck.trainerState as ExportedState['trainerState'],
  };
}
