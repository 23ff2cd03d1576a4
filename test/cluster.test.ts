/**
 * Two Vela nodes on one PostgreSQL and one shared storage folder (issue 18), as two real
 * `vela serve` processes, so that `kill -9` is real:
 * - jobs: 4 fine-tunes submitted to node A run on both nodes; the node running one is killed
 *   mid-training; the other resumes it from its last checkpoint, it succeeds, its event log is
 *   contiguous with a `resumed` event naming both nodes, and SSE from either node delivers every
 *   event once. Both nodes serve the finished job's policy (over the websocket and HTTP), with the
 *   same actions.
 * - sessions: 8 sessions created through node A land on both nodes and each trains over its
 *   websocket; futures requests sent to the node that does not hold the model are answered; a
 *   killed node's sessions become `lost` within the heartbeat setting; a new session loads a
 *   lost session's last checkpoint and takes exactly the step the old one would have.
 * Tiny steps (flow05-tiny, batch 2) on a one-episode dataset keep it to about a minute on two cores.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { VelaClient, type SessionJson } from '../protocol/client.ts';
import { packNumpy, unpackNumpy, type NDArray } from '../protocol/ndarray.ts';
import { api, TEST_KEY } from './helpers/server.ts';
import { g1Datums, g1Subset } from '../bench/harness/g1.ts';
import { NodeProc } from '../bench/harness/node-proc.ts';
import { PolicyClient } from '../bench/harness/policy-stub.ts';
import { readSse } from './helpers/sse.ts';
import { postgresSkipReason, startPostgres, type TestPostgres } from '../bench/harness/postgres.ts';
import { missing } from './helpers/requires.ts';

// One episode: each fresh node decodes the frames it trains on (seconds an episode, in its first
// steps), and no check here depends on how many episodes there are.
const SUBSET = g1Subset(1);
const HEARTBEAT_S = 0.5;
const LOST_S = 3;
let pg: TestPostgres | null = null;
let databaseUrl = '';
const storageDir = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-shared-'));
const nodes: Record<string, NodeProc> = {};

const startNode = (id: string) =>
  NodeProc.start({
    VELA_DATABASE_URL: databaseUrl, VELA_STORAGE_DIR: storageDir, VELA_DATA_DIR: fs.mkdtempSync(path.join(os.tmpdir(), `vela-node-${id}-`)),
    VELA_NODE_ID: id, VELA_API_KEY: TEST_KEY, VELA_DATASETS_DIR: SUBSET.root, VELA_NODE_HEARTBEAT_S: String(HEARTBEAT_S), VELA_NODE_LOST_S: String(LOST_S),
    VELA_SESSIONS_PER_KEY: '16', VELA_NODE_SESSIONS: '8',
  }).then((n) => (nodes[id] = n));

/**
 * Poll `fn` until it returns a value. On a timeout the error says what `explain` finds (job
 * states, the nodes' logs), so a red CI run can be read without rerunning it. The clock is
 * monotonic: a host that pauses or steps its wall clock does not end the wait early.
 */
async function waitFor<T>(what: string, fn: () => Promise<T | null | undefined | false>, timeoutMs = 240_000, pollMs = 100, explain?: () => Promise<string>): Promise<T> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (performance.now() > deadline) {
      const why = explain ? await explain().catch((e) => `(could not explain: ${(e as Error).message})`) : '';
      throw new Error(`timed out waiting for ${what} (${timeoutMs / 1000} s)${why ? `\n${why}` : ''}`);
    }
    await new Promise((r) => setTimeout(r, pollMs));
  }
}

/** Where each job stands (status, node, step, its last events) and the tail of each node's log. */
async function jobsReport(ids: string[]): Promise<string> {
  const lines: string[] = [];
  for (const id of ids) {
    const { json: j } = await api(nodes.a!, 'GET', `/v1/fine-tunes/${id}`);
    const { json: ev } = await api(nodes.a!, 'GET', `/v1/fine-tunes/${id}/events`);
    lines.push(`${id}: ${j.status} on ${j.node} at step ${j.step}`);
    for (const e of (ev.data as any[]).slice(-4)) lines.push(`  ${new Date(e.timestamp * 1000).toISOString()} ${e.type} ${e.status ?? e.step ?? ''} ${e.message ?? e.error ?? ''}`);
  }
  for (const [id, n] of Object.entries(nodes)) lines.push(`node ${id}: ${n.report()}`);
  return lines.join('\n');
}

const noPostgres = missing('PostgreSQL (the cluster tests)', postgresSkipReason);

beforeAll(async () => {
  if (noPostgres) return;
  pg = (await startPostgres())!;
  databaseUrl = await pg.newDatabase();
  await Promise.all([startNode('a'), startNode('b')]);
});

afterAll(async () => {
  await Promise.all(Object.values(nodes).map((n) => n.kill9()));
  await pg?.stop();
  fs.rmSync(storageDir, { recursive: true, force: true });
});

// No held-out evaluation: scoring ~100 held-out frames was half of each job's time here, and
// evaluation has its own tests (finetune-settings, jobs); on a loaded 2-core CI host it made this test slow.
const job = { model: 'flow05-tiny', dataset_name: SUBSET.name, steps: 12, batch_size: 2, learning_rate: 3e-3, eval_fraction: 0, checkpoint_every: 3 };

describe('two nodes, one PostgreSQL, one shared folder', () => {
  it('lists both nodes as up', async (ctx) => {
    if (!pg) return ctx.skip();
    const { status, json } = await api(nodes.a!, 'GET', '/v1/nodes');
    expect(status).toBe(200);
    expect(json.data.map((n: any) => `${n.id}:${n.status}`).sort()).toEqual(['a:up', 'b:up']);
    expect(json.data.find((n: any) => n.id === 'b').url).toBe(nodes.b!.baseUrl);
    expect(json.data.find((n: any) => n.id === 'a').self).toBe(true);
  });

  it('runs 4 jobs submitted to A on both nodes; a node killed mid-job is resumed from its checkpoint on the other, events contiguous, SSE from either node complete', async (ctx) => {
    if (!pg) return ctx.skip();
    // Decoding the G1 frame for the policy check takes seconds: begun now, it overlaps the jobs.
    const datumP = g1Datums(1);
    datumP.catch(() => undefined); // awaited below; not an unhandled rejection meanwhile
    const ids: string[] = [];
    for (let i = 0; i < 4; i++) {
      const { status, json } = await api(nodes.a!, 'POST', '/v1/fine-tunes', { ...job, seed: i });
      expect(status, JSON.stringify(json)).toBe(200);
      ids.push(json.id);
    }
    // Both nodes take a job; wait until B's is past a checkpoint, then kill B.
    const running = await waitFor('both nodes running a job', async () => {
      const js = await Promise.all(ids.map(async (id) => (await api(nodes.a!, 'GET', `/v1/fine-tunes/${id}`)).json));
      const onB = js.find((j) => j.node === 'b' && j.status === 'running' && j.step >= 4);
      return onB && js.some((j) => j.node === 'a' && j.status === 'running') ? onB : null;
    }, 240_000, 100, () => jobsReport(ids));
    const victim = running.id as string;
    // An SSE reader on A follows B's job through the kill.
    const sseOnA = readSse(nodes.a!, victim);
    await waitFor('the SSE reader on A to catch up', async () => (await api(nodes.a!, 'GET', `/v1/fine-tunes/${victim}`)).json.step >= running.step + 1);
    const killedAt = Date.now();
    await nodes.b!.kill9();
    // A declares B lost within the setting (plus a heartbeat) and, when free, resumes the job.
    const lost = await waitFor('B to be declared lost', async () => (await api(nodes.a!, 'GET', '/v1/nodes')).json.data.find((n: any) => n.id === 'b' && n.status === 'lost'), 30_000, 50);
    expect(Date.now() - killedAt).toBeLessThan((LOST_S + 2 * HEARTBEAT_S + 10) * 1000); // the setting, a heartbeat, and room for a loaded host
    expect(lost.lost_at).toBeGreaterThan(0);
    // B comes back (a new process, same id) and takes part again.
    await waitFor('a resumed event', async () => (await api(nodes.a!, 'GET', `/v1/fine-tunes/${victim}/events`)).json.data.some((e: any) => e.type === 'resumed'), 240_000, 100, () => jobsReport(ids));
    await startNode('b');
    const done = await waitFor('every job to end', async () => {
      const js = await Promise.all(ids.map(async (id) => (await api(nodes.a!, 'GET', `/v1/fine-tunes/${id}`)).json));
      return js.every((j) => ['succeeded', 'failed', 'cancelled'].includes(j.status)) ? js : null;
    }, 240_000, 100, () => jobsReport(ids));
    expect(done.map((j) => j.status)).toEqual(['succeeded', 'succeeded', 'succeeded', 'succeeded']);

    const { json: all } = await api(nodes.b!, 'GET', `/v1/fine-tunes/${victim}/events`);
    const events = all.data as any[];
    expect(events.map((e) => e.index)).toEqual(events.map((_, i) => i));
    const resumed = events.filter((e) => e.type === 'resumed');
    expect(resumed).toHaveLength(1);
    expect(resumed[0]).toMatchObject({ from_node: 'b', to_node: 'a' });
    const from = Number(/resumed from the checkpoint at step (\d+)/.exec(events.find((e) => e.index > resumed[0].index && /resumed from the checkpoint/.test(e.message ?? ''))!.message)![1]);
    expect(from % 3).toBe(0);
    expect(from).toBeGreaterThanOrEqual(3);
    const after = events.filter((e) => e.type === 'progress' && e.index > resumed[0].index).map((e) => e.step);
    expect(after).toEqual(Array.from({ length: 12 - from }, (_, i) => from + 1 + i));
    expect(events.at(-1)).toMatchObject({ type: 'status', status: 'succeeded' });
    // Both nodes ran jobs.
    const ranOn = new Set<string>();
    for (const id of ids) for (const e of (await api(nodes.a!, 'GET', `/v1/fine-tunes/${id}/events`)).json.data) if (e.type === 'status' && e.node) ranOn.add(e.node);
    expect([...ranOn].sort()).toEqual(['a', 'b']);
    // SSE: the reader on A (open through the kill) and a new one on B each got every event once.
    expect(await sseOnA).toEqual(events);
    expect(await readSse(nodes.b!, victim)).toEqual(events);

    // The resumed job's policy from either node (each loads the weights from the shared folder):
    // the same observation and seed give the same actions on both.
    const datum = (await datumP)[0]!;
    const obs = { 'observation/image': datum.observation.image!.cam_high, 'observation/state': datum.observation.state, prompt: datum.observation.prompt, image_codec: 'JPEG', seed: 7 };
    const infer = async (node: NodeProc) => {
      const res = await fetch(`${node.baseUrl}/v1/fine-tunes/${victim}/infer`, {
        method: 'POST', headers: { authorization: `Bearer ${TEST_KEY}`, 'content-type': 'application/msgpack' }, body: packNumpy(obs),
      });
      const bytes = new Uint8Array(await res.arrayBuffer());
      expect(res.status, Buffer.from(bytes).toString()).toBe(200);
      return unpackNumpy(bytes) as { actions: NDArray; cold_start: boolean };
    };
    // A robot's first contact with that policy on B is its websocket (OpenPI's protocol).
    const robot = await PolicyClient.connect(`${nodes.b!.baseUrl.replace('http', 'ws')}/v1/fine-tunes/${victim}/policy`, { authorization: `Api-Key ${TEST_KEY}` });
    const { 'observation/image': image, 'observation/state': state, prompt } = obs;
    const overWs = await robot.infer({ 'observation/image': image, 'observation/state': state, prompt, image_codec: 'JPEG' }).catch((e: Error) => {
      throw new Error(`${e.message}\n${nodes.b!.report()}`);
    });
    robot.close();
    expect(overWs.actions.shape).toEqual([16, 26]);
    expect([...(overWs.actions.data as Float32Array)].every(Number.isFinite)).toBe(true);
    const [onA, onB] = [await infer(nodes.a!), await infer(nodes.b!)];
    expect(onB.actions.shape).toEqual([16, 26]);
    expect([...(onB.actions.data as Float32Array)].every(Number.isFinite)).toBe(true);
    expect([...(onB.actions.data as Float32Array)]).toEqual([...(onA.actions.data as Float32Array)]);
  });

  it('places 8 sessions made through A on both nodes; each trains; futures to the wrong node are answered; a killed node\'s sessions are lost and one continues on the other node from its checkpoint', async (ctx) => {
    if (!pg) return ctx.skip();
    const clientA = new VelaClient(nodes.a!.baseUrl, TEST_KEY);
    const post = (node: string, route: string, body: unknown) => api(nodes[node]!, 'POST', `/api/v1/${route}`, body);
    const created: SessionJson[] = [];
    for (let i = 0; i < 8; i++) {
      if (i !== 1) {
        created.push(await clientA.createSession({ base_model: 'flow05-tiny', rank: 4, seed: i }));
        continue;
      }
      // The second through the futures API: A holds one session now, so placement picks B and A forwards.
      const m = await post('a', 'create_model', { base_model: 'flow05-tiny', rank: 4, seed: i });
      expect(m.status, JSON.stringify(m.json)).toBe(200);
      expect(m.json.request_id).toMatch(/^req-b~/);
      created.push(await clientA.getSession(m.json.model_id));
    }
    const byNode = (n: string) => created.filter((s) => s.node === n);
    expect(byNode('a')).toHaveLength(4);
    expect(byNode('b')).toHaveLength(4);
    for (const s of created) expect(s.url.startsWith(nodes[s.node as string]!.baseUrl.replace('http', 'ws'))).toBe(true);

    const data = await g1Datums(2);
    const [d1, d2, d3] = [[data[0]!], [data[1]!], [data[0]!, data[1]!]];
    const conns = await Promise.all(created.map(async (s) => clientA.connect(await clientA.waitReady(s.id))));
    const losses = await Promise.all(conns.map(async (c) => (await c.forwardBackward(d1, { codec: 'JPEG' })).loss));
    for (const c of conns) await c.optimStep({ learning_rate: 1e-3 });
    expect(losses.every((l) => Number.isFinite(l) && l > 0)).toBe(true);

    // Futures for a model on B, sent to A: forwarded, and the request id names B.
    const onB = byNode('b')[0]!;
    const wire = { data: d2.map((d) => ({ observation: { image: { cam_high: Buffer.from(d.observation.image!.cam_high as Uint8Array).toString('base64') }, state: Array.from(d.observation.state!.data as Float32Array), prompt: d.observation.prompt }, actions: { data: Array.from(d.actions!.data as Float32Array), dtype: 'float32', shape: d.actions!.shape } })), codec: 'JPEG' };
    const fwd = await post('a', 'forward', { model_id: onB.id, ...wire });
    expect(fwd.status, JSON.stringify(fwd.json)).toBe(200);
    expect(fwd.json.request_id).toMatch(/^req-b~/);
    const got = await post('a', 'retrieve_future', { request_id: fwd.json.request_id });
    expect(got.status).toBe(200);
    expect(got.json.velocity.shape).toEqual([1, 16, 32]);
    expect((await post('b', 'retrieve_future', { request_id: fwd.json.request_id })).json).toEqual(got.json);
    const info = await api(nodes.a!, 'GET', `/v1/training_sessions/${onB.id}`);
    expect(info.json).toMatchObject({ node: 'b', ops_count: 3, status: 'ready' });

    // The old session on B saves its state, then takes a step: the step a successor must repeat.
    const old = conns[created.indexOf(onB)]!;
    await old.saveState('ck1');
    const expected = await old.forwardBackward(d3, { codec: 'JPEG' });
    const expectedOpt = await old.optimStep({ learning_rate: 1e-3 });
    const expectedNext = await old.forwardBackward(d1, { codec: 'JPEG' });

    const killedAt = Date.now();
    await nodes.b!.kill9();
    const lostRow = await waitFor('B\'s sessions to be lost', async () => {
      const s = await clientA.getSession(onB.id).catch(() => null);
      return s?.status === 'lost' ? s : null;
    }, 30_000, 50);
    expect(Date.now() - killedAt).toBeLessThan((LOST_S + 2 * HEARTBEAT_S + 10) * 1000); // the setting, a heartbeat, and room for a loaded host
    expect(lostRow.error).toMatch(/node b was lost \(no heartbeat for 3 s\)/);
    for (const s of byNode('b')) expect((await clientA.getSession(s.id)).status).toBe('lost');
    for (const s of byNode('a')) expect((await clientA.getSession(s.id)).status).toBe('ready');
    // Requests for a lost model say so.
    expect((await post('a', 'forward', { model_id: onB.id, ...wire })).json.error).toMatch(/is lost: node b was lost/);

    // A new session (on A, the node left) continues from the lost session's checkpoint.
    const successor = await clientA.createSession({ base_model: 'flow05-tiny', rank: 4, seed: 99 });
    expect(successor.node).toBe('a');
    const conn = await clientA.connect(await clientA.waitReady(successor.id));
    await conn.loadCheckpoint(`${onB.id}/states/ck1`);
    const step = await conn.forwardBackward(d3, { codec: 'JPEG' });
    expect(step.loss).toBe(expected.loss);
    expect([...(step.loss_per_datum.data as Float32Array)]).toEqual([...(expected.loss_per_datum.data as Float32Array)]);
    const opt = await conn.optimStep({ learning_rate: 1e-3 });
    expect(opt.grad_norm).toBe(expectedOpt.grad_norm);
    expect((await conn.forwardBackward(d1, { codec: 'JPEG' })).loss).toBe(expectedNext.loss);
    await expect(conn.loadCheckpoint(`${onB.id}/states/nope`)).rejects.toThrow(/no saved state .*nope/);
    for (const c of [...conns, conn]) await c.close().catch(() => undefined);
  });

  it('a node stopped gracefully (SIGTERM, a rolling restart) mid-job hands the job to the other node, which resumes it from its checkpoint', async (ctx) => {
    if (!pg) return ctx.skip();
    await startNode('b'); // killed by the test before
    await waitFor('B to be up', async () => (await api(nodes.a!, 'GET', '/v1/nodes')).json.data.some((n: any) => n.id === 'b' && n.status === 'up'));
    const ids: string[] = [];
    for (let i = 0; i < 2; i++) ids.push((await api(nodes.a!, 'POST', '/v1/fine-tunes', { ...job, seed: 10 + i })).json.id);
    const onB = await waitFor('a job on B past its first checkpoint', async () => {
      const js = await Promise.all(ids.map(async (id) => (await api(nodes.a!, 'GET', `/v1/fine-tunes/${id}`)).json));
      return js.find((j) => j.node === 'b' && j.status === 'running' && j.step >= 4);
    }, 240_000, 100, () => jobsReport(ids));
    await nodes.b!.stop(); // SIGTERM; SIGKILL only after 30 s
    expect(nodes.b!.child.exitCode, nodes.b!.stderr.slice(-2000)).toBe(0);
    expect((await api(nodes.a!, 'GET', '/v1/nodes')).json.data.find((n: any) => n.id === 'b').status).toBe('stopped');
    const done = await waitFor('both jobs to end', async () => {
      const js = await Promise.all(ids.map(async (id) => (await api(nodes.a!, 'GET', `/v1/fine-tunes/${id}`)).json));
      return js.every((j) => ['succeeded', 'failed', 'cancelled'].includes(j.status)) ? js : null;
    }, 240_000, 100, () => jobsReport(ids));
    expect(done.map((j) => j.status)).toEqual(['succeeded', 'succeeded']);
    const events = (await api(nodes.a!, 'GET', `/v1/fine-tunes/${onB.id}/events`)).json.data as any[];
    expect(events.map((e) => e.index)).toEqual(events.map((_, i) => i));
    const handOff = events.findIndex((e) => /^server shutting down at step \d+; the job resumes from its last checkpoint on another node$/.test(e.message ?? ''));
    expect(handOff, JSON.stringify(events.slice(-8))).toBeGreaterThan(0);
    const resumed = events.filter((e) => e.type === 'resumed');
    expect(resumed).toHaveLength(1);
    expect(resumed[0]).toMatchObject({ from_node: 'b', to_node: 'a' });
    expect(resumed[0].index).toBeGreaterThan(handOff);
    const from = Number(/resumed from the checkpoint at step (\d+)/.exec(events.find((e) => e.index > resumed[0].index && /resumed from the checkpoint/.test(e.message ?? ''))!.message)![1]);
    const after = events.filter((e) => e.type === 'progress' && e.index > resumed[0].index).map((e) => e.step);
    expect(after).toEqual(Array.from({ length: 12 - from }, (_, i) => from + 1 + i));
    expect(events.at(-1)).toMatchObject({ type: 'status', status: 'succeeded' });
  });
});
