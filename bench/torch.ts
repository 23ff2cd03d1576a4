/**
 * The PyTorch reference (bench/torch_reference.py): runs it with python3 when torch imports,
 * checks its parameter count against MODEL.md (kernels/small/config.ts countParams), and times it in
 * turns with Vela's in-process step on the same preset, batch and cameras (full fine-tune, AdamW).
 */
import { spawn, spawnSync, type ChildProcessWithoutNullStreams } from 'node:child_process';
import os from 'node:os';
import { fileURLToPath } from 'node:url';
import { countParams, makeConfig } from '../kernels/small/config.ts';
import { summarize, timeCalls } from './stats.ts';
import type { TorchResult } from './schema.ts';

const SCRIPT = fileURLToPath(new URL('./torch_reference.py', import.meta.url));

/** Why torch cannot run here, or null when `python3 -c "import torch"` works. */
export function torchUnavailable(): string | null {
  const r = spawnSync('python3', ['-c', 'import torch'], { encoding: 'utf8' });
  if (r.error) return `python3 not found (${r.error.message})`;
  if (r.status !== 0) return `python3 cannot import torch: ${r.stderr.trim().split('\n').pop()}`;
  return null;
}

/** Thread counts to time: 1 (the wasm backend's one thread) and every core. */
export function torchThreads(): number[] {
  const n = os.cpus().length;
  return n > 1 ? [1, n] : [1];
}

/** Steps per block when Vela and PyTorch take turns. */
export const TORCH_BLOCK = 4;

/**
 * A long-lived bench/torch_reference.py (--serve: training steps; --sample-serve: sampling, see
 * bench/infer.ts) that answers one JSON line per JSON request line.
 */
export class TorchProcess {
  private buffered = '';
  private lines: string[] = [];
  private waiter: ((line: string | null) => void) | null = null;
  private stderr = '';
  private ended = false;

  private constructor(private child: ChildProcessWithoutNullStreams) {
    child.stdout.on('data', (d: Buffer) => {
      this.buffered += d.toString();
      let nl: number;
      while ((nl = this.buffered.indexOf('\n')) >= 0) {
        this.lines.push(this.buffered.slice(0, nl));
        this.buffered = this.buffered.slice(nl + 1);
      }
      this.wake();
    });
    child.stderr.on('data', (d: Buffer) => (this.stderr += d.toString()));
    child.on('close', () => {
      this.ended = true;
      this.wake();
    });
  }

  /** Starts python3 on torch_reference.py with `args` (which name the serve mode). */
  static start(args: string[]): TorchProcess {
    return new TorchProcess(spawn('python3', [SCRIPT, ...args], { stdio: ['pipe', 'pipe', 'pipe'] }));
  }

  private wake(): void {
    const w = this.waiter;
    if (!w || (this.lines.length === 0 && !this.ended)) return;
    this.waiter = null;
    w(this.lines.shift() ?? null);
  }

  /** The next JSON line. @throws Error with the script's stderr when it exits first. */
  async next(): Promise<any> {
    const line = this.lines.length > 0 ? this.lines.shift()! : await new Promise<string | null>((resolve) => {
      this.waiter = resolve;
      this.wake();
    });
    if (line === null) throw new Error(`torch_reference.py exited: ${this.stderr.trim().slice(-800)}`);
    return JSON.parse(line);
  }

  /** Sends one request line and resolves with the answer line. @throws Error as next(). */
  async ask(request: Record<string, unknown>): Promise<any> {
    this.child.stdin.write(`${JSON.stringify(request)}\n`);
    return this.next();
  }

  /** Times `steps` PyTorch steps on `threads` threads; ms each. */
  async steps(threads: number, steps: number): Promise<number[]> {
    return (await this.ask({ threads, steps })).step_ms as number[];
  }

  close(): void {
    this.child.stdin.end();
    this.child.kill();
  }
}

/**
 * Times PyTorch and Vela in turns: blocks of TORCH_BLOCK Vela steps (`velaStep`, one step on the
 * engine, awaited) alternate with blocks of PyTorch steps at each thread count, until each has
 * `steps` timed steps, so that load from other processes on a shared machine lands on both alike
 * (separate runs minutes apart moved the ratio from 2.8x to 3.4x). `ratio` is Vela's p50 over the
 * 1-thread PyTorch p50.
 * @throws Error with the script's stderr when it fails, or when its parameter count is not MODEL.md's.
 */
export async function runTorch(preset: string, batch: number, cameras: number, steps: number, burnIn: number, velaStep: () => Promise<void>): Promise<TorchResult> {
  const expected = countParams(makeConfig(preset));
  const threads = torchThreads();
  const proc = TorchProcess.start(['--preset', preset, '--batch', String(batch), '--cameras', String(cameras), '--threads', threads.join(','), '--burn-in', String(burnIn), '--serve']);
  try {
    const head = await proc.next();
    if (head.params !== expected) throw new Error(`torch_reference.py builds ${head.params} parameters; MODEL.md's ${preset} has ${expected}`);
    for (let i = 0; i < burnIn; i++) await velaStep();
    const vela: number[] = [];
    const torch = new Map<number, number[]>(threads.map((t) => [t, []]));
    while (vela.length < steps) {
      const n = Math.min(TORCH_BLOCK, steps - vela.length);
      vela.push(...(await timeCalls(n, 0, velaStep)));
      for (const t of threads) torch.get(t)!.push(...(await proc.steps(t, n)));
    }
    const rows = threads.map((t) => ({ threads: t, batch, stepMs: summarize(torch.get(t)!) }));
    const velaStepMs = summarize(vela);
    return { torchVersion: head.torch_version, params: head.params, paramsExpected: expected, rows, velaStepMs, ratio: velaStepMs.p50 / rows[0]!.stepMs.p50, blockSteps: TORCH_BLOCK };
  } finally {
    proc.close();
  }
}
