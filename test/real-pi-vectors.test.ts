/**
 * The committed parity vectors of the real pi0 / pi0.5 (test/vectors/real-pi/, made by
 * scripts/real_pi/make_vectors.py) hold what the contract of issue 23 promises, read with the
 * project's own safetensors reader: a gradient for every LeRobot parameter name but the token
 * embedding (whose used rows come apart) and the LM heads; the batch features (a masked camera, a
 * padded prompt, pi0.5 state bins at and beyond the edges); and mask and positions that follow the
 * prefix-LM rule recomputed here from the input masks alone.
 */
import { readFileSync, statSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { decodeSafetensors, type SafeTensor } from '../kernels/safetensors.ts';

const EMBED = 'model.paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight';
const HEADS = ['model.paligemma_with_expert.paligemma.lm_head.weight', 'model.paligemma_with_expert.gemma_expert.lm_head.weight'];
const TOY_CHAR_BASE = 257024;

interface Meta {
  config: { variant: string; vlm: { width: number; depth: number }; expert: { width: number }; vision: { depth: number }; actionHorizon: number; maxTokenLen: number };
  constants: { tokensPerCamera: number; numCameras: number };
  prompt: { strings: string[]; state_bins?: number[][] };
  zero_grad_params: string[];
  params: [string, number[]][];
}

const url = (f: string) => new URL(`./vectors/real-pi/${f}`, import.meta.url);
const fixtureNames = (variant: string) =>
  (JSON.parse(readFileSync(new URL(`./fixtures/real-pi/${variant}_state_dict.json`, import.meta.url), 'utf8')) as [string, number[]][]).map((e) => e[0]);

/** numpy digitize over the 256 left edges -1 + 2k/256 (exact in binary), minus 1. */
const bin = (x: number) => {
  let n = 0;
  for (let k = 0; k < 256; k++) if (-1 + (2 * k) / 256 <= x) n++;
  return n - 1;
};

for (const name of ['tiny_pi0', 'tiny_pi05'] as const) {
  describe(`real pi parity vectors ${name}`, () => {
    const meta = JSON.parse(readFileSync(url(`${name}.json`), 'utf8')) as Meta;
    const { tensors: t } = decodeSafetensors(new Uint8Array(readFileSync(url(`${name}.safetensors`))));
    const get = (k: string): SafeTensor => {
      const x = t[k];
      if (!x) throw new Error(`${name}: no tensor ${k}`);
      return x;
    };
    const variant = meta.config.variant;
    const b = 2;
    const cams = meta.constants.numCameras;
    const n = meta.constants.tokensPerCamera;
    const l = meta.config.maxTokenLen;
    const s = meta.config.actionHorizon + (variant === 'pi0' ? 1 : 0);
    const total = cams * n + l + s;

    it('is under 3 MB and has a gradient for every LeRobot parameter but the embedding and the LM heads', () => {
      expect(statSync(url(`${name}.safetensors`)).size).toBeLessThan(3_000_000);
      // The fixture is the full-size list (27 SigLIP layers, 18 Gemma layers): keep the tiny depths.
      const layerOk = (p: string) => {
        const m = /\.(vision_tower\.encoder|language_model|gemma_expert\.model)\.layers\.(\d+)\./.exec(p);
        return !m || Number(m[2]) < (m[1] === 'vision_tower.encoder' ? meta.config.vision.depth : meta.config.vlm.depth);
      };
      const want = fixtureNames(variant).filter((p) => p !== EMBED && !HEADS.includes(p) && layerOk(p)).sort();
      const got = Object.keys(t).filter((k) => k.startsWith('grad/')).map((k) => k.slice(5)).sort();
      expect(got).toEqual(want);
      // The json's parameter list: the same names plus the embedding, with each gradient's shape.
      expect(meta.params.map((e) => e[0]).sort()).toEqual([...want, EMBED].sort());
      for (const [p, shape] of meta.params) if (p !== EMBED) expect(get(`grad/${p}`).shape, p).toEqual(shape);
      expect(meta.params.find((e) => e[0] === EMBED)![1]).toEqual([257152, meta.config.vlm.width]);
      const ids = get('in/tokens').data as Int32Array;
      const distinct = [...new Set(ids)].sort((x, y) => x - y);
      expect(Array.from(get('grad_rows_index').data as Int32Array)).toEqual(distinct);
      expect(get(`grad_rows/${EMBED}`).shape).toEqual([distinct.length, meta.config.vlm.width]);
      // Every gradient is finite; all but the listed exact zeros are non-zero.
      for (const k of got) {
        const g = get(`grad/${k}`).data as Float32Array;
        expect(g.every(Number.isFinite), k).toBe(true);
        expect(g.some((v) => v !== 0), k).toBe(!meta.zero_grad_params.includes(k));
      }
    });

    it('has the batch the contract asks for: one masked black camera, padded prompts, outputs of the right shapes', () => {
      expect(Array.from(get('in/image_masks').data as Int32Array)).toEqual([1, 0, 1, 1, 1, 1]);
      const img = get('in/images');
      const per = img.shape.slice(2).reduce((x, y) => x * y, 1);
      expect(img.shape).toEqual([b, cams, 3, 56, 56]);
      expect((img.data as Float32Array).subarray(per, 2 * per).every((v) => v === -1)).toBe(true);
      const masks = get('in/token_masks').data as Int32Array;
      for (let d = 0; d < b; d++) expect(masks[d * l + l - 1], `datum ${d} ends in padding`).toBe(0);
      for (const k of ['out/velocity', 'out/sample', 'in/noise', 'in/actions', 'in/sample_noise']) expect(get(k).shape, k).toEqual([b, meta.config.actionHorizon, 32]);
      const loss = get('out/loss').data as Float32Array;
      expect(loss.length).toBe(b);
      for (const v of loss) {
        expect(v).toBeGreaterThan(0.5);
        expect(v).toBeLessThan(10);
      }
    });

    it('holds the prompts of its json in the toy vocabulary (pi0.5: the state bins at and beyond the edges)', () => {
      const ids = get('in/tokens').data as Int32Array;
      const masks = get('in/token_masks').data as Int32Array;
      const state = get('in/state').data as Float32Array;
      for (let d = 0; d < b; d++) {
        const row = Array.from(ids.subarray(d * l, (d + 1) * l)).filter((_, i) => masks[d * l + i] === 1);
        expect(row[0]).toBe(2); // BOS
        expect(String.fromCharCode(...row.slice(1).map((id) => id - TOY_CHAR_BASE))).toBe(meta.prompt.strings[d]);
        if (variant === 'pi05') {
          const bins = Array.from(state.subarray(d * 32, d * 32 + 8), bin);
          expect(bins).toEqual(meta.prompt.state_bins![d]);
          expect(meta.prompt.strings[d]).toContain(`State: ${bins.join(' ')};\nAction: `);
        }
      }
      if (variant === 'pi05') expect(meta.prompt.state_bins!.flat()).toEqual(expect.arrayContaining([-1, 0, 255]));
    });

    it('has the prefix-LM mask and the positions over valid tokens, recomputed from the input masks', () => {
      const im = get('in/image_masks').data as Int32Array;
      const tm = get('in/token_masks').data as Int32Array;
      const mask = get('dbg/att_mask');
      const pos = get('dbg/positions');
      expect(mask.shape).toEqual([b, total, total]);
      expect(pos.shape).toEqual([b, total]);
      // pi0: the state token opens block 1, the actions block 2; pi0.5: the actions open block 1.
      const ar = [...Array(cams * n + l).fill(0), ...(variant === 'pi0' ? [1, 1] : [1]), ...Array(meta.config.actionHorizon - 1).fill(0)];
      for (let d = 0; d < b; d++) {
        const valid = [...Array.from({ length: cams * n }, (_, i) => im[d * cams + Math.floor(i / n)] === 1),
          ...Array.from({ length: l }, (_, i) => tm[d * l + i] === 1), ...Array(s).fill(true)];
        let c = 0;
        const cum = ar.map((a) => (c += a));
        let p = -1;
        const want = valid.map((v) => (p += v ? 1 : 0));
        expect(Array.from((pos.data as Int32Array).subarray(d * total, (d + 1) * total))).toEqual(want);
        const got = (mask.data as Int32Array).subarray(d * total * total, (d + 1) * total * total);
        let bad = 0;
        for (let i = 0; i < total; i++) {
          for (let j = 0; j < total; j++) if (got[i * total + j] !== (cum[j]! <= cum[i]! && valid[i] && valid[j] ? 1 : 0)) bad++;
        }
        expect(bad, `datum ${d}`).toBe(0);
      }
    });
  });
}
