/**
 * The PostgreSQL database (node-postgres, a pool): what several Vela nodes share. Statements
 * keep the store's `?` placeholders and are rewritten to `$1, $2, ...` once each. BIGINT and
 * NUMERIC come back as JS numbers (Unix times, counts: all far below 2^53). Notifications are
 * PostgreSQL's LISTEN/NOTIFY on one dedicated connection, re-opened when it drops.
 */
import pg from 'pg';
import { log } from '../log.ts';
import { KeptDb, WriteKeeper } from './keep.ts';
import { isUniqueViolation, type Db, type Migration } from './types.ts';

/** A fixed advisory-lock key: the nodes that start together migrate one at a time. */
const MIGRATION_LOCK = 7_041_978;

const asNumber = (v: string) => Number(v);
const TYPES = {
  getTypeParser: ((oid: number, format?: string) => {
    if (oid === 20 || oid === 1700) return asNumber; // int8, numeric
    return pg.types.getTypeParser(oid, format as 'text');
  }) as typeof pg.types.getTypeParser,
};

/** `postgres://user:secret@host/db` -> `postgres://user@host/db`, for messages. */
export function redactUrl(url: string): string {
  try {
    const u = new URL(url);
    u.password = '';
    return u.toString();
  } catch {
    return '(a database URL that does not parse)';
  }
}

export class PostgresDb extends KeptDb implements Db {
  readonly dialect = 'postgres';
  readonly where: string;
  readonly pool: pg.Pool;
  readonly nowMsSql = '(extract(epoch from clock_timestamp()) * 1000)::bigint';
  private texts = new Map<string, string>();
  private listener: pg.Client | null = null;
  private listeners = new Map<string, Set<(payload: string) => void>>();
  private closed = false;
  private reconnectTimer: NodeJS.Timeout | null = null;
  protected readonly keeper: WriteKeeper;

  constructor(readonly url: string, poolSize = 10) {
    super();
    this.where = redactUrl(url);
    this.pool = new pg.Pool({ connectionString: url, max: poolSize, types: TYPES });
    this.keeper = new WriteKeeper(this.where, true);
    // An idle client that loses its server (a restart) must not crash the process.
    this.pool.on('error', (e) => log.warn(`PostgreSQL (${this.where}): idle connection failed: ${e.message}`));
    this.pool.on('connect', (client) => client.on('error', (e) => log.warn(`PostgreSQL (${this.where}): a connection failed: ${e.message}`)));
  }

  /** `?` -> `$n` (the store's SQL has no `?` inside string literals). */
  private text(sql: string): string {
    let t = this.texts.get(sql);
    if (t === undefined) {
      let n = 0;
      t = sql.replace(/\?/g, () => `$${++n}`);
      this.texts.set(sql, t);
    }
    return t;
  }

  /** One statement on a pooled connection; a failure is counted (errorCount) and rethrown. */
  private async query(sql: string, params: unknown[]): Promise<pg.QueryResult> {
    try {
      return await this.pool.query(this.text(sql), params);
    } catch (e) {
      if (!isUniqueViolation(e)) this.keeper.failed();
      throw e;
    }
  }

  async all<T>(sql: string, params: unknown[] = []): Promise<T[]> {
    return (await this.query(sql, params)).rows as T[];
  }

  async get<T>(sql: string, params: unknown[] = []): Promise<T | undefined> {
    return (await this.all<T>(sql, params))[0];
  }

  async run(sql: string, params: unknown[] = []): Promise<number> {
    return (await this.query(sql, params)).rowCount ?? 0;
  }

  async migrate(migrations: Migration[]): Promise<number> {
    const client = await this.pool.connect();
    try {
      await client.query('SELECT pg_advisory_lock($1)', [MIGRATION_LOCK]);
      try {
        await client.query('CREATE TABLE IF NOT EXISTS vela_schema (version INTEGER NOT NULL)');
        const row = (await client.query('SELECT version FROM vela_schema')).rows[0] as { version: number } | undefined;
        if (!row) await client.query('INSERT INTO vela_schema (version) VALUES (0)');
        const version = row?.version ?? 0;
        if (version > migrations.length) {
          throw new Error(`the store at ${this.where} has schema version ${version}; this Vela knows up to ${migrations.length}: upgrade Vela`);
        }
        for (let v = version; v < migrations.length; v++) {
          const m = migrations[v]!;
          await client.query('BEGIN');
          try {
            await client.query(typeof m === 'string' ? m : m.postgres);
            await client.query('UPDATE vela_schema SET version = $1', [v + 1]);
            await client.query('COMMIT');
          } catch (e) {
            await client.query('ROLLBACK');
            throw new Error(`migration ${v + 1} failed on ${this.where}: ${(e as Error).message}`);
          }
        }
        return migrations.length;
      } finally {
        await client.query('SELECT pg_advisory_unlock($1)', [MIGRATION_LOCK]);
      }
    } finally {
      client.release();
    }
  }

  async schemaVersion(): Promise<number> {
    const row = await this.get<{ version: number }>('SELECT version FROM vela_schema').catch(() => undefined);
    return row?.version ?? 0;
  }

  async notify(channel: string, payload: string): Promise<void> {
    await this.query('SELECT pg_notify(?, ?)', [channel, payload]);
  }

  async listen(channel: string, fn: (payload: string) => void): Promise<() => void> {
    let set = this.listeners.get(channel);
    if (!set) {
      this.listeners.set(channel, (set = new Set()));
      if (this.listener) await this.listener.query(`LISTEN ${quoteIdent(channel)}`);
    }
    set.add(fn);
    if (!this.listener) await this.connectListener();
    return () => set!.delete(fn);
  }

  private async connectListener(): Promise<void> {
    const client = new pg.Client({ connectionString: this.url, types: TYPES });
    client.on('notification', (m) => {
      for (const fn of this.listeners.get(m.channel) ?? []) fn(m.payload ?? '');
    });
    client.on('error', (e) => {
      if (this.closed) return;
      log.warn(`PostgreSQL (${this.where}): the notification connection failed (${e.message}); reconnecting`);
      this.listener = null;
      client.end().catch(() => undefined);
      this.reconnectTimer = setTimeout(() => this.connectListener().catch((err) => log.warn(`PostgreSQL: reconnecting failed: ${err.message}`)), 1000);
    });
    await client.connect();
    for (const channel of this.listeners.keys()) await client.query(`LISTEN ${quoteIdent(channel)}`);
    this.listener = client;
  }

  async close(): Promise<void> {
    this.closed = true;
    this.keeper.close();
    if (this.reconnectTimer) clearTimeout(this.reconnectTimer);
    await this.listener?.end().catch(() => undefined);
    await this.pool.end();
  }
}

function quoteIdent(name: string): string {
  return `"${name.replace(/"/g, '""')}"`;
}
