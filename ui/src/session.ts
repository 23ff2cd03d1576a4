/**
 * One training session (`#/sessions/<id>`): status, model, settings and last op, and a live loss
 * curve like a job's: the session JSON's `recent_losses` (its last 200 forward_backward losses,
 * PROTOCOL.md section 2), refreshed every 3 s, each new forward_backward one more point.
 */
import { ApiError, json, type Session } from './api.ts';
import { liveChart } from './charts.ts';
import { badge, errorLine, h, replace } from './dom.ts';
import { clock, dateTime } from './format.ts';
import { lastOp, memoryLine } from './sessions.ts';
import { poll, type View } from './view.ts';

const REFRESH_MS = 3000;

/** One point of `recent_losses`. */
interface LossPoint {
  n: number;
  loss: number | null;
}

export function sessionView(sessionId: string): View {
  const status = h('div', { id: 'session-status' });
  const problem = h('div');
  const note = h('p', { class: 'muted', 'aria-live': 'polite' });
  const lossChart = liveChart('Loss', 'loss', [{ key: 'loss', label: 'forward_backward loss', color: '#1f6feb' }], 'forward_backward');
  const empty = h('p', { class: 'muted', id: 'session-loss-note' });
  let lastN = 0;
  let shown = false;
  const body = h('div', {}, h('p', { class: 'muted' }, 'Loading…'));
  const load = async () => {
    let s: Session;
    try {
      s = await json<Session>('GET', `/v1/training_sessions/${encodeURIComponent(sessionId)}`);
    } catch (e) {
      replace(problem, errorLine(e instanceof ApiError && e.status === 404 ? `No training session ${sessionId} for this key.` : `Could not load the session: ${(e as Error).message}`));
      throw e;
    }
    replace(problem);
    if (!shown) {
      shown = true;
      replace(body, h('div', { class: 'charts' }, lossChart.figure), empty);
    }
    const settings = [s.finetune, s.rank !== undefined && s.finetune === 'lora' ? `rank ${s.rank}` : null, s.action_horizon !== undefined ? `horizon ${s.action_horizon}` : null].filter(Boolean).join(', ');
    replace(status,
      h('p', {}, badge(s.status), ` ${s.base_model}${settings ? `, ${settings}` : ''}; last op ${lastOp(s)}; created ${dateTime(s.created_at)}${s.closed_at ? `, closed ${dateTime(s.closed_at)}` : ''}`),
      s.error ? h('p', { class: 'error' }, s.error) : null,
      memoryLine(s));
    // A later point only: the list is the newest 200, oldest first.
    const points = (Array.isArray(s.recent_losses) ? s.recent_losses : []) as LossPoint[];
    for (const p of points) {
      if (p.n > lastN) {
        lossChart.add(p.n, [typeof p.loss === 'number' ? p.loss : null]);
        lastN = p.n;
      }
    }
    empty.textContent = lastN > 0 ? '' : s.status === 'ready' || s.status === 'starting'
      ? 'No forward_backward yet: each one the client sends adds a point.'
      : 'No losses: a session keeps its loss history only while it is open.';
    note.textContent = `refreshed at ${clock()}`;
  };
  const stop = poll(load, REFRESH_MS);
  const el = h('section', { 'aria-labelledby': 'session-title' },
    h('p', {}, h('a', { href: '#/sessions' }, '← Training sessions')),
    h('h1', { id: 'session-title', class: 'mono' }, sessionId),
    problem,
    status,
    body,
    note);
  return { el, title: `Session ${sessionId}`, dispose: () => (stop(), lossChart.destroy()) };
}
