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
import { loadCheckpoint, saveCheckpoint } from '../../kernels/checkpoint.ts';
import type { ModelBatch } from '../../kernels/batch.ts';
import { EngineError, type FromWorker, type ToWorker } from './messages.ts';

const port = parentPort!;
let config: PolicyConfig;
let base: BaseWeights;
let backendName = '';

interface Session {
  state: TrainingState;
  dir: string; // <data>/checkpoints/<owner>/<session>
  opts: { finetune: 'lora' | 'full'; rank: number; alpha: number; targets: string[]; seed: number };
}
const sessions = new Map<string, Session>();

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
function run(sessionId: string, op: string, args: Record<string, any>): [unknown, ArrayBuffer[]] {
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
      const r = s.state.forward(args.batch as ModelBatch, { keep: !!args.keep });
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
        temp = loadWeightsInto(s, args.weights);
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
      saveCheckpoint(dir, checkpointContent(s, op === 'save_state', args.cameras, args.actionHorizon), { overwrite: true });
      return [answer(s, op === 'save_state' ? args.name : dir), []];
    }
    case 'load_state': {
      const s = session(sessionId);
      const dir = savedDir(s, 'states', args.name);
      if (!fs.existsSync(dir)) throw new EngineError('not_found', `no saved state named "${args.name}" in this session`);
      const ck = loadCheckpoint(dir);
      s.state.importState(ck as any);
      return [answer(s, { cameras: (ck.config as any).cameras ?? [] }), []];
    }
    default:
      throw new EngineError('bad_request', `unknown engine op "${op}"`);
  }
}

function checkpointContent(s: Session, withOptimizer: boolean, cameras: string[], actionHorizon: number): any {
  const exported = withOptimizer ? s.state.exportState() : s.state.exportWeights();
  return {
    ...exported,
    config: { ...(exported as any).config, preset: config.preset, cameras, action_horizon: actionHorizon, finetune: s.opts.finetune, lora_rank: s.opts.rank, lora_alpha: s.opts.alpha, lora_targets: s.opts.targets },
  };
}

function loadWeightsInto(s: Session, name: string): TrainingState {
  const dir = savedDir(s, 'weights', name);
  if (!fs.existsSync(dir)) throw new EngineError('not_found', `no saved weights named "${name}" in this session`);
  const t = new TrainingState(base, s.opts);
  t.importWeights(loadCheckpoint(dir) as any);
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
  try {
    const [result, transfer] = run(m.session, m.op, m.args);
    send({ kind: 'result', callId: m.callId, result }, transfer);
  } catch (e) {
    const err = e as Error & { code?: string };
    const user = isUserError(e);
    send({ kind: 'error', callId: m.callId, error: err.message, code: typeof err.code === 'string' ? err.code : user ? 'bad_request' : 'internal', internal: !user, stack: err.stack });
  }
});
