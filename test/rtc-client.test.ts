/**
 * The TypeScript real-time chunking client (protocol/client.ts: RealTimeChunking over an
 * ActionQueue and a PolicyConnection) against a real `vela policy` process serving a small
 * flow0-tiny checkpoint (wasm): a robot loop at 10 Hz for several chunks (runs of 10 ticks until
 * enough answers are in). Every action the robot executed is the row of the chunk the splices
 * say (rebuilt from the answers and each splice's rtc/executed and k), every answer after the
 * first is an RTC chunk whose `server_timing.rtc` echoes what was sent, `rtc/delay` overrides
 * the server's estimate, and `?rtc=off` gives plain chunks that say so. Timing (delays,
 * underruns) is printed, never asserted.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { NormStatsSet } from '../kernels/normalize.ts';
import { ndarray } from '../protocol/ndarray.ts';
import { PolicyConnection, RealTimeChunking, type PolicyAnswer, type RtcTiming, type Splice } from '../protocol/client.ts';
import { startPolicyProc, tinyLoraCheckpoint, type PolicyProc } from './helpers/policy-proc.ts';

const HORIZON = 10;
const AD = 6;
const SD = 7;
const HZ = 10;
const STATS: NormStatsSet = {
  state: { mean: new Array(SD).fill(0), std: new Array(SD).fill(0.5), q01: new Array(SD).fill(-1.2), q99: new Array(SD).fill(1.2) },
  actions: { mean: new Array(AD).fill(0), std: new Array(AD).fill(0.5), q01: new Array(AD).fill(-1.2), q99: new Array(AD).fill(1.2) },
};

let dir = '';
let policy: PolicyProc;

beforeAll(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-rtc-client-'));
  const ck = path.join(dir, 'ck');
  await tinyLoraCheckpoint(ck, { cameras: ['cam_high'], action_dim: AD, action_horizon: HORIZON }, STATS);
  policy = await startPolicyProc([ck, '--seed', '3']);
}, 240_000);
afterAll(() => {
  policy?.proc.kill('SIGTERM');
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

/** A robot's observation at tick t: a 24x32 frame and a state that move with t. */
function observe(t: number): Record<string, unknown> {
  const frame = new Uint8Array(24 * 32 * 3).map((_, i) => (i * 7 + t * 13) % 256);
  const state = Float32Array.from({ length: SD }, (_, i) => 0.1 * Math.sin(0.3 * t + i));
  return { 'observation/cam_high': ndarray(frame, [24, 32, 3]), 'observation/state': ndarray(state, [SD]), prompt: 'pick up the bottle' };
}

interface Run {
  splices: { splice: Splice; answer: PolicyAnswer }[];
  executed: Float32Array[];
  counts: { ticks: number; executed: number; underruns: number };
  /** Calls of the robot's step (one per tick). */
  steps: number;
}

/**
 * Runs the robot loop in runs of 10 ticks until at least `minSplices` answers are in (a loaded
 * machine answers slower; the count of chunks is what the checks need, not the time).
 */
async function drive(minSplices: number, executeHorizon: number, opts: { delay?: number; query?: string } = {}): Promise<Run> {
  const conn = await PolicyConnection.open(policy.url + (opts.query ?? ''));
  expect(conn.metadata).toMatchObject({ action_horizon: HORIZON, action_dim: AD });
  const splices: Run['splices'] = [];
  const executed: Float32Array[] = [];
  let t = 0;
  const rtc = new RealTimeChunking(conn, { controlHz: HZ, executeHorizon, delay: opts.delay, observe: () => observe(t), onSplice: (splice, answer) => splices.push({ splice, answer }) });
  const counts = { ticks: 0, executed: 0, underruns: 0 };
  while (splices.length < minSplices) {
    const c = await rtc.run(10, (action) => {
      t++;
      if (action) executed.push(action.slice());
    });
    for (const k of ['ticks', 'executed', 'underruns'] as const) counts[k] += c[k];
  }
  await conn.close();
  return { splices, executed, counts, steps: t };
}

/**
 * The actions the robot must have executed: chunk i from row k_i until the capture of request
 * i + 1 (at its row executed_{i+1}) plus the k_{i+1} actions run while it was out.
 */
function expectedActions(run: Run): Float32Array[] {
  const out: Float32Array[] = [];
  run.splices.forEach(({ splice, answer }, i) => {
    const next = run.splices[i + 1]?.splice;
    const end = next ? next.executed! + next.skipped : HORIZON;
    const rows = answer.actions.data as Float32Array;
    for (let r = splice.skipped; r < end && out.length < run.executed.length; r++) out.push(rows.slice(r * AD, (r + 1) * AD));
  });
  return out;
}

/** The answer's `server_timing.rtc`, which must be an RTC chunk's (not 'off'). */
function rtcOf(answer: PolicyAnswer): Exclude<RtcTiming, { mode: 'off' }> {
  const rtc = answer.server_timing.rtc;
  if (!rtc || rtc.mode === 'off') throw new Error(`not an RTC chunk: server_timing ${JSON.stringify(answer.server_timing)}`);
  return rtc;
}

function report(label: string, run: Run): void {
  const rtc = run.splices.slice(1).map(({ splice, answer }) => `${splice.executed}/${splice.skipped}/d${answer.server_timing.rtc?.mode === 'off' ? '-' : answer.server_timing.rtc?.delay}`);
  process.stdout.write(`${label}: ${run.counts.executed} actions in ${run.counts.ticks} ticks at ${HZ} Hz, ${run.counts.underruns} underruns; splices (rtc/executed / k / server's d): ${rtc.join(' ')}; load ${fs.readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ')}\n`);
}

describe('RealTimeChunking against vela policy', () => {
  it('runs a robot loop over several chunks: RTC answers after the first, each action the row its splice says', async () => {
    const run = await drive(5, 5);
    report('server-measured delay', run);
    expect(run.counts.ticks).toBe(run.steps);
    expect(run.counts.ticks % 10).toBe(0);
    expect(run.counts.executed + run.counts.underruns).toBe(run.counts.ticks);
    expect(run.executed).toHaveLength(run.counts.executed);
    expect(run.splices.length).toBeGreaterThanOrEqual(5);
    // The first request sends no rtc/executed: a plain chunk, started at row 0.
    const [first, ...rest] = run.splices;
    expect(first!.splice).toEqual({ executed: null, skipped: 0, rowsLeft: HORIZON });
    expect(first!.answer.server_timing.rtc).toBeUndefined();
    for (const { splice, answer } of rest) {
      expect(splice.executed).toBeGreaterThanOrEqual(5); // asked once 5 actions of the chunk had run
      expect(splice.skipped).toBeGreaterThanOrEqual(0);
      const rtc = rtcOf(answer);
      expect(rtc).toMatchObject({ mode: 'guided', executed: splice.executed, control_hz: HZ, delay_source: 'measured' });
      expect(Number.isInteger(rtc.delay) && rtc.delay >= 0).toBe(true);
      expect(rtc.weights).toHaveLength(HORIZON);
      expect(answer.actions.shape).toEqual([HORIZON, AD]);
    }
    expect(run.executed).toEqual(expectedActions(run));
  });

  it('rtc/delay: the server holds the client\'s d', async () => {
    const run = await drive(3, 4, { delay: 2 });
    report('client delay 2', run);
        for (const { answer } of run.splices.slice(1)) {
      const rtc = rtcOf(answer);
      expect(rtc).toMatchObject({ mode: 'guided', delay: 2, delay_source: 'client' });
      // The first d rows are held to the old chunk: full weight.
      expect(rtc.weights.slice(0, 2)).toEqual([1, 1]);
    }
    expect(run.executed).toEqual(expectedActions(run));
  });

  it('a connection with ?rtc=off: plain chunks, each answer saying why, spliced in the same way', async () => {
    const run = await drive(3, 4, { query: '?rtc=off' });
    report('rtc=off', run);
        for (const { answer } of run.splices.slice(1)) {
      expect(answer.server_timing.rtc).toEqual({ mode: 'off', reason: 'real-time chunking is off for this connection (rtc=off)' });
    }
    expect(run.executed).toEqual(expectedActions(run));
  });
});
