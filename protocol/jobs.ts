/**
 * The JSON of a fine-tune job as the REST API returns it (PROTOCOL.md section 1): the server
 * builds it (server/jobs/routes.ts jobJson) and the dashboard reads it (ui/src/api.ts). Types only,
 * so the browser build can import it.
 */

/** A job's lifecycle state; `succeeded`, `failed` and `cancelled` are terminal. */
export type JobStatus = 'queued' | 'running' | 'succeeded' | 'failed' | 'cancelled';

/**
 * One job: identity and progress fields plus every config field with its default (model,
 * dataset_name, steps, ...). Times are Unix seconds; losses are the last logged values, null
 * before the first.
 */
export interface FineTuneJob {
  id: string;
  object: 'fine_tune';
  status: JobStatus;
  created_at: number;
  model: string;
  dataset_name: string;
  steps: number;
  step: number;
  loss: number | null;
  eval_loss: number | null;
  error: string | null;
  output_dir: string;
  /** Real pi0 / pi0.5 jobs that succeeded: the output in the Hub layout, usable as `base` (LoRA merged in). */
  model_dir?: string;
  started_at: number | null;
  finished_at: number | null;
  name?: string | null;
  /** The cluster node that runs (or last ran) the job; null before it starts and on one node. */
  node?: string | null;
  [field: string]: unknown;
}
