/**
 * The dashboard's entry: the page shell (header, navigation, error banner), hash routing
 * (`#/jobs`, `#/jobs/<id>`, `#/sessions`, `#/sessions/<id>`, `#/nodes`; hashes never reach the server) and the sign-in gate.
 * Any uncaught error shows in the banner, so a failure is never a blank page.
 */
import 'uplot/dist/uPlot.min.css';
import './styles.css';
import { clearKey, currentKey, setUnauthorizedHandler } from './api.ts';
import { h, replace } from './dom.ts';
import { jobView } from './job.ts';
import { jobsView } from './jobs.ts';
import { loginView } from './login.ts';
import { sessionView } from './session.ts';
import { sessionsView } from './sessions.ts';
import { nodesView } from './nodes.ts';
import type { View } from './view.ts';

const root = document.getElementById('app')!;
const banner = h('div', { class: 'banner', role: 'alert', id: 'banner', hidden: true });
const main = h('main', { id: 'main', tabindex: -1 });
const navJobs = h('a', { href: '#/jobs' }, 'Fine-tunes');
const navSessions = h('a', { href: '#/sessions' }, 'Sessions');
const navNodes = h('a', { href: '#/nodes' }, 'Nodes');
const signOut = h('button', { type: 'button', class: 'link' }, 'Sign out');
const nav = h('nav', { 'aria-label': 'Main' }, navJobs, navSessions, navNodes, signOut);
const header = h('header', {}, h('a', { href: '#/jobs', class: 'brand' }, 'Vela'), nav);

let current: View | null = null;
let loginMessage: string | null = null;

function showBanner(message: string | null): void {
  banner.hidden = !message;
  banner.textContent = message ?? '';
}

function show(view: View, focus: boolean): void {
  current?.dispose();
  current = view;
  replace(main, view.el);
  document.title = `${view.title} · Vela`;
  // After an in-page navigation, start screen readers and keyboard users at the new content.
  if (focus) main.focus({ preventScroll: true });
}

/** `navigated`: the user moved within the page (not the first load or a sign-in). */
function render(navigated = false): void {
  showBanner(null);
  if (!currentKey()) {
    nav.hidden = true;
    show(loginView(() => {
      loginMessage = null;
      // Render the page the user asked for (a shared #/jobs/<id> link survives signing in).
      render(true);
    }, loginMessage), false);
    return;
  }
  nav.hidden = false;
  const path = location.hash.replace(/^#/, '') || '/jobs';
  const job = /^\/jobs\/([^/]+)$/.exec(path);
  const session = /^\/sessions\/([^/]+)$/.exec(path);
  navJobs.removeAttribute('aria-current');
  navSessions.removeAttribute('aria-current');
  navNodes.removeAttribute('aria-current');
  if (job) {
    navJobs.setAttribute('aria-current', 'page');
    show(jobView(decodeURIComponent(job[1]!)), navigated);
  } else if (path === '/nodes') {
    navNodes.setAttribute('aria-current', 'page');
    show(nodesView(), navigated);
  } else if (session) {
    navSessions.setAttribute('aria-current', 'page');
    show(sessionView(decodeURIComponent(session[1]!)), navigated);
  } else if (path === '/sessions') {
    navSessions.setAttribute('aria-current', 'page');
    show(sessionsView(), navigated);
  } else {
    navJobs.setAttribute('aria-current', 'page');
    show(jobsView((hash) => (location.hash = hash)), navigated);
  }
}

setUnauthorizedHandler((message) => {
  // The key stopped working (revoked, or the server's store was reset): back to sign-in, saying why.
  clearKey();
  loginMessage = `The server no longer accepts this key (${message}). Sign in again.`;
  render();
});
signOut.addEventListener('click', () => {
  clearKey();
  loginMessage = null;
  render();
});
window.addEventListener('hashchange', () => render(true));
window.addEventListener('error', (e) => showBanner(`Something went wrong in the page: ${e.message}`));
window.addEventListener('unhandledrejection', (e) => showBanner(`Something went wrong in the page: ${(e.reason as Error)?.message ?? String(e.reason)}`));

replace(root, header, banner, main);
render();
