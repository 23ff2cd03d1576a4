/**
 * `GET /v1/nodes`: the operator's view of the cluster (any API key): each node with its URL,
 * status, session capacity, its load as it last reported it, the open sessions and running jobs
 * the store places on it, and seconds since its last heartbeat. One node (SQLite) answers with
 * itself, from memory.
 */
import type { TemplatedApp } from 'uWebSockets.js';
import { requireOwner } from '../http/auth.ts';
import { route, sendJson } from '../http/http.ts';
import type { NodeJson, NodeLoad } from '../../protocol/nodes.ts';
import type { Store } from '../store/store.ts';
import type { ClusterNode } from './node.ts';

export function mountNodeRoutes(
  app: TemplatedApp,
  deps: { store: Store; nodes: () => ClusterNode | null; local: () => { id: string; url: string; capacity: number; load: NodeLoad; runningJobs: string[]; startedAt: number } },
): void {
  app.get('/v1/nodes', route(0, async (r) => {
    await requireOwner(deps.store, r);
    const cluster = deps.nodes();
    if (!cluster) {
      const { runningJobs, startedAt, ...me } = deps.local();
      const only: NodeJson = {
        ...me, status: 'up', open_sessions: me.load.sessions, running_jobs: runningJobs, heartbeat_age_s: 0, started_at: startedAt, lost_at: null, self: true,
      };
      return sendJson(r, 200, { object: 'list', data: [only] });
    }
    const { store } = deps;
    const [nodes, sessions, jobs, ages] = await Promise.all([store.listNodes(), store.openSessionsByNode(), store.runningJobsByNode(), store.heartbeatAges()]);
    const data: NodeJson[] = nodes.map((n) => ({
      id: n.id, url: n.url, status: n.status, capacity: n.capacity, load: n.load, open_sessions: sessions.get(n.id) ?? 0,
      running_jobs: jobs.get(n.id) ?? [], heartbeat_age_s: ages.has(n.id) ? ages.get(n.id)! / 1000 : null, started_at: n.started_at,
      lost_at: n.lost_at === null ? null : n.lost_at / 1000, self: n.id === cluster.id,
    }));
    sendJson(r, 200, { object: 'list', data });
  }));
}
