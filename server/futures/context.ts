/**
 * What the futures routes share: the future store, `seq_id` ordering, the handler wrapper that
 * authenticates and answers in the request's format, and the per-model lookups (the owner's open
 * model, the gate that opens when its engine is ready, its public JSON).
 */
import path from 'node:path';
import type { TemplatedApp } from 'uWebSockets.js';
import { requireOwner } from '../http/auth.ts';
import { EngineError } from '../engine/messages.ts';
import { HttpError, route, type Req } from '../http/http.ts';
import { publicConfig, type LiveSession, type SessionManager } from '../sessions/sessions.ts';
import type { ServerConfig } from '../config.ts';
import type { ClientSessionRow, SessionRow, Store } from '../store/store.ts';
import { log } from '../log.ts';
import type { InferenceDeps } from '../inference/routes.ts';
import { formatOf, readBody, sendAs, type Body, type Format } from './codec.ts';
import { errorAnswer } from './requests.ts';
import { refuseZorl } from './fields.ts';
import { SeqOrder } from './seq.ts';
import { FutureStore } from './store.ts';
import { forward, wasForwarded, type ClusterNode } from '../cluster/index.ts';
import { futureIdPrefix, remoteTarget } from './cluster.ts';

export interface FuturesDeps {
  store: Store;
  sessions: SessionManager;
  config: ServerConfig;
  /** The server's base URL (read when a model is created). */
  baseUrl?: () => string;
  /** The served policies, for xorl's inference integration (inference.ts); absent: not mounted. */
  inference?: InferenceDeps;
  /** This node of a cluster (futures/cluster.ts forwards requests of models on other nodes); null on one node. */
  cluster?: () => ClusterNode | null;
  /** This node's id (in request ids), null on one node. */
  nodeId?: string | null;
}

/** The id a futures client knows a model by: the name it gave in create_model, else the Vela id. */
export function publicModelId(row: SessionRow): string {
  return row.model_name ?? row.id;
}

export type Handler = (r: Req, owner: string, body: Body) => Promise<void> | void;

/** Opens when a model's engine is ready; ops admitted while it starts wait on it, in order. */
interface Gate {
  open: boolean;
  promise: Promise<void>;
}

export class FuturesContext {
  readonly futures: FutureStore;
  readonly seq: SeqOrder;
  private gates = new Map<string, Gate>();
  private pruneTimer: NodeJS.Timeout;

  constructor(readonly app: TemplatedApp, readonly deps: FuturesDeps) {
    const { config, sessions } = deps;
    this.futures = new FutureStore({ ttlS: config.futureTtlS, idPrefix: futureIdPrefix(deps.nodeId) });
    this.seq = new SeqOrder({ gapWaitS: config.futureSeqGapS, ttlS: config.futureTtlS });
    // Models closed by other routes (idle cleanup, /v1 close): drop their per-model state.
    this.pruneTimer = setInterval(() => {
      for (const id of new Set([...this.gates.keys(), ...this.seq.modelIds()])) {
        if (!sessions.live.has(id)) this.forget(id, `model ${id} was closed before this request ran`);
      }
      // Client sessions without an open model, idle past the session timeout, are dropped.
      deps.store.pruneClientSessions(Math.floor(Date.now() / 1000 - config.sessionIdleTimeoutS)).catch((e) => log.warn(`pruning idle client sessions failed: ${(e as Error).message}`));
    }, 30_000).unref();
  }

  /** Wrap a handler: API key, body in either format, and every throw answered in the request's format. */
  handle(fn: Handler) {
    return route(0, async (r) => {
      const fmt: Format = formatOf(r);
      try {
        const owner = await requireOwner(this.deps.store, r);
        const body = r.method === 'GET' ? { value: Object.fromEntries(r.query), raw: Buffer.alloc(0), format: fmt } : await readBody(r, this.deps.config.maxSessionMessageBytes);
        // Every route, also those without checkFields (training_runs) and before a cluster forwards it.
        refuseZorl(body.value, r.url.replace(/^\/(api\/v1\/)?/, ''));
        const cluster = this.deps.cluster?.() ?? null;
        if (cluster && !wasForwarded(r)) {
          const remote = await remoteTarget(cluster, this.deps, r, owner, body.value);
          if (remote) return await forward(r, remote, cluster.id, body.raw);
        }
        await fn(r, owner, body);
      } catch (err) {
        const [status, answer] = errorAnswer(r, err);
        sendAs(r, fmt, status, answer);
      }
    });
  }

  post(name: string, fn: Handler): void {
    this.app.post(`/api/v1/${name}`, this.handle(fn));
  }

  /** `GET` and `POST /api/v1/<name>` (query string or body). */
  getOrPost(name: string, fn: Handler): void {
    this.app.get(`/api/v1/${name}`, this.handle(fn));
    this.post(name, fn);
  }

  /**
   * The owner's client session `id` (create_session's; stored, so it outlives a restart).
   * @throws HttpError 404 (unknown, pruned after --session-idle-timeout-s without a model or heartbeat, or another owner's).
   */
  async clientSession(owner: string, id: unknown): Promise<ClientSessionRow> {
    const entry = typeof id === 'string' ? await this.deps.store.getClientSession(id) : null;
    if (!entry || entry.owner !== owner) throw new HttpError(404, `no session ${JSON.stringify(id)}: create one with create_session`);
    return entry;
  }

  /** The owner's checkpoint root (`<data>/checkpoints/<owner>`). */
  ownerRoot(owner: string): string {
    return path.dirname(this.deps.sessions.sessionDir(owner, 'x'));
  }

  /**
   * A model row of this owner, open or not, by its Vela id (`ts-...`) or by the name its client
   * gave it in create_model (then the open model of that name).
   * @throws HttpError 404 (unknown, or another owner's).
   */
  async ownRow(owner: string, id: string): Promise<SessionRow> {
    const row = await this.deps.store.getSession(id);
    if (row && row.owner === owner) return row;
    const named = await this.deps.store.findOpenSessionByName(owner, id);
    if (!named) throw new HttpError(404, `no model ${id}${id.startsWith('ts-') ? '' : ' (no open model has that name)'}`);
    return named;
  }

  /**
   * The owner's open model (by id or name). A model open in this process under its Vela id is
   * found without a store read (a session is in `sessions.live` exactly while it is open here).
   * @throws HttpError 404 (unknown or another owner's), 409 (closed).
   */
  async modelOf(owner: string, id: string): Promise<LiveSession> {
    const open = this.deps.sessions.live.get(id);
    if (open) {
      if (open.row.owner !== owner) throw new HttpError(404, `no model ${id}`);
      return open;
    }
    const row = await this.ownRow(owner, id);
    const live = this.deps.sessions.live.get(row.id);
    if (!live || (row.status !== 'starting' && row.status !== 'ready')) {
      throw new HttpError(409, `model ${id} is ${row.status}${row.error ? `: ${row.error}` : ''}; create a new one with create_model`);
    }
    return live;
  }

  /**
   * The gate of a model: resolves once its engine is ready, rejects (EngineError `not_ready`)
   * when it failed to start. SessionManager has no readiness promise, so this polls every 20 ms
   * while the model starts.
   */
  gateOf(live: LiveSession): Gate {
    const found = this.gates.get(live.id);
    if (found) return found;
    const { sessions, store } = this.deps;
    const gate: Gate = { open: false, promise: Promise.resolve() };
    gate.promise = new Promise<void>((resolve, reject) => {
      const check = () => {
        if (live.engine && sessions.live.get(live.id) === live) {
          gate.open = true;
          return resolve();
        }
        if (!sessions.live.has(live.id)) {
          return store.getSession(live.id).then(
            (row) => reject(new EngineError('not_ready', `model ${live.id} could not start: ${row?.error ?? row?.status ?? 'gone'}`)),
            reject,
          );
        }
        setTimeout(check, 20);
      };
      void check();
    });
    gate.promise.catch(() => undefined);
    this.gates.set(live.id, gate);
    return gate;
  }

  /**
   * A model's status as the futures API shows it: the row's (`starting`, `ready`, `closed`,
   * `error`, `lost`), or `asleep` for an open model put to sleep (its ops fail with code `asleep`
   * until wake_up), so session_info does not say `ready` to a client whose ops would fail.
   */
  statusOf(row: SessionRow): string {
    return row.status === 'ready' && this.deps.sessions.live.get(row.id)?.asleep ? 'asleep' : row.status;
  }

  /** Public JSON of a model (session_info, create_model's future); `asleep` as in `/v1/training_sessions`. */
  async modelJson(id: string): Promise<Record<string, unknown>> {
    const row = (await this.deps.store.getSession(id))!;
    const live = this.deps.sessions.live.get(id);
    return {
      model_id: publicModelId(row), training_session_id: row.id, status: this.statusOf(row), asleep: live?.asleep ?? false, created_at: row.created_at, ...publicConfig(row.config), base_params: live?.engine?.info.baseParams ?? null,
      action_horizon: live?.actionHorizon || (row.config as { action_horizon?: unknown }).action_horizon,
      trainable_params: live?.trainableParams ?? null, pending_gradients: live?.pendingGradients ?? 0,
      pending_futures: this.futures.pendingCount(id), cameras: live?.cameras ?? [],
      last_activity_at: live ? Math.floor(live.lastActivityMs / 1000) : null, error: row.error,
    };
  }

  /**
   * Run an engine op on a ready model after every op sent to it before (its ops.ts chain), so it
   * never lands between two of them. @throws HttpError 409 while the model starts; the op's errors.
   */
  async engineCall<T = Record<string, unknown>>(live: LiveSession, op: string, args: Record<string, unknown> = {}, transfer?: ArrayBuffer[]): Promise<T> {
    if (!this.gateOf(live).open || !live.engine) throw new HttpError(409, `model ${publicModelId(live.row)} is starting; retry when create_model's future is ready`);
    const engine = live.engine;
    const p = live.chain.then(() => engine.call<{ result: T; pending_gradients: number }>(live.id, op, args, transfer));
    live.chain = p.catch(() => undefined);
    const a = await p;
    live.touch();
    return a?.result;
  }

  /** Drop a model's gate and sequence; its held requests fail with `reason`. */
  forget(id: string, reason: string): void {
    this.gates.delete(id);
    this.seq.forget(id, reason);
  }

  close(): void {
    clearInterval(this.pruneTimer);
    this.seq.close();
    this.futures.close();
  }
}
