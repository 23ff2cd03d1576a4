/**
 * A Vela job's event log in the sidecar's terms (the sidecar training API's "Progress events"),
 * record for record, so an event keeps its index (the SSE `id`, `from=`):
 * - status `queued` -> a log (the sidecar has no such status: it is "waiting for a GPU"),
 * - status `running` -> status `running` with `model_size`, `num_train_steps`,
 * - the trainer's start (a log with `stage: "training"`) -> status `training` with `max_steps`,
 * - `progress` -> `progress` (`step`, `loss`, `learning_rate`, `epoch`, `timestamp`,
 *   `elapsed_seconds`, and Vela's extra fields),
 * - status `succeeded` -> status `completed` with `final_loss` and `model` (`path`
 *   `trained/<job id>`, `files` with `path`, `size`, `sha256`),
 * - `failed` / `cancelled` -> the same, with `error`; other logs stay logs.
 */
import type { JobEvent, JobRow, Store } from '../store/store.ts';

/** The saved weights of a completed job, as `/models/file` serves them. */
export interface TrainedModel {
  path: string; // "trained/<job id>"
  model_size: string;
  files: { path: string; size: number; sha256: string }[];
}

/** A Vela job status as the sidecar's TrainingJob names it. */
export function sidecarStatus(job: JobRow): string {
  switch (job.status) {
    case 'succeeded':
      return 'completed';
    case 'running':
      return job.step > 0 ? 'training' : 'running';
    default:
      return job.status; // queued, failed, cancelled
  }
}

/** One Vela event in the sidecar's form; `model` is needed for the `completed` event only. */
export function sidecarEvent(ev: JobEvent, job: JobRow, model: TrainedModel | null): Record<string, unknown> {
  const { index, type, timestamp, ...data } = ev;
  const cfg = job.config as { model?: string; steps?: number };
  const base = { index, timestamp };
  if (type === 'progress') return { ...base, type: 'progress', ...data };
  if (type === 'log') {
    if (data.stage === 'training') return { ...base, type: 'status', status: 'training', max_steps: data.max_steps ?? cfg.steps };
    return { ...base, type: 'log', message: data.message };
  }
  switch (data.status) {
    case 'queued':
      return { ...base, type: 'log', message: 'queued: waiting for the engine' };
    case 'running':
      return { ...base, type: 'status', status: 'running', model_size: data.model ?? cfg.model, num_train_steps: data.steps ?? cfg.steps };
    case 'succeeded':
      return { ...base, type: 'status', status: 'completed', final_loss: job.loss, model };
    default:
      return { ...base, type: 'status', status: data.status, error: data.error ?? null };
  }
}

/** Whether a sidecar event ends the job. */
export function isFinal(ev: Record<string, unknown>): boolean {
  return ev.type === 'status' && ['completed', 'failed', 'cancelled'].includes(ev.status as string);
}

/** Every event of a job from index `from`, read page by page (the store answers at most 10,000 at once). */
export async function allEvents(store: Store, jobId: string, from = 0): Promise<JobEvent[]> {
  const out: JobEvent[] = [];
  for (let page = await store.events(jobId, from); page.length > 0; page = await store.events(jobId, out.at(-1)!.index + 1)) out.push(...page);
  return out;
}
