/**
 * The SQL database under the store, as the store sees it: statements with `?` placeholders,
 * numbered migrations, and a notification channel between the processes that share the database.
 * Two implementations: SQLite (one node, the default) and PostgreSQL (several nodes).
 */

/**
 * One schema change. A plain string runs on both databases; an object gives each its own text
 * where their dialects differ (REAL vs DOUBLE PRECISION, SQLite's implicit rowid, ...).
 */
export type Migration = string | { sqlite: string; postgres: string };

export interface Db {
  readonly dialect: 'sqlite' | 'postgres';
  /** Where the database is, for messages (a file path or a URL without its password). */
  readonly where: string;
  /** Every row of a statement; `?` placeholders take `params` in order. */
  all<T = Record<string, unknown>>(sql: string, params?: unknown[]): Promise<T[]>;
  /** The first row, or undefined. */
  get<T = Record<string, unknown>>(sql: string, params?: unknown[]): Promise<T | undefined>;
  /** Run a statement; resolves with the number of rows it changed. */
  run(sql: string, params?: unknown[]): Promise<number>;
  /**
   * Apply `migrations[version..]` in order, each in its own transaction, where `version` is what
   * the database records as applied; concurrent openers (several nodes starting) apply each once.
   * Resolves with the version reached.
   * @throws Error when the database is newer than `migrations` (a newer Vela migrated it).
   */
  migrate(migrations: Migration[]): Promise<number>;
  /** The number of migrations applied. */
  schemaVersion(): Promise<number>;
  /** SQL for "now" in Unix milliseconds, by the database's clock (one clock for every node). */
  readonly nowMsSql: string;
  /** Tell every process listening on `channel` (this one included). Payload: at most 7,000 bytes. */
  notify(channel: string, payload: string): Promise<void>;
  /** Call `fn` with each notification on `channel`; returns a function that stops listening. */
  listen(channel: string, fn: (payload: string) => void): Promise<() => void>;
  close(): Promise<void>;
  /**
   * Run a write that must not be lost, after `after` settles: while the database is unreachable
   * (PostgreSQL stopped or restarting) it waits in memory and is retried until the database
   * answers; SQLite runs it once. `write` gets its attempt number (0 first).
   * @throws the write's error when the database refused it, or was closed meanwhile.
   */
  keep<T>(write: (attempt: number) => Promise<T>, after?: Promise<unknown>): Promise<T>;
  /** Writes given to `keep` and not yet stored (gauge, for /metrics). */
  bufferedRecords(): number;
  /** Statements that failed since open, unique violations excluded (counter, for /metrics). */
  errorCount(): number;
  /**
   * Resolves once fewer than `limit` writes are held, or once `stop()` is true (checked every second).
   * @returns false when it stopped waiting because of `stop` or a close.
   */
  room(limit: number, stop?: () => boolean): Promise<boolean>;
}

/** A statement that broke a unique constraint (two writers chose the same key). */
export function isUniqueViolation(e: unknown): boolean {
  const code = (e as { code?: unknown })?.code;
  return code === '23505' || code === 'SQLITE_CONSTRAINT_PRIMARYKEY' || code === 'SQLITE_CONSTRAINT_UNIQUE';
}
