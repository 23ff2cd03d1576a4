/**
 * Model management of the futures API (xorl's "Model / Session Management", "Checkpointing"
 * and "Health & Control"): answered at once, not as futures.
 * - `create_session` (Tinker): a client session id that create_model's `session_id` and
 *   `session_heartbeat` take; a heartbeat on it refreshes every model created in it. Stored:
 *   it resolves after a restart (its models do not survive one: they are closed); one without an
 *   open model and without a heartbeat for --session-idle-timeout-s is deleted.
 * - `session_info` (GET or POST): the owner's open models, or one (`model_id`); a model put to
 *   sleep shows `status: "asleep"` (and `asleep: true`) until wake_up.
 * - `get_info` (Tinker; GET or POST, `model_id`): the model's info with Tinker's `model_data`
 *   (`arch`: base_model, `model_name`: the base checkpoint, `tokenizer_id`), `is_lora`, `lora_rank`.
 * - `session_heartbeat`: refreshes the idle clock (`model_id`, or `session_id`: a client
 *   session's models, or one model).
 * - `unload_model` / `kill_session`: close the model (its requests not yet run fail); the
 *   same here, since every model is a tenant session of a shared engine. Its name is free again.
 * - `sleep` / `wake_up` (`/api/v1/`, one `model_id`): the engine ops of the same names, after
 *   the model's earlier ops. `POST /sleep` / `POST /wake_up` (xorl's whole-engine control): the
 *   same for every open model of the caller's key (a key cannot put another key's work to sleep).
 * - `list_checkpoints` (GET or POST, optional `model_id`) / `delete_checkpoint` (`checkpoint_id`).
 * - `weights_info` (`model_id`, `path` or `checkpoint_id`): a model's or a checkpoint's base
 *   model, LoRA rank and alpha, and the newest checkpoint.
 * - `GET /api/v1/training_runs`: the owner's models, open or closed, newest first, each with its
 *   newest checkpoint.
 * - `GET /api/v1/healthz`: `{"status": "ok"}`, open (a health probe has no key).
 */
import { nowS, randomId } from '../store/store.ts';
import { HttpError, route } from '../http/http.ts';
import { sendAs, formatOf } from './codec.ts';
import { checkpointIdOfPath, checkpointInfo, deleteCheckpoint, listCheckpoints } from './checkpoints.ts';
import { checkFields, withIgnored } from './fields.ts';
import { modelIdOf } from './requests.ts';
import { publicModelId, type FuturesContext } from './context.ts';
import type { LiveSession } from '../sessions/sessions.ts';
import { isRealModel } from '../models/bases.ts';
import { PALIGEMMA_TOKENIZER_REPO } from '../models/tokenizer.ts';

export function mountManagement(ctx: FuturesContext): void {
  const { store, sessions } = ctx.deps;

  ctx.post('create_session', async (r, owner, body) => {
    checkFields(r, body.value, ['tags', 'user_metadata', 'sdk_version'], 'create_session');
    const id = randomId('sess-');
    const now = nowS();
    await store.insertClientSession({ id, owner, created_at: now, last_seen_at: now, tags: body.value.tags ?? [], user_metadata: body.value.user_metadata ?? null });
    sendAs(r, body.format, 200, withIgnored(r, { session_id: id }));
  });

  ctx.getOrPost('session_info', async (r, owner, body) => {
    checkFields(r, body.value, ['model_id'], 'session_info');
    const only = body.value.model_id === undefined ? null : (await ctx.modelOf(owner, modelIdOf(body.value))).id;
    const rows = (await store.listSessions(owner)).filter((s) => (s.status === 'starting' || s.status === 'ready') && (only === null || s.id === only));
    sendAs(r, body.format, 200, withIgnored(r, { sessions: await Promise.all(rows.map((s) => ctx.modelJson(s.id))) }));
  });

  // Tinker's get_info: what a model is made of. `model_data.arch` is the public base_model (pi05),
  // `model_name` the base checkpoint as the client named it (a Hub id or folder; a preset's own name).
  ctx.getOrPost('get_info', async (r, owner, body) => {
    checkFields(r, body.value, ['model_id', 'type'], 'get_info');
    const row = await ctx.ownRow(owner, modelIdOf(body.value));
    const cfg = row.config as Record<string, unknown>;
    const real = isRealModel(cfg.base_model);
    const name = (cfg.base as string | null | undefined) ?? (cfg.base_model as string);
    const lora = cfg.finetune !== 'full';
    sendAs(r, body.format, 200, withIgnored(r, {
      ...(await ctx.modelJson(row.id)), type: 'get_info', model_name: name, is_lora: lora, lora_rank: lora ? cfg.rank : null,
      model_data: { arch: cfg.base_model, model_name: name, tokenizer_id: real ? PALIGEMMA_TOKENIZER_REPO : null },
    }));
  });

  ctx.post('session_heartbeat', async (r, owner, body) => {
    checkFields(r, body.value, ['model_id', 'session_id'], 'session_heartbeat');
    const sid = body.value.session_id;
    // A session_id alone names a client session when one has that id (else a model, as xorl's clients send it).
    if (body.value.model_id === undefined && typeof sid === 'string' && sid.startsWith('sess-') && (await store.getClientSession(sid))) {
      const entry = await ctx.clientSession(owner, sid);
      await store.touchClientSession(sid);
      const touched: string[] = [];
      for (const id of entry.models) {
        const live = sessions.live.get(id);
        if (!live) continue;
        live.touch();
        touched.push(publicModelId(live.row));
      }
      return sendAs(r, body.format, 200, withIgnored(r, { session_id: sid, models: touched, last_activity_at: Math.floor(Date.now() / 1000) }));
    }
    const live = await ctx.modelOf(owner, modelIdOf(body.value, 'session_id'));
    live.touch();
    sendAs(r, body.format, 200, withIgnored(r, { model_id: publicModelId(live.row), status: ctx.statusOf((await store.getSession(live.id))!), last_activity_at: Math.floor(live.lastActivityMs / 1000) }));
  });

  for (const name of ['unload_model', 'kill_session']) {
    ctx.post(name, async (r, owner, body) => {
      checkFields(r, body.value, ['model_id', 'session_id'], name);
      const given = modelIdOf(body.value, 'session_id');
      const row = await ctx.ownRow(owner, given);
      ctx.forget(row.id, `model ${given} was closed by ${name} before this request ran`);
      await sessions.close(row.id);
      sendAs(r, body.format, 200, withIgnored(r, { model_id: publicModelId(row), status: (await store.getSession(row.id))!.status }));
    });
  }

  const engineOp = async (live: LiveSession, op: 'sleep' | 'wake_up'): Promise<Record<string, unknown>> => {
    const result = await ctx.engineCall<unknown>(live, op);
    live.asleep = op === 'sleep'; // after the engine did it: a refused sleep (pending gradients) leaves the model awake
    return result && typeof result === 'object' ? (result as Record<string, unknown>) : {};
  };

  for (const name of ['sleep', 'wake_up'] as const) {
    ctx.post(name, async (r, owner, body) => {
      checkFields(r, body.value, ['model_id'], name);
      const live = await ctx.modelOf(owner, modelIdOf(body.value));
      sendAs(r, body.format, 200, withIgnored(r, { model_id: publicModelId(live.row), ...(await engineOp(live, name)) }));
    });
    // xorl's whole-engine control: every open, ready model of the key. A model that refuses
    // (pending gradients) is named with its reason; the others still go.
    ctx.app.post(`/${name}`, ctx.handle(async (r, owner, body) => {
      checkFields(r, body.value, [], name);
      const done: string[] = [];
      const refused: { model_id: string; error: string }[] = [];
      for (const live of [...sessions.live.values()].filter((l) => l.row.owner === owner && l.engine)) {
        try {
          await engineOp(live, name);
          done.push(publicModelId(live.row));
        } catch (e) {
          refused.push({ model_id: publicModelId(live.row), error: (e as Error).message });
        }
      }
      sendAs(r, body.format, 200, withIgnored(r, { status: name === 'sleep' ? 'sleeping' : 'awake', models: done, refused }));
    }));
  }

  ctx.getOrPost('list_checkpoints', async (r, owner, body) => {
    checkFields(r, body.value, ['model_id'], 'list_checkpoints');
    const only = body.value.model_id === undefined ? undefined : (await ctx.ownRow(owner, modelIdOf(body.value))).id;
    sendAs(r, body.format, 200, withIgnored(r, { checkpoints: listCheckpoints(ctx.ownerRoot(owner), only) }));
  });

  ctx.post('delete_checkpoint', (r, owner, body) => {
    checkFields(r, body.value, ['checkpoint_id'], 'delete_checkpoint');
    deleteCheckpoint(ctx.ownerRoot(owner), body.value.checkpoint_id);
    sendAs(r, body.format, 200, withIgnored(r, { checkpoint_id: body.value.checkpoint_id, deleted: true }));
  });

  ctx.getOrPost('weights_info', async (r, owner, body) => {
    checkFields(r, body.value, ['model_id', 'path', 'checkpoint_id'], 'weights_info');
    const v = body.value;
    const given = ['model_id', 'path', 'checkpoint_id'].filter((k) => v[k] !== undefined);
    if (given.length !== 1) throw new HttpError(400, `weights_info takes one of model_id, path, checkpoint_id; got ${given.length ? given.join(', ') : 'none'}`);
    const root = ctx.ownerRoot(owner);
    if (v.model_id !== undefined) {
      const row = await ctx.ownRow(owner, modelIdOf(v));
      const cfg = row.config as Record<string, unknown>;
      const newest = listCheckpoints(root, row.id)[0] ?? null;
      const lora = cfg.finetune !== 'full';
      return sendAs(r, body.format, 200, withIgnored(r, {
        model_id: publicModelId(row), training_session_id: row.id, status: ctx.statusOf(row), base_model: cfg.base_model, is_lora: lora,
        lora_rank: lora ? cfg.rank : null, lora_alpha: lora ? cfg.alpha : null, targets: cfg.targets, finetune: cfg.finetune, last_checkpoint: newest,
      }));
    }
    const id = v.checkpoint_id !== undefined ? String(v.checkpoint_id) : checkpointIdOfPath(root, String(v.path));
    if (id === null) throw new HttpError(400, `path ${JSON.stringify(v.path)} is a bare name; give the path or checkpoint_id that save_weights returned`);
    sendAs(r, body.format, 200, withIgnored(r, checkpointInfo(root, id)));
  });

  ctx.app.get('/api/v1/training_runs', ctx.handle(async (r, owner, body) => {
    const root = ctx.ownerRoot(owner);
    const runs = (await store.listSessions(owner)).map((row) => {
      const cfg = row.config as Record<string, unknown>;
      const live = sessions.live.get(row.id);
      return {
        training_run_id: publicModelId(row), model_id: publicModelId(row), training_session_id: row.id, status: ctx.statusOf(row), created_at: row.created_at,
        closed_at: row.closed_at, base_model: cfg.base_model, is_lora: cfg.finetune !== 'full', lora_rank: cfg.finetune !== 'full' ? cfg.rank : null,
        last_request_time: live ? Math.floor(live.lastActivityMs / 1000) : row.closed_at, last_checkpoint: listCheckpoints(root, row.id)[0] ?? null,
      };
    });
    sendAs(r, body.format, 200, { training_runs: runs });
  }));

  // Open, like /health: a Tinker client probes it before it has a key configured.
  ctx.app.get('/api/v1/healthz', route(0, (r) => sendAs(r, formatOf(r), 200, { status: 'ok' })));
}
