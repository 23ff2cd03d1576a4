/**
 * The store, one suite run on both databases (issue 18): SQLite (a temp folder) and PostgreSQL
 * (a throwaway cluster, bench/harness/postgres.ts). Values read back are the values written; the
 * races that matter in a cluster (two nodes appending events to one job, two nodes declaring the
 * same node lost, two nodes migrating at once) are run for real on PostgreSQL.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Store, type JobRow, type SessionRow } from '../server/store/store.ts';
import { isUniqueViolation } from '../server/db/index.ts';
import { postgresSkipReason, startPostgres, type TestPostgres } from '../bench/harness/postgres.ts';
import { missing } from './helpers/requires.ts';

const noPostgres = missing('PostgreSQL (the store tests on PostgreSQL)', postgresSkipReason);
let pgCluster: TestPostgres | null = null;
beforeAll(async () => {
  if (!noPostgres) pgCluster = await startPostgres();
});
afterAll(async () => pgCluster?.stop());

/** A new empty store location of each kind. */
const backends: Record<string, () => Promise<{ dataDir: string; databaseUrl?: string }>> = {
  sqlite: async () => ({ dataDir: fs.mkdtempSync(path.join(os.tmpdir(), 'vela-store-')) }),
  postgres: async () => ({ dataDir: fs.mkdtempSync(path.join(os.tmpdir(), 'vela-store-')), databaseUrl: await pgCluster!.newDatabase() }),
};

const session = (id: string, owner: string, created_at: number, node_id: string | null = null): SessionRow => ({
  id, owner, status: 'starting', created_at, config: { base_model: 'flow05-tiny', rank: 4 }, token: `tok-${id}`, error: null, closed_at: null, node_id, model_name: null,
});
const job = (id: string, owner: string, created_at: number): JobRow => ({
  id, owner, status: 'queued', created_at, config: { model: 'flow05-tiny', steps: 10, learning_rate: 0.003 }, step: 0, loss: null, eval_loss: null,
  error: null, output_dir: `/data/jobs/${id}/weights/final`, started_at: null, finished_at: null, cancel_requested: false,
});
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

for (const [name, location] of Object.entries(backends)) {
  describe(`store on ${name}`, () => {
    let store: Store;
    let where: { dataDir: string; databaseUrl?: string };
    let owner: string;
    const skip = () => name === 'postgres' && !pgCluster;

    beforeAll(async () => {
      if (skip()) return;
      where = await location();
      store = await Store.open(where);
      owner = (await store.createApiKey('owner')).row.id;
    });
    afterAll(async () => store?.close());

    it('migrates to the current schema; reopening changes nothing; a newer schema is refused', async (ctx) => {
      if (skip()) return ctx.skip();
      expect(await store.schemaVersion()).toBe(Store.latestVersion);
      const again = await Store.open(where);
      expect(await again.schemaVersion()).toBe(Store.latestVersion);
      expect(await again.findApiKey('nope')).toBeNull();
      await again.close();
      // A store from a newer Vela: refuse it, naming both versions.
      const other = await location();
      const s = await Store.open(other);
      if (name === 'sqlite') (s.db as any).raw.pragma(`user_version = ${Store.latestVersion + 5}`);
      else await s.db.run('UPDATE vela_schema SET version = ?', [Store.latestVersion + 5]);
      await s.close();
      await expect(Store.open(other)).rejects.toThrow(new RegExp(`schema version ${Store.latestVersion + 5}; this Vela knows up to ${Store.latestVersion}: upgrade Vela`));
    });

    it('keeps only the hash of an API key; ensureApiKey is idempotent', async (ctx) => {
      if (skip()) return ctx.skip();
      const { key, row } = await store.createApiKey('t');
      expect(await store.findApiKey(key)).toBe(row.id);
      expect(await store.findApiKey(key + 'x')).toBeNull();
      const raw = JSON.stringify(await store.db.all('SELECT * FROM api_keys'));
      expect(raw).not.toContain(key);
      expect(raw).toContain(row.prefix);
      const id1 = await store.ensureApiKey('vela-fixed-key-123');
      const id2 = await store.ensureApiKey('vela-fixed-key-123');
      expect(id2).toBe(id1);
      expect(await store.countApiKeys()).toBe(3);
    });

    it('sessions: round trip, newest first (ties by insertion), open counts, orphans, lost nodes', async (ctx) => {
      if (skip()) return ctx.skip();
      await store.insertSession(session('ts-a', owner, 100, 'node-1'));
      await store.insertSession(session('ts-b', owner, 100, 'node-2'));
      await store.insertSession(session('ts-c', owner, 50, 'node-1'));
      expect(await store.getSession('ts-a')).toEqual(session('ts-a', owner, 100, 'node-1'));
      expect(await store.getSession('ts-zz')).toBeNull();
      expect((await store.listSessions(owner)).map((s) => s.id)).toEqual(['ts-b', 'ts-a', 'ts-c']);
      await store.updateSession('ts-a', { status: 'ready' });
      expect(await store.countOpenSessions(owner)).toBe(3);
      expect(Object.fromEntries(await store.openSessionsByNode())).toEqual({ 'node-1': 2, 'node-2': 1 });
      expect((await store.loseNodeSessions('node-1', 'node node-1 was lost')).sort()).toEqual(['ts-a', 'ts-c']);
      const lost = (await store.getSession('ts-a'))!;
      expect([lost.status, lost.error]).toEqual(['lost', 'node node-1 was lost']);
      expect(lost.closed_at).toBeGreaterThan(1_600_000_000);
      expect(await store.loseNodeSessions('node-1', 'again')).toEqual([]);
      expect(await store.closeOrphanSessions('restarted', 'node-3')).toBe(0);
      expect(await store.closeOrphanSessions('restarted')).toBe(1);
      expect((await store.getSession('ts-b'))!.status).toBe('closed');
      expect(await store.countOpenSessions(owner)).toBe(0);
    });

    it('jobs: round trip, conditional transitions, listing by status', async (ctx) => {
      if (skip()) return ctx.skip();
      await store.insertJob(job('ft-1', owner, 10));
      await store.insertJob(job('ft-2', owner, 10));
      expect(await store.getJob('ft-1')).toEqual({ ...job('ft-1', owner, 10), node_id: null });
      await store.updateJob('ft-1', { step: 3, loss: 0.123456789, eval_loss: 1.5, cancel_requested: true });
      const j = (await store.getJob('ft-1'))!;
      expect([j.step, j.loss, j.eval_loss, j.cancel_requested]).toEqual([3, 0.123456789, 1.5, true]);
      // Only one of two nodes moves a queued job to running.
      const claims = await Promise.all([
        store.transitionJob('ft-2', ['queued'], { status: 'running', node_id: 'node-1' }),
        store.transitionJob('ft-2', ['queued'], { status: 'running', node_id: 'node-2' }),
      ]);
      expect(claims.filter(Boolean)).toHaveLength(1);
      expect(await store.transitionJob('ft-2', ['queued'], { status: 'cancelled' })).toBe(false);
      expect((await store.getJob('ft-2'))!.status).toBe('running');
      expect((await store.listJobs(owner)).map((x) => x.id)).toEqual(['ft-2', 'ft-1']);
      expect((await store.listJobs(null, ['running'])).map((x) => x.id)).toEqual(['ft-2']);
      expect([...(await store.runningJobsByNode()).values()]).toEqual([['ft-2']]);
    });

    it('events: contiguous indexes, also when two stores append to one job at once', async (ctx) => {
      if (skip()) return ctx.skip();
      await store.insertJob(job('ft-ev', owner, 20));
      const first = await store.appendEvent('ft-ev', 'status', { status: 'queued' });
      expect(first).toMatchObject({ index: 0, type: 'status', status: 'queued' });
      const second = await Store.open(where); // another node on the same database
      const appends = [];
      for (let i = 0; i < 40; i++) appends.push((i % 2 ? store : second).appendEvent('ft-ev', 'progress', { step: i, loss: i / 10 }));
      const evs = await Promise.all(appends);
      await second.close();
      expect(evs.map((e) => e.index).sort((a, b) => a - b)).toEqual(Array.from({ length: 40 }, (_, i) => i + 1));
      const read = await store.events('ft-ev');
      expect(read.map((e) => e.index)).toEqual(Array.from({ length: 41 }, (_, i) => i));
      expect(read[5]).toEqual(evs.find((e) => e.index === 5));
      expect((await store.events('ft-ev', 39)).map((e) => e.index)).toEqual([39, 40]);
      expect((await store.events('ft-ev', 10, 3)).map((e) => e.index)).toEqual([10, 11, 12]);
    });

    it('nodes: register, heartbeat, lost exactly once, re-register', async (ctx) => {
      if (skip()) return ctx.skip();
      const load = { sessions: 1, jobs: 0, resident_presets: ['flow05-tiny'] };
      await store.registerNode({ id: 'n-a', url: 'http://127.0.0.1:1', presets: ['flow05-tiny'], capacity: 8, load });
      await store.registerNode({ id: 'n-b', url: 'http://127.0.0.1:2', presets: ['flow05-tiny'], capacity: 4, load });
      const a = (await store.getNode('n-a'))!;
      expect(a).toMatchObject({ id: 'n-a', url: 'http://127.0.0.1:1', status: 'up', presets: ['flow05-tiny'], capacity: 8, load, lost_at: null });
      expect(Math.abs(a.heartbeat_at - Date.now())).toBeLessThan(60_000);
      expect(await store.markLostNodes(60_000)).toEqual([]);
      expect(await store.heartbeatNode('n-a', { ...load, sessions: 2 })).toBe(true);
      // n-b's last heartbeat is made 10 minutes old: two nodes check at once, one of them declares it lost.
      await store.db.run('UPDATE nodes SET heartbeat_at = heartbeat_at - 600000 WHERE id = ?', ['n-b']);
      const second = await Store.open(where);
      const [x, y] = await Promise.all([store.markLostNodes(60_000), second.markLostNodes(60_000)]);
      await second.close();
      expect([...x, ...y]).toEqual(['n-b']);
      expect((await store.getNode('n-b'))!.status).toBe('lost');
      expect((await store.getNode('n-a'))!.load.sessions).toBe(2);
      expect(await store.heartbeatNode('n-b', load)).toBe(false); // n-b learns it was declared lost
      expect((await store.listNodes()).map((n) => `${n.id}:${n.status}`)).toEqual(['n-a:up', 'n-b:lost']);
      await store.registerNode({ id: 'n-b', url: 'http://127.0.0.1:3', presets: ['flow05-tiny'], capacity: 4, load });
      expect((await store.getNode('n-b'))!).toMatchObject({ status: 'up', url: 'http://127.0.0.1:3', lost_at: null });
      const ages = await store.heartbeatAges();
      expect(ages.get('n-b')!).toBeGreaterThanOrEqual(0);
      expect(ages.get('n-a')!).toBeGreaterThanOrEqual(0);
    });

    it('sampling and client sessions: stored, read back after reopening, idle ones without an open model pruned', async (ctx) => {
      if (skip()) return ctx.skip();
      const samp = { id: 'samp-1', owner, checkpoint_dir: '/data/checkpoints/x/ts-a/weights/p', checkpoint_id: 'ts-a/weights/p', preset: 'flow05-tiny', created_at: 1_700_000_000 };
      await store.insertSamplingSession(samp);
      await store.insertClientSession({ id: 'sess-old', owner, created_at: 100, last_seen_at: 100, tags: ['arm'], user_metadata: { lab: 'b' } });
      await store.insertClientSession({ id: 'sess-busy', owner, created_at: 100, last_seen_at: 100, tags: [], user_metadata: null });
      await store.insertClientSession({ id: 'sess-new', owner, created_at: 100, last_seen_at: 100, tags: [], user_metadata: null });
      await store.insertSession({ ...session('ts-open', owner, 300), status: 'ready' });
      await store.addClientSessionModel('sess-busy', 'ts-open');
      await store.addClientSessionModel('sess-busy', 'ts-open'); // twice: one link
      await store.db.run('UPDATE client_sessions SET last_seen_at = 100 WHERE id = ?', ['sess-busy']);
      await store.touchClientSession('sess-new');
      const again = await Store.open(where); // a restarted server
      expect(await again.getSamplingSession('samp-1')).toEqual(samp);
      expect(await again.getSamplingSession('samp-2')).toBeNull();
      expect(await again.getClientSession('sess-old')).toEqual({ id: 'sess-old', owner, created_at: 100, last_seen_at: 100, tags: ['arm'], user_metadata: { lab: 'b' }, models: [] });
      expect((await again.getClientSession('sess-busy'))!.models).toEqual(['ts-open']);
      // Seen before 200: sess-old goes; sess-busy stays (an open model), sess-new stays (seen now).
      expect(await again.pruneClientSessions(200)).toBe(1);
      expect(await again.getClientSession('sess-old')).toBeNull();
      expect(await again.getClientSession('sess-new')).not.toBeNull();
      await again.updateSession('ts-open', { status: 'closed' });
      expect(await again.pruneClientSessions(200)).toBe(1);
      expect(await again.getClientSession('sess-busy')).toBeNull();
      expect(await again.db.all('SELECT * FROM client_session_models')).toEqual([]); // links go with their session
      await again.close();
    });

    it('counters for /metrics: failed statements counted (not the unique violations it resolves), held writes back to 0, a refused write not retried', async (ctx) => {
      if (skip()) return ctx.skip();
      const errors = store.db.errorCount();
      await expect(store.db.all('SELECT * FROM no_such_table')).rejects.toThrow(/no_such_table/);
      expect(store.db.errorCount()).toBe(errors + 1);
      await expect(store.createApiKey('dup', 'vela-dup-key-123')).resolves.toBeTruthy();
      await expect(store.createApiKey('dup', 'vela-dup-key-123')).rejects.toSatisfy(isUniqueViolation);
      expect(store.db.errorCount()).toBe(errors + 1);
      let tries = 0;
      const refused = store.db.keep(async () => {
        tries++;
        return store.db.run('INSERT INTO no_such_table VALUES (1)');
      });
      await expect(refused).rejects.toThrow(/no_such_table/);
      expect(tries).toBe(1);
      let open = () => {};
      const gate = new Promise<void>((r) => (open = r));
      const held = store.db.keep(async () => 'stored', gate);
      expect(store.db.bufferedRecords()).toBe(1); // counted from the call, while it waits for the write before it
      open();
      expect(await held).toBe('stored');
      expect(store.db.bufferedRecords()).toBe(0);
    });

    it('notifications reach every listener of the database', async (ctx) => {
      if (skip()) return ctx.skip();
      const second = await Store.open(where);
      const got: string[] = [];
      const stop = await second.db.listen('vela_test', (p) => got.push(p));
      await store.db.notify('vela_test', 'ft-1:7');
      for (let i = 0; i < 100 && got.length === 0; i++) await sleep(20);
      stop();
      await second.close();
      expect(got).toEqual(['ft-1:7']);
    });
  });
}

describe('store on postgres: nodes starting together', () => {
  it('two stores migrating one new database at once both open it at the current version', async (ctx) => {
    if (!pgCluster) return ctx.skip();
    const url = await pgCluster.newDatabase();
    const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-store-'));
    const [a, b] = await Promise.all([Store.open({ dataDir, databaseUrl: url }), Store.open({ dataDir, databaseUrl: url })]);
    expect([await a.schemaVersion(), await b.schemaVersion()]).toEqual([Store.latestVersion, Store.latestVersion]);
    await Promise.all([a.close(), b.close()]);
  });
});
