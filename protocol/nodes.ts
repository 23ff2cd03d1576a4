/**
 * The JSON of `GET /v1/nodes` (README "Several nodes"): the server builds it
 * (server/cluster/routes.ts) and the dashboard reads it (ui/src/nodes.ts). Types only, so the
 * browser build can import it.
 */

/** What a node reports of itself at each heartbeat. */
export interface NodeLoad {
  /** Sessions open in its engines. */
  sessions: number;
  /** Jobs it is running. */
  jobs: number;
  /** Presets whose engine is started on it (a session of one starts without a model build). */
  resident_presets: string[];
}

/** One node. Times: Unix seconds. One node without a cluster answers with itself, id `local`. */
export interface NodeJson {
  id: string;
  /** The base URL clients reach it at (session websocket URLs point here). */
  url: string;
  /** `up`; `lost` when its heartbeat stopped for longer than the lost setting; `stopped` when it shut down. */
  status: 'up' | 'lost' | 'stopped';
  /** Open sessions it takes before placement sends new ones elsewhere. */
  capacity: number;
  load: NodeLoad;
  /** Open sessions the store places on it. */
  open_sessions: number;
  /** Ids of the jobs running on it. */
  running_jobs: string[];
  /** Seconds since its last heartbeat, by the database clock (null once it is not `up`). */
  heartbeat_age_s: number | null;
  started_at: number | null;
  lost_at: number | null;
  /** The node that answered. */
  self: boolean;
}
