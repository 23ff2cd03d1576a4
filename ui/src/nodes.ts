/**
 * The nodes page (`GET /v1/nodes`): each node of the cluster with its status, URL, open sessions
 * against its capacity, the jobs it runs, its started engines and the age of its last heartbeat,
 * refreshed every 3 s. One node without a cluster shows itself.
 */
import type { NodeJson } from '../../protocol/nodes.ts';
import { json } from './api.ts';
import { badge, errorLine, h, replace } from './dom.ts';
import { dateTime } from './format.ts';
import { poll, type View } from './view.ts';

const REFRESH_MS = 3000;

function nodeRow(n: NodeJson): HTMLTableRowElement {
  const age = n.heartbeat_age_s === null ? '—' : `${n.heartbeat_age_s.toFixed(1)} s ago`;
  return h('tr', { 'data-node': n.id },
    h('td', { class: 'mono' }, n.id, n.self ? h('span', { class: 'muted small-text' }, ' (this node)') : null),
    h('td', {}, badge(n.status), n.lost_at ? h('div', { class: 'small-text muted' }, `lost at ${dateTime(n.lost_at)}`) : null),
    h('td', { class: 'mono' }, n.url),
    h('td', {}, `${n.open_sessions} / ${n.capacity}`),
    h('td', { class: 'mono' }, n.running_jobs.length ? n.running_jobs.join(', ') : '—'),
    h('td', {}, n.load.resident_presets.length ? n.load.resident_presets.join(', ') : '—'),
    h('td', {}, age),
    h('td', {}, dateTime(n.started_at)));
}

export function nodesView(): View {
  const body = h('tbody');
  const note = h('p', { class: 'muted', 'aria-live': 'polite' });
  const problem = h('div');
  const table = h('table', { class: 'nodes', 'aria-label': 'Nodes' },
    h('thead', {}, h('tr', {}, ...['Node', 'Status', 'URL', 'Sessions', 'Jobs', 'Engines', 'Heartbeat', 'Started'].map((c) => h('th', { scope: 'col' }, c)))),
    body);
  const load = async () => {
    try {
      const { data } = await json<{ data: NodeJson[] }>('GET', '/v1/nodes');
      replace(body, ...data.map(nodeRow));
      replace(problem);
      const up = data.filter((n) => n.status === 'up').length;
      note.textContent = `${up} of ${data.length} node${data.length === 1 ? '' : 's'} up; refreshed at ${new Date().toLocaleTimeString()}`;
    } catch (e) {
      replace(problem, errorLine(`Could not load the nodes: ${(e as Error).message}`));
      throw e;
    }
  };
  const stop = poll(load, REFRESH_MS);
  const el = h('section', { 'aria-labelledby': 'nodes-title' },
    h('h1', { id: 'nodes-title' }, 'Nodes'),
    problem,
    h('div', { class: 'table-wrap' }, table),
    note);
  return { el, title: 'Nodes', dispose: stop };
}
