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
import { HttpError, type Req } from '../http/http.ts';
import { log } from '../log.ts';
import { redactPaths } from '../http/redact.ts';
import { checkFields } from './fields.ts';

export { checkFields } from './fields.ts';

/**
 * A futures op: its engine (websocket) op and the body fields it takes besides model_id, seq_id
 * (xorl / Tinker aliases included: they are mapped by `wsRequest`).
 */
export const OPS: Record<string, { op: SessionRequest['op']; args: string[] }> = {
  forward_backward: { op: 'forward_backward', args: ['data', 'codec', 'loss_fn', 'forward_backward_input', 'normalize_loss_before_backward'] },
  forward: { op: 'forward', args: ['data', 'codec', 'keep', 'forward_input'] },
  optim_step: { op: 'optim_step', args: ['learning_rate', 'beta1', 'beta2', 'eps', 'weight_decay', 'grad_clip_norm', 'adam_params', 'gradient_clip', 'lr', 'norm_type', 'clip_norm_type', 'grad_norm_type', 'max_norm_type'] },
  abort_gradient_epoch: { op: 'abort_gradient_epoch', args: [] },
  sample: { op: 'sample', args: ['data', 'codec', 'num_steps', 'weights', 'seed'] },
  save_weights: { op: 'save_state', args: ['name', 'path', 'overwrite'] },
  load_weights: { op: 'load_state', args: ['name', 'path', 'checkpoint_id'] },
  save_weights_for_sampler: { op: 'save_weights', args: ['name', 'path', 'overwrite'] },
};

const ADAM_KEYS = ['learning_rate', 'beta1', 'beta2', 'eps', 'weight_decay', 'grad_clip_norm'];
/** Other names of optim_step's fields: xorl's `gradient_clip`, the common `lr`. */
const OPTIM_ALIASES: Record<string, string> = { gradient_clip: 'grad_clip_norm', lr: 'learning_rate' };
/**
 * Names clients give the clipping norm's type (torch's `norm_type`). xorl: "Authoritative adapter
 * clipping supports the L2 norm only. gradient_clip remains the scalar L2 threshold; other norm
 * types are rejected". Vela clips by the global L2 norm (PROTOCOL.md section 3).
 */
const NORM_TYPE_FIELDS = ['norm_type', 'clip_norm_type', 'grad_norm_type', 'max_norm_type'];

/**
 * Take the norm-type fields out of `fields` (the top level or adam_params), checking each is L2:
 * the number 2 (JSON 2 and 2.0 alike), the string "2", "l2" in any case, or null (the default, L2).
 * @throws HttpError 400 naming the field and its value.
 */
function takeNormType(fields: Record<string, unknown>, where: string): void {
  for (const k of NORM_TYPE_FIELDS) {
    if (!(k in fields)) continue;
    const v = fields[k];
    delete fields[k];
    const l2 = v === null || v === 2 || (typeof v === 'string' && ['2', 'l2'].includes(v.trim().toLowerCase()));
    if (!l2) {
      throw new HttpError(400, `${where}${k} ${JSON.stringify(v)} is not supported: clipping uses the L2 norm only (xorl; gradient_clip / grad_clip_norm is the L2 threshold); leave ${k} out, or give "l2" or 2`);
    }
  }
}

/**
 * forward_backward's `normalize_loss_before_backward` (xorl). xorl: "Multi-adapter training
 * accepts raw numerator losses only. Setting normalize_loss_before_backward rejects the
 * forward_backward call; leave normalization to optim_step". Vela's forward_backward already adds
 * the raw numerator (sum_i w_i * loss_i) and optim_step divides by the weights once, so false (or
 * null) is what happens anyway: taken out. @throws HttpError 400 for anything else.
 */
function takeNormalizeLoss(fields: Record<string, unknown>, where: string): void {
  const k = 'normalize_loss_before_backward';
  if (!(k in fields)) return;
  const v = fields[k];
  delete fields[k];
  if (v === false || v === null) return;
  throw new HttpError(400, `${where}${k} ${JSON.stringify(v)} is refused: training accepts raw numerator losses only (xorl); leave normalization to optim_step, which divides the accumulated gradient by the accumulated weights once; leave ${k} out, or false`);
}

/** Tinker's input wrappers: `forward_backward_input: {data, loss_fn}`, `forward_input: {data}`. */
const INPUT_WRAPPERS: Record<string, { field: string; args: string[] }> = {
  forward_backward: { field: 'forward_backward_input', args: ['data', 'codec', 'loss_fn', 'normalize_loss_before_backward'] },
  forward: { field: 'forward_input', args: ['data', 'codec', 'keep'] },
};

function isObject(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

/** Move `from`'s fields into `into` (aliases renamed). @throws HttpError 400 for a field given twice. */
function merge(into: Record<string, unknown>, from: Record<string, unknown>, where: string, aliases: Record<string, string> = {}): void {
  for (const [k0, v] of Object.entries(from)) {
    const k = aliases[k0] ?? k0;
    if (into[k] !== undefined) throw new HttpError(400, `${k === k0 ? k : `${k0} (an alias of ${k})`} is given twice${where ? ` (at the top level and in ${where})` : ''}`);
    into[k] = v;
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
 * `forward_backward_input` / `forward_input` unwrapped, `adam_params` flattened (with its
 * `betas: [b1, b2]`), xorl's `gradient_clip` and `lr` renamed, xorl's L2 norm type and
 * `normalize_loss_before_backward: false` checked and taken out, `path` read as `name`, a save
 * without a name given an automatic one. `load_weights` by `checkpoint_id` or by a path outside
 * the model's own folder is resolved by the caller (routes.ts) and reaches here as `name`.
 * @throws HttpError 400 for a field given twice, a bad wrapper or `adam_params`, a misspelt field in one,
 *   a norm type other than L2, `normalize_loss_before_backward` other than false.
 */
export function wsRequest(name: string, body: Record<string, unknown>, r: Req | null = null): Record<string, unknown> {
  const spec = OPS[name]!;
  const req: Record<string, unknown> = { id: 0, op: spec.op };
  const top: Record<string, unknown> = {};
  for (const k of spec.args) if (body[k] !== undefined) top[k] = body[k];
  const wrapper = INPUT_WRAPPERS[name];
  if (wrapper && top[wrapper.field] !== undefined) {
    const inner = top[wrapper.field];
    delete top[wrapper.field];
    if (!isObject(inner)) throw new HttpError(400, `${wrapper.field} must be an object {${wrapper.args.join(', ')}}`);
    checkFields(r, inner, wrapper.args, wrapper.field);
    const known = Object.fromEntries(Object.entries(inner).filter(([k]) => wrapper.args.includes(k)));
    takeNormalizeLoss(known, `${wrapper.field}.`);
    merge(top, known, wrapper.field);
  }
  if (name === 'forward_backward') takeNormalizeLoss(top, '');
  if (name === 'optim_step') {
    takeNormType(top, '');
    const p = top.adam_params;
    delete top.adam_params;
    const flat: Record<string, unknown> = {};
    merge(flat, top, '', OPTIM_ALIASES);
    if (p !== undefined) {
      if (!isObject(p)) throw new HttpError(400, 'adam_params must be an object {learning_rate, beta1, beta2, eps, weight_decay, grad_clip_norm}');
      const { betas, ...rest } = p;
      checkFields(r, rest, [...ADAM_KEYS, ...Object.keys(OPTIM_ALIASES), ...NORM_TYPE_FIELDS], 'adam_params');
      const known = Object.fromEntries(Object.entries(rest).filter(([k]) => ADAM_KEYS.includes(k) || k in OPTIM_ALIASES || NORM_TYPE_FIELDS.includes(k)));
      takeNormType(known, 'adam_params.');
      if (betas !== undefined) {
        if (!Array.isArray(betas) || betas.length !== 2) throw new HttpError(400, `adam_params.betas must be [beta1, beta2], got ${JSON.stringify(betas)}`);
        merge(known, { beta1: betas[0], beta2: betas[1] }, 'adam_params.betas');
      }
      merge(flat, known, 'adam_params', OPTIM_ALIASES);
    }
    Object.assign(req, flat);
  } else Object.assign(req, top);
  if ('path' in req) {
    if (req.name !== undefined) throw new HttpError(400, 'give either name or path, not both');
    req.name = req.path;
    delete req.path;
  }
  if ((spec.op === 'save_state' || spec.op === 'save_weights') && (req.name === undefined || req.name === null)) req.name = autoName();
  return req;
}

/** Errors of the model layers that bad input causes (their messages are safe to show). */
const CLIENT_ERRORS = ['ShapeError', 'NormError', 'PolicyConfigError', 'CheckpointError', 'TrainerError'];

/** Map a thrown value to status and body, in PROTOCOL.md section 0's terms. */
export function errorAnswer(r: Req, err: unknown): [number, Record<string, unknown>] {
  if (err instanceof HttpError) return [err.status, { error: redactPaths(err.message), ...err.extra }];
  if (err instanceof ProtocolError) return [err.code === 'too_large' ? 413 : 400, { error: redactPaths(err.message), code: err.code }];
  if (err instanceof EngineError) {
    const status = err.code === 'not_found' ? 404 : ['conflict', 'busy', 'poisoned'].includes(err.code) ? 409 : err.code === 'insufficient_memory' ? 507 : 400;
    return [status, { error: redactPaths(err.message), code: err.code }];
  }
  const e = err as { name?: string; code?: unknown; status?: unknown; message?: string };
  if (typeof e?.status === 'number' && typeof e.code === 'string') return [e.status, { error: e.message, code: e.code }]; // e.g. StorageLimitError (507)
  if (typeof e?.code === 'string' && CLIENT_ERRORS.includes(e.name ?? '')) return [400, { error: e.message, code: e.code }];
  const requestId = `req-${crypto.randomBytes(6).toString('hex')}`;
  log.error(`${r.method} ${r.url} failed (${requestId})`, err);
  return [500, { error: 'internal error', request_id: requestId }];
}
