/**
 * One served policy: its checkpoint loaded in an engine, its meta, its batcher. The websocket
 * layer (socket.ts) calls `infer` per observation; everything that is work happens in the
 * engine's worker, so the event loop only decodes, batches and encodes.
 *
 * Weights versions (sync_inference_weights): `swap` loads new weights under a new engine policy
 * id while the old ones keep serving, then makes them current. Each request is pinned to the
 * version current when it arrived, for its whole path (observation checks, normalisation, the
 * engine call, unnormalisation), and the batcher runs each version's datums as their own engine
 * call; so a request never sees half of one model and half of another, and no connection is
 * closed by a swap. A retired version is unloaded once its last request is answered.
 * A live policy (a training session's) has no versions: every batch runs on the session's
 * weights of the moment, and an optim_step is one engine call, never half-applied.
 */
import { performance } from 'node:perf_hooks';
import { ndarray, type NDArray } from '../../protocol/ndarray.ts';
import { dictionaryId, initZstd, loadObservationDictionary } from '../../protocol/zstd.ts';
import { batchBuffers, makeBatch, tokenizePrompt } from '../../kernels/small/batch.ts';
import type { EngineLike } from '../engine/host.ts';
import { HttpError } from '../http/http.ts';
import { outOfRange } from '../../kernels/norm-range.ts';
import { log } from '../log.ts';
import { holdPolicySeries } from '../metrics/policy.ts';
import { modelLayout } from '../models/layout.ts';
import { Batcher, type BatchStats } from './batcher.ts';
import { baseServing, classifyFolder, servedNormStats } from './checkpoint.ts';
import type { NormMode } from '../../kernels/normalize.ts';
import { policyMeta, PolicyConfigError, type PolicyMeta } from './meta.ts';
import type { ObservationOutOfRange } from './range-warning.ts';
import { DEFAULT_POLICY_LIMITS, observationKeys, parseObservation, toDatum, toModelActions, toRobotActions, type PolicyLimits } from './observation.ts';
import { DEFAULT_RTC_SETTINGS, RTC_KEYS, rtcMode, type RtcPlan, type RtcSettings } from './rtc.ts';
import { shiftChunk, type RtcMode } from '../../kernels/rtc.ts';

export interface PolicyServerOptions {
  engine: EngineLike;
  /** The checkpoint folder (PROTOCOL.md section 4), loaded by the engine's `load_policy`. */
  checkpointDir?: string;
  /** The engine session that holds this policy's weights (swapped-in versions get `<id>#<n>`). */
  policyId: string;
  /**
   * Serve a training session's live weights instead of a checkpoint: `policyId` is the session
   * id and `config` stands in for the checkpoint's config.json (preset, cameras, action_horizon,
   * and the session's robot: action_dim, action_names, state_names); `normStats` (a job
   * checkpoint's norm_stats.json layout) unnormalise the answer into the robot's units. Without
   * them the answer is the model's normalised space, padded to its action dims (`units: "model"`).
   */
  live?: { config: Record<string, unknown>; normStats?: unknown };
  /**
   * Serve the engine's base checkpoint itself (a real pi0 / pi0.5 base such as
   * lerobot/pi05_base: a policy as it is, with no Vela checkpoint to load): `config` stands in
   * for the checkpoint's config.json (cameras, action_horizon, num_steps); the norm stats are the
   * base folder's own, read as made for `normMode` when given (a Vela fine-tune's output:
   * checkpoint.ts baseServing). Pushed weights (swap) load on top of it as usual.
   */
  base?: { config: Record<string, unknown>; normMode?: NormMode | null };
  /** The label of the first weights (what `weights_version` reports before any swap). */
  version?: string | number | null;
  /** `--seed`: reproducible per-connection seed streams (seeds.ts); absent = random seeds. */
  seed?: number | null;
  /** `--debug`: error frames carry the stack trace. */
  debug?: boolean;
  /** How long the first request of a batch waits for others, ms (default 5). */
  batchWindowMs?: number;
  /** Requests per engine call at most (default 16). */
  maxBatch?: number;
  /** When set, clients must send `Authorization: Api-Key <k>` or `Bearer <k>` (standalone server). */
  apiKey?: string | null;
  /**
   * The API key id (store owner) of the object this policy serves (a fine-tune, a session):
   * its metrics series are shown to that key's scrapes (metrics/owners.ts). Absent or null:
   * to the operator's only (`vela policy`, whose scrapes are all the operator's).
   */
  owner?: string | null;
  limits?: Partial<PolicyLimits>;
  /** Real-time chunking defaults for this policy's connections (server/policy/rtc.ts; each may override them by query). */
  rtc?: Partial<RtcSettings>;
  /**
   * The operator's zstd dictionaries (`--zstd-dict`, read by protocol/zstd.ts loadDictionaryFiles),
   * accepted beside the project's own: each observation frame is decoded with the one whose id
   * its header names.
   */
  zstdDictionaries?: readonly Uint8Array[];
}

/** A served request's answer, before encoding. */
export interface PolicyAnswer {
  actions: NDArray; // float32 [action_horizon, action_dim], robot units
  policyInferMs: number; // the engine call of its batch
  batchSize: number;
  /** performance.now() when the datum went to the batcher (its checks and decoding done). */
  submittedMs: number;
  /** Time in the batcher before its batch's engine call, ms. */
  queueMs: number;
  /** The raw state was far outside the norm stats (range-warning.ts); null when in range or unnormalised. */
  outOfRange: ObservationOutOfRange | null;
  /** The actions as sent (robot units, [action_horizon * action_dim]): the next RTC request's previous chunk. */
  robotActions: Float32Array;
  /** The RTC plan the chunk was sampled with (its mode off, with the reason, when it could not be); null without RTC keys. */
  rtc: RtcPlan | null;
  /**
   * The prompt's tokens as the model read them (its token mask's ones, padding not counted): the
   * real pi0 / pi0.5's PaliGemma ids with BOS (pi0.5's prompt with its state bins and "Action: "),
   * a small preset's UTF-8 bytes cut at max_token_len.
   */
  promptTokens: number;
  /** The action tokens the model's action expert output: one per step of its chunk, the model's horizon H (>= action_horizon, which the answer keeps). */
  actionTokens: number;
}

/** One datum's real-time chunking input, in the model's space ([H * A] each; kernels/rtc.ts ChunkPrefix). */
interface DatumChunk {
  mode: RtcMode;
  actions: Float32Array;
  weights: Float32Array;
  maxGuidance: number;
}

export interface PolicyStats extends BatchStats {
  connections: number;
  errors: number;
  weights_version: string | number | null;
  /** Weights swapped in since start. */
  swaps: number;
}

/** What `swap` reports. */
export interface SwapResult {
  weights_version: string | number | null;
  previous_version: string | number | null;
  load_seconds: number;
}

/** What `PolicyServer.readiness()` reports (the standalone's /healthz, the metadata's `ready`). */
export interface PolicyReadiness {
  ready: boolean;
  /** What is still being warmed up, in words; null when ready. */
  warming: string | null;
}

/**
 * How long a policy must have had no request before its real-time chunking graph is traced in
 * the background: a robot's first requests come right after its connect, and they go first.
 */
export const RTC_WARM_IDLE_MS = 250;

export interface PolicyServer {
  /** The engine id it was created with (a fine-tune's `policy-<job>`, a session's id): metrics label. */
  readonly id: string;
  /** The current version's meta. */
  readonly meta: PolicyMeta;
  readonly limits: PolicyLimits;
  readonly seed: number | null;
  readonly debug: boolean;
  readonly apiKey: string | null;
  /** Real-time chunking defaults of its connections (server/policy/rtc.ts). */
  readonly rtc: Readonly<RtcSettings>;
  /** The zstd dictionary served at GET /v1/observation.zdict. */
  readonly dictionary: Uint8Array;
  /** Every dictionary an observation frame may be made with: `dictionary` first, then the operator's (`--zstd-dict`). */
  readonly dictionaries: readonly Uint8Array[];
  /** The handshake map sent first on every connection; `rtc`: that connection's RTC settings (default: the policy's). */
  metadata(rtc?: Readonly<RtcSettings>): Record<string, unknown>;
  /**
   * Runs one decoded observation; with `rtc` (server/policy/rtc.ts, a plan whose mode is not off)
   * the chunk continues the previous one. @throws ProtocolError and the like for bad input (see socket.ts).
   */
  infer(obs: Record<string, unknown>, seed: number, rtc?: RtcPlan | null): Promise<PolicyAnswer>;
  stats(): PolicyStats;
  /** Counters kept by the websocket layer. */
  readonly counters: { connections: number; errors: number };
  /** The current weights' label (a live policy: the session's step at its last answer). */
  weightsVersion(): string | number | null;
  /** Whether this serves a session's live weights (no swap). */
  readonly isLive: boolean;
  /**
   * Load the checkpoint at `dir` as the new current weights (see the module comment); swaps are
   * serialised. @throws PolicyConfigError for a checkpoint that cannot be served (the old
   * weights keep serving), Error for a live policy.
   */
  swap(dir: string, version: string | number | null): Promise<SwapResult>;
  /**
   * Whether every graph a robot will ask for is traced: the plain one (before createPolicyServer
   * returns) and the real-time chunking one of the default mode (traced in the background once the
   * policy is idle). `warming` says what is still being done. A live policy, or an engine that
   * makes no graphs, is always ready.
   */
  readiness(): PolicyReadiness;
  /** Resolves when readiness() turns ready (never rejects; at close at the latest). */
  whenReady(): Promise<void>;
  /** Refuse new work; queued requests fail. The engine is the caller's to close. */
  close(): void;
  /** close(), then free every version's weights in the engine. */
  dispose(): Promise<void>;
}

/** One set of weights in the engine, with the meta that goes with it. */
interface Version {
  engineId: string;
  /** A loaded checkpoint, or the base as it is (both unloaded with unload_policy). */
  kind: 'checkpoint' | 'base';
  meta: PolicyMeta;
  label: string | number | null;
  refs: number; // requests in flight on it
  retired: boolean;
  unloaded: boolean;
}


/** What a datum is batched with: its weights version and its RTC input (null: a plain chunk). */
interface Tag {
  v: Version;
  chunk: DatumChunk | null;
}

function concat(parts: Float32Array[]): Float32Array {
  const out = new Float32Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/**
 * A plan's previous chunk and weights in the model's space for an observation with raw state
 * `state`: the chunk as the model would have answered it relative to this state, moved by the
 * executed count; guided weights on the dataset's action dims only (the padded dims are free),
 * prefix weights on every dim of the held actions (training held the padding too).
 */
function datumChunk(plan: RtcPlan, meta: PolicyMeta, state: Float32Array): DatumChunk {
  const { horizon: H, actionDim: A } = meta.model;
  const mode = plan.mode as RtcMode;
  const actions = shiftChunk(toModelActions(plan.previous!, meta, state), H, plan.executed);
  const weights = new Float32Array(H * A);
  const dims = mode === 'guided' ? meta.actionDim : A;
  plan.weights.forEach((w, i) => weights.fill(w, i * A, i * A + dims));
  return { mode, actions, weights, maxGuidance: plan.maxGuidance };
}

/**
 * Loads a checkpoint into the engine (`load_policy`), or binds a session's live weights, and
 * returns the policy ready to serve.
 * @throws PolicyConfigError / NormError for a checkpoint that cannot be served; the engine's
 *   error when it cannot load the weights.
 */
export async function createPolicyServer(opts: PolicyServerOptions): Promise<PolicyServer> {
  await initZstd();
  const { engine, policyId } = opts;
  const limits: PolicyLimits = { ...DEFAULT_POLICY_LIMITS, ...opts.limits };
  const rtc: RtcSettings = { ...DEFAULT_RTC_SETTINGS, ...opts.rtc };
  const isLive = opts.live !== undefined;
  let swaps = 0;
  let liveStep: number | null = null;
  // The batch layout of the engine's model (the real family's needs its tokenizer: one line naming the fix when it is missing).
  const layout = await modelLayout(engine.info);

  const metaOf = async (engineId: string, dir: string | null, config: unknown, fromEngine: unknown, what: string, normMode: NormMode | null = null): Promise<PolicyMeta> => {
    const norm = await servedNormStats(dir, fromEngine, normMode);
    const meta = policyMeta(engine.info, config, norm ? { norm_stats: norm.stats } : null, { layout, normMode: norm?.mode, normConvention: norm ? { convention: norm.convention, eps: norm.eps } : undefined });
    if (!meta.norm) log.warn(`policy ${engineId}: ${what} has no norm stats; states and actions pass unnormalised`);
    return meta;
  };
  /** A datum like a lone robot's first request (every camera the policy binds, a zero state, an empty prompt). */
  const warmBatch = (v: Version) => {
    const { model } = v.meta;
    const frame = new Uint8Array(model.imageSize * model.imageSize * 3);
    const datum = { images: Array.from({ length: model.slots }, (_, k) => (k < v.meta.cameras.length ? frame : null)), state: new Float32Array(v.meta.stateDim ?? 0), prompt: '' };
    return makeBatch(model, [datum], { maxPromptBytes: limits.maxPromptBytes, encodePrompt: model.encodePrompt });
  };
  /**
   * One plain sample of a lone robot's request before the first robot sends: on an engine that
   * runs graphs it traces that layout's graph (about 1 s on a 2-core machine) here rather than in
   * a robot's first answer, unless other policies' robots are busy on the engine (TRACE_QUIET_MS:
   * then it samples eagerly, and a later request traces when they are quiet). Skipped where the
   * engine does not make graphs (there a sample costs what it costs). Best effort: a failure is
   * logged and serving goes on. The real-time chunking graph is warmed after it (warmRtc).
   */
  const warmPlain = async (v: Version): Promise<boolean> => {
    if (!engine.info.graphs) return false;
    const batch = warmBatch(v);
    const t0 = performance.now();
    try {
      await engine.call(v.engineId, 'infer', { batch, seeds: [0], numSteps: v.meta.numSteps, trace: 'quiet' }, batchBuffers(batch));
      log.debug(`policy ${v.engineId}: warmed up (one sample; its graph traced unless other policies were busy: Engine TRACE_QUIET_MS) in ${Math.round(performance.now() - t0)} ms`);
      return true;
    } catch (e) {
      log.warn(`policy ${v.engineId}: the warm-up sample failed (${(e as Error).message}); the first request will trace its graph`);
      return false;
    }
  };
  // The real-time chunking graph of the policy's default mode (guided or prefix: a graph of its
  // own, seconds to trace on loaded cores, whose first run would otherwise inflate a robot's
  // measured delay). Not awaited by createPolicyServer: a policy the main server loads on a
  // robot's connect would keep its handshake waiting past clients' timeouts (Python's
  // websockets: 10 s). It starts only once the policy has been idle for RTC_WARM_IDLE_MS, so a
  // request whose graph is ready never queues behind it, except one that arrives while it runs
  // (one engine runs one call at a time); an RTC request of that mode before it starts makes
  // it moot (that request traced the graph). readiness() says which of these it is.
  const rtcWarm = {
    state: 'done' as 'waiting' | 'running' | 'done',
    mode: null as RtcMode | null,
    lastRequestMs: 0,
    done: Promise.resolve(),
    finish: () => undefined as void,
  };
  const warmRtc = (v: Version): void => {
    const mode = rtcMode(rtc.mode, v.meta.rtcMaxDelay);
    if (mode === 'off') return;
    rtcWarm.state = 'waiting';
    rtcWarm.mode = mode;
    rtcWarm.done = new Promise<void>((resolve) => (rtcWarm.finish = () => {
      rtcWarm.state = 'done';
      resolve();
    }));
    const check = () => {
      if (rtcWarm.state !== 'waiting') return;
      if (closed) return rtcWarm.finish();
      const s = batcher.stats();
      if (s.queued > 0 || s.running > 0 || performance.now() - rtcWarm.lastRequestMs < RTC_WARM_IDLE_MS) return void setTimeout(check, RTC_WARM_IDLE_MS).unref();
      rtcWarm.state = 'running';
      const { model } = v.meta;
      const n = model.horizon * model.actionDim;
      const chunk = { mode, maxGuidance: rtc.maxGuidance, actions: new Float32Array(n), weights: new Float32Array(n) };
      const batch = warmBatch(v);
      const t1 = performance.now();
      engine.call(v.engineId, 'infer', { batch, seeds: [0], numSteps: v.meta.numSteps, trace: 'quiet', rtc: chunk }, batchBuffers(batch)).then(
        () => log.debug(`policy ${v.engineId}: ${mode} real-time chunking warmed up in ${Math.round(performance.now() - t1)} ms`),
        (e) => log.debug(`policy ${v.engineId}: the ${mode} warm-up sample failed (${(e as Error).message}); the first RTC request will trace its graph`),
      ).finally(() => rtcWarm.finish());
    };
    setTimeout(check, RTC_WARM_IDLE_MS).unref();
  };
  const load = async (engineId: string, dir: string, label: string | number | null): Promise<Version> => {
    const loaded = await engine.call<{ result: { config: unknown; normStats: unknown } }>(engineId, 'load_policy', { dir });
    let meta: PolicyMeta;
    try {
      meta = await metaOf(engineId, dir, loaded.result.config, loaded.result.normStats, 'the checkpoint');
    } catch (e) {
      await engine.call(engineId, 'unload_policy').catch(() => undefined);
      throw e;
    }
    return { engineId, kind: 'checkpoint', meta, label, refs: 0, retired: false, unloaded: false };
  };
  /** The engine's base as a policy (the engine's `load_base_policy`: it samples with the shared base alone). */
  const loadBase = async (engineId: string, label: string | number | null): Promise<Version> => {
    const baseDir = engine.info.baseDir;
    if (engine.info.family === 'small' || !baseDir) throw new PolicyConfigError(`a base is served on a real pi0 / pi0.5 engine; this engine runs the preset ${engine.info.preset}`);
    const meta = await metaOf(engineId, baseDir, opts.base!.config, null, `the base ${baseDir}`, opts.base!.normMode ?? null);
    await engine.call(engineId, 'load_base_policy');
    return { engineId, kind: 'base', meta, label, refs: 0, retired: false, unloaded: false };
  };
  let current: Version = isLive
    ? { engineId: policyId, kind: 'checkpoint', meta: policyMeta(engine.info, opts.live!.config, opts.live!.normStats ?? null, { layout }), label: 'live', refs: 0, retired: false, unloaded: true }
    : opts.base
      ? await loadBase(policyId, opts.version ?? 'base')
      : await load(policyId, opts.checkpointDir ?? '', opts.version ?? null);
  const versions = new Set<Version>([current]);
  if (rtc.mode === 'prefix' && current.meta.rtcMaxDelay === 0) {
    log.warn(`policy ${policyId}: real-time chunking is set to prefix, but this checkpoint was not fine-tuned with rtc_max_delay: it never saw a held prefix (guided works with any checkpoint)`);
  }
  let closed = false;
  const warmedPlain = !isLive && (await warmPlain(current));

  /** A retired version is freed once nothing runs on it (its engine queue orders the unload after its last infer). */
  const release = (v: Version) => {
    if (!v.retired || v.refs > 0 || v.unloaded) return;
    v.unloaded = true;
    versions.delete(v);
    engine.call(v.engineId, 'unload_policy').catch((e) => log.warn(`unloading policy ${v.engineId}: ${(e as Error).message}`));
  };

  const counters = { connections: 0, errors: 0 };
  const batcher = new Batcher(
    async (datums, seeds, tags) => {
      // One engine call per weights version in the batch (more than one only around a swap), and
      // per kind of sampling: plain chunks keep the plain sampler, RTC ones share a guided or prefix
      // call. β is per datum (a graph input), so robots of different rtc_max_guidance share a call.
      const groups = new Map<string, { v: Version; idx: number[] }>();
      const versionIds = new Map<Version, number>();
      tags.forEach((t, i) => {
        const { v, chunk } = t as Tag;
        if (!versionIds.has(v)) versionIds.set(v, versionIds.size);
        const key = `${versionIds.get(v)}|${chunk ? chunk.mode : 'plain'}`;
        if (!groups.has(key)) groups.set(key, { v, idx: [] });
        groups.get(key)!.idx.push(i);
      });
      const rows: Float32Array[] = new Array(datums.length);
      let inferMs = 0;
      for (const { v, idx } of groups.values()) {
        const { horizon: H, actionDim: A } = v.meta.model;
        const batch = makeBatch(v.meta.model, idx.map((i) => datums[i]!), { maxPromptBytes: limits.maxPromptBytes, encodePrompt: v.meta.model.encodePrompt });
        const chunks = idx.map((i) => (tags[i] as Tag).chunk);
        const rtc = chunks[0] ? {
          mode: chunks[0].mode, maxGuidance: Float32Array.from(chunks, (c) => c!.maxGuidance),
          actions: concat(chunks.map((c) => c!.actions)), weights: concat(chunks.map((c) => c!.weights)),
        } : undefined;
        const t0 = performance.now();
        const ans = await engine.call<{ result: { actions: Float32Array; step?: number | null } }>(v.engineId, 'infer', { batch, seeds: idx.map((i) => seeds[i]!), numSteps: v.meta.numSteps, trace: 'quiet', ...(rtc ? { rtc } : {}) }, batchBuffers(batch));
        inferMs += performance.now() - t0;
        const actions = ans?.result?.actions;
        if (!(actions instanceof Float32Array) || actions.length !== idx.length * H * A) {
          throw new Error(`engine infer answered ${actions instanceof Float32Array ? `${actions.length} floats` : typeof actions}; expected ${idx.length} x ${H} x ${A}`);
        }
        if (typeof ans.result.step === 'number') liveStep = ans.result.step;
        idx.forEach((i, k) => (rows[i] = actions.subarray(k * H * A, (k + 1) * H * A)));
      }
      return { rows, inferMs };
    },
    opts.batchWindowMs ?? 5,
    opts.maxBatch ?? 16,
    () => counters.connections,
  );
  if (warmedPlain) warmRtc(current);
  const dictionary = loadObservationDictionary();
  const dictId = dictionaryId(dictionary);
  const dictionaries = [dictionary, ...(opts.zstdDictionaries ?? [])];
  const weightsVersion = () => (isLive ? liveStep : current.label);
  const readiness = (): PolicyReadiness => {
    if (rtcWarm.state === 'done') return { ready: true, warming: null };
    const what = `the ${rtcWarm.mode} real-time chunking graph`;
    return { ready: false, warming: rtcWarm.state === 'running' ? `tracing ${what}` : `${what} is traced once the policy has been idle ${RTC_WARM_IDLE_MS} ms` };
  };
  let swapChain: Promise<unknown> = Promise.resolve();
  // Its series (labelled policy=<policyId>) live until it is closed or unloaded.
  const releaseSeries = holdPolicySeries(policyId, opts.owner ?? null);
  return {
    id: policyId,
    get meta() {
      return current.meta;
    },
    limits,
    seed: opts.seed ?? null,
    debug: opts.debug ?? false,
    apiKey: opts.apiKey ?? null,
    rtc,
    dictionary,
    dictionaries,
    counters,
    isLive,
    weightsVersion,
    metadata: (conn = rtc) => {
      const meta = current.meta;
      const ready = readiness();
      // A live policy of a session created without `robot` has neither stats nor the robot's dims.
      const modelUnits = isLive && opts.live!.normStats == null && opts.live!.config.action_dim == null;
      return {
        server: 'vela',
        model: meta.preset,
        action_horizon: meta.actionHorizon,
        action_dim: meta.actionDim,
        action_space: meta.actionSpace,
        cameras: meta.cameras,
        state_dim: meta.stateDim ?? meta.model.stateDim,
        // Self-description: the keys to send and what comes back (PROTOCOL.md section 6).
        observation_keys: { ...observationKeys(meta, limits), ...RTC_KEYS },
        answer_keys: {
          actions: `float32 [${meta.actionHorizon}, ${meta.actionDim}]: action_horizon steps of ${modelUnits ? "the model's normalised actions (padded dims; see note)" : "the robot's actions, in its units"}${meta.actionSpace === 'delta' ? ' (absolute: the server adds the state back on the delta dims)' : ''}`,
          policy_timing: 'map: infer_ms', server_timing: 'map: infer_ms, prev_total_ms, and rtc (when the observation sent rtc/executed): mode, delay, delay_source, executed, overlap, control_hz, weights',
          ...(meta.norm ? { warnings: 'list of str, only when the state is far outside the norm stats (wrong units, stats or dim order); the actions are still sent' } : {}),
        },
        // Which units the answer is in (PROTOCOL.md section 6): a checkpoint's, or a session created
        // with `robot`, answers the robot's; a session without one, the model's normalised space.
        units: modelUnits ? 'model' : 'robot',
        ...(modelUnits ? { note: `actions are the model's normalised space, padded to ${meta.actionDim} dims (no norm stats, no names); create the training session with "robot" ({action_dim, action_names, state_names, norm_stats}) to get the robot's dims in its units` } : {}),
        ...(meta.stateNames ? { state_names: meta.stateNames } : {}),
        ...(meta.actionNames ? { action_names: meta.actionNames } : {}),
        image_size: meta.model.imageSize,
        image_codecs: ['RAW', 'LOSSLESS', 'PNG', 'JPEG', 'CODEC_JPEG_Q<N>'],
        zstd_dictionary_id: dictId,
        zstd_dictionary_path: '/v1/observation.zdict',
        // Every id a frame may name: the served dictionary's, then the operator's (--zstd-dict, e.g. Relay's observation.zdict).
        zstd_dictionary_ids: dictionaries.map(dictionaryId),
        max_message_bytes: limits.maxMessageBytes,
        max_batch: batcher.maxBatch,
        seeded: opts.seed !== undefined && opts.seed !== null,
        weights_version: weightsVersion(),
        live: isLive,
        // Readiness as at the handshake (PROTOCOL.md section 6): false while a graph is still warming up.
        ready: ready.ready,
        ...(ready.warming ? { warming: ready.warming } : {}),
        // Real-time chunking (PROTOCOL.md section 6): what an observation with rtc/executed gets on this connection.
        rtc: {
          mode: rtcMode(conn.mode, meta.rtcMaxDelay), control_hz: conn.controlHz, delay: conn.delay,
          schedule: conn.schedule, max_guidance: conn.maxGuidance, trained_max_delay: meta.rtcMaxDelay,
        },
      };
    },
    async infer(obs, seed, rtcPlan) {
      const v = current; // pinned for the whole request
      v.refs++;
      try {
        const parsed = parseObservation(obs, v.meta, limits);
        const norm = v.meta.norm;
        const report = norm && parsed.state.length > 0 ? outOfRange(parsed.state, norm.stats.state, norm.normalizer.mode) : null;
        const datum = await toDatum(parsed, v.meta, limits);
        // A real model's prompt over its token limit (ShapeError too_large) is refused for this
        // request alone, here, not in makeBatch where it would fail every robot batched with it.
        const prompt = v.meta.model.encodePrompt?.(datum.prompt, datum.state) ?? tokenizePrompt(v.meta.model, datum.prompt, limits.maxPromptBytes);
        let promptTokens = 0;
        for (let i = 0; i < prompt.mask.length; i++) promptTokens += prompt.mask[i] ? 1 : 0;
        let plan = rtcPlan ?? null;
        // Weights swapped in since the previous chunk may answer another shape: that chunk cannot be continued.
        // (compared by shape: 16 x 26 and 13 x 32 have the same size, and the old chunk would be read as the new shape).
        const [ph, pa] = plan?.previousShape ?? [0, 0];
        if (plan && plan.mode !== 'off' && (ph !== v.meta.actionHorizon || pa !== v.meta.actionDim)) plan = { ...plan, mode: 'off', reason: 'the served weights changed shape since the previous chunk' };
        const chunk = plan && plan.mode !== 'off' ? datumChunk(plan, v.meta, parsed.state) : null;
        const submittedMs = performance.now();
        rtcWarm.lastRequestMs = submittedMs;
        if (chunk && rtcWarm.state === 'waiting' && chunk.mode === rtcWarm.mode) rtcWarm.finish(); // this request traces that graph itself
        const r = await batcher.submit(datum, seed, { v, chunk } satisfies Tag);
        const actions = toRobotActions(r.row, v.meta, parsed.state);
        return { actions: ndarray(actions, [v.meta.actionHorizon, v.meta.actionDim]), policyInferMs: r.inferMs, batchSize: r.batchSize, submittedMs, queueMs: r.queueMs,
          outOfRange: report && norm ? { report, stats: norm.stats.state, stateNames: v.meta.stateNames } : null, robotActions: actions, rtc: plan,
          promptTokens, actionTokens: v.meta.model.horizon,
        };
      } finally {
        v.refs--;
        release(v);
      }
    },
    stats: () => ({ ...batcher.stats(), ...counters, weights_version: weightsVersion(), swaps }),
    swap(dir, version) {
      if (isLive) return Promise.reject(new Error(`policy ${policyId} serves a training session's live weights; it takes no pushed weights`));
      const run = async (): Promise<SwapResult> => {
        const t0 = performance.now();
        const next = await load(`${policyId}#${++swaps}`, dir, version);
        versions.add(next);
        const prev = current;
        current = next;
        prev.retired = true;
        release(prev);
        log.info(`policy ${policyId}: weights ${JSON.stringify(prev.label)} -> ${JSON.stringify(version)}`);
        return { weights_version: version, previous_version: prev.label, load_seconds: (performance.now() - t0) / 1000 };
      };
      const p = swapChain.then(run, run);
      swapChain = p.catch(() => undefined);
      return p;
    },
    readiness,
    whenReady: () => rtcWarm.done,
    close: () => {
      closed = true;
      if (rtcWarm.state === 'waiting') rtcWarm.finish();
      batcher.close(new Error('the policy server is shutting down'));
      releaseSeries();
    },
    async dispose() {
      closed = true;
      if (rtcWarm.state === 'waiting') rtcWarm.finish();
      batcher.close(new Error('the policy was unloaded'));
      releaseSeries();
      for (const v of [...versions]) {
        v.retired = true;
        if (!isLive) release(v);
      }
      await swapChain;
    },
  };
}

/**
 * The policy of a folder the main server serves (a fine-tune's output, a sampling session's
 * checkpoint), on the engine of its model: a Vela checkpoint on its preset's engine, or on its
 * real base's (`engineModel`, a job's `engine_model`, when known; else its `base_checkpoint`);
 * a real base in the Hub layout as it is, on its own engine.
 * @throws PolicyConfigError for a folder that names no model; HttpError 503 when the real
 *   model's tokenizer is missing (the line says how to get it); what engineFor and
 *   createPolicyServer throw.
 */
export async function createFolderPolicy(
  engineFor: (model: string) => Promise<EngineLike>,
  dir: string,
  opts: Omit<PolicyServerOptions, 'engine' | 'checkpointDir' | 'base' | 'live'> & { engineModel?: string | null },
): Promise<PolicyServer> {
  const { engineModel, ...rest } = opts;
  const target = await classifyFolder(dir, { engineModel });
  const engine = await engineFor(target.engineModel);
  try {
    return await createPolicyServer({ ...rest, engine, checkpointDir: dir, ...(target.kind === 'base' ? { base: baseServing(target, null) } : {}) });
  } catch (e) {
    // The real model's tokenizer is the operator's to install: its line (with the fix) reaches the client, not a bare 500.
    if ((e as Error)?.name === 'TokenizerError') throw new HttpError(503, `this server cannot serve ${target.kind === 'base' ? 'the base' : 'the checkpoint'} yet: ${(e as Error).message}`);
    throw e;
  }
}
