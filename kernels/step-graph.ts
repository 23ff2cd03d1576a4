/**
 * forward_backward's forward and backward pass as one TensorFlow graph call on native TensorFlow
 * (kernels/backend/graph.ts): the first call for a batch layout runs the trainer's own eager
 * pass (TF.js's tape over the family's TypeScript model) and records every op of it, gradients
 * included; later calls feed the current weights and the call's host arrays (x_t, target, masks,
 * datum weights, FlowPolicy.velocityInputs) to the recorded graph and get back the per-datum
 * loss and one gradient per trained parameter. The optimizer step stays as it is. A flow05-tiny
 * full step at batch 8 issues ~1,200 eager ops; bench/results/README.md has what the graph saves.
 */
import * as tf from '@tensorflow/tfjs';
import { GraphTraceError, graphsEnabled, traceGraph } from './backend/graph.ts';
import { GraphCache, maxTraceOps, type CachedGraph } from './graph-cache.ts';
import type { PolicyWeights, VelocityInputs } from './flow-policy.ts';
import { weightedLoss, type LossFn } from './flow.ts';
import { gather, recording, type Read } from './weights-trace.ts';

/** The arrays of one forward_backward call besides the model's own: [b, ah, ad] x3 and [b]. */
export interface LossArrays {
  xT: Float32Array;
  target: Float32Array;
  actionMask: Float32Array;
  weight: Float32Array;
}

interface Entry extends CachedGraph {
  /** The parameter name of each gradient output, in output order. */
  gradNames: string[];
}

const stats = { traces: 0, runs: 0, refused: 0 };

/** Counts since the process started: loss graphs traced, graph calls made, layouts left eager. */
export function lossGraphStats(): Readonly<typeof stats> {
  return { ...stats };
}


/**
 * Loss graphs by batch layout, loss function, trained parameters and weight structure. Weights
 * are graph inputs, so training states of one policy with the same structure (tenants with LoRA
 * of one rank, say) share graphs: lossGraphsOf(policy).
 */
export class LossGraphs {
  private readonly cache = new GraphCache<Entry>();

  /**
   * The per-datum loss [b] and the gradient of sum_i w_i loss_i for each trained parameter that
   * has one (by parameter name), as new tensors; or null where graphs are off or this layout
   * could not be traced (then it stays eager). `params` maps parameter names to the variables
   * the gradients are taken for; `W` is the view the velocity reads them through.
   */
  run(vin: VelocityInputs, W: PolicyWeights, params: ReadonlyMap<string, tf.Variable>, arrays: LossArrays, shape: number[], lossFn: LossFn): { per: tf.Tensor; grads: Map<string, tf.Tensor> } | null {
    if (!graphsEnabled()) return null;
    // Parameter shapes in the key: LoRA tenants of other ranks read the same names.
    const key = `${vin.key}|${shape.join(',')}|${lossFn}|${[...params].map(([n, p]) => `${n}:${p.shape.join('x')}`).join(',')}`;
    if (this.cache.isRefused(key)) return null;
    const host = [arrays.xT, arrays.target, arrays.actionMask, arrays.weight, ...vin.host];
    const answer = (e: Entry, weights: tf.Tensor[]) => {
      stats.runs++;
      const [per, ...grads] = e.graph.run(weights, host);
      return { per: per!, grads: new Map(e.gradNames.map((n, i) => [n, grads[i]!])) };
    };
    const found = this.cache.find(key, W);
    if (found) return answer(found.entry, found.weights);
    const reads: Read[] = [];
    const gradNames: string[] = [];
    const nameOf = new Map([...params].map(([n, v]) => [v.name, n]));
    let traced: ReturnType<typeof traceGraph>;
    try {
      traced = traceGraph((input) => {
        const rec = recording(W, input, reads);
        let per: tf.Tensor | undefined;
        const { value, grads } = tf.variableGrads(() => {
          const l = weightedLoss((x) => vin.velocity(rec, x), arrays.xT, arrays.target, arrays.actionMask, arrays.weight, shape, lossFn);
          per = l.per;
          return l.total;
        }, [...params.values()]);
        value.dispose();
        const out: tf.Tensor[] = [per!];
        for (const [varName, g] of Object.entries(grads)) {
          const n = nameOf.get(varName);
          if (n === undefined) {
            g.dispose();
            continue;
          }
          gradNames.push(n);
          out.push(g);
        }
        return out;
      }, host, { maxOps: maxTraceOps() });
    } catch (err) {
      if (!(err instanceof GraphTraceError)) throw err;
      if (process.env.VELA_GRAPH_DEBUG) console.error('loss graph trace failed:', err.message);
      this.cache.refuse(key);
      stats.refused++;
      return null;
    }
    tf.dispose(traced.outputs);
    stats.traces++;
    const entry = { graph: traced.graph, reads, gradNames };
    if (!this.cache.add(key, entry)) {
      // Past the cache's byte budget on its own (its constants): answered once, then eager.
      this.cache.refuse(key);
      try {
        return answer(entry, gather(reads, W)!);
      } finally {
        traced.graph.dispose();
      }
    }
    // The graph's own answer, so that every call of a layout rounds the same way.
    return answer(entry, gather(reads, W)!);
  }

  /** Frees every graph's session (idempotent; the graphs are made again as needed). */
  dispose(): void {
    this.cache.dispose();
  }
}

const shared = new WeakMap<object, LossGraphs>();

/** The loss graphs of `policy` (a FlowPolicy), shared by its training states. */
export function lossGraphsOf(policy: object): LossGraphs {
  let g = shared.get(policy);
  if (!g) shared.set(policy, (g = new LossGraphs()));
  return g;
}
