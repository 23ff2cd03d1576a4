/**
 * An engine worker: owns one preset's base weights on one TF.js backend and every session's
 * training state on top of them. It runs one call at a time (the host queues), so ops are
 * synchronous here and the main thread's event loop never waits on compute.
 */
import { parentPort } from 'node:worker_threads';
import fs from 'node:fs';
import path from 'node:path';
import { initBackend } from '../../kernels/backend.ts';
import { makeConfig, type PolicyConfig } from '../../kernels/config.ts';
import { BaseWeights, TrainingState } from '../../kernels/trainer.ts';
import { loadCheckpoint, saveCheckpoint, type CheckpointContent } from '../../kernels/checkpoint.ts';
import { parseNormStats } from '../../kernels/normalize.ts';
import { drawNoiseTime } from '../../kernels/flow.ts';
import { Rng } from '../../kernels/rng.ts';
import type { ExportedState } from '../../kernels/trainer.ts';
import type { ModelBatch } from '../../kernels/batch.ts';
import { EngineError, type FromWorker, type ToWorker } from './messages.ts';

const port = parentPort!;
let config: PolicyConfig;
let base: BaseWeights;
let backendName = '';
let baseSeed = 0;

interface Session {
  state: TrainingState;
  dir: string; // <data>/checkpoints/<owner>/<session>
  opts: { finetune: 'lora' | 'full'; rank: number; alpha: number; targets: string[]; seed: number };
}
const sessions = new Map<string, Session>();

/** Policies served by this engine: trained weights on the shared base, inference only. */
const policies = new Map<string, TrainingState>();

function send(m: FromWorker, transfer: ArrayBuffer[] = []): void {
  port.postMessage(m, transfer);
}

function need<T>(v: T | undefined, what: string): T {
  if (v === undefined) throw new EngineError('bad_request', `${what} is missing`);
  return v;
}

function session(id: string): Session {
  const s = sessions.get(id);
  if (!s) throw new EngineError('not_found', `session ${id} is not open in this engine`);
  return s;
}

function savedDir(s: Session, kind: 'states' | 'weights', name: string): string {
  return path.join(s.dir, kind, name);
}

function answer(s: Session | undefined, result: unknown): { result: unknown; pending_gradients: number } {
  return { result, pending_gradients: s ? s.state.pendingGradients : 0 };
}

/** The body of each op. Returns the answer and the buffers to transfer. */
async function run(sessionId: string, op: string, args: Record<string, any>): Promise<[unknown, ArrayBuffer[]]> {
  switch (op) {
    case 'create_session': {
      if (sessions.has(sessionId)) throw new EngineError('conflict', `session ${sessionId} already exists`);
      const opts = { finetune: args.finetune, rank: args.rank, alpha: args.alpha, targets: args.targets, seed: args.seed };
      const state = new TrainingState(base, opts);
      sessions.set(sessionId, { state, dir: args.dir, opts });
      return [answer(undefined, { trainableParams: state.trainableParamCount }), []];
    }
    case 'close_session': {
      sessions.get(sessionId)?.state.dispose();
      sessions.delete(sessionId);
      return [answer(undefined, {}), []];
    }
    case 'forward_backward': {
      const s = session(sessionId);
      const r = s.state.forwardBackward(args.batch as ModelBatch, { lossFn: args.lossFn });
      return [answer(s, r), [r.lossPerDatum.buffer as ArrayBuffer]];
    }
    case 'forward': {
      const s = session(sessionId);
      const batch = args.batch as ModelBatch;
      // A seeded forward (evaluation) draws its own noise and time and leaves the session's generator alone.
      const given = args.seed == null ? {} : drawNoiseTime(new Rng(args.seed), batch.size, config.horizon, config.actionDim);
      const r = s.state.forward(batch, { keep: !!args.keep, ...given });
      return [answer(s, r), [r.velocity, r.target, r.xT, r.noise, r.time].map((a) => a.buffer as ArrayBuffer)];
    }
    case 'backward': {
      const s = session(sessionId);
      s.state.backward(need(args.velocityGrad as Float32Array | undefined, 'velocity_grad'));
      return [answer(s, {}), []];
    }
    case 'optim_step': {
      const s = session(sessionId);
      return [answer(s, s.state.optimStep(args)), []];
    }
    case 'abort_gradient_epoch': {
      const s = session(sessionId);
      return [answer(s, s.state.abortGradientEpoch()), []];
    }
    case 'sample': {
      const s = session(sessionId);
      let state = s.state;
      let temp: TrainingState | null = null;
      if (args.weights) {
        temp = await loadWeightsInto(s, args.weights);
        state = temp;
      }
      try {
        const actions = state.sample(args.batch as ModelBatch, { numSteps: args.numSteps, seed: args.seed ?? undefined });
        return [answer(s, { actions }), [actions.buffer as ArrayBuffer]];
      } finally {
        temp?.dispose();
      }
    }
    case 'save_state':
    case 'save_weights': {
      const s = session(sessionId);
      const kind = op === 'save_state' ? 'states' : 'weights';
      const dir = savedDir(s, kind, args.name);
      if (fs.existsSync(dir) && !args.overwrite) {
        throw new EngineError('conflict', `a saved ${kind === 'states' ? 'state' : 'weights'} named "${args.name}" exists; pass overwrite: true to replace it`);
      }
      await saveCheckpoint(dir, checkpointContent(s, op === 'save_state', args), { overwrite: true });
      return [answer(s, op === 'save_state' ? args.name : dir), []];
    }
    case 'load_state': {
      const s = session(sessionId);
      const dir = savedDir(s, 'states', args.name);
      if (!fs.existsSync(dir)) throw new EngineError('not_found', `no saved state named "${args.name}" in this session`);
      const ck = await loadCheckpoint(dir, { preset: config.preset });
      s.state.importState(toExported(ck));
      return [answer(s, { cameras: (ck.config.cameras as string[] | undefined) ?? [] }), []];
    }
    case 'load_policy': {
      const ck = await loadCheckpoint(args.dir, { preset: config.preset });
      const c = ck.config as Record<string, any>;
      if ((c.base_seed ?? 0) !== baseSeed) {
        throw new EngineError('bad_checkpoint', `checkpoint ${args.dir} was trained on base weights of seed ${c.base_seed}; this engine holds seed ${baseSeed}`);
      }
      const state = new TrainingState(base, { finetune: c.finetune ?? 'lora', rank: c.lora_rank, alpha: c.lora_alpha, targets: c.lora_targets, seed: 0 });
      try {
        state.importWeights(toExported(ck));
      } catch (e) {
        state.dispose();
        throw e;
      }
      policies.get(sessionId)?.dispose();
      policies.set(sessionId, state);
      return [answer(undefined, { config: ck.config, normStats: ck.normStats ?? null }), []];
    }
    case 'unload_policy': {
      policies.get(sessionId)?.dispose();
      policies.delete(sessionId);
      return [answer(undefined, {}), []];
    }
    case 'infer': {
      const state = policies.get(sessionId);
      if (!state) throw new EngineError('not_found', `policy ${sessionId} is not loaded in this engine`);
      const batch = args.batch as ModelBatch;
      const seeds = args.seeds as number[];
      if (!Array.isArray(seeds) || seeds.length !== batch.size) throw new EngineError('bad_request', `infer needs one seed per datum: ${seeds?.length} seeds for ${batch.size} datums`);
      // Each datum's noise comes from its own seed alone, so batching never changes its actions.
      const per = config.horizon * config.actionDim;
      const noise = new Float32Array(batch.size * per);
      seeds.forEach((seed, i) => noise.set(new Rng(seed).normals(per), i * per));
      const actions = state.sample(batch, { numSteps: args.numSteps ?? 10, noise });
      return [answer(undefined, { actions }), [actions.buffer as ArrayBuffer]];
    }
    default:
      throw new EngineError('bad_request', `unknown engine op "${op}"`);
  }
}

/** A session's state or weights in the checkpoint layout (PROTOCOL.md section 4). */
function checkpointContent(s: Session, withOptimizer: boolean, args: Record<string, any>): CheckpointContent {
  const ex = withOptimizer ? s.state.exportState() : s.state.exportWeights();
  const cfg = {
    ...ex.config, preset: config.preset, action_horizon: args.actionHorizon ?? config.horizon, cameras: args.cameras ?? [],
    image_size: config.imageSize, image_slots: config.slots, base_seed: baseSeed,
    ...(args.extraConfig ?? {}),
  };
  const content: CheckpointContent = { config: cfg };
  if (ex.config.finetune === 'lora') {
    content.adapter = { tensors: ex.weights, config: { peft_type: 'LORA', r: ex.config.lora_rank, lora_alpha: ex.config.lora_alpha, target_modules: ex.config.lora_targets, base_model: config.preset } };
  } else content.weights = ex.weights;
  if (ex.optimizer && ex.trainerState) {
    content.optimizer = ex.optimizer;
    content.trainerState = ex.trainerState;
  }
  if (args.normStats) content.normStats = parseNormStats(args.normStats);
  return content;
}

/** The inverse of checkpointContent, for TrainingState.importState / importWeights. */
function toExported(ck: CheckpointContent): ExportedState {
  const c = ck.config as Record<string, any>;
  return {
    config: { finetune: c.finetune, lora_rank: c.lora_rank, lora_alpha: c.lora_alpha, lora_targets: c.lora_targets, preset: c.preset },
    weights: ck.adapter?.tensors ?? ck.weights ?? {},
    optimizer: ck.optimizer,
    trainerState: ck.trainerState as ExportedState['trainerState'],
  };
}

async function loadWeightsInto(s: Session, name: string): Promise<TrainingState> {
  const dir = savedDir(s, 'weights', name);
  if (!fs.existsSync(dir)) throw new EngineError('not_found', `no saved weights named "${name}" in this session`);
  const ck = await loadCheckpoint(dir, { preset: config.preset });
  const t = new TrainingState(base, s.opts);
  try {
    t.importWeights(toExported(ck));
  } catch (e) {
    t.dispose();
    throw e;
  }
  return t;
}

function isUserError(e: unknown): boolean {
  if (e instanceof EngineError) return true;
  const name = (e as Error)?.name;
  return ['ShapeError', 'ConfigError', 'CheckpointError', 'OptimError', 'TrainerError', 'LoraError'].includes(name);
}

port.on('message', (m: ToWorker) => {
  if (m.kind === 'init') {
    (async () => {
      try {
        const report = await initBackend(m.backend, (line) => send({ kind: 'log', level: 'info', message: line }));
        backendName = report.name;
        config = makeConfig(m.preset);
        baseSeed = m.seed;
        base = BaseWeights.create(config, m.seed);
        send({
          kind: 'ready',
          info: {
            preset: config.preset, backend: backendName, backendFallbacks: report.fallbacks.map((f) => `${f.backend}: ${f.reason}`),
            imageSize: config.imageSize, imageSlots: config.slots, stateDim: config.stateDim, actionDim: config.actionDim,
            actionHorizon: config.horizon, maxTokenLen: config.maxTokenLen, baseParams: base.paramCount,
          },
        });
      } catch (e) {
        send({ kind: 'init_failed', error: (e as Error).message });
      }
    })();
    return;
  }
  run(m.session, m.op, m.args).then(
    ([result, transfer]) => send({ kind: 'result', callId: m.callId, result }, transfer),
    (e) => {
      const err = e as Error & { code?: string };
      const user = isUserError(e);
      send({ kind: 'error', callId: m.callId, error: err.message, code: typeof err.code === 'string' ? err.code : user ? 'bad_request' : 'internal', internal: !user, stack: err.stack });
    },
  );
});
