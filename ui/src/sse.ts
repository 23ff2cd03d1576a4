/**
 * A Server-Sent Events parser for streams read with `fetch` (EventSource cannot send an
 * Authorization header). Follows the WHATWG "event stream interpretation": lines end in CRLF,
 * LF or CR; `:` starts a comment; `field: value` drops one leading space; a blank line
 * dispatches; `data` lines join with "\n"; `id` persists across events; an event with no data
 * is not dispatched. No DOM: the unit test runs it in Node.
 */

export interface SseMessage {
  /** The last `id:` seen on the stream (persists, as the spec says), or null. */
  id: string | null;
  /** `event:` field, "message" when absent. */
  event: string;
  data: string;
}

export class SseParser {
  private buf = '';
  private data: string[] = [];
  private event = '';
  private lastId: string | null = null;
  /** A chunk ended in CR: a LF at the next chunk's start belongs to the same line end. */
  private skipLf = false;

  /** Feed decoded text; returns the events completed by it, in order. */
  push(chunk: string): SseMessage[] {
    if (this.skipLf && chunk.startsWith('\n')) chunk = chunk.slice(1);
    this.skipLf = false;
    this.buf += chunk;
    const out: SseMessage[] = [];
    let start = 0;
    for (let i = 0; i < this.buf.length; i++) {
      const c = this.buf[i];
      if (c !== '\n' && c !== '\r') continue;
      this.line(this.buf.slice(start, i), out);
      if (c === '\r') {
        if (i + 1 === this.buf.length) this.skipLf = true;
        else if (this.buf[i + 1] === '\n') i++;
      }
      start = i + 1;
    }
    this.buf = this.buf.slice(start);
    return out;
  }

  private line(line: string, out: SseMessage[]): void {
    if (line === '') {
      if (this.data.length > 0) out.push({ id: this.lastId, event: this.event || 'message', data: this.data.join('\n') });
      this.data = [];
      this.event = '';
      return;
    }
    if (line.startsWith(':')) return;
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'data') this.data.push(value);
    else if (field === 'event') this.event = value;
    else if (field === 'id' && !value.includes('\0')) this.lastId = value;
    // `retry` and unknown fields are ignored: the reader picks its own reconnect delay.
  }
}
