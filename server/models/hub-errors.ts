/**
 * The hub's refusals as ModelErrors (download.ts's Voice). @huggingface/hub's HubApiError keeps
 * the status and the JSON body but not X-Error-Code / X-Error-Message, which is how the hub tells
 * a gated repository from a private or missing one; the Hub client's fetch wrapper
 * (server/hub/client.ts) keeps them (a Refusal) for this.
 */
import { HubApiError } from '@huggingface/hub';
import type { Refusal } from '../hub/client.ts';
import { ModelError } from './errors.ts';

export type { Refusal } from '../hub/client.ts';

/** The hub's refusal as a ModelError, told apart by status and X-Error-Code. */
export function toModelError(e: unknown, refusal: Refusal | null, c: { repoId: string; revision: string; endpoint: string; token: string | undefined; what: string }): ModelError {
  if (e instanceof ModelError) return e;
  if (!(e instanceof HubApiError)) {
    const err = e as Error & { cause?: Error };
    return new ModelError('network', `${c.what}: cannot reach ${c.endpoint} (${err.cause?.message ?? err.message})`);
  }
  const status = e.statusCode;
  const code = refusal?.status === status ? refusal.errorCode : null;
  const said = (refusal?.status === status ? refusal.errorMessage : null) ?? e.message.replace(/\. URL: .*$/, '');
  const page = `https://huggingface.co/${c.repoId}`;
  if (code === 'GatedRepo' || ((status === 401 || status === 403) && /gated|restricted/i.test(said))) {
    if (!c.token) return new ModelError('gated', `${c.repoId} is gated: accept its licence at ${page} while logged in, then set HF_TOKEN=<a read token> (or pass --token)`);
    return new ModelError('gated', `${c.repoId} is gated and the token given has no access to it: accept its licence at ${page} while logged in as that token's account (or use a read token of an account that has), then set HF_TOKEN=<that token> (or pass --token)`);
  }
  if (code === 'RevisionNotFound') return new ModelError('not_found', `${c.repoId} has no revision ${c.revision} on ${c.endpoint}`);
  if (code === 'EntryNotFound') return new ModelError('not_found', `${c.what}: not found on ${c.endpoint}`);
  if (code === 'RepoNotFound' || status === 404) {
    return new ModelError('not_found', `${c.repoId}: no such model on ${c.endpoint}${c.token ? ' that this token can see' : ', or it is private: set HF_TOKEN=<a read token> (or pass --token) if you have access'}`);
  }
  if (status === 401 || status === 403) {
    return new ModelError('unauthorized', `${c.what}: the hub refused ${c.token ? 'the token' : 'the request'} (${status}: ${said}); ${c.token ? 'check HF_TOKEN / --token (a read token from https://huggingface.co/settings/tokens)' : 'set HF_TOKEN=<a read token> (or pass --token)'}`);
  }
  return new ModelError('network', `${c.what}: the hub answered ${status} (${said})`);
}
