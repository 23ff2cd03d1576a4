/**
 * Writes that must not be lost while the database is unreachable (issue 22): a job's records
 * wait in memory, in the order they were made, and are retried until the database answers; a
 * statement the database refuses is not retried. The counters that /metrics reads
 * (`Db.bufferedRecords()`, `Db.errorCount()`) live here.
 */
import { log } from '../log.ts';

/** The longest wait between two tries of a held write (ms): a returning database is used within it. */
const RETRY_MAX_MS = 1000;
/** How often a paused job re-checks whether it must stop meanwhile (ms). */
const ROOM_POLL_MS = 1000;

/**
 * Whether `e` says the database cannot be reached now (stopped, restarting, a dropped
 * connection), as opposed to a statement it refused: SQLSTATE class 08 (connection exception),
 * 57P01-57P03 (shutdown, crash, starting up), 53300 (too many connections), or a socket error.
 */
export function isUnavailable(e: unknown): boolean {
  const err = e as { code?: unknown; message?: unknown } | null;
  const code = typeof err?.code === 'string' ? err.code : '';
  if (/^(08...|57P0[123]|53300)$/.test(code)) return true;
  if (['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT', 'EHOSTUNREACH', 'ENETUNREACH', 'EAI_AGAIN'].includes(code)) return true;
  return /Connection terminated|Client has encountered a connection error|timeout exceeded when trying to connect/i.test(String(err?.message ?? ''));
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/**
 * The held writes and failed statements of one database. `retry`: whether an unreachable
 * database is waited for (PostgreSQL); SQLite is a local file, whose errors are final.
 */
export class WriteKeeper {
  private held = 0;
  private errors = 0;
  private closed = false;
  private waiters = new Set<() => void>();
  /** When the current outage began (ms), or null while writes go through. */
  private outageSince: number | null = null;

  constructor(private readonly where: string, private readonly retry: boolean) {}

  /** Writes made but not yet stored: waiting for the database, or for the job's earlier records. */
  bufferedRecords(): number {
    return this.held;
  }

  /** Statements that failed since the database was opened (unique violations the store resolves itself are not counted). */
  errorCount(): number {
    return this.errors;
  }

  /** Count one failed statement. */
  failed(): void {
    this.errors++;
  }

  /**
   * Run `write` once `after` has settled (a write it must follow); while the database is
   * unreachable, try it again (backoff up to RETRY_MAX_MS) until it answers. Counted in
   * bufferedRecords from this call until it settles. `write` gets its attempt number (0 first):
   * a retry after a dropped connection must allow for a first attempt that was committed.
   * @throws the write's error when the database refused it, or when the database was closed.
   */
  async keep<T>(write: (attempt: number) => Promise<T>, after?: Promise<unknown>): Promise<T> {
    this.held++;
    try {
      if (after) await after.catch(() => undefined);
      for (let attempt = 0; ; attempt++) {
        try {
          const out = await write(attempt);
          if (this.outageSince !== null) {
            log.warn(`database ${this.where} answers again after ${((Date.now() - this.outageSince) / 1000).toFixed(1)} s; storing the ${this.held} records held meanwhile`);
            this.outageSince = null;
          }
          return out;
        } catch (e) {
          if (!this.retry || this.closed || !isUnavailable(e)) throw e;
          if (this.outageSince === null) {
            this.outageSince = Date.now();
            log.warn(`database ${this.where} is unreachable (${(e as Error).message}); job records wait in memory and are stored when it returns`);
          }
          await sleep(Math.min(RETRY_MAX_MS, 50 * 2 ** attempt));
        }
      }
    } finally {
      this.held--;
      for (const wake of this.waiters) wake();
    }
  }

  /**
   * Resolves once fewer than `limit` writes are held, or when `stop()` turns true (checked every
   * ROOM_POLL_MS). @returns whether there is room (false: it stopped waiting because of `stop`).
   */
  async room(limit: number, stop: () => boolean = () => false): Promise<boolean> {
    while (this.held >= limit) {
      if (stop() || this.closed) return false;
      await new Promise<void>((resolve) => {
        const done = () => {
          clearTimeout(timer);
          this.waiters.delete(done);
          resolve();
        };
        const timer = setTimeout(done, ROOM_POLL_MS);
        this.waiters.add(done);
      });
    }
    return true;
  }

  /** Held writes stop retrying (their next try fails with the database's error). */
  close(): void {
    this.closed = true;
    for (const wake of this.waiters) wake();
  }
}

/**
 * The part of `Db` a WriteKeeper answers (keep, bufferedRecords, errorCount, room: their meaning is
 * in types.ts), for both databases to extend: each makes its keeper, PostgreSQL's waiting out an
 * outage and SQLite's trying once.
 */
export abstract class KeptDb {
  protected abstract readonly keeper: WriteKeeper;

  keep<T>(write: (attempt: number) => Promise<T>, after?: Promise<unknown>): Promise<T> {
    return this.keeper.keep(write, after);
  }

  bufferedRecords(): number {
    return this.keeper.bufferedRecords();
  }

  errorCount(): number {
    return this.keeper.errorCount();
  }

  room(limit: number, stop?: () => boolean): Promise<boolean> {
    return this.keeper.room(limit, stop);
  }
}
