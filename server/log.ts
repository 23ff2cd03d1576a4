/** One-line server log on stderr, with a level filter (VELA_LOG_LEVEL). Stacks stay here, never on the wire. */
const LEVELS = { error: 0, warn: 1, info: 2, debug: 3 } as const;
type Level = keyof typeof LEVELS;
let threshold: number = LEVELS.info;

/** The last RECENT_LINES warn and error lines, kept whatever the level (see log.recent). */
const RECENT_LINES = 50;
const recent: string[] = [];

function write(level: Level, msg: string, err?: unknown): void {
  const keep = LEVELS[level] <= LEVELS.warn;
  if (LEVELS[level] > threshold && !keep) return;
  // One record, one line: a message that quotes another program's output (ffmpeg) stays whole.
  const line = `${new Date().toISOString()} ${level.padEnd(5)} ${msg.replace(/\r?\n/g, ' \\n ')}`;
  if (keep) {
    recent.push(err === undefined ? line : `${line} (${(err as Error)?.message ?? String(err)})`);
    if (recent.length > RECENT_LINES) recent.shift();
  }
  if (LEVELS[level] > threshold) return;
  process.stderr.write(line + '\n');
  if (err !== undefined) process.stderr.write(((err as Error)?.stack ?? String(err)) + '\n');
}

export const log = {
  setLevel(level: string): void {
    if (!(level in LEVELS)) throw new Error(`log level must be one of ${Object.keys(LEVELS).join(', ')}, got "${level}"`);
    threshold = LEVELS[level as Level];
  },
  error: (msg: string, err?: unknown) => write('error', msg, err),
  warn: (msg: string, err?: unknown) => write('warn', msg, err),
  info: (msg: string) => write('info', msg),
  debug: (msg: string) => write('debug', msg),
  /**
   * The last 50 warn and error lines of this process, oldest first, also those the level hid:
   * what a failure report quotes (a test that runs the server at level error names the warning
   * that explains an unexpected close).
   */
  recent: (): string[] => [...recent],
};
