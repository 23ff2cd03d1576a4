/**
 * Step latency: forward_backward + optim_step of one session, first in-process (Engine.call on an
 * engine worker of this process, the batch already decoded, buffers transferred), then over the
 * session websocket from the TypeScript client against the bench server (frames encoded with the
 * request codec, decoded by the server). Both wait for each answer before the next request, so
 * the difference is what the protocol costs one step: encode, send, decode, frame decoding, the
 * answer's way back.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { VelaClient, type Datum } from '../protocol/client.ts';
import { pack } from '../protocol/msgpack.ts';
import { toWire } from '../protocol/ndarray.ts';
import { makeConfig } from '../kernels/config.ts';
import type { ModelBatch } from '../kernels/batch.ts';
import { Engine } from '../server/engine/host.ts';
import { batchTransfer, cloneBatch, toModelBatch } from './data.ts';
import { summarize, timeCalls } from './stats.ts';
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

/** Session options shared by both paths (the server's defaults for LoRA). */
export function sessionOptions(finetune: 'lora' | 'full') {
  return { finetune, rank: 16, alpha: 32, targets: ['all'], seed: 0 };
}

/**
 * Times `steps` in-process steps (after `burnIn`) on a fresh engine session; returns ms per step.
 * The engine is the caller's; the session is closed at the end.
 */
export async function inprocSteps(engine: Engine, batch: ModelBatch, finetune: 'lora' | 'full', steps: number, burnIn: number): Promise<number[]> {
  const id = `bench-inproc-${Math.random().toString(36).slice(2)}`;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-bench-inproc-'));
  await engine.call(id, 'create_session', { ...sessionOptions(finetune), dir });
  try {
    return await timeCalls(steps, burnIn, async () => {
      const b = cloneBatch(batch); // the engine takes the buffers
      await engine.call(id, 'forward_backward', { batch: b, lossFn: 'mse' }, batchTransfer(b));
      await engine.call(id, 'optim_step', { learningRate: 1e-5 });
    });
  } finally {
    await engine.call(id, 'close_session');
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

/** Times `steps` steps over the websocket on a fresh session of the bench server; ms per step. */
export async function wsSteps(server: ServerProc, preset: string, datums: Datum[], codec: string, finetune: 'lora' | 'full', steps: number, burnIn: number): Promise<number[]> {
  const client = new VelaClient(server.baseUrl, server.apiKey);
  const s = await client.waitReady((await client.createSession({ base_model: preset, ...sessionOptions(finetune) })).id);
  const conn = await client.connect(s);
  try {
    return await timeCalls(steps, burnIn, async () => {
      await conn.forwardBackward(datums, { codec });
      await conn.optimStep({ learning_rate: 1e-5 });
    });
  } finally {
    await conn.close();
    await client.closeSession(s.id);
  }
}

/** Both paths on the same datums; returns the step part of the result. */
export async function runStep(engine: Engine, server: ServerProc, datums: Datum[], setup: StepSetup): Promise<StepResult> {
  const batch = await toModelBatch(makeConfig(setup.preset), datums, setup.codec);
  const inproc = await inprocSteps(engine, batch, setup.finetune, setup.steps, setup.burnIn);
  const ws = await wsSteps(server, setup.preset, datums, setup.codec, setup.finetune, setup.steps, setup.burnIn);
  const a = summarize(inproc);
  const b = summarize(ws);
  return {
    preset: setup.preset, batch: datums.length, cameras: setup.cameras, codec: setup.codec, finetune: setup.finetune,
    inproc: a, ws: b, overhead: (b.p50 - a.p50) / a.p50,
    requestBytes: pack(toWire({ id: 1, op: 'forward_backward', data: datums, codec: setup.codec })).length,
    samplesMs: { inproc, ws },
  };
}
