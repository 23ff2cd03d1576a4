/**
 * Policies served by the main server (PROTOCOL.md section 6), each over OpenPI's websocket and
 * over HTTP:
 * - a succeeded fine-tune: `/v1/fine-tunes/{id}/policy` (its final weights),
 * - a sampling session (create_sampling_session): `/v1/sampling_sessions/{id}/policy`,
 * - a training session's live weights: `/v1/training_sessions/{id}/policy` (a robot runs the
 *   policy while a client trains it; the session's API key or its session token).
 * `POST .../infer` (the sidecar's infer/query, for robots): one observation, JSON (arrays as
 * `{data, dtype, shape}` or number lists, frames base64) or msgpack, with an optional `seed`
 * -> `{"actions", "cold_start", "load_seconds", "infer_ms", "weights_version"}`.
 * `PUT .../policy/weights` takes pushed weights (push.ts) into a fine-tune's or sampling
 * session's policy. Loaded policies stay warm for VELA_INFER_IDLE_S (served.ts).
 */
import { storedEngineModel } from '../jobs/base.ts';
import { modelsDirOf } from '../models/resolve.ts';
import { performance } from 'node:perf_hooks';
import type { TemplatedApp } from 'uWebSockets.js';
import { loadObservationDictionary } from '../../protocol/zstd.ts';
import { ProtocolError } from '../../protocol/errors.ts';
import { credentialOf, safeEqual } from '../http/auth.ts';
import { HttpError, route, sendJson, statusLine, type Req } from '../http/http.ts';
import type { WsAdmission } from '../http/ws-admission.ts';
import { applyWeightsPush, createFolderPolicy, createPolicyServer, decodeWeightsPush, MAX_PUSH_BYTES, mountPolicySocket, randomSeed, type PolicyServer } from '../policy/index.ts';
import { readBody, sendAs, type Format } from '../futures/codec.ts';
import { errorAnswer } from '../futures/requests.ts';
import { redactPaths } from '../http/redact.ts';
import type { EngineLike } from '../engine/host.ts';
import type { SessionManager, SessionRobot } from '../sessions/sessions.ts';
import type { ServerConfig } from '../config.ts';
import type { Store } from '../store/store.ts';
import type { ServedPolicies } from './served.ts';

export type PolicyKind = 'fine-tunes' | 'training_sessions' | 'sampling_sessions';

/** A saved checkpoint served without a job (create_sampling_session). */
export interface SamplingSession {
  id: string; // "samp-..."
  owner: string;
  checkpointDir: string;
  checkpointId: string;
  preset: string;
  createdAt: number;
}

export interface InferenceDeps {
  store: Store;
  config: ServerConfig;
  sessions: SessionManager;
  served: ServedPolicies;
  /** Sampling sessions created or used since this server started; the store has every one (targetOf reads it). */
  sampling: Map<string, SamplingSession>;
  engineFor: (preset: string) => Promise<EngineLike>;
  /** The server's websocket caps (shared with the session websocket); none: uncapped (tests of other things). */
  admission?: WsAdmission;
  /** The operator's zstd dictionaries (`--zstd-dict`, loaded at start), accepted beside Vela's own by every policy. */
  zstdDictionaries?: readonly Uint8Array[];
}

/** What serving a target takes: its cache key, how to load it, whether it still exists. */
/**
 * A training session's live policy config: the checkpoint config.json fields its weights stand in
 * for, and, when the session was created with `robot`, the robot's dims, names and norm stats, so
 * that policyMeta builds it as a job checkpoint's (answers trimmed and in the robot's units).
 */
export function liveConfig(preset: string, cameras: string[], actionHorizon: number, robot: SessionRobot | undefined): { config: Record<string, unknown>; normStats?: unknown } {
  const config: Record<string, unknown> = { preset, cameras, action_horizon: actionHorizon };
  if (!robot) return { config };
  config.action_dim = robot.action_dim;
  if (robot.action_names) config.action_names = robot.action_names;
  if (robot.state_names) config.state_names = robot.state_names;
  return { config, ...(robot.norm_stats ? { normStats: { norm_stats: robot.norm_stats } } : {}) };
}

export interface Target {
  key: string;
  load: () => Promise<PolicyServer>;
  alive?: () => boolean;
}

/**
 * The policy target `kind`/`id` for a request's credentials.
 * @throws HttpError 401 (no or bad key), 404 (unknown, or another owner's), 409 (not servable yet).
 */
export async function targetOf(deps: InferenceDeps, kind: PolicyKind, id: string, headers: Record<string, string>): Promise<Target> {
  const { store, sessions, sampling, engineFor } = deps;
  const key = credentialOf(headers);
  if (!key) throw new HttpError(401, 'missing API key: send "Authorization: Bearer <key>" (or OpenPI\'s "Api-Key <key>")');
  const owner = await store.findApiKey(key);
  if (kind === 'training_sessions') {
    const row = await store.getSession(id);
    if (!row || (row.owner !== owner && !safeEqual(key, row.token))) throw new HttpError(owner || row ? 404 : 401, owner || row ? `no training session ${id}` : 'invalid API key');
    const live = sessions.live.get(id);
    if (row.status !== 'ready' || !live?.engine) throw new HttpError(409, `training session ${id} is ${row.status}${row.error ? `: ${row.error}` : ''}`);
    if (live.cameras.length === 0) throw new HttpError(409, `training session ${id} has no camera bound yet: its first forward_backward, forward or sample binds them`);
    const cameras = [...live.cameras];
    const engine = live.engine;
    return {
      key: `ts:${id}:${cameras.join(',')}`,
      load: () => createPolicyServer({ engine, policyId: id, owner: row.owner, live: liveConfig(engine.info.preset, cameras, live.actionHorizon, live.config.robot), limits: { maxMessageBytes: deps.config.maxPolicyMessageBytes }, zstdDictionaries: deps.zstdDictionaries }),
      alive: () => sessions.live.get(id) === live && live.cameras.join(',') === cameras.join(','),
    };
  }
  if (!owner) throw new HttpError(401, 'invalid API key');
  if (kind === 'fine-tunes') {
    const job = await store.getJob(id);
    if (!job || job.owner !== owner) throw new HttpError(404, `no fine-tune ${id}`);
    if (job.status !== 'succeeded') throw new HttpError(409, `fine-tune ${job.id} is ${job.status}; only a succeeded job has a policy to serve`);
    return {
      key: `ft:${id}`,
      // The job's engine: a preset, or the real model on its base (engine_model, or its base looked up again).
      load: () => storedEngineModel(job.config, modelsDirOf(deps.config)).then((engineModel) => createFolderPolicy(engineFor, job.output_dir, { engineModel, policyId: `policy-${job.id}`, owner: job.owner, version: 'final', limits: { maxMessageBytes: deps.config.maxPolicyMessageBytes }, zstdDictionaries: deps.zstdDictionaries })),
    };
  }
  // Not yet used since this server started: the store has it (sampling sessions outlive a restart).
  let s = sampling.get(id);
  if (!s) {
    const row = await store.getSamplingSession(id);
    if (row) sampling.set(id, (s = { id, owner: row.owner, checkpointDir: row.checkpoint_dir, checkpointId: row.checkpoint_id, preset: row.preset, createdAt: row.created_at }));
  }
  if (!s || s.owner !== owner) throw new HttpError(404, `no sampling session ${id}`);
  return {
    key: `samp:${id}`,
    // A real model's checkpoint names its base (base_checkpoint), which picks the engine; a preset's, its preset.
    load: () => createFolderPolicy(engineFor, s.checkpointDir, { policyId: `policy-${s.id}`, owner: s.owner, version: s.checkpointId, limits: { maxMessageBytes: deps.config.maxPolicyMessageBytes }, zstdDictionaries: deps.zstdDictionaries }),
    alive: () => sampling.has(id),
  };
}

/** Frame keys of an observation whose JSON strings are base64 frames. */
function isFrameKey(key: string): boolean {
  return (key.startsWith('observation/') && key !== 'observation/state') || key.startsWith('observation.images.');
}

/** A JSON observation's base64 frames as bytes (arrays were made NDArrays by readBody). */
function jsonFrames(obs: Record<string, unknown>): void {
  const decode = (v: unknown, where: string) => {
    if (typeof v !== 'string') return v;
    if (v.length % 4 !== 0 || !/^[A-Za-z0-9+/]*={0,2}$/.test(v)) throw new HttpError(400, `${where} is a string but not base64 (${v.length} characters)`);
    return Buffer.from(v, 'base64');
  };
  for (const [k, v] of Object.entries(obs)) {
    if (isFrameKey(k)) obs[k] = decode(v, k);
    else if (k === 'images' && v && typeof v === 'object' && !Array.isArray(v)) {
      for (const [cam, f] of Object.entries(v)) (v as Record<string, unknown>)[cam] = decode(f, `images.${cam}`);
    }
  }
}

/**
 * Run one observation (a decoded body: `seed` optional, the rest OpenPI's keys) on a target's
 * policy and answer it in `format`: `{"actions", "cold_start", "load_seconds", "infer_ms",
 * "weights_version", "model", "seed"}`, and with `opts.tokens` (the sidecar's infer/query)
 * `input_tokens` (PolicyAnswer.promptTokens) and `output_tokens` (PolicyAnswer.actionTokens). @throws HttpError / ProtocolError for bad input.
 */
export async function answerInfer(deps: InferenceDeps, r: Req, t: Target, value: Record<string, unknown>, format: Format, opts: { tokens?: boolean } = {}): Promise<void> {
  const obs = { ...value };
  const seed = obs.seed ?? randomSeed();
  delete obs.seed;
  if (typeof seed !== 'number' || !Number.isInteger(seed) || seed < 0 || seed > 0xffffffff) throw new HttpError(400, `seed must be an integer in 0..4294967295, got ${JSON.stringify(seed)}`);
  // Real-time chunking continues the connection's last chunk: a request here has no connection to keep it.
  const rtcKey = Object.keys(obs).find((k) => k.startsWith('rtc/'));
  if (rtcKey) throw new ProtocolError('bad_request', `${rtcKey}: real-time chunking needs the policy websocket (this route's /policy instead of /infer), which keeps each connection's last chunk; this HTTP route answers plain chunks and takes no rtc/ keys`);
  if (format === 'json') jsonFrames(obs);
  const got = await deps.served.acquire(t.key, t.load, t.alive);
  const t0 = performance.now();
  const a = await got.policy.infer(obs, seed);
  sendAs(r, format, 200, {
    actions: a.actions, cold_start: got.coldStart, load_seconds: got.loadSeconds, infer_ms: performance.now() - t0,
    weights_version: got.policy.weightsVersion(), model: got.policy.meta.preset, seed,
    // The sidecar's infer/query (its document's answer has them): the prompt's tokens as the model read them, and the chunk's action tokens.
    ...(opts.tokens ? { input_tokens: a.promptTokens, output_tokens: a.actionTokens } : {}),
  });
}

export function mountInference(app: TemplatedApp, deps: InferenceDeps): void {
  const { config, served } = deps;

  app.get('/v1/observation.zdict', route(0, (r) => {
    if (r.aborted) return;
    r.aborted = true;
    const dict = loadObservationDictionary();
    r.res.cork(() => r.res.writeStatus(statusLine(200)).writeHeader('content-type', 'application/octet-stream').end(dict));
  }));

  for (const kind of ['fine-tunes', 'training_sessions', 'sampling_sessions'] as const) {
    mountPolicySocket(app, `/v1/${kind}/:id/policy`, async (req) => {
      const t = await targetOf(deps, kind, req.params[0]!, req.headers);
      return (await served.acquire(t.key, t.load, t.alive)).policy;
    }, { maxMessageBytes: config.maxPolicyMessageBytes, limitFlag: '--max-policy-message-bytes', admission: deps.admission });

    // Readiness of one policy (PROTOCOL.md section 6): asking begins its load, so a robot that
    // starts on its 200 gets its first action as fast as its later ones.
    app.get(`/v1/${kind}/:id/policy/healthz`, route(1, async (r) => {
      const t = await targetOf(deps, kind, r.params[0]!, r.headers);
      let policy: PolicyServer | null;
      try {
        policy = served.peek(t.key, t.load, t.alive);
      } catch (err) {
        // Its last load failed (a new one is begun): why, in the load's own words.
        if (err instanceof HttpError) throw err;
        return sendJson(r, 409, { ready: false, error: `the policy cannot be loaded: ${redactPaths((err as Error).message)}` });
      }
      const state = policy ? policy.readiness() : { ready: false, warming: 'loading the policy (its weights, then one plain sample to trace its graph)' };
      sendJson(r, state.ready ? 200 : 503, state.ready ? { ready: true } : state);
    }));

    app.post(`/v1/${kind}/:id/infer`, route(1, async (r: Req) => {
      try {
        const t = await targetOf(deps, kind, r.params[0]!, r.headers);
        const body = await readBody(r, config.maxPolicyMessageBytes);
        await answerInfer(deps, r, t, body.value, body.format);
      } catch (err) {
        const [status, answer] = errorAnswer(r, err);
        sendAs(r, /msgpack/i.test(r.headers['content-type'] ?? '') ? 'msgpack' : 'json', status, answer);
      }
    }));

    app.put(`/v1/${kind}/:id/policy/weights`, route(1, async (r) => {
      const t = await targetOf(deps, kind, r.params[0]!, r.headers);
      const push = decodeWeightsPush(await r.body(MAX_PUSH_BYTES));
      const { policy } = await served.acquire(t.key, t.load, t.alive);
      const result = await applyWeightsPush(policy, push);
      served.pin(t.key); // an unload would lose the pushed weights
      sendJson(r, 200, result);
    }));
  }
}
