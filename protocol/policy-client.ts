/**
 * A TypeScript client of Vela's policy websocket (OpenPI's protocol, PROTOCOL.md section 6), and
 * real-time chunking on top of it: `RealTimeChunking` runs an `ActionQueue` against a policy,
 * requesting the next chunk while the robot executes the current one and splicing the answer in
 * at the right index.
 *
 *   const policy = await PolicyConnection.open('ws://127.0.0.1:8000');
 *   const rtc = new RealTimeChunking(policy, { controlHz: 30, executeHorizon: 8, observe: () => robotObservation() });
 *   await rtc.run(300, (action) => action && robot.command(action)); // 10 s at 30 Hz
 *   policy.close();
 */
import WebSocket from 'ws';
import { ActionQueue, type Capture, type Splice } from './action-queue.ts';
import { NDArray, packNumpy, unpackNumpy } from './ndarray.ts';
import { VelaError } from './errors.ts';

/**
 * The answer's `server_timing.rtc`: what the server did with a request that sent `rtc/executed`.
 * With `mode` 'off' (a plain chunk: the connection's first request, rtc=off, ...) it holds only
 * `mode` and `reason`.
 */
export type RtcTiming =
  | { mode: 'off'; reason: string }
  | {
      mode: 'guided' | 'prefix';
      /** d: actions of the new chunk held to the old one (control ticks between capture and answer), at most `overlap`. */
      delay: number;
      delay_source: 'client' | 'setting' | 'measured';
      /** The request's `rtc/executed`, as the server read it. */
      executed: number;
      /** Rows of the old chunk that overlap the new one: action_horizon - executed. */
      overlap: number;
      /** The robot's control rate the server used, Hz (null when it was never told). */
      control_hz: number | null;
      /** Weight per row of the new chunk, [action_horizon], in [0, 1]: 1 = held to the old chunk. */
      weights: number[];
      /** Guided only: the weights' decay over the overlap, and β, the cap on the guidance weight. */
      schedule?: 'exp' | 'linear';
      max_guidance?: number;
    };

/** One answer of the policy. */
export interface PolicyAnswer {
  /** float32 [action_horizon, action_dim], robot units; row 0 = the action due at the observation's capture. */
  actions: NDArray;
  policy_timing: { infer_ms: number };
  server_timing: { infer_ms: number; prev_total_ms?: number; rtc?: RtcTiming };
  /** Present when the observation's state was far outside the policy's norm stats. */
  warnings?: string[];
}

/**
 * One connection to a policy: the metadata on connect, then `infer` per observation. Requests may
 * be sent without awaiting; answers come back in request order.
 */
export class PolicyConnection {
  /** The server's metadata (action_horizon, action_dim, cameras, state_dim, observation_keys, ...). */
  metadata: Record<string, any> = {};
  /** Close code and reason once the socket closed. */
  closed: { code: number; reason: string } | null = null;
  private waiting: { resolve: (a: PolicyAnswer) => void; reject: (e: Error) => void }[] = [];

  private constructor(private readonly ws: WebSocket) {}

  /**
   * Connects and waits for the metadata. `url` may carry per-connection settings as query
   * parameters (`?seed=7&rtc=guided&control_hz=30`).
   * @throws VelaError with the HTTP status as code when the upgrade is refused (401: the key),
   *   or `closed` when the socket closes before the metadata.
   */
  static open(url: string, opts: { apiKey?: string } = {}): Promise<PolicyConnection> {
    return new Promise((resolve, reject) => {
      const headers: Record<string, string> = opts.apiKey ? { authorization: `Bearer ${opts.apiKey}` } : {};
      const ws = new WebSocket(url, { headers, perMessageDeflate: false, maxPayload: 0 });
      const conn = new PolicyConnection(ws);
      let opened = false;
      // The refusal's body says why (`{"error": "rtc is \"maybe\"; expected ..."}`): pass it on.
      ws.on('unexpected-response', (_req, res) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => (body += chunk.slice(0, 4096 - body.length)));
        res.on('end', () => {
          let why = body.trim();
          try {
            why = String((JSON.parse(body) as { error?: unknown }).error ?? why);
          } catch {
            // not JSON: the text as it came
          }
          reject(new VelaError(String(res.statusCode), `policy connection refused: HTTP ${res.statusCode}${why ? `: ${why}` : ''}`));
        });
      });
      ws.on('error', (e) => !opened && reject(e));
      ws.on('message', (data: Buffer, binary: boolean) => {
        if (!opened) {
          opened = true;
          conn.metadata = unpackNumpy(data) as Record<string, any>;
          return resolve(conn);
        }
        const w = conn.waiting.shift();
        if (!w) return;
        // A text frame is the server's error, in words; the server then closes (1011).
        if (binary) w.resolve(unpackNumpy(data) as PolicyAnswer);
        else w.reject(new VelaError('policy', data.toString()));
      });
      ws.on('close', (code, reason) => {
        conn.closed = { code, reason: reason.toString() };
        const err = new VelaError('closed', `policy connection closed (${code}${reason.length ? `: ${reason}` : ''})`);
        for (const w of conn.waiting.splice(0)) w.reject(err);
        if (!opened) reject(err);
      });
    });
  }

  /**
   * Sends one observation (a map of the metadata's `observation_keys`, NDArray values, plus any
   * `rtc/*` keys; or bytes already packed, optionally zstd-compressed) and resolves with its answer.
   * @throws VelaError `policy` (the server's error text) or `closed`.
   */
  infer(observation: Record<string, unknown> | Uint8Array): Promise<PolicyAnswer> {
    if (this.closed) return Promise.reject(new VelaError('closed', `policy connection closed (${this.closed.code})`));
    const bytes = observation instanceof Uint8Array ? observation : packNumpy(observation);
    return new Promise((resolve, reject) => {
      this.waiting.push({ resolve, reject });
      this.ws.send(bytes, { binary: true });
    });
  }

  close(): Promise<void> {
    if (this.closed) return Promise.resolve();
    return new Promise((resolve) => {
      this.ws.once('close', () => resolve());
      this.ws.close(1000);
    });
  }
}

export interface RealTimeChunkingOptions {
  /** The robot's control rate, Hz: `run`'s tick rate, sent as `rtc/control_hz`. */
  controlHz: number;
  /** s: request the next chunk once this many actions of the current one have run (e.g. horizon / 2). */
  executeHorizon: number;
  /** The robot's observation now (cameras, state, prompt): called at each capture. */
  observe: () => Record<string, unknown>;
  /** Sent as `rtc/delay`: the client's own d in control ticks, overriding the server's estimate. */
  delay?: number;
  /** Called with each answer once it is spliced in (or, for the first, started). */
  onSplice?: (splice: Splice, answer: PolicyAnswer) => void;
}

/**
 * Real-time chunking over one policy connection: `tick()` once per control tick returns the action
 * due now and, when the queue says so, captures an observation and requests the next chunk with
 * `rtc/executed` and `rtc/control_hz`; the answer is spliced in when it arrives. One request is
 * out at a time, so the server's previous answer on the connection is always the chunk executed.
 */
export class RealTimeChunking {
  readonly queue: ActionQueue;
  /** The request's error, once one failed; `tick` throws it. */
  error: Error | null = null;
  private inFlight: Promise<void> | null = null;

  /** @throws RangeError on a control rate <= 0 or an executeHorizon outside 1..action_horizon. */
  constructor(readonly policy: PolicyConnection, readonly opts: RealTimeChunkingOptions) {
    const horizon = Number(policy.metadata.action_horizon);
    if (!(opts.controlHz > 0)) throw new RangeError(`RealTimeChunking: controlHz must be > 0; got ${opts.controlHz}`);
    if (opts.executeHorizon > horizon) throw new RangeError(`RealTimeChunking: executeHorizon ${opts.executeHorizon} is more than the policy's action_horizon ${horizon}`);
    this.queue = new ActionQueue({ actionDim: Number(policy.metadata.action_dim), executeHorizon: opts.executeHorizon });
  }

  /**
   * One control tick: requests the next chunk when due, then returns the action due now,
   * float32 [action_dim] robot units, or null when there is none (before the first answer, or an
   * answer later than the old chunk lasts: hold the robot).
   * @throws the error of a failed request (the connection is then closed by the server).
   */
  tick(): Float32Array | null {
    if (this.error) throw this.error;
    if (this.queue.needsRequest()) this.request(this.queue.capture());
    return this.queue.pop();
  }

  /**
   * Ticks `ticks` times at `controlHz` (sleeping to each tick's due time, without drift), calling
   * `step` with each tick's action (null: none due), then waits for the request still out.
   * Resolves with the counts; rejects with a failed request's error.
   */
  async run(ticks: number, step: (action: Float32Array | null, tick: number) => void | Promise<void>): Promise<{ ticks: number; executed: number; underruns: number }> {
    const periodMs = 1000 / this.opts.controlHz;
    const start = performance.now();
    const before = { executed: this.queue.executedTotal, underruns: this.queue.underruns };
    for (let t = 0; t < ticks; t++) {
      await step(this.tick(), t);
      const wait = start + (t + 1) * periodMs - performance.now();
      await new Promise((r) => setTimeout(r, Math.max(0, wait)));
    }
    await this.settled();
    return { ticks, executed: this.queue.executedTotal - before.executed, underruns: this.queue.underruns - before.underruns };
  }

  /** Resolves once no request is out (its answer spliced in); rejects with its error. */
  async settled(): Promise<void> {
    while (this.inFlight) await this.inFlight;
    if (this.error) throw this.error;
  }

  private request(capture: Capture): void {
    const obs: Record<string, unknown> = { ...this.opts.observe(), 'rtc/control_hz': this.opts.controlHz };
    if (capture.executed !== null) obs['rtc/executed'] = capture.executed;
    if (this.opts.delay !== undefined) obs['rtc/delay'] = this.opts.delay;
    const done = this.policy.infer(obs).then((answer) => {
      const a = answer.actions;
      if (!(a instanceof NDArray) || a.dtype !== '<f4' || a.shape.length !== 2 || a.shape[1] !== this.queue.actionDim) {
        throw new VelaError('policy', `the answer's actions are ${a instanceof NDArray ? `${a.dtype} [${a.shape.join(', ')}]` : typeof a}; expected float32 [action_horizon, ${this.queue.actionDim}]`);
      }
      const splice = this.queue.push(a.data as Float32Array, capture);
      this.opts.onSplice?.(splice, answer);
    });
    this.inFlight = done.then(
      () => void (this.inFlight = null),
      (e: Error) => void ((this.error = e), (this.inFlight = null)),
    );
  }
}
