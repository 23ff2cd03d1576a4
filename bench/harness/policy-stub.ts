/**
 * Test and bench harness of the policy server: a stub engine that answers `load_policy` and `infer` as the
 * real worker does (EngineLike), computing each datum's actions deterministically from that
 * datum's inputs and seed alone, and a websocket client that reads like OpenPI's.
 */
import WebSocket from 'ws';
import type { EngineLike } from '../../server/engine/host.ts';
import type { EngineInfo } from '../../server/engine/messages.ts';
import type { ModelBatch } from '../../kernels/small/batch.ts';
import { packNumpy, unpackNumpy } from '../../protocol/ndarray.ts';
import { log } from '../../server/log.ts';

/** The stub model's sizes: flow0-tiny with 32-pixel images, 8 state and action dims, horizon 6. */
export const STUB_INFO: EngineInfo = {
  preset: 'flow0-tiny', backend: 'stub', backendKind: 'stub', backendDevice: 'none', backendLine: 'backend stub', backendFallbacks: [], imageSize: 32, imageSlots: 3, stateDim: 8, actionDim: 8,
  actionHorizon: 6, maxTokenLen: 48, padToken: 256, family: 'small', baseDir: null, baseParams: 1,
};

/** A checkpoint of a 7-dim-state, 6-dim-action dataset, delta on dims 0..2, z-score stats. */
export const STUB_CONFIG = {
  preset: 'flow0-tiny',
  cameras: ['observation.images.cam_high', 'observation.images.cam_wrist'],
  action_horizon: 5,
  action_dim: 6,
  state_dim: 7,
  action_space: 'delta',
  delta_mask: [true, true, true, false, false, false],
  num_steps: 3,
};

export const STUB_STATS = {
  norm_stats: {
    state: { mean: [0.1, -0.2, 0.3, 0.5, 1, 2, -1], std: [1, 0.5, 2, 0.25, 3, 1.5, 0.1], q01: [-1, -1, -1, -1, -1, -1, -1], q99: [1, 1, 1, 1, 1, 1, 1] },
    actions: { mean: [0.5, 0, -0.5, 1, 2, 3], std: [2, 1, 0.5, 4, 0.25, 1], q01: [-1, -1, -1, -1, -1, -1], q99: [1, 1, 1, 1, 1, 1] },
  },
};

export interface InferCall {
  batch: ModelBatch;
  seeds: number[];
  numSteps: number;
  rows: Float32Array[]; // what the stub answered per datum, [horizon * actionDim]
}

export interface StubEngine extends EngineLike {
  loads: { session: string; dir: string }[];
  infers: InferCall[];
  /** Infer calls that have started and not yet answered. */
  pending: number;
  /** When set, infer waits for this promise before answering. */
  gate: Promise<void> | null;
  /** Prompts whose datum makes infer throw a plain (internal) Error. */
  failOnPrompt: string | null;
}

function fnv1a(h: number, bytes: Uint8Array): number {
  for (let i = 0; i < bytes.length; i++) h = Math.imul(h ^ bytes[i]!, 0x01000193) >>> 0;
  return h;
}

function bytesOf(a: ArrayBufferView): Uint8Array {
  return new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
}

/** Datum b's actions: a mulberry32 stream keyed by a hash of its inputs and its seed. */
export function stubRow(batch: ModelBatch, b: number, seed: number, info: EngineInfo = STUB_INFO): Float32Array {
  const S = info.imageSize;
  const slots = info.imageSlots;
  const L = info.maxTokenLen;
  let h = 0x811c9dc5;
  h = fnv1a(h, batch.images.subarray(b * slots * S * S * 3, (b + 1) * slots * S * S * 3));
  h = fnv1a(h, batch.imageMask.subarray(b * slots, (b + 1) * slots));
  h = fnv1a(h, bytesOf(batch.tokens.subarray(b * L, (b + 1) * L)));
  h = fnv1a(h, bytesOf(batch.state.subarray(b * info.stateDim, (b + 1) * info.stateDim)));
  h = fnv1a(h, bytesOf(Uint32Array.of(seed)));
  let s = h;
  const out = new Float32Array(info.actionHorizon * info.actionDim);
  for (let i = 0; i < out.length; i++) {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    out[i] = (((t ^ (t >>> 14)) >>> 0) / 2 ** 32) * 4 - 2;
  }
  return out;
}

export function stubEngine(opts: { config?: unknown; normStats?: unknown; info?: EngineInfo } = {}): StubEngine {
  const info = opts.info ?? STUB_INFO;
  const engine: StubEngine = {
    info,
    loads: [],
    infers: [],
    pending: 0,
    gate: null,
    failOnPrompt: null,
    async call(session: string, op: string, args: Record<string, any> = {}) {
      if (op === 'load_policy') {
        engine.loads.push({ session, dir: args.dir });
        return { result: { config: opts.config ?? STUB_CONFIG, normStats: opts.normStats === undefined ? STUB_STATS : opts.normStats }, pending_gradients: 0 } as any;
      }
      if (op !== 'infer') throw new Error(`stub engine: unexpected op ${op}`);
      const batch = args.batch as ModelBatch;
      const seeds = args.seeds as number[];
      if (seeds.length !== batch.size) throw new Error(`stub engine: ${seeds.length} seeds for ${batch.size} datums`);
      engine.pending++;
      try {
        if (engine.gate) await engine.gate;
        else await new Promise((r) => setImmediate(r));
        const L = info.maxTokenLen;
        for (let b = 0; b < batch.size; b++) {
          const bytes = [...batch.tokens.subarray(b * L, (b + 1) * L)].filter((t) => t < 256);
          if (engine.failOnPrompt !== null && Buffer.from(bytes).toString('utf8') === engine.failOnPrompt) throw new Error('stub engine: simulated crash in infer');
        }
        const rows = Array.from({ length: batch.size }, (_, b) => stubRow(batch, b, seeds[b]!, info));
        engine.infers.push({ batch, seeds: [...seeds], numSteps: args.numSteps, rows });
        const actions = new Float32Array(batch.size * info.actionHorizon * info.actionDim);
        rows.forEach((r, b) => actions.set(r, b * r.length));
        return { result: { actions }, pending_gradients: 0 } as any;
      } finally {
        engine.pending--;
      }
    },
    stats: () => ({ queued: 0, sessions: 1, calls: engine.infers.length }),
    close: async () => {},
  };
  return engine;
}

/** A websocket client that reads like OpenPI's: metadata first, binary answers, text = error. */
export class PolicyClient {
  readonly messages: { binary: boolean; data: Buffer }[] = [];
  private waiters: (() => void)[] = [];
  closeCode: number | null = null;
  closeReason = '';
  /** What the socket's 'error' event said (a bad frame from the server reads as close 1006 without it). */
  socketError: string | null = null;
  metadata: any = null;
  metadataMs = 0;

  private constructor(readonly ws: WebSocket) {
    ws.on('message', (data: Buffer, isBinary: boolean) => {
      this.messages.push({ binary: isBinary, data: Buffer.from(data) });
      this.wake();
    });
    ws.on('error', (err: Error) => {
      this.socketError ??= err.message;
    });
    ws.on('close', (code: number, reason: Buffer) => {
      this.closeCode = code;
      this.closeReason = reason.toString();
      this.wake();
    });
  }

  private wake(): void {
    for (const w of this.waiters.splice(0)) w();
  }

  /** Connects and reads the metadata; rejects with the HTTP status on a refused upgrade. */
  static async connect(url: string, headers: Record<string, string> = {}): Promise<PolicyClient> {
    const t0 = performance.now();
    const ws = new WebSocket(url, { headers, perMessageDeflate: false, maxPayload: 0 });
    const client = new PolicyClient(ws);
    await new Promise<void>((resolve, reject) => {
      ws.once('open', () => resolve());
      ws.once('unexpected-response', (_req, res) => reject(Object.assign(new Error(`upgrade refused: ${res.statusCode}`), { status: res.statusCode })));
      ws.once('error', reject);
    });
    const first = await client.recv();
    client.metadataMs = performance.now() - t0;
    if (!first) throw new Error(`closed before the metadata (${client.closeCode} ${client.closeReason})`);
    if (!first.binary) throw new Error(`metadata came as text: ${first.data}`);
    client.metadata = unpackNumpy(first.data);
    return client;
  }

  /** The next message, or null once the socket closed with nothing left. */
  async recv(): Promise<{ binary: boolean; data: Buffer } | null> {
    for (;;) {
      const m = this.messages.shift();
      if (m) return m;
      if (this.closeCode !== null) return null;
      await new Promise<void>((r) => this.waiters.push(r));
    }
  }

  async closed(): Promise<number> {
    while (this.closeCode === null) await new Promise<void>((r) => this.waiters.push(r));
    return this.closeCode;
  }

  send(bytes: Uint8Array): void {
    this.ws.send(bytes, { binary: true });
  }

  /** Sends an observation (packed as OpenPI does unless bytes are given) and reads the answer. */
  async infer(obs: unknown): Promise<any> {
    this.send(obs instanceof Uint8Array ? obs : packNumpy(obs));
    const m = await this.recv();
    if (!m) {
      // An in-process server's warnings say why uWS closed (a 1006 carries no reason); see log.recent.
      const warned = log.recent().slice(-10);
      throw new Error(`connection closed (${this.closeCode} ${this.closeReason}${this.socketError ? `; socket error: ${this.socketError}` : ''}) without an answer` +
        (warned.length ? `\nthis process's last warnings:\n${warned.join('\n')}` : ''));
    }
    if (!m.binary) throw Object.assign(new Error(`Error in inference server:\n${m.data.toString()}`), { text: m.data.toString() });
    return unpackNumpy(m.data);
  }

  close(): void {
    this.ws.close();
  }
}
