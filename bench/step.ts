/**
 * Step latency: forward_backward + optim_step of one session, first in-process (Engine.call on an
 * engine worker of this process, the batch already decoded, buffers transferred), then over the
 * session websocket from the TypeScript client against the bench server (frames encoded with the
 * request codec, decoded by the server). Both wait for each answer before the next request, so
 * the difference is what the protocol costs one step: encode, send, decode, frame decoding, the
 * answer's way back. The two engines (this process's and the server's) are separate workers of
 * the same code; only one computes at a time.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { VelaClient, type Datum } from '../protocol/client.ts';
import { pack } from '../protocol/msgpack.ts';
import { toWire } from '../protocol/ndarray.ts';
import { makeConfig } from '../kernels/small/config.ts';
import type { ModelBatch } from '../kernels/small/batch.ts';
import { Engine } from '../server/engine/host.ts';
import { batchBuffers } from '../kernels/small/batch.ts';
import { cloneBatch, toModelBatch } from './data.ts';
import { quantile, summarize, timeCalls } from './stats.ts';
import type { StepResult } from './schema.ts';
import type { ServerProc } from './server-proc.ts';

export interface StepSetup {
  preset: string;
  finetune: 'lora' | 'full';
  codec: string;
  cameras: number;
  steps: number;
  burnIn: number;
}

/**
 * Session options shared by both paths: the server's LoRA defaults for a LoRA session; a full
 * session takes no rank, alpha or targets (the server refuses them there).
 */
export function sessionOptions(finetune: 'lora' | 'full') {
  return finetune === 'lora' ? { finetune, rank: 16, alpha: 32, targets: ['all'], seed: 0 } : { finetune, seed: 0 };
}

/** An open in-process session: one step = forward_backward + optim_step via Engine.call. */
export async function inprocSession(engine: Engine, batch: ModelBatch, finetune: 'lora' | 'full'): Promise<{ step: () => Promise<void>; close: () => Promise<void> }> {
  const id = `bench-inproc-${Math.random().toString(36).slice(2)}`;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-bench-inproc-'));
  await engine.call(id, 'create_session', { ...sessionOptions(finetune), dir });
  return {
    step: async () => {
      const b = cloneBatch(batch); // the engine takes the buffers
      await engine.call(id, 'forward_backward', { batch: b, lossFn: 'mse' }, batchBuffers(b));
      await engine.call(id, 'optim_step', { learningRate: 1e-5 });
    },
    close: async () => {
      await engine.call(id, 'close_session');
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** An open session over the websocket of the bench server: one step = the same two ops, awaited. */
export async function wsSession(server: ServerProc, preset: string, datums: Datum[], codec: string, finetune: 'lora' | 'full'): Promise<{ step: () => Promise<void>; pipelined: (steps: number) => Promise<number>; close: () => Promise<void> }> {
  const client = new VelaClient(server.baseUrl, server.apiKey);
  const s = await client.waitReady((await client.createSession({ base_model: preset, ...sessionOptions(finetune) })).id);
  const conn = await client.connect(s);
  return {
    step: async () => {
      await conn.forwardBackward(datums, { codec });
      await conn.optimStep({ learning_rate: 1e-5 });
    },
    // Steps sent without waiting, one step ahead (PROTOCOL.md: requests pipeline, answers come
    // in order), so the server decodes step n + 1's frames while the engine computes step n.
    // Returns the mean ms per step.
    pipelined: async (steps: number) => {
      const t0 = performance.now();
      let prev: Promise<unknown> = Promise.resolve();
      for (let i = 0; i < steps; i++) {
        const fb = conn.forwardBackward(datums, { codec });
        const opt = conn.optimStep({ learning_rate: 1e-5 });
        await prev;
        prev = Promise.all([fb, opt]);
      }
      await prev;
      return (performance.now() - t0) / steps;
    },
    close: async () => {
      await conn.close();
      await client.closeSession(s.id);
    },
  };
}

/**
 * Both paths on the same datums. Steps alternate (in-process, websocket, in-process, ...) so
 * that both see the same background load of a shared machine.
 */
export async function runStep(engine: Engine, server: ServerProc, datums: Datum[], setup: StepSetup): Promise<StepResult> {
  const batch = await toModelBatch(makeConfig(setup.preset), datums, setup.codec);
  const a = await inprocSession(engine, batch, setup.finetune);
  const b = await wsSession(server, setup.preset, datums, setup.codec, setup.finetune);
  const inproc: number[] = [];
  const ws: number[] = [];
  let pipelinedInproc = 0;
  let pipelinedWs = 0;
  try {
    for (let i = 0; i < setup.burnIn + setup.steps; i++) {
      for (const [s, out] of [[a, inproc], [b, ws]] as const) {
        const t0 = performance.now();
        await s.step();
        if (i >= setup.burnIn) out.push(performance.now() - t0);
      }
    }
    // Pipelined: the websocket client one step ahead, against in-process steps (no frames to
    // decode, so pipelining would gain nothing there), means of the same number of steps.
    pipelinedInproc = (await timeCalls(setup.steps, 0, a.step)).reduce((x, y) => x + y, 0) / setup.steps;
    pipelinedWs = await b.pipelined(setup.steps);
  } finally {
    await a.close();
    await b.close();
  }
  const sa = summarize(inproc);
  const sb = summarize(ws);
  return {
    preset: setup.preset, batch: datums.length, cameras: setup.cameras, codec: setup.codec, finetune: setup.finetune,
    inproc: sa, ws: sb, overhead: (sb.p50 - sa.p50) / sa.p50,
    overheadPaired: quantile(inproc.map((x, i) => (ws[i]! - x) / x), 0.5),
    pipelined: { inprocMsPerStep: pipelinedInproc, wsMsPerStep: pipelinedWs, overhead: (pipelinedWs - pipelinedInproc) / pipelinedInproc },
    requestBytes: pack(toWire({ id: 1, op: 'forward_backward', data: datums, codec: setup.codec })).length,
    samplesMs: { inproc, ws },
  };
}
