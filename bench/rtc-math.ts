/**
 * The arithmetic of the RTC replay (bench/rtc.ts), kept free of models so that it can be tested
 * on hand-made chunks: how a simulated robot executes a sequence of chunks under a delay, with or
 * without temporal ensembling, and the splice metrics.
 *
 * Timing (every quantity in control steps): chunk c is asked for with the observation of step
 * T_c = c * s; its row i is the action due at step T_c + i. It arrives d steps later (at
 * T_c + d); until then the robot keeps executing chunk c - 1, whose row s + d - 1 is the last it
 * runs. Chunk 0 is there at step 0 (the robot waits for its first chunk before moving). So
 * s + d <= horizon is needed: the old chunk must last until the new one arrives.
 */

/** Executed actions and where chunks meet. */
export interface Execution {
  /** [length, ad] row-major: the action executed at each step. */
  actions: Float32Array;
  /** Steps t (>= 1) whose action came in differently from step t - 1's source (a new chunk began, or the ensemble's set of chunks changed). */
  splices: number[];
}

/**
 * Checks the timing of a replay.
 * @throws RangeError for s < 1, d < 0, s + d > horizon, or no chunk for a step of the episode.
 */
function checkTiming(chunks: readonly Float32Array[], s: number, d: number, horizon: number, ad: number, length: number): void {
  if (!(Number.isInteger(s) && s >= 1)) throw new RangeError(`s is ${s}; it must be an integer >= 1`);
  if (!(Number.isInteger(d) && d >= 0)) throw new RangeError(`d is ${d}; it must be an integer >= 0`);
  if (s + d > horizon) throw new RangeError(`s + d = ${s + d} exceeds the horizon ${horizon}: the old chunk runs out before the new one arrives`);
  if (chunks.length < Math.ceil(length / s)) throw new RangeError(`${chunks.length} chunks cover ${chunks.length * s} steps; the episode has ${length}`);
  for (const [c, ch] of chunks.entries()) if (ch.length !== horizon * ad) throw new RangeError(`chunk ${c} has ${ch.length} values; expected ${horizon} x ${ad}`);
}

/** The newest chunk that has arrived by step t (c with c * s + d <= t, or chunk 0). */
function currentChunk(t: number, s: number, d: number, count: number): number {
  return Math.min(count - 1, Math.max(0, Math.floor((t - d) / s)));
}

/**
 * Switching at once (mode a; also what RTC's chunks are executed with): at each step the newest
 * chunk that has arrived, at its row for that step. Chunk c's first executed row is d (the rows
 * before are already past when it arrives).
 * @param chunks [horizon, ad] each, in any units; chunk c observed at step c * s.
 * @param length steps to execute.
 * @throws RangeError as checkTiming.
 */
export function executeSwitching(chunks: readonly Float32Array[], s: number, d: number, horizon: number, ad: number, length: number): Execution {
  checkTiming(chunks, s, d, horizon, ad, length);
  const actions = new Float32Array(length * ad);
  const splices: number[] = [];
  let prev = -1;
  for (let t = 0; t < length; t++) {
    const c = currentChunk(t, s, d, chunks.length);
    const row = t - c * s;
    actions.set(chunks[c]!.subarray(row * ad, (row + 1) * ad), t * ad);
    if (prev >= 0 && c !== prev) splices.push(t);
    prev = c;
  }
  return { actions, splices };
}

/**
 * ACT's weights for n chunks' predictions of one step, oldest first: w_j = exp(-m j), normalised
 * to sum 1 (m > 0 favours the older chunks, as ACT does with m = 0.01).
 */
export function ensembleWeights(n: number, m: number): Float64Array {
  const w = Float64Array.from({ length: n }, (_, j) => Math.exp(-m * j));
  const sum = w.reduce((a, b) => a + b, 0);
  return w.map((x) => x / sum);
}

/**
 * Temporal ensembling (mode b, ACT): at each step the weighted mean (ensembleWeights, oldest
 * first) of every chunk that has arrived and still covers the step. A splice is a step whose set
 * of chunks differs from the previous step's (a chunk joined or ran out).
 * @throws RangeError as checkTiming, or for m not finite.
 */
export function executeEnsembling(chunks: readonly Float32Array[], s: number, d: number, horizon: number, ad: number, length: number, m: number): Execution {
  checkTiming(chunks, s, d, horizon, ad, length);
  if (!Number.isFinite(m)) throw new RangeError(`m is ${m}; it must be a finite number`);
  const actions = new Float32Array(length * ad);
  const splices: number[] = [];
  let prevKey = '';
  for (let t = 0; t < length; t++) {
    const newest = currentChunk(t, s, d, chunks.length);
    const live: number[] = [];
    for (let c = 0; c <= newest; c++) if (t - c * s < horizon) live.push(c);
    const w = ensembleWeights(live.length, m);
    for (let k = 0; k < ad; k++) {
      let v = 0;
      live.forEach((c, j) => (v += w[j]! * chunks[c]![(t - c * s) * ad + k]!));
      actions[t * ad + k] = v;
    }
    const key = live.join(',');
    if (t > 0 && key !== prevKey) splices.push(t);
    prevKey = key;
  }
  return { actions, splices };
}

/** ||a_t - a_{t-1}||_2 for each step t of `at` (t >= 1); actions [T, ad]. */
export function stepJumps(actions: Float32Array, ad: number, at: readonly number[]): number[] {
  return at.map((t) => {
    if (!(t >= 1 && (t + 1) * ad <= actions.length)) throw new RangeError(`step ${t} has no previous step among ${actions.length / ad}`);
    let s = 0;
    for (let k = 0; k < ad; k++) s += (actions[t * ad + k]! - actions[(t - 1) * ad + k]!) ** 2;
    return Math.sqrt(s);
  });
}

/** The mean of ||a_{t+1} - a_t||_2 over every step of the action sequences ([T_i, ad] each). */
export function meanStepChange(sequences: readonly Float32Array[], ad: number): number {
  let sum = 0;
  let n = 0;
  for (const a of sequences) {
    const T = a.length / ad;
    const j = stepJumps(a, ad, Array.from({ length: Math.max(0, T - 1) }, (_, i) => i + 1));
    sum += j.reduce((x, y) => x + y, 0);
    n += j.length;
  }
  return n > 0 ? sum / n : NaN;
}

/** Mean squared difference of two equal-length arrays. @throws RangeError for other lengths. */
export function mse(a: Float32Array, b: Float32Array): number {
  if (a.length !== b.length) throw new RangeError(`lengths differ: ${a.length} and ${b.length}`);
  let s = 0;
  for (let i = 0; i < a.length; i++) s += (a[i]! - b[i]!) ** 2;
  return s / a.length;
}

/** Mean of a list (NaN for none). */
export function mean(xs: readonly number[]): number {
  return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : NaN;
}

/**
 * The closed-state replay's proprioception (bench/rtc.ts `--loop state`): a robot that reaches
 * the joint positions it was commanded. The state reported at step T is the recorded state of
 * step T moved by how far the executed action of step T - 1 differed from the recorded one, on
 * each state dim that an action dim commands; other state dims stay as recorded.
 * @param recordedState [stateDim] the dataset's state at step T (robot units).
 * @param executed [actionDim] the action the simulated robot executed at step T - 1.
 * @param recordedAction [actionDim] the dataset's action at step T - 1.
 * @param pairs [actionIndex, stateIndex] pairs (the dataset's action/state name pairs).
 * @returns a new [stateDim] array.
 * @throws RangeError for executed and recorded actions of different lengths or a pair outside the arrays.
 */
export function closedLoopState(recordedState: Float32Array, executed: Float32Array, recordedAction: Float32Array, pairs: readonly (readonly [number, number])[]): Float32Array {
  if (executed.length !== recordedAction.length) throw new RangeError(`executed action has ${executed.length} dims, the recorded one ${recordedAction.length}`);
  const out = Float32Array.from(recordedState);
  for (const [a, s] of pairs) {
    if (!(a >= 0 && a < executed.length && s >= 0 && s < out.length)) throw new RangeError(`pair [${a}, ${s}] is outside ${executed.length} action and ${out.length} state dims`);
    out[s] = recordedState[s]! + (executed[a]! - recordedAction[a]!);
  }
  return out;
}
