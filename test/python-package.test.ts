/**
 * The Python package (clients/python, import name `vela`) against the real server: its pytest
 * suite, run with the test virtualenv's Python (test/setup/python-env.ts) and the package from
 * its source folder, on a server started here (uWS, the engine worker, the real engine) with a
 * 2-episode G1 subset. Every session op, a fine-tune from create to its served policy, an
 * event stream cut by a proxy and resumed with from=, and an error of each kind are in
 * clients/python/tests/test_vela.py.
 */
import { execFile } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { g1Subset } from './helpers/g1.ts';
import { missing, pythonEnv } from './helpers/requires.ts';
import { startTestServer, TEST_KEY, type TestServer } from './helpers/server.ts';

const run = promisify(execFile);
const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const env = pythonEnv();

describe.skipIf(missing('the Python package tests', env.reason))('the vela Python package (pytest) against the real server', () => {
  const subset = g1Subset(2);
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer({ env: { VELA_DATASETS_DIR: subset.root } });
  }, 120_000);
  afterAll(async () => server?.close());

  it('passes clients/python/tests', async () => {
    let out: { stdout: string; stderr: string };
    try {
      out = await run(env.python!, ['-m', 'pytest', '-q', '-p', 'no:cacheprovider', 'clients/python/tests'], {
        cwd: ROOT, timeout: 600_000, maxBuffer: 16 * 1024 * 1024,
        env: { ...process.env, PYTHONPATH: path.join(ROOT, 'clients/python/src'), VELA_URL: server.baseUrl, VELA_API_KEY: TEST_KEY, VELA_DATASET: subset.name },
      });
    } catch (e) {
      const err = e as { stdout?: string; stderr?: string };
      throw new Error(`pytest failed:\n${err.stdout ?? ''}\n${err.stderr ?? ''}`);
    }
    // Every test ran and passed (none skipped: a skip would hide a missing piece).
    expect(out.stdout).toMatch(/\b6 passed\b/);
    expect(out.stdout).not.toMatch(/skipped|failed|error/);
  }, 660_000);
});
