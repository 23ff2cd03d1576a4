/**
 * Bodies of the futures API in both formats (PROTOCOL.md section 7), decoded to the same tree
 * that the session websocket's `parseRequest` takes: plain objects, `NDArray` leaves, Buffers
 * for encoded frames.
 * - msgpack (`Content-Type: application/msgpack`): OpenPI's ndarray maps (section 5), frames as bin.
 * - JSON: an array is `{"data": [numbers, C order], "dtype": "float32", "shape": [..]}`; an
 *   encoded frame (JPEG/PNG/ZPNG) under `observation.image` is a base64 string; a datum's
 *   `state` / `actions` may also be plain (nested) number lists, read as float32.
 * Answers go back in the request's format (msgpack when the request's Content-Type, or for a
 * GET its Accept header, names msgpack). JSON has no NaN or Infinity: such elements of a result
 * array are written as null there (msgpack keeps them); clients that must see them use msgpack.
 */
import crypto from 'node:crypto';
import { ProtocolError } from '../../protocol/errors.ts';
import { exactIntOrString, mapValueBytes, RawMsgpack } from '../../protocol/msgpack.ts';
import { NDArray, ndarray, packNumpy, unpackNumpy } from '../../protocol/ndarray.ts';
import { HttpError, statusLine, type Req } from '../http/http.ts';
import { ignoredFields } from './fields.ts';

export type Format = 'json' | 'msgpack';

/** The answer format of a request. */
export function formatOf(r: Req): Format {
  const h = r.method === 'GET' ? (r.headers['accept'] ?? '') : (r.headers['content-type'] ?? '');
  return /msgpack/i.test(h) ? 'msgpack' : 'json';
}

export interface Body {
  /** The decoded body; a top-level `seq_id` past 2^53 is an exact bigint. */
  value: Record<string, unknown>;
  /** A msgpack body's `seq_id` bytes as sent, to echo it with its msgpack type. */
  seqIdRaw?: Uint8Array;
  /** The bytes as received: the identity of a request for `seq_id` retries. */
  raw: Buffer;
  format: Format;
}

/**
 * Read and decode a request body (an empty body is `{}`).
 * @throws HttpError 413 past `limitBytes`, 400 for a body that is not one JSON object / msgpack
 *   map; ProtocolError for a bad ndarray.
 */
export async function readBody(r: Req, limitBytes: number): Promise<Body> {
  const raw = await r.body(limitBytes);
  const format = formatOf(r);
  if (raw.length === 0) return { value: {}, raw, format };
  let value: unknown;
  if (format === 'msgpack') value = unpackNumpy(raw);
  else {
    try {
      value = JSON.parse(raw.toString('utf8'));
    } catch (e) {
      throw new HttpError(400, `body is not valid JSON: ${(e as Error).message}`);
    }
    value = jsonArrays(value, 'body', 0);
  }
  // Plain objects only: msgpackr turns the reserved byte 0xc1 into a C1Type instance, not an error.
  const proto = value !== null && typeof value === 'object' ? Object.getPrototypeOf(value) : undefined;
  if (proto !== Object.prototype && proto !== null) {
    throw new HttpError(400, `body must be a ${format === 'json' ? 'JSON object' : 'msgpack map'}`);
  }
  const obj = value as Record<string, unknown>;
  if (format === 'json') {
    // Datums at the top level, or inside Tinker's input wrappers.
    for (const holder of [obj, obj.forward_backward_input, obj.forward_input]) {
      const h = holder as Record<string, unknown> | undefined;
      if (h && typeof h === 'object' && Array.isArray(h.data)) h.data = h.data.map((d, i) => jsonDatum(d, i));
    }
  }
  // Decoders round integers past 2^53 (msgpack to float64, JSON.parse too): re-read seq_id exactly.
  let seqIdRaw: Uint8Array | undefined;
  if (format === 'msgpack' && obj.seq_id !== undefined) {
    seqIdRaw = mapValueBytes(raw, 'seq_id') ?? undefined;
    const exact = seqIdRaw ? exactIntOrString(seqIdRaw) : null;
    if (typeof exact === 'bigint') obj.seq_id = exact;
  } else if (format === 'json' && typeof obj.seq_id === 'number' && Number.isInteger(obj.seq_id) && !Number.isSafeInteger(obj.seq_id)) {
    const literal = topLevelJsonLiteral(raw.toString('utf8'), 'seq_id');
    if (literal && /^-?\d+$/.test(literal)) obj.seq_id = BigInt(literal);
  }
  return { value: obj, raw, format, ...(seqIdRaw ? { seqIdRaw } : {}) };
}

/**
 * The source text of the value of top-level key `key` in a JSON object text (the last one, as
 * JSON.parse keeps), or null: a number's digits before JSON.parse rounded them. Only called for
 * the rare body whose seq_id is past 2^53.
 */
function topLevelJsonLiteral(text: string, key: string): string | null {
  let depth = 0;
  let found: string | null = null;
  for (let i = 0; i < text.length; ) {
    const c = text[i]!;
    if (c === '"') {
      let j = i + 1;
      while (j < text.length && text[j] !== '"') j += text[j] === '\\' ? 2 : 1;
      const str = text.slice(i, j + 1);
      i = j + 1;
      if (depth !== 1) continue;
      let k = i;
      while (/\s/.test(text[k] ?? '')) k++;
      if (text[k] !== ':') continue;
      let v = k + 1;
      while (/\s/.test(text[v] ?? '')) v++;
      if (JSON.parse(str) === key) found = /^-?\d+(\.\d+)?([eE][+-]?\d+)?/.exec(text.slice(v, v + 64))?.[0] ?? null;
      i = v;
      continue;
    }
    if (c === '{' || c === '[') depth++;
    else if (c === '}' || c === ']') depth--;
    i++;
  }
  return found;
}

function isArraySpec(v: Record<string, unknown>): boolean {
  const keys = Object.keys(v);
  return keys.length === 3 && Array.isArray(v.data) && typeof v.dtype === 'string' && Array.isArray(v.shape);
}

/** Turn every `{data, dtype, shape}` object of a parsed JSON tree into an NDArray. */
function jsonArrays(v: unknown, where: string, depth: number): unknown {
  if (depth > 64) throw new HttpError(400, `body nests deeper than 64 levels at ${where}`);
  if (Array.isArray(v)) return v.map((x, i) => jsonArrays(x, `${where}[${i}]`, depth + 1));
  if (v === null || typeof v !== 'object') return v;
  const o = v as Record<string, unknown>;
  if (isArraySpec(o)) return toNDArray(o.data as unknown[], o.shape as unknown[], o.dtype as string, where);
  const out: Record<string, unknown> = {};
  for (const [k, x] of Object.entries(o)) {
    Object.defineProperty(out, k, { value: jsonArrays(x, `${where}.${k}`, depth + 1), enumerable: true, writable: true, configurable: true });
  }
  return out;
}

function toNDArray(data: unknown[], shape: unknown[], dtype: string, where: string): NDArray {
  for (let i = 0; i < data.length; i++) {
    const x = data[i];
    if (typeof x !== 'number' && typeof x !== 'boolean') {
      throw new ProtocolError('bad_ndarray', `${where}.data[${i}] is ${JSON.stringify(x)}; array elements must be numbers in C order`);
    }
  }
  try {
    return ndarray(data as number[], shape as number[], dtype);
  } catch (e) {
    // ndarray() names an element `data[i]`: prefixed, it is the element's path in the body.
    if (e instanceof ProtocolError) throw new ProtocolError(e.code, e.message.startsWith('data[') ? `${where}.${e.message}` : `${where}: ${e.message}`);
    throw e;
  }
}

const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

/** Plain number lists as float32 arrays: [S] for state, [H, A] for actions. */
function plainFloats(v: unknown, where: string, rank: 1 | 2): unknown {
  if (!Array.isArray(v)) return v;
  const rows = rank === 1 ? [v] : v;
  const width = Array.isArray(rows[0]) ? (rows[0] as unknown[]).length : -1;
  const flat: number[] = [];
  for (const [i, row] of rows.entries()) {
    if (!Array.isArray(row) || row.length !== width) throw new ProtocolError('bad_ndarray', `${where} must be ${rank === 1 ? 'a list of numbers' : 'a list of equal-length number lists'} or {"data", "dtype", "shape"}; row ${i} is not`);
    for (const x of row) {
      if (typeof x !== 'number') throw new ProtocolError('bad_ndarray', `${where} holds ${JSON.stringify(x)}; expected numbers`);
      flat.push(x);
    }
  }
  return ndarray(flat, rank === 1 ? [width] : [rows.length, width], '<f4');
}

/** JSON-only forms of a datum: base64 frames, plain-list state and actions. */
function jsonDatum(d: unknown, i: number): unknown {
  if (d === null || typeof d !== 'object' || Array.isArray(d)) return d; // parseRequest names the error
  const datum = d as Record<string, unknown>;
  if ('actions' in datum) datum.actions = plainFloats(datum.actions, `data[${i}].actions`, 2);
  const obs = datum.observation as Record<string, unknown> | undefined;
  if (obs && typeof obs === 'object' && !Array.isArray(obs)) {
    if ('state' in obs) obs.state = plainFloats(obs.state, `data[${i}].observation.state`, 1);
    const image = obs.image;
    if (image && typeof image === 'object' && !Array.isArray(image) && !(image instanceof NDArray)) {
      for (const [cam, frame] of Object.entries(image as Record<string, unknown>)) {
        if (typeof frame !== 'string') continue;
        if (frame.length % 4 !== 0 || !BASE64.test(frame)) {
          throw new ProtocolError('bad_request', `data[${i}].observation.image.${cam} is a string but not base64 (${frame.length} characters)`);
        }
        (image as Record<string, unknown>)[cam] = Buffer.from(frame, 'base64');
      }
    }
  }
  return datum;
}

/** JSON form of a result tree: NDArray -> {data, dtype, shape}; bytes -> base64. */
function toJsonTree(v: unknown): unknown {
  if (v instanceof NDArray) {
    const data = Array.from(v.data as ArrayLike<number | bigint>, (x) => (typeof x === 'bigint' ? Number(x) : x));
    return { data, dtype: v.dtype, shape: [...v.shape] };
  }
  if (v instanceof Uint8Array) return Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString('base64');
  if (v instanceof RawMsgpack) {
    const exact = exactIntOrString(v.bytes); // an id echoed as sent: its value in JSON
    return exact ?? null;
  }
  if (Array.isArray(v)) return v.map(toJsonTree);
  if (v !== null && typeof v === 'object') {
    const out: Record<string, unknown> = {};
    for (const [k, x] of Object.entries(v)) out[k] = toJsonTree(x);
    return out;
  }
  return v;
}

// A bigint in a JSON answer goes out as its exact digits: JSON.stringify cannot write one.
const BIGINT_MARK = `bigint-${crypto.randomBytes(6).toString('hex')}:`;
const BIGINT_RE = new RegExp(`"${BIGINT_MARK}(-?\\d+)"`, 'g');

/** JSON text of an answer: NDArrays as {data, dtype, shape}, bytes base64, bigints as exact integer literals. */
function jsonText(body: unknown): string {
  const text = JSON.stringify(toJsonTree(body), (_k, v) => (typeof v === 'bigint' ? `${BIGINT_MARK}${v}` : v instanceof RawMsgpack ? null : v));
  return text.includes(BIGINT_MARK) ? text.replace(BIGINT_RE, '$1') : text;
}

/** Send an answer in `format` (corked; a no-op when the client went away). */
export function sendAs(r: Req, format: Format, status: number, body: unknown): void {
  if (r.aborted) return;
  r.aborted = true;
  const bytes = format === 'msgpack' ? packNumpy(body) : jsonText(body);
  const ignored = ignoredFields(r);
  r.res.cork(() => {
    r.res.writeStatus(statusLine(status)).writeHeader('content-type', format === 'msgpack' ? 'application/msgpack' : 'application/json');
    if (ignored.length > 0) r.res.writeHeader('x-vela-ignored-fields', ignored.join(', '));
    r.res.end(bytes);
  });
}
