/**
 * The sidecar's `GET /training/job_events` (routes.ts): a job's events in the sidecar's form from
 * `from=`, then live, as Server-Sent Events (`id` = the event's index, `event` = its type);
 * `: keepalive` comments while idle; the stream ends after the final status event or after
 * `streamCapS` (300) whatever happened, and the reader reconnects with `from=`. The watchdog:
 * every `watchdogS` (15) of an idle stream, a job that the store calls queued or running but
 * that no runner holds is marked failed (JobRunner.failLost), and the stream delivers that event.
 */
import { HttpError, type Req } from '../http/http.ts';
import { openSse } from '../http/stream.ts';
import { isTerminal } from '../jobs/runner.ts';
import type { JobEvent, JobRow } from '../store/store.ts';
import { allEvents, isFinal } from './events.ts';
import type { SidecarDeps } from './deps.ts';

/** `GET /training/job_events`: the job's events from `from`, live, as the sidecar streams them. */
export async function jobEvents(r: Req, deps: SidecarDeps, job: JobRow, mapped: (job: JobRow, events: JobEvent[]) => Promise<Record<string, unknown>[]>): Promise<void> {
  const { store, runner } = deps;
  const fromQ = r.query.get('from');
  const from = fromQ === null ? 0 : Number(fromQ);
  if (!Number.isInteger(from) || from < 0) throw new HttpError(400, `from must be a non-negative integer, got ${JSON.stringify(fromQ)}`);
  const sse = openSse(r);
  let next = from;
  let ended = false;
  let lastSentMs = Date.now();
  let chain: Promise<void> = Promise.resolve();
  const deliver = (records: JobEvent[] | (() => Promise<JobEvent[]>)) => {
    // Mapping may read the output's files (completed): keep the order with a chain.
    chain = chain.then(async () => {
      const evs = typeof records === 'function' ? await records() : records;
      for (const ev of await mapped((await store.getJob(job.id))!, evs.filter((e) => e.index >= next))) {
        if (ended || (ev.index as number) < next) continue;
        sse.send(ev.index as number, ev.type as string, ev);
        next = (ev.index as number) + 1;
        lastSentMs = Date.now();
        if (isFinal(ev)) finish();
      }
    }).catch(() => finish());
  };
  // A bare `{index}` is another node's event (jobs/runner.ts): read it, and any gap, from the store.
  const onLive = (ev: JobEvent) => deliver(ev.index > next || ev.type === undefined ? () => store.events(job.id, next, ev.index - next + 1) : [ev]);
  const timers = [
    setInterval(() => (sse.closed ? finish() : sse.comment('keepalive')), (deps.keepaliveS ?? 15) * 1000),
    // The watchdog: an idle stream asks whether anyone still runs the job.
    setInterval(() => {
      if (Date.now() - lastSentMs < (deps.watchdogS ?? 15) * 1000 * 0.9) return;
      void runner.failLost(job.id, 'the job stopped without a final event: no worker holds it any more (the server lost it, e.g. its engine died); start it again');
    }, (deps.watchdogS ?? 15) * 1000),
    setTimeout(() => finish(), (deps.streamCapS ?? 300) * 1000),
  ];
  function finish() {
    if (ended) return;
    ended = true;
    for (const t of timers) clearTimeout(t as NodeJS.Timeout);
    runner.live.off(`event:${job.id}`, onLive);
    void chain.then(() => sse.end());
  }
  runner.live.on(`event:${job.id}`, onLive);
  deliver(() => allEvents(store, job.id, from));
  const now = (await store.getJob(job.id))!;
  if (isTerminal(now.status)) chain.then(() => finish());
}
