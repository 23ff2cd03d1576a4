/**
 * Event cursors of `GET /v1/fine-tunes/{id}/events` (issue 13, item 3; PROTOCOL.md section 1
 * "Event cursors"): one behaviour per odd `from=` / `Last-Event-ID`, the same for the JSON list
 * and the SSE stream, and no record skipped or repeated across a reconnect. The job's log is
 * written the way the job runner writes it (runner.emit: durable log, then live readers) on a
 * real server, so no training runs here.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { nowS, type JobRow } from '../server/store/store.ts';
import { startTestServer, TEST_KEY, type TestServer } from './helpers/server.ts';

let server: TestServer;
let owner: string;

beforeAll(async () => {
  server = await startTestServer({ engineFactory: (() => Promise.reject(new Error('no engine in this test'))) as any });
  owner = (await server.store.findApiKey(TEST_KEY))!;
});
afterAll(() => server?.close());

let jobs = 0;
/** A running job whose log holds `n` records (indexes 0..n-1). */
async function runningJob(n: number): Promise<string> {
  const id = `ft-cursor${++jobs}`;
  const row: JobRow = {
    id, owner, status: 'running', created_at: nowS(), config: { model: 'flow05-tiny', dataset_name: 'x', steps: 10 }, step: 0, loss: null, eval_loss: null,
    error: null, output_dir: '', started_at: nowS(), finished_at: null, cancel_requested: false,
  };
  await server.store.insertJob(row);
  await server.runner.emit(id, 'status', { status: 'running' });
  for (let i = 1; i < n; i++) await server.runner.emit(id, 'progress', { step: i, loss: 1 / i });
  return id;
}

async function end(id: string): Promise<void> {
  await server.store.updateJob(id, { status: 'succeeded', finished_at: nowS() });
  await server.runner.emit(id, 'status', { status: 'succeeded' });
}

const auth = { authorization: `Bearer ${TEST_KEY}` };

/** Open the SSE stream; `received` grows as records arrive; `done` resolves when the server ends it. */
async function sse(id: string, query: string, headers: Record<string, string> = {}) {
  const ctrl = new AbortController();
  const res = await fetch(`${server.baseUrl}/v1/fine-tunes/${id}/events?stream=true${query}`, { headers: { ...auth, ...headers }, signal: ctrl.signal });
  const received: number[] = [];
  let text = '';
  const done = (async () => {
    if (res.status !== 200) return (await res.json()) as { error: string };
    const reader = res.body!.getReader();
    for (;;) {
      const { value, done } = await reader.read().catch(() => ({ value: undefined, done: true }));
      if (done) return null;
      text += Buffer.from(value!).toString();
      let cut: number;
      while ((cut = text.indexOf('\n\n')) >= 0) {
        const block = text.slice(0, cut);
        text = text.slice(cut + 2);
        const m = /^id: (\d+)$/m.exec(block);
        if (m) received.push(Number(m[1]));
      }
    }
  })();
  return { status: res.status, received, done, abort: () => ctrl.abort() };
}

const until = async (cond: () => boolean) => {
  for (let i = 0; i < 500 && !cond(); i++) await new Promise((r) => setTimeout(r, 10));
  expect(cond()).toBe(true);
};

const range = (a: number, b: number) => Array.from({ length: b - a }, (_, i) => a + i);

describe('the cursor table (a running job with records 0..4)', () => {
  // [from (null: absent), Last-Event-ID (undefined: absent), first record, or the 400's message]
  const table: [string | null, string | undefined, number | RegExp][] = [
    [null, undefined, 0],
    ['0', undefined, 0],
    ['3', undefined, 3],
    ['5', undefined, 5], // the next record: waits for it
    [null, '', 0], // empty Last-Event-ID: the SSE spec's "no last id"
    [null, '2', 3],
    [null, '4', 5],
    ['0', '2', 3], // both: the later position (EventSource reconnects with its first URL)
    ['4', '1', 4],
    ['', undefined, /^from must be a record index \(an integer >= 0\), got ""$/],
    ['-1', undefined, /got "-1"/],
    ['abc', undefined, /got "abc"/],
    ['1e3', undefined, /got "1e3"/],
    ['2.0', undefined, /got "2.0"/],
    [' 2', undefined, /got " 2"/],
    [null, '-1', /^Last-Event-ID must be the id of a record this log sent \(an integer >= 0\), got "-1"$/],
    [null, 'x', /got "x"/],
    ['6', undefined, /^from=6 is past the end of the log: its last record has index 4 \(reconnect with from=5 or lower\)$/],
    ['99999999999999999999', undefined, /^from=99999999999999999999 is past the end of the log: its last record has index 4/],
    [null, '5', /^Last-Event-ID 5 is past the end of the log: its last record has index 4/],
    [null, '100000', /^Last-Event-ID 100000 is past the end/], // the issue's input
    ['1', '100000', /^Last-Event-ID 100000 is past the end/],
  ];

  for (const [from, lastId, want] of table) {
    const name = `from ${from === null ? 'absent' : JSON.stringify(from)}, Last-Event-ID ${lastId === undefined ? 'absent' : JSON.stringify(lastId)}`;
    it(`${name}: ${want instanceof RegExp ? '400' : `starts at ${want}`}, in JSON and in SSE`, async () => {
      const id = await runningJob(5);
      const query = from === null ? '' : `&from=${encodeURIComponent(from)}`;
      const headers: Record<string, string> = lastId === undefined ? {} : { 'last-event-id': lastId };
      const list = await fetch(`${server.baseUrl}/v1/fine-tunes/${id}/events?x=1${query}`, { headers: { ...auth, ...headers } });
      const body = (await list.json()) as { data?: { index: number }[]; error?: string; last_index?: number };
      const s = await sse(id, query, headers);
      if (want instanceof RegExp) {
        expect(list.status).toBe(400);
        expect(body.error).toMatch(want);
        expect(s.status).toBe(400);
        expect((await s.done)!.error).toMatch(want);
        return;
      }
      expect(list.status).toBe(200);
      expect(body.data!.map((e) => e.index)).toEqual(range(want, 5));
      expect(s.status).toBe(200);
      await until(() => s.received.length === 5 - want);
      expect(s.received).toEqual(range(want, 5));
      // Then live records, and the stream ends after the terminal status.
      await server.runner.emit(id, 'progress', { step: 5, loss: 0.1 });
      await end(id);
      expect(await s.done).toBeNull();
      expect(s.received).toEqual(range(want, 7));
    });
  }
});

describe('reconnects', () => {
  it('an EventSource-style reconnect (first URL + Last-Event-ID) misses nothing and repeats nothing', async () => {
    const id = await runningJob(3);
    const first = await sse(id, '&from=0');
    await until(() => first.received.length === 3);
    first.abort();
    for (let i = 3; i < 8; i++) await server.runner.emit(id, 'progress', { step: i, loss: 1 });
    const second = await sse(id, '&from=0', { 'last-event-id': String(first.received.at(-1)) });
    await until(() => second.received.length === 5);
    await end(id);
    expect(await second.done).toBeNull();
    expect([...first.received, ...second.received]).toEqual(range(0, 9));
  });

  it('a finished job with more records than one page streams all of them, then ends', async () => {
    const id = await runningJob(1);
    for (let i = 1; i < 10_050; i++) void server.runner.emit(id, 'progress', { step: i, loss: 1 }); // in order: emits of a job are chained
    await end(id);
    const s = await sse(id, '');
    expect(await s.done).toBeNull();
    expect(s.received.length).toBe(10_051);
    expect(s.received).toEqual(range(0, 10_051));
    const list = (await (await fetch(`${server.baseUrl}/v1/fine-tunes/${id}/events`, { headers: auth })).json()) as { data: unknown[]; has_more: boolean };
    expect(list.data.length).toBe(10_000);
    expect(list.has_more).toBe(true);
    const rest = (await (await fetch(`${server.baseUrl}/v1/fine-tunes/${id}/events?from=10000`, { headers: auth })).json()) as { data: { index: number }[]; has_more: boolean };
    expect(rest.data.map((e) => e.index)).toEqual(range(10_000, 10_051));
    expect(rest.has_more).toBe(false);
  });

  it('a cursor at the end of a finished job: an empty list, and a stream that ends at once', async () => {
    const id = await runningJob(2);
    await end(id);
    const s = await sse(id, '&from=3');
    expect(await s.done).toBeNull();
    expect(s.received).toEqual([]);
  });
});
