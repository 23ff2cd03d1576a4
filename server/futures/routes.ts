/**
 * The futures API (PROTOCOL.md section 7; xorl's and Tinker's `/api/v1/...`), for clients that
 * poll over HTTP instead of holding a websocket. A model is a training session (the same rows,
 * limits and engine as `/v1/training_sessions`; `model_id` is the session id). Training ops
 * answer at once with `{"request_id", "model_id"}` and run through `runOp`, the code path of the
 * session websocket, so both give the same numbers; `retrieve_future` long-polls for the result.
 *
 * Ops and their engine op (arguments as the websocket op's, section 3):
 *   forward_backward, forward, optim_step (also Tinker's `adam_params`), abort_gradient_epoch,
 *   sample; save_weights -> save_state (weights + optimizer, xorl's full checkpoint; `name` or
 *   `path`, default an auto-timestamped name); load_weights -> load_state (restores both);
 *   save_weights_for_sampler -> save_weights (weights only, usable by `sample` and policies).
 * `create_model` answers at once with the `model_id` (as xorl) and also a `request_id` whose
 * future settles when the model is ready (as Tinker); ops sent before that wait for it.
 */
import crypto from 'node:crypto';
import path from 'node:path';
import type { TemplatedApp } from 'uWebSockets.js';
import { ProtocolError } from '../../protocol/errors.ts';
import { parseRequest, type SessionRequest } from '../../protocol/messages.ts';
import { requireOwner } from '../auth.ts';
import { EngineError } from '../engine/messages.ts';
import { HttpError, route, type Req } from '../http.ts';
import { log } from '../log.ts';
import { runOp } from '../ops.ts';
import { errorText } from '../session-ws.ts';
import { parseSessionConfig, type LiveSession, type SessionManager } from '../sessions.ts';
import type { ServerConfig } from '../config.ts';
import type { Store } from '../store.ts';
import { deleteCheckpoint, listCheckpoints } from './checkpoints.ts';
import { formatOf, readBody, sendAs, type Body, type Format } from './codec.ts';
import { SeqOrder } from './seq.ts';
import { FutureStore, type Future } from './store.ts';

export interface FuturesDeps {
  store: Store;
  sessions: SessionManager;
  config: ServerConfig & { futureWaitS?: number; futureSeqGapS?: number };
  /** The server's base URL, for the `url` of created models (read when a model is created). */
  baseUrl?: () => string;
}

export interface FuturesHandle {
  futures: FutureStore;
  /** Stop timers; held requests fail. */
  close(): void;
}

/** A futures op: its engine (websocket) op and the body fields it takes besides model_id, seq_id. */
const OPS: Record<string, { op: SessionRequest['op']; args: string[] }> = {
  forward_backward: { op: 'forward_backward', args: ['data', 'codec', 'loss_fn'] },
  forward: { op: 'forward', args: ['data', 'codec', 'keep'] },
  optim_step: { op: 'optim_step', args: ['learning_rate', 'beta1', 'beta2', 'eps', 'weight_decay', 'grad_clip_norm', 'adam_params'] },
  abort_gradient_epoch: { op: 'abort_gradient_epoch', args: [] },
  sample: { op: 'sample', args: ['data', 'codec', 'num_steps', 'weights', 'seed'] },
  save_weights: { op: 'save_state', args: ['name', 'path', 'overwrite'] },
  load_weights: { op: 'load_state', args: ['name', 'path'] },
  save_weights_for_sampler: { op: 'save_weights', args: ['name', 'path', 'overwrite'] },
};

const ADAM_KEYS = ['learning_rate', 'beta1', 'beta2', 'eps', 'weight_decay', 'grad_clip_norm'];

function checkFields(body: Record<string, unknown>, allowed: string[], what: string): void {
  for (const k of Object.keys(body)) {
    if (!allowed.includes(k)) throw new HttpError(400, `${what} has no field "${k}"; it takes ${allowed.join(', ')}`);
  }
}

function modelIdOf(body: Record<string, unknown>, alias?: string): string {
  const id = body.model_id ?? (alias ? body[alias] : undefined);
  if (typeof id !== 'string' || id === '') throw new HttpError(400, `model_id must be the string that create_model returned, got ${JSON.stringify(id)}`);
  return id;
}

function seqIdOf(body: Record<string, unknown>): number | null {
  const v = body.seq_id;
  if (v === undefined || v === null) return null;
  const n = typeof v === 'bigint' ? Number(v) : v;
  if (typeof n !== 'number' || !Number.isSafeInteger(n) || n < 0) throw new HttpError(400, `seq_id must be an integer >= 0, got ${JSON.stringify(typeof v === 'bigint' ? String(v) : v)}`);
  return n;
}

/** Seconds-resolution name for `save_weights` without a name (xorl: "path: null = auto-timestamped"). */
function autoName(): string {
  return `ckpt-${new Date().toISOString().replace(/[-:]/g, '').replace(/\.\d+Z$/, 'Z')}-${crypto.randomBytes(3).toString('hex')}`;
}

/** The websocket request of a futures op body (then validated by parseRequest). */
function wsRequest(name: string, body: Record<string, unknown>): Record<string, unknown> {
  const spec = OPS[name]!;
  const req: Record<string, unknown> = { id: 0, op: spec.op };
  for (const k of spec.args) if (body[k] !== undefined) req[k] = body[k];
  if (name === 'optim_step' && req.adam_params !== undefined) {
    const p = req.adam_params;
    delete req.adam_params;
    if (p === null || typeof p !== 'object' || Array.isArray(p)) throw new HttpError(400, 'adam_params must be an object {learning_rate, beta1, beta2, eps, ...}');
    for (const [k, v] of Object.entries(p)) {
      if (!ADAM_KEYS.includes(k)) throw new HttpError(400, `adam_params has no field "${k}"; it takes ${ADAM_KEYS.join(', ')}`);
      if (req[k] !== undefined) throw new HttpError(400, `${k} is given both at the top level and in adam_params`);
      req[k] = v;
    }
  }
  if ('path' in req) {
    if (req.name !== undefined) throw new HttpError(400, 'give either name or path, not both');
    req.name = req.path;
    delete req.path;
  }
  if ((spec.op === 'save_state' || spec.op === 'save_weights') && (req.name === undefined || req.name === null)) req.name = autoName();
  return req;
}

/** Map a thrown value to status and body, in PROTOCOL.md section 0's terms. */
function errorAnswer(r: Req, err: unknown): [number, Record<string, unknown>] {
  if (err instanceof HttpError) return [err.status, { error: err.message, ...err.extra }];
  if (err instanceof ProtocolError) return [err.code === 'too_large' ? 413 : 400, { error: err.message, code: err.code }];
  if (err instanceof EngineError) return [err.code === 'not_found' ? 404 : err.code === 'conflict' ? 409 : 400, { error: err.message, code: err.code }];
  const requestId = `req-${crypto.randomBytes(6).toString('hex')}`;
  log.error(`${r.method} ${r.url} failed (${requestId})`, err);
  return [500, { error: 'internal error', request_id: requestId }];
}

export function mountFutures(app: TemplatedApp, deps: FuturesDeps): FuturesHandle {
  const { store, sessions, config } = deps;
  const waitMs = (config.futureWaitS ?? 45) * 1000;
  const futures = new FutureStore({ ttlS: config.futureTtlS });
  const seq = new SeqOrder({ gapWaitS: config.futureSeqGapS ?? 30, ttlS: config.futureTtlS });
  const limits = { maxBatch: config.maxBatch, maxPromptBytes: config.maxPromptBytes };
  const bodyLimit = config.maxSessionMessageBytes;
  const ownerRoot = (owner: string) => path.dirname(sessions.sessionDir(owner, 'x'));
  const gates = new Map<string, { open: boolean; promise: Promise<void> }>();
  // Models closed by other routes (idle cleanup, /v1 close, shutdown): drop their per-model state.
  const pruneTimer = setInterval(() => {
    for (const id of new Set([...gates.keys(), ...seq.modelIds()])) {
      if (sessions.live.has(id)) continue;
      gates.delete(id);
      seq.forget(id, `model ${id} was closed before this request ran`);
    }
  }, 30_000).unref();

  /** A handler with the caller's owner id and body; any throw is answered in the request's format. */
  const handle = (fn: (r: Req, owner: string, body: Body) => Promise<void> | void) =>
    route(0, async (r) => {
      const fmt: Format = formatOf(r);
      try {
        const owner = requireOwner(store, r);
        const body = r.method === 'GET' ? { value: Object.fromEntries(r.query), raw: Buffer.alloc(0), format: fmt } : await readBody(r, bodyLimit);
        await fn(r, owner, body);
      } catch (err) {
        const [status, answer] = errorAnswer(r, err);
        sendAs(r, fmt, status, answer);
      }
    });
  const post = (name: string, fn: Parameters<typeof handle>[0]) => app.post(`/api/v1/${name}`, handle(fn));

  /** The owner's open model. @throws HttpError 404 (unknown or another owner's), 409 (closed). */
  const modelOf = (owner: string, id: string): LiveSession => {
    const row = store.getSession(id);
    if (!row || row.owner !== owner) throw new HttpError(404, `no model ${id}`);
    const live = sessions.live.get(id);
    if (!live || (row.status !== 'starting' && row.status !== 'ready')) {
      throw new HttpError(409, `model ${id} is ${row.status}${row.error ? `: ${row.error}` : ''}; create a new one with create_model`);
    }
    return live;
  };

  /**
   * Resolves once the model's engine is ready (rejects when it failed to start). One gate per
   * model, so that ops queued while it starts reach runOp in the order they were admitted.
   */
  const gateOf = (live: LiveSession) => {
    let g = gates.get(live.id);
    if (g) return g;
    const gate = { open: false, promise: Promise.resolve() };
    gate.promise = new Promise<void>((resolve, reject) => {
      const check = () => {
        if (live.engine && sessions.live.get(live.id) === live) {
          gate.open = true;
          return resolve();
        }
        const row = store.getSession(live.id);
        if (!row || (row.status !== 'starting' && row.status !== 'ready') || !sessions.live.has(live.id)) {
          return reject(new EngineError('not_ready', `model ${live.id} could not start: ${row?.error ?? row?.status ?? 'gone'}`));
        }
        setTimeout(check, 20);
      };
      check();
    });
    gate.promise.catch(() => undefined);
    gates.set(live.id, gate);
    return gate;
  };

  /** Settle `f` with the outcome of `p`; failures get Tinker's category. */
  const settleWith = (f: Future, p: Promise<unknown>) =>
    p.then(
      (result) => futures.settle(f, { result }),
      (err) => {
        const { error, code } = errorText(err, `model ${f.modelId} ${f.op} ${f.id}`);
        futures.settle(f, { error, code, category: code === 'internal' || code === 'not_ready' ? 'server' : 'user' });
      },
    );

  /** Hand a parsed request to the model's ordered engine chain (the websocket's runOp). */
  const start = (f: Future, live: LiveSession, req: SessionRequest) => {
    f.stage = 'queued';
    live.touch();
    const gate = gateOf(live);
    const run = () => runOp(live, req, config).then((r) => shapeResult(live, req, r));
    settleWith(f, gate.open ? run() : gate.promise.then(run));
  };

  const shapeResult = (live: LiveSession, req: SessionRequest, r: unknown): unknown => {
    if (req.op === 'save_state' || req.op === 'save_weights' || req.op === 'load_state') {
      const kind = req.op === 'save_weights' ? 'weights' : 'states';
      return { name: req.name, path: path.join(sessions.sessionDir(live.row.owner, live.id), kind, req.name), checkpoint_id: `${live.id}/${kind}/${req.name}` };
    }
    return r;
  };

  for (const name of Object.keys(OPS)) {
    post(name, (r, owner, body) => {
      checkFields(body.value, ['model_id', 'seq_id', ...OPS[name]!.args], name);
      const modelId = modelIdOf(body.value);
      const seqId = seqIdOf(body.value);
      const req = parseRequest(wsRequest(name, body.value), limits);
      const live = modelOf(owner, modelId);
      const admit = () => {
        // The websocket's read-ahead bound, per model: parsed batches wait in memory until they run.
        const pending = futures.pendingCount(modelId);
        if (pending >= config.readAhead) {
          throw new HttpError(429, `model ${modelId} has ${pending} requests pending (limit ${config.readAhead}, --read-ahead); retrieve their results before sending more`);
        }
        return futures.create(owner, modelId, name);
      };
      if (seqId === null) {
        const f = admit();
        start(f, live, req);
        return sendAs(r, body.format, 200, { request_id: f.id, model_id: modelId });
      }
      const hash = crypto.createHash('sha256').update(r.url).update('\0').update(body.format).update('\0').update(body.raw).digest('hex');
      const repeat = seq.repeatOf(modelId, seqId, hash);
      if (repeat) return sendAs(r, body.format, 200, { request_id: repeat, model_id: modelId });
      const f = admit();
      const started = seq.enqueue(modelId, seqId, hash, f.id, () => start(f, live, req), (message) => futures.settle(f, { error: message, category: 'user', code: 'seq_gap' }));
      if (!started) f.stage = seq.waitingFor(modelId, seqId);
      sendAs(r, body.format, 200, { request_id: f.id, model_id: modelId });
    });
  }

  post('retrieve_future', async (r, owner, body) => {
    checkFields(body.value, ['request_id'], 'retrieve_future');
    const id = body.value.request_id;
    if (typeof id !== 'string' || id === '') throw new HttpError(400, `request_id must be the string a request answered, got ${JSON.stringify(id)}`);
    const f = futures.get(id, owner);
    if (f === 'expired') throw new HttpError(410, `request ${id} expired: results are kept for ${config.futureTtlS} s after they are ready`);
    if (!f) throw new HttpError(404, `no request ${id}`);
    if (!(await futures.wait(f, waitMs))) {
      return sendAs(r, body.format, 200, { type: 'try_again', request_id: id, queue_state: 'active', queue_state_reason: f.stage });
    }
    const o = f.outcome!;
    sendAs(r, body.format, 200, 'result' in o ? o.result : { ...o, request_id: id });
  });

  post('create_model', (r, owner, body) => {
    const v = { ...body.value };
    checkFields(v, ['base_model', 'finetune', 'rank', 'alpha', 'targets', 'action_horizon', 'seed', 'lora_config'], 'create_model');
    if (v.lora_config !== undefined) {
      const lc = v.lora_config;
      delete v.lora_config;
      if (lc === null || typeof lc !== 'object' || Array.isArray(lc)) throw new HttpError(400, 'lora_config must be an object {rank, alpha, targets}');
      for (const [k, x] of Object.entries(lc)) {
        if (!['rank', 'alpha', 'targets'].includes(k)) throw new HttpError(400, `lora_config has no field "${k}"; it takes rank, alpha, targets`);
        if (v[k] !== undefined) throw new HttpError(400, `${k} is given both at the top level and in lora_config`);
        v[k] = x;
      }
    }
    const cfg = parseSessionConfig(v);
    const row = sessions.create(owner, cfg, deps.baseUrl?.() ?? '');
    const live = sessions.live.get(row.id)!;
    const f = futures.create(owner, row.id, 'create_model');
    settleWith(f, gateOf(live).promise.then(() => ({ ...modelJson(row.id), status: 'ready' })));
    sendAs(r, body.format, 200, { request_id: f.id, model_id: row.id, status: row.status, ...row.config });
  });

  const modelJson = (id: string): Record<string, unknown> => {
    const row = store.getSession(id)!;
    const live = sessions.live.get(id);
    return {
      model_id: id, status: row.status, created_at: row.created_at, ...row.config,
      action_horizon: live?.actionHorizon || (row.config as { action_horizon?: unknown }).action_horizon,
      trainable_params: live?.trainableParams ?? null, pending_gradients: live?.pendingGradients ?? 0,
      pending_futures: futures.pendingCount(id), cameras: live?.cameras ?? [],
      last_activity_at: live ? Math.floor(live.lastActivityMs / 1000) : null, error: row.error,
    };
  };

  const sessionInfo = (r: Req, owner: string, body: Body) => {
    checkFields(body.value, ['model_id'], 'session_info');
    const only = body.value.model_id === undefined ? null : modelIdOf(body.value);
    if (only !== null) modelOf(owner, only);
    const rows = store.listSessions(owner).filter((s) => (s.status === 'starting' || s.status === 'ready') && (only === null || s.id === only));
    sendAs(r, body.format, 200, { sessions: rows.map((s) => modelJson(s.id)) });
  };
  app.get('/api/v1/session_info', handle(sessionInfo));
  post('session_info', sessionInfo);

  post('session_heartbeat', (r, owner, body) => {
    checkFields(body.value, ['model_id', 'session_id'], 'session_heartbeat');
    const live = modelOf(owner, modelIdOf(body.value, 'session_id'));
    live.touch();
    sendAs(r, body.format, 200, { model_id: live.id, status: store.getSession(live.id)!.status, last_activity_at: Math.floor(live.lastActivityMs / 1000) });
  });

  const closeModel = (name: string) =>
    post(name, async (r, owner, body) => {
      checkFields(body.value, ['model_id', 'session_id'], name);
      const id = modelIdOf(body.value, 'session_id');
      const row = store.getSession(id);
      if (!row || row.owner !== owner) throw new HttpError(404, `no model ${id}`);
      seq.forget(id, `model ${id} was closed by ${name} before this request ran`);
      gates.delete(id);
      await sessions.close(id);
      sendAs(r, body.format, 200, { model_id: id, status: store.getSession(id)!.status });
    });
  closeModel('unload_model');
  closeModel('kill_session');

  /** sleep / wake_up: engine ops of the lead's engine, run in the model's order after earlier ops. */
  const engineControl = (name: 'sleep' | 'wake_up') =>
    post(name, async (r, owner, body) => {
      checkFields(body.value, ['model_id'], name);
      const live = modelOf(owner, modelIdOf(body.value));
      if (!gateOf(live).open || !live.engine) throw new HttpError(409, `model ${live.id} is starting; retry when create_model's future is ready`);
      const engine = live.engine;
      const p = live.chain.then(() => engine.call<{ result: unknown; pending_gradients: number }>(live.id, name, {}));
      live.chain = p.catch(() => undefined);
      const a = await p;
      live.touch();
      sendAs(r, body.format, 200, { model_id: live.id, ...(a?.result && typeof a.result === 'object' ? a.result : {}) });
    });
  engineControl('sleep');
  engineControl('wake_up');

  const listCk = (r: Req, owner: string, body: Body) => {
    checkFields(body.value, ['model_id'], 'list_checkpoints');
    let only: string | undefined;
    if (body.value.model_id !== undefined) {
      only = modelIdOf(body.value);
      const row = store.getSession(only);
      if (!row || row.owner !== owner) throw new HttpError(404, `no model ${only}`);
    }
    sendAs(r, body.format, 200, { checkpoints: listCheckpoints(ownerRoot(owner), only) });
  };
  app.get('/api/v1/list_checkpoints', handle(listCk));
  post('list_checkpoints', listCk);

  post('delete_checkpoint', (r, owner, body) => {
    checkFields(body.value, ['checkpoint_id'], 'delete_checkpoint');
    const id = body.value.checkpoint_id;
    deleteCheckpoint(ownerRoot(owner), id);
    sendAs(r, body.format, 200, { checkpoint_id: id, deleted: true });
  });

  app.get('/api/v1/healthz', handle((r, _owner, body) => sendAs(r, body.format, 200, { status: 'ok' })));

  return {
    futures,
    close() {
      clearInterval(pruneTimer);
      seq.close();
      futures.close();
    },
  };
}
