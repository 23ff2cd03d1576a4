/**
 * Every op of PROTOCOL.md section 3 over the real session websocket, and every op of the futures
 * API (section 7) over real HTTP, against the real engine worker, each answer compared with the
 * same op run in this process on a TrainingState built the same way (issue 13, item 1). The
 * engine runs the same kernels on the same backend (the best present: test/helpers/tf.ts), so answers
 * agree to float32 rounding.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { VelaClient, type Datum, type SessionConnection } from '../protocol/client.ts';
import { decodeFrameResized } from '../protocol/frames.ts';
import { ndarray, NDArray } from '../protocol/ndarray.ts';
import { useBestBackend } from './helpers/tf.ts';
import { passBound, relDiff, sampleBound } from './helpers/float32.ts';
import { makeBatch, type ModelBatch } from '../kernels/small/batch.ts';
import { makeConfig } from '../kernels/small/config.ts';
import { mseVelocityGrad } from '../kernels/flow.ts';
import { BaseWeights, TrainingState } from '../kernels/trainer.ts';
import { loadCheckpoint } from '../kernels/checkpoint.ts';
import { FuturesClient } from './helpers/futures-client.ts';
import { startTestServer, type TestServer } from './helpers/server.ts';

const cfg = makeConfig('flow05-tiny');
const SESSION = { base_model: 'flow05-tiny', rank: 4, alpha: 8, seed: 3 };
const OPTIM = { learning_rate: 3e-3, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.01, grad_clip_norm: 1 };

let server: TestServer;
let base: BaseWeights;

/** A deterministic RAW frame [96, 96, 3] (the model's size, so resizing is the identity). */
function frame(k: number): NDArray {
  const px = new Uint8Array(96 * 96 * 3);
  for (let i = 0; i < px.length; i++) px[i] = (i * (7 + k) + 31 * k) % 251;
  return ndarray(px, [96, 96, 3]);
}

/** Datums with one camera, an 8-dim state and a [10, 6] action chunk (the rest is padding). */
function datums(n: number, seed: number, weights?: number[]): Datum[] {
  return Array.from({ length: n }, (_, i) => {
    const k = seed * 10 + i;
    const state = Float32Array.from({ length: 8 }, (_, j) => Math.sin(k + j) * 0.5);
    const actions = Float32Array.from({ length: 60 }, (_, j) => Math.cos(k * 3 + j) * 0.7);
    return {
      observation: { image: { cam_high: frame(k) }, state: ndarray(state, [8]), prompt: `pick up bottle ${k}` },
      actions: ndarray(actions, [10, 6]),
      ...(weights ? { weight: weights[i]! } : {}),
    } as Datum;
  });
}

/** The batch the server builds from `data` (RAW codec), built here with the protocol and kernel functions. */
async function batchOf(data: Datum[]): Promise<ModelBatch> {
  const inputs = await Promise.all(
    data.map(async (d: any) => {
      const f = await decodeFrameResized('RAW', d.observation.image.cam_high, cfg.imageSize);
      const a = d.actions as NDArray;
      return {
        images: [f.data], state: d.observation.state.data as Float32Array, prompt: d.observation.prompt,
        actions: { data: a.data as Float32Array, horizon: a.shape[0]!, dim: a.shape[1]! }, weight: d.weight,
      };
    }),
  );
  return makeBatch(cfg, inputs);
}

function local(): TrainingState {
  return new TrainingState(base, { finetune: 'lora', rank: SESSION.rank, alpha: SESSION.alpha, targets: ['all'], seed: SESSION.seed });
}

/**
 * Same values to float32 rounding, relative to the tensor's scale (max |want|; an entry-wise
 * ratio is not a rounding bound: an entry near zero carries its neighbours' absolute error). The
 * engine runs the training ops on the same eager kernels as this process (bit-equal in practice),
 * bounded by one pass summed in another order, passBound(K), K the MLP's width; its sampler runs
 * a traced graph (Engine graphs), so samples get sampleBound(K) (test/helpers/float32.ts). An
 * AMD EPYC's sample differed from the eager one by 5.7e-8 of its scale, 1.35e-4 of one entry near 0.
 */
const K = cfg.mlpDim;
function expectClose(wire: NDArray | Float32Array, want: Float32Array, shape?: number[], bound = passBound(K)): void {
  const got = wire instanceof NDArray ? (wire.data as Float32Array) : wire;
  if (shape && wire instanceof NDArray) expect(wire.shape).toEqual(shape);
  expect(got.length).toBe(want.length);
  expect(relDiff(got, want)).toBeLessThanOrEqual(bound);
}

function expectNumClose(got: number, want: number): void {
  expect(Math.abs(got - want)).toBeLessThanOrEqual(1e-5 * Math.max(1, Math.abs(want)));
}

beforeAll(async () => {
  await useBestBackend();
  base = BaseWeights.create(cfg, 0); // the engine's base (Engine.start seed 0)
  server = await startTestServer();
});
afterAll(async () => {
  await server?.close();
  base?.dispose();
});

describe('every session op over the real websocket equals the in-process op', () => {
  let client: VelaClient;
  let conn: SessionConnection;
  let sessionId: string;

  beforeAll(async () => {
    client = new VelaClient(server.baseUrl, server.apiKey);
    const s = await client.waitReady((await client.createSession(SESSION)).id);
    sessionId = s.id;
    conn = await client.connect(s);
  });
  afterAll(async () => {
    await conn?.close();
  });

  it('forward, forward_backward, forward(keep) + backward, optim_step, sample, abort, save/load state, save_weights, heartbeat', async () => {
    const ref = local();
    const A = datums(3, 1, [1, 0.5, 2]);
    const B = datums(2, 2);

    // forward without keep: every output, and the generator advances alike.
    const f0 = await conn.forward(A, { codec: 'RAW' });
    const r0 = ref.forward(await batchOf(A));
    const shape = [3, cfg.horizon, cfg.actionDim];
    expectClose(f0.velocity, r0.velocity, shape);
    expectClose(f0.target, r0.target, shape);
    expectClose(f0.x_t, r0.xT, shape);
    expectClose(f0.noise, r0.noise, shape);
    expectClose(f0.time, r0.time, [3]);

    // forward_backward + optim_step.
    const fb = await conn.forwardBackward(A, { codec: 'RAW' });
    const rfb = ref.forwardBackward(await batchOf(A));
    expectNumClose(fb.loss, rfb.loss);
    expectClose(fb.loss_per_datum, rfb.lossPerDatum, [3]);
    const o1 = await conn.optimStep(OPTIM);
    const ro1 = ref.optimStep({ learningRate: OPTIM.learning_rate, beta1: OPTIM.beta1, beta2: OPTIM.beta2, eps: OPTIM.eps, weightDecay: OPTIM.weight_decay, gradClipNorm: OPTIM.grad_clip_norm });
    expect(o1.skipped).toBe(ro1.skipped);
    expectNumClose(o1.grad_norm, ro1.gradNorm);

    // forward(keep) on 2 datums, then backward of d/dvelocity of sum_i w_i * mse_i (the input).
    const bB = await batchOf(B);
    const fk = await conn.forward(B, { codec: 'RAW', keep: true });
    const rk = ref.forward(bB, { keep: true });
    expectClose(fk.velocity, rk.velocity, [2, cfg.horizon, cfg.actionDim]);
    expectClose(fk.x_t, rk.xT);
    expectClose(fk.time, rk.time, [2]);
    const grad = mseVelocityGrad(fk.velocity.data as Float32Array, fk.target.data as Float32Array, bB.actionMask, bB.weight);
    expect(await conn.backward(ndarray(grad, [2, cfg.horizon, cfg.actionDim]))).toEqual({});
    ref.backward(grad);
    const o2 = await conn.optimStep(OPTIM);
    const ro2 = ref.optimStep({ learningRate: OPTIM.learning_rate, beta1: OPTIM.beta1, beta2: OPTIM.beta2, eps: OPTIM.eps, weightDecay: OPTIM.weight_decay, gradClipNorm: OPTIM.grad_clip_norm });
    expectNumClose(o2.grad_norm, ro2.gradNorm);

    // PROTOCOL.md section 3: forward(keep) + backward adds the same G and D as forward_backward on
    // the same batch, noise and time. Checked in this process on two twins of ref's first step
    // (bit-identical weights; the wire's own velocities differ from them by rounding, which the
    // residual v - target would amplify): one takes forward(keep) + backward of its own
    // velocity's gradient, the other forward_backward with that forward's noise and time. The two
    // sum the same gradient in another order (the loss's d/dv in float64 here, in the graph
    // there): grad_norm within 2 passBound(2K) relative, K the MLP's width (backends-agree.test.ts).
    const adam = { learningRate: OPTIM.learning_rate, beta1: OPTIM.beta1, beta2: OPTIM.beta2, eps: OPTIM.eps, weightDecay: OPTIM.weight_decay, gradClipNorm: OPTIM.grad_clip_norm };
    const twins = [local(), local()];
    for (const t of twins) {
      t.forward(await batchOf(A));
      t.forwardBackward(await batchOf(A));
      t.optimStep(adam);
    }
    const tk = twins[0]!.forward(bB, { keep: true });
    twins[0]!.backward(mseVelocityGrad(tk.velocity, tk.target, bB.actionMask, bB.weight));
    twins[1]!.forwardBackward(bB, { noise: tk.noise, time: tk.time });
    const [viaBackward, fused] = twins.map((t) => t.optimStep(adam).gradNorm);
    expect(fused).toBeGreaterThan(0);
    expect(Math.abs(viaBackward! - fused!) / fused!).toBeLessThanOrEqual(2 * passBound(2 * cfg.mlpDim));
    for (const t of twins) t.dispose();

    // sample: seeded, then from the session's own generator.
    const s1 = await conn.sample(B, { codec: 'RAW', seed: 11, num_steps: 4 });
    expectClose(s1.actions, ref.sample(bB, { seed: 11, numSteps: 4 }), [2, cfg.horizon, cfg.actionDim], sampleBound(K));
    const s2 = await conn.sample(B, { codec: 'RAW', num_steps: 3 });
    expectClose(s2.actions, ref.sample(bB, { numSteps: 3 }), undefined, sampleBound(K));

    // abort_gradient_epoch discards G and D and rewinds the generator.
    await conn.forwardBackward(A, { codec: 'RAW' });
    ref.forwardBackward(await batchOf(A));
    expect(await conn.abortGradientEpoch()).toEqual(ref.abortGradientEpoch());
    const fb2 = await conn.forwardBackward(B, { codec: 'RAW', loss_fn: 'l1' });
    expectNumClose(fb2.loss, ref.forwardBackward(bB, { lossFn: 'l1' }).loss);

    // save_state / save_weights / load_state / sample from saved weights.
    expect(await conn.saveState('st-1')).toBe('st-1');
    const wPath = await conn.saveWeights('w-1');
    const saved = (await loadCheckpoint(wPath, { preset: 'flow05-tiny' })).adapter!.tensors;
    const mine = ref.trainableTensors();
    expect(Object.keys(saved).sort()).toEqual(Object.keys(mine).sort());
    for (const [name, t] of Object.entries(mine)) expectClose(saved[name]!.data, t.data);
    const beforeStep = await conn.sample(B, { codec: 'RAW', seed: 5, num_steps: 2 });
    await conn.optimStep(OPTIM);
    ref.optimStep({ learningRate: OPTIM.learning_rate, beta1: OPTIM.beta1, beta2: OPTIM.beta2, eps: OPTIM.eps, weightDecay: OPTIM.weight_decay, gradClipNorm: OPTIM.grad_clip_norm });
    const fromSaved = await conn.sample(B, { codec: 'RAW', seed: 5, num_steps: 2, weights: 'w-1' });
    expectClose(fromSaved.actions, beforeStep.actions.data as Float32Array);
    expect(await conn.loadState('st-1')).toEqual({});
    const restored = await conn.sample(B, { codec: 'RAW', seed: 5, num_steps: 2 });
    expectClose(restored.actions, beforeStep.actions.data as Float32Array);
    expect(await conn.request('heartbeat')).toEqual({});
    ref.dispose();
  });
});

const adamw = { learningRate: OPTIM.learning_rate, beta1: OPTIM.beta1, beta2: OPTIM.beta2, eps: OPTIM.eps, weightDecay: OPTIM.weight_decay, gradClipNorm: OPTIM.grad_clip_norm };

describe('every futures op over real HTTP equals the in-process op', () => {
  for (const format of ['msgpack', 'json'] as const) {
    it(`${format}: create_model, forward, forward_backward, optim_step, abort, sample, save/load, management ops`, async () => {
      const fc = new FuturesClient(server.baseUrl, server.apiKey, format);
      const ref = local();
      const A = datums(2, 4, [1, 3]);
      const bA = await batchOf(A);
      const created = await fc.createModel({ base_model: 'flow05-tiny', lora_config: { rank: SESSION.rank, alpha: SESSION.alpha }, seed: SESSION.seed });
      const model_id = created.model_id;
      expect(created).toMatchObject({ status: 'ready', rank: SESSION.rank, alpha: SESSION.alpha, trainable_params: ref.trainableParamCount });

      const f = await fc.run('forward', { model_id, data: A, codec: 'RAW', keep: true });
      const rf = ref.forward(bA, { keep: true });
      expectClose(f.velocity, rf.velocity, [2, cfg.horizon, cfg.actionDim]);
      expectClose(f.noise, rf.noise);
      expectClose(f.time, rf.time, [2]);

      const fb = await fc.forwardBackward(model_id, A, { codec: 'RAW' });
      const rfb = ref.forwardBackward(bA);
      expectNumClose(fb.loss, rfb.loss);
      expectClose(fb.loss_per_datum, rfb.lossPerDatum, [2]);
      const o = await fc.optimStep(model_id, { adam_params: { learning_rate: OPTIM.learning_rate, beta1: OPTIM.beta1, beta2: OPTIM.beta2, eps: OPTIM.eps, weight_decay: OPTIM.weight_decay }, grad_clip_norm: 1 });
      const ro = ref.optimStep(adamw);
      expect(o.skipped).toBe(false);
      expectNumClose(o.grad_norm, ro.gradNorm);

      await fc.forwardBackward(model_id, A, { codec: 'RAW', loss_fn: 'l1' });
      ref.forwardBackward(bA, { lossFn: 'l1' });
      expect(await fc.run('abort_gradient_epoch', { model_id })).toEqual(ref.abortGradientEpoch());

      const s = await fc.run('sample', { model_id, data: A, codec: 'RAW', seed: 9, num_steps: 3 });
      expectClose(s.actions, ref.sample(bA, { seed: 9, numSteps: 3 }), [2, cfg.horizon, cfg.actionDim], sampleBound(K));

      const saved = await fc.saveWeights(model_id, { name: 'fut-1' });
      expect(saved).toMatchObject({ name: 'fut-1', checkpoint_id: `${model_id}/states/fut-1` });
      const sampler = await fc.run('save_weights_for_sampler', { model_id, name: 'fut-w' });
      expect(sampler.checkpoint_id).toBe(`${model_id}/weights/fut-w`);
      await fc.forwardBackward(model_id, A, { codec: 'RAW' });
      await fc.optimStep(model_id, { learning_rate: 1e-2 });
      const moved = await fc.run('sample', { model_id, data: A, codec: 'RAW', seed: 9, num_steps: 3 });
      expect(Array.from(moved.actions.data)).not.toEqual(Array.from(s.actions.data));
      const fromSampler = await fc.run('sample', { model_id, data: A, codec: 'RAW', seed: 9, num_steps: 3, weights: 'fut-w' });
      expectClose(fromSampler.actions, s.actions.data as Float32Array);
      expect(await fc.run('load_weights', { model_id, name: 'fut-1' })).toMatchObject({ name: 'fut-1' });
      const back = await fc.run('sample', { model_id, data: A, codec: 'RAW', seed: 9, num_steps: 3 });
      expectClose(back.actions, s.actions.data as Float32Array);

      // Management ops: answered at once, in the request's format.
      expect((await fc.call('session_info', { model_id })).sessions[0]).toMatchObject({ model_id, status: 'ready', pending_gradients: 0 });
      expect((await fc.raw('GET', 'session_info')).body.sessions.map((x: any) => x.model_id)).toContain(model_id);
      expect(await fc.call('session_heartbeat', { model_id })).toMatchObject({ model_id, status: 'ready' });
      expect(await fc.call('sleep', { model_id })).toEqual({ model_id, asleep: true });
      expect(await fc.call('wake_up', { model_id })).toEqual({ model_id, asleep: false });
      const again = await fc.run('sample', { model_id, data: A, codec: 'RAW', seed: 9, num_steps: 3 });
      expectClose(again.actions, s.actions.data as Float32Array);
      const listed = (await fc.call('list_checkpoints', { model_id })).checkpoints.map((c: any) => c.checkpoint_id).sort();
      expect(listed).toEqual([`${model_id}/states/fut-1`, `${model_id}/weights/fut-w`]);
      expect(await fc.call('delete_checkpoint', { checkpoint_id: `${model_id}/weights/fut-w` })).toEqual({ checkpoint_id: `${model_id}/weights/fut-w`, deleted: true });
      const all = (await fc.raw('GET', 'list_checkpoints')).body.checkpoints.map((c: any) => c.checkpoint_id);
      expect(all).toContain(`${model_id}/states/fut-1`);
      expect(all).not.toContain(`${model_id}/weights/fut-w`);
      expect((await fc.raw('GET', 'healthz')).body).toEqual({ status: 'ok' });
      expect(await fc.call(format === 'json' ? 'unload_model' : 'kill_session', { model_id })).toEqual({ model_id, status: 'closed' });
      ref.dispose();
    });
  }
});

describe('optim_step refuses what would break the weights, before anything changes (item 5)', () => {
  it('eps 0 and other bad hyperparameters are refused; a non-finite update is refused; G and D survive both', async () => {
    const client = new VelaClient(server.baseUrl, server.apiKey);
    const conn = await client.connect(await client.waitReady((await client.createSession(SESSION)).id));
    const ref = local();
    const A = datums(2, 7);
    const bA = await batchOf(A);
    await conn.forwardBackward(A, { codec: 'RAW' });
    ref.forwardBackward(bA);
    const probe = async () => (await conn.sample(A, { codec: 'RAW', seed: 1, num_steps: 2 })).actions.data as Float32Array;
    const before = await probe();
    const bad: [Record<string, number>, RegExp][] = [
      [{ eps: 0 }, /^eps must be > 0 \(at least 1.4e-45, the smallest float32\), got 0$/],
      [{ eps: 1e-50 }, /^eps must be > 0/],
      [{ learning_rate: -1e-4 }, /^learning_rate must be in \[0, 1\], got -0.0001$/],
      [{ beta1: 1 }, /^beta1 must be in \[0, 1\), got 1$/],
      [{ beta2: -0.5 }, /^beta2 must be in \[0, 1\)/],
      [{ weight_decay: -1 }, /^weight_decay must be >= 0/],
      [{ grad_clip_norm: -1 }, /^grad_clip_norm must be >= 0/],
    ];
    for (const [opts, msg] of bad) await expect(conn.optimStep(opts), JSON.stringify(opts)).rejects.toThrow(msg);
    // Finite options whose update overflows float32: refused, nothing changed.
    await expect(conn.optimStep({ learning_rate: 1, weight_decay: 1e39 })).rejects.toThrow(/^optim_step would make \S+ -?Infinity; nothing was changed \(learning_rate 1, weight_decay 1e\+39, eps 1e-12\)/);
    expect(Array.from(await probe())).toEqual(Array.from(before));
    // G and D are intact: the next valid step equals the in-process one.
    const o = await conn.optimStep(OPTIM);
    expectNumClose(o.grad_norm, ref.optimStep(adamw).gradNorm);
    expectClose(await probe(), ref.sample(bA, { seed: 1, numSteps: 2 }), undefined, sampleBound(K));
    for (const x of await probe()) expect(Number.isFinite(x)).toBe(true);
    ref.dispose();
    await conn.close();
  });

  it('the futures optim_step and the fine-tune config follow the same rules', async () => {
    const fc = new FuturesClient(server.baseUrl, server.apiKey, 'json');
    const { model_id } = await fc.createModel({ base_model: 'flow05-tiny' });
    await expect(fc.submit('optim_step', { model_id, adam_params: { eps: 0 } })).rejects.toThrow(/HTTP 400: eps must be > 0/);
    const job = await fetch(`${server.baseUrl}/v1/fine-tunes`, {
      method: 'POST', headers: { authorization: `Bearer ${server.apiKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'flow05-tiny', dataset_name: 'x', learning_rate: 0 }),
    });
    expect(job.status).toBe(400);
    expect(((await job.json()) as { error: string }).error).toBe('learning_rate must be > 0 and <= 1, got 0');
    await fc.call('kill_session', { model_id });
  });
});

describe('ops that train refuse a datum without actions, naming it (item 8)', () => {
  it('forward_backward and forward(keep) refuse; forward and sample take it', async () => {
    const client = new VelaClient(server.baseUrl, server.apiKey);
    const conn = await client.connect(await client.waitReady((await client.createSession(SESSION)).id));
    const [d0, d1] = datums(2, 8);
    const noActions = { observation: d1!.observation } as Datum;
    const emptyActions = { ...d1!, actions: ndarray(new Float32Array(0), [0, 6]) } as Datum;
    await expect(conn.forwardBackward([d0!, noActions], { codec: 'RAW' })).rejects.toThrow('data[1] has no "actions": forward_backward needs a target action chunk [H, A] in every datum');
    await expect(conn.forward([noActions], { codec: 'RAW', keep: true })).rejects.toThrow('data[0] has no "actions": forward with keep: true needs');
    await expect(conn.forwardBackward([emptyActions], { codec: 'RAW' })).rejects.toThrow('data[0].actions is empty (shape [0,6])');
    // Nothing was accumulated by the refused requests.
    await expect(conn.optimStep()).rejects.toThrow(/D is 0 after 0 calls/);
    expect((await conn.forward([noActions], { codec: 'RAW' })).velocity.shape).toEqual([1, cfg.horizon, cfg.actionDim]);
    expect((await conn.sample([noActions], { codec: 'RAW', seed: 0, num_steps: 1 })).actions.shape).toEqual([1, cfg.horizon, cfg.actionDim]);
    const fc = new FuturesClient(server.baseUrl, server.apiKey, 'msgpack');
    const { model_id } = await fc.createModel({ base_model: 'flow05-tiny' });
    await expect(fc.submit('forward_backward', { model_id, data: [noActions] })).rejects.toThrow(/HTTP 400: data\[0\] has no "actions"/);
    await fc.call('kill_session', { model_id });
    await conn.close();
  });
});
