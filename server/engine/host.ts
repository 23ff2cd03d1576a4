/**
 * The engine host: the main thread's handle on one engine worker (one per preset and backend).
 * The worker holds the shared base weights and every session's adapter, gradients and optimizer
 * state; the host only queues calls. Calls of one session run in order; sessions take turns
 * (round-robin), so one client's pipeline cannot starve another's. One call is in the worker
 * at a time, which keeps a crash or a long op attributable to one session.
 */
import { Worker } from 'node:worker_threads';
import { EngineError, type BackendInfo, type EngineInfo, type EngineMemory, type FromWorker, type ToWorker } from './messages.ts';
import { log } from '../log.ts';
import { unwatchEngine, watchEngine, type MetricsEngine } from '../metrics/sources.ts';
import { applyNativeEnv, pinNativeLibrary, type NativeThreads } from '../../kernels/backend/native.ts';

/** Whether `b` was moved to another thread (a view of a detached buffer cannot be made). */
function isDetached(b: ArrayBuffer): boolean {
  try {
    new Uint8Array(b);
    return false;
  } catch {
    return true;
  }
}

interface Pending {
  callId: number;
  session: string;
  op: string;
  args: Record<string, unknown>;
  transfer: ArrayBuffer[];
  resolve: (v: any) => void;
  reject: (e: Error) => void;
}

export interface EngineOptions {
  preset: string;
  backend: string;
  seed?: number;
  baseWeightsPath?: string;
  /** Sessions resident in the engine at once; past it the least recently used is saved to disk (default 64). */
  maxResident?: number;
  /** TensorFlow's thread pools (native backends; process-wide, fixed by the first engine that loads it). */
  threads?: Partial<NativeThreads>;
  /**
   * Latency classes sharing one machine: an `urgent` engine (policies) marks the gate busy while
   * its calls wait or run; a `yield` engine (training) holds its next call while the gate is busy.
   */
  priority?: { gate: PriorityGate; role: 'urgent' | 'yield' };
  /** TRACE_QUIET_MS for this engine (tests shorten it). */
  traceQuietMs?: number;
}

/**
 * A call with `trace: 'quiet'` (a policy's `infer`, a session's `sample`) may trace a new
 * layout's graph (kernels/sample-graph.ts: 1-2 s for flow05-tiny on 2 cores, up to ~10 s loaded)
 * only when no other session of the engine has had an `infer` (a robot's request) queued, running
 * or answered for this long; else it samples that layout eagerly. A trace then never holds up another policy's robots (which already have their graphs):
 * a robot querying at least every 2 s keeps other keys' traces off the engine, while a policy
 * alone on its engine traces at once. The host decides at dispatch, when the wait is known.
 */
export const TRACE_QUIET_MS = 2000;

/**
 * Serves latency-critical work first without starving batch work (training). Urgent calls
 * mark it busy from queueing until `lingerMs` after the last one settles (a closed-loop robot
 * client sends its next request within that gap); a yielding engine waits between its calls
 * while it is busy, but never longer than `maxHoldMs` per call, so training keeps at least
 * callMs / (callMs + maxHoldMs) of its pace under any policy load.
 */
export class PriorityGate {
  private pending = 0;
  private lingering: NodeJS.Timeout | null = null;
  private waiters: (() => void)[] = [];
  /** Times a yielding engine held a call, and the milliseconds it held in all. */
  readonly held = { calls: 0, ms: 0 };

  constructor(readonly maxHoldMs = 250, readonly lingerMs = 20) {}

  get busy(): boolean {
    return this.pending > 0 || this.lingering !== null;
  }

  enter(): void {
    this.pending++;
    if (this.lingering) clearTimeout(this.lingering);
    this.lingering = null;
  }

  leave(): void {
    if (--this.pending > 0) return;
    this.lingering = setTimeout(() => {
      this.lingering = null;
      const w = this.waiters;
      this.waiters = [];
      for (const f of w) f();
    }, this.lingerMs);
    this.lingering.unref();
  }

  /** Resolves once the gate is idle, or after maxHoldMs. */
  wait(): Promise<void> {
    const t0 = performance.now();
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.waiters = this.waiters.filter((f) => f !== done);
        this.held.calls++;
        this.held.ms += performance.now() - t0;
        resolve();
      };
      const timer = setTimeout(done, this.maxHoldMs);
      timer.unref();
      this.waiters.push(done);
    });
  }
}

function spawnWorker(backend: string, threads?: Partial<NativeThreads>): Worker {
  // TensorFlow reads its thread counts from the process environment when it loads, and a
  // worker's process.env is only a copy: set them here, on the main thread, first.
  applyNativeEnv(threads);
  pinNativeLibrary(backend.trim().toLowerCase());
  return new Worker(new URL('./bootstrap.mjs', import.meta.url), {
    workerData: { entry: new URL('./worker.ts', import.meta.url).href },
  });
}

/** The interface the session server, jobs and the policy server use (tests inject stubs). */
export interface EngineLike {
  readonly info: EngineInfo;
  call<T = unknown>(session: string, op: string, args?: Record<string, unknown>, transfer?: ArrayBuffer[]): Promise<T>;
  stats(): { queued: number; sessions: number; calls: number };
  /** tf.memory() of the engine after its last answer (null before any; stubs may leave it out). */
  memory?(): EngineMemory | null;
  close(): Promise<void>;
}

export class Engine implements EngineLike, MetricsEngine {
  private queues = new Map<string, Pending[]>();
  private order: string[] = []; // round-robin order of sessions with queued calls
  private inFlight: Pending | null = null;
  private holding = false;
  private heldOnce = false;
  private priority: EngineOptions['priority'];
  private nextCallId = 1;
  private calls = 0;
  private dead: Error | null = null;
  private lastMemory: EngineMemory | null;
  /** Each session's last `infer` dispatched or answered (performance.now()), kept for traceQuietMs. */
  private lastActive = new Map<string, number>();
  private readonly traceQuietMs: number;
  /** Its labels in GET /metrics: lane `training`, `policy` (urgent) or `single` (no gate: vela policy, jobs CLI). */
  readonly labels: { preset: string; lane: string; worker: string };

  private constructor(private worker: Worker, readonly info: EngineInfo, priority?: EngineOptions['priority'], memory?: EngineMemory, traceQuietMs = TRACE_QUIET_MS) {
    this.priority = priority;
    this.traceQuietMs = traceQuietMs;
    this.lastMemory = memory ?? null;
    this.labels = { preset: info.preset, lane: priority ? (priority.role === 'urgent' ? 'policy' : 'training') : 'single', worker: String(worker.threadId) };
    watchEngine(this);
    worker.on('message', (m: FromWorker) => this.onMessage(m));
    worker.on('error', (e) => this.fail(new Error(`engine worker crashed: ${e.message}`)));
    worker.on('exit', (code) => this.fail(new Error(`engine worker exited with code ${code}`)));
  }

  /**
   * Start a worker and build the preset's base weights in it.
   * @throws Error with the worker's reason when the model cannot be built (unknown preset, backend).
   */
  static async start(opts: EngineOptions): Promise<Engine> {
    const worker = spawnWorker(opts.backend, opts.threads);
    let onMsg!: (m: FromWorker) => void;
    let onError!: (e: Error) => void;
    let onExit!: (code: number) => void;
    try {
      let memory: EngineMemory | undefined;
      const info = await new Promise<EngineInfo>((resolve, reject) => {
        onMsg = (m: FromWorker) => {
          if (m.kind === 'ready') {
            memory = m.memory;
            resolve(m.info);
          } else if (m.kind === 'init_failed') reject(new Error(m.error));
          else if (m.kind === 'log') relayLog(m);
        };
        onError = reject;
        onExit = (code) => reject(new Error(`engine worker exited with code ${code} while starting`));
        worker.on('message', onMsg).on('error', onError).on('exit', onExit);
        const init: ToWorker = { kind: 'init', preset: opts.preset, backend: opts.backend, seed: opts.seed ?? 0, baseWeightsPath: opts.baseWeightsPath, maxResident: opts.maxResident };
        worker.postMessage(init);
      });
      return new Engine(worker, info, opts.priority, memory, opts.traceQuietMs);
    } catch (e) {
      await worker.terminate();
      throw e;
    } finally {
      worker.off('message', onMsg).off('error', onError).off('exit', onExit);
    }
  }

  /**
   * The backend that engines started with these settings run on, chosen in a short-lived worker
   * (the same choice as Engine.start makes: the same package, environment and order).
   * @throws Error when no backend can start, or a forced one fails.
   */
  static async probe(backend: string, threads?: Partial<NativeThreads>): Promise<BackendInfo> {
    const worker = spawnWorker(backend, threads);
    try {
      return await new Promise<BackendInfo>((resolve, reject) => {
        worker.on('message', (m: FromWorker) => {
          if (m.kind === 'probed') resolve(m.backend);
          else if (m.kind === 'init_failed') reject(new Error(m.error));
        });
        worker.on('error', reject);
        worker.on('exit', (code) => reject(new Error(`backend probe exited with code ${code}`)));
        const msg: ToWorker = { kind: 'probe', backend };
        worker.postMessage(msg);
      });
    } finally {
      await worker.terminate();
    }
  }

  /**
   * Queue one op for a session; resolves with its result.
   * @throws EngineError for a client-caused failure (the message is safe to show), Error otherwise.
   */
  call<T = unknown>(session: string, op: string, args: Record<string, unknown> = {}, transfer: ArrayBuffer[] = []): Promise<T> {
    if (this.dead) return Promise.reject(this.dead);
    // A buffer an earlier call already moved to the worker is detached: posting it again loses
    // the message on the worker's side (no answer, and the queue would wait for one forever).
    if (transfer.some(isDetached)) return Promise.reject(new EngineError('bad_request', `engine op ${op} was given a buffer that an earlier call moved to the engine's thread; make its arrays again`));
    if (this.priority?.role === 'urgent') {
      const gate = this.priority.gate;
      gate.enter();
      const p = this.enqueue<T>(session, op, args, transfer);
      p.then(() => gate.leave(), () => gate.leave());
      return p;
    }
    return this.enqueue<T>(session, op, args, transfer);
  }

  private enqueue<T>(session: string, op: string, args: Record<string, unknown>, transfer: ArrayBuffer[]): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const p: Pending = { callId: this.nextCallId++, session, op, args, transfer, resolve, reject };
      let q = this.queues.get(session);
      if (!q) this.queues.set(session, (q = []));
      if (q.length === 0) this.order.push(session);
      q.push(p);
      this.pump();
    });
  }

  /** tf.memory() of the worker after its last answer (null before any). */
  memory(): EngineMemory | null {
    return this.lastMemory;
  }

  stats() {
    let queued = 0;
    for (const q of this.queues.values()) queued += q.length;
    return { queued, sessions: this.queues.size, calls: this.calls };
  }

  private pump(): void {
    if (this.inFlight || this.holding || this.order.length === 0) return;
    if (this.priority?.role === 'yield' && this.priority.gate.busy && !this.heldOnce) {
      // Policy requests wait: let them have the cores before the next training op. One hold
      // per call: after it the call goes, busy or not, so training is never starved.
      this.holding = true;
      void this.priority.gate.wait().then(() => {
        this.holding = false;
        this.heldOnce = true;
        if (!this.dead) this.pump();
      });
      return;
    }
    this.heldOnce = false;
    const session = this.order.shift()!;
    const q = this.queues.get(session)!;
    const p = q.shift()!;
    if (q.length > 0) this.order.push(session);
    else this.queues.delete(session);
    this.inFlight = p;
    this.calls++;
    const args = p.args.trace === 'quiet' ? { ...p.args, trace: this.othersQuiet(p.session) } : p.args;
    if (p.op === 'infer') this.lastActive.set(p.session, performance.now());
    const msg: ToWorker = { kind: 'call', callId: p.callId, session: p.session, op: p.op, args };
    try {
      this.worker.postMessage(msg, p.transfer);
    } catch (e) {
      // Arguments that cannot be sent (a function, say) fail this call alone; the queue must not
      // wait for an answer that never comes.
      this.inFlight = null;
      p.reject(new EngineError('bad_request', `engine op ${p.op} could not be sent to the worker: ${(e as Error).message}`));
      queueMicrotask(() => this.pump());
    }
  }

  /**
   * Whether no session but `session` has an `infer` queued, or dispatched or answered within
   * traceQuietMs (TRACE_QUIET_MS). Other ops (training, stats) may wait behind a trace: they have no graph to be held from.
   */
  private othersQuiet(session: string): boolean {
    for (const [s, q] of this.queues) if (s !== session && q.some((c) => c.op === 'infer')) return false;
    const now = performance.now();
    let quiet = true;
    for (const [s, at] of this.lastActive) {
      if (now - at >= this.traceQuietMs) this.lastActive.delete(s); // bounded by the sessions active lately
      else if (s !== session) quiet = false;
    }
    return quiet;
  }

  private onMessage(m: FromWorker): void {
    if (m.kind === 'log') return relayLog(m);
    if (m.kind !== 'result' && m.kind !== 'error') return;
    if (m.memory) this.lastMemory = m.memory;
    const p = this.inFlight;
    if (!p || p.callId !== m.callId) {
      log.error(`engine answered call ${m.callId} but ${p?.callId ?? 'none'} was in flight`);
      return;
    }
    this.inFlight = null;
    if (p.op === 'infer') this.lastActive.set(p.session, performance.now());
    if (m.kind === 'result') p.resolve(m.result);
    else if (!m.internal) p.reject(new EngineError(m.code, m.error));
    else {
      log.error(`engine op ${p.op} of ${p.session} failed: ${m.error}\n${m.stack ?? ''}`);
      p.reject(new Error(m.error));
    }
    this.pump();
  }

  private fail(err: Error, quiet = false): void {
    if (this.dead) return;
    this.dead = err;
    unwatchEngine(this);
    if (!quiet) log.error(err.message);
    const all = [...(this.inFlight ? [this.inFlight] : []), ...[...this.queues.values()].flat()];
    this.inFlight = null;
    this.queues.clear();
    this.order = [];
    for (const p of all) p.reject(err);
  }

  async close(): Promise<void> {
    this.fail(new Error('engine closed'), true);
    await this.worker.terminate();
  }
}

function relayLog(m: Extract<FromWorker, { kind: 'log' }>): void {
  log[m.level](`[engine] ${m.message}`);
}
