/**
 * Messages between the main thread (engine host) and an engine worker. Large arrays travel as
 * transferred ArrayBuffers, never copied.
 */

/** Main -> worker. */
export type ToWorker =
  | { kind: 'init'; preset: string; backend: string; seed: number; baseWeightsPath?: string; maxResident?: number }
  | { kind: 'call'; callId: number; session: string; op: string; args: Record<string, unknown> };

/** Worker -> main. */
export type FromWorker =
  | { kind: 'ready'; info: EngineInfo }
  | { kind: 'init_failed'; error: string }
  | { kind: 'result'; callId: number; result: unknown }
  | { kind: 'error'; callId: number; error: string; code: string; internal: boolean; stack?: string }
  | { kind: 'log'; level: 'info' | 'warn' | 'error'; message: string };

/** What an engine reports once its model is ready. */
export interface EngineInfo {
  preset: string;
  backend: string;
  backendFallbacks: string[];
  imageSize: number;
  imageSlots: number;
  stateDim: number;
  actionDim: number;
  actionHorizon: number;
  maxTokenLen: number;
  baseParams: number;
}

/** An error of an engine op that a client caused (bad args, wrong state): safe to show. */
export class EngineError extends Error {
  constructor(readonly code: string, message: string) {
    super(message);
    this.name = 'EngineError';
  }
}
