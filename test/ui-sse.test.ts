/**
 * The dashboard's SSE parser (ui/src/sse.ts) against the WHATWG event-stream rules, fed the
 * server's real framing split at every possible chunk boundary.
 */
import { describe, expect, it } from 'vitest';
import { SseParser, type SseMessage } from '../ui/src/sse.ts';

const feed = (chunks: string[]): SseMessage[] => {
  const p = new SseParser();
  return chunks.flatMap((c) => p.push(c));
};

describe('SseParser', () => {
  // What server/http/stream.ts writes: an opening comment, two events, a keepalive.
  const stream = ': stream opened\n\nid: 0\nevent: status\ndata: {"index":0,"status":"queued"}\n\n: keepalive\n\nid: 1\nevent: progress\ndata: {"index":1,"step":1,"loss":0.5}\n\n';
  const expected: SseMessage[] = [
    { id: '0', event: 'status', data: '{"index":0,"status":"queued"}' },
    { id: '1', event: 'progress', data: '{"index":1,"step":1,"loss":0.5}' },
  ];

  it('parses the server framing whole and split at every offset', () => {
    expect(feed([stream])).toEqual(expected);
    for (let i = 0; i <= stream.length; i++) expect(feed([stream.slice(0, i), stream.slice(i)])).toEqual(expected);
    expect(feed(stream.split(''))).toEqual(expected);
  });

  it('accepts CRLF and CR line ends, also split between CR and LF', () => {
    for (const eol of ['\r\n', '\r']) {
      const s = stream.replaceAll('\n', eol);
      for (let i = 0; i <= s.length; i++) expect(feed([s.slice(0, i), s.slice(i)])).toEqual(expected);
    }
  });

  it('joins data lines, keeps the last id, defaults the event name, skips data-less events', () => {
    const msgs = feed(['data: a\ndata:b\ndata\n\n', 'id: 7\nevent: x\n\n', 'data:  two spaces\n\n', 'retry: 10\nunknown: y\ndata: z\n\n', 'data: no blank line yet\n']);
    expect(msgs).toEqual([
      { id: null, event: 'message', data: 'a\nb\n' },
      { id: '7', event: 'message', data: ' two spaces' },
      { id: '7', event: 'message', data: 'z' },
    ]);
  });
});
