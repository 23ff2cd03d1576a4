/**
 * Stopping on signals (server/signals.ts) in a real child process: a SIGTERM that arrives twice
 * at once (a service manager signals the whole process group and npm forwards its own copy) is
 * one graceful stop; a second signal a second or more later exits at once.
 */
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const CHILD = fileURLToPath(new URL('./fixtures/signals-child.ts', import.meta.url));

/** Starts the child, sends SIGTERM at each of `at` ms after it is ready; its exit code and output. */
function run(closeMs: number, at: number[]): Promise<{ code: number | null; out: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', 'tsx', CHILD], { env: { ...process.env, CLOSE_MS: String(closeMs), VELA_LOG_LEVEL: 'info' } });
    let out = '';
    const add = (d: Buffer) => {
      if (!out.includes('ready') && (out + d).includes('ready')) for (const t of at) setTimeout(() => child.kill('SIGTERM'), t);
      out += d;
    };
    child.stdout.on('data', add);
    child.stderr.on('data', (d: Buffer) => (out += d));
    child.on('error', reject);
    child.on('exit', (code) => resolve({ code, out }));
  });
}

describe('stopOnSignals', () => {
  it('takes two SIGTERMs 40 ms apart as one graceful stop: close runs to its end, exit 0', async () => {
    const { code, out } = await run(500, [0, 40]);
    expect(out).toContain('SIGTERM: shutting down');
    expect(out).toContain('closed');
    expect(out).not.toContain('again: exiting now');
    expect(code).toBe(0);
  }, 30_000);

  it('exits 1 at once on a second SIGTERM 1.5 s after the first, before close ends', async () => {
    const { code, out } = await run(10_000, [0, 1500]);
    expect(out).toContain('SIGTERM again: exiting now');
    expect(out).not.toContain('closed');
    expect(code).toBe(1);
  }, 30_000);
});
