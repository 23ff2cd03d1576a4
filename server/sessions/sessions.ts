/**
 * Training sessions (PROTOCOL.md section 2): creation, the engines behind them, idle cleanup.
 * A session lives in its engine's memory (adapter, gradients, optimizer moments); the store keeps
 * its row so that clients can list it and so that a restart can close what was lost.
 */
import path from 'node:path';
import { jsonId, type RequestId } from '../../protocol/messages.ts';
import type { RawMsgpack } from '../../protocol/msgpack.ts';
import { PRESET_NAMES, makeConfig, resolvePreset } from '../../kernels/small/config.ts';
import { SESSION_DEFAULTS, defaultLora } from '../jobs/recipes.ts';
import { loraAlphaProblem } from '../models/lora-limits.ts';
import { DEFAULT_BASES, isRealModel, type RealModel } from '../models/bases.ts';
import { modelLayout, tokenizerFileFor, type ModelLayout } from '../models/layout.ts';
import { ModelError } from '../models/errors.ts';
import { modelsDirOf, resolveBase } from '../models/resolve.ts';
import { isRealModelKey, parseEngineModel, realModelKey } from '../engine/model-key.ts';
import { availableMemory, memoryLedger } from '../models/memory.ts';
import { planOrRefuse, realConfigOf } from '../models/plan.ts';
import { checkBaseAccess } from '../models/access.ts';
import { checkBaseVariant } from '../models/base-variant.ts';
import { zeroGateRule } from '../../kernels/lora.ts';
import type { NormStats, NormStatsSet } from '../../kernels/normalize.ts';
import { Engine, PriorityGate, type EngineLike, type EngineOptions } from '../engine/host.ts';
import type { BackendInfo } from '../engine/messages.ts';
import type { NativeThreads } from '../../kernels/backend/native.ts';
import { HttpError, bytesText } from '../http/http.ts';
import { meant } from '../../protocol/resemble.ts';
import { log } from '../log.ts';
import { storedPreset } from '../models/presets.ts';
import { newToken } from '../http/auth.ts';
import { nowS, randomId, type SessionRow, type Store } from '../store/store.ts';
import { isUniqueViolation } from '../db/index.ts';
import type { ServerConfig } from '../config.ts';
import { storageOf } from '../store/storage.ts';

const TARGETS = ['attn', 'mlp', 'action_expert', 'prefix_expert', 'all'];

/** The validated body of `POST /v1/training_sessions`, defaults filled in. */
export interface SessionConfig {
  /** A small preset, or `pi0` / `pi05`: the real models (kernels/pi), on checkpoint `base`. */
  base_model: string;
  /** The real model's base checkpoint as the client named it (Hub id or folder); null for presets. */
  base?: string | null;
  /** The engine that holds the model (server/engine/model-key.ts); set when the base is resolved. */
  engine_model?: string;
  finetune: 'lora' | 'full';
  rank: number;
  alpha: number;
  targets: string[];
  action_horizon: number | null; // null: the preset's horizon
  seed: number;
  /** The action expert's LoRA rank and alpha where they differ from rank / alpha (openpi's 32 on the real models). */
  action_rank?: number;
  action_alpha?: number;
  /** The robot the session's live policy answers for (parseSessionRobot); absent: the model's normalised 32 dims. */
  robot?: SessionRobot;
}

/**
 * The robot a training session's live policy serves (`robot` of `POST /v1/training_sessions`):
 * its action dims (the answer is trimmed to them), names, and the stats that unnormalise the
 * answer into the robot's units, in a job checkpoint's norm_stats.json layout (NormStatsSet).
 */
export interface SessionRobot {
  action_dim: number;
  action_names?: string[];
  state_names?: string[];
  norm_stats?: NormStatsSet;
}

/** The most entries a robot's names or stats list may have. */
const MAX_ROBOT_ENTRIES = 4096;
/** The most action dims a session's robot may have (the models' padded width; the engine's own is checked at load). */
const MAX_ROBOT_ACTION_DIM = 32;

/**
 * Validates a create-session body's `robot`. @throws HttpError 400 naming the field
 * (`robot.action_dim`, `robot.norm_stats.actions.std`, ...) and what is accepted.
 */
export function parseSessionRobot(v: unknown): SessionRobot {
  if (v === null || typeof v !== 'object' || Array.isArray(v)) throw new HttpError(400, `robot must be an object {action_dim, action_names?, state_names?, norm_stats?}, got ${JSON.stringify(v)}`);
  const r = v as Record<string, unknown>;
  const fields = ['action_dim', 'action_names', 'state_names', 'norm_stats'];
  for (const k of Object.keys(r)) if (!fields.includes(k)) throw new HttpError(400, `unknown field "robot.${k}"; known fields: ${fields.map((f) => `robot.${f}`).join(', ')}`);
  const ad = r.action_dim;
  if (typeof ad !== 'number' || !Number.isInteger(ad) || ad < 1 || ad > MAX_ROBOT_ACTION_DIM) throw new HttpError(400, `robot.action_dim must be an integer in 1..${MAX_ROBOT_ACTION_DIM} (at most the model's action dims), got ${JSON.stringify(ad)}`);
  const out: SessionRobot = { action_dim: ad };
  const nameList = (key: 'action_names' | 'state_names', len: number | null): string[] | undefined => {
    const n = r[key];
    if (n === undefined || n === null) return undefined;
    if (!Array.isArray(n) || n.length > MAX_ROBOT_ENTRIES || !n.every((x) => typeof x === 'string' && x.length <= 256)) throw new HttpError(400, `robot.${key} must be a list of at most ${MAX_ROBOT_ENTRIES} strings, got ${JSON.stringify(n).slice(0, 200)}`);
    if (len !== null && n.length !== len) throw new HttpError(400, `robot.${key} has ${n.length} names; robot.action_dim is ${len}`);
    return n as string[];
  };
  const an = nameList('action_names', ad);
  const sn = nameList('state_names', null);
  if (an) out.action_names = an;
  if (sn) out.state_names = sn;
  if (r.norm_stats !== undefined && r.norm_stats !== null) {
    const ns = r.norm_stats;
    if (typeof ns !== 'object' || Array.isArray(ns)) throw new HttpError(400, `robot.norm_stats must be an object {state: {mean, std, q01, q99}, actions: {...}}, got ${JSON.stringify(ns).slice(0, 200)}`);
    const stats = {} as NormStatsSet;
    for (const key of ['state', 'actions'] as const) {
      const s = (ns as Record<string, unknown>)[key];
      if (s === null || typeof s !== 'object' || Array.isArray(s)) throw new HttpError(400, `robot.norm_stats.${key} must be an object {mean, std, q01, q99} of number lists`);
      const want = key === 'actions' ? ad : (sn?.length ?? null);
      const one = {} as NormStats;
      let len: number | null = null;
      for (const f of ['mean', 'std', 'q01', 'q99'] as const) {
        const a = (s as Record<string, unknown>)[f];
        const name = `robot.norm_stats.${key}.${f}`;
        if (!Array.isArray(a) || a.length === 0 || a.length > MAX_ROBOT_ENTRIES) throw new HttpError(400, `${name} must be a list of 1..${MAX_ROBOT_ENTRIES} finite numbers, got ${JSON.stringify(a)?.slice(0, 200)}`);
        const badAt = a.findIndex((x) => typeof x !== 'number' || !Number.isFinite(x));
        // JSON has no NaN: a client's NaN arrives as null, and is named as what it was meant to be.
        if (badAt >= 0) throw new HttpError(400, `${name}[${badAt}] is ${JSON.stringify(a[badAt])}; stats must be finite numbers (a NaN or infinity is sent as null)`);
        if (f === 'std' && a.some((x: number) => x < 0)) throw new HttpError(400, `${name} has a negative value; a std must be >= 0`);
        if (len !== null && a.length !== len) throw new HttpError(400, `${name} has ${a.length} values; robot.norm_stats.${key}.mean has ${len}`);
        if (want !== null && a.length !== want) throw new HttpError(400, `${name} has ${a.length} values; ${key === 'actions' ? `robot.action_dim is ${want}` : `robot.state_names has ${want}`}`);
        len = a.length;
        one[f] = a as number[];
      }
      stats[key] = one;
    }
    out.norm_stats = stats;
  }
  return out;
}

/** A fine-tune's names for a session's fields (the two APIs name them apart), for "did you mean". */
const SESSION_NAMES: Record<string, string> = { model: 'base_model', lora_rank: 'rank', lora_alpha: 'alpha' };

/** Validate a create-session body. @throws HttpError 400 naming the field. */
export function parseSessionConfig(body: Record<string, unknown>): SessionConfig {
  const known = ['base_model', 'base', 'finetune', 'rank', 'alpha', 'targets', 'action_horizon', 'seed', 'robot'];
  for (const k of Object.keys(body)) if (!known.includes(k)) throw new HttpError(400, `unknown field "${k}"${meant(k, known, SESSION_NAMES)}; known fields: ${known.join(', ')}`);
  const base = body.base_model;
  const real = isRealModel(base);
  const models = `pi0, pi05 (the real models) or ${PRESET_NAMES.join(', ')}`;
  // Absent (or null) is not a wrong value: "got undefined" did not say the field was missing.
  if (base == null) throw new HttpError(400, `base_model is required: one of ${models}`);
  if (typeof base !== 'string' || (!real && !PRESET_NAMES.includes(base))) {
    throw new HttpError(400, `base_model must be one of ${models}, got ${JSON.stringify(base)}`);
  }
  if (body.base != null && (!real || typeof body.base !== 'string' || body.base.length === 0 || body.base.length > 4096)) {
    throw new HttpError(400, real ? `base must be a Hub id (e.g. ${DEFAULT_BASES[base]}) or a checkpoint folder, got ${JSON.stringify(body.base)}` : `base applies to base_model pi0 / pi05 (a checkpoint of the real models); ${base} is a preset with its own seeded weights`);
  }
  const finetune = body.finetune ?? SESSION_DEFAULTS.finetune; // LoRA on every base: recipes.ts SESSION_DEFAULTS says why
  if (finetune !== 'lora' && finetune !== 'full') throw new HttpError(400, `finetune must be "lora" or "full", got ${JSON.stringify(finetune)}`);
  // A LoRA setting on a full-weight session would be ignored silently: the request wants LoRA.
  const loraField = finetune === 'full' ? ['rank', 'alpha', 'targets'].find((k) => body[k] != null) : undefined;
  if (loraField) throw new HttpError(400, `${loraField} applies to finetune "lora" only, got ${JSON.stringify(body[loraField])}: this session is "full", which trains every weight; leave ${loraField} out, or use finetune "lora" (the default)`);
  const int = (k: string, def: number, lo: number, hi: number): number => {
    const v = body[k] ?? def;
    if (typeof v !== 'number' || !Number.isInteger(v) || v < lo || v > hi) throw new HttpError(400, `${k} must be an integer in ${lo}..${hi}, got ${JSON.stringify(v)}`);
    return v;
  };
  // recipes.ts defaultLora: openpi's ranks on the real models, 16 / 32 on a preset (as fine-tunes).
  const lora = defaultLora(real);
  const rank = int('rank', lora.rank, 1, 256);
  const alpha = body.alpha ?? lora.alpha;
  const alphaProblem = loraAlphaProblem(alpha);
  if (alphaProblem || typeof alpha !== 'number') throw new HttpError(400, `alpha ${alphaProblem}, got ${JSON.stringify(alpha)}`);
  const targets = body.targets ?? ['all'];
  if (!Array.isArray(targets) || targets.length === 0 || !targets.every((t) => typeof t === 'string' && TARGETS.includes(t))) {
    throw new HttpError(400, `targets must be a non-empty list of ${TARGETS.join(', ')}, got ${JSON.stringify(targets)}`);
  }
  // Sessions on a preset start from the engine's seeded base, whose pi0.5 gates are shut (kernels/lora.ts).
  const preset = real ? base : resolvePreset(base, (line) => log.warn(`session: ${line}`));
  const gateRule = finetune === 'lora' && !real ? zeroGateRule(makeConfig(preset), targets as string[]) : null;
  if (gateRule) throw new HttpError(400, `targets ${gateRule}, got ${JSON.stringify(targets)}`);
  const ah = body.action_horizon ?? null;
  if (ah !== null && (typeof ah !== 'number' || !Number.isInteger(ah) || ah < 1)) throw new HttpError(400, `action_horizon must be a positive integer, got ${JSON.stringify(ah)}`);
  const seed = int('seed', SESSION_DEFAULTS.seed, 0, 2 ** 31 - 1);
  const out: SessionConfig = { base_model: preset, finetune, rank, alpha, targets: targets as string[], action_horizon: ah as number | null, seed };
  if (body.robot !== undefined && body.robot !== null) out.robot = parseSessionRobot(body.robot);
  if (real) {
    out.base = (body.base as string | undefined) ?? DEFAULT_BASES[base];
    // The expert's rank follows openpi's doubling unless the client set a rank for both (LoRA only:
    // a full session has no adapters to size).
    if (finetune === 'lora' && body.rank == null && lora.action_rank !== null) out.action_rank = lora.action_rank;
    if (finetune === 'lora' && body.rank == null && body.alpha == null && lora.action_alpha !== null) out.action_alpha = lora.action_alpha;
  } else out.engine_model = preset;
  return out;
}

/**
 * A session row's config as clients see it: `base_model` the public name and `base` as the client
 * gave it; the engine's key (`engine_model`, the resolved folder) stays inside the server.
 */
export function publicConfig(config: Record<string, unknown>): Record<string, unknown> {
  const { engine_model: _engineKey, ...rest } = config;
  return rest;
}

/** How many of a session's latest forward_backward losses its JSON carries (`recent_losses`). */
export const LOSS_HISTORY = 200;

/** A session that is open in an engine. */
export class LiveSession {
  cameras: string[] = []; // camera name -> slot index, in the order first seen (saved with weights)
  /** The id of the last request answered with a result: exact value, and its msgpack bytes as the client sent them. */
  lastRequestId: { value: RequestId; raw: RawMsgpack | null } | null = null;
  /** The last op that finished (for dashboards): its name, id, end time (Unix s) and duration. */
  lastOp: { op: string; id: RequestId; at: number; ms: number; ok: boolean } | null = null;
  opsCount = 0;
  pendingGradients = 0;
  lastActivityMs = Date.now();
  connection: { takeOver(reason: string): void } | null = null;
  actionHorizon = 0;
  trainableParams: number | null = null;
  /** Bytes of engine memory this session holds beside the shared base (adapters and AdamW moments, at creation). */
  tenantBytes: number | null = null;
  /** The memory planned for this session at creation (server/models/plan.ts; real models only). */
  plannedBytes: number | null = null;
  /** How the main thread lays out this session's batches (set once its engine is up). */
  layout: ModelLayout | null = null;
  /** Tail of the session's ordered engine calls (ops.ts). */
  chain: Promise<unknown> = Promise.resolve();
  /**
   * Put to sleep (the futures API's sleep, `/sleep`): its tensors are in host memory and its ops
   * fail with `asleep` until wake_up. Shown as `asleep` in both session APIs' JSON.
   */
  asleep = false;
  /** forward_backward ops answered so far (the x of recentLosses). */
  forwardBackwards = 0;
  /**
   * The last LOSS_HISTORY forward_backward losses, oldest first: `n` counts this session's
   * forward_backwards from 1, `loss` is the batch's weighted mean loss as answered. In memory only
   * (gone with the live session); the dashboard's session page draws them.
   */
  recentLosses: { n: number; loss: number }[] = [];
  constructor(readonly row: SessionRow, readonly config: SessionConfig, public engine: EngineLike | null) {}
  /** Keeps one forward_backward's loss in recentLosses (the oldest goes past LOSS_HISTORY). */
  recordLoss(loss: number): void {
    this.recentLosses.push({ n: ++this.forwardBackwards, loss });
    if (this.recentLosses.length > LOSS_HISTORY) this.recentLosses.shift();
  }
  get id(): string {
    return this.row.id;
  }
  touch(): void {
    this.lastActivityMs = Date.now();
  }
}

/**
 * Which engine of a preset: `training` (sessions and fine-tune jobs) or `policy` (policies
 * served to robots). They run in separate workers; the gate lets policy calls go first.
 */
export interface EngineLane {
  role: 'training' | 'policy';
  gate: PriorityGate;
}

export type EngineFactory = (preset: string, lane: EngineLane) => Promise<EngineLike>;

/** Engine.start options for a preset's engine in a lane, from the server's settings. */
export function engineOptions(config: ServerConfig, preset: string, lane: EngineLane): EngineOptions {
  return {
    preset, backend: lane.role === 'policy' && config.policyBackend !== 'same' ? config.policyBackend : config.backend,
    maxResident: config.maxResidentSessions, threads: threadsOf(config),
    priority: { gate: lane.gate, role: lane.role === 'policy' ? 'urgent' : 'yield' },
  };
}

/** The native runtime's thread settings of a server config. */
export function threadsOf(config: ServerConfig): NativeThreads {
  return { intraOp: config.tfIntraOpThreads, interOp: config.tfInterOpThreads };
}

export class SessionManager {
  private engines = new Map<string, Promise<EngineLike>>();
  private started = new Set<string>();
  /** Engines that finished starting, by their start promise (what the maps hold). */
  private readyEngines = new WeakMap<Promise<EngineLike>, EngineLike>();
  private policyEngines = new Map<string, Promise<EngineLike>>();
  /** Policy requests first, training between them (host.ts PriorityGate). */
  readonly gate: PriorityGate;
  private probed: Promise<BackendInfo> | undefined;
  readonly live = new Map<string, LiveSession>();
  /** The cluster node this process is (server/cluster), written on each session row; null on one node. */
  nodeId: string | null = null;
  /** Called after a session closed (any reason): the server unloads its live policy then, and its metrics series go. */
  onClosed: ((id: string) => void) | null = null;
  private idleTimer: NodeJS.Timeout;
  /** When each real base's engine was first seen holding nothing (Date.now() ms), by engine key. */
  private idleSince = new Map<string, number>();
  private baseTimer: NodeJS.Timeout | null = null;

  constructor(
    private store: Store,
    private config: ServerConfig,
    private engineFactory: EngineFactory = (preset, lane) => Engine.start(engineOptions(config, preset, lane)),
  ) {
    this.gate = new PriorityGate(config.trainingYieldMs);
    this.idleTimer = setInterval(() => this.closeIdle(), Math.min(60_000, config.sessionIdleTimeoutS * 250)).unref();
    // A base is closed within a quarter of its timeout past it (each sweep asks each engine for its stats).
    if (config.baseIdleS > 0) {
      let sweeping = false;
      this.baseTimer = setInterval(() => {
        if (sweeping) return;
        sweeping = true;
        void this.releaseIdleBases(config.baseIdleS).catch((e) => log.warn(`base idle sweep: ${(e as Error).message}`)).finally(() => (sweeping = false));
      }, Math.max(250, Math.min(60_000, config.baseIdleS * 250))).unref();
    }
  }

  /**
   * The backend this server's engines run on: the first started engine's, else chosen once in a
   * short-lived worker (Engine.probe) with the same settings.
   */
  backend(): Promise<BackendInfo> {
    this.probed ??= (async () => {
      for (const e of this.engines.values()) {
        const info = await e.then((x) => x.info, () => null);
        if (info) return { name: info.backend, kind: info.backendKind, device: info.backendDevice, fallbacks: info.backendFallbacks, line: info.backendLine };
      }
      return Engine.probe(this.config.backend, threadsOf(this.config));
    })();
    this.probed.catch(() => (this.probed = undefined));
    return this.probed;
  }

  /** The engine of a preset, started on first use and shared by every session of that preset. */
  engineFor(preset: string): Promise<EngineLike> {
    return this.laneEngine(this.engines, preset, 'training');
  }

  /**
   * The engine that serves a preset's policies to robots: its own worker (its own thread, and
   * its own copy of the base weights), so inference never queues behind a training step, and
   * the training engine yields between ops while policy requests wait.
   */
  policyEngineFor(preset: string): Promise<EngineLike> {
    return this.laneEngine(this.policyEngines, preset, 'policy');
  }

  private laneEngine(map: Map<string, Promise<EngineLike>>, name: string, role: EngineLane['role']): Promise<EngineLike> {
    // A real base is held once per process (13.4 GB in float32 at full size): its policies run in
    // the engine of its sessions and jobs, taking turns with their ops, rather than in a second copy.
    if (isRealModelKey(name)) {
      map = this.engines;
      role = 'training';
    }
    // A checkpoint or job stored before issue 23 names its preset by an old name (pi05-tiny, or a
    // bare pi05 for flow05-small): the same model, so the same engine as the new name.
    const preset = storedPreset(name);
    let e = map.get(preset);
    if (!e) {
      e = this.engineFactory(preset, { role, gate: this.gate });
      map.set(preset, e);
      // A later call may retry a failed start; /health's engines are the training ones (xorl's shape).
      const started = e;
      // A real base's weights are reserved from a session's plan until its engine holds them (or failed to).
      const loaded = () => isRealModelKey(name) && memoryLedger.release(`base:${name}`);
      e.then((x) => {
        this.readyEngines.set(started, x);
        if (map === this.engines) this.started.add(preset);
        loaded();
      }, () => {
        map.delete(preset);
        loaded();
      });
    }
    return e;
  }

  /**
   * The started engine of a real base `key` when it holds nothing now (no session, job state or
   * policy in it, no call queued, no admitted session counting on it), else null.
   */
  private async idleEngine(key: string, e: Promise<EngineLike>): Promise<EngineLike | null> {
    const engine = this.readyEngines.get(e);
    // A session admitted but not yet opened (memoryLedger) counted on this base being loaded.
    if (!engine || engine.stats().queued > 0 || memoryLedger.pendingOn(key) || [...this.live.values()].some((l) => l.config.engine_model === key)) return null;
    const s = await engine.call<{ result: { sessions: number; policies: number } }>('-', 'stats').catch(() => null);
    if (!s || s.result.sessions > 0 || s.result.policies > 0 || this.engines.get(key) !== e) return null;
    return engine;
  }

  /**
   * Closes the engines of real bases that hold nothing now (idleEngine), those idle for at least
   * `minIdleS` seconds (default 0: every one): a closed session leaves its base in memory (13.4 GB
   * at full size) until then. Run before a memory plan refuses, by the base idle timer
   * (--base-idle-timeout-s) and by the operator's POST /v1/admin/release-idle-bases. Returns the
   * public names (pi0 / pi05) of the bases closed.
   */
  async releaseIdleBases(minIdleS = 0): Promise<string[]> {
    const closed: string[] = [];
    const now = Date.now();
    for (const [key, e] of [...this.engines]) {
      if (!isRealModelKey(key)) continue;
      const engine = await this.idleEngine(key, e);
      if (!engine) {
        this.idleSince.delete(key);
        continue;
      }
      const since = this.idleSince.get(key) ?? now;
      this.idleSince.set(key, since);
      if (now - since < minIdleS * 1000 || this.engines.get(key) !== e) continue;
      this.engines.delete(key);
      this.started.delete(key);
      this.idleSince.delete(key);
      await engine.close().catch((err) => log.warn(`closing the idle engine of ${publicModelName(key)}: ${(err as Error).message}`));
      log.info(`closed the idle engine of ${publicModelName(key)} (no session, job or policy on its base for ${Math.round((now - since) / 1000)} s)`);
      closed.push(publicModelName(key));
    }
    return closed;
  }

  /** releaseIdleBases() counted: how many idle real engines were closed. */
  async releaseIdleEngines(): Promise<number> {
    return (await this.releaseIdleBases()).length;
  }

  /**
   * /health's `bases`: every started real base's engine, with how long it has held nothing
   * (idle_s, null while in use), the seconds until the idle timer closes it (release_in_s: null
   * while in use or with --base-idle-timeout-s 0) and the tensor bytes it holds (null if unknown).
   */
  async baseReport(): Promise<{ name: string; idle_s: number | null; release_in_s: number | null; resident_bytes: number | null }[]> {
    const out = [];
    const now = Date.now();
    for (const [key, e] of [...this.engines]) {
      const ready = this.readyEngines.get(e);
      if (!isRealModelKey(key) || !ready) continue;
      const idle = await this.idleEngine(key, e);
      if (!idle) this.idleSince.delete(key);
      else if (!this.idleSince.has(key)) this.idleSince.set(key, now);
      const since = this.idleSince.get(key);
      const idleS = since === undefined ? null : (now - since) / 1000;
      const limit = this.config.baseIdleS;
      out.push({
        name: publicModelName(key), idle_s: idleS === null ? null : Math.round(idleS * 10) / 10,
        release_in_s: idleS === null || limit <= 0 ? null : Math.max(0, Math.round((limit - idleS) * 10) / 10),
        resident_bytes: ready.memory?.()?.numBytes ?? null,
      });
    }
    return out;
  }

  /**
   * planOrRefuse that first frees idle real engines when the plan does not fit (their bases are
   * memory nobody uses), then plans again. Same arguments and errors as planOrRefuse.
   */
  async planFreeing<T>(plan: () => Promise<T>): Promise<T> {
    try {
      return await plan();
    } catch (e) {
      if (!(e instanceof HttpError) || e.status !== 507 || (await this.releaseIdleEngines()) === 0) throw e;
      return plan();
    }
  }

  /** Whether an engine for `key` is started or starting (a real base is then in memory, or about to be). */
  hasEngine(key: string): boolean {
    return this.engines.has(key);
  }

  /** Models whose engine is started (for /health's engine_running): preset names, and pi0 / pi05 for real bases (never their folders). */
  runningEngines(): string[] {
    return [...this.started].filter((p) => this.engines.has(p)).map(publicModelName);
  }

  /**
   * What the engines hold against what this process may use (/health's `memory`): the limit it
   * plans against (--max-memory, the cgroup's or the machine's) and its RSS, and per started
   * engine its model, the base's parameter count and the tensor bytes tf.memory() counted
   * after its last op (the base and every tenant).
   */
  async memoryReport(): Promise<Record<string, unknown>> {
    const avail = await availableMemory({ maxMemory: this.config.maxMemory, capName: '--max-memory' });
    const engines: Record<string, unknown>[] = [];
    for (const [lane, map] of [['training', this.engines], ['policy', this.policyEngines]] as const) {
      for (const [key, e] of map) {
        const engine = this.readyEngines.get(e);
        if (!engine) continue; // still loading
        engines.push({ model: publicModelName(key), lane, base_params: engine.info.baseParams, tensor_bytes: engine.memory?.()?.numBytes ?? null });
      }
    }
    const reserved = memoryLedger.less(avail);
    return { limit_bytes: avail.limitBytes, limit_source: avail.source, rss_bytes: avail.rssBytes, reserved_bytes: reserved.reservedBytes, available_bytes: reserved.bytes, engines };
  }

  /** Root folder of a session's saved states and weights. */
  sessionDir(owner: string, id: string): string {
    return storageOf(this.config).dir('checkpoints', owner, id);
  }

  /**
   * Create a session row (`starting`) and open it in its engine in the background. `modelName`
   * is a futures client's own name for it (create_model's `model_id`).
   * @throws HttpError 429 past the per-key limit, 409 when `modelName` is taken by an open model of the key.
   */
  async create(owner: string, cfg: SessionConfig, baseUrl: string, modelName: string | null = null): Promise<SessionRow> {
    const open = await this.store.countOpenSessions(owner);
    if (open >= this.config.sessionsPerKey) {
      throw new HttpError(429, `this key has ${open} open sessions; the limit is ${this.config.sessionsPerKey}: close one first`);
    }
    const taken = () => new HttpError(409, `model_id "${modelName}" is taken by an open model of this key; kill_session or unload_model it first, or pick another name`);
    if (modelName !== null && (await this.store.findOpenSessionByName(owner, modelName))) throw taken();
    if (cfg.base != null && cfg.engine_model === undefined) {
      // Resolved and checked before the row exists, so a base that cannot serve is the request's
      // one-line 400 and nothing is left open (no row, no engine). Which folders a key may name first.
      await checkBaseAccess(this.config, this.store, owner, cfg.base, path.dirname(storageOf(this.config).dir('jobs', 'x')));
      const { dir } = await resolveBase(cfg.base, { serverDownloads: false, modelsDir: modelsDirOf(this.config), cwdRelative: false }).catch((e) => {
        // The request's mistakes are 400s; only the Hub failing (network, integrity) is the server's 502.
        throw e instanceof ModelError ? new HttpError(e.code === 'network' || e.code === 'integrity' ? 502 : 400, e.message) : e;
      });
      await checkBaseVariant(cfg.base_model as RealModel, cfg.base, dir);
      try {
        tokenizerFileFor(dir); // the real model's prompts need PaliGemma's tokenizer: refused now, not at the first op
      } catch (e) {
        throw new HttpError(400, (e as Error).message);
      }
      cfg.engine_model = realModelKey(cfg.base_model as RealModel, dir);
    }
    const id = randomId('ts-');
    let planned: number | null = null;
    let reserved: string[] = [];
    if (cfg.base != null) {
      // The base (unless its engine holds it already) and this tenant's own state must fit now;
      // each pass's activations are planned when its batch is known (ops.ts). What fits is
      // reserved until open() has the tensors allocated (the base: until its engine has loaded),
      // so that requests at once are planned as if one after another.
      const key = cfg.engine_model!;
      const plan = await this.planFreeing(async () => planOrRefuse(
        await realConfigOf(parseRealDir(key)),
        { use: cfg.finetune === 'full' ? 'full' : 'lora', batch: 1, cameras: 1, loraRank: cfg.rank, loraActionRank: cfg.action_rank ?? cfg.rank, loraTargets: cfg.targets },
        { weights: () => !this.engines.has(key), tenant: true, pass: false },
        `a ${cfg.finetune === 'full' ? 'full-weight' : 'LoRA'} session of ${cfg.base_model} (${cfg.base})`,
        this.config.maxMemory, undefined, { owner: `session:${id}`, base: `base:${key}`, engine: key },
      ));
      planned = plan.counted.totalBytes;
      reserved = plan.reserved;
    }
    const row: SessionRow = {
      id, owner, status: 'starting', created_at: nowS(), config: cfg as unknown as Record<string, unknown>, token: newToken(), error: null, closed_at: null,
      node_id: this.nodeId, model_name: modelName,
    };
    try {
      await this.store.insertSession(row);
    } catch (e) {
      // Not opened: its reservation goes (the base's too, unless an engine started loading it meanwhile and releases it once loaded).
      for (const owner of reserved) if (owner.startsWith('session:') || !this.engines.has(cfg.engine_model!)) memoryLedger.release(owner);
      // Two creates racing past the check: the store's unique index decides.
      if (isUniqueViolation(e) && modelName !== null) throw taken();
      throw e;
    }
    const live = new LiveSession(row, cfg, null);
    live.plannedBytes = planned;
    this.live.set(id, live);
    void this.open(live);
    return row;
  }

  private async open(live: LiveSession): Promise<void> {
    try {
      const engine = await this.engineFor(live.config.engine_model!);
      live.layout = await modelLayout(engine.info);
      const horizon = live.config.action_horizon ?? engine.info.actionHorizon;
      if (horizon > engine.info.actionHorizon) {
        throw new Error(`action_horizon ${horizon} is larger than ${live.config.base_model}'s ${engine.info.actionHorizon}`);
      }
      live.actionHorizon = horizon;
      // The parse allows up to 32 (the models' padded width); the engine's own is known only now.
      const robotDim = live.config.robot?.action_dim;
      if (robotDim !== undefined && robotDim > engine.info.actionDim) {
        throw new Error(`robot.action_dim ${robotDim} is larger than ${live.config.base_model}'s ${engine.info.actionDim} action dims`);
      }
      const created = await engine.call<{ result: { trainableParams: number; tenantBytes: number; baseBytes: number } }>(live.id, 'create_session', {
        finetune: live.config.finetune, rank: live.config.rank, alpha: live.config.alpha, targets: live.config.targets,
        actionRank: live.config.action_rank, actionAlpha: live.config.action_alpha,
        seed: live.config.seed, dir: this.sessionDir(live.row.owner, live.id),
      });
      // Its tensors are allocated: the process's RSS counts them from here on, not the ledger.
      memoryLedger.release(`session:${live.id}`);
      live.trainableParams = created.result.trainableParams;
      live.tenantBytes = created.result.tenantBytes;
      live.engine = engine;
      if (this.live.get(live.id) !== live) {
        await engine.call(live.id, 'close_session').catch(() => {}); // closed while starting
        return;
      }
      await this.store.updateSession(live.id, { status: 'ready' });
      // Every session of an engine shares its one frozen base: what a session adds is its own tensors.
      const { baseBytes } = created.result;
      const on = live.config.base != null ? ` on ${live.config.base}` : '';
      log.info(`session ${live.id} ready (${live.config.base_model}${on}, ${live.config.finetune}): ${live.trainableParams} trainable params, ${bytesText(live.tenantBytes ?? 0)} beside the shared base's ${bytesText(baseBytes)}`);
    } catch (e) {
      const reason = (e as Error).message;
      log.warn(`session ${live.id} failed to start: ${reason}`);
      this.live.delete(live.id);
      await this.store.updateSession(live.id, { status: 'error', error: reason, closed_at: nowS() }).catch((err) => log.warn(`session ${live.id}: ${err.message}`));
    } finally {
      memoryLedger.release(`session:${live.id}`); // failed or closed while starting: nothing more to reserve for
    }
  }

  /** Close a session: its connection ends, its engine memory is freed. Idempotent. */
  async close(id: string, reason = 'closed by the client'): Promise<void> {
    const live = this.live.get(id);
    this.live.delete(id);
    const row = await this.store.getSession(id);
    if (row && (row.status === 'starting' || row.status === 'ready')) {
      await this.store.updateSession(id, { status: 'closed', closed_at: nowS(), error: reason === 'closed by the client' ? null : reason });
      log.info(`session ${id} closed (${reason})`);
    }
    if (live) {
      live.connection?.takeOver(`session closed: ${reason}`);
      if (live.engine) await live.engine.call(id, 'close_session').catch((e) => log.warn(`closing ${id}: ${(e as Error).message}`));
    }
    this.onClosed?.(id);
  }

  private closeIdle(): void {
    const limitMs = this.config.sessionIdleTimeoutS * 1000;
    for (const live of this.live.values()) {
      if (live.engine && Date.now() - live.lastActivityMs > limitMs) {
        log.info(`session ${live.id} idle for ${this.config.sessionIdleTimeoutS} s: closing`);
        void this.close(live.id, `idle for more than ${this.config.sessionIdleTimeoutS} s`);
      }
    }
  }

  /** Public JSON of a session (PROTOCOL.md section 2). */
  toJson(row: SessionRow, baseWsUrl: string): Record<string, unknown> {
    const live = this.live.get(row.id);
    return {
      id: row.id,
      object: 'training_session',
      status: row.status,
      created_at: row.created_at,
      ...publicConfig(row.config),
      action_horizon: live?.actionHorizon || (row.config as any).action_horizon,
      base_params: live?.engine?.info.baseParams ?? null,
      // Planned (server/models/plan.ts) against used: this session's own tensors, and the engine's
      // all (the shared base and every tenant), as tf.memory() counted them after its last op.
      memory: live && live.plannedBytes !== null ? { planned_bytes: live.plannedBytes, tenant_bytes: live.tenantBytes, engine_tensor_bytes: live.engine?.memory?.()?.numBytes ?? null } : null,
      url: `${baseWsUrl}/v1/training_sessions/${row.id}/ws`,
      token: row.token,
      error: row.error,
      closed_at: row.closed_at,
      trainable_params: live?.trainableParams ?? null,
      connected: !!live?.connection,
      last_request_id: live?.lastRequestId ? jsonId(live.lastRequestId.value) : null,
      last_op: live?.lastOp ? { ...live.lastOp, id: jsonId(live.lastOp.id) } : null,
      ops_count: live?.opsCount ?? 0,
      // The dashboard's loss curve: the last LOSS_HISTORY forward_backward losses of the live session.
      recent_losses: live ? live.recentLosses.map((p) => ({ ...p })) : [],
      pending_gradients: live?.pendingGradients ?? 0,
      asleep: live?.asleep ?? false, // status stays the lifecycle (ready); its ops fail with `asleep` until wake_up
      last_activity_at: live ? live.lastActivityMs / 1000 : null,
      node: row.node_id,
    };
  }

  /** Let in-flight requests finish (up to `graceMs`), then close every session and engine. */
  async shutdown(graceMs = 10_000): Promise<void> {
    clearInterval(this.idleTimer);
    if (this.baseTimer) clearInterval(this.baseTimer);
    const inFlight = [...this.live.values()].map((l) => l.chain);
    await Promise.race([Promise.all(inFlight), new Promise((r) => setTimeout(r, graceMs).unref())]);
    for (const id of [...this.live.keys()]) await this.close(id, 'server shutting down');
    for (const e of [...this.engines.values(), ...this.policyEngines.values()]) await e.then((x) => x.close()).catch(() => {});
    this.engines.clear();
    this.policyEngines.clear();
  }
}

/** The checkpoint folder of a real engine key. */
function parseRealDir(key: string): string {
  const m = parseEngineModel(key);
  if (m.kind !== 'real') throw new Error(`${key} is not a real model's engine key`);
  return m.dir;
}

/** The name an engine key is shown by: the preset, or pi0 / pi05 for a real base (its folder stays private). */
function publicModelName(key: string): string {
  const m = parseEngineModel(key);
  return m.kind === 'real' ? m.variant : m.preset;
}
