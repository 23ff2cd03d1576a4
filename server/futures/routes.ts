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
 * A model holds at most `--read-ahead` unsettled requests (429 past it), as a websocket does.
 * `retrieve_future` answers the op's result; `{"type": "try_again", "request_id", "queue_state":
 * "active", "queue_state_reason"}` after `--future-wait-s` (45) without one; `{"error",
 * "category": "user" | "server", "code", "request_id"}` for a failed op; 404 for an id never
 * given (or another owner's), 410 for one whose result was dropped after `--future-ttl-s`.
 * seq_id rules: seq.ts. Management routes: manage.ts.
 */
import crypto from 'node:crypto';
import path from 'node:path';
import type { TemplatedApp } from 'uWebSockets.js';
import { parseRequest, type SessionRequest } from '../../protocol/messages.ts';
import { RawMsgpack } from '../../protocol/msgpack.ts';
import { HttpError } from '../http/http.ts';
import { runOp } from '../sessions/ops.ts';
import { errorText } from '../sessions/socket.ts';
import { parseSessionConfig, publicConfig, type LiveSession } from '../sessions/sessions.ts';
import { sendAs } from './codec.ts';
import { FuturesContext, publicModelId, type FuturesDeps } from './context.ts';
import { mountManagement } from './manage.ts';
import { mountInferenceIntegration } from './inference.ts';
import { OPS, modelIdOf, seqIdOf, wsRequest } from './requests.ts';
import { checkFields, withIgnored } from './fields.ts';
import { checkpointIdOfPath, checkpointPath } from './checkpoints.ts';
import type { Future, FutureStore } from './store.ts';

export type { FuturesDeps } from './context.ts';

/** A client-chosen model id (xorl's create_model `model_id`). */
const MODEL_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;

export interface FuturesHandle {
  futures: FutureStore;
  /** Stop timers; requests held for a seq_id gap fail. */
  close(): void;
}

export function mountFutures(app: TemplatedApp, deps: FuturesDeps): FuturesHandle {
  const { sessions, config } = deps;
  const ctx = new FuturesContext(app, deps);
  const { futures, seq } = ctx;
  const limits = { maxBatch: config.maxBatch, maxPromptBytes: config.maxPromptBytes };

  /** Settle `f` with the outcome of `p`; failures get Tinker's category. */
  const settleWith = (f: Future, p: Promise<unknown>) =>
    p.then(
      (result) => futures.settle(f, { result }),
      (err) => {
        const { error, code } = errorText(err, `model ${f.modelId} ${f.op} ${f.id}`);
        futures.settle(f, { error, code, category: code === 'internal' || code === 'not_ready' ? 'server' : 'user' });
      },
    );

  /** Results of the checkpoint ops name the folder as list_checkpoints does. */
  const shapeResult = (live: LiveSession, req: SessionRequest, r: unknown): unknown => {
    if (req.op !== 'save_state' && req.op !== 'save_weights' && req.op !== 'load_state') return r;
    const kind = req.op === 'save_weights' ? 'weights' : 'states';
    const dir = req.op === 'load_state' && req.dir ? req.dir : path.join(sessions.sessionDir(live.row.owner, live.id), kind, req.name);
    return { name: req.name, path: dir, checkpoint_id: path.relative(ctx.ownerRoot(live.row.owner), dir).split(path.sep).join('/') };
  };

  /** Hand a parsed request to the model's ordered engine chain (the websocket's runOp). */
  const start = (f: Future, live: LiveSession, req: SessionRequest) => {
    f.stage = 'queued';
    live.touch();
    const gate = ctx.gateOf(live);
    const run = () => runOp(live, req, config).then((r) => shapeResult(live, req, r));
    settleWith(f, gate.open ? run() : gate.promise.then(run));
  };

  /**
   * load_weights' source when it is not a bare name of the model's own states: the
   * `checkpoint_id`, or the `path`, that save_weights / list_checkpoints gave, for any state of
   * this key (another model's, one saved before a restart). Takes them out of `v`, leaving the
   * state's name. @returns the checkpoint id, or null for a bare name.
   */
  const loadSource = (owner: string, v: Record<string, unknown>): string | null => {
    let id: string | null = null;
    if (v.checkpoint_id !== undefined) {
      if (v.name !== undefined || v.path !== undefined) throw new HttpError(400, 'give one of name, path, checkpoint_id');
      if (typeof v.checkpoint_id !== 'string') throw new HttpError(400, `checkpoint_id must be a string, got ${JSON.stringify(v.checkpoint_id)}`);
      id = v.checkpoint_id;
    } else if (typeof v.path === 'string') id = checkpointIdOfPath(ctx.ownerRoot(owner), v.path);
    if (id === null) return null;
    checkpointPath(ctx.ownerRoot(owner), id); // 400 malformed, 404 missing: before the request is accepted
    if (id.split('/')[1] !== 'states') throw new HttpError(400, `checkpoint ${id} holds weights only (save_weights_for_sampler); load_weights needs one that save_weights wrote (weights + optimizer state)`);
    delete v.checkpoint_id;
    delete v.path;
    v.name = id.split('/')[2];
    return id;
  };

  for (const name of Object.keys(OPS)) {
    ctx.post(name, async (r, owner, body) => {
      checkFields(r, body.value, ['model_id', 'seq_id', ...OPS[name]!.args], name);
      const publicId = modelIdOf(body.value);
      const seqId = seqIdOf(body.value);
      const v = { ...body.value };
      const loadId = name === 'load_weights' ? loadSource(owner, v) : null;
      const req = parseRequest(wsRequest(name, v, r), limits);
      const live = await ctx.modelOf(owner, publicId);
      if (loadId !== null && req.op === 'load_state' && loadId.split('/')[0] !== live.id) req.dir = checkpointPath(ctx.ownerRoot(owner), loadId);
      const modelId = live.id; // per-model state is keyed by the Vela id: a name may be reused after kill
      const admit = () => {
        // The websocket's read-ahead bound, per model: parsed batches wait in memory until they run.
        const pending = futures.pendingCount(modelId);
        if (pending >= config.readAhead) {
          throw new HttpError(429, `model ${publicId} has ${pending} requests pending (limit ${config.readAhead}, --read-ahead); retrieve their results before sending more`);
        }
        return futures.create(owner, modelId, name, seqId);
      };
      const ack = (requestId: string, extra: Record<string, unknown> = {}) => sendAs(r, body.format, 200, withIgnored(r, { request_id: requestId, model_id: publicId, ...extra }));
      if (seqId === null) {
        const f = admit();
        start(f, live, req);
        return ack(f.id);
      }
      // The answer echoes seq_id as sent: same msgpack type, or the same JSON digits.
      const echo = { seq_id: body.seqIdRaw ? new RawMsgpack(body.seqIdRaw) : seqId };
      const hash = crypto.createHash('sha256').update(r.url).update('\0').update(body.format).update('\0').update(body.raw).digest('hex');
      const repeat = seq.repeatOf(modelId, seqId, hash);
      if (repeat) return ack(repeat, echo);
      const f = admit();
      const fail = (message: string) => futures.settle(f, { error: message, category: 'user', code: 'seq_gap' });
      if (!seq.enqueue(modelId, seqId, hash, f.id, () => start(f, live, req), fail)) f.stage = 'held';
      ack(f.id, echo);
    });
  }

  ctx.post('retrieve_future', async (r, owner, body) => {
    checkFields(r, body.value, ['request_id'], 'retrieve_future');
    const id = body.value.request_id;
    if (typeof id !== 'string' || id === '') throw new HttpError(400, `request_id must be the string a request answered, got ${JSON.stringify(id)}`);
    const f = futures.get(id, owner);
    if (f === 'expired') throw new HttpError(410, `request ${id} expired: results are kept for ${config.futureTtlS} s after they are ready`);
    if (!f) throw new HttpError(404, `no request ${id}`);
    sessions.live.get(f.modelId)?.touch(); // a client waiting on a long op is not idle
    if (!(await futures.wait(f, config.futureWaitS * 1000))) {
      const reason = f.stage === 'held' && f.seqId !== null ? seq.waitingFor(f.modelId, f.seqId) : f.stage;
      return sendAs(r, body.format, 200, { type: 'try_again', request_id: id, queue_state: 'active', queue_state_reason: reason });
    }
    const o = f.outcome!;
    sendAs(r, body.format, 200, 'result' in o ? o.result : { ...o, request_id: id });
  });

  ctx.post('create_model', async (r, owner, body) => {
    const v = { ...body.value };
    // session_id / model_seq_id: Tinker's (create_session's id; the model's order within it).
    checkFields(r, v, ['model_id', 'base_model', 'base', 'finetune', 'rank', 'alpha', 'targets', 'action_horizon', 'seed', 'lora_config', 'session_id', 'model_seq_id'], 'create_model');
    const name = v.model_id ?? null;
    const clientSession = v.session_id ?? null;
    delete v.model_id;
    delete v.session_id;
    delete v.model_seq_id;
    if (name !== null && (typeof name !== 'string' || !MODEL_NAME.test(name) || name.startsWith('ts-'))) {
      throw new HttpError(400, `model_id must match ${MODEL_NAME.source} and not start with "ts-" (Vela's own ids), got ${JSON.stringify(name)}`);
    }
    const loraConfig = v.lora_config !== undefined;
    if (loraConfig) {
      const lc = v.lora_config;
      delete v.lora_config;
      if (lc === null || typeof lc !== 'object' || Array.isArray(lc)) throw new HttpError(400, 'lora_config must be an object {rank, alpha, targets}');
      checkFields(r, lc as Record<string, unknown>, ['rank', 'alpha', 'targets'], 'lora_config');
      for (const [k, x] of Object.entries(lc)) {
        if (!['rank', 'alpha', 'targets'].includes(k)) continue;
        if (v[k] !== undefined) throw new HttpError(400, `${k} is given both at the top level and in lora_config`);
        v[k] = x;
      }
      if (name === 'default') throw new HttpError(400, 'model_id "default" is reserved for the full-weight model (xorl): leave out lora_config, or name the LoRA model otherwise');
    }
    // xorl: full-weight training is the reserved model "default".
    if (name === 'default') {
      if (v.finetune !== undefined && v.finetune !== 'full') throw new HttpError(400, `model_id "default" is reserved for the full-weight model (xorl); got finetune ${JSON.stringify(v.finetune)}`);
      const lora = ['rank', 'alpha', 'targets'].find((k) => v[k] != null);
      if (lora) throw new HttpError(400, `model_id "default" is reserved for the full-weight model (xorl): leave out ${lora}, or name the LoRA model otherwise`);
      v.finetune = 'full';
    } else if (loraConfig && v.finetune === 'full') {
      throw new HttpError(400, 'lora_config applies to LoRA models, and this one is finetune "full", which trains every weight: leave lora_config out, or finetune out (LoRA is the default)');
    } else if (v.finetune === 'full') {
      // xorl: "full-weight mode only supports the reserved model_id="default" session"; without
      // this a second full-weight model (another name, or a ts- id) would train beside "default".
      throw new HttpError(400, `full-weight mode only supports the reserved model_id="default" session (xorl); got ${name === null ? 'no model_id' : `model_id ${JSON.stringify(name)}`}: create model_id "default" for full-weight training, or leave finetune out for a LoRA model`);
    }
    const sessionEntry = clientSession === null ? null : await ctx.clientSession(owner, clientSession);
    const row = await sessions.create(owner, parseSessionConfig(v), deps.baseUrl?.() ?? '', name as string | null);
    if (sessionEntry) await deps.store.addClientSessionModel(sessionEntry.id, row.id);
    const f = futures.create(owner, row.id, 'create_model');
    settleWith(f, ctx.gateOf(sessions.live.get(row.id)!).promise.then(async () => ({ ...(await ctx.modelJson(row.id)), status: 'ready' })));
    sendAs(r, body.format, 200, withIgnored(r, { request_id: f.id, model_id: publicModelId(row), training_session_id: row.id, status: row.status, ...publicConfig(row.config) }));
  });

  mountManagement(ctx);
  if (deps.inference) mountInferenceIntegration(ctx, deps.inference);
  return { futures, close: () => ctx.close() };
}
