/**
 * Test helper: read a job's Server-Sent Events stream (`GET /v1/fine-tunes/{id}/events`) until
 * `stopAfter` events or the stream's end; returns the parsed events. Checks each event's SSE
 * `id` and `event` fields against its JSON.
 */
import { expect } from 'vitest';
import { TEST_KEY } from './server.ts';

/** Reads an SSE stream until `stopAfter` events or its end; returns the parsed events. */
export async function readSse(base: { baseUrl: string }, id: string, query = '', stopAfter = Infinity): Promise<any[]> {
  const ctl = new AbortController();
  const res = await fetch(`${base.baseUrl}/v1/fine-tunes/${id}/events${query}`, { headers: { authorization: `Bearer ${TEST_KEY}`, accept: 'text/event-stream' }, signal: ctl.signal });
  expect(res.headers.get('content-type')).toBe('text/event-stream');
  const events: any[] = [];
  const decoder = new TextDecoder();
  let buf = '';
  try {
    for await (const chunk of res.body as any as AsyncIterable<Uint8Array>) {
      buf += decoder.decode(chunk, { stream: true });
      let cut;
      while ((cut = buf.indexOf('\n\n')) >= 0) {
        const block = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        const fields = Object.fromEntries(block.split('\n').filter((l) => !l.startsWith(':')).map((l) => [l.slice(0, l.indexOf(':')), l.slice(l.indexOf(':') + 2)]));
        if (fields.data === undefined) continue;
        const ev = JSON.parse(fields.data);
        expect(Number(fields.id)).toBe(ev.index);
        expect(fields.event).toBe(ev.type);
        events.push(ev);
        if (events.length >= stopAfter) {
          ctl.abort();
          return events;
        }
      }
    }
  } catch (e) {
    if ((e as Error).name !== 'AbortError') throw e;
  }
  return events;
}
