/**
 * A PostgreSQL outage in the middle of a fine-tune (issue 22, item 11): the real server on a
 * throwaway PostgreSQL cluster (bench/harness/postgres.ts) trains a job; the database is stopped
 * (pg_ctl stop -m fast: every connection is dropped) and started again on the same port while the
 * job trains. Nothing made meanwhile may be lost: the job's events are contiguous, every step's
 * progress record and every checkpoint record is stored, and the job succeeds. Records held for
 * the database are bounded (--db-buffer-records): at the bound the job pauses instead of dropping.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, startTestServer, type TestServer } from './helpers/server.ts';
import { g1Subset } from '../bench/harness/g1.ts';
import { postgresSkipReason, startPostgres, type TestPostgres } from '../bench/harness/postgres.ts';
import { missing } from './helpers/requires.ts';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

// One episode: the job's first steps decode the frames it trains on (seconds an episode), before
// the outage; no check here depends on how many episodes there are.
const SUBSET = g1Subset(1);
const noPostgres = missing('PostgreSQL (the outage test)', postgresSkipReason);
/** Small, so that the outage reaches the bound after a few steps and the pause is seen. */
const BUFFER_RECORDS = 12;
let pg: TestPostgres | null = null;
let server: TestServer;

beforeAll(async () => {
  if (noPostgres) return;
  pg = (await startPostgres())!;
  server = await startTestServer({
    env: {
      VELA_DATABASE_URL: await pg.newDatabase(), VELA_STORAGE_DIR: fs.mkdtempSync(path.join(os.tmpdir(), 'vela-outage-')), VELA_NODE_ID: 'outage',
      VELA_DATASETS_DIR: SUBSET.root, VELA_NODE_HEARTBEAT_S: '0.5', VELA_NODE_LOST_S: '3', VELA_DB_BUFFER_RECORDS: String(BUFFER_RECORDS),
    },
  });
}, 120_000);

afterAll(async () => {
  await pg?.resume().catch(() => undefined); // when a failure left it stopped
  await server?.close();
  await pg?.stop();
});

async function waitFor<T>(what: string, fn: () => Promise<T | null | undefined | false> | T | null | undefined | false, timeoutMs = 180_000): Promise<T> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (performance.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

// No evaluation, batch 2: steps of a fraction of a second on a 2-core host. The outage is the
// issue's 20 s, and at least until the held records reach the bound (about ten steps and two
// checkpoints) plus 3 s of the job paused at it: on a fast host the bound is reached within a few
// seconds and the job waits out the rest paused (which is what the bound is for); on a slow one
// the outage stretches until several steps and a checkpoint were made during it. 24 steps: the
// bound is reached by about step 14, and the job still has steps to make after the outage.
// About 30 s in all.
const OUTAGE_MS = 20_000;
const STEPS = 24;
const CHECKPOINT_EVERY = 4;
const job = { model: 'flow05-tiny', dataset_name: SUBSET.name, steps: STEPS, batch_size: 2, learning_rate: 3e-3, eval_fraction: 0, checkpoint_every: CHECKPOINT_EVERY };

describe('a PostgreSQL outage during a job', () => {
  it('loses no record: events contiguous, every progress and checkpoint record stored, the job succeeds; the held records stay bounded', async (ctx) => {
    if (!pg) return ctx.skip();
    const db = server.store.db;
    const { status, json } = await api(server, 'POST', '/v1/fine-tunes', job);
    expect(status, JSON.stringify(json)).toBe(200);
    const id = json.id as string;
    await waitFor('step 2', async () => (await api(server, 'GET', `/v1/fine-tunes/${id}`)).json.step >= 2);
    const errorsBefore = db.errorCount();

    await pg.pause();
    const downAt = Date.now() / 1000;
    // Generous: about ten steps. Without holding, records are lost instead, and this times out.
    await waitFor(`${BUFFER_RECORDS} records held`, () => db.bufferedRecords() >= BUFFER_RECORDS, 90_000);
    // At the bound the job pauses at its next step: the held records grow by at most one step's (progress + checkpoint log).
    let most = 0;
    const until = Math.max(Date.now() + 3000, downAt * 1000 + OUTAGE_MS);
    while (Date.now() < until) {
      most = Math.max(most, db.bufferedRecords());
      await new Promise((r) => setTimeout(r, 50));
    }
    expect(most).toBeLessThanOrEqual(BUFFER_RECORDS + 2);
    // A read meanwhile is a 503 the client may retry, not a 500.
    const read = await api(server, 'GET', `/v1/fine-tunes/${id}`);
    expect(read).toEqual({ status: 503, json: { error: 'the database is unavailable right now; try again in a few seconds' } });
    await pg.resume();
    const upAt = Date.now() / 1000;

    const done = await waitFor('the job to end', async () => {
      const j = (await api(server, 'GET', `/v1/fine-tunes/${id}`)).json;
      return ['succeeded', 'failed', 'cancelled'].includes(j.status) ? j : null;
    });
    expect(done).toMatchObject({ status: 'succeeded', step: STEPS });
    await waitFor('no record held', () => db.bufferedRecords() === 0);
    expect(db.errorCount()).toBeGreaterThan(errorsBefore); // the outage's failed statements are counted

    const events = (await api(server, 'GET', `/v1/fine-tunes/${id}/events`)).json.data as any[];
    expect(events.map((e) => e.index)).toEqual(events.map((_, i) => i)); // contiguous from 0
    const progress = events.filter((e) => e.type === 'progress');
    expect(progress.map((e) => e.step)).toEqual(Array.from({ length: STEPS }, (_, i) => i + 1));
    const checkpoints = events.filter((e) => e.type === 'log' && /^checkpoint written at step \d+/.test(e.message)).map((e) => Number(/step (\d+)/.exec(e.message)![1]));
    expect(checkpoints).toEqual(Array.from({ length: STEPS / CHECKPOINT_EVERY - 1 }, (_, i) => (i + 1) * CHECKPOINT_EVERY));
    expect(events.at(-1)).toMatchObject({ type: 'status', status: 'succeeded' });
    // The outage did cover several steps and a checkpoint: records made while the database was down.
    const during = events.filter((e) => e.timestamp > downAt && e.timestamp < upAt);
    console.log(`outage ${(upAt - downAt).toFixed(1)} s: ${during.length} records made during it (${during.filter((e) => e.type === 'progress').length} steps), at most ${most} held; ${db.errorCount() - errorsBefore} failed statements; ${Math.round(JSON.stringify(during).length / during.length)} bytes of JSON per record`);
    expect(during.filter((e) => e.type === 'progress').length).toBeGreaterThanOrEqual(5);
    expect(during.some((e) => e.type === 'log' && /^checkpoint written/.test(e.message))).toBe(true);
    // Records are stored in the order they were made.
    const times = events.map((e) => e.timestamp);
    expect(times).toEqual([...times].sort((a, b) => a - b));
  }, 240_000);
});
