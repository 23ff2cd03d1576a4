/**
 * Real-time chunking on the policy websocket (PROTOCOL.md section 6, "Real-time chunking";
 * kernels/rtc.ts has the sampling). The server keeps, per connection, the last chunk it sent and
 * when, and how long its answers took; a robot that says how many actions of that chunk it had
 * executed when it captured the new observation (`rtc/executed`) gets a chunk that continues the
 * old one over the d actions it will still execute before the answer arrives. d is the client's
 * (`rtc/delay`), the connection's or server's setting, or measured: the websocket's ping round
 * trip plus the connection's recent answer times, in control steps at the robot's rate. A client
 * that sends none of these keys (OpenPI's) gets plain chunks, as before.
 */
import { NDArray, NpScalar } from '../../protocol/ndarray.ts';
import { ProtocolError } from '../../protocol/errors.ts';
import { DEFAULT_MAX_GUIDANCE, rtcWeights, type RtcMode, type RtcSchedule } from '../../kernels/rtc.ts';

/** What a policy does with RTC requests: `auto` = `prefix` for a policy trained with rtc_max_delay, else `guided`. */
export type RtcSetting = 'auto' | RtcMode | 'off';

/** RTC settings of a server (`vela policy --rtc ...`) or a connection (query parameters). */
export interface RtcSettings {
  mode: RtcSetting;
  /** The robot's control rate, Hz; null = unknown until the client sends `rtc/control_hz`. */
  controlHz: number | null;
  /** A fixed delay d in control steps; null = measured (or the client's `rtc/delay`). */
  delay: number | null;
  schedule: RtcSchedule;
  /** β, the cap on the guidance weight. */
  maxGuidance: number;
}

export const DEFAULT_RTC_SETTINGS: Readonly<RtcSettings> = Object.freeze({ mode: 'auto', controlHz: null, delay: null, schedule: 'exp', maxGuidance: DEFAULT_MAX_GUIDANCE });

/** Largest accepted control rate, delay and β (sanity bounds on client input). */
const MAX_HZ = 10_000;
const MAX_DELAY = 1024;
const MAX_EXECUTED = 1_000_000;
/**
 * β above this overshoots: the guidance term moves x by up to β / num_steps of the weighted error
 * per Euler step, so at 10 steps β ~ 20 is about where a step starts to jump past the old chunk
 * (β 50 still held it, 1000 threw actions to 6x the chunk's range). The paper uses 5.
 */
const MAX_GUIDANCE = 20;

/** A plain decimal number (Number() would also take '0x1e', '1e2', ' 30 '). */
const DECIMAL = /^\d+(\.\d+)?$/;

/** The mode a setting means for a checkpoint trained with `rtcMaxDelay` (0 = without): `auto` is prefix for one trained so, else guided. */
export function rtcMode(setting: RtcSetting, rtcMaxDelay: number): RtcMode | 'off' {
  return setting === 'auto' ? (rtcMaxDelay > 0 ? 'prefix' : 'guided') : setting;
}

/** Checks one setting; returns its value or throws RangeError naming it and what it accepts. */
function setting(name: string, raw: string, kind: 'mode' | 'hz' | 'delay' | 'schedule' | 'beta'): unknown {
  const num = Number(raw);
  switch (kind) {
    case 'mode':
      if (!['auto', 'guided', 'prefix', 'off'].includes(raw)) throw new RangeError(`${name} is ${JSON.stringify(raw)}; expected auto, guided, prefix or off`);
      return raw;
    case 'schedule':
      if (raw !== 'exp' && raw !== 'linear') throw new RangeError(`${name} is ${JSON.stringify(raw)}; expected exp or linear`);
      return raw;
    case 'hz':
      if (!DECIMAL.test(raw) || !(num > 0 && num <= MAX_HZ)) throw new RangeError(`${name} is ${JSON.stringify(raw)}; expected a rate in Hz, > 0 and <= ${MAX_HZ}`);
      return num;
    case 'delay':
      if (!/^\d+$/.test(raw) || num > MAX_DELAY) throw new RangeError(`${name} is ${JSON.stringify(raw)}; expected an integer number of control steps in 0..${MAX_DELAY}`);
      return num;
    case 'beta':
      if (!DECIMAL.test(raw) || !(num >= 0 && num <= MAX_GUIDANCE)) throw new RangeError(`${name} is ${JSON.stringify(raw)}; expected a number in 0..${MAX_GUIDANCE}`);
      return num;
  }
}

/** Each RTC setting: its query parameter (`vela policy`'s flag is `--` + it with dashes), its check, its field. */
const RTC_FIELDS: readonly [string, Parameters<typeof setting>[2], keyof RtcSettings][] = [
  ['rtc', 'mode', 'mode'], ['control_hz', 'hz', 'controlHz'], ['rtc_delay', 'delay', 'delay'], ['rtc_schedule', 'schedule', 'schedule'], ['rtc_max_guidance', 'beta', 'maxGuidance'],
];

/** The query parameters of the RTC settings (`vela policy`'s flags: `--` + the name with dashes). */
export const RTC_QUERY_KEYS: readonly string[] = Object.freeze(RTC_FIELDS.map(([name]) => name));

/**
 * `base` with the RTC settings of a connection's query (`rtc`, `control_hz`, `rtc_delay`,
 * `rtc_schedule`, `rtc_max_guidance`) or of a server's flags (the same names).
 * @throws RangeError naming the parameter and what it accepts, or one given more than once (`getAll`).
 */
export function rtcSettings(base: Readonly<RtcSettings>, given: { get(name: string): string | null | undefined; getAll?(name: string): string[] }): RtcSettings {
  const out: RtcSettings = { ...base };
  const take = (name: string, kind: Parameters<typeof setting>[2]) => {
    // `?rtc=off&rtc=guided` is ambiguous: refused rather than silently taking the first.
    const all = given.getAll?.(name) ?? [];
    if (all.length > 1) throw new RangeError(`${name} is given ${all.length} times (${all.map((v) => JSON.stringify(v)).join(', ')}); give it once`);
    const raw = given.get(name);
    return raw === null || raw === undefined ? undefined : setting(name, raw, kind);
  };
  for (const [name, kind, field] of RTC_FIELDS) {
    const v = take(name, kind);
    if (v !== undefined) (out as unknown as Record<string, unknown>)[field] = v;
  }
  return out;
}

/** The RTC keys of one observation (all optional). */
export interface RtcKeys {
  executed: number | null;
  controlHz: number | null;
  delay: number | null;
}

/** The observation keys this module reads, with what they hold (for the metadata's observation_keys). */
export const RTC_KEYS: Readonly<Record<string, string>> = Object.freeze({
  'rtc/executed': 'int, optional (real-time chunking): actions of this connection\'s previous answer already executed when this observation was captured; asks for a chunk that continues it',
  'rtc/control_hz': 'float, optional: the robot\'s control rate in Hz (remembered for the connection)',
  'rtc/delay': 'int, optional: the delay in control steps to plan for (else the server measures it)',
});

function scalar(key: string, v: unknown): number {
  // numpy's bool (np.bool_, a bool array) is no count, as Python's True is not: Number() would make it 1.
  if ((v instanceof NpScalar || v instanceof NDArray) && v.dtype.endsWith('b1')) throw new ProtocolError('bad_request', `${key} must be a number; got a numpy bool`);
  const x = v instanceof NpScalar ? Number(v.value) : v instanceof NDArray && v.data.length === 1 ? Number(v.data[0]) : v;
  if (typeof x !== 'number' || !Number.isFinite(x)) throw new ProtocolError('bad_request', `${key} must be a number; got ${x === null ? 'nil' : typeof x === 'number' ? x : typeof x}`);
  return x;
}

/**
 * Removes the `rtc/...` keys from a decoded observation and checks them.
 * @throws ProtocolError('bad_request') naming the key for a value of the wrong kind or range, or an
 *   `rtc/` key this server does not know (listing the ones it does).
 */
export function takeRtcKeys(obs: Record<string, unknown>): RtcKeys {
  const keys: RtcKeys = { executed: null, controlHz: null, delay: null };
  for (const key of Object.keys(obs)) {
    if (!key.startsWith('rtc/')) continue;
    const v = obs[key];
    delete obs[key];
    const x = scalar(key, v);
    if (key === 'rtc/executed' || key === 'rtc/delay') {
      const max = key === 'rtc/executed' ? MAX_EXECUTED : MAX_DELAY;
      if (!Number.isInteger(x) || x < 0 || x > max) throw new ProtocolError('bad_request', `${key} is ${x}; expected an integer in 0..${max}`);
      if (key === 'rtc/executed') keys.executed = x;
      else keys.delay = x;
    } else if (key === 'rtc/control_hz') {
      if (!(x > 0 && x <= MAX_HZ)) throw new ProtocolError('bad_request', `rtc/control_hz is ${x}; expected a rate in Hz, > 0 and <= ${MAX_HZ}`);
      keys.controlHz = x;
    } else {
      throw new ProtocolError('bad_request', `unknown key ${key}; the real-time chunking keys are ${Object.keys(RTC_KEYS).join(', ')}`);
    }
  }
  return keys;
}

/**
 * What one request is sampled with. `mode` off: a plain chunk (`reason` says why). Otherwise the
 * previous chunk (robot units, [horizon, actionDim] as it was sent) and how it lines up: index i
 * of the new chunk is index i + executed of the old one; `delay` actions are executed before the
 * new chunk arrives; `overlap` = horizon - executed.
 */
export interface RtcPlan {
  mode: RtcMode | 'off';
  reason?: string;
  previous?: Float32Array;
  /** `previous`'s [horizon, actionDim] as sent: weights pushed since may answer another shape of the same size. */
  previousShape?: readonly [number, number];
  executed: number;
  delay: number;
  delaySource: 'client' | 'setting' | 'measured';
  overlap: number;
  controlHz: number | null;
  /** The weights over the served horizon: guided, the guidance weights; prefix, 1 on the held actions. */
  weights: number[];
  schedule: RtcSchedule;
  maxGuidance: number;
}

/** The answer's `server_timing.rtc` map for `plan` (PROTOCOL.md section 6). */
export function rtcReport(plan: RtcPlan): Record<string, unknown> {
  if (plan.mode === 'off') return { mode: 'off', reason: plan.reason ?? '' };
  return {
    mode: plan.mode, delay: plan.delay, delay_source: plan.delaySource, executed: plan.executed, overlap: plan.overlap,
    control_hz: plan.controlHz, weights: plan.weights, ...(plan.mode === 'guided' ? { schedule: plan.schedule, max_guidance: plan.maxGuidance } : {}),
  };
}

/** Answer times kept per connection and kind for the delay estimate. */
const RECENT = 4;

/**
 * How much longer a guided answer takes than a plain one, for the estimate of a connection's
 * first guided request (no guided answer time yet): a backward pass per denoising step roughly
 * doubles the work (1.9-2.0x measured for flow0-tiny, bench/results/README.md "Real-time chunking: replay").
 */
const GUIDED_COST = 2;

/**
 * One connection's RTC state: its settings, the last chunk it was sent and when, its recent
 * answer times (arrival to send, ms) and websocket round trip.
 */
export class RtcConnection {
  private last: { actions: Float32Array; shape: readonly [number, number] } | null = null;
  private totals: Record<'plain' | RtcMode, number[]> = { plain: [], guided: [], prefix: [] };
  private rttMs: number | null = null;
  private pingMs: number | null = null;
  /** Why there is no last chunk (for the answer's reason). */
  private noLast = 'no previous answer on this connection yet';

  constructor(readonly settings: RtcSettings) {}

  /** A ping went out at `nowMs` (one at a time: returns false while one is unanswered). */
  pinging(nowMs: number): boolean {
    if (this.pingMs !== null) return false;
    this.pingMs = nowMs;
    return true;
  }

  /** The pong of the outstanding ping arrived at `nowMs`. */
  pong(nowMs: number): void {
    if (this.pingMs === null) return;
    this.rttMs = nowMs - this.pingMs;
    this.pingMs = null;
  }

  /** A new episode (OpenPI's episode_start / episode_end): the last chunk is not the robot's any more. */
  newEpisode(): void {
    this.last = null;
    this.noLast = 'a new episode started on this connection (episode_start / episode_end): no previous answer in it yet';
  }

  /**
   * An answer with robot actions `actions` ([horizon, actionDim] `shape`) was sent,
   * `totalMs` after its observation arrived, sampled as `kind` (plain, or the RTC mode it ran).
   */
  answered(actions: Float32Array, shape: readonly [number, number], totalMs: number, kind: 'plain' | RtcMode): void {
    this.last = { actions, shape };
    const t = this.totals[kind];
    t.push(totalMs);
    if (t.length > RECENT) t.shift();
  }

  /**
   * The plan for an observation with RTC keys `keys` (null when it sent none: plain, no report),
   * for a policy of `horizon` served actions whose checkpoint was trained with `rtcMaxDelay` (0 =
   * not). The delay: `rtc/delay`, else the setting, else ceil((rtt + the slowest of the last
   * answer times of this mode) x control rate), clamped to the overlap; before the first answer
   * of the mode, the plain answers' times (x GUIDED_COST for guided) stand in.
   */
  plan(keys: RtcKeys, horizon: number, rtcMaxDelay: number): RtcPlan | null {
    if (keys.controlHz !== null) this.settings.controlHz = keys.controlHz;
    if (keys.executed === null) return null;
    const s = this.settings;
    const mode = rtcMode(s.mode, rtcMaxDelay);
    const base = { executed: keys.executed, delay: 0, delaySource: 'measured' as const, overlap: 0, controlHz: s.controlHz, weights: [] as number[], schedule: s.schedule, maxGuidance: s.maxGuidance };
    if (mode === 'off') return { ...base, mode, reason: 'real-time chunking is off for this connection (rtc=off)' };
    if (!this.last) return { ...base, mode: 'off', reason: this.noLast };
    const overlap = Math.max(0, horizon - keys.executed);
    if (overlap === 0) return { ...base, mode: 'off', reason: `rtc/executed is ${keys.executed}: the previous chunk of ${horizon} actions is used up` };
    let delay: number;
    let delaySource: RtcPlan['delaySource'];
    if (keys.delay !== null) [delay, delaySource] = [keys.delay, 'client'];
    else if (s.delay !== null) [delay, delaySource] = [s.delay, 'setting'];
    else {
      if (s.controlHz === null) return { ...base, mode: 'off', reason: 'the control rate is unknown: send rtc/control_hz once (or rtc/delay), or connect with ?control_hz=' };
      const own = this.totals[mode];
      const stand = this.totals.plain.length > 0 ? this.totals.plain : [...this.totals.guided, ...this.totals.prefix];
      const serverMs = own.length > 0 ? Math.max(...own) : Math.max(0, ...stand) * (mode === 'guided' ? GUIDED_COST : 1);
      delay = Math.ceil((((this.rttMs ?? 0) + serverMs) * s.controlHz) / 1000);
      delaySource = 'measured';
    }
    delay = Math.min(delay, overlap);
    const weights = mode === 'guided' ? Array.from(rtcWeights(horizon, delay, overlap, s.schedule)) : Array.from({ length: horizon }, (_, i) => (i < delay ? 1 : 0));
    return { ...base, mode, previous: this.last.actions, previousShape: this.last.shape, delay, delaySource, overlap, weights };
  }
}
