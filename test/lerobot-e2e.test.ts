/**
 * Equal to LeRobot, end to end (issue 32): the tiny pi0 and pi0.5 checkpoint folders that
 * scripts/real_pi/make_lerobot_e2e.py wrote exactly as LeRobot's `save_pretrained` + processor
 * pipeline lay them out (test/fixtures/real-pi/lerobot_tiny_pi0{,5}/: config.json, model.safetensors
 * with LeRobot's `model.`-prefixed names, policy_preprocessor.json + its normalizer state,
 * policy_postprocessor.json + its unnormalizer state, the tokenizer step's `tokenizer/` folder),
 * against what LeRobot's own code computed from the same raw robot-unit inputs
 * (test/vectors/real-pi/lerobot_e2e.json). The 21 checks, 10 per model and pi0.5's state bins:
 *
 *   1 prompt ids + masks (Vela's tokenizer, found from the folder), 2 normalised state and
 *   3 unnormalised actions (the folder's stats), the model loaded from the folder: 4 velocity at a
 *   given (x_t, t), 5 per-datum loss at given noise and time, 6 10-step sample with given noise;
 *   through the real server: 7 a session's `forward` (velocity at LeRobot's x_t, t; its loss; and
 *   that it drew the noise and times LeRobot was given), 8 `forward_backward`'s loss, 9 a seeded
 *   `sample`, 10 `vela policy --base <folder> --seed` answering raw robot observations in robot
 *   units; 21 pi0.5's state bins.
 *
 * Tolerance: 1e-5 of each quantity's scale (max |value|, at least 1). Float32 arithmetic gives far
 * less: LeRobot and Vela both compute in float32 (ulp 6e-8 at 1), the model parity vectors measured
 * the whole forward / 10-step sample at 2e-7 .. 7e-7 of the scale (scripts/real_pi/README.md).
 * A (un)normalisation alone is checked at 5e-7 of the scale (TOL_NORM). Prompt ids and bins are
 * compared exactly. What these catch: a different epsilon (LeRobot (x - mean) / (std + 1e-8) and
 * x * std + mean; 1e-6 instead moves x / std = 2.4 at std 0.018 by 1.3e-4), a missing BOS, a
 * different prompt form, a wrong bin.
 */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { VelaClient, type Datum } from '../protocol/client.ts';
import { ndarray, type NDArray } from '../protocol/ndarray.ts';
import { discretizeState } from '../kernels/pi/prompt.ts';
import { normalizerOf } from '../kernels/normalize.ts';
import { readCheckpointNormStats } from '../server/models/norm-stats.ts';
import { loadPaligemmaTokenizer } from '../server/models/tokenizer.ts';
import { tokenizerFileFor } from '../server/models/layout.ts';
import * as tf from '@tensorflow/tfjs';
import { realPiConfigFromHub } from '../kernels/pi/config.ts';
import { computeLoss, sample, velocity, type RealPiBatch, type RealPiModel } from '../kernels/pi/model.ts';
import { loadHubTensors } from '../server/models/load-tensors.ts';
import { useBestBackend } from './helpers/tf.ts';
import { PolicyClient } from '../bench/harness/policy-stub.ts';
import { startPolicyProc, type PolicyProc } from './helpers/policy-proc.ts';
import { startTestServer, type TestServer } from './helpers/server.ts';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const E2E = JSON.parse(fs.readFileSync(path.join(ROOT, 'test/vectors/real-pi/lerobot_e2e.json'), 'utf8'));
const CAMERAS = ['base_0_rgb', 'left_wrist_0_rgb', 'right_wrist_0_rgb'];
const B = 2;
const H = 10;
const A = 32; // the model's action dim; the robot's is 6
const NATIVE = 6;
const TOL = 1e-5;
/**
 * A (un)normalisation alone: LeRobot's float32 (x + 1) * (q99 - q01) / 2 + q01 is 4 roundings of
 * values <= 4, at most ~3e-7 absolute on results of scale 2 (1.5e-7 of the scale), Vela's one
 * rounding of a double less; 5e-7 of the scale covers that and still sees an epsilon of 1e-6 on
 * a quantile range (unnormalised: (x + 1) / 2 * 1e-6, 9e-7 of the scale here).
 */
const TOL_NORM = 5e-7;

type Variant = 'pi0' | 'pi05';
const folder = (v: Variant) => path.join(ROOT, 'test/fixtures/real-pi', `lerobot_tiny_${v}`);
const vec = (v: Variant) => E2E[`tiny_${v}`];
const flat = (x: unknown): number[] => (Array.isArray(x) ? x.flatMap(flat) : [x as number]);

/** Every measured difference, printed at the end: name -> [max |diff|, scale]. */
const measured: Record<string, [number, number]> = {};

/** Asserts max |got - want| <= TOL * max(1, max |want|) and records it. */
function close(name: string, got: ArrayLike<number>, want: ArrayLike<number>, tol = TOL): void {
  expect(got.length, name).toBe(want.length);
  let d = 0;
  let scale = 1;
  for (let i = 0; i < want.length; i++) {
    d = Math.max(d, Math.abs(got[i]! - want[i]!));
    scale = Math.max(scale, Math.abs(want[i]!));
  }
  measured[name] = [d, scale];
  expect(d, `${name}: max |diff| ${d} (scale ${scale})`).toBeLessThanOrEqual(tol * scale);
}

/** The first `n` of every `per` values ([b, h, 32] -> [b, h, n]). */
function firstDims(x: ArrayLike<number>, per: number, n: number): number[] {
  const out: number[] = [];
  for (let i = 0; i < x.length; i += per) for (let k = 0; k < n; k++) out.push(x[i + k]!);
  return out;
}

/** Camera c of datum b as uint8 [56, 56, 3]: the script's pattern (b*37 + c*71 + y*5 + x*3 + ch*101) mod 256. */
function frame(b: number, c: number): NDArray {
  const px = new Uint8Array(56 * 56 * 3);
  for (let y = 0; y < 56; y++) for (let x = 0; x < 56; x++) for (let ch = 0; ch < 3; ch++) px[(y * 56 + x) * 3 + ch] = (b * 37 + c * 71 + y * 5 + x * 3 + ch * 101) % 256;
  return ndarray(px, [56, 56, 3]);
}

/** The session batch: LeRobot's normalised state and actions (sessions take model units), raw frames, raw tasks. */
function datums(v: Variant): Datum[] {
  const e = vec(v);
  return [0, 1].map((b) => ({
    observation: {
      image: Object.fromEntries(CAMERAS.map((cam, c) => [cam, frame(b, c)])),
      state: ndarray(Float32Array.from(e.state_normalized[b]), [NATIVE]),
      prompt: e.tasks[b],
    },
    actions: ndarray(Float32Array.from(flat(e.actions_normalized[b])), [H, NATIVE]),
  }));
}

let server: TestServer;
let client: VelaClient;
const procs: PolicyProc[] = [];

beforeAll(async () => {
  server = await startTestServer();
  client = new VelaClient(server.baseUrl, server.apiKey);
}, 60_000);
afterAll(() => {
  for (const p of procs) p.proc.kill('SIGTERM');
  server?.close();
  console.log('LeRobot end to end, max |diff| (scale):\n' + Object.entries(measured).map(([k, [d, s]]) => `  ${k}: ${d.toExponential(2)} (${s.toFixed(3)})`).join('\n'));
});

for (const v of ['pi0', 'pi05'] as const) {
  describe(`tiny ${v} as LeRobot saved it (${path.relative(ROOT, folder(v))})`, () => {
    const e = vec(v);

    it('the folder is LeRobot\'s layout', () => {
      const files = fs.readdirSync(folder(v), { recursive: true }).map(String).filter((f) => fs.statSync(path.join(folder(v), f)).isFile()).sort();
      expect(files).toEqual(e.folder_files);
      const pre = JSON.parse(fs.readFileSync(path.join(folder(v), 'policy_preprocessor.json'), 'utf8'));
      expect(pre.steps.find((s: any) => s.registry_name === 'tokenizer_processor').config.tokenizer_name).toBe('tokenizer');
    });

    it('prompt ids and masks: Vela\'s tokenizer from the folder', async () => {
      const tok = await loadPaligemmaTokenizer(tokenizerFileFor(folder(v)));
      for (let b = 0; b < B; b++) {
        const p = v === 'pi0' ? tok.pi0Prompt(e.tasks[b], 48) : tok.pi05Prompt(e.tasks[b], e.state_normalized[b], 200);
        expect(Array.from(p.tokens), `datum ${b}: ${JSON.stringify(e.prompt_text[b])}`).toEqual(e.tokens[b]);
        expect(Array.from(p.mask)).toEqual(e.token_masks[b]);
      }
    });

    it('normalised state (and pi0.5\'s state bins): the folder\'s stats, LeRobot\'s transform', async () => {
      const ns = await readCheckpointNormStats(folder(v));
      expect(ns).toMatchObject({ mode: v === 'pi0' ? 'zscore' : 'quantile', convention: 'lerobot', eps: 1e-8 });
      const norm = normalizerOf(ns!.mode, ns!.convention, ns!.eps);
      if (v === 'pi05') {
        const bins = [0, 1].map((b) => discretizeState(norm.normalize(e.state_raw[b], NATIVE, ns!.stats.state)));
        expect(bins).toEqual(e.state_bins);
      }
      close(`${v} normalised state`, norm.normalize(flat(e.state_raw), NATIVE, ns!.stats.state), flat(e.state_normalized), TOL_NORM);
    });

    it('unnormalised actions: the 10-step sample through the folder\'s stats', async () => {
      const ns = await readCheckpointNormStats(folder(v));
      close(`${v} unnormalised sample`, normalizerOf(ns!.mode, ns!.convention, ns!.eps).unnormalize(flat(e.sample.actions_normalized), NATIVE, ns!.stats.actions), flat(e.sample.actions_robot), TOL_NORM);
    });

    it('the model loaded from the folder: velocity at (x_t, t), loss, 10-step sample with the given noise', async () => {
      await useBestBackend();
      const config = realPiConfigFromHub(JSON.parse(fs.readFileSync(path.join(folder(v), 'config.json'), 'utf8')));
      const { tensors } = await loadHubTensors(folder(v), config);
      const model: RealPiModel = { config, params: { get: (n) => tensors.get(n) } };
      try {
        // LeRobot's model inputs: frames / 255 * 2 - 1 in float32, its prompt ids, its normalised state padded to 32.
        const images = new Float32Array(B * 3 * 3 * 56 * 56);
        for (let b = 0; b < B; b++) {
          for (let c = 0; c < 3; c++) {
            const px = frame(b, c).data as Uint8Array;
            for (let ch = 0; ch < 3; ch++) for (let i = 0; i < 56 * 56; i++) images[((b * 3 + c) * 3 + ch) * 56 * 56 + i] = Math.fround(Math.fround(px[i * 3 + ch]! / 255) * 2 - 1);
          }
        }
        const actions = new Float32Array(B * H * A);
        flat(e.actions_normalized).forEach((x, i) => (actions[Math.floor(i / NATIVE) * A + (i % NATIVE)] = x));
        const batch: RealPiBatch = {
          size: B, numCameras: 3, images, imageMasks: [1, 1, 1, 1, 1, 1],
          tokens: Int32Array.from(flat(e.tokens)), tokenMasks: flat(e.token_masks),
          ...(v === 'pi0' ? { state: Float32Array.from(flat(e.state_padded)) } : {}),
          actions, lossActionDims: NATIVE,
        };
        const vel = tf.tidy(() => velocity(model, batch, Float32Array.from(flat(e.velocity.x_t)), Float32Array.from(e.velocity.time)));
        close(`${v} model velocity`, await vel.data(), flat(e.velocity.velocity));
        vel.dispose();
        const loss = tf.tidy(() => computeLoss(model, batch, Float32Array.from(flat(e.forward.noise)), Float32Array.from(e.forward.time)));
        close(`${v} model loss`, await loss.data(), e.forward.loss_per_datum);
        loss.dispose();
        const s = tf.tidy(() => sample(model, batch, Float32Array.from(flat(e.sample.noise)), 10));
        close(`${v} model 10-step sample`, firstDims(await s.data(), A, NATIVE), flat(e.sample.actions_normalized));
        s.dispose();
      } finally {
        for (const t of tensors.values()) t.dispose();
      }
    }, 120_000);

    it('a session on the folder: seeded forward, forward_backward, seeded sample', async () => {
      const created = await client.createSession({ base_model: v, base: folder(v), seed: e.forward_backward.session_seed });
      const conn = await client.connect(await client.waitReady(created.id));
      const data = datums(v);
      // The session's generator is Rng(session seed + 0x5eed1) (kernels/trainer.ts); the protocol takes no
      // noise, so LeRobot was given that generator's first draw: forward draws it, and forward_backward
      // after load_state of the state saved before it draws it again.
      await conn.saveState('start');
      const f = await conn.forward(data, { codec: 'RAW' });
      close(`${v} session noise`, f.noise.data as Float32Array, flat(e.forward.noise));
      close(`${v} session time`, f.time.data as Float32Array, e.forward.time);
      close(`${v} session forward velocity`, f.velocity.data as Float32Array, flat(e.forward.velocity));
      const vel = f.velocity.data as Float32Array;
      const tgt = f.target.data as Float32Array;
      const loss = [0, 1].map((b) => {
        let s = 0;
        for (let h = 0; h < H; h++) for (let k = 0; k < NATIVE; k++) s += (vel[(b * H + h) * A + k]! - tgt[(b * H + h) * A + k]!) ** 2;
        return s / (H * NATIVE);
      });
      close(`${v} session forward loss`, loss, e.forward.loss_per_datum);
      await conn.loadState('start');
      const fb = await conn.forwardBackward(data, { codec: 'RAW' });
      close(`${v} session forward_backward loss`, fb.loss_per_datum.data as Float32Array, e.forward_backward.loss_per_datum);
      const s = await conn.sample(data, { codec: 'RAW', seed: e.sample.seed });
      close(`${v} session sample (normalised)`, firstDims(s.actions.data as Float32Array, A, NATIVE), flat(e.sample.actions_normalized));
    }, 120_000);

    it('vela policy --base <folder>: robot-unit actions', async () => {
      const p = await startPolicyProc(['--base', folder(v), '--cameras', CAMERAS.join(','), '--seed', String(e.policy.seed)]);
      procs.push(p);
      const c = await PolicyClient.connect(p.url);
      const got: number[] = [];
      for (let b = 0; b < B; b++) {
        const obs: Record<string, unknown> = { 'observation/state': ndarray(Float32Array.from(e.state_raw[b]), [NATIVE]), prompt: e.tasks[b] };
        CAMERAS.forEach((cam, i) => (obs[`observation/${cam}`] = frame(b, i)));
        const r = await c.infer(obs);
        got.push(...firstDims(r.actions.data as Float32Array, r.actions.shape[1], NATIVE));
      }
      c.close();
      close(`${v} vela policy actions (robot units)`, got, flat(e.policy.actions_robot));
    }, 120_000);
  });
}
