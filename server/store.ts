/**
 * The embedded store: one SQLite file (better-sqlite3, WAL) for API keys, training sessions,
 * fine-tune jobs and their events. Schema changes are numbered migrations applied in order at
 * open, tracked by `PRAGMA user_version`, so a data folder made by an older Vela opens in a newer.
 */
import Database from 'better-sqlite3';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import type { FineTuneJob } from '../protocol/jobs.ts';

/** Each entry moves the schema from version i to i + 1. Never edit a released entry: append. */
const MIGRATIONS: string[] = [
  `CREATE TABLE api_keys (
     id TEXT PRIMARY KEY,
     hash TEXT NOT NULL UNIQUE,
     prefix TEXT NOT NULL,
     name TEXT,
     created_at INTEGER NOT NULL,
     revoked_at INTEGER
   );
   CREATE TABLE training_sessions (
     id TEXT PRIMARY KEY,
     owner TEXT NOT NULL REFERENCES api_keys(id),
     status TEXT NOT NULL,
     created_at INTEGER NOT NULL,
     config TEXT NOT NULL,
     token TEXT NOT NULL,
     error TEXT,
     closed_at INTEGER
   );
   CREATE INDEX training_sessions_owner ON training_sessions(owner, created_at);`,
  `CREATE TABLE fine_tunes (
     id TEXT PRIMARY KEY,
     owner TEXT NOT NULL REFERENCES api_keys(id),
     status TEXT NOT NULL,
     created_at INTEGER NOT NULL,
     config TEXT NOT NULL,
     step INTEGER NOT NULL DEFAULT 0,
     loss REAL,
     eval_loss REAL,
     error TEXT,
     output_dir TEXT NOT NULL,
     started_at INTEGER,
     finished_at INTEGER,
     cancel_requested INTEGER NOT NULL DEFAULT 0
   );
   CREATE INDEX fine_tunes_owner ON fine_tunes(owner, created_at);
   CREATE TABLE fine_tune_events (
     job_id TEXT NOT NULL REFERENCES fine_tunes(id),
     idx INTEGER NOT NULL,
     type TEXT NOT NULL,
     timestamp REAL NOT NULL,
     data TEXT NOT NULL,
     PRIMARY KEY (job_id, idx)
   ) WITHOUT ROWID;`,
  // A futures client may name its model (xorl's create_model `model_id`): unique among the
  // owner's open models, so a name is free again once its model is closed.
  `ALTER TABLE training_sessions ADD COLUMN model_name TEXT;
   CREATE UNIQUE INDEX training_sessions_open_name ON training_sessions(owner, model_name)
     WHERE model_name IS NOT NULL AND status IN ('starting', 'ready');`,
  // Policy servers that sync_inference_weights pushes a model's weights to (xorl's inference endpoints).
  `CREATE TABLE inference_endpoints (
     id TEXT PRIMARY KEY,
     owner TEXT NOT NULL REFERENCES api_keys(id),
     url TEXT NOT NULL,
     api_key TEXT,
     name TEXT,
     created_at INTEGER NOT NULL,
     UNIQUE (owner, url)
   );`,
];

export interface ApiKeyRow {
  id: string;
  prefix: string;
  name: string | null;
  created_at: number;
}

export interface SessionRow {
  id: string;
  owner: string;
  status: 'starting' | 'ready' | 'closed' | 'error';
  created_at: number;
  config: Record<string, unknown>;
  token: string;
  error: string | null;
  closed_at: number | null;
  /** The client's name for the model (futures `create_model` `model_id`), or null. */
  model_name: string | null;
}

/** A policy server registered by `add_inference_endpoint`. */
export interface EndpointRow {
  id: string;
  owner: string;
  url: string;
  /** The key the policy server wants (sent as `Authorization: Bearer`), or null. */
  api_key: string | null;
  name: string | null;
  created_at: number;
}

/** Now, in Unix seconds (the `created_at` unit). */
export function nowS(): number {
  return Math.floor(Date.now() / 1000);
}

/** A random id with a prefix (`ts-`, `ft-`, `req-`): 16 random bytes, base32-ish lowercase. */
export function randomId(prefix: string, bytes = 12): string {
  return prefix + crypto.randomBytes(bytes).toString('base64url').replace(/[-_]/g, 'x').toLowerCase();
}

function hashKey(key: string): string {
  return crypto.createHash('sha256').update(key).digest('hex');
}

export class Store {
  readonly db: Database.Database;

  /** Open (creating if needed) `<dataDir>/vela.sqlite` and migrate it to the current schema. */
  constructor(readonly dataDir: string) {
    fs.mkdirSync(dataDir, { recursive: true });
    this.db = new Database(path.join(dataDir, 'vela.sqlite'));
    this.db.pragma('journal_mode = WAL');
    this.db.pragma('synchronous = NORMAL');
    this.db.pragma('foreign_keys = ON');
    this.migrate();
  }

  private migrate(): void {
    const version = this.db.pragma('user_version', { simple: true }) as number;
    if (version > MIGRATIONS.length) {
      throw new Error(`the store at ${this.dataDir} has schema version ${version}; this Vela knows up to ${MIGRATIONS.length}: upgrade Vela`);
    }
    for (let v = version; v < MIGRATIONS.length; v++) {
      this.db.transaction(() => {
        this.db.exec(MIGRATIONS[v]!);
        this.db.pragma(`user_version = ${v + 1}`);
      })();
    }
  }

  /** Schema version after migrations (the number of migrations applied). */
  get schemaVersion(): number {
    return this.db.pragma('user_version', { simple: true }) as number;
  }

  // --- API keys: only a SHA-256 of each key is stored.

  /** Create a new key; returns the plain key (shown once) and its row. */
  createApiKey(name: string | null = null, plain?: string): { key: string; row: ApiKeyRow } {
    const key = plain ?? 'vela-' + crypto.randomBytes(24).toString('base64url');
    const row: ApiKeyRow = { id: randomId('key-', 8), prefix: key.slice(0, 9), name, created_at: nowS() };
    this.db
      .prepare('INSERT INTO api_keys (id, hash, prefix, name, created_at) VALUES (?, ?, ?, ?, ?)')
      .run(row.id, hashKey(key), row.prefix, name, row.created_at);
    return { key, row };
  }

  /** Make sure `plain` is an accepted key (for VELA_API_KEY); returns its owner id. */
  ensureApiKey(plain: string): string {
    const found = this.findApiKey(plain);
    return found ?? this.createApiKey('from VELA_API_KEY', plain).row.id;
  }

  /** The owner id of a key, or null when the key is unknown or revoked. */
  findApiKey(plain: string): string | null {
    const row = this.db.prepare('SELECT id FROM api_keys WHERE hash = ? AND revoked_at IS NULL').get(hashKey(plain)) as { id: string } | undefined;
    return row?.id ?? null;
  }

  countApiKeys(): number {
    return (this.db.prepare('SELECT COUNT(*) AS n FROM api_keys WHERE revoked_at IS NULL').get() as { n: number }).n;
  }

  // --- Training sessions.

  /** @throws Error with `code` `SQLITE_CONSTRAINT_UNIQUE` when `model_name` is taken by an open model of the owner. */
  insertSession(row: SessionRow): void {
    this.db
      .prepare('INSERT INTO training_sessions (id, owner, status, created_at, config, token, error, closed_at, model_name) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)')
      .run(row.id, row.owner, row.status, row.created_at, JSON.stringify(row.config), row.token, row.error, row.closed_at, row.model_name ?? null);
  }

  /** The owner's open model named `name` (futures `model_id`), or null. */
  findOpenSessionByName(owner: string, name: string): SessionRow | null {
    const r = this.db.prepare("SELECT * FROM training_sessions WHERE owner = ? AND model_name = ? AND status IN ('starting', 'ready')").get(owner, name) as (Omit<SessionRow, 'config'> & { config: string }) | undefined;
    return r ? { ...r, config: JSON.parse(r.config) } : null;
  }

  updateSession(id: string, fields: Partial<Pick<SessionRow, 'status' | 'error' | 'closed_at'>>): void {
    const sets = Object.keys(fields).map((k) => `${k} = @${k}`);
    if (sets.length === 0) return;
    this.db.prepare(`UPDATE training_sessions SET ${sets.join(', ')} WHERE id = @id`).run({ ...fields, id });
  }

  getSession(id: string): SessionRow | null {
    const r = this.db.prepare('SELECT * FROM training_sessions WHERE id = ?').get(id) as (Omit<SessionRow, 'config'> & { config: string }) | undefined;
    return r ? { ...r, config: JSON.parse(r.config) } : null;
  }

  listSessions(owner: string): SessionRow[] {
    const rows = this.db.prepare('SELECT * FROM training_sessions WHERE owner = ? ORDER BY created_at DESC, rowid DESC').all(owner) as (Omit<SessionRow, 'config'> & { config: string })[];
    return rows.map((r) => ({ ...r, config: JSON.parse(r.config) }));
  }

  countOpenSessions(owner: string): number {
    return (this.db.prepare("SELECT COUNT(*) AS n FROM training_sessions WHERE owner = ? AND status IN ('starting', 'ready')").get(owner) as { n: number }).n;
  }

  /** Sessions live in engine memory: after a restart every open one is closed with a reason. */
  closeOrphanSessions(reason: string): number {
    return this.db
      .prepare("UPDATE training_sessions SET status = 'closed', error = ?, closed_at = ? WHERE status IN ('starting', 'ready')")
      .run(reason, nowS()).changes;
  }

  // --- Inference endpoints (sync_inference_weights).

  /** Register (or update the key and name of) the owner's endpoint at `url`; returns the row. */
  upsertEndpoint(owner: string, url: string, apiKey: string | null, name: string | null): EndpointRow {
    this.db
      .prepare('INSERT INTO inference_endpoints (id, owner, url, api_key, name, created_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (owner, url) DO UPDATE SET api_key = excluded.api_key, name = excluded.name')
      .run(randomId('ep-'), owner, url, apiKey, name, nowS());
    return this.db.prepare('SELECT * FROM inference_endpoints WHERE owner = ? AND url = ?').get(owner, url) as EndpointRow;
  }

  /** Remove the owner's endpoint by id or url; returns whether one was removed. */
  deleteEndpoint(owner: string, idOrUrl: string): boolean {
    return this.db.prepare('DELETE FROM inference_endpoints WHERE owner = ? AND (id = ? OR url = ?)').run(owner, idOrUrl, idOrUrl).changes > 0;
  }

  listEndpoints(owner: string): EndpointRow[] {
    return this.db.prepare('SELECT * FROM inference_endpoints WHERE owner = ? ORDER BY created_at, rowid').all(owner) as EndpointRow[];
  }

  // --- Fine-tune jobs and their durable event log.

  insertJob(row: JobRow): void {
    this.db
      .prepare('INSERT INTO fine_tunes (id, owner, status, created_at, config, output_dir) VALUES (?, ?, ?, ?, ?, ?)')
      .run(row.id, row.owner, row.status, row.created_at, JSON.stringify(row.config), row.output_dir);
  }

  updateJob(id: string, fields: Partial<Omit<JobRow, 'id' | 'owner' | 'created_at' | 'config' | 'output_dir'>>): void {
    const sets = Object.keys(fields).map((k) => `${k} = @${k}`);
    if (sets.length === 0) return;
    const values: Record<string, unknown> = { ...fields, id };
    if ('cancel_requested' in fields) values.cancel_requested = fields.cancel_requested ? 1 : 0;
    this.db.prepare(`UPDATE fine_tunes SET ${sets.join(', ')} WHERE id = @id`).run(values);
  }

  getJob(id: string): JobRow | null {
    const r = this.db.prepare('SELECT * FROM fine_tunes WHERE id = ?').get(id) as any;
    return r ? jobFromRow(r) : null;
  }

  listJobs(owner: string | null, statuses?: string[]): JobRow[] {
    const where: string[] = [];
    const args: unknown[] = [];
    if (owner !== null) {
      where.push('owner = ?');
      args.push(owner);
    }
    if (statuses) where.push(`status IN (${statuses.map(() => '?').join(', ')})`), args.push(...statuses);
    const sql = `SELECT * FROM fine_tunes ${where.length ? 'WHERE ' + where.join(' AND ') : ''} ORDER BY created_at DESC, rowid DESC`;
    return (this.db.prepare(sql).all(...args) as any[]).map(jobFromRow);
  }

  /** Append one event with the next index; returns the stored record. Atomic with the index choice. */
  appendEvent(jobId: string, type: string, data: Record<string, unknown>): JobEvent {
    return this.db.transaction(() => {
      const next = (this.db.prepare('SELECT COALESCE(MAX(idx) + 1, 0) AS n FROM fine_tune_events WHERE job_id = ?').get(jobId) as { n: number }).n;
      const ev: JobEvent = { index: next, type, timestamp: Date.now() / 1000, ...data };
      this.db.prepare('INSERT INTO fine_tune_events (job_id, idx, type, timestamp, data) VALUES (?, ?, ?, ?, ?)').run(jobId, next, type, ev.timestamp, JSON.stringify(data));
      return ev;
    })();
  }

  /** The index the job's next event will get (the number of events so far). */
  nextEventIndex(jobId: string): number {
    return (this.db.prepare('SELECT COALESCE(MAX(idx) + 1, 0) AS n FROM fine_tune_events WHERE job_id = ?').get(jobId) as { n: number }).n;
  }

  /** Events with index >= from, in order, at most `limit`. */
  events(jobId: string, from = 0, limit = 10_000): JobEvent[] {
    const rows = this.db.prepare('SELECT idx, type, timestamp, data FROM fine_tune_events WHERE job_id = ? AND idx >= ? ORDER BY idx LIMIT ?').all(jobId, from, limit) as any[];
    return rows.map((r) => ({ index: r.idx, type: r.type, timestamp: r.timestamp, ...JSON.parse(r.data) }));
  }

  close(): void {
    this.db.close();
  }
}


/** A job as stored: the REST JSON's progress fields, plus its owner, its config and the cancel flag. */
export interface JobRow extends Pick<FineTuneJob, 'id' | 'status' | 'created_at' | 'step' | 'loss' | 'eval_loss' | 'error' | 'output_dir' | 'started_at' | 'finished_at'> {
  owner: string;
  config: Record<string, unknown>;
  cancel_requested: boolean;
}

/** One durable record of a job's event log (PROTOCOL.md section 1). */
export interface JobEvent {
  index: number;
  type: string;
  timestamp: number;
  [k: string]: unknown;
}

function jobFromRow(r: any): JobRow {
  return { ...r, config: JSON.parse(r.config), cancel_requested: !!r.cancel_requested };
}
