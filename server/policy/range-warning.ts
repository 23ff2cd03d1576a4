/**
 * Warnings for observations far outside the norm stats a policy serves with
 * (kernels/norm-range.ts). A robot must not stop because of a warning, so its answer is
 * unchanged but for a `warnings` list (openpi_client returns the answer's dict as is, and its
 * ActionChunkBroker passes non-array leaves through); the server log gets one line per
 * connection (a robot at 50 Hz would otherwise write 50 lines a second), and every such
 * observation counts in `vela_policy_observations_out_of_range_total{policy}`.
 */
import type { OutOfRangeDim, OutOfRangeReport } from '../../kernels/norm-range.ts';
import type { NormStats } from '../../kernels/normalize.ts';
import { log } from '../log.ts';
import { recordObservationOutOfRange } from '../metrics/policy.ts';

const DEG_PER_RAD = 180 / Math.PI;
/** Dims listed in a log line at most; the rest are counted. */
const MAX_LISTED = 6;

const num = (x: number): string => String(Number(x.toPrecision(4)));

function dimName(d: OutOfRangeDim, names: readonly string[] | null): string {
  return names?.[d.dim] ? `dim ${d.dim} (${names[d.dim]})` : `dim ${d.dim}`;
}

/** The stats of one dim as the mode uses them. */
function statsText(d: OutOfRangeDim, r: OutOfRangeReport, stats: NormStats): string {
  return r.mode === 'zscore' ? `mean ${num(stats.mean[d.dim]!)}, std ${num(stats.std[d.dim]!)}` : `q01 ${num(stats.q01[d.dim]!)}, q99 ${num(stats.q99[d.dim]!)}`;
}

/** Whether the worst dim's value, read as degrees, would fit the stats in radians. */
function looksLikeDegrees(r: OutOfRangeReport): boolean {
  const rad = r.worst.value / DEG_PER_RAD;
  return rad >= r.worst.low && rad <= r.worst.high;
}

/**
 * The server log line for a report: the policy, each dim with its value, normalised value and
 * the stats' range, the worst dim, and the likely causes. One line.
 */
export function outOfRangeLogLine(policy: string, r: OutOfRangeReport, stats: NormStats, names: readonly string[] | null): string {
  const unit = r.mode === 'zscore' ? 'z' : 'quantile-normalised';
  const listed = r.dims.slice(0, MAX_LISTED).map((d) => `${dimName(d, names)} = ${num(d.value)} (${unit} ${num(d.normalized)}; ${statsText(d, r, stats)}; accepted ${num(d.low)}..${num(d.high)})`);
  const more = r.dims.length > MAX_LISTED ? ` and ${r.dims.length - MAX_LISTED} more` : '';
  const degrees = looksLikeDegrees(r) ? `: ${dimName(r.worst, names)} read as degrees is ${num(r.worst.value / DEG_PER_RAD)} rad, inside the stats;` : ',';
  return (
    `policy ${policy}: observation state is far outside the norm stats this policy serves with (|${unit}| > ${r.limit}): ${listed.join(', ')}${more}; worst ${dimName(r.worst, names)}. ` +
    `Likely causes: units (degrees where training used radians${degrees} or mm vs m), the stats of another dataset or robot, or the state's dims in another order than training's. ` +
    `The actions are still sent; this is logged once per connection and counted in vela_policy_observations_out_of_range_total`
  );
}

/** The `warnings` entry of the answer: short, for the robot's own log. */
export function outOfRangeAnswerWarning(r: OutOfRangeReport, names: readonly string[] | null): string {
  const w = r.worst;
  return (
    `observation state ${r.dims.length === 1 ? 'dim' : 'dims'} ${r.dims.map((d) => d.dim).join(', ')} far outside the policy's norm stats ` +
    `(worst: ${dimName(w, names)} = ${num(w.value)}; the stats accept ${num(w.low)}..${num(w.high)}): check units (degrees vs radians), the stats and the state's order`
  );
}

/** An observation's report with what describing it needs (PolicyAnswer.outOfRange). */
export interface ObservationOutOfRange {
  report: OutOfRangeReport;
  /** The state stats the report was made against. */
  stats: NormStats;
  stateNames: readonly string[] | null;
}

/** One connection's warnings: `check` per answered observation. */
export class RangeWarnings {
  private warned = false;

  /** `policy`: the served policy's id (the metrics label and the log line's name). */
  constructor(private readonly policy: string) {}

  /**
   * Counts an out-of-range observation, logs the first of the connection, and returns the
   * answer's `warnings` (undefined when the observation was in range or unchecked).
   */
  check(found: ObservationOutOfRange | null | undefined): string[] | undefined {
    if (!found) return undefined;
    recordObservationOutOfRange(this.policy);
    if (!this.warned) {
      this.warned = true;
      log.warn(outOfRangeLogLine(this.policy, found.report, found.stats, found.stateNames));
    }
    return [outOfRangeAnswerWarning(found.report, found.stateNames)];
  }
}
