/**
 * The training sessions page (PROTOCOL.md section 2): status, model and settings of each of the
 * key's sessions, refreshed every 3 s, with a Close button for open ones. The session token is
 * a credential for the websocket and is not shown. Each id links to the session's page
 * (session.ts) with its loss curve.
 */
import { json, type Session } from './api.ts';
import { badge, errorLine, h, replace } from './dom.ts';
import { bytes, clock, dateTime } from './format.ts';
import { poll, type View } from './view.ts';

const REFRESH_MS = 3000;

/**
 * The session's last op: the session JSON's `last_op` ({op, id, at, ms, ok}; null before the
 * first), else its `last_request_id`. A string is shown as it is (an older server's shape).
 */
export function lastOp(s: Session): string {
  // Ids are integers or strings; one past 2^53 arrives as its decimal string (PROTOCOL.md section 3).
  const op = s.last_op as { op?: string; id?: number | string; at?: number } | string | null | undefined;
  if (typeof op === 'string') return op;
  if (op && typeof op === 'object' && op.op) return `${op.op}${op.id !== undefined ? ` #${op.id}` : ''}${op.at ? ` at ${dateTime(op.at)}` : ''}`;
  if (typeof s.last_request_id === 'number' || typeof s.last_request_id === 'string') return `request #${s.last_request_id}`;
  return '—';
}

/**
 * A real-model session's memory: what the server planned for it at creation (its base unless
 * already loaded, and its own adapters and moments) against what its engine holds (the shared
 * base and every tenant, after the last op). Null for presets.
 */
export function memoryLine(s: Session): HTMLElement | null {
  const m = s.memory as { planned_bytes?: number; engine_tensor_bytes?: number | null } | null | undefined;
  if (!m || typeof m.planned_bytes !== 'number') return null;
  const used = typeof m.engine_tensor_bytes === 'number' ? `, engine holds ${bytes(m.engine_tensor_bytes)}` : '';
  return h('div', { class: 'muted small-text' }, `memory planned ${bytes(m.planned_bytes)}${used}`);
}

function sessionRow(s: Session, refresh: () => void, problem: HTMLElement): HTMLTableRowElement {
  const open = s.status === 'starting' || s.status === 'ready';
  const close = h('button', { type: 'button', class: 'small danger', 'aria-label': `Close session ${s.id}` }, 'Close');
  close.addEventListener('click', async () => {
    if (!window.confirm(`Close session ${s.id}? Its unsaved memory (weights, optimizer state) is lost.`)) return;
    close.disabled = true;
    try {
      await json('POST', `/v1/training_sessions/${encodeURIComponent(s.id)}/close`);
      replace(problem);
    } catch (e) {
      replace(problem, errorLine(`Could not close ${s.id}: ${(e as Error).message}`));
    }
    refresh();
  });
  const settings = [s.finetune, s.rank !== undefined && s.finetune === 'lora' ? `rank ${s.rank}` : null, s.action_horizon !== undefined ? `horizon ${s.action_horizon}` : null]
    .filter(Boolean).join(', ');
  return h('tr', { 'data-session': s.id },
    h('td', { class: 'mono' }, h('a', { href: `#/sessions/${encodeURIComponent(s.id)}`, 'aria-label': `Session ${s.id}: status and loss curve` }, s.id)),
    h('td', {}, badge(s.status), s.error ? h('div', { class: 'error small-text' }, s.error) : null),
    h('td', {}, s.base_model, typeof s.base === 'string' ? h('div', { class: 'muted small-text mono' }, s.base) : null, memoryLine(s)),
    h('td', {}, settings || '—'),
    h('td', {}, lastOp(s)),
    h('td', {}, dateTime(s.created_at)),
    h('td', {}, dateTime(s.closed_at ?? null)),
    h('td', {}, open ? close : null));
}

export function sessionsView(): View {
  const body = h('tbody');
  const note = h('p', { class: 'muted', 'aria-live': 'polite' });
  const problem = h('div');
  const table = h('table', { class: 'sessions', 'aria-label': 'Training sessions' },
    h('thead', {}, h('tr', {}, ...['Session', 'Status', 'Model', 'Settings', 'Last op', 'Created', 'Closed', ''].map((c) => h('th', { scope: 'col' }, c)))),
    body);
  let signature = '';
  const load = async () => {
    try {
      const { data } = await json<{ data: Session[] }>('GET', '/v1/training_sessions');
      const sig = JSON.stringify(data);
      // Rebuild only on change, so that focus on a Close button is not lost every refresh.
      if (sig !== signature) {
        signature = sig;
        if (data.length === 0) replace(body, h('tr', {}, h('td', { colspan: 8, class: 'empty' }, 'No training sessions. Clients open them with POST /v1/training_sessions.')));
        else replace(body, ...data.map((s) => sessionRow(s, () => void load(), problem)));
      }
      note.textContent = `${data.length} session${data.length === 1 ? '' : 's'}; refreshed at ${clock()}`;
    } catch (e) {
      replace(problem, errorLine(`Could not load the sessions: ${(e as Error).message}`));
      throw e;
    }
  };
  const stop = poll(load, REFRESH_MS);
  const el = h('section', { 'aria-labelledby': 'sessions-title' },
    h('h1', { id: 'sessions-title' }, 'Training sessions'),
    problem,
    h('div', { class: 'table-wrap' }, table),
    note);
  return { el, title: 'Training sessions', dispose: stop };
}
