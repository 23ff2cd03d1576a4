/**
 * Test helper: `vela policy ARGS --port 0 --backend wasm` as its own process (wasm: one thread,
 * so answers of different processes are bit-identical), resolving with the URL it prints.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { saveCheckpoint } from '../../kernels/checkpoint.ts';
import type { NormStatsSet } from '../../kernels/normalize.ts';
import { makeConfig } from '../../kernels/small/config.ts';
import { BaseWeights, TrainingState } from '../../kernels/trainer.ts';
import { writeCheckpointNormStats } from '../../server/models/norm-stats.ts';
import { useBackend } from './tf.ts';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');

/** A started `vela policy`: its websocket URL, the process, and its stderr so far. */
export interface PolicyProc {
  url: string;
  proc: ChildProcess;
  stderr: () => string;
}

/**
 * Starts `vela policy` with `args` (plus `--port 0 --backend wasm --log-level warn`) and waits
 * until it listens. `env` is added to this process's environment.
 * @throws Error with the exit code and stderr (`code`, `stderr` fields) when it exits before listening.
 */
export function startPolicyProc(args: string[], env: NodeJS.ProcessEnv = {}): Promise<PolicyProc> {
  const proc = spawn(process.execPath, ['bin/vela.js', 'policy', ...args, '--port', '0', '--backend', 'wasm', '--log-level', 'warn'], { cwd: ROOT, env: { ...process.env, VELA_TF_LOGS: '1', ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let err = '';
  proc.stderr!.on('data', (b) => (err += b));
  return new Promise((resolve, reject) => {
    let out = '';
    proc.stdout!.on('data', (b) => {
      out += b;
      const m = /Vela policy server on (ws:\/\/\S+)/.exec(out);
      if (m) resolve({ url: m[1]!, proc, stderr: () => err });
    });
    proc.once('exit', (code) => reject(Object.assign(new Error(`vela policy exited with ${code}: ${err}`), { code, stderr: err })));
  });
}

/**
 * Writes a fresh LoRA checkpoint of flow0-tiny on the base of seed 0 (what `vela policy` builds)
 * to `dir`: rank 4, alpha 8, `config` added to its config.json (cameras, dims, names), `stats` as
 * its z-score norm stats. Computes on wasm (the backend startPolicyProc serves with).
 */
export async function tinyLoraCheckpoint(dir: string, config: Record<string, unknown>, stats: NormStatsSet): Promise<void> {
  await useBackend('wasm');
  const base = BaseWeights.create(makeConfig('flow0-tiny'), 0);
  const state = new TrainingState(base, { finetune: 'lora', rank: 4, alpha: 8, seed: 0 });
  const ex = state.exportWeights();
  await saveCheckpoint(dir, {
    config: { ...ex.config, preset: 'flow0-tiny', base_seed: 0, ...config },
    adapter: { tensors: ex.weights, config: { peft_type: 'LORA', r: 4, lora_alpha: 8 } },
  });
  state.dispose();
  base.dispose();
  await writeCheckpointNormStats(dir, stats, 'zscore');
}
