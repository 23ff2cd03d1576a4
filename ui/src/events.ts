/**
 * Follow a fine-tune's event log (PROTOCOL.md section 1) live: SSE over `fetch` with the key in
 * the Authorization header, reconnecting with `?from=<next index>` after a drop so that no
 * record is missed or repeated, until the job's terminal status record arrives.
 */
import { ApiError, send, TERMINAL } from './api.ts';
import { SseParser } from './sse.ts';

/** One record of the job's log: `{index, type, timestamp, ...}`. */
export interface JobEvent {
  index: number;
  type: 'status' | 'log' | 'progress' | string;
  timestamp: number;
  [field: string]: unknown;
}

export interface FollowOptions {
  signal: AbortSignal;
  onEvent(ev: JobEvent): void;
  /** Connection state for the page: "live", "reconnecting (...)", "ended". */
  onState?(state: string): void;
}

/**
 * Resolves when the job ended (terminal status seen) or `signal` aborted.
 * @throws ApiError for 4xx answers (401: key refused, 404: no such job); network drops and
 *   5xx answers are retried with a backoff of 1, 2, 4, ... 15 s.
 */
export async function followJobEvents(jobId: string, opts: FollowOptions): Promise<void> {
  let next = 0;
  let failures = 0;
  while (!opts.signal.aborted) {
    let ended = false;
    try {
      const res = await send(`/v1/fine-tunes/${encodeURIComponent(jobId)}/events?stream=true&from=${next}`, {
        headers: { accept: 'text/event-stream' },
        signal: opts.signal,
      });
      opts.onState?.('live');
      const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
      const parser = new SseParser();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        for (const m of parser.push(value)) {
          const ev = JSON.parse(m.data) as JobEvent;
          if (ev.index < next) continue;
          next = ev.index + 1;
          failures = 0;
          opts.onEvent(ev);
          if (ev.type === 'status' && TERMINAL.has(String(ev.status))) ended = true;
        }
      }
    } catch (e) {
      if (opts.signal.aborted) return;
      if (e instanceof ApiError && e.status >= 400 && e.status < 500) throw e;
    }
    if (ended) {
      opts.onState?.('ended');
      return;
    }
    if (opts.signal.aborted) return;
    const waitS = Math.min(15, 2 ** failures++);
    opts.onState?.(`reconnecting in ${waitS} s`);
    await new Promise<void>((resolve) => {
      const t = setTimeout(resolve, waitS * 1000);
      opts.signal.addEventListener('abort', () => (clearTimeout(t), resolve()), { once: true });
    });
  }
}
