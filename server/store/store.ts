/**
 * The store: API keys, training sessions, fine-tune jobs and their events, and the nodes of a
 * cluster. One SQLite file (better-sqlite3, WAL) for one node, the default; PostgreSQL
 * (`VELA_DATABASE_URL`) when several nodes share it. Every method is written once, in SQL that
 * both accept, over the async `Db` interface (server/db): `?` placeholders, no dialect
 * functions (the database clock is `db.nowMsSql`). Schema changes are numbered migrations
 * applied in order at open and tracked per database, so a store made by an older Vela opens in a
 * newer, on either database.
 */
import crypto from 'node:crypto';
import type { FineTuneJob } from '../../protocol/jobs.ts';
import type { NodeLoad } from '../../protocol/nodes.ts';
import { PostgresDb, SqliteDb, isUnavailable, isUniqueViolation, type Db, type Migration } from '../db/index.ts';
import { log } from '../log.ts';

/**
 * Each entry moves the schema from version i to i + 1, on both databases. Never edit a released
 * entry: append. A plain string must run on both; where the dialects differ give
 * `{sqlite, postgres}`. PostgreSQL has no implicit rowid, so its tables that are listed in
 * insertion order carry an explicit `rowid BIGSERIAL`; INTEGER is 32-bit there (BIGINT for
 * Unix times in ms), and REAL is 32-bit (DOUBLE PRECISION for losses and times).
 */
const MIGRATIONS: Migration[] = [
  {
    sqlite: `CREATE TABLE api_keys (
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
    postgres: `CREATE TABLE api_keys (
     id TEXT PRIMARY KEY,
     hash TEXT NOT NULL UNIQUE,
     prefix TEXT NOT NULL,
     name TEXT,
     created_at BIGINT NOT NULL,
     revoked_at BIGINT
   );
   CREATE TABLE training_sessions (
     id TEXT PRIMARY KEY,
     owner TEXT NOT NULL REFERENCES api_keys(id),
     status TEXT NOT NULL,
     created_at BIGINT NOT NULL,
     config TEXT NOT NULL,
     token TEXT NOT NULL,
     error TEXT,
     closed_at BIGINT,
     rowid BIGSERIAL
   );
   CREATE INDEX training_sessions_owner ON training_sessions(owner, created_at);`,
  },
  {
    sqlite: `CREATE TABLE fine_tunes (
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
    postgres: `CREATE TABLE fine_tunes (
     id TEXT PRIMARY KEY,
     owner TEXT NOT NULL REFERENCES api_keys(id),
     status TEXT NOT NULL,
     created_at BIGINT NOT NULL,
     config TEXT NOT NULL,
     step INTEGER NOT NULL DEFAULT 0,
     loss DOUBLE PRECISION,
     eval_loss DOUBLE PRECISION,
     error TEXT,
     output_dir TEXT NOT NULL,
     started_at BIGINT,
     finished_at BIGINT,
     cancel_requested INTEGER NOT NULL DEFAULT 0,
     rowid BIGSERIAL
   );
   CREATE INDEX fine_tunes_owner ON fine_tunes(owner, created_at);
   CREATE TABLE fine_tune_events (
     job_id TEXT NOT NULL REFERENCES fine_tunes(id),
     idx INTEGER NOT NULL,
     type TEXT NOT NULL,
     timestamp DOUBLE PRECISION NOT NULL,
     data TEXT NOT NULL,
     PRIMARY KEY (job_id, idx)
   );`,
  },
  // A futures client may name its model (xorl's create_model `model_id`): unique among the
  // owner's open models, so a name is free again once its model is closed.
  `ALTER TABLE training_sessions ADD COLUMN model_name TEXT;
   CREATE UNIQUE INDEX training_sessions_open_name ON training_sessions(owner, model_name)
     WHERE model_name IS NOT NULL AND status IN ('starting', 'ready');`,
  // Policy servers that sync_inference_weights pushes a model's weights to (xorl's inference endpoints).
  {
    sqlite: `CREATE TABLE inference_endpoints (
     id TEXT PRIMARY KEY,
     owner TEXT NOT NULL REFERENCES api_keys(id),
     url TEXT NOT NULL,
     api_key TEXT,
     name TEXT,
     created_at INTEGER NOT NULL,
     UNIQUE (owner, url)
   );`,
    postgres: `CREATE TABLE inference_endpoints (
     id TEXT PRIMARY KEY,
     owner TEXT NOT NULL REFERENCES api_keys(id),
     url TEXT NOT NULL,
     api_key TEXT,
     name TEXT,
     created_at BIGINT NOT NULL,
     rowid BIGSERIAL,
     UNIQUE (owner, url)
   );`,
  },
  // Nodes of a cluster (issue 18): each `vela serve` registers and heartbeats; sessions and jobs
  // name the node they run on. Times in ms are the database's clock.
  `CREATE TABLE nodes (
     id TEXT PRIMARY KEY,
     url TEXT NOT NULL,
     status TEXT NOT NULL,
     presets TEXT NOT NULL,
     capacity INTEGER NOT NULL,
     load TEXT NOT NULL,
     started_at BIGINT NOT NULL,
     heartbeat_at BIGINT NOT NULL,
     lost_at BIGINT,
     queue_worker TEXT
   );
   ALTER TABLE training_sessions ADD COLUMN node_id TEXT;
   ALTER TABLE fine_tunes ADD COLUMN node_id TEXT;
   CREATE INDEX training_sessions_node ON training_sessions(node_id, status);`,
  // Kept across restarts (issue 22): sampling sessions (create_sampling_session: a checkpoint
  // served as a policy, loaded again on first use) and Tinker client sessions (create_session)
  // with the models created in them. Times in Unix s.
  `CREATE TABLE sampling_sessions (
     id TEXT PRIMARY KEY,
     owner TEXT NOT NULL REFERENCES api_keys(id),
     checkpoint_dir TEXT NOT NULL,
     checkpoint_id TEXT NOT NULL,
     preset TEXT NOT NULL,
     created_at BIGINT NOT NULL
   );
   CREATE TABLE client_sessions (
     id TEXT PRIMARY KEY,
     owner TEXT NOT NULL REFERENCES api_keys(id),
     created_at BIGINT NOT NULL,
     last_seen_at BIGINT NOT NULL,
     tags TEXT NOT NULL,
     user_metadata TEXT NOT NULL
   );
   CREATE TABLE client_session_models (
     session_id TEXT NOT NULL REFERENCES client_sessions(id) ON DELETE CASCADE,
     model_id TEXT NOT NULL,
     PRIMARY KEY (session_id, model_id)
   );`,
];

export interface ApiKeyRow {
  id: string;
  prefix: string;
  name: string | null;
  created_at: number;
}

/** A session's lifecycle: `lost` when the node that held it stopped answering (its memory is gone). */
export type SessionStatus = 'starting' | 'ready' | 'closed' | 'error' | 'lost';

export interface SessionRow {
  id: string;
  owner: string;
  status: SessionStatus;
  created_at: number;
  config: Record<string, unknown>;
  token: string;
  error: string | null;
  closed_at: number | null;
  /** The node whose engine holds the session (null: a single-node store). */
  node_id: string | null;
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

/** A saved checkpoint served as a policy without a job (create_sampling_session). */
export interface SamplingSessionRow {
  id: string; // "samp-..."
  owner: string;
  checkpoint_dir: string;
  checkpoint_id: string;
  preset: string;
  created_at: number; // Unix s
}

/** A Tinker client session (create_session): what create_model's `session_id` and session_heartbeat name. */
export interface ClientSessionRow {
  id: string; // "sess-..."
  owner: string;
  created_at: number; // Unix s
  /** The last create_session, create_model in it or heartbeat on it (Unix s): idle ones are pruned. */
  last_seen_at: number;
  tags: unknown;
  user_metadata: unknown;
  /** Vela ids (`ts-...`) of the models created in it. */
  models: string[];
}

export type { NodeLoad } from '../../protocol/nodes.ts';

/** One node of a cluster, as registered. Times: `started_at` Unix s, `heartbeat_at`/`lost_at` Unix ms. */
export interface NodeRow {
  id: string;
  url: string;
  status: 'up' | 'lost' | 'stopped';
  presets: string[];
  capacity: number;
  load: NodeLoad;
  started_at: number;
  heartbeat_at: number;
  lost_at: number | null;
  /** The job-queue worker id of the node (graphile-worker's pool id): what to release when it is lost. */
  queue_worker: string | null;
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

/** Where the store lives: a data folder (SQLite) or a PostgreSQL URL. */
export interface StoreLocation {
  dataDir: string;
  databaseUrl?: string;
}

const OPEN = "('starting', 'ready')";

export class Store {
  private constructor(readonly db: Db) {}

  /**
   * Open the store (PostgreSQL when `databaseUrl` is set, else `<dataDir>/vela.sqlite`) and
   * migrate it to the current schema.
   * @throws Error when the database cannot be reached or is newer than this Vela.
   */
  static async open(where: StoreLocation): Promise<Store> {
    const db: Db = where.databaseUrl ? new PostgresDb(where.databaseUrl) : new SqliteDb(where.dataDir);
    try {
      await db.migrate(MIGRATIONS);
    } catch (e) {
      await db.close().catch(() => undefined);
      throw e;
    }
    return new Store(db);
  }

  /** Schema version after migrations (the number of migrations applied). */
  schemaVersion(): Promise<number> {
    return this.db.schemaVersion();
  }

  /** The number of migrations this Vela knows. */
  static get latestVersion(): number {
    return MIGRATIONS.length;
  }

  // --- API keys: only a SHA-256 of each key is stored.

  /** Create a new key; returns the plain key (shown once) and its row. */
  async createApiKey(name: string | null = null, plain?: string): Promise<{ key: string; row: ApiKeyRow }> {
    const key = plain ?? 'vela-' + crypto.randomBytes(24).toString('base64url');
    const row: ApiKeyRow = { id: randomId('key-', 8), prefix: key.slice(0, 9), name, created_at: nowS() };
    await this.db.run('INSERT INTO api_keys (id, hash, prefix, name, created_at) VALUES (?, ?, ?, ?, ?)', [row.id, hashKey(key), row.prefix, name, row.created_at]);
    return { key, row };
  }

  /** Make sure `plain` is an accepted key (for VELA_API_KEY); returns its owner id. Nodes starting together create it once. */
  async ensureApiKey(plain: string): Promise<string> {
    const found = await this.findApiKey(plain);
    if (found) return found;
    try {
      return (await this.createApiKey('from VELA_API_KEY', plain)).row.id;
    } catch (e) {
      if (!isUniqueViolation(e)) throw e;
      return (await this.findApiKey(plain))!;
    }
  }

  /** The owner id of a key, or null when the key is unknown or revoked. */
  async findApiKey(plain: string): Promise<string | null> {
    const row = await this.db.get<{ id: string }>('SELECT id FROM api_keys WHERE hash = ? AND revoked_at IS NULL', [hashKey(plain)]);
    return row?.id ?? null;
  }

  async countApiKeys(): Promise<number> {
    return (await this.db.get<{ n: number }>('SELECT COUNT(*) AS n FROM api_keys WHERE revoked_at IS NULL'))!.n;
  }

  // --- Training sessions.

  /** @throws Error for which `isUniqueViolation` holds when `model_name` is taken by an open model of the owner. */
  async insertSession(row: SessionRow): Promise<void> {
    await this.db.run(
      'INSERT INTO training_sessions (id, owner, status, created_at, config, token, error, closed_at, node_id, model_name) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)',
      [row.id, row.owner, row.status, row.created_at, JSON.stringify(row.config), row.token, row.error, row.closed_at, row.node_id ?? null, row.model_name ?? null],
    );
  }

  /** The owner's open model named `name` (futures `model_id`), or null. */
  async findOpenSessionByName(owner: string, name: string): Promise<SessionRow | null> {
    const r = await this.db.get(`SELECT * FROM training_sessions WHERE owner = ? AND model_name = ? AND status IN ${OPEN}`, [owner, name]);
    return r ? sessionFromRow(r) : null;
  }

  async updateSession(id: string, fields: Partial<Pick<SessionRow, 'status' | 'error' | 'closed_at'>>): Promise<void> {
    const keys = Object.keys(fields) as (keyof typeof fields)[];
    if (keys.length === 0) return;
    await this.db.run(`UPDATE training_sessions SET ${keys.map((k) => `${k} = ?`).join(', ')} WHERE id = ?`, [...keys.map((k) => fields[k]), id]);
  }

  async getSession(id: string): Promise<SessionRow | null> {
    const r = await this.db.get('SELECT * FROM training_sessions WHERE id = ?', [id]);
    return r ? sessionFromRow(r) : null;
  }

  async listSessions(owner: string): Promise<SessionRow[]> {
    return (await this.db.all('SELECT * FROM training_sessions WHERE owner = ? ORDER BY created_at DESC, rowid DESC', [owner])).map(sessionFromRow);
  }

  async countOpenSessions(owner: string): Promise<number> {
    return (await this.db.get<{ n: number }>(`SELECT COUNT(*) AS n FROM training_sessions WHERE owner = ? AND status IN ${OPEN}`, [owner]))!.n;
  }

  /**
   * Sessions live in engine memory: after a restart every open one is closed with a reason.
   * `nodeId` limits it to that node's sessions (a cluster node restarting under the same id).
   */
  async closeOrphanSessions(reason: string, nodeId?: string): Promise<number> {
    if (nodeId === undefined) {
      return this.db.run(`UPDATE training_sessions SET status = 'closed', error = ?, closed_at = ? WHERE status IN ${OPEN}`, [reason, nowS()]);
    }
    return this.db.run(`UPDATE training_sessions SET status = 'closed', error = ?, closed_at = ? WHERE node_id = ? AND status IN ${OPEN}`, [reason, nowS(), nodeId]);
  }

  /** The open sessions of a lost node become `lost` with `reason`; returns their ids. */
  async loseNodeSessions(nodeId: string, reason: string): Promise<string[]> {
    const rows = await this.db.all<{ id: string }>(
      `UPDATE training_sessions SET status = 'lost', error = ?, closed_at = ? WHERE node_id = ? AND status IN ${OPEN} RETURNING id`,
      [reason, nowS(), nodeId],
    );
    return rows.map((r) => r.id);
  }

  /** Open sessions per node (placement and the operator view). */
  async openSessionsByNode(): Promise<Map<string, number>> {
    const rows = await this.db.all<{ node_id: string; n: number }>(`SELECT node_id, COUNT(*) AS n FROM training_sessions WHERE node_id IS NOT NULL AND status IN ${OPEN} GROUP BY node_id`);
    return new Map(rows.map((r) => [r.node_id, r.n]));
  }

  // --- Inference endpoints (sync_inference_weights).

  /** Register (or update the key and name of) the owner's endpoint at `url`; returns the row. */
  async upsertEndpoint(owner: string, url: string, apiKey: string | null, name: string | null): Promise<EndpointRow> {
    await this.db.run(
      'INSERT INTO inference_endpoints (id, owner, url, api_key, name, created_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (owner, url) DO UPDATE SET api_key = excluded.api_key, name = excluded.name',
      [randomId('ep-'), owner, url, apiKey, name, nowS()],
    );
    return withoutRowid((await this.db.get('SELECT * FROM inference_endpoints WHERE owner = ? AND url = ?', [owner, url]))!) as unknown as EndpointRow;
  }

  /** Remove the owner's endpoint by id or url; returns whether one was removed. */
  async deleteEndpoint(owner: string, idOrUrl: string): Promise<boolean> {
    return (await this.db.run('DELETE FROM inference_endpoints WHERE owner = ? AND (id = ? OR url = ?)', [owner, idOrUrl, idOrUrl])) > 0;
  }

  async listEndpoints(owner: string): Promise<EndpointRow[]> {
    return (await this.db.all('SELECT * FROM inference_endpoints WHERE owner = ? ORDER BY created_at, rowid', [owner])).map((r) => withoutRowid(r) as unknown as EndpointRow);
  }

  // --- Sampling sessions and Tinker client sessions (kept across restarts).

  async insertSamplingSession(row: SamplingSessionRow): Promise<void> {
    await this.db.run('INSERT INTO sampling_sessions (id, owner, checkpoint_dir, checkpoint_id, preset, created_at) VALUES (?, ?, ?, ?, ?, ?)', [
      row.id, row.owner, row.checkpoint_dir, row.checkpoint_id, row.preset, row.created_at,
    ]);
  }

  /** A sampling session by id (any owner: the caller checks ownership), or null. */
  async getSamplingSession(id: string): Promise<SamplingSessionRow | null> {
    return (await this.db.get<SamplingSessionRow>('SELECT id, owner, checkpoint_dir, checkpoint_id, preset, created_at FROM sampling_sessions WHERE id = ?', [id])) ?? null;
  }

  async insertClientSession(row: Omit<ClientSessionRow, 'models'>): Promise<void> {
    await this.db.run('INSERT INTO client_sessions (id, owner, created_at, last_seen_at, tags, user_metadata) VALUES (?, ?, ?, ?, ?, ?)', [
      row.id, row.owner, row.created_at, row.last_seen_at, JSON.stringify(row.tags ?? null), JSON.stringify(row.user_metadata ?? null),
    ]);
  }

  /** A client session by id (any owner: the caller checks ownership) with its models, or null. */
  async getClientSession(id: string): Promise<ClientSessionRow | null> {
    const r = await this.db.get<Record<string, unknown>>('SELECT * FROM client_sessions WHERE id = ?', [id]);
    if (!r) return null;
    const models = await this.db.all<{ model_id: string }>('SELECT model_id FROM client_session_models WHERE session_id = ? ORDER BY model_id', [id]);
    return { ...r, tags: JSON.parse(r.tags as string), user_metadata: JSON.parse(r.user_metadata as string), models: models.map((m) => m.model_id) } as ClientSessionRow;
  }

  /** Record that model `modelId` (a Vela id) was created in client session `sessionId`, which is seen now. */
  async addClientSessionModel(sessionId: string, modelId: string): Promise<void> {
    await this.db.run('INSERT INTO client_session_models (session_id, model_id) VALUES (?, ?) ON CONFLICT DO NOTHING', [sessionId, modelId]);
    await this.touchClientSession(sessionId);
  }

  /** A heartbeat (or a new model) on a client session: it is seen now. */
  async touchClientSession(id: string): Promise<void> {
    await this.db.run('UPDATE client_sessions SET last_seen_at = ? WHERE id = ?', [nowS(), id]);
  }

  /**
   * Delete the client sessions last seen before `seenBeforeS` (Unix s) that have no open model
   * (on any node). @returns how many were deleted.
   */
  async pruneClientSessions(seenBeforeS: number): Promise<number> {
    return this.db.run(
      `DELETE FROM client_sessions WHERE last_seen_at < ? AND NOT EXISTS (
         SELECT 1 FROM client_session_models m JOIN training_sessions t ON t.id = m.model_id
         WHERE m.session_id = client_sessions.id AND t.status IN ${OPEN})`,
      [seenBeforeS],
    );
  }

  // --- Fine-tune jobs and their durable event log.

  async insertJob(row: JobRow): Promise<void> {
    await this.db.run('INSERT INTO fine_tunes (id, owner, status, created_at, config, output_dir) VALUES (?, ?, ?, ?, ?, ?)', [
      row.id, row.owner, row.status, row.created_at, JSON.stringify(row.config), row.output_dir,
    ]);
  }

  async updateJob(id: string, fields: JobFields): Promise<void> {
    await this.transitionJob(id, null, fields);
  }

  /**
   * Update a job only while its status is one of `from` (null: any) and, when `onNode` is given,
   * while it is on that node; the check and the write are one statement, so two nodes cannot
   * both move a job out of the same state.
   * @returns true when the job was updated.
   */
  async transitionJob(id: string, from: string[] | null, fields: JobFields, onNode?: string): Promise<boolean> {
    const keys = Object.keys(fields) as (keyof JobFields)[];
    if (keys.length === 0) return true;
    const values = keys.map((k) => (k === 'cancel_requested' ? (fields[k] ? 1 : 0) : fields[k]));
    let where = from ? ` AND status IN (${from.map(() => '?').join(', ')})` : '';
    if (onNode !== undefined) where += ' AND node_id = ?';
    const args = [...values, id, ...(from ?? []), ...(onNode !== undefined ? [onNode] : [])];
    return (await this.db.run(`UPDATE fine_tunes SET ${keys.map((k) => `${k} = ?`).join(', ')} WHERE id = ?${where}`, args)) > 0;
  }

  async getJob(id: string): Promise<JobRow | null> {
    const r = await this.db.get('SELECT * FROM fine_tunes WHERE id = ?', [id]);
    return r ? jobFromRow(r) : null;
  }

  async listJobs(owner: string | null, statuses?: string[]): Promise<JobRow[]> {
    const where: string[] = [];
    const args: unknown[] = [];
    if (owner !== null) {
      where.push('owner = ?');
      args.push(owner);
    }
    if (statuses) where.push(`status IN (${statuses.map(() => '?').join(', ')})`), args.push(...statuses);
    const sql = `SELECT * FROM fine_tunes ${where.length ? 'WHERE ' + where.join(' AND ') : ''} ORDER BY created_at DESC, rowid DESC`;
    return (await this.db.all(sql, args)).map(jobFromRow);
  }

  /** Jobs per node that are running there (the operator view). */
  async runningJobsByNode(): Promise<Map<string, string[]>> {
    const rows = await this.db.all<{ id: string; node_id: string }>(`SELECT id, node_id FROM fine_tunes WHERE node_id IS NOT NULL AND status = 'running'`);
    const out = new Map<string, string[]>();
    for (const r of rows) out.set(r.node_id, [...(out.get(r.node_id) ?? []), r.id]);
    return out;
  }

  /**
   * Append one event with the next index; returns the stored record. The index is chosen in the
   * insert itself; when two nodes race for one index (PostgreSQL), the loser takes the next.
   * The record is made now (its timestamp) and kept until stored (Db.keep): `after` is a write it
   * must follow (the job's previous record); while PostgreSQL is unreachable it waits in memory
   * and is stored when the database returns, with `jobFields` (the job row's progress fields)
   * written after it.
   * @throws the database's error when it refused the record (or was closed meanwhile).
   */
  async appendEvent(jobId: string, type: string, data: Record<string, unknown>, opts: { after?: Promise<unknown>; jobFields?: JobFields } = {}): Promise<JobEvent> {
    const timestamp = Date.now() / 1000;
    const json = JSON.stringify(data);
    return this.db.keep(async (attempt) => {
      // A retry after a dropped connection: the lost attempt may have been committed. The same
      // job, timestamp, type and data is the same record (timestamps are ms with a fraction).
      const stored = attempt === 0 ? undefined : await this.db.get<{ idx: number }>(
        'SELECT idx FROM fine_tune_events WHERE job_id = ? AND timestamp = ? AND type = ? AND data = ?', [jobId, timestamp, type, json]);
      const index = stored?.idx ?? (await this.insertEvent(jobId, type, timestamp, json));
      // The row's fields are a summary of the records: one the database refuses does not undo the record.
      if (opts.jobFields) {
        await this.updateJob(jobId, opts.jobFields).catch((e) => {
          if (isUnavailable(e)) throw e;
          log.warn(`job ${jobId}: its progress fields were not stored: ${(e as Error).message}`);
        });
      }
      return { index, type, timestamp, ...data };
    }, opts.after);
  }

  /** Insert one event at the next free index; returns the index. */
  private async insertEvent(jobId: string, type: string, timestamp: number, json: string): Promise<number> {
    for (let attempt = 0; ; attempt++) {
      try {
        const row = await this.db.get<{ idx: number }>(
          'INSERT INTO fine_tune_events (job_id, idx, type, timestamp, data) SELECT ?, COALESCE(MAX(idx) + 1, 0), ?, ?, ? FROM fine_tune_events WHERE job_id = ? RETURNING idx',
          [jobId, type, timestamp, json, jobId],
        );
        return row!.idx;
      } catch (e) {
        if (!isUniqueViolation(e) || attempt >= 20) throw e;
      }
    }
  }

  /** The index the job's next event will get (the number of events so far). */
  async nextEventIndex(jobId: string): Promise<number> {
    return (await this.db.get<{ n: number }>('SELECT COALESCE(MAX(idx) + 1, 0) AS n FROM fine_tune_events WHERE job_id = ?', [jobId]))!.n;
  }

  /** Events with index >= from, in order, at most `limit`. */
  async events(jobId: string, from = 0, limit = 10_000): Promise<JobEvent[]> {
    const rows = await this.db.all<{ idx: number; type: string; timestamp: number; data: string }>(
      'SELECT idx, type, timestamp, data FROM fine_tune_events WHERE job_id = ? AND idx >= ? ORDER BY idx LIMIT ?',
      [jobId, from, limit],
    );
    return rows.map((r) => ({ index: r.idx, type: r.type, timestamp: r.timestamp, ...JSON.parse(r.data) }));
  }

  // --- Nodes of a cluster. Heartbeat times are the database's clock, so nodes' clocks may differ.

  /** Register (or re-register after a restart) a node as `up`. */
  async registerNode(n: Pick<NodeRow, 'id' | 'url' | 'presets' | 'capacity' | 'load'>): Promise<void> {
    const now = this.db.nowMsSql;
    const args = [n.url, JSON.stringify(n.presets), n.capacity, JSON.stringify(n.load), nowS()];
    const updated = await this.db.run(`UPDATE nodes SET url = ?, presets = ?, capacity = ?, load = ?, started_at = ?, status = 'up', heartbeat_at = ${now}, lost_at = NULL WHERE id = ?`, [...args, n.id]);
    if (updated === 0) {
      await this.db.run(`INSERT INTO nodes (url, presets, capacity, load, started_at, id, status, heartbeat_at) VALUES (?, ?, ?, ?, ?, ?, 'up', ${now})`, [...args, n.id]);
    }
  }

  /**
   * Record a node's heartbeat and load.
   * @returns false when the node is no longer `up` (another node declared it lost): it must stop its work.
   */
  async heartbeatNode(id: string, load: NodeLoad): Promise<boolean> {
    return (await this.db.run(`UPDATE nodes SET heartbeat_at = ${this.db.nowMsSql}, load = ? WHERE id = ? AND status = 'up'`, [JSON.stringify(load), id])) > 0;
  }

  /**
   * Declare lost every `up` node whose last heartbeat is older than `lostMs`. One statement: when
   * several nodes check at once, each lost node is claimed by exactly one of them.
   * @returns the nodes this call declared lost.
   */
  async markLostNodes(lostMs: number): Promise<string[]> {
    const now = this.db.nowMsSql;
    const rows = await this.db.all<{ id: string }>(`UPDATE nodes SET status = 'lost', lost_at = ${now} WHERE status = 'up' AND heartbeat_at < ${now} - ? RETURNING id`, [lostMs]);
    return rows.map((r) => r.id);
  }

  async setNodeQueueWorker(id: string, worker: string | null): Promise<void> {
    await this.db.run('UPDATE nodes SET queue_worker = ? WHERE id = ?', [worker, id]);
  }

  async setNodeStatus(id: string, status: NodeRow['status']): Promise<void> {
    await this.db.run('UPDATE nodes SET status = ? WHERE id = ?', [status, id]);
  }

  async getNode(id: string): Promise<NodeRow | null> {
    const r = await this.db.get('SELECT * FROM nodes WHERE id = ?', [id]);
    return r ? nodeFromRow(r) : null;
  }

  /** Every registered node, `up` ones first, then by id. */
  async listNodes(): Promise<NodeRow[]> {
    return (await this.db.all("SELECT * FROM nodes ORDER BY CASE WHEN status = 'up' THEN 0 ELSE 1 END, id")).map(nodeFromRow);
  }

  /** Milliseconds since each `up` node's last heartbeat, by the database clock. */
  async heartbeatAges(): Promise<Map<string, number>> {
    const rows = await this.db.all<{ id: string; age: number }>(`SELECT id, ${this.db.nowMsSql} - heartbeat_at AS age FROM nodes WHERE status = 'up'`);
    return new Map(rows.map((r) => [r.id, Number(r.age)]));
  }

  close(): Promise<void> {
    return this.db.close();
  }
}

export type JobFields = Partial<Omit<JobRow, 'id' | 'owner' | 'created_at' | 'config' | 'output_dir'>>;

/** A job as stored: the REST JSON's progress fields, plus its owner, its config, the cancel flag and its node. */
export interface JobRow extends Pick<FineTuneJob, 'id' | 'status' | 'created_at' | 'step' | 'loss' | 'eval_loss' | 'error' | 'output_dir' | 'started_at' | 'finished_at'> {
  owner: string;
  config: Record<string, unknown>;
  cancel_requested: boolean;
  /** The node that runs (or last ran) it; null before it starts and on a single-node store. */
  node_id?: string | null;
}

/** One durable record of a job's event log (PROTOCOL.md section 1). */
export interface JobEvent {
  index: number;
  type: string;
  timestamp: number;
  [k: string]: unknown;
}

/** A row without PostgreSQL's explicit `rowid` (SQLite's is implicit and never selected by `*`). */
function withoutRowid(r: Record<string, unknown>): Record<string, unknown> {
  const { rowid: _rowid, ...rest } = r;
  return rest;
}

function sessionFromRow(r: Record<string, unknown>): SessionRow {
  return { ...withoutRowid(r), config: JSON.parse(r.config as string) } as SessionRow;
}

function jobFromRow(r: Record<string, unknown>): JobRow {
  return { ...withoutRowid(r), config: JSON.parse(r.config as string), cancel_requested: !!r.cancel_requested } as JobRow;
}

function nodeFromRow(r: Record<string, unknown>): NodeRow {
  return { ...r, presets: JSON.parse(r.presets as string), load: JSON.parse(r.load as string) } as NodeRow;
}
