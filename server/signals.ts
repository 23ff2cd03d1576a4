/** SIGINT/SIGTERM for long-running commands: the first asks for a graceful stop, a second exits now. */
import { log } from './log.ts';

/** Call `close` on the first SIGINT/SIGTERM, then exit 0 (1 if it fails); a second signal exits 1 at once. */
export function stopOnSignals(close: () => Promise<void>, what = 'shutting down (finishing in-flight requests)'): void {
  let stopping = false;
  const stop = (signal: string) => {
    if (stopping) {
      log.warn(`${signal} again: exiting now`);
      process.exit(1);
    }
    stopping = true;
    log.info(`${signal}: ${what}`);
    close().then(
      () => process.exit(0),
      (e) => {
        log.error('shutdown failed', e);
        process.exit(1);
      },
    );
  };
  process.on('SIGINT', () => stop('SIGINT'));
  process.on('SIGTERM', () => stop('SIGTERM'));
}
