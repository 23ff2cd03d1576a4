/**
 * job_start's body without holding `dataset_content` in memory: the JSON body, already streamed
 * to a file, is read once; the top-level `dataset_content` string is base64-decoded straight
 * into another file, and the rest of the object (small: at most `restLimitBytes`) is parsed
 * with `dataset_content` standing as `true`. Only the top level is looked at; a key spelled
 * with escapes is not recognised, so its value stays in the rest (and meets its limit).
 */
import fs from 'node:fs';
import { once } from 'node:events';
import { HttpError } from '../http/http.ts';

const KEY = 'dataset_content';
const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const BASE64 = /^[A-Za-z0-9+/]*$/;

/** Waits until `out` drains (or closes: a failed stream never drains), leaving no listener behind. */
async function drained(out: fs.WriteStream): Promise<void> {
  const ac = new AbortController();
  const wait = (event: string) => once(out, event, { signal: ac.signal }).catch(() => undefined);
  await Promise.race([wait('drain'), wait('close')]);
  ac.abort();
}

export interface SplitBody {
  /** The body's fields; `dataset_content` is `true` when it was a string (decoded into the file). */
  fields: Record<string, unknown>;
  /** Decoded bytes of dataset_content written to `contentFile`; null when it was not a string. */
  contentBytes: number | null;
}

/**
 * Reads the JSON object in `jsonFile`, decoding its `dataset_content` string into `contentFile`
 * (created; left empty when there is none).
 * @throws HttpError 400 for a body that is not a JSON object or a dataset_content that is not
 *   base64 (JSON's `\/` is taken for `/`), 413 when the other fields pass `restLimitBytes`.
 */
export async function splitDatasetContent(jsonFile: string, contentFile: string, restLimitBytes: number): Promise<SplitBody> {
  const out = fs.createWriteStream(contentFile, { flags: 'wx' });
  let failed: Error | null = null; // a disk error: thrown at the next write or at the end
  out.on('error', (e) => (failed ??= e));
  const rest: number[] = [];
  let depth = 0;
  let inString = false;
  let escaped = false;
  let keyMode = false; // in a top-level key
  let key = '';
  let lastKey = '';
  let expectKey = false;
  let afterColon = false;
  let streaming = false; // inside dataset_content's string
  let carry = ''; // base64 characters not yet a multiple of 4
  let chars = 0;
  let padding = 0;
  let contentBytes: number | null = null;
  /** `what` is wrong at character `at` of dataset_content. */
  const bad = (what: string, at = chars) => new HttpError(400, `dataset_content is not valid base64 (${what} at character ${at})`);
  const push = (c: number) => {
    if (rest.length >= restLimitBytes) throw new HttpError(413, `job_start's fields other than dataset_content are over ${restLimitBytes} bytes`);
    rest.push(c);
  };
  const emit = async (text: string) => {
    const data = text.replace(/=+$/, '');
    if (padding > 0 && data.length > 0) throw bad(`${JSON.stringify(data[0])} after '='`); // '=' only at the end
    if (!BASE64.test(data)) {
      const i = data.search(/[^A-Za-z0-9+/]/);
      throw bad(JSON.stringify(data[i]), chars + i);
    }
    padding += text.length - data.length;
    chars += text.length;
    carry += text;
    const whole = carry.length - (carry.length % 4);
    if (whole === 0) return;
    const bytes = Buffer.from(carry.slice(0, whole), 'base64');
    carry = carry.slice(whole);
    contentBytes! += bytes.length;
    if (failed) throw failed;
    if (!out.write(bytes)) await drained(out);
  };
  try {
    for await (const chunk of fs.createReadStream(jsonFile, { highWaterMark: 256 * 1024 }) as AsyncIterable<Buffer>) {
      let i = 0;
      while (i < chunk.length) {
        if (streaming) {
          // One run of the string at a time, to its closing quote or the chunk's end; JSON's `\/`
          // (the one escape base64 may hold: some encoders write `/` so) is undone in bulk, since
          // a string of nothing but escapes would otherwise cost an await per character.
          let head = '';
          if (escaped) {
            if (chunk[i] !== 0x2f) throw bad('an escape other than \\/');
            escaped = false;
            head = '/';
            i++;
          }
          const q = chunk.indexOf(QUOTE, i);
          const end = q < 0 ? chunk.length : q;
          let text = chunk.toString('latin1', i, end).replace(/\\\//g, '/');
          if (end === chunk.length && text.endsWith('\\')) {
            escaped = true; // the escape goes on in the next chunk
            text = text.slice(0, -1);
          }
          const stray = text.indexOf('\\');
          if (stray >= 0) throw bad('an escape other than \\/', chars + head.length + stray);
          await emit(head + text);
          i = end;
          if (i === chunk.length) break;
          streaming = false;
          if (carry.length > 0 || padding > 2) throw new HttpError(400, `dataset_content is not valid base64 (${chars} characters${padding > 2 ? `, ${padding} of them '='` : ': not a multiple of 4'})`);
          i++;
          continue;
        }
        const c = chunk[i++]!;
        if (inString) {
          push(c);
          if (escaped) escaped = false;
          else if (c === BACKSLASH) escaped = true;
          else if (c === QUOTE) {
            inString = false;
            if (keyMode) (keyMode = false), (lastKey = key);
          } else if (keyMode && key.length <= KEY.length) key += String.fromCharCode(c);
          continue;
        }
        if (c === QUOTE && depth === 1 && afterColon && lastKey === KEY) {
          for (const t of Buffer.from('true')) push(t);
          streaming = true;
          afterColon = false;
          contentBytes = 0;
          continue;
        }
        push(c);
        if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) continue;
        if (c === QUOTE) {
          inString = true;
          if (depth === 1 && expectKey) (keyMode = true), (key = ''), (expectKey = false);
        } else if (c === 0x7b || c === 0x5b) {
          depth++;
          if (depth === 1 && c === 0x7b) expectKey = true;
        } else if (c === 0x7d || c === 0x5d) depth--;
        else if (c === 0x2c && depth === 1) expectKey = true;
        else if (c === 0x3a && depth === 1) {
          afterColon = true;
          continue;
        }
        afterColon = false; // the value began, and it is not a string
      }
    }
    if (streaming) throw new HttpError(400, 'body is not valid JSON: it ends inside dataset_content');
    await new Promise<void>((resolve, reject) => out.end(() => (failed ? reject(failed) : resolve())));
    if (failed) throw failed;
  } catch (e) {
    out.destroy();
    throw e;
  }
  if (rest.every((c) => c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09)) return { fields: {}, contentBytes }; // as Req.json: no body is {}
  let value: unknown;
  try {
    value = JSON.parse(Buffer.from(rest).toString('utf8'));
  } catch (e) {
    throw new HttpError(400, `body is not valid JSON: ${(e as Error).message}`);
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) throw new HttpError(400, 'body must be a JSON object');
  return { fields: value as Record<string, unknown>, contentBytes };
}
