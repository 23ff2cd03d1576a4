/**
 * Body fields of the futures API under xorl's compatibility rule: "unrelated unknown fields
 * retain their rolling-client / shared-config behavior", so a field that Vela does not know and
 * that looks like nothing it knows (Tinker's `type`, `allow_metadata_only`, `user_metadata`, ...)
 * is accepted and ignored, and named back to the client (`ignored_fields` in the answer, and the
 * `X-Vela-Ignored-Fields` header). A field that looks like one of the route's own fields (a
 * misspelling: `learnig_rate`, `grad_clip`, `Learning-Rate`), or that belongs to another route
 * (`learning_rate` sent to forward_backward), is still a 400: a typo must never silently train
 * on defaults. Documented aliases (`gradient_clip`, `lr`, ...) are mapped before this check.
 *
 * ZORL's fields are neither: xorl removed ZORL, and "known ZORL configuration fields now fail
 * with a migration error at ... session API boundaries", so `zorl`, `zorl_config` and every
 * `zorl_*` field is a 400 that says so and names lora_config, on every route (top level:
 * `refuseZorl` from the handler wrapper; nested objects: through checkFields).
 */
import { HttpError, type Req } from '../http/http.ts';
import { resemblance } from '../../protocol/resemble.ts';

/** Fields with a meaning somewhere in Vela's futures API (ids excluded: they are harmless). */
const VELA_FIELDS = new Set([
  'data', 'codec', 'loss_fn', 'keep', 'learning_rate', 'beta1', 'beta2', 'eps', 'weight_decay', 'grad_clip_norm',
  'adam_params', 'num_steps', 'weights', 'seed', 'name', 'path', 'overwrite', 'checkpoint_id', 'base_model',
  'finetune', 'rank', 'alpha', 'targets', 'action_horizon', 'lora_config', 'quantization', 'url', 'api_key',
  'lr', 'gradient_clip', 'forward_backward_input', 'forward_input', 'observation',
  'normalize_loss_before_backward', 'norm_type', 'clip_norm_type', 'grad_norm_type', 'max_norm_type',
]);

const ignoredByReq = new WeakMap<Req, string[]>();

/** ZORL's fields: `zorl`, `zorl_config`, `zorl_*` (any case and separator: `ZORL-rank`, `zorlConfig`). */
const ZORL_FIELD = /^zorl/i;

/**
 * Refuse ZORL's fields (xorl's migration rule).
 * @throws HttpError 400 `{error, code: "zorl_removed"}` naming the first one, that ZORL was removed, and lora_config.
 */
export function refuseZorl(body: Record<string, unknown>, what: string): void {
  const k = Object.keys(body).find((f) => ZORL_FIELD.test(f));
  if (k === undefined) return;
  throw new HttpError(
    400,
    `${what}: "${k}" is a ZORL field, and ZORL was removed (xorl): configure the adapter with lora_config {rank, alpha, targets} on create_model instead`,
    { code: 'zorl_removed' },
  );
}

/**
 * Check a body's fields against what `what` takes.
 * @returns the unknown, unrelated fields (ignored; also noted for the answer's header).
 * @throws HttpError 400 for a field that resembles one of `allowed` or belongs to another route,
 *   and for a ZORL field (refuseZorl).
 */
export function checkFields(r: Req | null, body: Record<string, unknown>, allowed: readonly string[], what: string): string[] {
  refuseZorl(body, what);
  const ignored: string[] = [];
  for (const k of Object.keys(body)) {
    if (allowed.includes(k)) continue;
    const like = resemblance(k, allowed);
    if (like) throw new HttpError(400, `${what} has no field "${k}" (did you mean "${like}"?); it takes ${allowed.join(', ')}`);
    if (VELA_FIELDS.has(k)) throw new HttpError(400, `${what} has no field "${k}" (a field of other routes); it takes ${allowed.join(', ')}`);
    ignored.push(k);
  }
  if (r && ignored.length > 0) ignoredByReq.set(r, [...(ignoredByReq.get(r) ?? []), ...ignored]);
  return ignored;
}

/** Fields ignored so far for this request (for the `X-Vela-Ignored-Fields` header). */
export function ignoredFields(r: Req): string[] {
  return ignoredByReq.get(r) ?? [];
}

/** `answer` plus `ignored_fields` when some were ignored (for answers that are not an op's result). */
export function withIgnored<T extends Record<string, unknown>>(r: Req, answer: T): T & { ignored_fields?: string[] } {
  const ignored = ignoredFields(r);
  return ignored.length > 0 ? { ...answer, ignored_fields: ignored } : answer;
}
