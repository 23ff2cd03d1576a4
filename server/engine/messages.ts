/**
 * Messages between the main thread (engine host) and an engine worker. Large arrays travel as
 * transferred ArrayBuffers, never copied.
 */

/** Main -> worker. */
export type ToWorker =
  | { kind: 'init'; preset: string; backend: string; seed: number; baseWeightsPath?: string; maxResident?: number }
  /** Only select the backend and report it (what engines of this process will run on). */
  | { kind: 'probe'; backend: string }
  | { kind: 'call'; callId: number; session: string; op: string; args: Record<string, unknown> };

/** tf.memory() of a worker: bytes held by tensors and how many tensors are alive. */
export interface EngineMemory {
  numBytes: number;
  numTensors: number;
  /**
   * The worker's traced graphs (kernels/graph-cache.ts, kernels/sample-graph.ts, step-graph.ts):
   * sampling and loss graphs traced since it started, those cached now and their estimated bytes
   * (GraphFunction.heldBytes, bounded by VELA_GRAPH_CACHE_BYTES). Absent from stubs.
   */
  graphs?: { traced: number; cached: number; cachedOps: number; cachedBytes: number };
}

/** Worker -> main. Answers carry the worker's memory after the op (for GET /metrics). */
export type FromWorker =
  | { kind: 'ready'; info: EngineInfo; memory?: EngineMemory }
  | { kind: 'probed'; backend: BackendInfo }
  | { kind: 'init_failed'; error: string }
  | { kind: 'result'; callId: number; result: unknown; memory?: EngineMemory }
  | { kind: 'error'; callId: number; error: string; code: string; internal: boolean; stack?: string; memory?: EngineMemory }
  | { kind: 'log'; level: 'info' | 'warn' | 'error' | 'debug'; message: string };

/** The TF.js backend an engine runs on (kernels/backend/backend.ts BackendReport, as sent between threads). */
export interface BackendInfo {
  /** `tensorflow`, `wasm` or `cpu`: what session info and /health call `backend`. */
  name: string;
  /** As VELA_BACKEND spells it: `node-gpu`, `node`, `wasm`, `cpu`. */
  kind: string;
  /** Where ops run: device, library version, thread pools, GPU memory policy. */
  device: string;
  /** Faster backends not in use, each "kind: reason". */
  fallbacks: string[];
  /** One calm line: the backend, where it runs, and why faster ones are not in use. */
  line: string;
}

/** What an engine reports once its model is ready. */
export interface EngineInfo {
  /** The exported model name: a small preset, or `pi0` / `pi05` for the real models. */
  preset: string;
  /** `small` (Vela's presets, byte prompts) or the real variant (PaliGemma prompts, kernels/pi). */
  family: 'small' | 'pi0' | 'pi05';
  /** The real model's checkpoint folder; null for presets. */
  baseDir: string | null;
  /** The prompt padding id (256 for presets' bytes, PaliGemma's `<pad>` 0). */
  padToken: number;
  backend: string;
  backendKind: string;
  backendDevice: string;
  backendFallbacks: string[];
  /** BackendInfo.line: what the CLIs print. */
  backendLine: string;
  imageSize: number;
  imageSlots: number;
  stateDim: number;
  actionDim: number;
  actionHorizon: number;
  maxTokenLen: number;
  baseParams: number;
  /**
   * Whether this engine runs the sampler (and the small family's training step) as TensorFlow
   * graphs (kernels/backend/graph.ts): native backend, VELA_GRAPHS not 0, a model of at most
   * 200 M parameters. The first call of each batch layout then pays a trace.
   */
  graphs?: boolean;
}

/** An error of an engine op that a client caused (bad args, wrong state): safe to show. */
export class EngineError extends Error {
  constructor(readonly code: string, message: string) {
    super(message);
    this.name = 'EngineError';
  }
}
