/**
 * The real pi0 / pi0.5 on TF.js (kernels/pi/): the parameter table against LeRobot's state dict,
 * the config checks, the block mask and positions, RoPE against a direct computation, the
 * prefix KV cache against the joint pass, masked inputs that must not matter, gradients against
 * finite differences, no leaked tensors; then parity with the PyTorch reference's vectors
 * (test/vectors/real-pi/, contract item 3) when they are present.
 */
import * as tf from '@tensorflow/tfjs';
import fs from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { forEachBackend } from './helpers/tf.ts';
import { realPiInitValues } from './helpers/real-pi-init.ts';
import { ConfigError } from '../kernels/small/config.ts';
import { ShapeError } from '../kernels/small/batch.ts';
import { REAL_PI0, REAL_PI05, REAL_PI_TINY_PI0, REAL_PI_TINY_PI05, makeRealPiConfig, realPiConfigFromHub, type RealPiConfig } from '../kernels/pi/config.ts';
import { fakeRealPiBatch } from '../kernels/pi/fake.ts';
import { NAMES, contractInitValues, createRealPiParams, disposeRealPiParams, realPiParamCount, realPiParamSpecs, type RealPiParams } from '../kernels/pi/params.ts';
import { applyRope, attentionLayout, computeLoss, drawRealPiNoiseTime, embedPrefix, embedSuffix, ropeTables, sample, sequenceLayout, timeEmbedding, velocity, type RealPiBatch, type RealPiModel } from '../kernels/pi/model.ts';
import { decodeSafetensors, type SafeTensor } from '../kernels/safetensors.ts';
import { Rng } from '../kernels/rng.ts';

/** Every parameter of a table by the contract's init rule: name -> values. */
function realPiInitParams(specs: readonly { name: string; shape: readonly number[] }[]): Map<string, Float32Array> {
  return new Map(specs.map((s) => [s.name, realPiInitValues(s.name, s.shape.reduce((a, b) => a * b, 1))]));
}

const B = 2;
const NC = 3;

/** A small deterministic batch: camera 1 of datum 0 masked, datum 1's prompt padded. */
const makeBatch = (c: RealPiConfig, L = 12): RealPiBatch => fakeRealPiBatch(c, L);

const noiseOf = (c: RealPiConfig) => new Float32Array(B * c.actionHorizon * c.actionDim).map((_, i) => Math.cos(i * 0.3));

function maxAbs(a: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]!));
  return m;
}

function maxDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  expect(a.length).toBe(b.length);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
}

/** max |a - b| / max |b| (0 / 0 = 0). */
function relErr(a: ArrayLike<number>, b: ArrayLike<number>): number {
  const d = maxDiff(a, b);
  const scale = maxAbs(b);
  return scale === 0 ? d : d / scale;
}

describe('real pi config and parameter table', () => {
  it('full-size tables equal LeRobot state dicts (minus the two LM heads) in names, shapes and order', () => {
    for (const [c, file] of [[REAL_PI0, 'pi0'], [REAL_PI05, 'pi05']] as const) {
      const lerobot = (JSON.parse(fs.readFileSync(`test/fixtures/real-pi/${file}_state_dict.json`, 'utf8')) as [string, number[], string][])
        .filter(([name]) => !name.endsWith('lm_head.weight'))
        .map(([name, shape]) => ({ name, shape }));
      expect(realPiParamSpecs(c)).toEqual(lerobot);
    }
    // FACTS 2.4: parameters used in a forward pass.
    expect(realPiParamCount(REAL_PI0)).toBe(3_238_048_528);
    expect(realPiParamCount(REAL_PI05)).toBe(3_353_433_872);
  });

  it('tiny pi0.5 table: FACTS 5.2 LeRobot-style tiny module (16,758,912 used) plus the action/time projections', () => {
    const tiny = (JSON.parse(fs.readFileSync('test/fixtures/real-pi/tiny_reference_shapes.json', 'utf8')) as Record<string, [string, number[]][]>)
      .lerobot_pi_gemma_tiny_pi05!.filter(([name]) => !name.endsWith('lm_head.weight'));
    const mine = new Map(realPiParamSpecs(REAL_PI_TINY_PI05).map((s) => [s.name, s.shape]));
    for (const [name, shape] of tiny) expect(mine.get(`model.${name}`), name).toEqual(shape);
    const extra = [...mine.keys()].filter((n) => !n.startsWith('model.paligemma_with_expert.'));
    expect(extra).toEqual(['action_in_proj', 'action_out_proj', 'time_mlp_in', 'time_mlp_out'].flatMap((n) => [`model.${n}.weight`, `model.${n}.bias`]));
    expect(mine.size).toBe(tiny.length + extra.length);
    expect(realPiParamCount(REAL_PI_TINY_PI05)).toBe(16_758_912 + 4 * (32 * 32 + 32));
    const names = realPiParamSpecs(REAL_PI_TINY_PI0).map((s) => s.name);
    expect(names).toContain('model.state_proj.weight');
    expect(names).not.toContain('model.time_mlp_in.weight');
    expect(realPiParamSpecs(REAL_PI_TINY_PI0).find((s) => s.name === `${NAMES.expert}layers.0.self_attn.q_proj.weight`)!.shape).toEqual([128, 32]);
  });

  it('rejects configs the shared attention cannot run, naming the field and value', () => {
    const base = { ...REAL_PI_TINY_PI0 };
    expect(() => makeRealPiConfig({ ...base, expert: { ...base.expert, headDim: 8 } })).toThrow(/expert\.headDim is 8 but vlm\.headDim is 16/);
    expect(() => makeRealPiConfig({ ...base, vision: { ...base.vision, patchSize: 15 } })).toThrow(ConfigError);
    expect(() => makeRealPiConfig({ ...base, actionHorizon: 0 })).toThrow(/actionHorizon is 0/);
    expect(() => makeRealPiConfig({ ...base, variant: 'pi1' as never })).toThrow(/variant is 'pi1'/);
  });

  it('the kernel init rule equals the contract helper', () => {
    for (const name of [NAMES.embedding, 'model.action_in_proj.weight', `${NAMES.vision}post_layernorm.bias`]) {
      expect(Array.from(contractInitValues(name, 1000))).toEqual(Array.from(realPiInitValues(name, 1000)));
    }
    const v = realPiInitValues('model.action_in_proj.weight', 10_000);
    expect(maxAbs(v)).toBeLessThanOrEqual(0.05);
    expect(maxAbs(v)).toBeGreaterThan(0.049);
  });

  it('createRealPiParams names every missing, unexpected and misshapen tensor at once', () => {
    const specs = realPiParamSpecs(REAL_PI_TINY_PI05).filter((s) => s.name !== NAMES.embedding);
    const values = new Map<string, Float32Array | tf.Tensor>(realPiInitParams(specs));
    values.set('model.action_in_proj.weight', new Float32Array(3));
    values.set('model.action_out_proj.weight', tf.zeros([31, 32]));
    values.set('model.state_proj.weight', new Float32Array(3));
    expect(() => createRealPiParams(REAL_PI_TINY_PI05, values)).toThrow(
      /missing model\.paligemma_with_expert\.paligemma\.model\.language_model\.embed_tokens\.weight \[257152, 64\].*model\.action_in_proj\.weight is 3 values; expected \[32, 32\].*model\.action_out_proj\.weight is \[31, 32\]; expected \[32, 32\].*unexpected model\.state_proj\.weight/,
    );
    (values.get('model.action_out_proj.weight') as tf.Tensor).dispose();
  });
});

describe("a checkpoint's config.json (docs/MODEL.md \"Checkpoint config\")", () => {
  it('refuses a size LeRobot does not name with the accepted values and the vela_real_pi_config key (issue 32 item 5)', () => {
    for (const [field, value] of [['paligemma_variant', 'gemma_7b'], ['action_expert_variant', 'gemma_2b']] as const) {
      try {
        realPiConfigFromHub({ type: 'pi05', [field]: value });
        expect.unreachable();
      } catch (e) {
        expect(e).toBeInstanceOf(ConfigError);
        const msg = (e as Error).message;
        expect(msg).toContain(`${field} is "${value}"`);
        expect(msg).toContain(field === 'paligemma_variant' ? '"gemma_2b"' : '"gemma_300m"');
        expect(msg).toContain('"vela_real_pi_config"');
      }
    }
  });

  it("MODEL.md's vela_real_pi_config example builds the tiny pi0.5", () => {
    const doc = fs.readFileSync(new URL('../docs/MODEL.md', import.meta.url), 'utf8');
    const section = doc.slice(doc.indexOf('### Checkpoint config'));
    const json = /```json\n([\s\S]*?)```/.exec(section)![1]!;
    expect(realPiConfigFromHub(JSON.parse(json))).toEqual(REAL_PI_TINY_PI05);
  });
});

describe('real pi training draws (FACTS 1.12)', () => {
  it('t = 0.999 Beta(1.5, 1) + 0.001: inside [0.001, 1], mean 0.6004, biased to the noise end', () => {
    const { noise, time } = drawRealPiNoiseTime(REAL_PI_TINY_PI0, new Rng(7), 20_000);
    expect(noise.length).toBe(20_000 * 10 * 32);
    expect(Math.min(...time)).toBeGreaterThanOrEqual(0.001);
    expect(Math.max(...time)).toBeLessThanOrEqual(1);
    const mean = time.reduce((a, b) => a + b, 0) / time.length;
    expect(Math.abs(mean - (0.999 * 0.6 + 0.001))).toBeLessThan(0.01);
    // P(t > 0.5) = 1 - ((0.5 - 0.001) / 0.999)^1.5 = 0.647 (uniform would give 0.5).
    const upper = time.filter((t) => t > 0.5).length / time.length;
    expect(Math.abs(upper - 0.647)).toBeLessThan(0.015);
  });
});

describe('real pi mask and positions (FACTS 1.7)', () => {
  it('prefix bidirectional among valid tokens, blocks for the suffix, positions over valid tokens', () => {
    // prefix: 5 tokens, #2 and #4 invalid; pi0 suffix: state (flag 1), 2 actions (flags 1, 0).
    const valid = Uint8Array.from([1, 1, 0, 1, 0, 1, 1, 1]);
    const ar = Uint8Array.from([0, 0, 0, 0, 0, 1, 1, 0]);
    const { mask, positions } = attentionLayout(valid, ar, 1);
    expect(Array.from(positions)).toEqual([0, 1, 1, 2, 2, 3, 4, 5]);
    const rows = Array.from({ length: 8 }, (_, i) => Array.from(mask.subarray(i * 8, i * 8 + 8)).join(''));
    expect(rows).toEqual(['11010000', '11010000', '00000000', '11010000', '00000000', '11010100', '11010111', '11010111']);
  });
});

forEachBackend('real pi blocks', () => {
  it('RoPE rotates (x_j, x_{j+hd/2}) by pos / 10000^(2j/hd), as a direct computation', () => {
    const b = 2, n = 3, heads = 2, hd = 8;
    const x = new Float32Array(b * n * heads * hd).map((_, i) => Math.sin(i * 1.3) + 0.1);
    const pos = Int32Array.from([0, 5, 17, 3, 41, 1000]);
    const { cos, sin } = ropeTables(pos, b, n, hd);
    const got = tf.tidy(() => applyRope(tf.tensor3d(x, [b, n, heads * hd]), cos, sin, heads, hd)).dataSync();
    tf.dispose([cos, sin]);
    const want = new Float64Array(x.length);
    for (let t = 0; t < b * n; t++) {
      for (let h = 0; h < heads; h++) {
        const o = (t * heads + h) * hd;
        for (let j = 0; j < hd / 2; j++) {
          const a = pos[t]! / Math.pow(10000, (2 * j) / hd);
          want[o + j] = x[o + j]! * Math.cos(a) - x[o + j + hd / 2]! * Math.sin(a);
          want[o + j + hd / 2] = x[o + j + hd / 2]! * Math.cos(a) + x[o + j]! * Math.sin(a);
        }
      }
    }
    expect(maxDiff(got, want)).toBeLessThan(2e-6);
  });

  it('time embedding: sines then cosines over periods 4e-3 .. 4', () => {
    const e = timeEmbedding(new Float32Array([0, 1]), 8);
    expect(Array.from(e.subarray(0, 8))).toEqual([0, 0, 0, 0, 1, 1, 1, 1]);
    // Largest period 4: sin(2 pi / 4) = 1 at t = 1.
    expect(e[8 + 3]).toBeCloseTo(1, 6);
    expect(e[8 + 7]).toBeCloseTo(0, 6);
  });
});

forEachBackend('real pi grouped-query attention', () => {
  it('query head j uses key/value head floor(j / (H / G)): G = 2 equals G = 8 with each kv head repeated 4 times', async () => {
    const small = { ...REAL_PI_TINY_PI05, vlm: { ...REAL_PI_TINY_PI05.vlm, vocabSize: 300 } };
    const withKv = (G: number) => makeRealPiConfig({ ...small, vlm: { ...small.vlm, numKvHeads: G }, expert: { ...small.expert, numKvHeads: G } });
    const [g2, g8] = [withKv(2), withKv(8)];
    const values = realPiInitParams(realPiParamSpecs(g2));
    const hd = 16;
    const repeated = new Map([...values].map(([n, v]) => {
      if (!/self_attn\.[kv]_proj\.weight$/.test(n) || n.includes('vision')) return [n, v];
      const rowLen = v.length / (2 * hd);
      const out = new Float32Array(8 * hd * rowLen);
      for (let j = 0; j < 8; j++) out.set(v.subarray(Math.floor(j / 4) * hd * rowLen, (Math.floor(j / 4) + 1) * hd * rowLen), j * hd * rowLen);
      return [n, out];
    }));
    const batch = makeBatch(g2);
    const time = new Float32Array([0.3, 0.8]);
    const out: Float32Array[] = [];
    for (const [config, vals] of [[g2, values], [g8, repeated]] as const) {
      const params = createRealPiParams(config, vals);
      const v = velocity({ config, params }, batch, noiseOf(config), time);
      out.push((await v.data()) as Float32Array);
      v.dispose();
      disposeRealPiParams(params);
    }
    expect(maxAbs(out[0]!)).toBeGreaterThan(1e-3);
    expect(maxDiff(out[1]!, out[0]!)).toBeLessThan(1e-6);
  });
});

for (const [label, config] of [['pi0', REAL_PI_TINY_PI0], ['pi05', REAL_PI_TINY_PI05]] as const) {
  forEachBackend(`real pi ${label} tiny model`, () => {
    let params: RealPiParams;
    let model: RealPiModel;
    beforeAll(() => {
      params = createRealPiParams(config, 'contract-init', { trainable: true });
      model = { config, params };
    });
    afterAll(() => disposeRealPiParams(params));

    it('shapes, and text embeddings are the table rows times sqrt(D)', async () => {
      const batch = makeBatch(config);
      const before = tf.memory().numTensors;
      const v = velocity(model, batch, noiseOf(config), new Float32Array([0.3, 0.8]));
      expect(v.shape).toEqual([B, config.actionHorizon, config.actionDim]);
      expect(maxAbs(await v.data())).toBeGreaterThan(0);
      v.dispose();
      const { embs, rows } = tf.tidy(() => {
        const p = embedPrefix(model, batch);
        const T = 16;
        return { embs: tf.slice(p.embs, [0, NC * T, 0], [B, 12, 64]), rows: tf.gather(params.get(NAMES.embedding)!, tf.tensor1d(batch.tokens, 'int32')) };
      });
      expect(embs.shape).toEqual([B, 12, 64]);
      expect(Array.from(await embs.data())).toEqual(Array.from(await rows.data()).map((x) => Math.fround(x * 8)));
      tf.dispose([embs, rows]);
      expect(tf.memory().numTensors).toBe(before);
    });

    it('sample with one step equals noise - v(noise, 1) of the joint pass (the KV cache is exact)', async () => {
      const batch = makeBatch(config);
      const noise = noiseOf(config);
      const v = await velocity(model, batch, noise, new Float32Array([1, 1])).array() as number[][][];
      const s1 = sample(model, batch, noise, 1);
      const got = await s1.data();
      s1.dispose();
      const want = v.flat(2).map((x, i) => noise[i]! - x);
      expect(maxDiff(got, want)).toBeLessThan(1e-5);
    });

    it('a 10-step sample keeps its shape and leaks no tensors', async () => {
      const batch = makeBatch(config);
      const before = tf.memory().numTensors;
      const s = sample(model, batch, noiseOf(config));
      expect(s.shape).toEqual([B, config.actionHorizon, config.actionDim]);
      const data = await s.data();
      expect(data.every(Number.isFinite)).toBe(true);
      s.dispose();
      expect(tf.memory().numTensors).toBe(before);
    });

    it('masked camera pixels and padded token ids change nothing', async () => {
      const batch = makeBatch(config);
      const noise = noiseOf(config);
      const time = new Float32Array([0.3, 0.8]);
      const base = await velocity(model, batch, noise, time).data();
      const S = config.vision.imageSize;
      const images = batch.images.slice();
      images.fill(0.9, 1 * 3 * S * S, 2 * 3 * S * S); // datum 0, camera 1 (masked)
      const tokens = batch.tokens.slice();
      for (let j = 7; j < 12; j++) tokens[12 + j] = 5 + j; // datum 1's padding
      const changed = await velocity(model, { ...batch, images, tokens }, noise, time).data();
      expect(maxDiff(changed, base)).toBeLessThan(1e-6);
      // ...while a present camera's pixels do change the output.
      const images2 = batch.images.slice();
      images2.fill(0.9, 0, 3 * S * S);
      expect(maxDiff(await velocity(model, { ...batch, images: images2 }, noise, time).data(), base)).toBeGreaterThan(1e-4);
    });

    it('gradients of the mean loss agree with central finite differences', () => {
      // Weights 6x the contract's (±0.3), so that the vision tower's gradients stand clear of
      // float32 rounding in the differences.
      const scaled = new Map([...realPiInitParams(realPiParamSpecs(config))].map(([n, v]) => [n, v.map((x) => x * 6)]));
      const params = createRealPiParams(config, scaled, { trainable: true });
      const model = { config, params };
      try {
        checkGradients(model, params);
      } finally {
        disposeRealPiParams(params);
      }
    });

    function checkGradients(model: RealPiModel, params: RealPiParams): void {
      const batch = makeBatch(config);
      const noise = noiseOf(config);
      const time = new Float32Array([0.3, 0.8]);
      const objective = () => tf.mean(computeLoss(model, batch, noise, time)) as tf.Scalar;
      const names = [
        'model.action_out_proj.weight',
        'model.action_in_proj.weight',
        `${NAMES.vision}embeddings.patch_embedding.weight`,
        `${NAMES.vision}encoder.layers.0.layer_norm1.weight`,
        `${NAMES.projector}weight`,
        NAMES.embedding,
        `${NAMES.vlm}layers.0.self_attn.k_proj.weight`,
        `${NAMES.vlm}layers.1.input_layernorm.weight`,
        `${NAMES.expert}layers.0.self_attn.q_proj.weight`,
        `${NAMES.expert}layers.3.mlp.down_proj.weight`,
        ...(config.variant === 'pi0'
          ? ['model.state_proj.weight', 'model.action_time_mlp_in.weight', `${NAMES.expert}layers.2.post_attention_layernorm.weight`]
          : ['model.time_mlp_in.weight', `${NAMES.expert}layers.2.input_layernorm.dense.weight`, `${NAMES.expert}norm.dense.bias`]),
      ];
      const vars = names.map((n) => params.get(n) as tf.Variable);
      const before = tf.memory().numTensors;
      const { value, grads } = tf.variableGrads(objective, vars);
      const byName = new Map(names.map((n, i) => [n, grads[vars[i]!.name]!.dataSync()]));
      tf.dispose([value, ...Object.values(grads)]);
      expect(tf.memory().numTensors).toBe(before);
      const h = 1e-2;
      const lossAt = (): number => tf.tidy(() => objective().dataSync()[0]!);
      for (const [i, name] of names.entries()) {
        const g = byName.get(name)!;
        let k = 0;
        for (let j = 1; j < g.length; j++) if (Math.abs(g[j]!) > Math.abs(g[k]!)) k = j;
        expect(Math.abs(g[k]!), name).toBeGreaterThan(1e-3);
        const v = vars[i]!;
        const orig = v.dataSync().slice();
        const set = (delta: number) => {
          const next = orig.slice();
          next[k] = orig[k]! + delta;
          tf.tidy(() => v.assign(tf.tensor(next, v.shape)));
        };
        set(h);
        const up = lossAt();
        set(-h);
        const down = lossAt();
        tf.tidy(() => v.assign(tf.tensor(orig, v.shape)));
        const fd = (up - down) / (2 * h);
        expect(Math.abs(fd - g[k]!), `${name}[${k}]: fd ${fd} vs ${g[k]}`).toBeLessThanOrEqual(2e-4 + 2e-2 * Math.abs(g[k]!));
      }
    }

    it('loss = mean of (v(x_t, t) - (noise - actions))^2, over all dims or LeRobot\'s leading real dims', async () => {
      const batch = makeBatch(config);
      const noise = noiseOf(config);
      const time = new Float32Array([0.3, 0.8]);
      const per = config.actionHorizon * config.actionDim;
      const xT = noise.map((n, i) => time[Math.floor(i / per)]! * n + (1 - time[Math.floor(i / per)]!) * batch.actions![i]!);
      const v = await velocity(model, batch, xT, time).data();
      for (const dims of [config.actionDim, 7]) {
        const want = [0, 1].map((i) => {
          let sum = 0;
          for (let h = 0; h < config.actionHorizon; h++) {
            for (let a = 0; a < dims; a++) {
              const k = i * per + h * config.actionDim + a;
              sum += (v[k]! - (noise[k]! - batch.actions![k]!)) ** 2;
            }
          }
          return sum / (config.actionHorizon * dims);
        });
        const got = await computeLoss(model, { ...batch, lossActionDims: dims }, noise, time).data();
        expect(relErr(got, want), `lossActionDims ${dims}`).toBeLessThan(1e-5);
      }
    });

    it('refuses a batch that does not fit, naming the field', () => {
      const batch = makeBatch(config);
      expect(() => velocity(model, { ...batch, imageMasks: [1, 1] }, noiseOf(config), new Float32Array([0.5, 0.5]))).toThrow(/imageMasks has 2 values; expected 6/);
      expect(() => computeLoss(model, { ...batch, actions: undefined }, noiseOf(config), new Float32Array([0.5, 0.5]))).toThrow(ShapeError);
      expect(() => velocity(model, batch, noiseOf(config), new Float32Array([0.5]))).toThrow(/time has 1 values/);
      const tokens = batch.tokens.slice();
      tokens[0] = 257152;
      expect(() => velocity(model, { ...batch, tokens }, noiseOf(config), new Float32Array([0.5, 0.5]))).toThrow(/token id 257152 is outside the vocabulary/);
    });
  });
}

// ---------------------------------------------------------------- parity with the PyTorch reference

const VECTORS = 'test/vectors/real-pi';

interface Vectors {
  meta: Record<string, unknown>;
  t: Record<string, SafeTensor>;
}

function readVectors(name: string): Vectors | null {
  const file = `${VECTORS}/${name}.safetensors`;
  if (!fs.existsSync(file)) return null;
  return {
    meta: JSON.parse(fs.readFileSync(`${VECTORS}/${name}.json`, 'utf8')) as Record<string, unknown>,
    t: decodeSafetensors(new Uint8Array(fs.readFileSync(file))).tensors,
  };
}


for (const [name, preset] of [['tiny_pi0', REAL_PI_TINY_PI0], ['tiny_pi05', REAL_PI_TINY_PI05]] as const) {
  const vectors = readVectors(name);
  if (!vectors) console.warn(`skipped: real pi parity ${name}: ${VECTORS}/${name}.safetensors is not there`);
  (vectors ? forEachBackend : describe.skip)(`real pi parity with the PyTorch reference: ${name}`, () => {
    const v = vectors!;
    const f32 = (key: string): Float32Array => {
      const t = v.t[key];
      if (!t) throw new Error(`${name}: tensor ${key} is missing from the vectors`);
      return t.data instanceof Float32Array ? t.data : Float32Array.from(t.data as Int32Array);
    };
    const i32 = (key: string): Int32Array => Int32Array.from(v.t[key]!.data as Int32Array);
    let config: RealPiConfig;
    let params: RealPiParams;
    let model: RealPiModel;
    let batch: RealPiBatch;
    let xT: Float32Array;

    beforeAll(() => {
      const given = (v.meta.config ?? {}) as Partial<RealPiConfig>;
      config = makeRealPiConfig({ ...preset, ...given, vlm: { ...preset.vlm, ...given.vlm }, expert: { ...preset.expert, ...given.expert }, vision: { ...preset.vision, ...given.vision } });
      params = createRealPiParams(config, realPiInitParams(realPiParamSpecs(config)), { trainable: true });
      model = { config, params };
      const [b, nc] = v.t['in/images']!.shape as [number, number];
      const time = f32('in/time');
      batch = {
        size: b,
        numCameras: nc,
        images: f32('in/images'),
        imageMasks: i32('in/image_masks'),
        tokens: i32('in/tokens'),
        tokenMasks: i32('in/token_masks'),
        ...(config.variant === 'pi0' ? { state: f32('in/state') } : {}),
        actions: f32('in/actions'),
      };
      const noise = f32('in/noise');
      const actions = batch.actions!;
      const per = actions.length / b;
      xT = new Float32Array(actions.length);
      for (let i = 0; i < actions.length; i++) {
        const t = time[Math.floor(i / per)]!;
        xT[i] = Math.fround(Math.fround(t * noise[i]!) + Math.fround(Math.fround(1 - t) * actions[i]!));
      }
    });
    afterAll(() => params && disposeRealPiParams(params));

    it('the init rule gives the json init_check values (first and last of a few parameters)', () => {
      const checks = v.meta.init_check as Record<string, { n: number; first: number[]; last: number[] }> | undefined;
      expect(checks, 'init_check in the json').toBeDefined();
      const entries = Object.entries(checks!);
      expect(entries.length).toBeGreaterThan(0);
      for (const [pname, { n, first, last }] of entries) {
        expect(realPiParamSpecs(config).find((s) => s.name === pname)!.shape.reduce((a, b) => a * b, 1), pname).toBe(n);
        const values = contractInitValues(pname, n);
        expect(Array.from(values.subarray(0, first.length)), pname).toEqual(first.map((x) => Math.fround(x)));
        expect(Array.from(values.subarray(n - last.length)), pname).toEqual(last.map((x) => Math.fround(x)));
      }
    });

    it('the reference has exactly this parameter table (names and shapes)', () => {
      const list = v.meta.params as [string, number[]][] | undefined;
      expect(list, 'params in the json').toBeDefined();
      // Order aside: this table keeps LeRobot's state-dict order (SigLIP k, v, q, out), the
      // reference its own module order.
      const byName = (a: { name: string }, b: { name: string }) => (a.name < b.name ? -1 : 1);
      expect(realPiParamSpecs(config).slice().sort(byName)).toEqual(list!.map(([pname, shape]) => ({ name: pname, shape })).sort(byName));
    });

    it('mask and positions equal the reference exactly', () => {
      const prefix = tf.tidy(() => embedPrefix(model, batch).valid);
      const { mask, positions } = sequenceLayout(config, prefix, batch.size);
      expect(Array.from(positions)).toEqual(Array.from(i32('dbg/positions')));
      expect(Array.from(mask)).toEqual(Array.from(i32('dbg/att_mask')));
    });

    it('SigLIP output and prefix / suffix embeddings', async () => {
      const { siglipOut, embs } = tf.tidy(() => {
        const p = embedPrefix(model, batch);
        return { siglipOut: p.siglipOut, embs: p.embs };
      });
      const ref = f32('dbg/siglip');
      // The reference may dump the tower output or its projection; both are checked by size.
      const got = ref.length === siglipOut.size ? await siglipOut.data() : await tf.tidy(() => tf.add(tf.matMul(tf.reshape(siglipOut, [-1, config.vision.width]), params.get(`${NAMES.projector}weight`)!, false, true), params.get(`${NAMES.projector}bias`)!)).data();
      expect(relErr(got, ref), 'dbg/siglip').toBeLessThan(1e-5);
      expect(relErr(await embs.data(), f32('dbg/prefix_embs')), 'dbg/prefix_embs').toBeLessThan(1e-5);
      tf.dispose([siglipOut, embs]);
      const suffix = tf.tidy(() => embedSuffix(model, batch.state, tf.tensor3d(xT, [batch.size, config.actionHorizon, config.actionDim]), f32('in/time')).embs);
      expect(relErr(await suffix.data(), f32('dbg/suffix_embs')), 'dbg/suffix_embs').toBeLessThan(1e-5);
      suffix.dispose();
    });

    it('velocity at (noise, t) within 1e-5 relative', async () => {
      const out = velocity(model, batch, xT, f32('in/time'));
      expect(relErr(await out.data(), f32('out/velocity'))).toBeLessThan(1e-5);
      out.dispose();
    });

    it('per-datum loss, and every parameter gradient within 1e-4 of its scale', () => {
      const specs = realPiParamSpecs(config);
      const vars = specs.map((s) => params.get(s.name) as tf.Variable);
      let lossData = new Float32Array();
      const { value, grads } = tf.variableGrads(() => {
        const loss = computeLoss(model, batch, f32('in/noise'), f32('in/time'));
        lossData = Float32Array.from(loss.dataSync());
        return tf.mean(loss) as tf.Scalar;
      }, vars);
      expect(relErr(lossData, f32('out/loss')), 'out/loss').toBeLessThan(1e-5);
      const failures: string[] = [];
      let checked = 0;
      specs.forEach((s, i) => {
        const g = grads[vars[i]!.name];
        const mine = g ? g.dataSync() : new Float32Array(s.shape.reduce((a, b) => a * b, 1));
        if (s.name === NAMES.embedding) {
          const idx = i32('grad_rows_index');
          const rows = f32(`grad_rows/${s.name}`);
          const w = s.shape[1]!;
          const picked = new Float32Array(idx.length * w);
          idx.forEach((r, j) => picked.set(mine.subarray(r * w, (r + 1) * w), j * w));
          const err = relErr(picked, rows);
          if (!(err <= 1e-4)) failures.push(`${s.name} rows: ${err}`);
          checked++;
          return;
        }
        const ref = f32(`grad/${s.name}`);
        const err = maxDiff(mine, ref);
        const scale = maxAbs(ref);
        // A gradient that is exactly 0 in the reference (zero_grad_params) must be below 1e-6 here.
        if (!(scale === 0 ? err <= 1e-6 : err <= 1e-4 * scale)) failures.push(`${s.name}: max diff ${err.toExponential(3)}, scale ${scale.toExponential(3)}`);
        checked++;
      });
      tf.dispose([value, ...Object.values(grads)]);
      expect(checked).toBe(specs.length);
      expect(failures).toEqual([]);
    });

    it('a 10-step sample from fixed noise within 1e-4', async () => {
      const out = sample(model, batch, f32('in/sample_noise'), 10);
      expect(maxDiff(await out.data(), f32('out/sample'))).toBeLessThan(1e-4);
      out.dispose();
    });
  });
}
