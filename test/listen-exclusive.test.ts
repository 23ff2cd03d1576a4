/**
 * A server owns its port alone. uWS binds with SO_REUSEPORT unless told otherwise, so a second
 * `vela serve` (or `vela policy`) on a busy port used to print "listening", and the kernel split
 * connections between the two: a valid key got random 401s and 404s from the other server.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { log } from '../server/log.ts';
import { startPolicyServer } from '../server/policy/index.ts';
import { NodeProc } from '../bench/harness/node-proc.ts';
import { stubEngine } from '../bench/harness/policy-stub.ts';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

/**
 * A port that is free now. The servers must be started on a port they are given, as users do:
 * Linux never shares a port the kernel picked (port 0) by SO_REUSEPORT, so port 0 hides the bug.
 */
function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address() as net.AddressInfo;
      s.close(() => resolve(port));
    });
  });
}

/** Runs `vela ARGS` to its end: exit code and stderr. */
function vela(args: string[], env: Record<string, string>): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [path.join(ROOT, 'bin/vela.js'), ...args], {
      cwd: ROOT,
      env: { ...process.env, VELA_BACKEND: 'wasm', VELA_LOG_LEVEL: 'warn', ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d));
    child.stderr.on('data', (d: Buffer) => (stderr += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), 60_000); // it must exit by itself; a listening server would not
    child.on('error', reject);
    child.on('exit', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

describe('one server per port', () => {
  let first: NodeProc;
  let tmp: string;
  beforeAll(async () => {
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-port-'));
    first = await NodeProc.start({ VELA_DATA_DIR: path.join(tmp, 'a'), VELA_API_KEY: 'key-a', VELA_PORT: String(await freePort()) });
  }, 120_000);
  afterAll(async () => {
    await first?.stop();
    fs.rmSync(tmp, { recursive: true, force: true });
  });

  it('a second vela serve on a taken port exits 1 with one line naming the address; the first keeps answering', async () => {
    const port = new URL(first.baseUrl).port;
    const second = await vela(['serve', '--host', '127.0.0.1', '--port', port], { VELA_DATA_DIR: path.join(tmp, 'b'), VELA_API_KEY: 'key-b' });
    expect(second.stdout).not.toContain('listening');
    expect(second.code).toBe(1);
    const lines = second.stderr.trim().split('\n');
    expect(lines).toHaveLength(1);
    expect(lines[0]).toContain(`cannot listen on 127.0.0.1:${port}: the address is in use`);
    // Every request reaches the first server: its key works each time, the other's never.
    for (let i = 0; i < 20; i++) {
      const ok = await fetch(`${first.baseUrl}/v1/fine-tunes`, { headers: { authorization: 'Bearer key-a' } });
      expect(ok.status).toBe(200);
      await ok.arrayBuffer();
    }
  }, 120_000);

  it('a second policy server on a taken port is refused', async () => {
    log.setLevel('error');
    const a = await startPolicyServer({ engine: stubEngine(), checkpointDir: '/ckpt', policyId: 'p', seed: 1, batchWindowMs: 0, maxBatch: 1, port: await freePort() });
    try {
      const engine = stubEngine();
      await expect(startPolicyServer({ engine, checkpointDir: '/ckpt', policyId: 'p', seed: 1, batchWindowMs: 0, maxBatch: 1, port: a.port }))
        .rejects.toThrow(`cannot listen on 127.0.0.1:${a.port}: the address is in use`);
    } finally {
      await a.close();
    }
  });
});
