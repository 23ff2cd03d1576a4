/**
 * What a robot waits for (issue 25): in one run, taking turns in blocks of a few calls,
 *  1. the engine's sampler alone (kernels/trainer.ts sampleActions, the call the engine worker
 *     makes for a policy), batch 1, one camera, in this process on the backend the server picks
 *     (VELA_BACKEND, default auto), with graphs (kernels/sample-graph.ts) and with VELA_GRAPHS=0
 *     (eager), and on wasm; for flow05-tiny, flow0-tiny and the real
 *     architecture's tiny pi0.5 / pi0 (kernels/pi);
 *  2. PyTorch sampling of the same models (bench/torch_reference.py --sample-serve): Vela's own
 *     weights for the small presets, the contract init (the same values as Vela's) for the real
 *     tiny configs; prefix keys/values once, 10 Euler steps, the same noise, on as many threads as
 *     TensorFlow's intra-op pool; the largest difference of the actions from Vela's is recorded;
 *  3. the policy server's round trip (an OpenPI client, protocol/policy-client.ts) on flow05-tiny:
 *     1 and 3 cameras, JPEG and RAW frames, batch 1 (one client) and 8 (eight clients sending at
 *     once, which the server's batcher runs as one engine call), against PyTorch's sampling of
 *     the same batch size and cameras.
 * Every call waits for its answer's data. PyTorch is left out, with the reason, when python3
 * cannot import torch (as the torch part does).
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { activateBackend, initBackend, type BackendKind } from '../kernels/backend/backend.ts';
import { graphsAvailable } from '../kernels/backend/graph.ts';
import type { FlowPolicy, PolicyWeights } from '../kernels/flow-policy.ts';
import { REAL_PI_TINY_PI0, REAL_PI_TINY_PI05, realPiPolicy, type RealPiBatch, type RealPiConfig } from '../kernels/pi/index.ts';
import { Rng } from '../kernels/rng.ts';
import { encodeSafetensors, type SafeTensor } from '../kernels/safetensors.ts';
import { makeConfig } from '../kernels/small/config.ts';
import { BaseWeights, sampleActions } from '../kernels/trainer.ts';
import { toDatums, toModelBatch, type RawSample } from './data.ts';
import { PolicyConnection } from '../protocol/policy-client.ts';
import { makeCheckpoint, observationMessage } from './policy.ts';
import type { InferLatency, InferResult, InferRoundTripRow, InferSampleRow, InferTorchRow } from './schema.ts';
import { ServerProc } from './server-proc.ts';
import { quantile, summarize, timeCalls } from './stats.ts';
import { TorchProcess, torchUnavailable } from './torch.ts';

/** Calls per block when the rows take turns. */
export const INFER_BLOCK = 5;
/** The model whose policy server round trip is measured. */
const SERVED = 'flow05-tiny';
/** Clients sending at once for the batch-8 round trip. */
const BATCH8 = 8;

/** summarize() plus p90, ms. */
function latency(xs: number[]): InferLatency {
  return { ...summarize(xs), p90: quantile(xs, 0.9) };
}

/** A measured series: `block(n)` runs n calls and returns each one's ms. */
interface Series {
  block: (n: number) => Promise<number[]>;
  samples: number[];
}

/** One model the sampler rows run: its policy, its batch, the noise, and PyTorch's inputs. */
interface Model {
  name: string;
  policy: FlowPolicy<any, any>;
  batch: unknown;
  noise: Float32Array;
  /** Written for torch_reference.py --sample-serve's load request. */
  torchInputs: Record<string, SafeTensor>;
  torchLoad: Record<string, unknown>;
  backends: BackendKind[];
}

const f32 = (shape: number[], data: Float32Array): SafeTensor => ({ dtype: 'F32', shape, data });

function smallModel(preset: string, batch: Awaited<ReturnType<typeof toModelBatch>>, backends: BackendKind[], dir: string): Model {
  const c = makeConfig(preset);
  const base = BaseWeights.create(c, 0);
  fs.writeFileSync(path.join(dir, 'weights.safetensors'), encodeSafetensors(Object.fromEntries(Object.entries(base.exportWeights()).map(([k, t]) => [k, f32(t.shape, t.data)]))));
  base.dispose();
  const S = c.imageSize;
  const noise = new Rng(5).normals(c.horizon * c.actionDim);
  return {
    name: preset, policy: base.policy, batch, noise, backends,
    torchLoad: { preset, dir },
    torchInputs: {
      images: { dtype: 'U8', shape: [1, 1, S, S, 3], data: batch.images.subarray(0, S * S * 3) },
      tokens: { dtype: 'I32', shape: [1, c.maxTokenLen], data: batch.tokens },
      token_mask: { dtype: 'U8', shape: [1, c.maxTokenLen], data: batch.tokenMask },
      state: f32([1, c.stateDim], batch.state),
      noise: f32([1, c.horizon, c.actionDim], noise),
    },
  };
}

/** The real architecture's tiny config: a batch as bench/real-pi-sample.ts builds it (20 prompt tokens, the rest padding). */
function realModel(config: RealPiConfig, backends: BackendKind[], dir: string): Model {
  const S = config.vision.imageSize;
  const L = config.maxTokenLen;
  const batch: RealPiBatch = {
    size: 1,
    numCameras: 1,
    images: new Float32Array(3 * S * S).map((_, i) => Math.sin(i * 0.37)),
    imageMasks: [1],
    tokens: Int32Array.from({ length: L }, (_, i) => (i < 20 ? 2 + i * 97 : 0)),
    tokenMasks: Uint8Array.from({ length: L }, (_, i) => (i < 20 ? 1 : 0)),
    state: new Float32Array(config.stateDim).fill(0.1),
  };
  const noise = new Float32Array(config.actionHorizon * config.actionDim).map((_, i) => Math.cos(i));
  return {
    name: `real ${config.variant} tiny`, policy: realPiPolicy(config), batch, noise, backends,
    torchLoad: { real: config.variant, dir },
    torchInputs: {
      images: f32([1, 1, 3, S, S], batch.images),
      tokens: { dtype: 'I32', shape: [1, L], data: batch.tokens },
      token_mask: { dtype: 'U8', shape: [1, L], data: batch.tokenMasks as Uint8Array },
      state: f32([1, config.stateDim], batch.state!),
      noise: f32([1, config.actionHorizon, config.actionDim], noise),
    },
  };
}

const maxAbsDiff = (a: ArrayLike<number>, b: ArrayLike<number>) => {
  if (a.length !== b.length) return Infinity;
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
};

export interface InferOptions {
  /** Timed calls per row. */
  calls: number;
  /** Untimed calls per row first (a graph's trace, caches). */
  burnIn: number;
  /** G1 samples with 3 cameras (at least 1; 2 are trained into the served checkpoint). */
  samples: RawSample[];
  say: (line: string) => void;
}

/**
 * Runs the three kinds of rows in turns (blocks of INFER_BLOCK calls, every row per turn) until
 * each has `calls` timed calls. Starts its own server process for the round trips.
 * @throws Error when a backend, the server or torch_reference.py fails (with its stderr).
 */
export async function runInfer(opts: InferOptions): Promise<InferResult> {
  const notes: string[] = [];
  const report = await initBackend(process.env.VELA_BACKEND ?? 'auto', null);
  const home = report.kind;
  const threads = report.threads?.intraOp ?? 1;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-infer-'));
  const torchWhy = torchUnavailable();
  let torch: TorchProcess | null = null;
  let server: ServerProc | null = null;
  const clients: PolicyConnection[] = [];
  const bases: BaseWeights<any, any>[] = [];
  try {
    // Vela's sampler rows: per model, its backends; graphs on and off where the home backend is native.
    const one = opts.samples.slice(0, 1).map((s) => ({ ...s, frames: s.frames.slice(0, 1) }));
    const backends: BackendKind[] = home === 'wasm' ? ['wasm'] : [home, 'wasm'];
    const models: Model[] = [];
    for (const preset of ['flow05-tiny', 'flow0-tiny']) {
      const sub = path.join(dir, preset);
      fs.mkdirSync(sub);
      models.push(smallModel(preset, await toModelBatch(makeConfig(preset), await toDatums(one, 'JPEG'), 'JPEG'), backends, sub));
    }
    for (const config of [REAL_PI_TINY_PI05, REAL_PI_TINY_PI0]) {
      const sub = path.join(dir, config.variant);
      fs.mkdirSync(sub);
      models.push(realModel(config, backends, sub));
    }
    const series: Series[] = [];
    const sampleRows: { row: Omit<InferSampleRow, 'ms' | 'samplesMs' | 'torchRatio'>; s: Series; model: Model; base: BaseWeights<any, any> }[] = [];
    for (const m of models) {
      for (const kind of m.backends) {
        await activateBackend(kind);
        const base = BaseWeights.create(m.policy as FlowPolicy<unknown, unknown>, 0);
        bases.push(base);
        const view: PolicyWeights = base.view();
        const modes = graphsAvailable() ? [true, false] : [false];
        for (const graphs of modes) {
          const call = () => sampleActions(m.policy, view, m.batch, new Rng(0), { noise: m.noise });
          const block = async (n: number) => {
            await activateBackend(kind);
            return withGraphs(graphs, () => timeCalls(n, 0, call));
          };
          opts.say(`infer: ${m.name} sample() on ${kind}${graphs ? ' (graphs)' : modes.length > 1 ? ' (eager)' : ''}: burn-in`);
          await block(opts.burnIn);
          const s: Series = { block, samples: [] };
          series.push(s);
          sampleRows.push({
            model: m,
            s,
            base,
            row: {
              model: m.name, backend: kind, graphs, graphUsed: graphs && m.policy.sampleInputs !== undefined, batch: 1, cameras: 1,
              maxAbsDiffTorch: null, maxAbsDiffHome: null,
            },
          });
        }
      }
    }
    // PyTorch's rows.
    const torchRows: { row: Omit<InferTorchRow, 'ms' | 'samplesMs'>; s: Series }[] = [];
    let torchVersion: string | null = null;
    const torchActions = new Map<string, number[]>();
    if (torchWhy) notes.push(`infer: PyTorch left out: ${torchWhy}`);
    else {
      torch = TorchProcess.start(['--sample-serve', '--threads', String(threads)]);
      const head = await torch.next();
      torchVersion = head.torch_version as string;
      for (const m of models) {
        fs.writeFileSync(path.join(m.torchLoad.dir as string, 'inputs.safetensors'), encodeSafetensors(m.torchInputs));
        opts.say(`infer: PyTorch loads ${m.name}`);
        const got = await torch.ask({ load: m.name, ...m.torchLoad });
        torchActions.set(m.name, got.actions as number[]);
        const layouts = m.name === SERVED ? [[1, 1], [1, 3], [BATCH8, 1], [BATCH8, 3]] : [[1, 1]];
        for (const [batch, cameras] of layouts) {
          const t = torch;
          const block = async (n: number) => (await t.ask({ time: m.name, batch, cameras, n })).ms as number[];
          await block(opts.burnIn);
          const s: Series = { block, samples: [] };
          series.push(s);
          torchRows.push({ row: { model: m.name, batch: batch!, cameras: cameras! }, s });
        }
      }
    }
    // The policy server's round trips.
    opts.say(`infer: starting a ${SERVED} server and serving a full fine-tune checkpoint`);
    server = await ServerProc.start(SERVED);
    const ckpt = await makeCheckpoint(server, SERVED, opts.samples.slice(0, 2), 'full');
    const url = await server.startPolicy(ckpt);
    for (let i = 0; i < BATCH8; i++) clients.push(await PolicyConnection.open(url));
    // Batch 1 is a lone robot: a policy server of its own with one client connected. (With other
    // robots connected but silent, the batcher holds a request up to its window, 5 ms, for company.)
    const loneUrl = await server.startPolicy(ckpt, true);
    const lone = await PolicyConnection.open(loneUrl);
    clients.push(lone);
    // The policy servers' batcher counts (GET /stats): how many engine calls a row's requests made.
    const statsOf = (u: string) => `${u.replace(/^ws/, 'http').replace(/\/$/, '')}/stats`;
    const batchStats = async (batch: number) => (await (await fetch(statsOf(batch === 1 ? loneUrl : url))).json()) as { requests: number; batches: number };
    const tripRows: { row: Omit<InferRoundTripRow, 'ms' | 'samplesMs' | 'serverInferMs' | 'torchP50' | 'ratio' | 'serverBatchMean'>; s: Series; inferMs: number[]; counted: { requests: number; batches: number } }[] = [];
    for (const batch of [1, BATCH8]) {
      for (const cameras of [1, 3]) {
        for (const codec of ['JPEG', 'RAW'] as const) {
          const { bytes } = await observationMessage(opts.samples[0]!, cameras, { codec, zstd: false }, notes);
          const inferMs: number[] = [];
          const round = async () => {
            const answers = await Promise.all((batch === 1 ? [lone] : clients.slice(0, batch)).map((c) => c.infer(bytes)));
            inferMs.push(Math.max(...answers.map((a) => Number(a.policy_timing?.infer_ms ?? NaN))));
          };
          const counted = { requests: 0, batches: 0 };
          const block = async (n: number) => {
            const a = await batchStats(batch);
            const out = await timeCalls(n, 0, round);
            const b = await batchStats(batch);
            counted.requests += b.requests - a.requests;
            counted.batches += b.batches - a.batches;
            return out;
          };
          await block(opts.burnIn);
          inferMs.length = 0;
          counted.requests = counted.batches = 0;
          const s: Series = { block, samples: [] };
          series.push(s);
          tripRows.push({ row: { model: SERVED, cameras, codec, batch, messageBytes: bytes.byteLength }, s, inferMs, counted });
        }
      }
    }

    opts.say(`infer: ${series.length} rows, ${opts.calls} calls each, in turns of ${INFER_BLOCK}`);
    for (let turn = 0; series.some((s) => s.samples.length < opts.calls); turn++) {
      for (const s of series) {
        const n = Math.min(INFER_BLOCK, opts.calls - s.samples.length);
        if (n > 0) s.samples.push(...(await s.block(n)));
      }
      if (turn % 2 === 1) opts.say(`infer: ${series.reduce((a, s) => a + s.samples.length, 0)} of ${series.length * opts.calls} calls`);
    }

    const torchOut: InferTorchRow[] = torchRows.map((t) => ({ ...t.row, ms: latency(t.s.samples), samplesMs: t.s.samples }));
    const torchP50 = (model: string, batch: number, cameras: number) => torchOut.find((t) => t.model === model && t.batch === batch && t.cameras === cameras)?.ms.p50 ?? null;
    const sample: InferSampleRow[] = sampleRows.map((r) => {
      const ms = latency(r.s.samples);
      const tp = torchP50(r.model.name, 1, 1);
      return { ...r.row, ms, samplesMs: r.s.samples, torchRatio: tp === null ? null : ms.p50 / tp };
    });
    // The answers: each row's against PyTorch's and against its model's first row (home backend, graphs).
    for (const [i, r] of sampleRows.entries()) {
      const ours = await answer(r.model, r.row.backend as BackendKind, r.row.graphs, r.base);
      const theirs = torchActions.get(r.model.name);
      sample[i]!.maxAbsDiffTorch = theirs ? maxAbsDiff(ours, theirs) : null;
      // Float32 rounding of the same model from the same noise stays near 1e-6 (actions of order 1).
      if ((sample[i]!.maxAbsDiffTorch ?? 0) > 1e-4) notes.push(`infer: ${r.model.name} on ${r.row.backend}: the actions differ from PyTorch's by up to ${sample[i]!.maxAbsDiffTorch!.toExponential(1)}; not the same model?`);
      const first = sampleRows.findIndex((x) => x.model === r.model);
      sample[i]!.maxAbsDiffHome = i === first ? 0 : maxAbsDiff(ours, await answer(r.model, home, sampleRows[first]!.row.graphs, sampleRows[first]!.base));
    }
    const roundTrip: InferRoundTripRow[] = tripRows.map((r) => {
      const ms = latency(r.s.samples);
      const tp = torchP50(SERVED, r.row.batch, r.row.cameras);
      const finite = r.inferMs.filter(Number.isFinite);
      return { ...r.row, ms, serverBatchMean: r.counted.batches ? r.counted.requests / r.counted.batches : null, serverInferMs: finite.length ? quantile(finite, 0.5) : null, torchP50: tp, ratio: tp === null ? null : ms.p50 / tp, samplesMs: r.s.samples };
    });
    await activateBackend(home);
    return {
      backend: report.line, backendName: report.name, threads, torchVersion, blockCalls: INFER_BLOCK, callsPerRow: opts.calls, sample, torch: torchOut, roundTrip, notes,
    };
  } finally {
    for (const c of clients) await c.close().catch(() => undefined);
    await server?.close();
    torch?.close();
    for (const b of bases) b.dispose();
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

/** Runs `fn` with graphs allowed (VELA_GRAPHS as it was) or turned off (VELA_GRAPHS=0), then restores the variable. */
async function withGraphs<T>(graphs: boolean, fn: () => T | Promise<T>): Promise<T> {
  const before = process.env.VELA_GRAPHS;
  if (!graphs) process.env.VELA_GRAPHS = '0';
  try {
    return await fn();
  } finally {
    if (before === undefined) delete process.env.VELA_GRAPHS;
    else process.env.VELA_GRAPHS = before;
  }
}

/** One untimed sample of `m` on `kind` (graphs on or off), for the agreement columns. */
async function answer(m: Model, kind: BackendKind, graphs: boolean, base: BaseWeights<any, any>): Promise<Float32Array> {
  await activateBackend(kind);
  return withGraphs(graphs, () => sampleActions(m.policy, base.view(), m.batch, new Rng(0), { noise: m.noise }));
}
