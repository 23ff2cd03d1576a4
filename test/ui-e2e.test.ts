/**
 * The dashboard end to end, in Debian's headless Chromium driven by playwright-core: a wrong key
 * is refused in words; a signed-in user starts a 12-step fine-tune of the default preset (flow0-tiny, from GET /v1/defaults) on
 * the shipped datasets/g1_pick_bottle_sample, sees the loss chart gain points while the job runs, cancels
 * a second job, downloads an output file (sha256 checked), and closes a training session. The
 * key never appears in a request URL. Screenshots land in test/ui/*.png (gitignored).
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chromium, type BrowserContext, type Page } from 'playwright-core';
import { buildUi } from '../scripts/build-ui.ts';
import { num } from '../ui/src/format.ts';
import { api, startTestServer, TEST_KEY, type TestServer } from './helpers/server.ts';
import { chromiumPath, missing } from './helpers/requires.ts';

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const DATASETS = path.join(REPO, 'datasets');
const SHOTS = path.join(REPO, 'test/ui');
const CHROMIUM = chromiumPath();
// No network on CI machines: without these, Chromium's background services fail loudly.
const CHROMIUM_ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
  '--disable-component-update', '--disable-sync'];
const STEPS = 12;
const EVAL_EVERY = 6;

let server: TestServer;
let context: BrowserContext;
let profileDir: string;
const requests: { url: string; authorization: string | undefined }[] = [];
const pageErrors: string[] = [];

async function newPage(): Promise<Page> {
  const page = await context.newPage();
  page.on('pageerror', (e) => pageErrors.push(e.message));
  page.on('dialog', (d) => void d.accept());
  return page;
}

async function signIn(page: Page, key: string): Promise<void> {
  await page.goto(`${server.baseUrl}/ui/`);
  await page.getByLabel('API key').fill(key);
  await page.getByRole('button', { name: 'Sign in' }).click();
}

const statusOf = (page: Page) => page.locator('#job-status [data-status]').getAttribute('data-status');
const chartCount = (page: Page, chart: string, attr = 'data-points') => page.locator(`#chart-${chart}`).getAttribute(attr).then(Number);

describe.skipIf(missing('Chromium', CHROMIUM.reason))('dashboard in headless Chromium', () => {
  beforeAll(async () => {
    await buildUi();
    server = await startTestServer({ env: { VELA_DATASETS_DIR: DATASETS } });
    const probe = await fetch(`${server.baseUrl}/ui/`);
    if (probe.status !== 200) {
      throw new Error(`GET /ui/ answered ${probe.status} (${(await probe.text()).slice(0, 200)}): server/app.ts must call mountUi(app) from server/ui/index.ts before its catch-all route`);
    }
    fs.mkdirSync(SHOTS, { recursive: true });
    profileDir = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-chromium-'));
    context = await chromium.launchPersistentContext(profileDir, {
      executablePath: CHROMIUM.path, headless: true, args: CHROMIUM_ARGS, viewport: { width: 1366, height: 900 }, acceptDownloads: true,
    });
    context.on('request', (r) => requests.push({ url: r.url(), authorization: r.headers()['authorization'] }));
  });

  afterAll(async () => {
    await context?.close();
    await server?.close();
    if (profileDir) fs.rmSync(profileDir, { recursive: true, force: true });
  });

  it('a wrong key gets a clear error, not a blank page', async () => {
    const page = await newPage();
    await signIn(page, 'vela-wrong-key');
    const error = page.locator('#login-error');
    await expect.poll(() => error.textContent()).toBe('The server refused this key: invalid API key. Check the key and try again.');
    await expect(page.getByLabel('API key').isVisible()).resolves.toBe(true);
    await page.screenshot({ path: path.join(SHOTS, 'wrong-key.png') });

    // A kept key that the server stopped accepting leads back to sign-in, saying so.
    await page.evaluate("sessionStorage.setItem('vela.apiKey', 'vela-revoked-key')");
    await page.reload();
    await expect.poll(() => error.textContent()).toBe('The server no longer accepts this key (invalid API key). Sign in again.');
    await expect(page.getByLabel('API key').isVisible()).resolves.toBe(true);
    await page.close();
  });

  it('signs in, trains with a live loss chart, cancels a queued job, downloads a file, closes a session', async () => {
    const page = await newPage();
    await signIn(page, TEST_KEY);
    await expect.poll(() => page.locator('td.empty').textContent()).toBe('No fine-tunes yet: start one above.');

    const startJob = async (name: string) => {
      await page.goto(`${server.baseUrl}/ui/#/jobs`);
      await page.getByText('New fine-tune').click();
      await page.getByLabel('Dataset').fill('g1_pick_bottle_sample');
      await page.getByLabel('Steps', { exact: true }).fill(String(STEPS));
      await page.getByLabel('Batch size').fill('4');
      await page.getByLabel('Learning rate').fill('0.003');
      await page.getByLabel('Eval every (steps)').fill(String(EVAL_EVERY));
      await page.getByLabel('Name (optional)').fill(name);
      await page.getByRole('button', { name: 'Start fine-tune' }).click();
      await page.waitForURL(/#\/jobs\/ft-/);
      return decodeURIComponent(page.url().split('#/jobs/')[1]!);
    };

    // Job A: the loss chart must gain points while the job is still running.
    const jobA = await startJob('ui-e2e train');
    await expect.poll(() => chartCount(page, 'loss'), { timeout: 120_000, interval: 100 }).toBeGreaterThanOrEqual(1);
    const seen = await chartCount(page, 'loss');
    const statusWhenSeen = await statusOf(page);
    await expect.poll(() => chartCount(page, 'loss'), { timeout: 60_000, interval: 100 }).toBeGreaterThan(seen);
    expect(statusWhenSeen).toBe('running');
    expect(seen).toBeLessThan(STEPS);
    await page.screenshot({ path: path.join(SHOTS, 'job-live.png'), fullPage: true });

    // Job B waits behind A (one job runs at a time); cancel it from its page.
    const jobB = await startJob('ui-e2e cancel me');
    await expect.poll(() => statusOf(page)).toMatch(/queued|running/);
    await page.getByRole('button', { name: 'Cancel job' }).click();
    await expect.poll(() => statusOf(page), { timeout: 30_000 }).toBe('cancelled');
    await expect(page.getByRole('button', { name: 'Cancel job' }).isVisible()).resolves.toBe(false);
    expect((await api(server, 'GET', `/v1/fine-tunes/${jobB}`)).json.status).toBe('cancelled');
    await page.screenshot({ path: path.join(SHOTS, 'job-cancelled.png'), fullPage: true });

    // The jobs table lists both, newest first.
    await page.goto(`${server.baseUrl}/ui/#/jobs`);
    await expect.poll(() => page.locator('tr[data-job]').evaluateAll((rows) => rows.map((r) => r.getAttribute('data-job')))).toEqual([jobB, jobA]);
    await expect.poll(() => page.locator(`tr[data-job="${jobB}"] [data-status]`).textContent()).toBe('cancelled');
    // 24-hour like every other time on the page (Chromium's en-US locale would say "7:45:30 PM").
    expect(await page.getByText(/refreshed at/).textContent()).toMatch(/^2 jobs; refreshed at \d{2}:\d{2}:\d{2}$/);
    await page.screenshot({ path: path.join(SHOTS, 'jobs.png'), fullPage: true });

    // Back to A until it ends: every step, each evaluation and each learning rate is on the charts.
    await page.getByRole('link', { name: 'ui-e2e train' }).click();
    // Two held-out evaluations of ~170 frames each (2 of 15 episodes, every 4th frame) come on top of the steps.
    await expect.poll(() => statusOf(page), { timeout: 240_000, interval: 500 }).toBe('succeeded');
    await expect.poll(() => chartCount(page, 'loss')).toBe(STEPS);
    const events = (await api(server, 'GET', `/v1/fine-tunes/${jobA}/events`)).json.data as Record<string, any>[];
    const progress = events.filter((e) => e.type === 'progress');
    expect(progress.map((e) => e.step)).toEqual(Array.from({ length: STEPS }, (_, i) => i + 1));
    const evals = progress.filter((e) => e.eval_loss !== undefined);
    expect(evals.map((e) => e.step)).toEqual([EVAL_EVERY, STEPS]);
    expect(await chartCount(page, 'loss', 'data-count-eval')).toBe(evals.length);
    expect(await chartCount(page, 'learning-rate', 'data-count-lr')).toBe(STEPS);
    const last = progress.at(-1)!;
    const summary = await page.locator('#chart-loss .chart-summary').textContent();
    expect(summary).toBe(`train loss: ${STEPS} points, last ${num(last.loss)} at step ${STEPS}; ` +
      `eval loss (held-out): ${evals.length} points, last ${num(evals.at(-1)!.eval_loss)} at step ${evals.at(-1)!.step}.`);
    await expect.poll(() => page.locator('#job-step').textContent()).toBe(`step ${STEPS} / ${STEPS}`);
    // The legend shows the last values while the pointer is elsewhere (uPlot alone shows "--").
    await page.mouse.move(1, 1);
    await expect.poll(() => page.locator('#chart-loss .u-legend .u-value').allTextContents()).toEqual([`${STEPS} (last)`, num(last.loss), num(evals.at(-1)!.eval_loss)]);
    await expect.poll(() => page.locator('#chart-learning-rate .u-legend .u-value').allTextContents()).toEqual([`${STEPS} (last)`, num(last.learning_rate)]);
    // The loss axis has enough labels to read a value off it.
    const yTicks = (await page.locator('#chart-loss').getAttribute('data-y-ticks'))!.split(' ');
    expect(yTicks.length, yTicks.join(' ')).toBeGreaterThanOrEqual(4);
    // The config shows what the job used, not the request's nulls.
    expect(await page.locator('tr[data-field="cameras"] td').textContent()).toBe('cam_high');
    expect(await page.locator('tr[data-field="action_space"] td').textContent()).toBe('delta');
    const lastEval = evals.at(-1)!;
    await expect.poll(() => page.locator('dl.summary').innerText()).toContain(
      `Held-out MSE\n${num(lastEval.eval_mse)}: ${lastEval.eval_ratio_hold_state.toFixed(2)}× hold state, ${lastEval.eval_ratio_mean_chunk.toFixed(2)}× mean chunk`);
    // The held-out table: overall, one row per arm and hand, and raw units; the MSE chart has a point per evaluation.
    await expect.poll(() => page.locator('#job-eval tbody tr').evaluateAll((rows) => rows.map((r) => r.getAttribute('data-group'))))
      .toEqual(['all', 'left arm', 'right arm', 'left hand', 'right hand', 'all (raw units)']);
    expect(await page.locator('#job-eval tr[data-group="all"] td').first().textContent()).toBe(num(lastEval.eval_mse));
    expect(await chartCount(page, 'held-out-mse', 'data-count-policy')).toBe(evals.length);

    // Files: the listed ones, and a download whose bytes hash to the listed sha256.
    const files = (await api(server, 'GET', `/v1/fine-tunes/${jobA}/files`)).json.data as { path: string; sha256: string }[];
    expect(files.length).toBeGreaterThan(0);
    await expect.poll(() => page.locator('tr[data-file]').evaluateAll((rows) => rows.map((r) => r.getAttribute('data-file')))).toEqual(files.map((f) => f.path));
    const target = files.find((f) => f.path.endsWith('.json')) ?? files[0]!;
    const [download] = await Promise.all([page.waitForEvent('download'), page.getByRole('button', { name: `Download ${target.path}` }).click()]);
    const saved = path.join(profileDir, 'downloaded');
    await download.saveAs(saved);
    expect(download.suggestedFilename()).toBe(target.path.split('/').pop());
    expect(crypto.createHash('sha256').update(fs.readFileSync(saved)).digest('hex')).toBe(target.sha256);
    await page.screenshot({ path: path.join(SHOTS, 'job-succeeded.png'), fullPage: true });
    expect(await page.locator('#banner').isHidden(), (await page.locator('#banner').textContent()) ?? '').toBe(true);

    // Sessions: one opened through the API shows with its status, and closes from the page.
    const created = await api(server, 'POST', '/v1/training_sessions', { base_model: 'flow05-tiny' });
    expect(created.status).toBe(200);
    await page.getByRole('link', { name: 'Sessions' }).click();
    const row = page.locator(`tr[data-session="${created.json.id}"]`);
    await expect.poll(() => row.locator('[data-status]').textContent(), { timeout: 30_000 }).toMatch(/starting|ready/);
    await page.screenshot({ path: path.join(SHOTS, 'sessions.png'), fullPage: true });
    await row.getByRole('button', { name: `Close session ${created.json.id}` }).click();
    await expect.poll(() => row.locator('[data-status]').textContent(), { timeout: 30_000 }).toBe('closed');
    expect((await api(server, 'GET', `/v1/training_sessions/${created.json.id}`)).json.status).toBe('closed');

    // Nodes: one server without a cluster shows itself, up, with its URL.
    await page.getByRole('link', { name: 'Nodes' }).click();
    const me = page.locator('tr[data-node="local"]');
    await expect.poll(() => me.locator('[data-status]').textContent(), { timeout: 30_000 }).toBe('up');
    expect(await me.locator('td').nth(2).textContent()).toBe(server.baseUrl);

    // The key travelled only in headers: never in a URL, and on every API call.
    expect(requests.filter((r) => r.url.includes(TEST_KEY))).toEqual([]);
    const apiCalls = requests.filter((r) => new URL(r.url).pathname.startsWith('/v1/'));
    expect(apiCalls.length).toBeGreaterThan(10);
    expect(apiCalls.filter((r) => r.authorization !== `Bearer ${TEST_KEY}` && !['Bearer vela-wrong-key', 'Bearer vela-revoked-key'].includes(r.authorization!))).toEqual([]);
    expect(pageErrors).toEqual([]);
    // Errors the page caught itself (a ResizeObserver loop is not a page error to Playwright).
    expect(await page.locator('#banner').isHidden(), (await page.locator('#banner').textContent()) ?? '').toBe(true);
    await page.close();
  }, 600_000); // ~2 min on an idle 2-core machine; room for a loaded one
});
