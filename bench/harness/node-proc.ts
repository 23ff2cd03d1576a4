/**
 * Test and bench harness: a real `vela serve` in a child process (bin/vela.js), so that `kill9()` is a real
 * SIGKILL of a node: no shutdown code runs, its heartbeats just stop. Port 0; the address is
 * read from the line the server prints when it listens. Its stderr is kept for failures.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');

export class NodeProc {
  private exited: Promise<void>;
  stderr = '';

  private constructor(readonly child: ChildProcess, readonly baseUrl: string) {
    this.exited = new Promise((resolve) => (child.exitCode !== null || child.signalCode !== null ? resolve() : child.once('exit', () => resolve())));
  }

  /** Whether it still runs (or how it ended) and the tail of its stderr: for a failing test's message. */
  report(chars = 3000): string {
    const { exitCode, signalCode } = this.child;
    const state = exitCode === null && signalCode === null ? 'running' : `exited (${exitCode ?? signalCode})`;
    return `node at ${this.baseUrl}: ${state}; stderr (tail):\n${this.stderr.slice(-chars)}`;
  }

  /** Start `vela serve` with `env` (over the parent's); resolves once it listens. */
  static start(env: Record<string, string>, timeoutMs = 120_000): Promise<NodeProc> {
    const child = spawn(process.execPath, [path.join(ROOT, 'bin/vela.js'), 'serve'], {
      cwd: ROOT,
      // VELA_TF_LOGS=1: bin/vela.js runs serve in this process (no stderr filter in front), so
      // kill9() and an RSS read of child.pid reach the server itself.
      env: { ...process.env, VELA_TF_LOGS: '1', VELA_PORT: '0', VELA_HOST: '127.0.0.1', VELA_BACKEND: 'wasm', VELA_LOG_LEVEL: process.env.VELA_TEST_LOG || 'warn', ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    child.stderr!.on('data', (d: Buffer) => {
      err += d.toString();
      if (process.env.VELA_TEST_LOG) process.stderr.write(d);
    });
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        child.kill('SIGKILL');
        reject(new Error(`vela serve did not listen within ${timeoutMs} ms: ${err.slice(-1000)}`));
      }, timeoutMs);
      child.stdout!.on('data', (d: Buffer) => {
        out += d.toString();
        const m = /Vela listening on (http:\/\/\S+)/.exec(out);
        if (m) {
          clearTimeout(timer);
          child.stdout!.removeAllListeners('data');
          child.stdout!.resume();
          const node = new NodeProc(child, m[1]!);
          child.stderr!.on('data', (dd: Buffer) => (node.stderr += dd.toString()));
          node.stderr = err;
          resolve(node);
        }
      });
      child.once('exit', (code, signal) => {
        clearTimeout(timer);
        reject(new Error(`vela serve exited (${code ?? signal}) while starting: ${err.slice(-2000)}`));
      });
    });
  }

  /** SIGKILL, and wait until it is gone. */
  async kill9(): Promise<void> {
    this.child.kill('SIGKILL');
    await this.exited;
  }

  /** SIGTERM (a graceful stop), SIGKILL after `graceMs`. */
  async stop(graceMs = 30_000): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    this.child.kill('SIGTERM');
    const t = setTimeout(() => this.child.kill('SIGKILL'), graceMs);
    await this.exited;
    clearTimeout(t);
  }
}
