/**
 * Graphs as users run them: the same session through two real servers (uWS, the engine worker,
 * the real engine), one making graphs (the default on native TensorFlow) and one with
 * VELA_GRAPHS=0, driven by the TypeScript client with G1 frames: forward_backward's losses, the
 * gradient norms and the samples agree to float32 rounding, and the session info says which path
 * each engine took. Native TensorFlow only (CI always has it: kernels-backend.test.ts).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { relDiff } from './helpers/float32.ts';
import { VelaClient, type Datum } from '../protocol/client.ts';
import { g1Datums } from '../bench/harness/g1.ts';
import { startTestServer, type TestServer } from './helpers/server.ts';
import { NATIVE_PRESENT } from './helpers/tf.ts';

const servers: TestServer[] = [];
let batches: Datum[][];

/** Runs a seeded full fine-tune session on a fresh server: losses, grad norms, a sample, its info. */
async function runSession(graphs: boolean) {
  // An engine worker copies the environment when it starts, which is at the first session.
  const before = process.env.VELA_GRAPHS;
  process.env.VELA_GRAPHS = graphs ? '1' : '0';
  try {
    const server = await startTestServer();
    servers.push(server);
    const client = new VelaClient(server.baseUrl, server.apiKey);
    const s = await client.waitReady((await client.createSession({ base_model: 'flow05-tiny', finetune: 'full', seed: 3 })).id);
    const conn = await client.connect(s);
    const losses: number[] = [];
    const norms: number[] = [];
    const samples: Float32Array[] = [];
    for (let step = 0; step < 3; step++) {
      losses.push((await conn.forwardBackward(batches[step % 2]!, { codec: 'JPEG' })).loss);
      norms.push((await conn.optimStep({ learning_rate: 1e-3 })).grad_norm);
      samples.push((await conn.sample(batches[0]!.slice(0, 1), { codec: 'JPEG', seed: 7 })).actions.data as Float32Array);
    }
    return { losses, norms, samples, device: String(conn.info.backend_device) };
  } finally {
    if (before === undefined) delete process.env.VELA_GRAPHS;
    else process.env.VELA_GRAPHS = before;
  }
}


describe.runIf(NATIVE_PRESENT)('graphs through the real server', () => {
  beforeAll(async () => {
    batches = [await g1Datums(4, { episode: 0 }), await g1Datums(4, { episode: 0, offset: 0.5 })];
  });
  afterAll(async () => {
    for (const s of servers) await s.close();
  });

  it('a session trains and samples the same with graphs and without', async () => {
    const graph = await runSession(true);
    const eager = await runSession(false);
    expect(graph.device).toMatch(/graphs on/);
    expect(eager.device).toMatch(/graphs off \(VELA_GRAPHS=0\)/);
    for (let k = 0; k < 3; k++) {
      expect(Math.abs(graph.losses[k]! - eager.losses[k]!)).toBeLessThan(1e-4 * eager.losses[k]!);
      expect(Math.abs(graph.norms[k]! - eager.norms[k]!)).toBeLessThan(1e-4 * eager.norms[k]!);
      // After AdamW steps the two paths' weights differ by more than one rounding (see graphs.test.ts).
      expect(relDiff(graph.samples[k]!, eager.samples[k]!)).toBeLessThan(k === 0 ? 1e-4 : 3e-3);
    }
    // The samples follow the training: a baked-in weight would leave them unchanged.
    expect(relDiff(graph.samples[2]!, graph.samples[0]!)).toBeGreaterThan(1e-3);
  });
});
