/**
 * Test helper: run one of test/python's client scripts with the test virtualenv's Python (made by
 * test/setup/python-env.ts; the system `python3` when it could not be made, enough for scripts
 * that need only the standard library) and parse the JSON it prints. A failure throws with the
 * script's stderr, so the test says what the Python client saw.
 */
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { fileURLToPath } from 'node:url';
import { pythonEnv } from './requires.ts';

const run = promisify(execFile);

/** Run `test/python/<script>` with `args`; resolves with its stdout parsed as JSON. */
export async function runPythonJson(script: string, args: string[], timeoutMs: number): Promise<any> {
  const file = fileURLToPath(new URL(`../python/${script}`, import.meta.url));
  try {
    const { stdout } = await run(pythonEnv().python ?? 'python3', [file, ...args], { timeout: timeoutMs, maxBuffer: 64 * 1024 * 1024 });
    return JSON.parse(stdout);
  } catch (e) {
    const err = e as { stderr?: string; stdout?: string; message: string };
    throw new Error(`the Python client ${script} failed:\n${err.stdout ?? ''}\n${err.stderr ?? err.message}`);
  }
}
