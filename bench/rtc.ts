/**
 * Real-time chunking replay on held-out G1 episodes (issue 26).
 *
 *   npx tsx bench/rtc.ts [--quick] [--loop open|state] [--s 8] [--delays 0,1,2,4,6,8] [--beta 5] [--m 0.01]
 *
 * Trains (once; cached under .scratch/rtc/) two flow0-tiny policies on split A of
 * ../shared/datasets/g1_pick_bottle (bench/rtc-train.ts): P, the job's recipe, and R, the same
 * recipe with training-time RTC (rtcMaxDelay 8). Then replays the held-out episodes 4, 7, 12 as a
 * simulated robot at 30 Hz, open loop: chunk c is asked for with the recorded observation (camera
 * + state) of step c * s and arrives d steps later, the robot executing the old chunk meanwhile
 * (bench/rtc-math.ts has the timing). `--loop state` closes the loop on proprioception: the state
 * observed at step T is the recorded one plus the executed-minus-recorded action of step T - 1 on
 * the state dims the action dims command (same names; G1: all 26 joints), a robot that reaches its
 * commanded positions; the camera frames stay the recorded ones. Each mode and d then has its own
 * states, hence its own chunks (one datum each in the request's batch, the same noise).
 * Modes, every one with the same noise per request:
 *   switch     P's plain chunk, switched to at once (from its row d);
 *   ensemble   P's plain chunks, ACT's temporal ensembling (weights exp(-m j), oldest first);
 *   guided     P, guided RTC: the old chunk (shifted by s = the executed count, in model space
 *              relative to the new observation's state) as the target, rtcWeights over the
 *              overlap H - s, the true d, cap β;
 *   trained    R, prefix mode: the old chunk's first d rows written, the true d;
 *   switch R   R's plain chunks switched to at once (a reference for R's own accuracy).
 * Metrics per mode and d, in the normalised absolute-action space the job scores in (z-score
 * with the training chunks' absolute statistics): the mean splice jump ||a_t - a_{t-1}|| over
 * steps where a chunk begins (ensembling: where its set of chunks changes), also over the
 * recorded data's own mean step-to-step change; the MSE of the executed actions to the recorded
 * ones; and batch-1 inference times (graphs on, as served), the kinds in turns.
 * Writes bench/results/rtc.json and rtc-traces.svg (--loop state: rtc-state.json and
 * rtc-state-traces.svg), and prints the table (bench/results/README.md
 * holds the one of the last full run). --quick: 40 training steps (its own cache), one episode's
 * first 120 steps, d in 0,4,8, a few timing rounds; writes nothing.
 */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { initBackend } from '../kernels/backend/backend.ts';
import { Rng } from '../kernels/rng.ts';
import { rtcWeights, shiftChunk, type ChunkPrefix, type RtcSchedule } from '../kernels/rtc.ts';
import type { TrainingState } from '../kernels/trainer.ts';
import { makeDatum, openDataset, pairsFor, type Dataset } from '../server/datasets/index.ts';
import { toModelActions, toRobotActions } from '../server/policy/observation.ts';
import type { PolicyMeta } from '../server/policy/meta.ts';
import { toBatch } from '../server/jobs/datums.ts';
import { G1, HELD_OUT } from './recipe-split.ts';
import { closedLoopState, executeEnsembling, executeSwitching, mean, meanStepChange, mse, stepJumps, type Execution } from './rtc-math.ts';
import { g1Setup, readLoad, recipeKey, RTC_CACHE, RTC_STEPS, rtcRecipes, trainedPolicy, type TrainedMeta } from './rtc-train.ts';
import { tracesSvg } from './svg.ts';

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const RESULTS = path.join(REPO, 'bench/results');
const say = (l: string) => process.stderr.write(`[rtc ${new Date().toISOString().slice(11, 19)}] ${l}\n`);

const USAGE = `Usage: npx tsx bench/rtc.ts [--quick] [--loop open|state] [--s N] [--delays LIST] [--beta X] [--schedule exp|linear] [--m X] [--steps N] [--timing-rounds N]

Replays the held-out G1 episodes ${HELD_OUT.join(', ')} as a robot at 30 Hz that asks for a chunk every s
steps and gets it d steps later: switching at once, temporal ensembling, guided RTC (policy P) and
trained RTC (policy R, rtc_max_delay 8). Trains P and R first (flow0-tiny, --steps each, ~7 min
each on 2 cores) unless .scratch/rtc/ has them. Needs ../shared/datasets/g1_pick_bottle.
  --loop L           open (default): every request observes the recorded state; state: the state follows
                     the executed actions (recorded state + executed - recorded action of the step before,
                     on the joints the actions command), camera frames still the recorded ones
  --s N              actions of a chunk executed before asking for the next (default 8 = horizon / 2)
  --delays LIST      delays d in control steps (default 0,1,2,3,4,5,6,7,8; s + d <= 16)
  --beta X           guided RTC's guidance cap (default 5)
  --schedule S       guided weights over the overlap: exp (default) or linear
  --m X              temporal ensembling's exp(-m j) weights, oldest first (default 0.01, ACT's)
  --steps N          training steps per policy (default 1500, the job's recipe; batch 32)
  --timing-rounds N  batch-1 inference timing rounds, each kind once per round (default 30)
  --name NAME        results as bench/results/NAME.json and NAME-traces.svg (default rtc; rtc-state for --loop state)
  --quick            smoke run: 40 training steps, one episode's first 120 steps, d 0,4,8; writes nothing
`;

/** open: every request observes the recorded state; state: the state follows what was executed (closedLoopState). */
type Loop = 'open' | 'state';

type Mode = 'switch' | 'ensemble' | 'guided' | 'trained' | 'switch_r';
const MODES: Mode[] = ['switch', 'ensemble', 'guided', 'trained', 'switch_r'];
const MODE_LABEL: Record<Mode, string> = { switch: 'switch at once (P)', ensemble: 'temporal ensembling (P)', guided: 'guided RTC (P)', trained: 'trained RTC (R, prefix)', switch_r: 'switch at once (R)' };

interface Row {
  mode: Mode;
  d: number;
  splices: number;
  jump_mean: number; // normalised units
  jump_ratio: number; // jump_mean / the recorded data's mean step change
  jump_vs_switch: number; // jump_mean / switch's at the same d
  /** The mean step change at every other step (within chunks): how smooth the chunks are themselves, over the data's step change. */
  within_ratio: number;
  /** The mean over steps of ||executed - recorded|| (normalised): drift shows as a rise over switching's. */
  offset_mean: number;
  mse: number; // executed vs recorded, normalised absolute actions
  mse_vs_switch: number;
}

interface Options { name: string; loop: Loop; s: number; delays: number[]; beta: number; schedule: RtcSchedule; m: number; steps: number; timingRounds: number; quick: boolean }

function parse(argv: string[]): Options | null {
  const { values } = parseArgs({ args: argv, options: {
    help: { type: 'boolean' }, quick: { type: 'boolean', default: false }, s: { type: 'string', default: '8' }, delays: { type: 'string' }, beta: { type: 'string', default: '5' },
    schedule: { type: 'string', default: 'exp' }, m: { type: 'string', default: '0.01' }, steps: { type: 'string' }, 'timing-rounds': { type: 'string' }, name: { type: 'string' }, loop: { type: 'string', default: 'open' },
  } });
  if (values.help) return null;
  const quick = values.quick!;
  const num = (name: string, v: string) => {
    const x = Number(v);
    if (!Number.isFinite(x)) throw new Error(`--${name} is ${JSON.stringify(v)}; expected a number`);
    return x;
  };
  const schedule = values.schedule as RtcSchedule;
  if (schedule !== 'exp' && schedule !== 'linear') throw new Error(`--schedule is ${schedule}; expected exp or linear`);
  const loop = values.loop as Loop;
  if (loop !== 'open' && loop !== 'state') throw new Error(`--loop is ${loop}; expected open or state`);
  return {
    name: values.name ?? (loop === 'state' ? 'rtc-state' : 'rtc'), loop, s: num('s', values.s!), delays: (values.delays ?? (quick ? '0,4,8' : '0,1,2,3,4,5,6,7,8')).split(',').map((x) => num('delays', x)), beta: num('beta', values.beta!), schedule, m: num('m', values.m!),
    steps: num('steps', values.steps ?? (quick ? '40' : String(RTC_STEPS))), timingRounds: num('timing-rounds', values['timing-rounds'] ?? (quick ? '3' : '30')), quick,
  };
}

/**
 * Robot units <-> the model's space for one observation, by the policy server's own conversions
 * (server/policy/observation.ts toRobotActions / toModelActions): delta dims relative to the raw
 * state, normalised, padded. toModel's rows from `valid` on are zero (past the overlap: weight 0).
 */
function spaces(setup: ReturnType<typeof g1Setup>, ds: Dataset) {
  const H = setup.model.horizon;
  const A = setup.model.actionDim; // the model's padded action dim
  const ad = ds.meta.actionDim;
  const pairs = pairsFor(ds.meta, setup.actionSpace);
  // The server's delta mask pairs action dim k with state dim k.
  if (pairs.some(([a, st]) => a !== st)) throw new Error(`the dataset pairs delta action dims with other state dims (${JSON.stringify(pairs)}); the policy server's conversion assumes the same index`);
  const deltaMask = Array.from({ length: ad }, (_, k) => pairs.some(([a]) => a === k));
  const meta = { model: { horizon: H, actionDim: A }, actionHorizon: H, actionDim: ad, deltaMask, norm: { normalizer: setup.normalizer, stats: { actions: setup.norm.actions } } } as unknown as PolicyMeta;
  return {
    /** model rows [H, A] normalised -> robot [H, ad]. */
    toRobot: (row: Float32Array, rawState: Float32Array): Float32Array => toRobotActions(row, meta, rawState),
    /** robot [H, ad] -> model rows [H, A] relative to `rawState`. */
    toModel(robot: Float32Array, rawState: Float32Array, valid: number): Float32Array {
      return toModelActions(robot, meta, rawState).fill(0, valid * A);
    },
  };
}

/** `x` repeated k times (one noise stream for every datum of a batch). */
const repeat = (x: Float32Array, k: number) => {
  const out = new Float32Array(x.length * k);
  for (let i = 0; i < k; i++) out.set(x, i * x.length);
  return out;
};

/** How a mode's chunks are executed: ACT's ensembling for `ensemble`, else switching at once. */
function executeMode(mode: Mode, chunks: readonly Float32Array[], s: number, d: number, H: number, ad: number, length: number, m: number): Execution {
  return mode === 'ensemble' ? executeEnsembling(chunks, s, d, H, ad, length, m) : executeSwitching(chunks, s, d, H, ad, length);
}

/** The modes that sample P's or R's plain chunks (their own trajectories only in the closed-state loop). */
const PLAIN: Record<'P' | 'R', Mode[]> = { P: ['switch', 'ensemble'], R: ['switch_r'] };

/**
 * Every mode's chunks (robot units) for one episode: chunks[mode][d index][c]. Open loop: each
 * request sees the recorded state, so the plain chunks are one per request, shared by every d
 * (and by switching and ensembling). Closed state (`--loop state`): each mode and d has its own
 * state trajectory (closedLoopState: the recorded state plus the executed-minus-recorded action of
 * the step before, on the paired dims), so every (mode, d) is its own datum in the request's
 * batch; the camera frame stays the recorded one. The noise is one stream per request, the same
 * for every mode and d, in both loops.
 */
async function episodeChunks(ds: Dataset, e: number, length: number, setup: ReturnType<typeof g1Setup>, P: TrainingState, R: TrainingState, o: Options): Promise<Record<Mode, Float32Array[][]>> {
  const { model } = setup;
  const H = model.horizon;
  const A = model.actionDim;
  const ad = ds.meta.actionDim;
  const sd = ds.meta.stateDim;
  const sp = spaces(setup, ds);
  const D = o.delays.length;
  const overlap = H - o.s;
  const table = ds.table(e);
  const n = Math.ceil(length / o.s);
  const closed = o.loop === 'state';
  // Every action dim commands the state dim of its name (G1: all 26, the same order).
  const statePairs = pairsFor(ds.meta, 'delta');
  const chunks = Object.fromEntries(MODES.map((m) => [m, o.delays.map(() => [] as Float32Array[])])) as Record<Mode, Float32Array[][]>;
  // Guided weights per d over the dataset's dims (0 on the padding); prefix: 1 on the first d rows, every dim.
  const gw = repeatRows(o.delays.map((d) => rtcWeights(H, d, overlap, o.schedule)), H, A, ad);
  const pw = repeatRows(o.delays.map((d) => Float32Array.from({ length: H }, (_, i) => (i < d ? 1 : 0))), H, A, A);
  for (let c = 0; c < n; c++) {
    const T = c * o.s;
    const datum = await makeDatum(ds, e, T, setup.datumOpts);
    const rec = table.state.subarray(T * sd, (T + 1) * sd);
    // The state each (mode, d) reports at step T: the recorded one in the open loop and before
    // anything was executed (c = 0: every mode's first chunk is the plain one).
    const stateOf = (mode: Mode, k: number): Float32Array => {
      if (!closed || c === 0) return rec;
      const x = executeMode(mode, chunks[mode][k]!, o.s, o.delays[k]!, H, ad, T, o.m).actions;
      return closedLoopState(rec, x.subarray((T - 1) * ad, T * ad), table.action.subarray((T - 1) * ad, T * ad), statePairs);
    };
    const states = Object.fromEntries(MODES.map((m) => [m, o.delays.map((_, k) => stateOf(m, k))])) as Record<Mode, Float32Array[]>;
    const batchOf = (xs: Float32Array[]) => toBatch(model, xs.map((state) => ({ ...datum, state })), setup.cameras, setup.norm, setup.normalizer, ad);
    // One noise per request, the same for every mode and d.
    const noise = new Rng(1_000_003 * e + c).normals(H * A);
    const rows = (out: Float32Array, i: number) => out.subarray(i * H * A, (i + 1) * H * A);
    if (!closed || c === 0) {
      // Every plain mode and d sees the recorded state: one chunk per policy and request, shared.
      const p = sp.toRobot(P.sample(batchOf([rec]), { noise }), rec);
      const r = sp.toRobot(R.sample(batchOf([rec]), { noise }), rec);
      for (const k of o.delays.keys()) {
        for (const m of PLAIN.P) chunks[m][k]!.push(p);
        for (const m of PLAIN.R) chunks[m][k]!.push(r);
        if (c === 0) {
          // Nothing to continue yet: the first chunk is the plain one in every mode.
          chunks.guided[k]!.push(p);
          chunks.trained[k]!.push(r);
        }
      }
    } else {
      for (const [policy, modes] of [[P, PLAIN.P], [R, PLAIN.R]] as const) {
        const xs = modes.flatMap((m) => states[m]);
        const out = policy.sample(batchOf(xs), { noise: repeat(noise, xs.length) });
        modes.forEach((m, j) => o.delays.forEach((_, k) => chunks[m][k]!.push(sp.toRobot(rows(out, j * D + k), states[m][k]!))));
      }
    }
    if (c === 0) continue;
    // The old chunk in the model's space relative to the state this request reports, shifted by the executed count s.
    const prevOf = (mode: Mode) => {
      const out = new Float32Array(D * H * A);
      for (let k = 0; k < D; k++) out.set(sp.toModel(shiftChunk(chunks[mode][k]![c - 1]!, H, o.s), states[mode][k]!, overlap), k * H * A);
      return out;
    };
    const g: ChunkPrefix = { mode: 'guided', actions: prevOf('guided'), weights: gw, maxGuidance: o.beta };
    const gOut = P.sample(batchOf(states.guided), { noise: repeat(noise, D), chunk: g });
    const t: ChunkPrefix = { mode: 'prefix', actions: prevOf('trained'), weights: pw };
    const tOut = R.sample(batchOf(states.trained), { noise: repeat(noise, D), chunk: t });
    for (let k = 0; k < D; k++) {
      chunks.guided[k]!.push(sp.toRobot(rows(gOut, k), states.guided[k]!));
      chunks.trained[k]!.push(sp.toRobot(rows(tOut, k), states.trained[k]!));
    }
  }
  return chunks;
}

/** Per-row weights [k][H] -> [k, H, A] with the first `dims` dims of each row set. */
function repeatRows(rows: Float32Array[], H: number, A: number, dims: number): Float32Array {
  const out = new Float32Array(rows.length * H * A);
  rows.forEach((w, k) => {
    for (let i = 0; i < H; i++) out.fill(w[i]!, (k * H + i) * A, (k * H + i) * A + dims);
  });
  return out;
}

/** Batch-1 inference times (ms), the kinds in turns, after warm-up rounds (graph tracing). */
async function timeInference(ds: Dataset, setup: ReturnType<typeof g1Setup>, P: TrainingState, R: TrainingState, o: Options) {
  const { model } = setup;
  const H = model.horizon;
  const A = model.actionDim;
  const ad = ds.meta.actionDim;
  const d = 4;
  const e = HELD_OUT[0]!;
  const batches = await Promise.all([0, 40, 80, 120].map(async (T) => toBatch(model, [await makeDatum(ds, e, T, setup.datumOpts)], setup.cameras, setup.norm, setup.normalizer, ad)));
  const prev = new Rng(7).normals(H * A).map((x) => x * 0.5);
  const gw = repeatRows([rtcWeights(H, d, H - o.s, o.schedule)], H, A, ad);
  const pw = repeatRows([Float32Array.from({ length: H }, (_, i) => (i < d ? 1 : 0))], H, A, A);
  const kinds: [string, (b: ReturnType<typeof toBatch>, noise: Float32Array) => unknown][] = [
    ['plain_p', (b, noise) => P.sample(b, { noise })],
    ['guided_p', (b, noise) => P.sample(b, { noise, chunk: { mode: 'guided', actions: prev, weights: gw, maxGuidance: o.beta } })],
    ['plain_r', (b, noise) => R.sample(b, { noise })],
    ['prefix_r', (b, noise) => R.sample(b, { noise, chunk: { mode: 'prefix', actions: prev, weights: pw } })],
  ];
  const ms: Record<string, number[]> = Object.fromEntries(kinds.map(([k]) => [k, []]));
  const warm = 3;
  for (let round = 0; round < warm + o.timingRounds; round++) {
    // Rotate the order each round: no kind always follows the same one.
    for (let j = 0; j < kinds.length; j++) {
      const [name, run] = kinds[(round + j) % kinds.length]!;
      const noise = new Rng(round * 31 + j).normals(H * A);
      const t0 = performance.now();
      run(batches[round % batches.length]!, noise);
      if (round >= warm) ms[name]!.push(performance.now() - t0);
    }
  }
  const med = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
  const summary = Object.fromEntries(Object.entries(ms).map(([k, xs]) => [k, { median_ms: med(xs), mean_ms: mean(xs), n: xs.length }]));
  return { summary, guided_over_plain: summary.guided_p!.median_ms / summary.plain_p!.median_ms, prefix_over_plain: summary.prefix_r!.median_ms / summary.plain_r!.median_ms, samples_ms: ms, d };
}

async function main(o: Options): Promise<void> {
  const load0 = readLoad();
  await initBackend(process.env.VELA_BACKEND ?? 'auto', say);
  const ds = await openDataset(G1);
  const recipes = rtcRecipes(o.steps);
  const base = recipes[0];
  const policies: { state: TrainingState; meta: TrainedMeta }[] = [];
  for (const r of recipes) policies.push(await trainedPolicy(ds, r, path.join(RTC_CACHE, recipeKey(r)), say));
  const [P, R] = policies.map((p) => p.state) as [TrainingState, TrainingState];
  const setup = g1Setup(ds, base.preset);
  const H = setup.model.horizon;
  for (const d of o.delays) if (!(Number.isInteger(d) && d >= 0 && o.s + d <= H)) throw new Error(`--delays has ${d}; with s = ${o.s} each d must be an integer in 0..${H - o.s}`);
  const ad = ds.meta.actionDim;
  const normAbs = (x: Float32Array) => setup.normalizer.normalize(x, ad, setup.absStats);
  const episodes = o.quick ? [HELD_OUT[0]!] : HELD_OUT;
  const recorded = new Map<number, Float32Array>();
  for (const e of episodes) {
    const L = o.quick ? Math.min(120, ds.episode(e).length) : ds.episode(e).length;
    recorded.set(e, ds.table(e).action.slice(0, L * ad));
  }
  const stepChange = meanStepChange([...recorded.values()].map(normAbs), ad);
  say(`recorded data: mean step change ${stepChange.toFixed(4)} (normalised absolute actions), ${[...recorded.values()].reduce((s, a) => s + a.length / ad, 0)} steps in episodes ${episodes.join(', ')}`);

  const exec = new Map<string, Execution[]>(); // `${mode}/${d}` -> per episode
  const put = (mode: Mode, d: number, x: Execution) => exec.set(`${mode}/${d}`, [...(exec.get(`${mode}/${d}`) ?? []), x]);
  const t0 = performance.now();
  for (const e of episodes) {
    const L = recorded.get(e)!.length / ad;
    say(`episode ${e}: ${L} steps, ${Math.ceil(L / o.s)} requests, d in ${o.delays.join(',')}, ${o.loop === 'state' ? 'closed state' : 'open loop'}`);
    const ch = await episodeChunks(ds, e, L, setup, P, R, o);
    o.delays.forEach((d, k) => {
      for (const mode of MODES) put(mode, d, executeMode(mode, ch[mode][k]!, o.s, d, H, ad, L, o.m));
    });
  }
  const replayS = (performance.now() - t0) / 1000;
  const rows: Row[] = [];
  for (const d of o.delays) {
    const stats = (mode: Mode) => {
      const xs = exec.get(`${mode}/${d}`)!;
      const jumps = xs.flatMap((x) => stepJumps(normAbs(x.actions), ad, x.splices));
      const executed = xs.map((x) => normAbs(x.actions));
      const flat = (xs: Float32Array[]) => Float32Array.from(xs.flatMap((x) => Array.from(x)));
      const err = mse(flat(executed), flat(episodes.map((e) => normAbs(recorded.get(e)!))));
      const within = xs.flatMap((x, i) => {
        const at = new Set(x.splices);
        return stepJumps(executed[i]!, ad, Array.from({ length: executed[i]!.length / ad - 1 }, (_, t) => t + 1).filter((t) => !at.has(t)));
      });
      const offsets = xs.flatMap((x, i) => {
        const rec = normAbs(recorded.get(episodes[i]!)!);
        return Array.from({ length: rec.length / ad }, (_, t) => Math.hypot(...Array.from({ length: ad }, (_, k) => executed[i]![t * ad + k]! - rec[t * ad + k]!)));
      });
      return { splices: jumps.length, jump: mean(jumps), err, within: mean(within), offset: mean(offsets) };
    };
    const sw = stats('switch');
    for (const mode of MODES) {
      const st = mode === 'switch' ? sw : stats(mode);
      rows.push({ mode, d, splices: st.splices, jump_mean: st.jump, jump_ratio: st.jump / stepChange, jump_vs_switch: st.jump / sw.jump, mse: st.err, mse_vs_switch: st.err / sw.err, within_ratio: st.within / stepChange, offset_mean: st.offset });
    }
  }
  say('timing: batch-1 inference, graphs on, kinds in turns');
  const timing = await timeInference(ds, setup, P, R, o);
  const load1 = readLoad();
  const table = markdownTable(rows, o.delays);
  process.stdout.write(`${table}\n${timingLine(timing)}\n`);
  const checks = [4, 8].filter((d) => o.delays.includes(d)).flatMap((d) => (['guided', 'trained'] as const).map((mode) => {
    const r = rows.find((x) => x.mode === mode && x.d === d)!;
    return { mode, d, jump_vs_switch: r.jump_vs_switch, mse_vs_switch: r.mse_vs_switch, met: r.jump_vs_switch <= 0.5 && r.mse_vs_switch <= 1.05 };
  }));
  for (const c of checks) process.stdout.write(`target d=${c.d} ${c.mode}: jump ${c.jump_vs_switch.toFixed(2)}x switch (<= 0.5), MSE ${c.mse_vs_switch.toFixed(3)}x (<= 1.05): ${c.met ? 'met' : 'NOT met'}\n`);
  if (o.quick) return void say('--quick: nothing written');

  const traceD = o.delays.includes(8) ? 8 : o.delays.at(-1)!;
  const te = episodes[0]!;
  const rec = recorded.get(te)!;
  const L = rec.length / ad;
  // The 3 joints that move most in this episode (the largest spread of the recorded action).
  const spread = Array.from({ length: ad }, (_, k) => {
    const xs = Array.from({ length: L }, (_, t) => rec[t * ad + k]!);
    return Math.max(...xs) - Math.min(...xs);
  });
  const joints = spread.map((s, k) => [s, k] as const).sort((a, b) => b[0] - a[0]).slice(0, 3).map(([, k]) => k);
  const col = (x: Float32Array, k: number) => Array.from({ length: L }, (_, t) => x[t * ad + k]!);
  const traceModes: Mode[] = ['switch', 'ensemble', 'guided', 'trained'];
  const svg = tracesSvg(`G1 episode ${te} (held out), ${o.loop === 'state' ? 'closed state' : 'open loop'}, d = ${traceD}, s = ${o.s}: executed actions at 30 Hz vs recorded${traceD + o.s >= H ? ' (ensembling = switching here, drawn under it)' : ''}`, joints.map((k) => ({
    label: ds.meta.actionNames?.[k] ?? `action ${k}`,
    series: [{ label: 'recorded', values: col(rec, k) }, ...traceModes.map((m) => ({ label: MODE_LABEL[m], values: col(exec.get(`${m}/${traceD}`)![0]!.actions, k) }))],
  })), exec.get(`switch/${traceD}`)![0]!.splices, 'dataset units');
  fs.mkdirSync(RESULTS, { recursive: true });
  fs.writeFileSync(path.join(RESULTS, `${o.name}-traces.svg`), svg);
  const out = {
    name: o.name, date: new Date().toISOString(), loadavg_start: load0, loadavg_end: load1, replay_s: replayS,
    setup: {
      dataset: 'g1_pick_bottle (split A)', held_out: episodes, loop: o.loop,
      observation: o.loop === 'state'
        ? 'recorded camera frame; state = recorded state + (executed - recorded action of the step before) on the state dims named like action dims (all 26), per mode and d'
        : 'recorded camera frame and state', preset: base.preset, horizon: H, control_hz: ds.meta.fps, s: o.s, delays: o.delays, beta: o.beta, schedule: o.schedule, ensemble_m: o.m,
      noise: 'one seeded N(0,1) stream per request (episode, c), the same for every mode and d', sample_steps: 10, metric_space: 'absolute actions, z-score with the training chunks\' absolute statistics (the job\'s held-out scoring space)',
      recorded_mean_step_change: stepChange,
    },
    policies: { P: policies[0]!.meta, R: policies[1]!.meta },
    rows, checks, timing: { ...timing, samples_ms: undefined },
    traces: { episode: te, d: traceD, joints: joints.map((k) => ds.meta.actionNames?.[k] ?? k) },
  };
  fs.writeFileSync(path.join(RESULTS, `${o.name}.json`), JSON.stringify(out, null, 1) + '\n');
  say(`wrote ${path.join(RESULTS, `${o.name}.json`)} and ${o.name}-traces.svg`);
}


/** The replay table: one row per d, per mode the splice jump (over the data's step change) and the MSE. */
export function markdownTable(rows: Row[], delays: number[]): string {
  const modes = MODES;
  const head = ['d', ...modes.flatMap((m) => [`${MODE_LABEL[m]}: splice jump / data step`, 'other steps / data step', 'MSE'])];
  const lines = delays.map((d) => [String(d), ...modes.flatMap((m) => {
    const r = rows.find((x) => x.mode === m && x.d === d)!;
    const rel = m === 'switch' ? '' : ` (${r.jump_vs_switch.toFixed(2)}x)`;
    const relM = m === 'switch' ? '' : ` (${r.mse_vs_switch.toFixed(2)}x)`;
    return [`${r.jump_ratio.toFixed(2)}${rel}`, `${r.within_ratio.toFixed(2)}`, `${r.mse.toFixed(4)}${relM}`];
  })]);
  return [`| ${head.join(' | ')} |`, `| ${head.map(() => '-').join(' | ')} |`, ...lines.map((l) => `| ${l.join(' | ')} |`)].join('\n') + '\n';
}

function timingLine(t: Awaited<ReturnType<typeof timeInference>>): string {
  const s = t.summary;
  return `inference, batch 1, graphs on (median ms): plain P ${s.plain_p!.median_ms.toFixed(1)}, guided P ${s.guided_p!.median_ms.toFixed(1)} (${((t.guided_over_plain - 1) * 100).toFixed(0)}% more), plain R ${s.plain_r!.median_ms.toFixed(1)}, prefix R ${s.prefix_r!.median_ms.toFixed(1)} (${((t.prefix_over_plain - 1) * 100).toFixed(0)}% more)`;
}

let opts: Options | null;
try {
  opts = parse(process.argv.slice(2));
} catch (e) {
  process.stderr.write(`rtc: ${(e as Error).message}\n\n${USAGE}`);
  process.exit(2);
}
if (!opts) {
  process.stdout.write(USAGE);
  process.exit(0);
}
if (!fs.existsSync(G1)) {
  process.stderr.write(`rtc: the replay needs the G1 dataset (LeRobot v2.1, 15 episodes) at ${G1}, the project's ../shared/datasets/g1_pick_bottle beside the clone; it is not in a clone from a git host\n`);
  process.exit(2);
}
main(opts).then(
  () => process.exit(0),
  (e) => {
    process.stderr.write(`rtc: ${(e as Error).stack ?? e}\n`);
    process.exit(1);
  },
);
