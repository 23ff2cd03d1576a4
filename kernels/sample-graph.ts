/**
 * The cached Euler sampler (MODEL.md "Sampling") as one TensorFlow graph call on native
 * TensorFlow (kernels/backend/graph.ts): the first call for a batch layout runs the family's own
 * TypeScript sampler eagerly and records it; later calls with the same layout feed the current
 * weights, the noise and the batch's host arrays (FlowPolicy.sampleInputs) to the recorded
 * graph. A 10-step flow05-tiny sample is ~2,000 eager ops at 15-40 us of dispatch each; as a
 * graph TensorFlow's executor runs them with no host round trip (bench/results/README.md).
 *
 * Which weights a graph reads is recorded as it is traced (the names the sampler asks the
 * PolicyWeights for, and which linears had LoRA factors at which scale); a later call uses the
 * graph only when the weights it is given answer the same way, so a session that adds, drops or
 * rescales adapters gets a graph of its own. VELA_GRAPHS=0 turns graphs off (every call eager).
 */
import * as tf from '@tensorflow/tfjs';
import { GraphTraceError, graphsEnabled, traceGraph } from './backend/graph.ts';
import { GraphCache, maxTraceOps, type CachedGraph } from './graph-cache.ts';
import type { FlowPolicy, PolicyWeights } from './flow-policy.ts';
import type { ChunkTensors } from './rtc.ts';
import { gather, recording, type Read } from './weights-trace.ts';

/** Per policy, its sampling graphs (kernels/graph-cache.ts: one budget for the thread). */
const graphs = new WeakMap<object, GraphCache<CachedGraph>>();
const stats = { traces: 0, runs: 0, refused: 0, deferred: 0 };

/**
 * Above this many parameters a sample is seconds of arithmetic and the ~30 us per eager op is
 * noise, while a trace costs a second eager run and a graph load: full-size pi0 / pi0.5 (3.3-3.6 G)
 * sample eagerly.
 */
export const GRAPH_MAX_PARAMS = 200_000_000;
const paramCounts = new WeakMap<object, number>();

/** Whether `policy` is small enough for a graph to pay (GRAPH_MAX_PARAMS). */
export function graphWorthIt(policy: FlowPolicy<unknown, unknown>): boolean {
  let n = paramCounts.get(policy);
  if (n === undefined) paramCounts.set(policy, (n = policy.paramSpecs().reduce((a, s) => a + s.shape.reduce((x, y) => x * y, 1), 0)));
  return n <= GRAPH_MAX_PARAMS;
}

/**
 * Whether `policy`'s cached sampler runs as graphs here: graphs enabled (native TensorFlow,
 * VELA_GRAPHS not off), the family splits its sampler for them (sampleInputs), and the model is
 * at most GRAPH_MAX_PARAMS. Engines report it (EngineInfo.graphs) and split policy batches by it.
 */
export function samplesAsGraphs(policy: FlowPolicy<unknown, unknown>): boolean {
  return graphsEnabled() && !!policy.sampleInputs && graphWorthIt(policy);
}

/**
 * Counts since the process started: graphs traced, graph calls made, layouts left eager (not
 * traceable), and calls that ran eagerly because they were told not to trace (`trace: false`).
 */
export function sampleGraphStats(): Readonly<typeof stats> {
  return { ...stats };
}

/**
 * Actions [b, ah, ad] from the cached sampler of `policy` run as one graph call (with `chunk`,
 * real-time chunking: kernels/rtc.ts), or null where
 * graphs are not available or not enabled, the family has no sampleInputs, the model is above
 * GRAPH_MAX_PARAMS, or this layout could not be traced (remembered: it then stays eager; so does
 * a layout past the graph caches' budget, kernels/graph-cache.ts maxTraceOps: a trace stops
 * recording there, so an unrolled 1000-step loop never becomes a graph). The first call of a layout traces (an eager
 * run, the graph's load and one graph run: 1-2 s for flow05-tiny on 2 cores, several times a
 * request's eager time) unless `trace` is false: then it answers null (the caller samples
 * eagerly) and a later call with `trace` traces it. The caller owns the result.
 * @throws whatever the family's sampler throws for a bad batch (before any graph runs).
 */
export function sampleWithGraph<B, C>(policy: FlowPolicy<B, C>, W: PolicyWeights, batch: B, noise: tf.Tensor, numSteps: number, chunk?: ChunkTensors, trace = true): tf.Tensor | null {
  if (!samplesAsGraphs(policy)) return null;
  const inputs = policy.sampleInputs!(batch);
  // RTC: the previous chunk, its weights (the delay, executed count and schedule are all in
  // them) and β are inputs, so only the mode is in the key: no number a client sends traces a
  // graph (issue 32 item 7). The key's other parts are layouts (sampleInputs.key), bounded by
  // the server (power-of-two batch parts, the model's cameras and token length).
  const rtc = !chunk ? '' : `|${chunk.mode}`;
  const key = `${inputs.key}|${noise.shape.join(',')}|${numSteps}${rtc}`;
  const fed = chunk ? (chunk.mode === 'guided' ? [noise, chunk.actions, chunk.weights, chunk.maxGuidance] : [noise, chunk.actions, chunk.weights]) : [noise];
  let cache = graphs.get(policy);
  if (!cache) graphs.set(policy, (cache = new GraphCache()));
  if (cache.isRefused(key)) return null;
  const found = cache.find(key, W);
  if (found) {
    stats.runs++;
    return found.entry.graph.run([...fed, ...found.weights], inputs.host)[0]!;
  }
  if (!trace) {
    stats.deferred++;
    return null;
  }
  if (process.env.VELA_GRAPH_DEBUG) console.error(`sample graph: tracing layout ${key}`);
  const reads: Read[] = [];
  let traced: ReturnType<typeof traceGraph>;
  try {
    traced = traceGraph((input) => {
      for (const t of fed) input(t);
      return [inputs.sample(recording(W, input, reads), noise, numSteps, chunk)];
    }, inputs.host, { maxOps: maxTraceOps() });
  } catch (err) {
    if (!(err instanceof GraphTraceError)) throw err;
    if (process.env.VELA_GRAPH_DEBUG) console.error('graph trace failed:', err.message);
    cache.refuse(key);
    stats.refused++;
    return null;
  }
  const kept = cache.add(key, { graph: traced.graph, reads });
  stats.traces++;
  if (!kept) {
    // Past the cache's byte budget on its own (its constants): the trace's eager answer, and the
    // layout stays eager from now on.
    traced.graph.dispose();
    cache.refuse(key);
    stats.refused++;
    return traced.outputs[0]!;
  }
  // The graph's own answer, not the trace's: every call of a layout then gives the same bits
  // (Grappler's rewrites round differently from eager ops, within float32 rounding).
  tf.dispose(traced.outputs);
  stats.runs++;
  return traced.graph.run([...fed, ...gather(reads, W)!], inputs.host)[0]!;
}
