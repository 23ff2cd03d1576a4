/**
 * Model management of the futures API (xorl's "Model / Session Management", "Checkpointing"
 * and "Health & Control"): answered at once, not as futures.
 * - `session_info` (GET or POST): the owner's open models, or one (`model_id`).
 * - `session_heartbeat`: refreshes the idle clock (`model_id` or `session_id`).
 * - `unload_model` / `kill_session`: close the model (its requests not yet run fail); the
 *   same here, since every model is a tenant session of a shared engine.
 * - `sleep` / `wake_up`: the engine ops of the same names, after the model's earlier ops.
 * - `list_checkpoints` (GET or POST, optional `model_id`) / `delete_checkpoint` (`checkpoint_id`).
 * - `GET /api/v1/healthz`: `{"status": "ok"}` (with an API key, like every `/api/v1` route).
 */
import { HttpError } from '../http.ts';
import { sendAs } from './codec.ts';
import { deleteCheckpoint, listCheckpoints } from './checkpoints.ts';
import { checkFields, modelIdOf } from './requests.ts';
import type { FuturesContext } from './context.ts';

export function mountManagement(ctx: FuturesContext): void {
  const { store, sessions } = ctx.deps;

  ctx.getOrPost('session_info', (r, owner, body) => {
    checkFields(body.value, ['model_id'], 'session_info');
    const only = body.value.model_id === undefined ? null : modelIdOf(body.value);
    if (only !== null) ctx.modelOf(owner, only);
    const rows = store.listSessions(owner).filter((s) => (s.status === 'starting' || s.status === 'ready') && (only === null || s.id === only));
    sendAs(r, body.format, 200, { sessions: rows.map((s) => ctx.modelJson(s.id)) });
  });

  ctx.post('session_heartbeat', (r, owner, body) => {
    checkFields(body.value, ['model_id', 'session_id'], 'session_heartbeat');
    const live = ctx.modelOf(owner, modelIdOf(body.value, 'session_id'));
    live.touch();
    sendAs(r, body.format, 200, { model_id: live.id, status: store.getSession(live.id)!.status, last_activity_at: Math.floor(live.lastActivityMs / 1000) });
  });

  for (const name of ['unload_model', 'kill_session']) {
    ctx.post(name, async (r, owner, body) => {
      checkFields(body.value, ['model_id', 'session_id'], name);
      const id = modelIdOf(body.value, 'session_id');
      ctx.ownRow(owner, id);
      ctx.forget(id, `model ${id} was closed by ${name} before this request ran`);
      await sessions.close(id);
      sendAs(r, body.format, 200, { model_id: id, status: store.getSession(id)!.status });
    });
  }

  for (const name of ['sleep', 'wake_up']) {
    ctx.post(name, async (r, owner, body) => {
      checkFields(body.value, ['model_id'], name);
      const live = ctx.modelOf(owner, modelIdOf(body.value));
      if (!ctx.gateOf(live).open || !live.engine) throw new HttpError(409, `model ${live.id} is starting; retry when create_model's future is ready`);
      const engine = live.engine;
      // On the model's chain (ops.ts), so it never lands between two ops sent before it.
      const p = live.chain.then(() => engine.call<{ result: unknown; pending_gradients: number }>(live.id, name, {}));
      live.chain = p.catch(() => undefined);
      const a = await p;
      live.touch();
      sendAs(r, body.format, 200, { model_id: live.id, ...(a?.result && typeof a.result === 'object' ? a.result : {}) });
    });
  }

  ctx.getOrPost('list_checkpoints', (r, owner, body) => {
    checkFields(body.value, ['model_id'], 'list_checkpoints');
    const only = body.value.model_id === undefined ? undefined : ctx.ownRow(owner, modelIdOf(body.value)).id;
    sendAs(r, body.format, 200, { checkpoints: listCheckpoints(ctx.ownerRoot(owner), only) });
  });

  ctx.post('delete_checkpoint', (r, owner, body) => {
    checkFields(body.value, ['checkpoint_id'], 'delete_checkpoint');
    deleteCheckpoint(ctx.ownerRoot(owner), body.value.checkpoint_id);
    sendAs(r, body.format, 200, { checkpoint_id: body.value.checkpoint_id, deleted: true });
  });

  ctx.app.get('/api/v1/healthz', ctx.handle((r, _owner, body) => sendAs(r, body.format, 200, { status: 'ok' })));
}
