/**
 * An engine worker: owns one preset's base weights on one TF.js backend, every training
 * session's state on top of them (tenants.ts) and the policies it serves. It runs one call at a
 * time (the host queues), so the main thread's event loop never waits on compute.
 */
import { parentPort } from 'node:worker_threads';
import fs from 'node:fs';
import path from 'node:path';
import * as tf from '@tensorflow/tfjs';
import { initBackend, type BackendReport } from '../../kernels/backend/backend.ts';
import { sampleGraphStats, samplesAsGraphs } from '../../kernels/sample-graph.ts';
import { lossGraphStats } from '../../kernels/step-graph.ts';
import { graphCacheStats } from '../../kernels/graph-cache.ts';
import { makeConfig } from '../../kernels/small/config.ts';
import { BaseWeights, TrainingState, sampleActions } from '../../kernels/trainer.ts';
import { checkpointFiles, loadCheckpoint, saveCheckpoint, type CheckpointContent } from '../../kernels/checkpoint.ts';
import { parseNormStats } from '../../kernels/normalize.ts';
import { drawNoiseTime } from '../../kernels/flow.ts';
import { Rng } from '../../kernels/rng.ts';
import { sliceBatch, type ModelBatch } from '../../kernels/small/batch.ts';
import { realPiConfigFromHub, type RealPiConfig } from '../../kernels/pi/config.ts';
import { toRealPiBatch } from '../../kernels/pi/batch.ts';
import { realPiPolicy } from '../../kernels/pi/policy.ts';
import { PALIGEMMA_PAD_ID } from '../../kernels/pi/prompt.ts';
import { readHubConfig } from '../models/hub-checkpoint.ts';
import { loadHubTensors } from '../models/load-tensors.ts';
import { parseEngineModel } from './model-key.ts';
import { EngineError, type BackendInfo, type EngineInfo, type EngineMemory, type FromWorker, type ToWorker } from './messages.ts';
import { TenantPool, toExported, type Tenant } from './tenants.ts';
import { powerOfTwoChunks } from './sample-chunks.ts';
import type { ChunkPrefix, RtcMode } from '../../kernels/rtc.ts';

const port = parentPort!;
/**
 * The model this engine holds, as the rest of the worker sees it: its exported name, chunk
 * shape and image layout (a small preset's PolicyConfig, or the real pi0 / pi0.5 read from a Hub
 * checkpoint folder), and how a server batch becomes the family's batch.
 */
interface EngineModel {
  preset: string;
  horizon: number;
  actionDim: number;
  imageSize: number;
  slots: number;
  /** The real family's checkpoint folder, written into saved configs; null for presets. */
  baseDir: string | null;
  /** Euler steps a session's sample may have a graph for (sessionSampleTraces): the real model's num_inference_steps, the protocol's default 10 for presets. */
  numSteps: number;
  /** The family's batch (typed loosely: the TrainingState of this engine takes whichever the family is). */
  toBatch(mb: ModelBatch): any;
}
let config: EngineModel;
// The family's batch type is the engine's business alone: the server hands ModelBatch over.
let base: BaseWeights<any, any>;
let pool: TenantPool;
let backendName = '';
let baseSeed = 0;
/** Test-only fault injection (VELA_FAULT_INJECTION=1): the next optim_step of a session fails after updating. */
const faultAfterUpdate = new Set<string>();

/** Policies served by this engine: trained weights on the shared base, inference only. */
const policies = new Map<string, TrainingState>();
/** Policies that are the base itself, as it is (`vela policy --base`): no weights of their own. */
const basePolicies = new Set<string>();

function send(m: FromWorker, transfer: ArrayBuffer[] = []): void {
  port.postMessage(m, transfer);
}

/** tf.memory()'s counts and the graph caches' (cheap: bookkeeping, no device sync), so every answer carries them. */
function memoryNow(): EngineMemory {
  const m = tf.memory();
  const g = graphCacheStats();
  return { numBytes: m.numBytes, numTensors: m.numTensors, graphs: { traced: sampleGraphStats().traces + lossGraphStats().traces, cached: g.graphs, cachedOps: g.ops, cachedBytes: g.bytes } };
}

/**
 * The transfer list of an answer: the buffers of arrays that this call made for the answer alone.
 * Rules that keep the worker's own state intact (a transferred buffer is detached here): pass
 * only arrays that nothing in the worker keeps (TrainingState returns such arrays, see its
 * docstrings); a view on part of a buffer is copied, never transferred (the rest of the buffer may
 * be someone else's); a buffer listed twice is transferred once.
 */
function answerBuffers(...arrays: ArrayBufferView[]): ArrayBuffer[] {
  const out = new Set<ArrayBuffer>();
  for (const a of arrays) {
    const buf = a.buffer;
    if (buf instanceof ArrayBuffer && a.byteOffset === 0 && a.byteLength === buf.byteLength) out.add(buf);
  }
  return [...out];
}

function savedDir(t: Tenant, kind: 'states' | 'weights', name: string): string {
  return path.join(t.dir, kind, name);
}

/**
 * Refuses trained tensors (adapters, full weights) made on another base than this engine's: on
 * the real models a checkpoint records its `base_checkpoint` folder, and an adapter means nothing
 * on other base weights even where every shape fits (two pi0.5 bases; a stored bare `pi05` is
 * also the old name of flow05-small).
 * @throws EngineError('bad_checkpoint') naming both bases.
 */
function checkSameBase(saved: Record<string, unknown>, what: string): void {
  const savedBase = typeof saved.base_checkpoint === 'string' ? saved.base_checkpoint : null;
  if (savedBase === config.baseDir) return;
  const mine = config.baseDir ? `the ${config.preset} base ${config.baseDir}` : `preset ${config.preset}'s seeded base`;
  const theirs = savedBase ? `the ${saved.preset} base ${savedBase}` : `preset ${saved.preset}'s seeded base`;
  throw new EngineError('bad_checkpoint', `${what} was trained on ${theirs}; this session runs on ${mine}: load it into a session on its own base`);
}

/** The shared base's bytes in the engine (every base tensor is float32). */
function baseBytes(): number {
  return base.paramCount * 4;
}

function answer(state: TrainingState | null, result: unknown): { result: unknown; pending_gradients: number } {
  return { result, pending_gradients: state ? state.pendingGradients : 0 };
}

/** The body of each op. Returns the answer and the buffers to transfer. */
async function run(sessionId: string, op: string, args: Record<string, any>): Promise<[unknown, ArrayBuffer[]]> {
  switch (op) {
    case 'create_session': {
      const opts = {
        finetune: args.finetune, rank: args.rank, alpha: args.alpha, actionRank: args.actionRank ?? undefined, actionAlpha: args.actionAlpha ?? undefined,
        targets: args.targets, seed: args.seed, emaDecay: args.emaDecay ?? 0, timeSampling: args.timeSampling ?? 'beta', rtcMaxDelay: args.rtcMaxDelay ?? 0,
      };
      const t = await pool.create(sessionId, args.dir, opts);
      return [answer(null, { trainableParams: t.state!.trainableParamCount, tenantBytes: t.bytes, baseBytes: baseBytes() }), []];
    }
    case 'close_session': {
      pool.close(sessionId);
      return [answer(null, {}), []];
    }
    case 'stats': {
      const mem = tf.memory();
      return [answer(null, { numTensors: mem.numTensors, numBytes: mem.numBytes, baseParams: base.paramCount, baseBytes: baseBytes(), policies: policies.size, ...pool.stats() }), []];
    }
    case 'sleep':
      await pool.sleep(sessionId);
      return [answer(null, { asleep: true }), []];
    case 'wake_up':
      await pool.wake(sessionId);
      return [answer(null, { asleep: false }), []];
    case 'inject_fault': {
      if (process.env.VELA_FAULT_INJECTION !== '1') throw new EngineError('bad_request', 'fault injection is off (VELA_FAULT_INJECTION=1 turns it on, for tests)');
      faultAfterUpdate.add(sessionId);
      return [answer(null, {}), []];
    }
    case 'abort_gradient_epoch': {
      const t = pool.peek(sessionId);
      if (t.poisoned) {
        throw new EngineError('poisoned', `session ${sessionId} is poisoned: its optimizer step failed midway (${t.poisoned}), so weights or moments may have changed. abort_gradient_epoch never repairs an optimizer step: load_state a saved state, or close the session`);
      }
      const { state } = await pool.use(sessionId);
      return [answer(state, state.abortGradientEpoch()), []];
    }
    case 'load_state': {
      const t = pool.peek(sessionId);
      // `dir`: a saved state of another model of the same owner (the server checked the path).
      const dir = typeof args.dir === 'string' ? args.dir : savedDir(t, 'states', args.name);
      if (!fs.existsSync(dir)) throw new EngineError('not_found', typeof args.dir === 'string' ? `no saved state at ${args.dir}` : `no saved state named "${args.name}" in this session`);
      const { state } = await pool.use(sessionId);
      const ck = await loadCheckpoint(dir, { preset: config.preset });
      checkSameBase(ck.config, typeof args.dir === 'string' ? `saved state ${path.basename(path.dirname(path.dirname(dir)))}/states/${path.basename(dir)}` : `saved state "${args.name}"`);
      state.importState(toExported(ck));
      t.poisoned = null;
      return [answer(state, { cameras: (ck.config.cameras as string[] | undefined) ?? [] }), []];
    }
    case 'load_policy':
      return loadPolicy(sessionId, args.dir);
    case 'load_base_policy':
      // The base as it is, as a policy: it computes with the shared base alone (nothing trained).
      policies.get(sessionId)?.dispose();
      policies.delete(sessionId);
      basePolicies.add(sessionId);
      return [answer(null, {}), []];
    case 'unload_policy':
      policies.get(sessionId)?.dispose();
      policies.delete(sessionId);
      basePolicies.delete(sessionId);
      return [answer(null, {}), []];
    case 'infer':
      return infer(sessionId, args);
    case 'export_weights': {
      // The session's weights as checkpoint files (sync_inference_weights), between its ops.
      const t = pool.peek(sessionId);
      if (t.poisoned) throw new EngineError('poisoned', `session ${sessionId} is poisoned (${t.poisoned}): its weights may be half-updated, so they are not sent; load_state a saved state first`);
      const { tenant, state } = await pool.use(sessionId);
      const files = checkpointFiles(checkpointContent(tenant, state, false, args), args.dtype ?? 'F32');
      const out: Record<string, Uint8Array> = {};
      for (const [name, f] of Object.entries(files)) out[name] = typeof f === 'string' ? new Uint8Array(Buffer.from(f, 'utf8')) : f;
      return [answer(state, { files: out, step: state.step }), answerBuffers(...Object.values(out))];
    }
  }
  // Ops that compute on a training session.
  const { tenant, state } = await pool.use(sessionId);
  if (tenant.poisoned && op !== 'save_weights' && op !== 'sample') {
    throw new EngineError('poisoned', `session ${sessionId} is poisoned (${tenant.poisoned}): load_state a saved state first`);
  }
  switch (op) {
    case 'forward_backward': {
      // microBatch (a fine-tune the memory plan splits, issue 34): one taped pass per consecutive
      // slice of that many datums (the last may be smaller), accumulated as one batch's gradient.
      const whole = args.batch as ModelBatch;
      const m = args.microBatch == null ? whole.size : Number(args.microBatch);
      if (!Number.isInteger(m) || m < 1) throw new EngineError('bad_request', `microBatch is ${String(args.microBatch)}; expected an integer >= 1`);
      const parts: ModelBatch[] = [];
      for (let at = 0; at < whole.size; at += m) parts.push(m >= whole.size ? whole : sliceBatch(whole, at, Math.min(whole.size, at + m)));
      const r = state.forwardBackwardParts(parts.map((p) => config.toBatch(p)), { lossFn: args.lossFn });
      return [answer(state, r), answerBuffers(r.lossPerDatum)];
    }
    case 'forward': {
      const batch = args.batch as ModelBatch;
      // A seeded forward (evaluation) draws its own noise and time and leaves the session's generator alone.
      const given = args.seed == null ? {} : drawNoiseTime(new Rng(args.seed), batch.size, config.horizon, config.actionDim);
      const r = state.forward(config.toBatch(batch), { keep: !!args.keep, ema: !!args.ema, ...given });
      return [answer(state, r), answerBuffers(r.velocity, r.target, r.xT, r.noise, r.time)];
    }
    case 'backward':
      if (!(args.velocityGrad instanceof Float32Array)) throw new EngineError('bad_request', 'velocity_grad is missing');
      state.backward(args.velocityGrad);
      return [answer(state, {}), []];
    case 'optim_step': {
      try {
        const r = state.optimStep(args);
        if (faultAfterUpdate.delete(sessionId)) throw new Error('injected fault after the parameter update');
        return [answer(state, r), []];
      } catch (e) {
        // Option and D checks run before anything changes; anything else may have mutated state.
        if (!isUserError(e)) tenant.poisoned = (e as Error).message;
        throw e;
      }
    }
    case 'sample': {
      const temp = args.weights ? await loadWeights(tenant, args.weights) : null;
      try {
        // trace false (the host's answer to 'quiet'), or a layout the client picked outside the
        // bounded ones (sessionSampleTraces): a layout without a graph samples eagerly.
        const mb = args.batch as ModelBatch;
        const trace = args.trace !== false && sessionSampleTraces(mb.size, args.numSteps ?? 10);
        const actions = (temp ?? state).sample(config.toBatch(mb), { numSteps: args.numSteps, seed: args.seed ?? undefined, ema: !!args.ema, trace });
        return [answer(state, { actions }), answerBuffers(actions)];
      } finally {
        temp?.dispose();
      }
    }
    case 'save_state':
    case 'save_weights': {
      const kind = op === 'save_state' ? 'states' : 'weights';
      const dir = savedDir(tenant, kind, args.name);
      if (fs.existsSync(dir) && !args.overwrite) {
        throw new EngineError('conflict', `a saved ${kind === 'states' ? 'state' : 'weights'} named "${args.name}" exists; pass overwrite: true to replace it`);
      }
      await saveCheckpoint(dir, checkpointContent(tenant, state, op === 'save_state', args), { overwrite: true });
      return [answer(state, op === 'save_state' ? args.name : dir), []];
    }
    default:
      throw new EngineError('bad_request', `unknown engine op "${op}"`);
  }
}

/** The largest batch a session's sample traces a graph for (the policy batcher's max_batch). */
const SESSION_SAMPLE_GRAPH_MAX_BATCH = 16;

/**
 * Whether a session's `sample` (websocket or futures API: the client picks the batch size, 1 to
 * --max-batch, and num_steps, 1 to 1000) may trace a graph for its layout (issue 33): only at the
 * model's own step count (config.numSteps) and a batch size in {1, 2, 4, ..., 16}. Each graph is
 * the sampler unrolled (~250-350 ops and ~5 MB per step at batch 8, kernels/backend/graph.ts
 * GRAPH_BYTES_PER_OP) and seconds to trace, so a client sweeping num_steps or batch sizes would
 * otherwise fill the cache and stall the engine with traces; at most 5 layouts here, and every
 * other one samples eagerly (one step's activations at a time: kernels/flow.ts eulerSample).
 */
function sessionSampleTraces(size: number, numSteps: number): boolean {
  return numSteps === config.numSteps && size <= SESSION_SAMPLE_GRAPH_MAX_BATCH && (size & (size - 1)) === 0;
}

/** A session's state or weights in the checkpoint layout (PROTOCOL.md section 4). */
function checkpointContent(t: Tenant, state: TrainingState, withOptimizer: boolean, args: Record<string, any>): CheckpointContent {
  // save_weights with ema: the moving average is what gets served (openpi exports its EMA params).
  const ex = withOptimizer ? state.exportState() : state.exportWeights({ ema: !!args.ema });
  const cfg = {
    ...ex.config, preset: config.preset, action_horizon: args.actionHorizon ?? config.horizon, cameras: args.cameras ?? [],
    image_size: config.imageSize, image_slots: config.slots, base_seed: baseSeed, session_seed: t.opts.seed,
    ...(config.baseDir ? { base_checkpoint: config.baseDir } : {}),
    ...(args.extraConfig ?? {}),
  };
  const content: CheckpointContent = { config: cfg };
  if (ex.config.finetune === 'lora') {
    // Parameters trained in full ride in the adapter file under their own names, listed by module
    // in modules_to_save as PEFT does (server/jobs/export-hub.ts writes them into a merged base).
    const modules = [...new Set((ex.config.lora_full ?? []).map((n) => n.replace(/\.(weight|bias)$/, '')))];
    content.adapter = {
      tensors: ex.weights,
      config: { peft_type: 'LORA', r: ex.config.lora_rank, lora_alpha: ex.config.lora_alpha, target_modules: ex.config.lora_targets, base_model: config.preset, ...(modules.length > 0 ? { modules_to_save: modules } : {}) },
    };
  } else content.weights = ex.weights;
  if (ex.optimizer && ex.trainerState) {
    content.optimizer = ex.optimizer;
    content.trainerState = ex.trainerState;
  }
  if (args.normStats) content.normStats = parseNormStats(args.normStats);
  return content;
}

async function loadWeights(t: Tenant, name: string): Promise<TrainingState> {
  const dir = savedDir(t, 'weights', name);
  if (!fs.existsSync(dir)) throw new EngineError('not_found', `no saved weights named "${name}" in this session`);
  const ck = await loadCheckpoint(dir, { preset: config.preset });
  const state = new TrainingState(base, { ...t.opts, emaDecay: 0 });
  try {
    state.importWeights(toExported(ck));
  } catch (e) {
    state.dispose();
    throw e;
  }
  return state;
}

async function loadPolicy(policyId: string, dir: string): Promise<[unknown, ArrayBuffer[]]> {
  const ck = await loadCheckpoint(dir, { preset: config.preset });
  const c = ck.config as Record<string, any>;
  if ((c.base_seed ?? 0) !== baseSeed) {
    throw new EngineError('bad_checkpoint', `checkpoint ${dir} was trained on base weights of seed ${c.base_seed}; this engine holds seed ${baseSeed}`);
  }
  const state = new TrainingState(base, {
    finetune: c.finetune ?? 'lora', rank: c.lora_rank, alpha: c.lora_alpha, actionRank: c.lora_action_rank, actionAlpha: c.lora_action_alpha, targets: c.lora_targets, seed: 0,
  });
  try {
    state.importWeights(toExported(ck));
  } catch (e) {
    state.dispose();
    throw e;
  }
  policies.get(policyId)?.dispose();
  policies.set(policyId, state);
  // norm_stats.json's own layout, as the policy server parses it.
  return [answer(null, { config: ck.config, normStats: ck.normStats ? { norm_stats: ck.normStats } : null }), []];
}

/**
 * Sample actions for a policy's batch: a loaded policy, or a training session's live weights
 * (a session's policy websocket). One call runs on one set of weights: an optim_step is one
 * call too, so a batch never sees a half-updated model. Answers the weights' step for sessions.
 * `args.trace: false` (the host's answer to `trace: 'quiet'`): a layout without a graph samples
 * eagerly instead of tracing one. The answer's `graphs`: how many graphs the call traced, and how
 * many layouts it sampled eagerly for want of one.
 */
async function infer(policyId: string, args: Record<string, any>): Promise<[unknown, ArrayBuffer[]]> {
  const batch = args.batch as ModelBatch;
  const seeds = args.seeds as number[];
  if (!Array.isArray(seeds) || seeds.length !== batch.size) throw new EngineError('bad_request', `infer needs one seed per datum: ${seeds?.length} seeds for ${batch.size} datums`);
  // Each datum's noise comes from its own seed alone, so batching never changes its actions.
  const per = config.horizon * config.actionDim;
  const noise = new Float32Array(batch.size * per);
  seeds.forEach((seed, i) => noise.set(new Rng(seed).normals(per), i * per));
  const rtc = args.rtc as RtcArgs | undefined;
  // false: a layout without a graph samples eagerly, tracing nothing (the host decides: Engine, TRACE_QUIET_MS).
  const trace = args.trace !== false;
  if (rtc && (rtc.actions?.length !== batch.size * per || rtc.weights?.length !== batch.size * per)) {
    throw new EngineError('bad_request', `infer's rtc needs ${batch.size} x ${per} actions and weights`);
  }
  const before = sampleGraphStats();
  // Graphs this call traced, and layouts it sampled eagerly instead of tracing (trace false).
  const graphs = () => {
    const now = sampleGraphStats();
    return { traced: now.traces - before.traces, deferred: now.deferred - before.deferred };
  };
  if (basePolicies.has(policyId)) {
    const actions = inChunks(batch, noise, per, rtc, (b, n, chunk) => sampleActions(base.policy, base.view(), config.toBatch(b), new Rng(0), { numSteps: args.numSteps ?? 10, noise: n, chunk, trace }));
    return [answer(null, { actions, step: null, graphs: graphs() }), answerBuffers(actions)];
  }
  let state = policies.get(policyId) ?? null;
  let step: number | null = null;
  if (!state && pool.has(policyId)) {
    const t = pool.peek(policyId);
    if (t.poisoned) throw new EngineError('poisoned', `session ${policyId} is poisoned (${t.poisoned}): its policy answers again after load_state`);
    state = (await pool.use(policyId)).state;
    step = state.step;
  }
  if (!state) throw new EngineError('not_found', `policy ${policyId} is not loaded in this engine`);
  const st = state;
  const actions = inChunks(batch, noise, per, rtc, (b, n, chunk) => st.sample(config.toBatch(b), { numSteps: args.numSteps ?? 10, noise: n, chunk, trace }));
  return [answer(null, { actions, step, graphs: graphs() }), answerBuffers(actions)];
}

/**
 * Samples a policy batch in power-of-two parts (sample-chunks.ts: a bounded number of traced
 * graphs) within one call, so every part runs on the same weights; `per` floats of noise and of
 * actions per datum. Returns the actions of every datum in order. Where sampling runs eagerly
 * (no graphs: wasm, VELA_GRAPHS=0, a family without sampleInputs) each part would pay the whole
 * per-call dispatch again, so the batch goes in one piece. `rtc`: the batch's real-time chunking
 * input (server/policy/service.ts), split with it.
 */
function inChunks(batch: ModelBatch, noise: Float32Array, per: number, rtc: RtcArgs | undefined, sample: (b: ModelBatch, noise: Float32Array, chunk: ChunkPrefix | undefined) => Float32Array): Float32Array {
  const sizes = samplesAsGraphs(base.policy) ? powerOfTwoChunks(batch.size) : [batch.size];
  const part = (from: number, to: number): ChunkPrefix | undefined =>
    rtc && { mode: rtc.mode, maxGuidance: typeof rtc.maxGuidance === 'number' ? rtc.maxGuidance : rtc.maxGuidance.slice(from, to), actions: rtc.actions.slice(from * per, to * per), weights: rtc.weights.slice(from * per, to * per) };
  if (sizes.length === 1) return sample(batch, noise, part(0, batch.size));
  const out = new Float32Array(batch.size * per);
  let at = 0;
  for (const n of sizes) {
    out.set(sample(sliceBatch(batch, at, at + n), noise.slice(at * per, (at + n) * per), part(at, at + n)), at * per);
    at += n;
  }
  return out;
}

/** infer's `rtc` argument: kernels/rtc.ts ChunkPrefix for the whole batch, [b * per] arrays. */
interface RtcArgs {
  mode: RtcMode;
  /** β: one for the batch, or [b], one per datum (robots of different rtc_max_guidance share a batch). */
  maxGuidance: number | Float32Array;
  actions: Float32Array;
  weights: Float32Array;
}

/**
 * Loads the engine's model: a small preset from its seed, or the real pi0 / pi0.5 from a Hub
 * checkpoint folder (server/models/hub-checkpoint.ts), streamed tensor by tensor so the peak
 * stays near one float32 copy. Returns what the host's EngineInfo says about the model.
 * @throws the checkpoint reader's CheckpointError / ConfigError (one line naming the file).
 */
async function loadModel(key: string, seed: number): Promise<Omit<EngineInfo, 'backend' | 'backendKind' | 'backendDevice' | 'backendFallbacks' | 'backendLine'>> {
  const parsed = parseEngineModel(key);
  baseSeed = seed;
  if (parsed.kind === 'preset') {
    const c = makeConfig(parsed.preset);
    base = BaseWeights.create(c, seed);
    config = { preset: c.preset, horizon: c.horizon, actionDim: c.actionDim, imageSize: c.imageSize, slots: c.slots, baseDir: null, numSteps: 10, toBatch: (mb) => mb };
    pool = new TenantPool(base, c.preset, maxResident);
    return {
      preset: c.preset, family: 'small', baseDir: null, imageSize: c.imageSize, imageSlots: c.slots, stateDim: c.stateDim, actionDim: c.actionDim,
      actionHorizon: c.horizon, maxTokenLen: c.maxTokenLen, padToken: c.padToken, baseParams: base.paramCount,
    };
  }
  const c: RealPiConfig = realPiConfigFromHub(await readHubConfig(parsed.dir));
  if (c.variant !== parsed.variant) throw new EngineError('bad_checkpoint', `${parsed.dir}/config.json is a ${c.variant} checkpoint; ${parsed.variant} was asked for`);
  const policy = realPiPolicy(c, c.variant);
  const { tensors } = await loadHubTensors(parsed.dir, c);
  try {
    base = BaseWeights.adopt(policy, tensors);
  } catch (e) {
    tf.dispose([...tensors.values()]);
    throw e;
  }
  const S = c.vision.imageSize;
  config = { preset: c.variant, horizon: c.actionHorizon, actionDim: c.actionDim, imageSize: S, slots: 3, baseDir: parsed.dir, numSteps: c.numSteps, toBatch: (mb) => toRealPiBatch(c, mb) };
  pool = new TenantPool(base as BaseWeights, c.variant, maxResident);
  return {
    preset: c.variant, family: c.variant, baseDir: parsed.dir, imageSize: S, imageSlots: 3, stateDim: c.stateDim, actionDim: c.actionDim,
    actionHorizon: c.actionHorizon, maxTokenLen: c.maxTokenLen, padToken: PALIGEMMA_PAD_ID, baseParams: base.paramCount,
  };
}
let maxResident = 64;

function isUserError(e: unknown): boolean {
  if (e instanceof EngineError) return true;
  const name = (e as Error)?.name;
  return ['ShapeError', 'ConfigError', 'CheckpointError', 'OptimError', 'TrainerError', 'LoraError', 'NormError'].includes(name);
}

function backendInfo(r: BackendReport): BackendInfo {
  return { name: r.name, kind: r.kind, device: r.device, fallbacks: r.fallbacks.map((f) => `${f.backend}: ${f.reason}`), line: r.line };
}

port.on('message', (m: ToWorker) => {
  if (m.kind === 'probe') {
    initBackend(m.backend, null).then(
      (r) => send({ kind: 'probed', backend: backendInfo(r) }),
      (e) => send({ kind: 'init_failed', error: (e as Error).message }),
    );
    return;
  }
  if (m.kind === 'init') {
    (async () => {
      try {
        // The commands print the line themselves (engine.info.backendLine); the log keeps it at debug.
        const report = await initBackend(m.backend, (line) => send({ kind: 'log', level: 'debug', message: line }));
        backendName = report.name;
        maxResident = m.maxResident ?? 64;
        const info = await loadModel(m.preset, m.seed);
        send({
          kind: 'ready',
          info: {
            ...info, backend: backendName, backendKind: report.kind, backendDevice: report.device,
            backendFallbacks: backendInfo(report).fallbacks, backendLine: report.line,
            graphs: samplesAsGraphs(base.policy),
          },
          memory: memoryNow(),
        });
      } catch (e) {
        send({ kind: 'init_failed', error: (e as Error).message });
      }
    })();
    return;
  }
  run(m.session, m.op, m.args).then(
    ([result, transfer]) => send({ kind: 'result', callId: m.callId, result, memory: memoryNow() }, transfer),
    (e) => {
      const err = e as Error & { code?: string };
      const user = isUserError(e);
      send({ kind: 'error', callId: m.callId, error: err.message, code: typeof err.code === 'string' ? err.code : user ? 'bad_request' : 'internal', internal: !user, stack: err.stack, memory: memoryNow() });
    },
  );
});
