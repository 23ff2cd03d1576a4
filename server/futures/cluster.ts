/**
 * The futures API in a cluster: a request is answered by the node that holds its model. A
 * model's ops, its management routes and `retrieve_future` (whose request id names the node that
 * issued it: `req-<node>~<random>`) are forwarded there; `create_model` goes where placement puts
 * the new model. Everything else (checkpoints on the shared storage, session_info from the
 * store) is answered by whichever node got it.
 */
import type { ClusterNode } from '../cluster/index.ts';
import type { Req } from '../http/http.ts';
import type { SessionManager } from '../sessions/sessions.ts';
import type { Store } from '../store/store.ts';
import { HttpError } from '../http/http.ts';
import { storedPreset } from '../models/presets.ts';

/** Request-id prefix of a node's futures. */
export function futureIdPrefix(nodeId: string | null | undefined): string | undefined {
  return nodeId ? `req-${nodeId}~` : undefined;
}

/** The node that issued a request id, or null for an id of a single node. */
export function nodeOfRequestId(id: string): string | null {
  const m = /^req-(.+)~[a-z0-9]+$/.exec(id);
  return m ? m[1]! : null;
}

/**
 * The base URL of the node that must answer this futures request, when that is another node.
 * @throws HttpError 503 when a new model has no node with room.
 */
export async function remoteTarget(
  cluster: ClusterNode,
  deps: { store: Store; sessions: SessionManager },
  r: Req,
  owner: string,
  value: Record<string, unknown>,
): Promise<string | null> {
  const elsewhere = (nodeId: string | null | undefined) => (nodeId && nodeId !== cluster.id ? cluster.urlOf(nodeId) : null);
  if (r.url.endsWith('/create_model')) {
    // Residency is by canonical name (a deprecated alias is the same engine); create_model validates it.
    const preset = typeof value.base_model === 'string' ? storedPreset(value.base_model) : '';
    const target = await cluster.place(preset);
    if (!target) throw new HttpError(503, 'every node is at its session capacity (--node-sessions); unload a model or add a node');
    return elsewhere(target.id);
  }
  if (typeof value.request_id === 'string') return elsewhere(nodeOfRequestId(value.request_id));
  const modelId = value.model_id ?? value.session_id;
  if (typeof modelId !== 'string' || deps.sessions.live.has(modelId)) return null;
  // A Vela id (`ts-...`) or the name the client gave its open model in create_model.
  const byId = await deps.store.getSession(modelId);
  const row = byId && byId.owner === owner ? byId : await deps.store.findOpenSessionByName(owner, modelId);
  if (!row || deps.sessions.live.has(row.id) || (row.status !== 'starting' && row.status !== 'ready')) return null;
  return elsewhere(row.node_id);
}
