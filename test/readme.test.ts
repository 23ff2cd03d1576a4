/**
 * The README, followed as written (issue 14), so the documentation cannot rot:
 * - the quickstart's `vela finetune` (2 steps, a temp --output) trains on the shipped sample
 *   and keeps its checkpoints; its `vela policy` (port 0 instead of 8000) serves the result;
 * - the README's Python client runs unchanged against that `vela policy`, and, with its job line
 *   uncommented, against a job's policy on `vela serve`, started as the README's curl body asks;
 * - the README's training-session example (TypeScript) runs against the same server.
 * Code is cut from README.md at run time; only addresses, keys, ids and step counts are swapped.
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, startTestServer, TEST_KEY, type TestServer } from './helpers/server.ts';
import { missing, pythonEnv } from './helpers/requires.ts';

const run = promisify(execFile);
const REPO = path.resolve(import.meta.dirname, '..');
const README = fs.readFileSync(path.join(REPO, 'README.md'), 'utf8');
const PY = pythonEnv();
const noPython = missing('the Python test environment', PY.reason);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-readme-'));
const children: ChildProcess[] = [];
afterAll(() => {
  for (const c of children) c.kill('SIGKILL');
  fs.rmSync(tmp, { recursive: true, force: true });
});

/** The first ```lang block after the heading that starts with `heading`. */
function block(heading: string, lang: string): string {
  const at = README.indexOf(`\n## ${heading}`);
  expect(at, `README heading "## ${heading}"`).toBeGreaterThan(0);
  const open = README.indexOf('```' + lang + '\n', at);
  expect(open, `a \`\`\`${lang} block under "## ${heading}"`).toBeGreaterThan(0);
  return README.slice(open + lang.length + 4, README.indexOf('\n```', open + 3));
}

/** `text` with `from` replaced by `to`; fails when the README no longer has `from`. */
function swap(text: string, from: string, to: string): string {
  expect(text, 'the README text this test swaps').toContain(from);
  return text.replace(from, to);
}

const PY_CLIENT = block('Python clients', 'python');
const POLICY_LINE = 'url, api_key = "ws://127.0.0.1:8000", None';
const JOB_LINE = '# url, api_key = "ws://127.0.0.1:8080/v1/fine-tunes/<id>/policy", "my-key"';

/** Runs the README's Python client with its first url line replaced; returns its printed lines. */
async function runPythonClient(urlLine: string): Promise<string[]> {
  const script = path.join(tmp, `client-${Date.now()}.py`);
  fs.writeFileSync(script, swap(PY_CLIENT, POLICY_LINE, urlLine));
  try {
    const { stdout, stderr } = await run(PY.python!, [script], { timeout: 120_000 });
    expect(stderr, 'the README client printed warnings').toBe('');
    return stdout.trim().split('\n');
  } catch (e) {
    throw new Error(`the README's Python client failed:\n${(e as { stderr?: string }).stderr ?? (e as Error).message}`);
  }
}

/** A command line of the README as argv (the README's commands need no shell quoting). */
function argvOf(line: string): string[] {
  return line.replace(/\s+#.*$/, '').trim().split(/\s+/);
}

describe('the quickstart', () => {
  const quick = block('Quickstart', 'sh').split('\n');
  const finetuneLine = quick.find((l) => l.startsWith('npx vela finetune '))!;
  const policyLine = quick.find((l) => l.startsWith('npx vela policy '))!;
  const out = path.join(tmp, 'g1');
  let policyUrl = '';
  let finetuneLog = '';

  beforeAll(async () => {
    expect(finetuneLine).toBeDefined();
    expect(policyLine).toBeDefined();
    // `npx vela` runs bin/vela.js; 2 steps instead of 300, and a temp folder for --output.
    let args = argvOf(finetuneLine).slice(2);
    args[args.indexOf('--steps') + 1] = '2';
    args[args.indexOf('--output') + 1] = out;
    const r = await run(process.execPath, ['bin/vela.js', ...args], { cwd: REPO, timeout: 280_000, env: { ...process.env, VELA_BACKEND: process.env.VELA_BACKEND ?? 'wasm' } });
    finetuneLog = r.stderr;
    args = argvOf(policyLine).slice(2);
    expect(args.slice(0, 2)).toEqual(['policy', '~/vela-runs/g1/weights/final']);
    args[1] = path.join(out, 'weights', 'final');
    args[args.indexOf('--port') + 1] = '0';
    const child = spawn(process.execPath, ['bin/vela.js', ...args], { cwd: REPO, env: { ...process.env, VELA_BACKEND: process.env.VELA_BACKEND ?? 'wasm', VELA_API_KEY: '' }, stdio: ['ignore', 'pipe', 'pipe'] });
    children.push(child);
    let stderr = '';
    child.stderr!.on('data', (d) => (stderr += d));
    policyUrl = await new Promise<string>((resolve, reject) => {
      let text = '';
      child.stdout!.on('data', (d) => {
        text += d;
        const m = /Vela policy server on (ws:\/\/\S+)/.exec(text);
        if (m) resolve(m[1]!);
      });
      child.once('exit', (code) => reject(new Error(`vela policy exited ${code}: ${stderr}`)));
    });
  }, 300_000);

  it('trains on the shipped sample and keeps every checkpoint\'s weights, not the resumable state', () => {
    expect(finetuneLog).toMatch(/succeeded after 2 steps/);
    // checkpoint_every defaults to the eval interval: a quarter of 2 steps, rounded up.
    expect(fs.readdirSync(path.join(out, 'weights')).sort()).toEqual(['final', 'step-0000001']);
    for (const d of ['final', 'step-0000001']) {
      expect(fs.readdirSync(path.join(out, 'weights', d)).sort()).toEqual(['config.json', 'model.safetensors', 'norm_stats.json']); // the default: a full fine-tune
    }
    expect(fs.existsSync(path.join(out, 'states'))).toBe(false);
    expect(fs.existsSync(path.join(out, 'resume.json'))).toBe(false);
    expect(finetuneLog).toContain(`checkpoint written at step 1: weights in ${path.join(out, 'weights', 'step-0000001')} (eval_loss `);
    expect(finetuneLog).toContain(`checkpoints kept in ${path.join(out, 'weights')}: step-0000001\n`);
    expect(finetuneLog).toContain(`serve it: vela policy ${path.join(out, 'weights', 'final')}\n`);
  });

  it.skipIf(noPython)('the README\'s Python client gets actions from `vela policy`, with no key', async () => {
    const lines = await runPythonClient(`url, api_key = "${policyUrl}", None`);
    expect(lines).toEqual(["['cam_high'] 26 16 26", '(16, 26) float32']);
  });
});

describe('the server, as "First fine-tune on the server" starts it', () => {
  let server: TestServer;
  let job: any;

  beforeAll(async () => {
    const sh = block('First fine-tune on the server', 'sh');
    expect(sh).toContain('VELA_API_KEY=my-key VELA_DATASETS_DIR=./datasets npm start');
    server = await startTestServer({ env: { VELA_DATASETS_DIR: path.join(REPO, 'datasets') } });
    const body = JSON.parse(/-d '([^']+)'/.exec(sh)![1]!);
    expect(body).toEqual({ dataset_name: 'g1_pick_bottle_sample', steps: 300 });
    const created = await api(server, 'POST', '/v1/fine-tunes', { ...body, steps: 2 });
    expect(created.status, JSON.stringify(created.json)).toBe(200);
    for (const deadline = Date.now() + 240_000; Date.now() < deadline; await new Promise((r) => setTimeout(r, 500))) {
      job = (await api(server, 'GET', `/v1/fine-tunes/${created.json.id}`)).json;
      if (['succeeded', 'failed', 'cancelled'].includes(job.status)) break;
    }
    expect(job.status, job.error).toBe('succeeded');
  }, 300_000);
  afterAll(() => server?.close());

  it('the job shows the cameras and action space it used, not null', () => {
    expect(job).toMatchObject({ cameras: ['cam_high'], action_space: 'delta' });
  });

  it.skipIf(noPython)('the README\'s Python client, with its job line, gets actions from the job\'s policy with the Bearer key', async () => {
    const line = swap(swap(swap(JOB_LINE, '# ', ''), 'ws://127.0.0.1:8080', server.baseUrl.replace('http', 'ws')), '<id>', job.id).replace('"my-key"', `"${TEST_KEY}"`);
    expect(await runPythonClient(line)).toEqual(["['cam_high'] 26 16 26", '(16, 26) float32']);
  });

  it('the README\'s training-session example runs as written', async () => {
    const code = block('Training sessions', 'ts');
    const lines = code.split('\n');
    const imports = lines.filter((l) => l.startsWith('import ')).map((l) => l.replace("'./", "'../"));
    const rest = lines.filter((l) => !l.startsWith('import ')).join('\n');
    const script = [...imports, swap(swap(rest, "'http://127.0.0.1:8080'", `'${server.baseUrl}'`), "'my-key'", `'${TEST_KEY}'`),
      'console.log(JSON.stringify({ loss, shape: actions.shape, dtype: actions.dtype }));'].join('\n');
    const dir = path.join(REPO, '.tmp');
    fs.mkdirSync(dir, { recursive: true });
    const file = path.join(dir, `readme-session-${process.pid}.ts`);
    fs.writeFileSync(file, script);
    try {
      const { stdout } = await run(process.execPath, ['--import', 'tsx', file], { cwd: REPO, timeout: 200_000 });
      const r = JSON.parse(stdout.trim().split('\n').at(-1)!);
      expect(Number.isFinite(r.loss)).toBe(true);
      expect(r.loss).toBeGreaterThan(0);
      expect(r).toMatchObject({ shape: [1, 16, 32], dtype: '<f4' });
    } finally {
      fs.rmSync(file, { force: true });
    }
  }, 240_000);
});
