/**
 * Quiet by default (issue 35, item 10): TensorFlow's native start-up banner ("WARNING: All log
 * messages before absl::InitializeLog() ..." and "I0000 ... port.cc:...] oneDNN custom operations
 * are on ...") is not on the stderr of `vela backend`, `vela policy` or `vela serve` run as real
 * processes on the native backend (which loads libtensorflow, in the engine worker for serve);
 * it is there when asked for (TF_CPP_MIN_LOG_LEVEL=0, --log-level debug). A SIGKILL of the `vela`
 * process leaves no command running behind it (bin/vela.js runs the command in a child).
 */
import { execFile, spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { NormStatsSet } from '../kernels/normalize.ts';
import { installStatus } from '../kernels/backend/native.ts';
import { tinyLoraCheckpoint } from './helpers/policy-proc.ts';

const ROOT = path.resolve(import.meta.dirname, '..');
const VELA = path.join(ROOT, 'bin/vela.js');
const ABSL = /^WARNING: All log messages before absl::InitializeLog\(\)/m;
const ONEDNN = /^I\d{4} .*port\.cc:\d+\] oneDNN custom operations are on/m;
/** The variables a developer's shell may carry that would ask for the banner. */
const CLEAN = (() => {
  const env = { ...process.env };
  for (const k of ['TF_CPP_MIN_LOG_LEVEL', 'VELA_TF_LOGS', 'VELA_LOG_LEVEL', 'VELA_BACKEND']) delete env[k];
  return env;
})();
const NATIVE = installStatus()?.node?.ok === true;

async function run(args: string[], env: NodeJS.ProcessEnv = {}): Promise<{ stdout: string; stderr: string }> {
  return promisify(execFile)(process.execPath, [VELA, ...args], { cwd: ROOT, env: { ...CLEAN, ...env }, timeout: 120_000 });
}

/** Starts a long-running command, resolves once stdout matches `ready`, with its stderr so far. */
function startUntil(args: string[], ready: RegExp, env: NodeJS.ProcessEnv = {}) {
  const proc = spawn(process.execPath, [VELA, ...args], { cwd: ROOT, env: { ...CLEAN, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  proc.stderr!.on('data', (b) => (err += b));
  const listening = new Promise<void>((resolve, reject) => {
    proc.stdout!.on('data', (b) => {
      out += b;
      if (ready.test(out)) resolve();
    });
    proc.once('exit', (code) => reject(new Error(`vela ${args[0]} exited with ${code}: ${err}`)));
  });
  return { proc, listening, stdout: () => out, stderr: () => err };
}

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-quiet-'));
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

describe.skipIf(!NATIVE)('vela is quiet by default (native backend)', () => {
  it('vela backend: no absl / oneDNN line; TF_CPP_MIN_LOG_LEVEL=0 and --log-level debug show them', async () => {
    // Three independent processes, started together: each spends seconds loading libtensorflow.
    const [quiet, asked, debug] = await Promise.all([
      run(['backend', '--backend', 'node']),
      run(['backend', '--backend', 'node'], { TF_CPP_MIN_LOG_LEVEL: '0' }),
      run(['backend', '--backend', 'node', '--log-level', 'debug']),
    ]);
    expect(quiet.stdout).toMatch(/^backend tensorflow \(tfjs-node\) on CPU/);
    expect(quiet.stderr).not.toMatch(ABSL);
    expect(quiet.stderr).not.toMatch(ONEDNN);
    expect(quiet.stderr).not.toMatch(/errors/);

    expect(asked.stderr).toMatch(ABSL);
    expect(asked.stderr).toMatch(ONEDNN);
    expect(debug.stderr).toMatch(ONEDNN);
  }, 240_000);

  describe('vela policy on a preset checkpoint', () => {
    const D = 7;
    const STATS: NormStatsSet = {
      state: { mean: new Array(D).fill(0), std: new Array(D).fill(0.5), q01: new Array(D).fill(-1.2), q99: new Array(D).fill(1.2) },
      actions: { mean: new Array(6).fill(0), std: new Array(6).fill(0.5), q01: new Array(6).fill(-1.2), q99: new Array(6).fill(1.2) },
    };
    const ck = path.join(tmp, 'ck');
    beforeAll(async () => {
      await tinyLoraCheckpoint(ck, { cameras: ['cam_high'], action_dim: 6, action_horizon: 4 }, STATS);
    }, 120_000);

    it('prints no banner by default, and the banner with --log-level debug', async () => {
      // The two servers are independent (port 0 each): started together.
      await Promise.all(([[[], false], [['--log-level', 'debug'], true]] as const).map(async ([extra, shown]) => {
        const p = startUntil(['policy', ck, '--port', '0', '--backend', 'node', ...extra], /Vela policy server on ws:\/\//);
        try {
          await p.listening;
          expect(p.stderr()).toMatch(shown ? ONEDNN : /^/);
          if (!shown) {
            expect(p.stderr()).not.toMatch(ABSL);
            expect(p.stderr()).not.toMatch(ONEDNN);
          }
        } finally {
          p.proc.kill('SIGTERM');
          await new Promise((r) => p.proc.once('close', r));
        }
      }));
    }, 240_000);
  });

  it('vela serve: the engine worker loads TensorFlow without a banner; a SIGKILL of vela takes its command with it', async () => {
    const env = { VELA_PORT: '0', VELA_HOST: '127.0.0.1', VELA_API_KEY: 'quiet-key', VELA_DATA_DIR: path.join(tmp, 'data'), VELA_DATASETS_DIR: path.join(tmp, 'ds') };
    const p = startUntil(['serve'], /^backend tensorflow \(tfjs-node\)/m, env);
    await p.listening;
    // The backend line comes after the engine worker initialised tfjs-node.
    expect(p.stderr()).not.toMatch(ABSL);
    expect(p.stderr()).not.toMatch(ONEDNN);
    const kids = fs.readFileSync(`/proc/${p.proc.pid}/task/${p.proc.pid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean).map(Number);
    p.proc.kill('SIGKILL');
    await new Promise((r) => p.proc.once('close', r));
    // Whatever ran the command is gone soon after (its IPC channel closed); poll, never a fixed sleep.
    const alive = (pid: number) => {
      try {
        return !/^State:\s+Z/m.test(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
      } catch {
        return false;
      }
    };
    for (const pid of kids) {
      for (let i = 0; i < 200 && alive(pid); i++) await new Promise((r) => setTimeout(r, 50));
      expect(alive(pid)).toBe(false);
    }
  }, 240_000);
});
