/**
 * Step latency: forward_backward + optim_step of one session, first in-process (Engine.call on an
 * engine worker of this process, the batch already decoded, buffers transferred), then over the
 * session websocket from the TypeScript client against the bench server (frames encoded with the
 * request codec, decoded by the server). Both wait for each answer before the next request, so
 * the difference is what the protocol costs one step: encode, send, decode, frame decoding, the
 * answer's way back. The two engines (this process's and the server's) are separate workers of
 * the same code; only one computes at a time.
 */
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { fileURLToPath } from 'node:url';
import { VelaClient, type Datum } from '../protocol/client.ts';
import { pack } from '../protocol/msgpack.ts';
import { ndarray, packNumpy, toWire } from '../protocol/ndarray.ts';
import { makeConfig } from '../kernels/small/config.ts';
import type { ModelBatch } from '../kernels/small/batch.ts';
import { Engine } from '../server/engine/host.ts';
import { batchBuffers } from '../kernels/small/batch.ts';
import { cloneBatch, toModelBatch, CAMERA_NAMES, type RawSample } from './data.ts';
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

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

/**
 * The Python that runs the package's path: $VELA_BENCH_PYTHON, else the test suite's .venv (made by
 * `npm test`), with clients/python/src on its path. Returns the interpreter, or why there is none.
 */
export function benchPython(): { python: string } | { reason: string } {
  const python = process.env.VELA_BENCH_PYTHON ?? path.join(ROOT, '.venv', 'bin', 'python');
  if (!fs.existsSync(python)) return { reason: `no Python environment at ${python} (npm test makes .venv; or set VELA_BENCH_PYTHON)` };
  const probe = spawnSync(python, ['-c', 'import vela, numpy'], { env: { ...process.env, PYTHONPATH: path.join(ROOT, 'clients/python/src') }, encoding: 'utf8', timeout: 60_000 });
  if (probe.status !== 0) return { reason: `${python} cannot import the vela package: ${(probe.stderr || probe.error?.message || '').trim().split('\n').at(-1)}` };
  return { python };
}

/**
 * A session driven by the Python package (bench/python_step.py) on the bench server: frames as
 * the camera gives them (uint8 [H, W, 3] numpy arrays), which the package shrinks to the model's
 * image_size and sends with its default codec, RAW, as a user's loop sends them; one step =
 * forward_backward(...).result() + optim_step(...).result().
 */
export async function pySession(python: string, server: ServerProc, preset: string, samples: readonly RawSample[], finetune: 'lora' | 'full'): Promise<{ step: () => Promise<number>; requestBytes: number; close: () => Promise<void> }> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-bench-py-'));
  const file = path.join(dir, 'datums.msgpack');
  fs.writeFileSync(file, packNumpy(samples.map((s) => ({
    observation: {
      image: Object.fromEntries(s.frames.map((f, k) => [CAMERA_NAMES[k]!, ndarray(f.data, [f.height, f.width, 3])])),
      state: ndarray(s.state, [s.state.length]), prompt: s.prompt,
    },
    actions: ndarray(s.actions, [s.actions.length / s.actionDim, s.actionDim]),
  }))));
  const child = spawn(python, [path.join(ROOT, 'bench', 'python_step.py'), server.baseUrl, server.apiKey, preset, finetune, file], {
    env: { ...process.env, PYTHONPATH: path.join(ROOT, 'clients/python/src') }, stdio: ['pipe', 'pipe', 'pipe'],
  });
  // The tail only (what an error quotes): a chatty child cannot grow it without bound.
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => {
    stderr = (stderr + d.toString()).slice(-10_000);
  });
  const lines = readline.createInterface({ input: child.stdout! })[Symbol.asyncIterator]();
  const next = async (what: string): Promise<string> => {
    const r = await lines.next();
    if (r.done) throw new Error(`bench/python_step.py exited before ${what}: ${stderr.trim().split('\n').slice(-5).join(' | ')}`);
    return r.value;
  };
  const ready = /^ready (\d+)$/.exec(await next('the session was open'));
  if (!ready) throw new Error('bench/python_step.py did not say ready');
  return {
    requestBytes: Number(ready[1]),
    step: async () => {
      child.stdin!.write('step\n');
      return Number(await next('a step\'s time'));
    },
    close: async () => {
      child.stdin!.end('close\n');
      await new Promise((r) => child.once('exit', r));
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

/**
 * Both paths on the same datums. Steps alternate (in-process, websocket, in-process, ...) so
 * that both see the same background load of a shared machine. With `samples` (the datums' raw
 * frames, uint8 [480, 640, 3] per camera) a third path runs each round: the same step through
 * the Python package (pySession), or `pythonSkipped` says why not (benchPython).
 * @throws Error when a path fails (the Python child's stderr tail in the message).
 */
export async function runStep(engine: Engine, server: ServerProc, datums: Datum[], setup: StepSetup, samples: readonly RawSample[] = []): Promise<StepResult> {
  const batch = await toModelBatch(makeConfig(setup.preset), datums, setup.codec);
  const a = await inprocSession(engine, batch, setup.finetune);
  const b = await wsSession(server, setup.preset, datums, setup.codec, setup.finetune);
  // The Python package's path, on the same samples (its own frames: raw, at the camera's size).
  const py = samples.length > 0 ? benchPython() : { reason: 'no raw samples given' };
  const c = 'python' in py ? await pySession(py.python, server, setup.preset, samples, setup.finetune) : null;
  const inproc: number[] = [];
  const ws: number[] = [];
  const pyMs: number[] = [];
  let pipelinedInproc = 0;
  let pipelinedWs = 0;
  try {
    for (let i = 0; i < setup.burnIn + setup.steps; i++) {
      for (const [s, out] of [[a, inproc], [b, ws]] as const) {
        const t0 = performance.now();
        await s.step();
        if (i >= setup.burnIn) out.push(performance.now() - t0);
      }
      // Timed inside Python, as the user's loop sees it; paired with this round's in-process step.
      if (c) {
        const ms = await c.step();
        if (i >= setup.burnIn) pyMs.push(ms);
      }
    }
    // Pipelined: the websocket client one step ahead, against in-process steps (no frames to
    // decode, so pipelining would gain nothing there), means of the same number of steps.
    pipelinedInproc = (await timeCalls(setup.steps, 0, a.step)).reduce((x, y) => x + y, 0) / setup.steps;
    pipelinedWs = await b.pipelined(setup.steps);
  } finally {
    await a.close();
    await b.close();
    await c?.close();
  }
  const sa = summarize(inproc);
  const sb = summarize(ws);
  const python = c
    ? { codec: 'RAW', summary: summarize(pyMs), overheadPaired: quantile(inproc.map((x, i) => (pyMs[i]! - x) / x), 0.5), requestBytes: c.requestBytes, samplesMs: pyMs }
    : null;
  return {
    python, ...(python ? {} : { pythonSkipped: (py as { reason: string }).reason }),
    preset: setup.preset, batch: datums.length, cameras: setup.cameras, codec: setup.codec, finetune: setup.finetune,
    inproc: sa, ws: sb, overhead: (sb.p50 - sa.p50) / sa.p50,
    overheadPaired: quantile(inproc.map((x, i) => (ws[i]! - x) / x), 0.5),
    pipelined: { inprocMsPerStep: pipelinedInproc, wsMsPerStep: pipelinedWs, overhead: (pipelinedWs - pipelinedInproc) / pipelinedInproc },
    requestBytes: pack(toWire({ id: 1, op: 'forward_backward', data: datums, codec: setup.codec })).length,
    samplesMs: { inproc, ws },
  };
}
