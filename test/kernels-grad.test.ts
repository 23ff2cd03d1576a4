/**
 * Gradients of micro configs against central finite differences. TF.js has no float64 dtype on
 * any backend, so both sides are float32. Tolerance: with step h = 1e-2 on an objective of
 * order 1, the central difference has truncation error ~h^2 |f'''| ~ 1e-4 and rounding error
 * ~ eps32 * |f| / h ~ 1e-5 * (sum over ~1e3 terms) ~ 1e-4; we accept |fd - g| <= 2e-3 + 2e-2 |g|
 * and also require that every checked gradient is clearly non-zero (so the test can fail).
 */
import * as tf from '@tensorflow/tfjs';
import { describe, expect, it } from 'vitest';
import { forEachBackend } from './helpers/tf.ts';
import { makeConfig, type PolicyConfig } from '../kernels/small/config.ts';
import { fakeBatch, type ModelBatch } from '../kernels/small/batch.ts';
import { paramSpecs, velocity, type WeightsView } from '../kernels/small/model.ts';
import { drawNoiseTime, lossPerDatum, noisyActions } from '../kernels/flow.ts';
import { selectTargets } from '../kernels/lora.ts';
import type { LoraFactors } from '../kernels/layers.ts';
import { Rng } from '../kernels/rng.ts';


const micro = (preset: string) =>
  makeConfig(preset, { imageSize: 32, patch: 16, slots: 2, width: 16, depth: 2, heads: 2, headDim: 8, mlpDim: 32, maxTokenLen: 6, stateDim: 4, actionDim: 3, horizon: 4 });

/** Random values (scale 0.3) for every parameter, so that zero-initialised parts are active. */
function randomParams(c: PolicyConfig, seed: number): Map<string, Float32Array> {
  const rng = new Rng(seed);
  const out = new Map<string, Float32Array>();
  for (const s of paramSpecs(c)) {
    const n = s.shape.reduce((a, b) => a * b, 1);
    const base = s.name.endsWith('norm1.weight') || s.name.endsWith('norm2.weight') || s.name === 'final_norm.weight' ? 1 : 0;
    out.set(s.name, rng.normals(n).map((x) => base + 0.3 * x));
  }
  return out;
}

interface Setup {
  c: PolicyConfig;
  batch: ModelBatch;
  values: Map<string, Float32Array>;
  lora: Map<string, { a: Float32Array; b: Float32Array; ashape: number[]; bshape: number[] }>;
  objective: (tensors: Map<string, tf.Tensor>) => tf.Scalar;
}

function setup(preset: string, withLora: boolean): Setup {
  const c = micro(preset);
  const batch = fakeBatch(c, 2, 11, { actionShape: [3, 2] }); // padded actions: masking matters
  (batch.weight as Float32Array).set([1, 0.5]);
  (batch.tokenMask as Uint8Array)[4] = 0; // shorten datum 0's prompt
  (batch.tokens as Int32Array)[4] = 256;
  (batch.imageMask as Uint8Array)[1] = 0; // datum 0 has no slot-1 image
  const values = randomParams(c, 3);
  const rng = new Rng(9);
  const { noise, time } = drawNoiseTime(rng, 2, c.horizon, c.actionDim);
  const { xT, target } = noisyActions(batch.actions, noise, time);
  const lora = new Map<string, { a: Float32Array; b: Float32Array; ashape: number[]; bshape: number[] }>();
  if (withLora) {
    for (const s of selectTargets(c, ['attn', 'action_expert'])) {
      lora.set(s.name, { a: rng.normals(s.inDim * 2).map((x) => 0.3 * x), b: rng.normals(2 * s.outDim).map((x) => 0.3 * x), ashape: [s.inDim, 2], bshape: [2, s.outDim] });
    }
  }
  const shape = [2, c.horizon, c.actionDim];
  const objective = (tensors: Map<string, tf.Tensor>) => {
    const loras = new Map<string, LoraFactors>();
    for (const name of lora.keys()) loras.set(name, { a: tensors.get(`${name}.lora_a`)!, b: tensors.get(`${name}.lora_b`)!, scale: 1.5 });
    const view: WeightsView = {
      config: c,
      get: (n) => tensors.get(n)!,
      trainable: () => !withLora,
      lora: (n) => loras.get(n),
    };
    const v = velocity(view, batch, tf.tensor(xT, shape), time);
    const per = lossPerDatum(v, tf.tensor(target, shape), tf.tensor(batch.actionMask, shape), 'mse');
    return tf.sum(tf.mul(per, tf.tensor1d(batch.weight))) as tf.Scalar;
  };
  return { c, batch, values, lora, objective };
}

function allTensors(s: Setup, override?: { name: string; index: number; delta: number }): Map<string, tf.Tensor> {
  const m = new Map<string, tf.Tensor>();
  const put = (name: string, data: Float32Array, shape: number[]) => {
    let d = data;
    if (override && override.name === name) {
      d = data.slice();
      d[override.index] = d[override.index]! + override.delta;
    }
    m.set(name, tf.tensor(d, shape));
  };
  for (const spec of paramSpecs(s.c)) put(spec.name, s.values.get(spec.name)!, spec.shape);
  for (const [n, l] of s.lora) {
    put(`${n}.lora_a`, l.a, l.ashape);
    put(`${n}.lora_b`, l.b, l.bshape);
  }
  return m;
}

function fdCheck(s: Setup, picks: { name: string; index: number }[], trainable: (name: string) => boolean): void {
  const tensors = allTensors(s);
  const vars = new Map<string, tf.Variable>();
  for (const [n, t] of tensors) if (trainable(n)) vars.set(n, tf.variable(t, true));
  const viewTensors = new Map<string, tf.Tensor>([...tensors, ...vars]);
  const { value, grads } = tf.variableGrads(() => s.objective(viewTensors), [...vars.values()]);
  const byName = new Map<string, Float32Array>();
  for (const [n, v] of vars) if (grads[v.name]) byName.set(n, grads[v.name]!.dataSync() as Float32Array);
  value.dispose();
  tf.dispose(Object.values(grads));
  tf.dispose([...vars.values(), ...tensors.values()]);
  const h = 1e-2;
  const f = (name: string, index: number, delta: number) =>
    tf.tidy(() => s.objective(allTensors(s, { name, index, delta })).dataSync()[0]!);
  for (const { name, index } of picks) {
    const g = byName.get(name)![index]!;
    const fd = (f(name, index, h) - f(name, index, -h)) / (2 * h);
    expect(Math.abs(g), `${name}[${index}] gradient ${g}`).toBeGreaterThan(1e-3);
    expect(Math.abs(fd - g), `${name}[${index}]: finite difference ${fd}, gradient ${g}`).toBeLessThanOrEqual(2e-3 + 2e-2 * Math.abs(g));
  }
}

forEachBackend('kernels: gradients', () => {
  describe('gradients vs central finite differences (float32, h = 1e-2)', () => {
    it('pi0 micro config: one entry of every kind of parameter', () => {
      const s = setup('flow0-tiny', false);
      const tokens = s.batch.tokens;
      const picks = [
        { name: 'img.patch.weight', index: 5 },
        { name: 'img.patch.bias', index: 3 },
        { name: 'img.pos', index: 17 },
        { name: 'img.slot', index: 16 + 2 },
        { name: 'txt.embed', index: tokens[0]! * 16 + 1 },
        { name: 'txt.pos', index: 2 },
        { name: 'state.proj.weight', index: 7 },
        { name: 'act.in.weight', index: 4 },
        { name: 'act.pos', index: 20 },
        { name: 'act.time1.weight', index: 16 * 20 + 3 },
        { name: 'act.time2.bias', index: 1 },
        { name: 'layers.0.prefix.norm1.weight', index: 2 },
        { name: 'layers.0.prefix.qkv.weight', index: 40 },
        { name: 'layers.0.prefix.o.weight', index: 9 },
        { name: 'layers.0.prefix.mlp1.weight', index: 33 },
        { name: 'layers.0.prefix.mlp2.weight', index: 21 },
        { name: 'layers.1.prefix.qkv.weight', index: 16 * 48 - 20 }, // a value (V) column: last-layer K/V
        { name: 'layers.1.action.norm1.weight', index: 5 },
        { name: 'layers.1.action.qkv.weight', index: 3 },
        { name: 'layers.1.action.mlp2.bias', index: 6 },
        { name: 'final_norm.weight', index: 4 },
        { name: 'act.out.weight', index: 10 },
      ];
      fdCheck(s, picks, () => true);
    });
    it('pi0.5 micro config: state bins, time MLP, adaptive RMSNorm', () => {
      const s = setup('flow05-tiny', false);
      const c = s.c;
      const bins = Math.min(255, Math.floor(((Math.max(-1, Math.min(1, s.batch.state[1]!)) + 1) / 2) * 256));
      const picks = [
        { name: 'state.embed', index: bins * 16 + 2 },
        { name: 'state.dim', index: 16 + 5 },
        { name: 'time.mlp1.weight', index: 30 },
        { name: 'time.mlp2.bias', index: 7 },
        { name: 'layers.0.action.ada1.weight', index: 16 * 48 - 5 }, // gate column
        { name: 'layers.0.action.ada1.weight', index: 3 }, // scale column
        { name: 'layers.1.action.ada2.bias', index: c.width + 2 }, // shift
        { name: 'layers.1.action.o.weight', index: 12 },
        { name: 'layers.0.prefix.qkv.bias', index: 20 },
        { name: 'act.out.bias', index: 1 },
      ];
      fdCheck(s, picks, () => true);
    });
    it('LoRA factors on a frozen base (attn + action_expert targets)', () => {
      const s = setup('flow05-tiny', true);
      const picks = [
        { name: 'layers.0.prefix.qkv.lora_a', index: 3 },
        { name: 'layers.0.prefix.qkv.lora_b', index: 17 },
        { name: 'layers.1.action.o.lora_a', index: 5 },
        { name: 'layers.1.action.mlp1.lora_b', index: 8 },
        { name: 'act.in.lora_a', index: 1 },
        { name: 'layers.0.action.ada2.lora_b', index: 40 },
      ];
      fdCheck(s, picks, (n) => n.includes('.lora_'));
    });
  });
});
