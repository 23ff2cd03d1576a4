/**
 * Tests that need something the project cannot install by itself (a system Chromium, the zstd
 * CLI) or that its set-up could not make (the Python virtualenv, when pip is unreachable): on a
 * developer's machine they skip with one line saying why; with CI=true a missing requirement
 * fails the file instead, so CI never passes by skipping.
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import { inject } from 'vitest';

/**
 * Whether a file's tests must skip: false when `reason` is null (the requirement is met).
 * Otherwise prints `skipped: <what>: <reason>` once and returns true, or throws under CI=true.
 * Use as `describe.skipIf(missing('...', reason))(...)`.
 * @throws Error naming the requirement and the reason, when CI is "true" or "1".
 */
export function missing(what: string, reason: string | null): boolean {
  if (reason === null) return false;
  if (/^(true|1)$/i.test(process.env.CI ?? '')) throw new Error(`${what} is required when CI=true: ${reason}`);
  console.warn(`skipped: ${what}: ${reason}`);
  return true;
}

/** The test virtualenv's Python (made by test/setup/python-env.ts), or null with the reason. */
export function pythonEnv(): { python: string | null; reason: string | null } {
  return inject('python');
}

/** The Chromium that playwright-core drives: $CHROMIUM_PATH, else Debian's /usr/bin/chromium. */
export function chromiumPath(): { path: string; reason: string | null } {
  const p = process.env.CHROMIUM_PATH || '/usr/bin/chromium';
  return { path: p, reason: fs.existsSync(p) ? null : `no Chromium at ${p} (Debian: apt-get install chromium; or set CHROMIUM_PATH)` };
}

/** Null when the `zstd` command runs, else why not. */
export function zstdCliReason(): string | null {
  const r = spawnSync('zstd', ['--version'], { encoding: 'utf8' });
  return r.status === 0 ? null : 'the zstd command is not installed (Debian: apt-get install zstd)';
}
