/**
 * What the sidecar routes need from the server (routes.ts mounts them; stream.ts and evals.ts
 * take the same deps). Its own module so that the route files never import each other.
 */
import type { ServerConfig } from '../config.ts';
import type { InferenceDeps } from '../inference/routes.ts';
import type { JobRunner } from '../jobs/runner.ts';
import type { Store } from '../store/store.ts';

export interface SidecarDeps {
  store: Store;
  config: ServerConfig;
  runner: JobRunner;
  inference: InferenceDeps;
  /** Seconds between `: keepalive` comments (15). */
  keepaliveS?: number;
  /** Seconds a job_events stream lasts at most (300). */
  streamCapS?: number;
  /** Seconds between watchdog checks of an idle stream (15). */
  watchdogS?: number;
}
