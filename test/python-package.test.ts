/**
 * The Python package (clients/python, import name `vela`) against the real server: its pytest
 * suite, run with the test virtualenv's Python (test/setup/python-env.ts) and the package from
 * its source folder, on a server started here (uWS, the engine worker, the real engine) with a
 * 1-episode G1 subset (a fine-tune first decodes its training episodes' frames: seconds each).
 * Every session op, a fine-tune from create to its served policy, an
 * event stream cut by a proxy and resumed with from=, an error of each kind, a session taken
 * over and one reconnected after its socket was cut, and zstd-dictionary observations to
 * `vela policy` are in clients/python/tests/test_vela.py; the futures client (vela.ServiceClient)
 * in test_futures.py.
 */
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { NormStatsSet } from '../kernels/normalize.ts';
import { g1Subset } from '../bench/harness/g1.ts';
import { startPolicyProc, tinyLoraCheckpoint, type PolicyProc } from './helpers/policy-proc.ts';
import { missing, pythonEnv } from './helpers/requires.ts';
import { startTestServer, TEST_KEY, type TestServer } from './helpers/server.ts';

const run = promisify(execFile);
const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const env = pythonEnv();
const README = fs.readFileSync(path.join(ROOT, 'README.md'), 'utf8');

/** The `n`th python block (0-based) after README heading `## heading`. */
function pythonBlock(heading: string, n: number): string {
  let at = README.indexOf(`\n## ${heading}\n`);
  expect(at, heading).toBeGreaterThan(0);
  for (let i = 0; i <= n; i++) at = README.indexOf('```python\n', at + 1);
  return README.slice(at + 10, README.indexOf('\n```', at + 10));
}

/** `code` with the README's address and key swapped for `server`'s; fails when the README no longer has them. */
function forServer(code: string, server: TestServer): string {
  expect(code).toContain('"http://127.0.0.1:8080"');
  expect(code).toContain('"my-key"');
  return code.replaceAll('"http://127.0.0.1:8080"', JSON.stringify(server.baseUrl)).replaceAll('"my-key"', JSON.stringify(TEST_KEY));
}

/** `code` with each `[from, to]` swapped once; fails when the example no longer has `from`. */
function swapped(code: string, pairs: [string, string][]): string {
  for (const [from, to] of pairs) {
    expect(code).toContain(from);
    code = code.replace(from, to);
  }
  return code;
}

/**
 * Writes `code` to `dir`/`name` and runs it with `python` (the test venv's, with the package from
 * its source folder, unless another is given); its stdout. Fails on any stderr (a warning included)
 * and names `what` when the script fails.
 */
async function runScript(what: string, name: string, code: string, opts: { dir: string; python?: string; timeoutMs?: number }): Promise<string> {
  const file = path.join(opts.dir, name);
  fs.writeFileSync(file, code);
  const pkgEnv = opts.python ? {} : { PYTHONPATH: path.join(ROOT, 'clients/python/src') };
  const { stdout, stderr } = await run(opts.python ?? env.python!, [file], { cwd: opts.dir, timeout: opts.timeoutMs ?? 300_000, env: { ...process.env, ...pkgEnv } })
    .catch((e: { stderr?: string; stdout?: string }) => {
      throw new Error(`${what} failed:\n${e.stdout}\n${e.stderr}`);
    });
  expect(stderr, `${what} wrote to stderr`).toBe('');
  return stdout;
}

describe.skipIf(missing('the Python package tests', env.reason))('the vela Python package (pytest) against the real server', () => {
  const subset = g1Subset(1);
  const tmpRoot = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-pkg-policy-'));
  let server: TestServer;
  let policy: PolicyProc;
  beforeAll(async () => {
    // retrieve_future answers try_again after 0.5 s (not 45): test_futures.py polls a held request through it in a second.
    server = await startTestServer({ env: { VELA_DATASETS_DIR: subset.root, VELA_FUTURE_WAIT_S: '0.5' } });
    // A `vela policy` of the README's robot (one camera cam_high, 26 state and action dims) for the RTC loop.
    const z = (n: number, v: number) => new Array(n).fill(v);
    const stats: NormStatsSet = { state: { mean: z(26, 0), std: z(26, 1), q01: z(26, -2), q99: z(26, 2) }, actions: { mean: z(26, 0), std: z(26, 1), q01: z(26, -2), q99: z(26, 2) } };
    const ck = path.join(tmpRoot, 'ck');
    await tinyLoraCheckpoint(ck, { cameras: ['cam_high'], action_dim: 26, state_dim: 26 }, stats);
    policy = await startPolicyProc([ck]);
  }, 180_000);
  afterAll(async () => {
    policy?.proc.kill('SIGTERM');
    await server?.close();
    fs.rmSync(tmpRoot, { recursive: true, force: true });
  });

  it('passes clients/python/tests', async () => {
    let out: { stdout: string; stderr: string };
    try {
      out = await run(env.python!, ['-m', 'pytest', '-q', '-p', 'no:cacheprovider', 'clients/python/tests'], {
        cwd: ROOT, timeout: 600_000, maxBuffer: 16 * 1024 * 1024,
        env: { ...process.env, PYTHONDONTWRITEBYTECODE: '1', PYTHONPATH: path.join(ROOT, 'clients/python/src'), VELA_URL: server.baseUrl, VELA_API_KEY: TEST_KEY, VELA_DATASET: subset.name, VELA_DATASET_DIR: subset.dir, VELA_POLICY_URL: policy.url },
      });
    } catch (e) {
      const err = e as { stdout?: string; stderr?: string };
      throw new Error(`pytest failed:\n${err.stdout ?? ''}\n${err.stderr ?? ''}`);
    }
    // Every test ran and passed (none skipped: a skip would hide a missing piece).
    expect(out.stdout).toMatch(/\b17 passed\b/);
    expect(out.stdout).not.toMatch(/skipped|failed|error/);
  }, 660_000);

  it('the README\'s real-time chunking loop with the package runs against `vela policy`: plain first, then guided chunks spliced at the row each says', async () => {
    const code = swapped(pythonBlock('Real-time chunking', 0), [
      ['vela.WebsocketClientPolicy("ws://127.0.0.1:8000"', `vela.WebsocketClientPolicy(${JSON.stringify(policy.url)}`],
      ['control_hz=30', 'control_hz=10'], ['rtc.run(300, robot_step)', 'rtc.run(60, robot_step)'],
    ]);
    const stdout = await runScript('the README\'s RTC loop with the package', 'rtc.py', code, { dir: tmpRoot });
    const lines = stdout.trim().split('\n');
    const summary = /^(\d+) actions in 60 ticks; (\d+) ticks without one$/.exec(lines.pop()!);
    expect(summary, stdout).not.toBeNull();
    expect(Number(summary![1]) + Number(summary![2])).toBe(60);
    const splices = lines.map((l) => /^asked at action (None|\d+), spliced at row (\d+), rtc (\w+) \(delay (None|\d+)\)$/.exec(l));
    expect(splices.every(Boolean), stdout).toBe(true);
    // The first request has no previous chunk (no rtc/executed: a plain answer); each later one asked
    // once at least execute_horizon (8) actions of its chunk had run (more when that chunk was spliced
    // in past row 8) and was guided.
    expect([splices[0]![1], splices[0]![3]]).toEqual(['None', 'plain']);
    expect(splices.length).toBeGreaterThan(2);
    for (const m of splices.slice(1)) {
      expect(Number(m![1])).toBeGreaterThanOrEqual(8);
      expect(m![3]).toBe('guided');
    }
  }, 300_000);

  it('the README\'s futures-client loop (vela.ServiceClient) trains, saves and loads a model over /api/v1', async () => {
    const stdout = await runScript('the README\'s futures loop', 'futures.py', forServer(pythonBlock('Training sessions', 2), server), { dir: tmpRoot, timeoutMs: 120_000 });
    // A finite loss and gradient norm, and the checkpoint id that save_weights gave (the model's states/step-1).
    expect(stdout.trim()).toMatch(/^loss \d+\.\d{3}, grad_norm \d+\.\d{3}, saved ts-\w+\/states\/step-1$/);
  }, 120_000);

  it('the package README\'s example trains a session, fine-tunes on a dataset of the server and gets actions from the job\'s policy', async () => {
    const md = fs.readFileSync(path.join(ROOT, 'clients/python/README.md'), 'utf8');
    const at = md.indexOf('```python\n');
    expect(at).toBeGreaterThan(0);
    // This server's dataset, 2 steps of batch 2 without held-out evaluation instead of 20 of the recipe, and its websocket address.
    const code = swapped(forServer(md.slice(at + 10, md.indexOf('\n```', at + 10)), server), [
      ['dataset_name="g1_pick_bottle_sample", steps=20', `dataset_name=${JSON.stringify(subset.name)}, steps=2, batch_size=2, eval_fraction=0`],
      ['ws://127.0.0.1:8080', server.baseUrl.replace('http', 'ws')],
    ]);
    const stdout = await runScript('the package README\'s example', 'package-readme.py', code, { dir: tmpRoot });
    // The G1 subset's policy: flow0-tiny's 16-step chunks of the dataset's 26 action dims.
    expect(stdout.trim()).toMatch(/^loss \d+\.\d{3}, actions \(16, 26\)$/);
  }, 300_000);

  it('the README\'s session loop, with the package (in a fresh venv: pip install ./clients/python and nothing else) and on raw websockets', async () => {
    const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-pkg-'));
    try {
      // A fresh virtualenv (no system site packages): what `pip install ./clients/python` brings is all it has.
      const venv = path.join(tmp, 'venv');
      await run('python3', ['-m', 'venv', venv], { timeout: 120_000 });
      const py = path.join(venv, 'bin', 'python');
      // From a copy: setuptools writes build/ and *.egg-info beside the source it installs.
      const pkg = path.join(tmp, 'python');
      fs.cpSync(path.join(ROOT, 'clients/python'), pkg, { recursive: true, filter: (p) => !/(^|\/)(build|__pycache__|[^/]*\.egg-info)$/.test(p) });
      await run(py, ['-m', 'pip', 'install', '--disable-pip-version-check', '--quiet', '--retries', '1', '--timeout', '20', pkg], { timeout: 600_000, cwd: tmp })
        .catch((e: { stderr?: string }) => {
          throw new Error(`pip install ./clients/python failed in a fresh venv:\n${e.stderr}`);
        });
      const lines: Record<string, string> = {};
      for (const [which, n, python] of [['package', 0, py], ['raw', 1, env.python!]] as const) {
        // The fresh venv's Python for the package (nothing on its path), the test venv's for the raw loop.
        const stdout = await runScript(`the README's ${which} session loop`, `${which}.py`, forServer(pythonBlock('Training sessions', n), server), { dir: tmp, python });
        lines[which] = stdout.trim();
      }
      // Both print the loss and the sampled chunk's shape: [1 datum, flow05-tiny's 16 steps, its 32 action dims]
      // (the losses differ: each forward_backward draws its own noise and time).
      for (const out of Object.values(lines)) expect(out).toMatch(/^loss \d+\.\d{3}, actions \(1, 16, 32\)$/);
    } finally {
      fs.rmSync(tmp, { recursive: true, force: true });
    }
  }, 900_000);
});
