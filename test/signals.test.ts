/**
 * Stopping on signals (server/cli/signals.ts) in a real child process: a SIGTERM that arrives twice
 * at once (a service manager signals the whole process group and npm forwards its own copy) is
 * one graceful stop; a second signal a second or more later exits at once. And `vela serve`
 * stops cleanly on a Ctrl-C that comes as soon as it answers, before its banner (the backend
 * probe takes seconds): a fresh user's Ctrl-C there once left the database's -wal and -shm files.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { TEST_BACKENDS } from './helpers/tf.ts';

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

describe('vela serve', () => {
  it('a SIGINT as soon as /healthz answers (before the banner) is a clean stop: exit 0, no -wal or -shm left', async () => {
    const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-sigint-'));
    const port = 20000 + Math.floor(Math.random() * 20000);
    try {
      const child = spawn(process.execPath, [fileURLToPath(new URL('../bin/vela.js', import.meta.url)), 'serve'], {
        env: { ...process.env, VELA_PORT: String(port), VELA_DATA_DIR: dataDir, VELA_API_KEY: 'sigint-key', VELA_BACKEND: TEST_BACKENDS[0]!, VELA_LOG_LEVEL: 'info' },
      });
      let out = '';
      child.stdout.on('data', (d: Buffer) => (out += d));
      child.stderr.on('data', (d: Buffer) => (out += d));
      const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
      for (const deadline = performance.now() + 60_000; ; await new Promise((r) => setTimeout(r, 20))) {
        expect(performance.now(), `vela serve never answered /healthz:\n${out}`).toBeLessThan(deadline);
        if ((await fetch(`http://127.0.0.1:${port}/healthz`).catch(() => null))?.ok) break;
      }
      const beforeBanner = !out.includes('Vela listening');
      child.kill('SIGINT');
      const code = await exited;
      expect(out).toContain('SIGINT: shutting down');
      expect(code, out).toBe(0);
      expect(fs.readdirSync(dataDir).filter((f) => /-(wal|shm)$/.test(f))).toEqual([]);
      // Where the signal landed (the banner waits for the backend probe, seconds on 2 cores).
      console.log(`SIGINT ${beforeBanner ? 'before' : 'after'} the banner`);
    } finally {
      fs.rmSync(dataDir, { recursive: true, force: true });
    }
  }, 90_000);
});
