/**
 * Running one session request: decode its frames and arrays into the model's batch layout (on
 * the main thread; sharp decodes off the event loop), then hand it to the engine, then shape the
 * result for the wire. A session's engine calls are chained in request order; frame decoding of
 * request n + 1 overlaps the engine's work on request n.
 */
import fs from 'node:fs';
import { ProtocolError } from '../../protocol/errors.ts';
import { decodeFrameResized } from '../../protocol/frames.ts';
import { ndarray, type NDArray } from '../../protocol/ndarray.ts';
import type { SessionRequest, WireDatum } from '../../protocol/messages.ts';
import { batchBuffers, makeBatch, type BatchLayout, type DatumInput, type ModelBatch } from '../../kernels/small/batch.ts';
import type { ServerConfig } from '../config.ts';
import { checkStorage, storageOf } from '../store/storage.ts';
import { EngineError } from '../engine/messages.ts';
import { HttpError } from '../http/http.ts';
import { planOrRefuse } from '../models/plan.ts';
import { availableMemory, checkFits, memoryLedger } from '../models/memory.ts';
import { makeConfig } from '../../kernels/small/config.ts';
import { estimatePassMemory, estimateSampleMemory } from '../../kernels/small/memory.ts';
import { recordSessionOp, recordSessionRequestRefused } from '../metrics/training.ts';
import type { LiveSession } from './sessions.ts';

/** Numbers of any numeric ndarray as float32 (int64 via Number). */
export function toFloat32(a: NDArray): Float32Array {
  if (a.data instanceof Float32Array) return a.data;
  const out = new Float32Array(a.data.length);
  for (let i = 0; i < out.length; i++) out[i] = Number(a.data[i]);
  return out;
}

/** The slot of each camera of a datum, binding new camera names to free slots of `bound` in first-seen order. */
function slotsFor(cams: Iterable<string>, slots: number, i: number, bound: string[]): Map<string, number> {
  const out = new Map<string, number>();
  for (const cam of cams) {
    let k = bound.indexOf(cam);
    if (k < 0) {
      if (bound.length >= slots) {
        throw new ProtocolError('bad_request', `data[${i}] has camera "${cam}"; the model's ${slots} image slots are bound to ${bound.join(', ')}`);
      }
      bound.push(cam);
      k = bound.length - 1;
    }
    out.set(cam, k);
  }
  return out;
}

/**
 * The folder of a saved state `<session>/states/<name>` of `owner` (validated by parseRequest).
 * @throws EngineError not_found when this owner has no such state.
 */
function stateDir(server: ServerConfig, owner: string, checkpointId: string): string {
  const dir = storageOf(server).dir('checkpoints', owner, ...checkpointId.split('/'));
  if (!fs.existsSync(dir)) throw new EngineError('not_found', `no saved state ${checkpointId} for this key`);
  return dir;
}

/** Decode the frames and arrays of `data` into a ModelBatch. @throws ProtocolError / ShapeError. */
export async function buildBatch(live: LiveSession, data: WireDatum[], codec: string, server: ServerConfig): Promise<ModelBatch> {
  const cfg = live.layout!;
  // Bind cameras synchronously, in request order, before any await.
  // A request refused for its cameras binds none of them (the binding is saved with the weights).
  const bound = [...live.cameras];
  const bindings = data.map((d, i) => slotsFor(d.images.keys(), cfg.slots, i, bound));
  live.cameras.splice(0, live.cameras.length, ...bound);
  const datums = await Promise.all(
    data.map(async (d, i): Promise<DatumInput> => {
      const images: (Uint8Array | null)[] = new Array(cfg.slots).fill(null);
      await Promise.all(
        [...d.images].map(async ([cam, frame]) => {
          try {
            images[bindings[i]!.get(cam)!] = (await decodeFrameResized(codec, frame, cfg.imageSize, { maxPixels: server.maxImagePixels })).data;
          } catch (e) {
            if (e instanceof ProtocolError) throw new ProtocolError(e.code, `data[${i}].observation.image.${cam}: ${e.message}`);
            throw e;
          }
        }),
      );
      let actions: DatumInput['actions'];
      if (d.actions) {
        if (d.actions.shape.length !== 2) throw new ProtocolError('shape_mismatch', `data[${i}].actions has shape [${d.actions.shape}]; expected [H, A]: H steps (up to this session's action_horizon ${live.actionHorizon}) of A values (up to action_dim ${cfg.actionDim})`);
        actions = { data: toFloat32(d.actions), horizon: d.actions.shape[0]!, dim: d.actions.shape[1]! };
        if (actions.horizon > live.actionHorizon) {
          throw new ProtocolError('shape_mismatch', `data[${i}].actions has ${actions.horizon} steps; this session's action_horizon is ${live.actionHorizon}`);
        }
      }
      if (d.state && d.state.shape.length !== 1) throw new ProtocolError('shape_mismatch', `data[${i}].observation.state has shape [${d.state.shape}]; expected [S]: S values (up to state_dim ${cfg.stateDim})`);
      return { images, state: d.state ? toFloat32(d.state) : new Float32Array(0), prompt: d.prompt, actions, weight: d.weight };
    }),
  );
  return makeBatch(cfg, datums, { maxPromptBytes: server.maxPromptBytes, encodePrompt: cfg.encodePrompt });
}


/** Wire form of a [B, H, A] float32 result, trimmed to the session's action_horizon. */
function chunk(data: Float32Array, b: number, cfg: BatchLayout, horizon: number): NDArray {
  if (horizon === cfg.horizon) return ndarray(data, [b, cfg.horizon, cfg.actionDim]);
  const out = new Float32Array(b * horizon * cfg.actionDim);
  for (let i = 0; i < b; i++) out.set(data.subarray(i * cfg.horizon * cfg.actionDim, (i * cfg.horizon + horizon) * cfg.actionDim), i * horizon * cfg.actionDim);
  return ndarray(out, [b, horizon, cfg.actionDim]);
}

interface EngineAnswer<T> {
  result: T;
  pending_gradients: number;
}

/**
 * Run one request of a live session and return its wire result. The engine call waits for every
 * earlier request of the session (whatever connection sent it); preparation does not.
 * @throws ProtocolError, ShapeError or EngineError for client-caused failures.
 */
export function runOp(live: LiveSession, req: SessionRequest, server: ServerConfig): Promise<unknown> {
  let prepared: () => Promise<unknown>;
  try {
    prepared = prepareOp(live, req, server);
  } catch (e) {
    recordSessionRequestRefused(req.op);
    return Promise.reject(e); // checks that fail before any work still answer in order
  }
  const run = async () => {
    const started = Date.now();
    let ok = false;
    try {
      const result = await prepared();
      ok = true;
      return result;
    } finally {
      recordSessionOp(req.op, (Date.now() - started) / 1000, ok);
      if (req.op !== 'heartbeat') {
        live.opsCount++;
        live.lastOp = { op: req.op, id: req.id, at: Date.now() / 1000, ms: Date.now() - started, ok };
      }
    }
  };
  const done = live.chain.then(run);
  live.chain = done.catch(() => undefined);
  return done;
}

/**
 * A real model's pass is planned before it runs (server/models/plan.ts): its activations, for
 * this batch and these cameras, against what the process may still use (the base and the
 * session's own tensors are resident already). A preset's passes are planned too
 * (kernels/small/memory.ts: up to --max-batch datums reach GBs, flow0-small's forward_backward
 * ~0.6 GB per datum; a sample's num_steps costs time, not memory, the sampler being eager past
 * the few layouts with graphs).
 * @throws EngineError('insufficient_memory') with the one-line estimate and fix; the session goes on.
 */
async function planPass(live: LiveSession, op: string, batch: ModelBatch, server: ServerConfig): Promise<void> {
  const real = live.layout?.real;
  if (!real) {
    if (live.engine?.info.family === 'small') await planPresetPass(live, op, batch, server);
    return;
  }
  // The engine computes the camera slots that any datum fills (kernels/pi/batch.ts drops the rest).
  const cameras = filledSlots(batch);
  const use = op === 'sample' ? 'serve' : live.config.finetune === 'full' ? 'full' : 'lora';
  try {
    await planOrRefuse(real, { use, batch: batch.size, cameras, loraRank: live.config.rank, loraActionRank: live.config.action_rank ?? live.config.rank, loraTargets: live.config.targets },
      { weights: false, tenant: false, pass: true }, `${op} of ${batch.size} datum(s) with ${cameras} camera(s) on ${live.config.base_model}`, server.maxMemory);
  } catch (e) {
    throw e instanceof HttpError ? new EngineError('insufficient_memory', e.message) : e;
  }
}

/** The camera slots any datum of `batch` fills (at least 1): the engine computes only those. */
function filledSlots(batch: ModelBatch): number {
  const slots = batch.imageMask.length / batch.size;
  let cameras = 0;
  for (let k = 0; k < slots; k++) {
    for (let i = 0; i < batch.size; i++) {
      if (batch.imageMask[i * slots + k]) {
        cameras++;
        break;
      }
    }
  }
  return Math.max(1, cameras);
}

/**
 * A preset's sample, forward_backward or forward against what the process may still use (planPass).
 * @throws EngineError('insufficient_memory') with checkFits's one line.
 */
async function planPresetPass(live: LiveSession, op: string, batch: ModelBatch, server: ServerConfig): Promise<void> {
  const c = makeConfig(live.engine!.info.preset);
  const cameras = Math.min(c.slots, filledSlots(batch));
  const estimate = op === 'sample' ? estimateSampleMemory(c, batch.size, cameras) : estimatePassMemory(c, batch.size, cameras);
  // As a real model's pass: counts what admitted loads have reserved, reserves nothing itself.
  const available = memoryLedger.less(await availableMemory({ maxMemory: server.maxMemory, capName: '--max-memory' }));
  const why = checkFits(estimate, available, `${op} of ${batch.size} datum(s) with ${cameras} camera(s) on ${c.preset}`, { batch: batch.size, use: op === 'sample' ? 'serve' : 'lora' }); // (a preset's tape is the same under LoRA: no "use LoRA" fix)
  if (why) throw new EngineError('insufficient_memory', why);
}

/** Starts the request's preparation now and returns the part that must run in order. */
function prepareOp(live: LiveSession, req: SessionRequest, server: ServerConfig): () => Promise<unknown> {
  const engine = live.engine!;
  const cfg = live.layout!;
  const call = async <T>(op: string, args: Record<string, unknown>, transfer: ArrayBuffer[] = []): Promise<T> => {
    const a = await engine.call<EngineAnswer<T>>(live.id, op, args, transfer);
    live.pendingGradients = a.pending_gradients;
    return a.result;
  };
  switch (req.op) {
    case 'heartbeat':
      return async () => ({});
    case 'forward_backward':
    case 'forward':
    case 'sample': {
      const prepared = buildBatch(live, req.data, req.codec, server);
      prepared.catch(() => undefined); // observed in order below; avoid an unhandled rejection meanwhile
      return async () => {
        const batch = await prepared;
        const b = batch.size;
        await planPass(live, req.op, batch, server);
        const transfer = batchBuffers(batch);
        if (req.op === 'forward_backward') {
          const r = await call<{ loss: number; lossPerDatum: Float32Array }>('forward_backward', { batch, lossFn: req.loss_fn }, transfer);
          live.recordLoss(r.loss);
          return { loss: r.loss, loss_per_datum: ndarray(r.lossPerDatum, [b]) };
        }
        if (req.op === 'forward') {
          const r = await call<Record<string, Float32Array>>('forward', { batch, keep: req.keep }, transfer);
          return {
            velocity: chunk(r.velocity!, b, cfg, cfg.horizon), target: chunk(r.target!, b, cfg, cfg.horizon),
            x_t: chunk(r.xT!, b, cfg, cfg.horizon), noise: chunk(r.noise!, b, cfg, cfg.horizon), time: ndarray(r.time!, [b]),
          };
        }
        const r = await call<{ actions: Float32Array }>('sample', {
          batch, numSteps: req.num_steps, seed: req.seed, weights: req.weights,
          // A sample's batch size and num_steps are the client's: a new pair's trace waits until no
          // other session's robots (live policies on this engine) are busy (Engine TRACE_QUIET_MS).
          trace: 'quiet',
        }, transfer);
        return { actions: chunk(r.actions, b, cfg, live.actionHorizon) };
      };
    }
    case 'backward': {
      const g = req.velocity_grad;
      if (g.shape.length !== 3 || g.shape[1] !== cfg.horizon || g.shape[2] !== cfg.actionDim) {
        const err = new ProtocolError('shape_mismatch', `velocity_grad has shape [${g.shape}]; expected [B, ${cfg.horizon}, ${cfg.actionDim}] like forward's velocity`);
        return () => Promise.reject(err);
      }
      const data = Float32Array.from(toFloat32(g));
      return () => call('backward', { velocityGrad: data, batchSize: g.shape[0] }, [data.buffer]).then(() => ({}));
    }
    case 'optim_step':
      return () =>
        call<{ gradNorm: number; skipped: boolean }>('optim_step', {
          learningRate: req.learning_rate, beta1: req.beta1, beta2: req.beta2, eps: req.eps, weightDecay: req.weight_decay, gradClipNorm: req.grad_clip_norm,
        }).then((r) => ({ grad_norm: r.gradNorm, skipped: r.skipped }));
    case 'save_state':
    case 'save_weights':
      checkStorage(storageOf(server), live.row.owner, server.storagePerKeyBytes);
      return () => call(req.op, { name: req.name, overwrite: req.overwrite, cameras: [...live.cameras], actionHorizon: live.actionHorizon });
    case 'load_state': {
      // Another session's state (same key): its folder on the shared storage, checked here.
      const dir = req.checkpoint_id ? stateDir(server, live.row.owner, req.checkpoint_id) : undefined;
      return () =>
        call<{ cameras?: string[] }>('load_state', { name: req.name, dir: req.dir ?? dir }).then((r) => {
          if (r.cameras) live.cameras = [...r.cameras];
          return {};
        });
    }
    case 'abort_gradient_epoch':
      return () => call('abort_gradient_epoch', {});
  }
}
