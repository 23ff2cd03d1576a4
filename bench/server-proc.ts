/**
 * The parent's handle on bench/server-child.ts: forks it (with tsx), waits until it listens, and
 * sends it commands over IPC. RSS is read from /proc/<pid>/status when present (the whole
 * process: main thread, engine worker, native memory), else from the child's own report.
 */
import { fork, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';

export interface ServerStats {
  rssBytes: number;
  heapUsedBytes: number;
  tensors: number | null;
  engine: { queued: number; sessions: number; calls: number };
}

export class ServerProc {
  private nextId = 1;
  private closing = false;
  private waiting = new Map<number, { resolve: (v: any) => void; reject: (e: Error) => void }>();

  private constructor(private child: ChildProcess, readonly baseUrl: string, readonly apiKey: string, readonly pid: number) {
    child.on('message', (m: any) => {
      const w = this.waiting.get(m.id);
      if (!w) return;
      this.waiting.delete(m.id);
      if (m.error !== undefined) w.reject(new Error(m.error));
      else w.resolve(m.result);
    });
    child.on('exit', (code, signal) => {
      if (!this.closing) process.stderr.write(`bench: the server process exited unexpectedly (code ${code}, signal ${signal})\n`);
      for (const w of this.waiting.values()) w.reject(new Error(`the bench server exited with code ${code}`));
      this.waiting.clear();
    });
  }

  /** Starts the server process for `preset`; rejects with its stderr when it fails to start. */
  static start(preset: string): Promise<ServerProc> {
    const child = fork(new URL('./server-child.ts', import.meta.url), [], {
      // VELA_BENCH_SERVER_NODE_ARGS: extra node flags for the server, e.g. "--cpu-prof --cpu-prof-dir=/tmp/p".
      execArgv: ['--import', 'tsx', ...(process.env.VELA_BENCH_SERVER_NODE_ARGS?.split(' ').filter(Boolean) ?? [])],
      env: { ...process.env, VELA_BENCH_PRESET: preset },
      stdio: ['ignore', 'inherit', 'pipe', 'ipc'],
    });
    let stderr = '';
    child.stderr!.on('data', (d: Buffer) => {
      stderr += d.toString();
      process.stderr.write(d);
    });
    return new Promise((resolve, reject) => {
      child.once('message', (m: any) => {
        if (m.kind === 'ready') resolve(new ServerProc(child, m.baseUrl, m.apiKey, m.pid));
      });
      child.once('exit', (code) => reject(new Error(`the bench server exited with code ${code} while starting: ${stderr.trim().slice(-500)}`)));
    });
  }

  private send<T>(cmd: string, args: Record<string, unknown> = {}): Promise<T> {
    const id = this.nextId++;
    return new Promise<T>((resolve, reject) => {
      this.waiting.set(id, { resolve, reject });
      this.child.send({ id, cmd, ...args });
    });
  }

  /** The server's memory and the engine's tensor count. */
  async stats(): Promise<ServerStats> {
    const s = await this.send<ServerStats>('stats');
    return { ...s, rssBytes: procRss(this.pid) ?? s.rssBytes };
  }

  /** The process RSS alone (no engine round trip), bytes. */
  rss(): number | null {
    return procRss(this.pid);
  }

  /** Starts a policy server on a checkpoint folder; resolves with its websocket URL. */
  /** Serves checkpoint `dir`: its OpenPI websocket URL. `another`: beside the policy already served, not instead of it. */
  async startPolicy(dir: string, another = false): Promise<string> {
    return (await this.send<{ wsUrl: string }>('policy', { dir, another })).wsUrl;
  }

  async close(): Promise<void> {
    this.closing = true;
    const exited = new Promise((r) => this.child.once('exit', r));
    await this.send('close').catch(() => undefined);
    await Promise.race([exited, new Promise((r) => setTimeout(r, 5000))]);
    if (this.child.exitCode === null) this.child.kill('SIGKILL');
  }
}

function procRss(pid: number): number | null {
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) * 1024 : null;
  } catch {
    return null;
  }
}
