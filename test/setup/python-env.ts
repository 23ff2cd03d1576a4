/**
 * vitest globalSetup: the Python the tests that play OpenPI's client need (test/python/*, the
 * README's client). Made once, on first run, as a project-local virtualenv `.venv/` (git-ignored)
 * with `--system-site-packages` (packages already installed on the machine count), its packages
 * from test/python/requirements.txt installed by pip as this machine configures it. Later runs only
 * check the stamp file. When it cannot be made (no python3, pip unreachable), the tests that need
 * it skip with the one-line reason, or fail when CI=true (test/helpers/requires.ts).
 */
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import type { TestProject } from 'vitest/node';

const run = promisify(execFile);
const REPO = path.resolve(import.meta.dirname, '../..');
const VENV = path.join(REPO, '.venv');
const REQUIREMENTS = path.join(REPO, 'test/python/requirements.txt');
const STAMP = path.join(VENV, '.vela-requirements');

/** The Python for tests: an interpreter path, or null with the reason it is missing. */
export type PythonEnv = { python: string; reason: null } | { python: null; reason: string };

declare module 'vitest' {
  export interface ProvidedContext {
    python: PythonEnv;
  }
}

/** The last non-empty line of a failed command's output (pip's own summary of what went wrong). */
function lastLine(e: unknown): string {
  const err = e as { stderr?: string; stdout?: string; message?: string };
  const lines = `${err.stderr ?? ''}\n${err.stdout ?? ''}`.split('\n').map((l) => l.trim()).filter(Boolean);
  return lines.at(-1) ?? err.message ?? String(e);
}

/**
 * Makes (or finds) `.venv` with the test requirements. Never throws: a failure is a reason.
 * Takes ~30 s the first time on a 2-core machine (numpy's wheel), a stat afterwards.
 */
export async function ensurePythonEnv(): Promise<PythonEnv> {
  const python = path.join(VENV, 'bin', 'python');
  const wanted = fs.readFileSync(REQUIREMENTS, 'utf8');
  if (fs.existsSync(python) && fs.existsSync(STAMP) && fs.readFileSync(STAMP, 'utf8') === wanted) return { python, reason: null };
  try {
    await run('python3', ['-m', 'venv', '--clear', '--system-site-packages', VENV], { timeout: 120_000 });
  } catch (e) {
    return { python: null, reason: `cannot make the test virtualenv with "python3 -m venv" (${lastLine(e)}); install Python 3 with its venv module` };
  }
  try {
    // Short timeouts: an offline developer machine should learn it in seconds, not minutes.
    await run(python, ['-m', 'pip', 'install', '--disable-pip-version-check', '--quiet', '--retries', '1', '--timeout', '20', '-r', REQUIREMENTS], { timeout: 600_000 });
    await run(python, ['-c', 'import websockets, msgpack, numpy, zstandard'], { timeout: 60_000 });
  } catch (e) {
    return { python: null, reason: `pip could not install test/python/requirements.txt into .venv (${lastLine(e)})` };
  }
  fs.writeFileSync(STAMP, wanted);
  process.stderr.write(`made .venv for the Python client tests (${wanted.trim().split('\n').join(', ')})\n`);
  return { python, reason: null };
}

export default async function setup(project: TestProject): Promise<void> {
  project.provide('python', await ensurePythonEnv());
}
