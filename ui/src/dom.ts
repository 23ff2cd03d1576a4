/**
 * A tiny DOM builder. Every server-provided string goes in as text (never HTML), so a job name
 * like `<img onerror=...>` shows as typed.
 */

type Child = Node | string | number | null | undefined | false;
type Attrs = Record<string, string | number | boolean | null | undefined | EventListener>;

/**
 * `h('a', { href: '#/jobs', class: 'x', onclick: fn }, 'text', child)`: attributes whose value
 * is a function become listeners (`on<event>`), `false`/`null`/`undefined` are left out, `true`
 * sets the attribute empty.
 */
export function h<K extends keyof HTMLElementTagNameMap>(tag: K, attrs: Attrs = {}, ...children: Child[]): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === false || v === null || v === undefined) continue;
    if (typeof v === 'function') el.addEventListener(k.replace(/^on/, ''), v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  append(el, ...children);
  return el;
}

export function append(el: Element, ...children: Child[]): void {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    el.append(typeof c === 'number' ? String(c) : c);
  }
}

/** Replace every child of `el`. */
export function replace(el: Element, ...children: Child[]): void {
  el.replaceChildren();
  append(el, ...children);
}

/** A status as a word in a coloured pill (the word carries the meaning; colour only helps). */
export function badge(status: string): HTMLSpanElement {
  return h('span', { class: `badge badge-${status.replace(/[^a-z]/g, '')}`, 'data-status': status }, status);
}

/** An error line for a failed load or action, announced to screen readers. */
export function errorLine(message: string): HTMLParagraphElement {
  return h('p', { class: 'error', role: 'alert' }, message);
}
