/**
 * Which weights a traced graph reads (kernels/sample-graph.ts, kernels/step-graph.ts): a
 * PolicyWeights that declares each tensor it hands out as a graph input and logs the read, and
 * the replay of that log against other weights, which answers the tensors to feed, or null when
 * those weights have another structure (other names' shapes, adapters present or not, another
 * LoRA scale) and so need a graph of their own.
 */
import * as tf from '@tensorflow/tfjs';
import type { PolicyWeights } from './flow-policy.ts';
import type { LoraFactors } from './layers.ts';

/** One read of the weights during a trace. */
export type Read = { kind: 'w'; name: string; shape: number[] } | { kind: 'lora'; linear: string; scale: number | null; a?: number[]; b?: number[] };

const same = (a: readonly number[] | undefined, b: readonly number[] | undefined) => (a === undefined ? b === undefined : b !== undefined && tf.util.arraysEqual([...a], [...b]));

/** The tensors `reads` names, from `W`, or null when W answers differently than at the trace. */
export function gather(reads: Read[], W: PolicyWeights): tf.Tensor[] | null {
  const out: tf.Tensor[] = [];
  for (const r of reads) {
    if (r.kind === 'w') {
      const t = W.get(r.name);
      if (!same(t.shape, r.shape)) return null;
      out.push(t);
    } else {
      const f = W.lora(r.linear);
      if ((f ? f.scale : null) !== r.scale) return null;
      if (f) {
        if (!same(f.a.shape, r.a) || !same(f.b.shape, r.b)) return null;
        out.push(f.a, f.b);
      }
    }
  }
  return out;
}

/** A PolicyWeights over W that declares each tensor it hands out as a graph input and logs it. */
export function recording(W: PolicyWeights, input: (t: tf.Tensor) => tf.Tensor, reads: Read[]): PolicyWeights {
  const got = new Map<string, tf.Tensor>();
  const loras = new Map<string, LoraFactors | undefined>();
  return {
    get(name) {
      let t = got.get(name);
      if (!t) {
        t = input(W.get(name));
        got.set(name, t);
        reads.push({ kind: 'w', name, shape: [...t.shape] });
      }
      return t;
    },
    trainable: (name) => W.trainable(name),
    lora(linear) {
      if (loras.has(linear)) return loras.get(linear);
      const f = W.lora(linear);
      loras.set(linear, f);
      reads.push({ kind: 'lora', linear, scale: f ? f.scale : null, ...(f ? { a: [...f.a.shape], b: [...f.b.shape] } : {}) });
      if (f) {
        input(f.a);
        input(f.b);
      }
      return f;
    },
    // No params(): gradient checkpointing is for the backward pass; sampling has none.
  };
}

