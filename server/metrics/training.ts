/**
 * Training sessions (the session websocket, ops.ts): ops by op and outcome, the time of each op
 * (its engine call, in session order; `step` time of forward_backward, optim_step, ...), and
 * errors by op. `op` is one of the protocol's ops, or `invalid` for a request refused before its
 * op was known, so the label stays bounded.
 */
import client from 'prom-client';
import { registry } from './registry.ts';

const OP_BUCKETS_S = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120];

const ops = new client.Counter({ name: 'vela_training_ops_total', help: 'session ops run, by op', labelNames: ['op'], registers: [registry] });
const opErrors = new client.Counter({ name: 'vela_training_op_errors_total', help: 'session ops answered with an error, by op (invalid: refused before parsing finished: bad msgpack, unknown op, read-ahead full)', labelNames: ['op'], registers: [registry] });
const opSeconds = new client.Histogram({
  name: 'vela_training_op_seconds', help: 'time of one session op once its turn came (engine queue and compute), seconds, by op',
  labelNames: ['op'], buckets: OP_BUCKETS_S, registers: [registry],
});

const jobSteps = new client.Counter({ name: 'vela_job_steps_total', help: 'fine-tune job steps taken (vela serve\'s jobs)', registers: [registry] });
const jobStepSeconds = new client.Histogram({
  name: 'vela_job_step_seconds', help: 'time of one fine-tune step: batch sampling and frame decoding, forward_backward, optim_step (evaluation and checkpoints not included), seconds',
  buckets: OP_BUCKETS_S, registers: [registry],
});

/** A fine-tune job took one step in `seconds`. */
export function recordJobStep(seconds: number): void {
  jobSteps.inc();
  jobStepSeconds.observe(seconds);
}

/** A session op ran for `seconds` and succeeded (`ok`) or answered an error. */
export function recordSessionOp(op: string, seconds: number, ok: boolean): void {
  ops.inc({ op });
  opSeconds.observe({ op }, seconds);
  if (!ok) opErrors.inc({ op });
}

/**
 * A session request was refused before it ran: `op` when its op is known (its arguments failed
 * a check), null when it did not parse or read-ahead was full (counted as `invalid`).
 */
export function recordSessionRequestRefused(op: string | null): void {
  opErrors.inc({ op: op ?? 'invalid' });
}
