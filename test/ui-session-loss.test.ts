/**
 * The dashboard's session page shows a loss curve like a job's (issue 35, item 11d): a real
 * server, a flow05-tiny session driven over its websocket, `recent_losses` in its REST JSON (each
 * forward_backward's loss as answered, numbered from 1), and the page `#/sessions/<id>` in
 * headless Chromium drawing one point per forward_backward, a new one as the client trains on.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chromium, type BrowserContext } from 'playwright-core';
import { VelaClient, type SessionConnection } from '../protocol/client.ts';
import { buildUi } from '../scripts/build-ui.ts';
import { num } from '../ui/src/format.ts';
import { g1Datums } from '../bench/harness/g1.ts';
import { api, startTestServer, TEST_KEY, type TestServer } from './helpers/server.ts';
import { chromiumPath, missing } from './helpers/requires.ts';

const CHROMIUM = chromiumPath();
const CHROMIUM_ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
  '--disable-component-update', '--disable-sync'];

let server: TestServer;
let context: BrowserContext;
let profileDir: string;
let conn: SessionConnection;

describe.skipIf(missing('Chromium', CHROMIUM.reason))('the session page: a live loss curve', () => {
  beforeAll(async () => {
    await buildUi();
    server = await startTestServer();
    profileDir = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-chromium-'));
    context = await chromium.launchPersistentContext(profileDir, { executablePath: CHROMIUM.path, headless: true, args: CHROMIUM_ARGS, viewport: { width: 1366, height: 900 } });
  }, 240_000);
  afterAll(async () => {
    await conn?.close();
    await context?.close();
    await server?.close();
    if (profileDir) fs.rmSync(profileDir, { recursive: true, force: true });
  });

  it('recent_losses in the session JSON; #/sessions/<id> draws them and gains a point per forward_backward', async () => {
    const client = new VelaClient(server.baseUrl, server.apiKey);
    const s = await client.waitReady((await client.createSession({ base_model: 'flow05-tiny' })).id);
    conn = await client.connect(s);
    const batch = await g1Datums(2, { episode: 0 });
    const losses: number[] = [];
    for (let i = 0; i < 3; i++) losses.push((await conn.forwardBackward(batch, { codec: 'JPEG' })).loss);
    await conn.optimStep({ learning_rate: 1e-4 });
    const json = (await api(server, 'GET', `/v1/training_sessions/${s.id}`)).json;
    expect(json.recent_losses).toEqual(losses.map((loss, i) => ({ n: i + 1, loss })));

    const pageErrors: string[] = [];
    const page = await context.newPage();
    page.on('pageerror', (e) => pageErrors.push(e.message));
    await page.goto(`${server.baseUrl}/ui/`);
    await page.getByLabel('API key').fill(TEST_KEY);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('link', { name: 'Sessions' }).click();
    // The id in the sessions table links to the session's page.
    await page.getByRole('link', { name: `Session ${s.id}: status and loss curve` }).click();
    await expect.poll(() => new URL(page.url()).hash).toBe(`#/sessions/${s.id}`);
    const chart = page.locator('#chart-loss');
    await expect.poll(() => chart.getAttribute('data-points'), { timeout: 30_000 }).toBe('3');
    expect(await chart.locator('.chart-summary').textContent()).toBe(`forward_backward loss: 3 points, last ${num(losses[2])} at forward_backward 3.`);
    expect(await page.locator('#session-status [data-status]').textContent()).toBe('ready');

    // Live: the next forward_backward is one more point within a refresh (3 s).
    losses.push((await conn.forwardBackward(batch, { codec: 'JPEG' })).loss);
    await expect.poll(() => chart.getAttribute('data-points'), { timeout: 30_000 }).toBe('4');
    await expect.poll(() => chart.locator('.chart-summary').textContent()).toBe(`forward_backward loss: 4 points, last ${num(losses[3])} at forward_backward 4.`);
    expect(pageErrors).toEqual([]);
    await page.close();
  }, 300_000);
});
