/**
 * Request bodies of the futures API: which fields each op takes, the common fields (`model_id`,
 * `seq_id`), the translation of an op body into the session websocket's request (validated by
 * `parseRequest`, so both paths accept exactly the same arguments), and the mapping of errors to
 * HTTP answers (PROTOCOL.md section 0).
 */
import crypto from 'node:crypto';
import { ProtocolError } from '../../protocol/errors.ts';
import type { SessionRequest } from '../../protocol/messages.ts';
import { EngineError } from '../engine/messages.ts';
import { HttpError, type Req } from '../http.ts';
import { log } from '../log.ts';
import { redactPaths } from '../redact.ts';

/** A futures op: its engine (websocket) op and the body fields it takes besides model_id, seq_id. */
export const OPS: Record<string, { op: SessionRequest['op']; args: string[] }> = {
  forward_backward: { op: 'forward_backward', args: ['data', 'codec', 'loss_fn'] },
  forward: { op: 'forward', args: ['data', 'codec', 'keep'] },
  optim_step: { op: 'optim_step', args: ['learning_rate', 'beta1', 'beta2', 'eps', 'weight_decay', 'grad_clip_norm', 'adam_params'] },
  abort_gradient_epoch: { op: 'abort_gradient_epoch', args: [] },
  sample: { op: 'sample', args: ['data', 'codec', 'num_steps', 'weights', 'seed'] },
  save_weights: { op: 'save_state', args: ['name', 'path', 'overwrite'] },
  load_weights: { op: 'load_state', args: ['name', 'path'] },
  save_weights_for_sampler: { op: 'save_weights', args: ['name', 'path', 'overwrite'] },
};

const ADAM_KEYS = ['learning_rate', 'beta1', 'beta2', 'eps', 'weight_decay', 'grad_clip_norm'];

/** @throws HttpError 400 naming the first field that `what` does not take. */
export function checkFields(body: Record<string, unknown>, allowed: string[], what: string): void {
  for (const k of Object.keys(body)) {
    if (!allowed.includes(k)) throw new HttpError(400, `${what} has no field "${k}"; it takes ${allowed.join(', ')}`);
  }
}

/** The body's `model_id` (or its `alias` field). @throws HttpError 400. */
export function modelIdOf(body: Record<string, unknown>, alias?: string): string {
  const id = body.model_id ?? (alias ? body[alias] : undefined);
  if (typeof id !== 'string' || id === '') throw new HttpError(400, `model_id must be the string that create_model returned, got ${JSON.stringify(id)}`);
  return id;
}

const MAX_SEQ_ID = 2n ** 64n - 1n;

/**
 * The body's `seq_id`, exact (readBody keeps integers past 2^53 as bigints), null when absent.
 * @throws HttpError 400 unless an integer in 0..2^64 - 1.
 */
export function seqIdOf(body: Record<string, unknown>): bigint | null {
  const v = body.seq_id;
  if (v === undefined || v === null) return null;
  const ok = (typeof v === 'bigint' && v >= 0n && v <= MAX_SEQ_ID) || (typeof v === 'number' && Number.isSafeInteger(v) && v >= 0);
  if (!ok) throw new HttpError(400, `seq_id must be an integer in 0..2^64 - 1, got ${typeof v === 'bigint' ? String(v) : JSON.stringify(v)}`);
  return BigInt(v as number | bigint);
}

/** Seconds-resolution name for `save_weights` without a name (xorl: "path: null = auto-timestamped"). */
function autoName(): string {
  return `ckpt-${new Date().toISOString().replace(/[-:]/g, '').replace(/\.\d+Z$/, 'Z')}-${crypto.randomBytes(3).toString('hex')}`;
}

/**
 * The websocket request of a futures op body (validate it with parseRequest): Tinker's
 * `adam_params` flattened, `path` read as `name`, a save without a name given an automatic one.
 * @throws HttpError 400 for a field given twice or a bad `adam_params`.
 */
export function wsRequest(name: string, body: Record<string, unknown>): Record<string, unknown> {
  const spec = OPS[name]!;
  const req: Record<string, unknown> = { id: 0, op: spec.op };
  for (const k of spec.args) if (body[k] !== undefined) req[k] = body[k];
  if (name === 'optim_step' && req.adam_params !== undefined) {
    const p = req.adam_params;
    delete req.adam_params;
    if (p === null || typeof p !== 'object' || Array.isArray(p)) throw new HttpError(400, 'adam_params must be an object {learning_rate, beta1, beta2, eps, ...}');
    for (const [k, v] of Object.entries(p)) {
      if (!ADAM_KEYS.includes(k)) throw new HttpError(400, `adam_params has no field "${k}"; it takes ${ADAM_KEYS.join(', ')}`);
      if (req[k] !== undefined) throw new HttpError(400, `${k} is given both at the top level and in adam_params`);
      req[k] = v;
    }
  }
  if ('path' in req) {
    if (req.name !== undefined) throw new HttpError(400, 'give either name or path, not both');
    req.name = req.path;
    delete req.path;
  }
  if ((spec.op === 'save_state' || spec.op === 'save_weights') && (req.name === undefined || req.name === null)) req.name = autoName();
  return req;
}

/** Map a thrown value to status and body, in PROTOCOL.md section 0's terms. */
export function errorAnswer(r: Req, err: unknown): [number, Record<string, unknown>] {
  if (err instanceof HttpError) return [err.status, { error: redactPaths(err.message), ...err.extra }];
  if (err instanceof ProtocolError) return [err.code === 'too_large' ? 413 : 400, { error: redactPaths(err.message), code: err.code }];
  if (err instanceof EngineError) {
    const status = err.code === 'not_found' ? 404 : ['conflict', 'busy', 'poisoned'].includes(err.code) ? 409 : 400;
    return [status, { error: redactPaths(err.message), code: err.code }];
  }
  const requestId = `req-${crypto.randomBytes(6).toString('hex')}`;
  log.error(`${r.method} ${r.url} failed (${requestId})`, err);
  return [500, { error: 'internal error', request_id: requestId }];
}
