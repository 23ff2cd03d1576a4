/**
 * The SQLite database (better-sqlite3, WAL): one file, one process. better-sqlite3 is
 * synchronous; its answers are wrapped in resolved promises so the store has one async
 * interface for both databases. Notifications stay in this process (only one process uses the
 * file), shared by every handle on the same file.
 */
import Database from 'better-sqlite3';
import { EventEmitter } from 'node:events';
import fs from 'node:fs';
import path from 'node:path';
import { KeptDb, WriteKeeper } from './keep.ts';
import { isUniqueViolation, type Db, type Migration } from './types.ts';

/** One notification bus per database file in this process. */
const buses = new Map<string, EventEmitter>();

export class SqliteDb extends KeptDb implements Db {
  readonly dialect = 'sqlite';
  readonly where: string;
  readonly raw: Database.Database;
  readonly nowMsSql = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)";
  private statements = new Map<string, Database.Statement>();
  private bus: EventEmitter;
  /** Counts only: a local file has no outage to wait out, so a held write is tried once. */
  protected readonly keeper: WriteKeeper;

  /** Open (creating if needed) `<dataDir>/vela.sqlite`. */
  constructor(dataDir: string) {
    super();
    fs.mkdirSync(dataDir, { recursive: true });
    this.where = path.join(dataDir, 'vela.sqlite');
    this.raw = new Database(this.where);
    this.keeper = new WriteKeeper(this.where, false);
    const file = path.resolve(this.where);
    this.bus = buses.get(file) ?? new EventEmitter().setMaxListeners(0);
    buses.set(file, this.bus);
    this.raw.pragma('journal_mode = WAL');
    this.raw.pragma('synchronous = NORMAL');
    this.raw.pragma('foreign_keys = ON');
  }

  private prepare(sql: string): Database.Statement {
    let s = this.statements.get(sql);
    if (!s) this.statements.set(sql, (s = this.raw.prepare(sql)));
    return s;
  }

  /** Run `fn` (one statement); a failure is counted (errorCount) and rethrown. */
  private counted<T>(fn: () => T): T {
    try {
      return fn();
    } catch (e) {
      if (!isUniqueViolation(e)) this.keeper.failed();
      throw e;
    }
  }

  async all<T>(sql: string, params: unknown[] = []): Promise<T[]> {
    return this.counted(() => this.prepare(sql).all(...params) as T[]);
  }

  async get<T>(sql: string, params: unknown[] = []): Promise<T | undefined> {
    return this.counted(() => this.prepare(sql).get(...params) as T | undefined);
  }

  async run(sql: string, params: unknown[] = []): Promise<number> {
    return this.counted(() => {
      const s = this.prepare(sql);
      return s.reader ? s.all(...params).length : s.run(...params).changes;
    });
  }

  async migrate(migrations: Migration[]): Promise<number> {
    const version = await this.schemaVersion();
    if (version > migrations.length) {
      throw new Error(`the store at ${this.where} has schema version ${version}; this Vela knows up to ${migrations.length}: upgrade Vela`);
    }
    for (let v = version; v < migrations.length; v++) {
      const m = migrations[v]!;
      this.raw.transaction(() => {
        this.raw.exec(typeof m === 'string' ? m : m.sqlite);
        this.raw.pragma(`user_version = ${v + 1}`);
      })();
    }
    return migrations.length;
  }

  async schemaVersion(): Promise<number> {
    return this.raw.pragma('user_version', { simple: true }) as number;
  }

  async notify(channel: string, payload: string): Promise<void> {
    this.bus.emit(channel, payload);
  }

  async listen(channel: string, fn: (payload: string) => void): Promise<() => void> {
    this.bus.on(channel, fn);
    return () => this.bus.off(channel, fn);
  }

  async close(): Promise<void> {
    this.keeper.close();
    this.raw.close();
  }
}
