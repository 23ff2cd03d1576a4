/**
 * The PyTorch reference (bench/torch_reference.py): runs it with python3 when torch imports,
 * checks its parameter count against MODEL.md (kernels/config.ts countParams), and pairs it with
 * Vela's in-process step on the same preset, batch and cameras (full fine-tune, AdamW).
 */
import { spawn, spawnSync } from 'node:child_process';
import os from 'node:os';
import { fileURLToPath } from 'node:url';
import { countParams, makeConfig } from '../kernels/config.ts';
import { summarize } from './stats.ts';
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

/**
 * Runs the reference and builds the result with Vela's step samples (ms).
 * @throws Error with the script's stderr when it fails, or when its parameter count is not MODEL.md's.
 */
export async function runTorch(preset: string, batch: number, cameras: number, steps: number, burnIn: number, velaStepMs: number[]): Promise<TorchResult> {
  const expected = countParams(makeConfig(preset));
  const args = [SCRIPT, '--preset', preset, '--batch', String(batch), '--cameras', String(cameras), '--threads', torchThreads().join(','), '--steps', String(steps), '--burn-in', String(burnIn)];
  // Asynchronous: a blocked event loop would leave the HTTP client's kept-alive sockets unread,
  // and its next request would pick one the server has closed meanwhile.
  const r = await new Promise<{ status: number | null; stdout: string; stderr: string }>((resolve, reject) => {
    const child = spawn('python3', args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('error', reject);
    child.on('close', (status) => resolve({ status, stdout, stderr }));
  });
  if (r.status !== 0) throw new Error(`torch_reference.py failed (${r.status}): ${r.stderr.trim().slice(-800)}`);
  const out = JSON.parse(r.stdout.trim().split('\n').pop()!);
  if (out.params !== expected) throw new Error(`torch_reference.py builds ${out.params} parameters; MODEL.md's ${preset} has ${expected}`);
  const rows = (out.rows as any[]).map((x) => ({ threads: x.threads as number, batch: x.batch as number, stepMs: summarize(x.step_ms as number[]) }));
  const vela = summarize(velaStepMs);
  const one = rows.find((x) => x.threads === 1)!;
  return { torchVersion: out.torch_version, params: out.params, paramsExpected: expected, rows, velaStepMs: vela, ratio: vela.p50 / one.stepMs.p50 };
}
