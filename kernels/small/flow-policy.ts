/**
 * The small presets (kernels/policy.ts, kernels/config.ts) as a FlowPolicy (kernels/flow-policy.ts):
 * a thin binding of their parameter table, seeded init, LoRA targets, batch checks, velocity and
 * cached sampler, so the shared trainer computes exactly what it computed before the interface.
 */
import * as tf from '@tensorflow/tfjs';
import type { PolicyConfig } from './config.ts';
import { ShapeError, type ModelBatch } from './batch.ts';
import { eulerSample } from '../flow.ts';
import type { FlowPolicy, PolicyWeights } from '../flow-policy.ts';
import type { ChunkTensors } from '../rtc.ts';
import { selectTargets, zeroGateRule } from '../lora.ts';
import { decodeSuffix, disposeCache, encodePrefix, initialValues, paramSpecs, prefixHost, timeEmbedding, velocity, type PrefixHost, type WeightsView } from './model.ts';

const policies = new WeakMap<PolicyConfig, FlowPolicy<ModelBatch, PolicyConfig>>();

/** Whether every adaptive-norm Linear of the base (pi0.5's ada1/ada2 weights and biases) is all zero, as seeded. */
function adaGatesClosed(base: ReadonlyMap<string, tf.Tensor>): boolean {
  for (const [name, t] of base) {
    if (/\.ada[12]\.(weight|bias)$/.test(name) && (t.dataSync() as Float32Array).some((x) => x !== 0)) return false;
  }
  return true;
}

/** Euler sampling with the prefix's keys / values computed once (MODEL.md "Sampling"). */
function cachedSample(V: WeightsView, batch: ModelBatch, host: PrefixHost, noise: tf.Tensor, numSteps: number, chunk?: ChunkTensors): tf.Tensor {
  const kept = tf.tidy(() => {
    const k = encodePrefix(V, batch, host);
    return { kT: k.kT, v: k.v, keyBias: k.keyBias };
  });
  const full = { ...kept, length: kept.keyBias.shape[3]! };
  try {
    return eulerSample(noise, numSteps, (x, time, held) => decodeSuffix(V, batch, full, x, time, undefined, held), chunk);
  } finally {
    disposeCache(full);
  }
}

/** The small preset `c` as a FlowPolicy over ModelBatch (one object per config). */
export function smallPolicy(c: PolicyConfig): FlowPolicy<ModelBatch, PolicyConfig> {
  let p = policies.get(c);
  if (p) return p;
  const view = (W: PolicyWeights): WeightsView => ({ config: c, get: W.get, trainable: W.trainable, lora: W.lora, ...(W.params ? { params: W.params } : {}) });
  p = {
    name: c.preset,
    config: c,
    horizon: c.horizon,
    actionDim: c.actionDim,
    paramSpecs: () => paramSpecs(c),
    initialValues: (seed) => initialValues(c, seed),
    loraLinears: (targets) => selectTargets(c, targets),
    loraRefusal(targets, base) {
      const rule = zeroGateRule(c, targets);
      return rule && adaGatesClosed(base) ? `targets ${JSON.stringify(targets)} ${rule}` : null;
    },
    batchSize: (batch) => batch.size,
    checkBatch(batch) {
      const B = batch.size;
      const want: [string, { length: number }, number][] = [
        ['images', batch.images, B * c.slots * c.imageSize * c.imageSize * 3],
        ['imageMask', batch.imageMask, B * c.slots],
        ['tokens', batch.tokens, B * c.maxTokenLen],
        ['tokenMask', batch.tokenMask, B * c.maxTokenLen],
        ['state', batch.state, B * c.stateDim],
        ['actions', batch.actions, B * c.horizon * c.actionDim],
        ['actionMask', batch.actionMask, B * c.horizon * c.actionDim],
        ['weight', batch.weight, B],
      ];
      if (!Number.isInteger(B) || B < 1) throw new ShapeError('empty_batch', `batch size is ${B}; at least 1 is needed`);
      for (const [name, arr, n] of want) {
        if (arr.length !== n) throw new ShapeError('shape_mismatch', `batch.${name} has ${arr.length} values; a batch of ${B} for ${c.preset} needs ${n}`);
      }
    },
    lossTargets: (batch) => batch,
    velocity: (W, batch, xT, time) => velocity(view(W), batch, xT, time),
    sample(W, batch, noise, numSteps, cache, chunk) {
      const V = view(W);
      if (!cache) return eulerSample(noise, numSteps, (x, time, held) => velocity(V, batch, x, time, undefined, undefined, held), chunk);
      return cachedSample(V, batch, prefixHost(c, batch), noise, numSteps, chunk);
    },
    velocityInputs(batch, time) {
      const host = prefixHost(c, batch);
      const timeEmb = timeEmbedding(time, c.width);
      const arrays = [host.patches, batch.tokens, host.bins, host.keyBias, timeEmb, c.variant === 'pi0' ? batch.state : null];
      return {
        // A time per action (training-time RTC) is another graph: its time embedding is [b, ah, w].
        key: `${batch.size}|${host.slots.join(',')}|${time.length}`,
        host: arrays.filter((a): a is Float32Array | Int32Array => a !== null),
        velocity: (W, xT) => velocity(view(W), batch, xT, time, host, timeEmb),
      };
    },
    sampleInputs(batch) {
      const host = prefixHost(c, batch);
      const arrays = [host.patches, batch.tokens, host.bins, host.keyBias, c.variant === 'pi0' ? batch.state : null];
      return {
        key: `${batch.size}|${host.slots.join(',')}`,
        host: arrays.filter((a): a is Float32Array | Int32Array => a !== null),
        sample: (W, noise, numSteps, chunk) => cachedSample(view(W), batch, host, noise, numSteps, chunk),
      };
    },
  };
  policies.set(c, p);
  return p;
}
