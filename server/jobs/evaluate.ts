/**
 * Held-out evaluation of a fine-tune (issue 16): does the policy beat the trivial answers on
 * episodes it never saw? On every `stride`-th frame of each held-out episode, a 16-step chunk is
 * sampled (10 Euler steps, seeded) and scored against the recorded actions, next to two
 * baselines: holding the current state, and the training set's mean chunk. Scores are MSEs over
 * the valid (not padded) entries, in the normalised absolute-action space (the preset's
 * normaliser with the training chunk entries' absolute statistics: one scale whatever the
 * training action space) and in raw units, overall and per action group.
 */
import type { Normalizer, NormStats, NormStatsSet } from '../../kernels/normalize.ts';
import { batchBuffers } from '../../kernels/small/batch.ts';
import { makeDatum, type ActionGroup, type Dataset, type TrainingDatum } from '../datasets/index.ts';
import { toBatch, type JobLayout } from './datums.ts';

/** Euler steps of each sampled chunk. */
export const EVAL_SAMPLE_STEPS = 10;
/** Leading steps of each chunk that are scored (the whole chunk when the model's is shorter). */
export const EVAL_CHUNK = 16;
/** Datums per engine call. */
const EVAL_BATCH = 32;
/** Seeds the sampling noise and the flow loss's noise and time, so evaluations are comparable. */
const EVAL_SEED = 1234;

/** The fixed frames an evaluation scores. */
export interface EvalSet {
  /** Held-out episodes (of the evaluation dataset). */
  episodes: number[];
  /** Frames 0, stride, 2 * stride, ... of each episode, actions in the training space. */
  datums: TrainingDatum[];
}

/** Datums at every `stride`-th frame (from 0) of each episode. @throws DatasetError from makeDatum. */
export async function buildEvalSet(ds: Dataset, episodes: number[], stride: number, opts: Parameters<typeof makeDatum>[3]): Promise<EvalSet> {
  const datums: TrainingDatum[] = [];
  for (const e of episodes) {
    const len = ds.episode(e).length;
    for (let t = 0; t < len; t += stride) datums.push(await makeDatum(ds, e, t, opts));
  }
  return { episodes, datums };
}

/** MSEs of the model and the two baselines, and the model's ratio to each (< 1: better). */
export interface MseTriple {
  mse: number;
  mse_hold_state: number;
  mse_mean_chunk: number;
  ratio_hold_state: number;
  ratio_mean_chunk: number;
}

/** One action group's scores: normalised absolute space, and `raw` in the dataset's units. */
export interface GroupScores extends MseTriple {
  group: string;
  dims: string[];
  raw: MseTriple;
}

/** An evaluation's scores: overall (normalised and raw) and per group ([] when the dataset names none). */
export interface EvalScores extends MseTriple {
  /** Scored frames (datums) and valid chunk entries (frame x step x dim). */
  frames: number;
  entries: number;
  raw: MseTriple;
  groups: GroupScores[];
}

function triple(model: number, hold: number, mean: number): MseTriple {
  return { mse: model, mse_hold_state: hold, mse_mean_chunk: mean, ratio_hold_state: model / hold, ratio_mean_chunk: model / mean };
}

/**
 * Accumulates squared errors of predicted absolute chunks and of the baselines, per action dim.
 * - hold state: on action dims that share a name with a state dim (`holdPairs`), the state at t
 *   for the whole chunk; elsewhere the training mean, since there is no state to hold.
 * - mean chunk: the training set's mean absolute action per dim, for every step.
 */
export class ChunkScorer {
  private readonly perDim: { model: Float64Array; hold: Float64Array; mean: Float64Array; modelRaw: Float64Array; holdRaw: Float64Array; meanRaw: Float64Array };
  private count = 0; // valid (frame, step) pairs
  private frames = 0;

  /**
   * @param ad action dim; `chunk` leading steps are scored.
   * @param absStats statistics of the training chunk entries' absolute actions (normalises the scores).
   * @param meanAbs [ad] the training mean absolute action.
   */
  constructor(
    private readonly ad: number,
    private readonly chunk: number,
    private readonly absStats: NormStats,
    private readonly normalizer: Normalizer,
    private readonly meanAbs: Float32Array,
    private readonly holdPairs: readonly [number, number][],
    private readonly groups: readonly ActionGroup[],
    private readonly names: readonly string[] | null,
  ) {
    const z = () => new Float64Array(ad);
    this.perDim = { model: z(), hold: z(), mean: z(), modelRaw: z(), holdRaw: z(), meanRaw: z() };
  }

  /**
   * One frame: state [s] at t, the recorded absolute chunk [h, ad] with its mask [h], and the
   * predicted absolute chunk [h, ad] (raw units).
   */
  add(state: Float32Array, truth: Float32Array, mask: Float32Array, predicted: Float32Array): void {
    const ad = this.ad;
    const steps = Math.min(this.chunk, mask.length);
    let valid = 0;
    while (valid < steps && mask[valid] === 1) valid++;
    this.frames++;
    if (valid === 0) return;
    const n = valid * ad;
    const hold = new Float32Array(n);
    const mean = new Float32Array(n);
    for (let h = 0; h < valid; h++) {
      hold.set(this.meanAbs, h * ad);
      mean.set(this.meanAbs, h * ad);
      for (const [a, s] of this.holdPairs) hold[h * ad + a] = state[s]!;
    }
    const y = truth.subarray(0, n);
    const p = predicted.subarray(0, n);
    const norm = (x: Float32Array) => this.normalizer.normalize(x, ad, this.absStats);
    const [yN, pN, holdN, meanN] = [norm(y), norm(p), norm(hold), norm(mean)];
    const d = this.perDim;
    for (let i = 0; i < n; i++) {
      const j = i % ad;
      d.model[j] += (pN[i]! - yN[i]!) ** 2;
      d.hold[j] += (holdN[i]! - yN[i]!) ** 2;
      d.mean[j] += (meanN[i]! - yN[i]!) ** 2;
      d.modelRaw[j] += (p[i]! - y[i]!) ** 2;
      d.holdRaw[j] += (hold[i]! - y[i]!) ** 2;
      d.meanRaw[j] += (mean[i]! - y[i]!) ** 2;
    }
    this.count += valid;
  }

  private over(dims: readonly number[]): { norm: MseTriple; raw: MseTriple } {
    const d = this.perDim;
    const c = Math.max(1, this.count * dims.length);
    const sum = (a: Float64Array) => dims.reduce((s, j) => s + a[j]!, 0) / c;
    return { norm: triple(sum(d.model), sum(d.hold), sum(d.mean)), raw: triple(sum(d.modelRaw), sum(d.holdRaw), sum(d.meanRaw)) };
  }

  result(): EvalScores {
    const all = this.over(Array.from({ length: this.ad }, (_, j) => j));
    return {
      frames: this.frames, entries: this.count * this.ad, ...all.norm, raw: all.raw,
      groups: this.groups.map((g) => {
        const s = this.over(g.dims);
        return { group: g.name, dims: g.dims.map((j) => this.names?.[j] ?? String(j)), ...s.norm, raw: s.raw };
      }),
    };
  }
}

/** The dataset chunk of a datum in absolute raw units: its actions with the state added back on `pairs`. */
export function absoluteChunk(d: TrainingDatum, pairs: readonly [number, number][]): Float32Array {
  const out = d.actions.slice();
  for (let h = 0; h < d.horizon; h++) for (const [a, s] of pairs) out[h * d.actionDim + a] += d.state[s]!;
  return out;
}

/** What an evaluation needs besides the engine: model, cameras, the training stats and baselines. */
export interface EvalContext {
  model: JobLayout;
  cameras: string[];
  /** The training normalisation (state; actions in the training space). */
  norm: NormStatsSet;
  normalizer: Normalizer;
  /** Statistics of the training chunk entries' absolute actions, and their per-dim mean [ad]. */
  absStats: NormStats;
  ad: number;
  /** Pairs subtracted in the training action space (empty for absolute). */
  spacePairs: [number, number][];
  /** Pairs the hold-state baseline holds (dims action and state share by name). */
  holdPairs: [number, number][];
  groups: ActionGroup[];
  actionNames: string[] | null;
  /** One engine op on this job's session. */
  call<T>(op: string, args: Record<string, unknown>, transfer: ArrayBuffer[]): Promise<T>;
}

/**
 * Scores sampled chunks: `actions` [n, H, A] in the model's normalised training space, one per
 * datum of `datums` (same order) -> the dataset's dims -> unnormalise -> add the state back ->
 * absolute raw, against the recorded chunks and the baselines (ChunkScorer).
 */
export function scorePredictions(ec: Omit<EvalContext, 'call' | 'cameras'>, datums: readonly TrainingDatum[], actions: Float32Array): EvalScores {
  const { ad } = ec;
  const H = ec.model.horizon;
  const A = ec.model.actionDim;
  if (actions.length !== datums.length * H * A) throw new Error(`${actions.length} predicted values for ${datums.length} datums of [${H}, ${A}]`);
  const scorer = new ChunkScorer(ad, EVAL_CHUNK, ec.absStats, ec.normalizer, Float32Array.from(ec.absStats.mean), ec.holdPairs, ec.groups, ec.actionNames);
  datums.forEach((d, i) => {
    const normed = new Float32Array(H * ad);
    for (let h = 0; h < H; h++) normed.set(actions.subarray((i * H + h) * A, (i * H + h) * A + ad), h * ad);
    const predicted = ec.normalizer.unnormalize(normed, ad, ec.norm.actions);
    for (let h = 0; h < H; h++) for (const [a, st] of ec.spacePairs) predicted[h * ad + a] += d.state[st]!;
    scorer.add(d.state, absoluteChunk(d, ec.spacePairs), d.actionMask, predicted);
  });
  return scorer.result();
}

/** EvalScores as progress-event fields (`eval_` prefixed; see evaluate). */
export function evalFields(r: EvalScores): Record<string, unknown> {
  return {
    eval_mse: r.mse, eval_mse_hold_state: r.mse_hold_state, eval_mse_mean_chunk: r.mse_mean_chunk,
    eval_ratio_hold_state: r.ratio_hold_state, eval_ratio_mean_chunk: r.ratio_mean_chunk,
    eval_raw: r.raw, eval_groups: r.groups, eval_frames: r.frames,
  };
}

/**
 * Scores the model (its moving average with `weights.ema`) on the set. Returns the progress-event
 * fields: `eval_loss` (the flow-matching loss in the model's space, seeded noise and time),
 * `eval_mse`, `eval_mse_hold_state`, `eval_mse_mean_chunk`, `eval_ratio_hold_state`,
 * `eval_ratio_mean_chunk` (normalised absolute space), `eval_raw` (the same in raw units),
 * `eval_groups`, `eval_frames`, `eval_seconds`, `eval_horizon` (the chunk's length scored) and
 * `eval_num_steps` (the Euler steps of its samples).
 */
export async function evaluate(ec: EvalContext, set: EvalSet, weights: { ema?: boolean } = {}): Promise<Record<string, unknown>> {
  const started = Date.now();
  const { model, ad } = ec;
  const per = model.horizon * model.actionDim;
  const sampled = new Float32Array(set.datums.length * per);
  let flow = 0;
  let flowCount = 0;
  for (let start = 0; start < set.datums.length; start += EVAL_BATCH) {
    const datums = set.datums.slice(start, start + EVAL_BATCH);
    const b1 = toBatch(model, datums, ec.cameras, ec.norm, ec.normalizer, ad);
    const b2 = toBatch(model, datums, ec.cameras, ec.norm, ec.normalizer, ad);
    const mask = b1.actionMask.slice();
    const f = await ec.call<{ velocity: Float32Array; target: Float32Array }>('forward', { batch: b1, keep: false, seed: EVAL_SEED + start, ema: !!weights.ema }, batchBuffers(b1));
    for (let k = 0; k < mask.length; k++) {
      if (mask[k] !== 1) continue;
      flow += (f.velocity[k]! - f.target[k]!) ** 2;
      flowCount++;
    }
    const s = await ec.call<{ actions: Float32Array }>('sample', { batch: b2, numSteps: EVAL_SAMPLE_STEPS, seed: EVAL_SEED + start, ema: !!weights.ema }, batchBuffers(b2));
    sampled.set(s.actions, start * per);
  }
  return {
    eval_loss: flow / Math.max(1, flowCount), ...evalFields(scorePredictions(ec, set.datums, sampled)), eval_seconds: (Date.now() - started) / 1000,
    eval_horizon: model.horizon, eval_num_steps: EVAL_SAMPLE_STEPS,
  };
}
