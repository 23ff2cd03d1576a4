import { describe, expect, it } from 'vitest';
import { ConfigError, countParams, describePresets, makeConfig, resolvePreset, type PolicyConfig } from '../kernels/small/config.ts';
import { tableParamCount, paramSpecs, timeEmbedding, stateBins } from '../kernels/small/model.ts';
import { ShapeError, fakeBatch, makeBatch, tokenizePrompt } from '../kernels/small/batch.ts';
import { Rng } from '../kernels/rng.ts';

/** MODEL.md's table, counted by hand, term by term (independent of kernels/small/config.ts). */
function handCount(c: PolicyConfig): number {
  const w = c.width, hd = c.heads * c.headDim;
  const lin = (i: number, o: number) => i * o + o;
  const patches = (c.imageSize / c.patch) ** 2;
  let n = lin(c.patch * c.patch * 3, w) + patches * w + c.slots * w; // patch proj, patch pos, slot emb
  n += 257 * w + c.maxTokenLen * w; // prompt embedding + position
  n += lin(c.actionDim, w) + c.horizon * w; // action in + horizon emb
  n += w + lin(w, c.actionDim); // final norm + head
  const attnMlp = lin(w, 3 * hd) + lin(hd, w) + lin(w, c.mlpDim) + lin(c.mlpDim, w);
  if (c.variant === 'pi0') {
    n += lin(c.stateDim, w) + lin(2 * w, w) + lin(w, w); // state token, action-time MLP
    n += c.depth * 2 * (attnMlp + 2 * w); // two experts, two RMSNorm weights each
  } else {
    n += 256 * w + c.stateDim * w + lin(w, w) + lin(w, w); // state bins, time MLP
    n += c.depth * (attnMlp + 2 * w + attnMlp + 2 * lin(w, 3 * w)); // prefix expert; action expert with adaRMSNorm
  }
  return n;
}

describe('presets', () => {
  const expected: Record<string, number> = { 'flow0-tiny': 1_790_752, 'flow05-tiny': 2_202_272, 'flow0-small': 29_368_352, 'flow05-small': 36_408_992 };
  for (const [name, count] of Object.entries(expected)) {
    it(`${name} has ${count} parameters by hand, by formula and by the table`, () => {
      const c = makeConfig(name);
      expect(handCount(c)).toBe(count);
      expect(countParams(c)).toBe(count);
      expect(tableParamCount(c)).toBe(count);
      expect(new Set(paramSpecs(c).map((s) => s.name)).size).toBe(paramSpecs(c).length);
    });
  }
  it('deprecated names resolve to the presets, bare pi0 / pi05 are refused, describePresets prints every count', () => {
    expect(resolvePreset('pi0-small')).toBe('flow0-small');
    expect(makeConfig('pi05-tiny').preset).toBe('flow05-tiny');
    expect(() => makeConfig('pi05')).toThrow(/pi05 is the real pi0.5/);
    const text = describePresets();
    expect(text).toContain('1,790,752');
    expect(text).toContain('36,408,992');
    expect(text.split('\n')).toHaveLength(4);
  });
  it('rejects unknown presets and bad sizes with ConfigError codes', () => {
    expect(() => makeConfig('pi1')).toThrow(ConfigError);
    try {
      makeConfig('flow0-tiny', { patch: 7 });
    } catch (e) {
      expect((e as ConfigError).code).toBe('bad_config');
      expect((e as Error).message).toContain('patch 7 does not divide image_size 96');
    }
    expect(() => makeConfig('flow0-tiny', { width: 0 })).toThrow(/width is 0/);
    expect(Object.isFrozen(makeConfig('flow0-tiny'))).toBe(true);
    expect(makeConfig('flow0-tiny', { width: 16 }).preset).toBe('flow0-tiny+custom');
  });
});

describe('inputs', () => {
  const c = makeConfig('flow0-tiny', { imageSize: 32, maxTokenLen: 8, stateDim: 4, actionDim: 3, horizon: 2 });
  it('tokenizes UTF-8 bytes, truncates to max_token_len and pads with 256 (D5)', () => {
    const { tokens, mask } = tokenizePrompt(c, 'hé');
    expect([...tokens]).toEqual([104, 0xc3, 0xa9, 256, 256, 256, 256, 256]);
    expect([...mask]).toEqual([1, 1, 1, 0, 0, 0, 0, 0]);
    expect([...tokenizePrompt(c, 'abcdefghij').tokens]).toEqual([97, 98, 99, 100, 101, 102, 103, 104]);
    expect(() => tokenizePrompt(c, 'x'.repeat(1400))).toThrow('prompt is 1400 bytes; the limit is 1024');
  });
  it('makeBatch pads state and actions, masks padding and rejects what does not fit', () => {
    const img = new Uint8Array(32 * 32 * 3).fill(7);
    const b = makeBatch(c, [{ images: [img, null], state: [1, 2], prompt: 'a', actions: { data: [1, 2, 3, 4], horizon: 2, dim: 2 }, weight: 2 }]);
    expect([...b.imageMask]).toEqual([1, 0, 0]);
    expect([...b.state]).toEqual([1, 2, 0, 0]);
    expect([...b.actions]).toEqual([1, 2, 0, 3, 4, 0]);
    expect([...b.actionMask]).toEqual([1, 1, 0, 1, 1, 0]);
    expect([...b.weight]).toEqual([2]);
    const bad = (d: object, code: string, msg: string) => {
      try {
        makeBatch(c, [{ images: [], state: [], prompt: '', ...d }]);
        expect.unreachable();
      } catch (e) {
        expect(e).toBeInstanceOf(ShapeError);
        expect((e as ShapeError).code).toBe(code);
        expect((e as Error).message).toContain(msg);
      }
    };
    bad({ state: [1, 2, 3, 4, 5] }, 'shape_mismatch', "state has 5 values; the model's state_dim is 4");
    bad({ actions: { data: new Float32Array(12), horizon: 3, dim: 4 } }, 'shape_mismatch', 'actions are [3, 4]; the model takes at most [2, 3]');
    bad({ images: [new Uint8Array(10)] }, 'shape_mismatch', 'image 0 is 10 bytes');
    bad({ weight: -1 }, 'bad_value', 'weight is -1');
    expect(() => makeBatch(c, [])).toThrow(ShapeError);
  });
  it('state bins follow D6 and the time embedding is sin/cos of 2 pi t / period', () => {
    expect([...stateBins(new Float32Array([-2, -1, 0, 0.999, 1, 5]))]).toEqual([0, 0, 128, 255, 255, 255]);
    const e = timeEmbedding(new Float32Array([0.5]), 8); // periods 4e-3 * 1000^(j/3)
    for (let j = 0; j < 4; j++) {
      const period = 4e-3 * 1000 ** (j / 3);
      expect(e[j]).toBeCloseTo(Math.sin((2 * Math.PI * 0.5) / period), 5);
      expect(e[4 + j]).toBeCloseTo(Math.cos((2 * Math.PI * 0.5) / period), 5);
    }
  });
  it('fakeBatch is deterministic in its seed', () => {
    expect(fakeBatch(c, 2, 5).actions).toEqual(fakeBatch(c, 2, 5).actions);
    expect(fakeBatch(c, 2, 5).actions).not.toEqual(fakeBatch(c, 2, 6).actions);
  });
});

describe('rng', () => {
  it('repeats from a seed and resumes from a saved state', () => {
    const a = new Rng(42);
    a.normals(5);
    const saved = a.getState();
    const next = a.uniforms(4);
    expect(Rng.fromState(saved).uniforms(4)).toEqual(next);
    expect(new Rng(42).normals(6)).toEqual(new Rng(42).normals(6));
  });
  it('uniforms lie in [0, 1) and normals have mean ~0, variance ~1', () => {
    const r = new Rng(1);
    const u = r.uniforms(20000);
    expect(Math.min(...u)).toBeGreaterThanOrEqual(0);
    expect(Math.max(...u)).toBeLessThan(1);
    const n = r.normals(20000);
    const mean = n.reduce((s, x) => s + x, 0) / n.length;
    const v = n.reduce((s, x) => s + (x - mean) ** 2, 0) / n.length;
    expect(Math.abs(mean)).toBeLessThan(0.03); // 4.2 standard errors
    expect(Math.abs(v - 1)).toBeLessThan(0.05);
  });
});
