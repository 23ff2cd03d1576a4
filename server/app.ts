/**
 * The Vela server: one uWebSockets.js app with the REST routes, the session websocket and the
 * health checks. `startServer` opens the store, makes sure an API key exists, listens, and
 * returns a handle whose `close()` shuts down gracefully.
 */
import uWS from 'uWebSockets.js';
import { HttpError, route, sendJson, sendText, type Req } from './http/http.ts';
import { assertNativeUws, assertPortFree, createApp, listenExclusive } from './http/guard.ts';
import path from 'node:path';
import { hideServerPath } from './http/redact.ts';
import { hubCacheDir } from './models/hf-cache.ts';
import { credentialOf, requireOwner, safeEqual } from './http/auth.ts';
import { log } from './log.ts';
import { randomId, Store, type SessionRow } from './store/store.ts';
import { PostgresDb } from './db/index.ts';
import { ClusterNode, forward, mountNodeRoutes, wasForwarded } from './cluster/index.ts';
import { GraphileQueue } from './jobs/graphile-queue.ts';
import { LocalQueue } from './jobs/queue.ts';
import { SessionManager, parseSessionConfig, type EngineFactory } from './sessions/sessions.ts';
import { mountSessionSocket } from './sessions/socket.ts';
import { mountUi } from './ui/index.ts';
import { JobRunner } from './jobs/runner.ts';
import { mountJobRoutes } from './jobs/routes.ts';
import { mountInference, type SamplingSession } from './inference/routes.ts';
import { ServedPolicies } from './inference/served.ts';
import { mountFutures } from './futures/index.ts';
import { mountDatasetUpload, prepareDatasetsRoot } from './datasets/routes.ts';
import { mountSidecar } from './sidecar/routes.ts';
import { mountMetrics, watchStore } from './metrics/index.ts';
import { ConfigError, type ServerConfig } from './config.ts';
import { loadDictionaryFiles } from '../protocol/zstd.ts';
import { WsAdmission } from './http/ws-admission.ts';

/** `GET /` for API clients (xorl's root info): what this server is and where its APIs live. */
function rootInfo(baseUrl: string): Record<string, unknown> {
  return {
    name: 'vela',
    description: 'training and policy server for flow-matching vision-language-action policies',
    dashboard: `${baseUrl}/ui/`,
    health: `${baseUrl}/health`,
    apis: {
      vela: `${baseUrl}/v1`,
      xorl_tinker: `${baseUrl}/api/v1`,
      sidecar: `${baseUrl}/training`,
    },
  };
}

export interface ServerHandle {
  port: number;
  host: string;
  baseUrl: string;
  store: Store;
  sessions: SessionManager;
  runner: JobRunner;
  /** Every route of the app (`WS` for a websocket): method and uWS pattern. */
  routes(): { method: string; pattern: string }[];
  /** Stop accepting, close every session (answering what is in flight), close engines and the store. */
  close(): Promise<void>;
}

export interface StartOptions {
  engineFactory?: EngineFactory;
  /** Seconds between SSE keepalives (default 15; tests shorten it). */
  sseKeepaliveS?: number;
  /** The sidecar's job_events: stream cap and watchdog period, seconds (300, 15; tests shorten them). */
  sidecarStreamCapS?: number;
  sidecarWatchdogS?: number;
  /** Called once with a key that was created because the store had none. */
  onNewKey?: (key: string) => void;
}

/**
 * Open the store (migrating it), close sessions a previous run left open, make sure an API key
 * exists, mount every route and listen. Resolves once listening.
 * @throws Error when uWS runs on its JS fallback, the store is newer than this Vela, or the port is taken.
 */
export async function startServer(config: ServerConfig, opts: StartOptions = {}): Promise<ServerHandle> {
  assertNativeUws();
  await assertPortFree(config.host, config.port);
  hideServerPath(config.dataDir, '<data dir>');
  hideServerPath(config.datasetsDir, '<datasets dir>');
  if (config.storageDir) hideServerPath(config.storageDir, '<storage dir>');
  hideServerPath(hubCacheDir(), '<Hugging Face cache>');
  hideServerPath(config.modelsDir ?? path.join(config.dataDir, 'models'), '<models dir>');
  // Read (and tried) before anything starts: a bad --zstd-dict is one line at start, not a 1011 at a robot's first observation.
  const zstdDictionaries = await loadDictionaryFiles(config.zstdDicts).catch((e: Error) => {
    throw new ConfigError(`--zstd-dict (VELA_ZSTD_DICT): ${e.message}`);
  });
  const store = await Store.open(config);
  // One node owns every session of its store; in a cluster, sessions of lost nodes are found by heartbeats (cluster/node.ts).
  const clustered = store.db.dialect === 'postgres';
  const nodeId = clustered ? (config.nodeId ?? randomId('n-', 4)) : null;
  if (clustered && !config.storageDir) {
    log.warn(`no --storage-dir (VELA_STORAGE_DIR): checkpoints and job outputs stay in this node's --data-dir, so other nodes cannot resume its jobs or load its sessions' states; point every node at one shared folder`);
  }
  if (!clustered) {
    const orphans = await store.closeOrphanSessions('the server restarted; session memory is lost (load a saved state in a new session)');
    if (orphans > 0) log.info(`closed ${orphans} session(s) left open by the previous run`);
  }
  await prepareDatasetsRoot(config, clustered);
  if (config.apiKey) await store.ensureApiKey(config.apiKey);
  else if ((await store.countApiKeys()) === 0) {
    const { key } = await store.createApiKey('first key');
    (opts.onNewKey ?? ((k) => log.info(`created an API key (shown once): ${k}`)))(key);
  }
  const unwatchStore = watchStore(store);
  const startedAt = Math.floor(Date.now() / 1000); // Unix s, as a cluster node's started_at
  const sessions = new SessionManager(store, config, opts.engineFactory);
  sessions.nodeId = nodeId;
  const app = createApp();
  let baseUrl = '';
  let cluster: ClusterNode | null = null;
  const wsBase = () => (config.publicUrl ?? baseUrl).replace(/^http/, 'ws').replace(/\/$/, '');
  /** The websocket base of the node that holds a session (this node's when unknown). */
  const wsBaseOf = (row: SessionRow) => {
    const url = cluster && row.node_id && row.node_id !== cluster.id ? cluster.urlOf(row.node_id) : null;
    return url ? url.replace(/^http/, 'ws').replace(/\/$/, '') : wsBase();
  };
  /** The URL of the node that holds an open session, when that is another node. */
  const remoteOf = (row: SessionRow): string | null =>
    cluster && row.node_id && row.node_id !== cluster.id && (row.status === 'starting' || row.status === 'ready') ? cluster.urlOf(row.node_id) : null;

  app.get('/healthz', route(0, (r) => sendText(r, 200, 'OK')));
  // xorl's shape (status, engine_running, engines); `backend` is the backend in use (chosen once:
  // VELA_BACKEND is the request, backend_requested), with where it runs and what was not used.
  app.get('/health', route(0, async (r) => {
    const b = await sessions.backend().catch((e: Error) => ({ name: null, kind: null, device: null, fallbacks: [e.message] }));
    sendJson(r, 200, {
      status: 'healthy', engine_running: sessions.runningEngines().length > 0, engines: sessions.runningEngines(),
      backend: b.name, backend_kind: b.kind, backend_device: b.device, backend_requested: config.backend, backend_not_used: b.fallbacks,
      memory: await sessions.memoryReport(),
      // Loaded real bases, their idle seconds and when the idle timer closes them (--base-idle-timeout-s).
      bases: await sessions.baseReport(), base_idle_timeout_s: config.baseIdleS,
    });
  }));
  // The operator frees every real base that holds nothing now, without waiting for the timer.
  // There is no operator credential beyond --metrics-key (which opens only /metrics), so any API
  // key may: it closes only engines no session, job or policy uses.
  app.post('/v1/admin/release-idle-bases', route(0, async (r) => {
    await requireOwner(store, r);
    const closed = await sessions.releaseIdleBases();
    sendJson(r, 200, { closed, count: closed.length });
  }));

  app.post('/v1/training_sessions', route(0, async (r) => {
    const owner = await requireOwner(store, r);
    const body = await r.json();
    const cfg = parseSessionConfig(body);
    // A cluster places the session (cluster/node.ts place); the chosen node creates it.
    if (cluster && !wasForwarded(r)) {
      const target = await cluster.place(cfg.base_model);
      if (!target) throw new HttpError(503, `every node is at its session capacity (--node-sessions); close a session or add a node`);
      if (target.id !== cluster.id) return forward(r, target.url, cluster.id, Buffer.from(JSON.stringify(body)));
    }
    const row = await sessions.create(owner, cfg, baseUrl);
    sendJson(r, 200, sessions.toJson(row, wsBaseOf(row)));
  }));
  app.get('/v1/training_sessions', route(0, async (r) => {
    const owner = await requireOwner(store, r);
    sendJson(r, 200, { object: 'list', data: (await store.listSessions(owner)).map((s) => sessions.toJson(s, wsBaseOf(s))) });
  }));
  const ownSession = async (r: Req) => {
    const owner = await requireOwner(store, r);
    const row = await store.getSession(r.params[0]!);
    if (!row || row.owner !== owner) throw new HttpError(404, `no training session ${r.params[0]}`);
    return row;
  };
  // A session open on another node is answered by that node (its live fields are there).
  app.get('/v1/training_sessions/:id', route(1, async (r) => {
    const row = await ownSession(r);
    const remote = wasForwarded(r) ? null : remoteOf(row);
    if (remote) return forward(r, remote, cluster!.id, null);
    sendJson(r, 200, sessions.toJson(row, wsBaseOf(row)));
  }));
  app.post('/v1/training_sessions/:id/close', route(1, async (r) => {
    const row = await ownSession(r);
    const remote = wasForwarded(r) ? null : remoteOf(row);
    if (remote) return forward(r, remote, cluster!.id, await r.body());
    await sessions.close(row.id);
    sendJson(r, 200, sessions.toJson((await store.getSession(row.id))!, wsBaseOf(row)));
  }));

  // One set of websocket caps for every websocket route of this server (issue 32, item 8).
  const admission = new WsAdmission({
    connectionsPerKey: config.maxWsConnectionsPerKey, connections: config.maxWsConnections,
    bufferedBytesPerKey: config.maxWsBufferedBytesPerKey, bufferedBytes: config.maxWsBufferedBytes,
  });
  mountSessionSocket(app, { store, sessions, config, admission, elsewhere: (row) => (remoteOf(row) ? wsBaseOf(row) + `/v1/training_sessions/${row.id}/ws` : null) });
  const served = new ServedPolicies(config.inferIdleS);
  // A closed session's live policy is unloaded now, not at the next sweep (its series go with it).
  sessions.onClosed = () => served.sweep();
  const inference = { store, config, sessions, served, admission, zstdDictionaries, sampling: new Map<string, SamplingSession>(),
    // Checkpoint policies (fine-tunes, sampling sessions) run on the policy engine: own worker,
    // and training yields to it (a training session's live policy stays on its training engine).
    engineFor: (preset: string) => sessions.policyEngineFor(preset) };
  const futures = mountFutures(app, { store, sessions, config, baseUrl: () => baseUrl, inference, cluster: () => cluster, nodeId });
  const queue = clustered ? new GraphileQueue((store.db as PostgresDb).pool, nodeId!) : new LocalQueue();
  const runner = new JobRunner(store, config, (preset) => sessions.engineFor(preset), queue, nodeId ? { id: nodeId, fenced: () => cluster?.fenced() ?? false } : null);
  mountJobRoutes(app, { store, config, runner, keepaliveS: opts.sseKeepaliveS, engineLoaded: (key) => sessions.hasEngine(key), releaseIdle: () => sessions.releaseIdleEngines() });
  mountNodeRoutes(app, { store, nodes: () => cluster, local: () => ({ id: 'local', url: config.publicUrl ?? baseUrl, capacity: config.nodeCapacity, load: { sessions: sessions.live.size, jobs: runner.running.size, resident_presets: sessions.runningEngines() }, runningJobs: [...runner.running].sort(), startedAt }) });
  mountInference(app, inference);
  mountDatasetUpload(app, { store, config });
  mountSidecar(app, { store, config, runner, inference, keepaliveS: opts.sseKeepaliveS, streamCapS: opts.sidecarStreamCapS, watchdogS: opts.sidecarWatchdogS });

  mountUi(app, { rootInfo: () => rootInfo(baseUrl) });
  // Any valid key may scrape, and sees the aggregates and its own objects' series; the operator
  // (--metrics-key, or no key at all with --metrics-public) sees every series (metrics/owners.ts).
  mountMetrics(app, async (r) => {
    const key = credentialOf(r.headers);
    if (key && config.metricsKey && safeEqual(key, config.metricsKey)) return null;
    if (!key && config.metricsPublic) return null;
    return requireOwner(store, r);
  });

  app.fallback(route(0, (r) => {
    throw new HttpError(404, `no route ${r.method} ${r.url}`);
  }));

  const { socket: listenSocket, port } = await listenExclusive(app, config.host, config.port);
  baseUrl = `http://${config.host.includes(':') ? `[${config.host}]` : config.host}:${port}`;
  if (nodeId) {
    cluster = new ClusterNode(store, {
      id: nodeId, url: config.publicUrl ?? baseUrl, capacity: config.nodeCapacity, heartbeatS: config.nodeHeartbeatS, lostS: config.nodeLostS,
      load: () => ({ sessions: sessions.live.size, jobs: runner.running.size, resident_presets: sessions.runningEngines() }),
      releaseJobs: (workers) => queue.releaseWorkers(workers),
      busy: () => runner.running.size > 0,
      onFenced: async (reason) => {
        for (const id of [...sessions.live.keys()]) await sessions.close(id, reason);
      },
    });
    await cluster.start();
  }
  await runner.start();
  if (nodeId) await store.setNodeQueueWorker(nodeId, queue.workerId);

  let closing: Promise<void> | null = null;
  return {
    port,
    host: config.host,
    baseUrl,
    store,
    sessions,
    runner,
    routes: () => app.routes(),
    close: () =>
      (closing ??= (async () => {
        uWS.us_listen_socket_close(listenSocket);
        // A cluster node is marked stopped first, so the job it hands back is taken over at once.
        await cluster?.stop();
        await runner.shutdown();
        await served.close();
        futures.close();
        await sessions.shutdown();
        // Kept-alive HTTP connections and open SSE streams: the native app has close() although
        // the typings of this version lack it. Then the store, last.
        (app as unknown as { close(): void }).close();
        unwatchStore();
        await store.close();
      })()),
  };
}
