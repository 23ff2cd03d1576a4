/**
 * Process-level handling for long-running commands: SIGINT/SIGTERM ask for a graceful stop (a
 * second signal, a second or more later, exits now), and the last line of defence behind the
 * per-request guard (server/http/guard.ts): a rejected promise that nobody handled is logged and the server goes on (it
 * belonged to one request); an exception that escaped every guard leaves the process in an
 * unknown state, so it is logged and the server shuts down gracefully (in-flight requests are
 * answered, jobs resume from their checkpoints on restart) and exits 1.
 */
import { log } from '../log.ts';

/**
 * A repeat of the stop signal within this many ms is the same stop delivered twice, not a second
 * request: a service manager (systemd's control-group kill) or `kill -- -PGID` signals every
 * process of the group, and npm then forwards its own copy to the server ~40 ms later.
 */
const REPEAT_MS = 1000;

/**
 * Call `close` on the first SIGINT/SIGTERM (or uncaught exception), then exit 0 (1 after an
 * exception or a failed close); a second signal at least REPEAT_MS (1 s) later exits 1 at once.
 */
export function stopOnSignals(close: () => Promise<void>, what = 'shutting down (finishing in-flight requests)'): void {
  let stoppingSince: number | null = null;
  const stop = (reason: string, code: number) => {
    if (stoppingSince !== null) {
      if (code === 0 && performance.now() - stoppingSince < REPEAT_MS) return;
      log.warn(`${reason} again: exiting now`);
      process.exit(1);
    }
    stoppingSince = performance.now();
    log.info(`${reason}: ${what}`);
    close().then(
      () => process.exit(code),
      (e) => {
        log.error('shutdown failed', e);
        process.exit(1);
      },
    );
  };
  process.on('SIGINT', () => stop('SIGINT', 0));
  process.on('SIGTERM', () => stop('SIGTERM', 0));
  process.on('unhandledRejection', (reason) => {
    log.error('a promise was rejected and nobody handled it (a bug; the server goes on)', reason);
  });
  process.on('uncaughtException', (err) => {
    log.error('an exception escaped every handler (a bug)', err);
    stop('uncaught exception', 1);
  });
}
