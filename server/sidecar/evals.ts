/**
 * The sidecar's eval dataset (PROTOCOL.md section 10): `POST /evals/add_to_dataset`
 * `{prompt, response, notes?}` appends one JSON line to the key's
 * `<data>/evals/<key id>/eval_dataset.jsonl`; `GET /evals/get_dataset_count` -> `{"count"}`.
 *
 * Both are constant work whatever the file's size: the count and byte size of each key's file
 * are kept in memory and in `eval_dataset.count` beside it (`{"count", "bytes"}`, replaced
 * atomically after each append). The file is read once per key and process, as a stream, only
 * when that record is missing or does not match the file's size (a file from before, or a crash
 * between the append and the record). A key's file is capped at `--max-eval-bytes-per-key`:
 * an add past it is a 413 naming the setting.
 */
import fs from 'node:fs';
import path from 'node:path';
import type { TemplatedApp } from 'uWebSockets.js';
import { requireOwner } from '../http/auth.ts';
import { HttpError, route, sendJson } from '../http/http.ts';
import { randomId } from '../store/store.ts';
import type { SidecarDeps } from './deps.ts';

interface KeyState {
  /** Non-empty lines in the file. */
  count: number;
  /** The file's size in bytes. */
  bytes: number;
}

/** The eval datasets under `<root>/<key id>/`: appends and counts, serialised per key. */
export class EvalLog {
  private states = new Map<string, Promise<KeyState>>();
  private chains = new Map<string, Promise<unknown>>();

  /**
   * @param root `<data>/evals`.
   * @param maxBytesPerKey the largest a key's file may grow (bytes).
   */
  constructor(
    private readonly root: string,
    private readonly maxBytesPerKey: number,
  ) {}

  /** The key's dataset file. */
  file(owner: string): string {
    return path.join(this.root, owner, 'eval_dataset.jsonl');
  }

  private recordFile(owner: string): string {
    return path.join(this.root, owner, 'eval_dataset.count');
  }

  /** The key's line count. @throws Error when the file cannot be read. */
  count(owner: string): Promise<number> {
    return this.serial(owner, async () => (await this.state(owner)).count);
  }

  /**
   * Append one line (a JSON text, without its newline) and return the new count.
   * @throws HttpError 413 when the file would pass the per-key cap (nothing is written).
   */
  append(owner: string, line: string): Promise<number> {
    return this.serial(owner, async () => {
      const s = await this.state(owner);
      const data = Buffer.from(line + '\n', 'utf8');
      if (s.bytes + data.length > this.maxBytesPerKey) {
        throw new HttpError(413, `this key's eval dataset holds ${s.bytes} bytes (${s.count} entries); this entry (${data.length} bytes) would pass the limit of ${this.maxBytesPerKey} bytes (--max-eval-bytes-per-key)`);
      }
      await fs.promises.mkdir(path.dirname(this.file(owner)), { recursive: true });
      await fs.promises.appendFile(this.file(owner), data);
      s.count += 1;
      s.bytes += data.length;
      await this.record(owner, s);
      return s.count;
    });
  }

  /** Run `fn` after every earlier call for `owner`: the count follows the file line by line. */
  private serial<T>(owner: string, fn: () => Promise<T>): Promise<T> {
    const run = (this.chains.get(owner) ?? Promise.resolve()).then(fn, fn);
    const tail = run.catch(() => undefined);
    this.chains.set(owner, tail);
    void tail.then(() => this.chains.get(owner) === tail && this.chains.delete(owner));
    return run;
  }

  private state(owner: string): Promise<KeyState> {
    let s = this.states.get(owner);
    if (!s) {
      s = this.load(owner);
      this.states.set(owner, s);
      s.catch(() => this.states.delete(owner));
    }
    return s;
  }

  private async load(owner: string): Promise<KeyState> {
    let bytes: number;
    try {
      bytes = (await fs.promises.stat(this.file(owner))).size;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT') return { count: 0, bytes: 0 };
      throw e;
    }
    try {
      const kept = JSON.parse(await fs.promises.readFile(this.recordFile(owner), 'utf8'));
      if (kept.bytes === bytes && Number.isInteger(kept.count) && kept.count >= 0) return { count: kept.count, bytes };
    } catch {
      // no record, or a torn one: count the file once
    }
    const s = { count: await countLines(this.file(owner)), bytes };
    await this.record(owner, s);
    return s;
  }

  /** Replace the key's record atomically (write a temp file, rename it over). */
  private async record(owner: string, s: KeyState): Promise<void> {
    const target = this.recordFile(owner);
    const tmp = `${target}.${randomId('tmp-')}`;
    await fs.promises.writeFile(tmp, JSON.stringify({ count: s.count, bytes: s.bytes }));
    await fs.promises.rename(tmp, target);
  }
}

/** Non-empty lines of a file, read as a stream in 1 MiB chunks (never the whole file at once). */
async function countLines(file: string): Promise<number> {
  let count = 0;
  let inLine = false; // the current line has a byte
  for await (const chunk of fs.createReadStream(file, { highWaterMark: 1024 * 1024 }) as AsyncIterable<Buffer>) {
    let at = 0;
    for (let nl = chunk.indexOf(10, at); nl >= 0; nl = chunk.indexOf(10, at)) {
      if (inLine || nl > at) count++;
      inLine = false;
      at = nl + 1;
    }
    if (at < chunk.length) inLine = true;
  }
  return inLine ? count + 1 : count;
}

/** Mount the two evals routes. */
export function mountEvals(app: TemplatedApp, deps: SidecarDeps): void {
  const { store, config } = deps;
  const log = new EvalLog(path.resolve(config.dataDir, 'evals'), config.maxEvalBytesPerKey);

  app.post('/evals/add_to_dataset', route(0, async (r) => {
    const owner = await requireOwner(store, r);
    const body = await r.json();
    for (const k of Object.keys(body)) if (!['prompt', 'response', 'notes'].includes(k)) throw new HttpError(400, `add_to_dataset has no field "${k}"; it takes prompt, response, notes`);
    for (const k of ['prompt', 'response']) if (typeof body[k] !== 'string' || body[k] === '') throw new HttpError(400, `${k} is required (a non-empty string)`);
    if (body.notes !== undefined && body.notes !== null && typeof body.notes !== 'string') throw new HttpError(400, 'notes must be a string');
    const count = await log.append(owner, JSON.stringify({ prompt: body.prompt, response: body.response, notes: body.notes ?? null, timestamp: Date.now() / 1000 }));
    sendJson(r, 200, { status: 'ok', count });
  }));

  app.get('/evals/get_dataset_count', route(0, async (r) => sendJson(r, 200, { count: await log.count(await requireOwner(store, r)) })));
}
