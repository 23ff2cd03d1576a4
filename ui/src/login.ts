/**
 * The login page: an API key, checked against `GET /v1/fine-tunes` before it is kept. A refused
 * key or an unreachable server is said in words in an alert region; the form stays usable.
 */
import { ApiError, json, setKey } from './api.ts';
import { h } from './dom.ts';
import type { View } from './view.ts';

/** `message`: why the user is here again (a key that stopped working), shown as an error. */
export function loginView(onLogin: () => void, message: string | null): View {
  const error = h('p', { class: 'error', id: 'login-error', role: 'alert' });
  if (message) error.textContent = message;
  const input = h('input', {
    id: 'api-key', name: 'api-key', type: 'password', required: true, autocomplete: 'current-password', spellcheck: 'false',
    'aria-describedby': 'api-key-help login-error',
  });
  const remember = h('input', { id: 'remember', type: 'checkbox', checked: true });
  const submit = h('button', { type: 'submit' }, 'Sign in');
  const form = h('form', { class: 'login', 'aria-labelledby': 'login-title' },
    h('h1', { id: 'login-title' }, 'Sign in to Vela'),
    h('label', { for: 'api-key' }, 'API key'),
    input,
    h('p', { id: 'api-key-help', class: 'help' }, 'The key the server printed when it created it, or the one set with VELA_API_KEY. It is sent only in the Authorization header.'),
    h('p', { class: 'check' }, remember, h('label', { for: 'remember' }, 'Keep me signed in in this tab (session storage, cleared when the tab closes)')),
    submit,
    error,
  );
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const k = input.value.trim();
    if (!k) return;
    submit.disabled = true;
    error.textContent = 'Checking the key…';
    error.classList.add('pending');
    try {
      await json('GET', '/v1/fine-tunes', undefined, k);
      setKey(k, remember.checked);
      error.textContent = '';
      onLogin();
    } catch (err) {
      const m = (err as Error).message;
      error.textContent = err instanceof ApiError && err.status === 401
        ? `The server refused this key: ${m}. Check the key and try again.`
        : `Could not sign in: ${m}`;
      input.focus();
      input.select();
    } finally {
      error.classList.remove('pending');
      submit.disabled = false;
    }
  });
  queueMicrotask(() => input.focus());
  return { el: h('section', { class: 'login-page' }, form), title: 'Sign in', dispose() {} };
}
