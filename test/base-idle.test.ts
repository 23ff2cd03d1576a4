/**
 * A real base's memory given back (issue 35, item 4), through the real server and its engines: a
 * closed session leaves its base's engine loaded; `/health` lists it with its idle seconds and
 * when it goes; the idle timer (--base-idle-timeout-s, VELA_BASE_IDLE_TIMEOUT_S) closes it, and the
 * operator's POST /v1/admin/release-idle-bases closes one at once. A base a session still uses
 * is neither listed idle nor closed.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { VelaClient } from '../protocol/client.ts';
import { writeTinyBase } from './helpers/real-pi-base.ts';
import { api, startTestServer, type TestServer } from './helpers/server.ts';

const servers: TestServer[] = [];
const dirs: string[] = [];
afterAll(async () => {
  for (const s of servers) await s.close();
  for (const d of dirs) fs.rmSync(path.dirname(d), { recursive: true, force: true });
});

/** A ready LoRA session on a fresh tiny pi0.5 base; returns its id. */
async function session(server: TestServer, base: string): Promise<string> {
  const client = new VelaClient(server.baseUrl, server.apiKey);
  return (await client.waitReady((await client.createSession({ base_model: 'pi05', base } as never)).id)).id;
}

const health = async (server: TestServer) => (await api(server, 'GET', '/health', undefined, null)).json;

describe('idle real bases are closed', () => {
  it('by the idle timer: listed in /health while idle, with release_in_s; gone once closed; in use, neither', async () => {
    const server = await startTestServer({ env: { VELA_BASE_IDLE_TIMEOUT_S: '2' } });
    servers.push(server);
    const base = await writeTinyBase('pi05');
    dirs.push(base);
    const id = await session(server, base);
    const inUse = await health(server);
    expect(inUse.base_idle_timeout_s).toBe(2);
    expect(inUse.bases).toEqual([expect.objectContaining({ name: 'pi05', idle_s: null, release_in_s: null })]);

    expect((await api(server, 'POST', `/v1/training_sessions/${id}/close`)).status).toBe(200);
    const idle = await health(server);
    expect(idle.bases).toHaveLength(1);
    expect(idle.bases[0].name).toBe('pi05');
    expect(idle.bases[0].idle_s).toBeGreaterThanOrEqual(0);
    expect(idle.bases[0].release_in_s).toBeLessThanOrEqual(2);
    // Closed within a quarter of the timeout past it; polled, as the sweep runs on its own timer.
    let now = idle;
    for (let i = 0; i < 200 && now.bases.length > 0; i++) {
      await new Promise((r) => setTimeout(r, 100));
      now = await health(server);
    }
    expect(now.bases).toEqual([]);
  });

  it('by the operator route at once, with the timer at its default; a base still in use stays', async () => {
    const server = await startTestServer();
    servers.push(server);
    expect((await health(server)).base_idle_timeout_s).toBe(300);
    const base = await writeTinyBase('pi05');
    dirs.push(base);
    const id = await session(server, base);
    // In use: the route closes nothing.
    expect((await api(server, 'POST', '/v1/admin/release-idle-bases')).json).toEqual({ closed: [], count: 0 });
    expect((await health(server)).bases).toHaveLength(1);
    await api(server, 'POST', `/v1/training_sessions/${id}/close`);
    expect((await health(server)).bases[0].release_in_s).toBeGreaterThan(290);
    expect((await api(server, 'POST', '/v1/admin/release-idle-bases', undefined, null)).status).toBe(401);
    expect((await api(server, 'POST', '/v1/admin/release-idle-bases')).json).toEqual({ closed: ['pi05'], count: 1 });
    expect((await health(server)).bases).toEqual([]);
    // The next session on that base loads it again.
    await session(server, base);
    expect((await health(server)).bases).toEqual([expect.objectContaining({ name: 'pi05', idle_s: null })]);
  });
});
