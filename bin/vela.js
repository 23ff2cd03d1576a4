#!/usr/bin/env node
// Runs the TypeScript CLI through tsx's loader, so `npx vela ...` works without a build step.
//
// Quiet by default: libtensorflow (tfjs-node) writes a start-up banner to file descriptor 2 as it
// loads ("WARNING: All log messages before absl::InitializeLog() ..." and "I0000 ... port.cc:...]
// oneDNN custom operations are on ..."). Those two lines come from absl's logging before
// TensorFlow reads TF_CPP_MIN_LOG_LEVEL, so no variable silences them, and native code writes past
// process.stderr. So `vela` runs the command in a child process whose stderr passes through here,
// with exactly those banner lines dropped (everything else, partial lines and progress bars
// included, passes unchanged). oneDNN stays on: only the message goes, never the numerics.
//
// The banner is shown (no filter, the command runs in this process) when asked for:
// `--log-level debug`, VELA_LOG_LEVEL=debug, TF_CPP_MIN_LOG_LEVEL=0 or 1 (TensorFlow's own "show
// INFO / WARNING"), or VELA_TF_LOGS=1. Test helpers that SIGKILL or read the RSS of the pid they
// spawned set VELA_TF_LOGS=1, so that pid is the command itself.
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const CHILD = 'VELA_STDERR_FILTERED';

/** Whether the user asked to see TensorFlow's native start-up lines. */
function nativeLogsWanted(argv, env) {
  const i = argv.indexOf('--log-level');
  const level = i >= 0 ? argv[i + 1] : argv.find((a) => a.startsWith('--log-level='))?.slice('--log-level='.length);
  if ((level ?? env.VELA_LOG_LEVEL) === 'debug') return true;
  if (env.TF_CPP_MIN_LOG_LEVEL === '0' || env.TF_CPP_MIN_LOG_LEVEL === '1') return true;
  return /^(1|true|yes|on)$/i.test(env.VELA_TF_LOGS ?? '');
}

/** The banner lines dropped (whole lines, without their newline). */
const BANNER = [
  /^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$/,
  /^I\d{4} [\d:.]+\s+\d+ port\.cc:\d+\] oneDNN custom operations are on\. /,
];
/** A partial line that may still become a banner line: held until its newline (or 100 ms). */
const maybeBanner = (s) => 'WARNING: All log messages before absl'.startsWith(s.slice(0, 37)) || /^I\d{0,4}( [\d:.]*)?$/.test(s.slice(0, 24)) || /^I\d{4} [\d:.]+\s+\d+ port/.test(s);

function supervise() {
  const script = fileURLToPath(import.meta.url);
  const env = { ...process.env, [CHILD]: '1' };
  // The command's progress bar asks whether stderr is a terminal; it still is, behind the filter.
  if (process.stderr.isTTY) env.VELA_STDERR_TTY = String(process.stderr.columns || 80);
  const child = spawn(process.execPath, [...process.execArgv, script, ...process.argv.slice(2)], { stdio: ['inherit', 'inherit', 'pipe', 'ipc'], env });
  let held = '';
  let timer = null;
  const flush = () => {
    if (timer) clearTimeout(timer), (timer = null);
    if (held) process.stderr.write(held), (held = '');
  };
  child.stderr.on('data', (chunk) => {
    if (timer) clearTimeout(timer), (timer = null);
    const text = held + chunk.toString('utf8');
    const lines = text.split('\n');
    const last = lines.pop();
    const kept = lines.filter((l) => !BANNER.some((re) => re.test(l))).map((l) => l + '\n').join('');
    if (kept) process.stderr.write(kept);
    held = '';
    if (last) {
      if (maybeBanner(last)) (held = last), (timer = setTimeout(flush, 100));
      else process.stderr.write(last);
    }
  });
  // Signals meant for the command go to it (a stop signal delivered twice within a second, as by
  // a terminal's Ctrl-C to the whole group, counts once: server/cli/signals.ts).
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) process.on(sig, () => child.kill(sig));
  child.on('close', (code, signal) => {
    flush();
    if (signal) {
      for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) process.removeAllListeners(sig);
      process.kill(process.pid, signal);
    } else process.exit(code ?? 1);
  });
}

if (!process.env[CHILD] && !nativeLogsWanted(process.argv.slice(2), process.env)) supervise();
else {
  if (process.env[CHILD]) {
    delete process.env[CHILD];
    // This process dies with the filter (even a SIGKILL of it closes the IPC channel), so a
    // killed `vela` never leaves its command running; the channel itself keeps nothing alive.
    if (process.channel) {
      process.channel.unref();
      process.on('disconnect', () => process.kill(process.pid, 'SIGKILL'));
    }
    if (process.env.VELA_STDERR_TTY) {
      process.stderr.isTTY = true;
      process.stderr.columns = Number(process.env.VELA_STDERR_TTY);
      delete process.env.VELA_STDERR_TTY;
    }
  }
  const { register } = await import('tsx/esm/api');
  register();
  await import('../server/cli/vela.ts');
}
