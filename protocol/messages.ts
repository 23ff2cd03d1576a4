/**
 * The session websocket's requests (PROTOCOL.md section 3) as a discriminated union on `op`, and
 * `parseRequest`, the one function that turns a decoded msgpack value into a typed request or
 * throws a `ProtocolError` naming the field. Arrays arrive as `NDArray`s (ndarray.ts) and frames
 * stay encoded here: decoding them is the server's job.
 */
import { ProtocolError } from './errors.ts';
import { NDArray } from './ndarray.ts';
import { meant } from './resemble.ts';

/** A camera frame as it came on the wire: encoded bytes (PNG/JPEG/ZPNG) or a uint8 ndarray (RAW). */
export type WireFrame = Uint8Array | NDArray;

/** One training example. Shapes: state [S] (S <= state_dim), actions [H', A'] (H' <= horizon, A' <= action_dim). */
export interface WireDatum {
  images: Map<string, WireFrame>; // camera name -> frame, in the order the client wrote them
  state: NDArray | null;
  prompt: string;
  actions: NDArray | null;
  weight: number; // >= 0, default 1
}

export type LossFn = 'mse' | 'l1';

/**
 * A request id (PROTOCOL.md section 3, "Request ids"): any msgpack integer (int64 and uint64
 * extremes included) or a string of at most MAX_ID_BYTES bytes. Integers beyond +-(2^53 - 1) are
 * bigints here; the session websocket echoes the id's exact msgpack bytes in the answer.
 */
export type RequestId = number | bigint | string;

/** The longest string id, in UTF-8 bytes. */
export const MAX_ID_BYTES = 256;

export type SessionRequest =
  | { id: RequestId; op: 'forward_backward'; data: WireDatum[]; codec: string; loss_fn: LossFn }
  | { id: RequestId; op: 'forward'; data: WireDatum[]; codec: string; keep: boolean }
  | { id: RequestId; op: 'backward'; velocity_grad: NDArray }
  | { id: RequestId; op: 'optim_step'; learning_rate: number; beta1: number; beta2: number; eps: number; weight_decay: number; grad_clip_norm: number }
  | { id: RequestId; op: 'sample'; data: WireDatum[]; codec: string; num_steps: number; weights: string | null; seed: number | null }
  | { id: RequestId; op: 'save_state' | 'load_state' | 'save_weights'; name: string; overwrite: boolean; dir?: string; checkpoint_id?: string } // dir: set by the server (load from another model's folder), never read from the wire
  | { id: RequestId; op: 'abort_gradient_epoch' }
  | { id: RequestId; op: 'heartbeat' };

export type SessionOp = SessionRequest['op'];

export const SESSION_OPS: readonly SessionOp[] = [
  'forward_backward', 'forward', 'backward', 'optim_step', 'sample', 'save_state', 'load_state', 'save_weights', 'abort_gradient_epoch', 'heartbeat',
];

export const NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

/**
 * A saved state of another session of the same key, as list_checkpoints names it:
 * `<session id>/states/<name>`. `load_state` takes one to continue where that session left off
 * (a session of a lost node, or a closed one).
 */
export const STATE_CHECKPOINT_PATTERN = /^(ts-[a-z0-9]{1,64})\/states\/([A-Za-z0-9][A-Za-z0-9._-]{0,127})$/;

export interface RequestLimits {
  maxBatch: number;
  maxPromptBytes: number;
}

const ARGS: Record<SessionOp, readonly string[]> = {
  forward_backward: ['data', 'codec', 'loss_fn'],
  forward: ['data', 'codec', 'keep'],
  backward: ['velocity_grad'],
  optim_step: ['learning_rate', 'beta1', 'beta2', 'eps', 'weight_decay', 'grad_clip_norm'],
  sample: ['data', 'codec', 'num_steps', 'weights', 'seed'],
  save_state: ['name', 'overwrite'],
  load_state: ['name', 'checkpoint_id'],
  save_weights: ['name', 'overwrite'],
  abort_gradient_epoch: [],
  heartbeat: [],
};

function isNDArray(v: unknown): v is NDArray {
  return v instanceof NDArray;
}

function bad(msg: string): never {
  throw new ProtocolError('bad_request', msg);
}

function num(obj: Record<string, unknown>, key: string, def: number, check: (x: number) => boolean, rule: string): number {
  const v = obj[key];
  if (v === undefined || v === null) return def;
  const n = typeof v === 'bigint' ? Number(v) : v;
  if (typeof n !== 'number' || !Number.isFinite(n) || !check(n)) bad(`${key} must be ${rule}, got ${JSON.stringify(typeof v === 'bigint' ? String(v) : v)}`);
  return n;
}

function name(obj: Record<string, unknown>): string {
  const v = obj.name;
  if (typeof v !== 'string' || !NAME_PATTERN.test(v)) {
    bad(`name must match ${NAME_PATTERN.source} (letters, digits, '.', '_', '-', at most 128), got ${JSON.stringify(v)}`);
  }
  return v;
}

/** Why `id` is not a usable request id, or null when it is one. */
export function idProblem(id: unknown): string | null {
  if (id === undefined) return 'the request has no "id": send an integer or a string';
  if (typeof id === 'bigint' || (typeof id === 'number' && Number.isInteger(id))) return null;
  if (typeof id === 'string') {
    const n = Buffer.byteLength(id, 'utf8');
    return n <= MAX_ID_BYTES ? null : `the request's "id" is a string of ${n} bytes; the limit is ${MAX_ID_BYTES}`;
  }
  const what = typeof id === 'number' ? `the float ${id}` : id === null ? 'nil' : id instanceof Uint8Array ? 'bytes' : Array.isArray(id) ? 'an array' : typeof id === 'object' ? 'a map' : typeof id;
  return `the request's "id" must be an integer or a string, got ${what}`;
}

/**
 * A request id in JSON (the REST session object): an integer within +-(2^53 - 1) as a number; a
 * larger one as its decimal string, since JSON numbers are float64 for most readers.
 */
export function jsonId(id: RequestId): number | string {
  return typeof id === 'bigint' ? id.toString() : id;
}

function overwrite(obj: Record<string, unknown>): boolean {
  if (obj.overwrite !== undefined && typeof obj.overwrite !== 'boolean') bad('overwrite must be true or false');
  return obj.overwrite === true;
}

/** The request id of a decoded message, if it has a usable one (for error answers). */
export function requestIdOf(value: unknown): RequestId | null {
  if (typeof value !== 'object' || value === null) return null;
  // Before fromWire, maps are Maps (msgpack.ts decodes with mapsAsObjects: false).
  const id = value instanceof Map ? value.get('id') : (value as Record<string, unknown>).id;
  return idProblem(id) === null ? (id as RequestId) : null;
}

function parseDatum(v: unknown, i: number, limits: RequestLimits): WireDatum {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) bad(`data[${i}] must be a map`);
  const d = v as Record<string, unknown>;
  for (const k of Object.keys(d)) if (!['observation', 'actions', 'weight'].includes(k)) bad(`data[${i}] has an unknown field "${k}"`);
  const obs = d.observation;
  if (typeof obs !== 'object' || obs === null || Array.isArray(obs)) bad(`data[${i}].observation must be a map`);
  const o = obs as Record<string, unknown>;
  for (const k of Object.keys(o)) if (!['image', 'state', 'prompt'].includes(k)) bad(`data[${i}].observation has an unknown field "${k}"`);
  const images = new Map<string, WireFrame>();
  if (o.image !== undefined && o.image !== null) {
    if (typeof o.image !== 'object' || Array.isArray(o.image) || o.image instanceof Uint8Array || isNDArray(o.image)) {
      bad(`data[${i}].observation.image must be a map of camera name -> frame`);
    }
    for (const [cam, frame] of Object.entries(o.image as Record<string, unknown>)) {
      if (!(frame instanceof Uint8Array) && !isNDArray(frame)) bad(`data[${i}].observation.image.${cam} must be bytes or an ndarray`);
      images.set(cam, frame as WireFrame);
    }
  }
  const prompt = o.prompt ?? '';
  if (typeof prompt !== 'string') bad(`data[${i}].observation.prompt must be a string`);
  const promptBytes = Buffer.byteLength(prompt, 'utf8');
  if (promptBytes > limits.maxPromptBytes) {
    throw new ProtocolError('too_large', `data[${i}].observation.prompt is ${promptBytes} bytes; the limit is ${limits.maxPromptBytes}`);
  }
  const state = o.state ?? null;
  if (state !== null && !isNDArray(state)) bad(`data[${i}].observation.state must be an ndarray`);
  const actions = d.actions ?? null;
  if (actions !== null && !isNDArray(actions)) bad(`data[${i}].actions must be an ndarray`);
  const weight = num(d, 'weight', 1, (x) => x >= 0, 'a number >= 0');
  return { images, state: state as NDArray | null, prompt, actions: actions as NDArray | null, weight };
}

function parseData(req: Record<string, unknown>, limits: RequestLimits): WireDatum[] {
  const data = req.data;
  if (!Array.isArray(data)) bad('data must be a list of datums');
  if (data.length === 0) bad('data is empty: send at least one datum');
  if (data.length > limits.maxBatch) throw new ProtocolError('too_large', `data has ${data.length} datums; the limit is ${limits.maxBatch}`);
  return data.map((d, i) => parseDatum(d, i, limits));
}

/**
 * Ops that train need a target chunk in every datum: without one the datum's loss is 0 while its
 * weight still counts in D, silently shrinking the step. (forward without keep and sample do not.)
 * @throws ProtocolError `bad_request` naming the first datum without actions.
 */
function withTargets(data: WireDatum[], what: string): WireDatum[] {
  data.forEach((d, i) => {
    if (d.actions === null) bad(`data[${i}] has no "actions": ${what} needs a target action chunk [H, A] in every datum`);
    if (d.actions.size === 0) bad(`data[${i}].actions is empty (shape [${d.actions.shape}]): ${what} needs at least one action value per datum`);
  });
  return data;
}

function codec(req: Record<string, unknown>): string {
  const c = req.codec ?? 'RAW';
  if (typeof c !== 'string') bad('codec must be a string');
  return c;
}

/**
 * Validate one decoded request (plain object, ndarrays already recognised).
 * @throws ProtocolError `bad_request` naming the field, or `too_large` for a limit.
 */
export function parseRequest(value: unknown, limits: RequestLimits): SessionRequest {
  if (typeof value !== 'object' || value === null || Array.isArray(value) || isNDArray(value) || value instanceof Uint8Array) {
    bad('a request must be a map {"id": <int>, "op": <op>, ...}');
  }
  const req = value as Record<string, unknown>;
  const problem = idProblem(req.id);
  if (problem) bad(problem);
  const id = req.id as RequestId;
  const op = req.op;
  if (typeof op !== 'string') bad('the request has no "op" string');
  if (!(SESSION_OPS as readonly string[]).includes(op)) bad(`unknown op "${op}"${meant(op, SESSION_OPS)}; known ops: ${SESSION_OPS.join(', ')}`);
  const allowed = ARGS[op as SessionOp];
  for (const k of Object.keys(req)) {
    // A misspelt argument names the one it resembles, as REST and the CLI do (`num_step`: "num_steps").
    if (k !== 'id' && k !== 'op' && !allowed.includes(k)) bad(`op ${op} has no argument "${k}"${meant(k, allowed)}; it takes ${allowed.join(', ') || 'none'}`);
  }
  switch (op as SessionOp) {
    case 'forward_backward': {
      const lossFn = req.loss_fn ?? 'mse';
      if (lossFn !== 'mse' && lossFn !== 'l1') bad(`loss_fn must be "mse" or "l1", got ${JSON.stringify(lossFn)}`);
      return { id, op: 'forward_backward', data: withTargets(parseData(req, limits), 'forward_backward'), codec: codec(req), loss_fn: lossFn };
    }
    case 'forward': {
      if (req.keep !== undefined && typeof req.keep !== 'boolean') bad('keep must be true or false');
      const data = parseData(req, limits);
      return { id, op: 'forward', data: req.keep === true ? withTargets(data, 'forward with keep: true') : data, codec: codec(req), keep: req.keep === true };
    }
    case 'backward':
      if (!isNDArray(req.velocity_grad)) bad('velocity_grad must be an ndarray [B, H, A]');
      return { id, op: 'backward', velocity_grad: req.velocity_grad };
    case 'optim_step':
      return {
        id,
        op: 'optim_step',
        learning_rate: num(req, 'learning_rate', 1e-4, (x) => x >= 0 && x <= 1, 'in [0, 1]'),
        beta1: num(req, 'beta1', 0.9, (x) => x >= 0 && x < 1, 'in [0, 1)'),
        beta2: num(req, 'beta2', 0.95, (x) => x >= 0 && x < 1, 'in [0, 1)'),
        eps: num(req, 'eps', 1e-12, (x) => Math.fround(x) > 0, '> 0 (at least 1.4e-45, the smallest float32)'),
        weight_decay: num(req, 'weight_decay', 0, (x) => x >= 0, '>= 0'),
        grad_clip_norm: num(req, 'grad_clip_norm', 0, (x) => x >= 0, '>= 0 (0 = off)'),
      };
    case 'sample': {
      const w = req.weights ?? null;
      if (w !== null && (typeof w !== 'string' || !NAME_PATTERN.test(w))) bad(`weights must be a saved name or null, got ${JSON.stringify(w)}`);
      const seed = req.seed === undefined || req.seed === null ? null : num(req, 'seed', 0, (x) => Number.isInteger(x) && x >= 0, 'a non-negative integer');
      return {
        id, op: 'sample', data: parseData(req, limits), codec: codec(req),
        num_steps: num(req, 'num_steps', 10, (x) => Number.isInteger(x) && x >= 1 && x <= 1000, 'an integer in 1..1000'),
        weights: w as string | null, seed,
      };
    }
    case 'load_state':
      if (req.checkpoint_id !== undefined) {
        if (req.name !== undefined) bad('give either name (a state of this session) or checkpoint_id (another session\'s), not both');
        const m = typeof req.checkpoint_id === 'string' ? STATE_CHECKPOINT_PATTERN.exec(req.checkpoint_id) : null;
        if (!m) bad(`checkpoint_id must be "<session id>/states/<name>" as list_checkpoints gives it, got ${JSON.stringify(req.checkpoint_id)}`);
        return { id, op: 'load_state', name: m[2]!, overwrite: false, checkpoint_id: req.checkpoint_id as string };
      }
      return { id, op: 'load_state', name: name(req), overwrite: overwrite(req) };
    case 'save_state':
    case 'save_weights':
      return { id, op: op as 'save_state', name: name(req), overwrite: overwrite(req) };
    case 'abort_gradient_epoch':
      return { id, op: 'abort_gradient_epoch' };
    case 'heartbeat':
      return { id, op: 'heartbeat' };
  }
}
