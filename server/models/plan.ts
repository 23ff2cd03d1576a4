/**
 * Memory planning of the real pi0 / pi0.5 on this server (issue 24): before a base is loaded, a
 * session opened, a job started or a step run, the estimate (kernels/pi/memory.ts, calibrated on
 * measured peaks) is set against what this process may still use (server/models/memory.ts: the
 * cgroup limit or the machine's memory, capped by --max-memory, less the current RSS), and what
 * would not fit is refused with one line naming the estimate, what is available and the fix,
 * instead of being discovered by the kernel's OOM killer halfway through a load.
 *
 * What is counted where: the base's weights once per engine (they are in the RSS once loaded); a
 * tenant's adapters, moments (and a full fine-tune's trainable copy and gradients) when it is
 * created; the activations of a pass when the pass's batch is known (each op).
 *
 * The RSS grows only once an engine worker has allocated a load, awaits after its check: what a
 * session's plan admits is reserved (memory.ts memoryLedger) until then, so requests at once
 * are planned as if one after another (issue 32 item 9). Fine-tune submissions and passes count
 * the reservations but take none: a queued job holds nothing until it runs, and a pass's
 * activations are gone when it returns.
 */
import { realPiConfigFromHub, type RealPiConfig } from '../../kernels/pi/config.ts';
import { estimateMemory, type MemoryEstimate, type MemoryPlan } from '../../kernels/pi/memory.ts';
import { HttpError } from '../http/http.ts';
import { readHubConfig } from './hub-checkpoint.ts';
import { availableMemory, checkFits, memoryLedger, type AvailableMemory } from './memory.ts';

/** HTTP status of a refusal for memory: the request is valid, this server cannot hold it. */
export const INSUFFICIENT_MEMORY = 507;

const configs = new Map<string, Promise<RealPiConfig>>();

/**
 * The RealPiConfig of checkpoint folder `dir` (its config.json), read once per folder.
 * @throws CheckpointError / ConfigError naming the file.
 */
export function realConfigOf(dir: string): Promise<RealPiConfig> {
  let c = configs.get(dir);
  if (!c) {
    c = readHubConfig(dir).then(realPiConfigFromHub);
    configs.set(dir, c);
    c.catch(() => configs.delete(dir));
  }
  return c;
}

/** Which parts of an estimate a check counts (the rest is already resident or not yet needed). */
export interface PlanParts {
  /**
   * The base's weights (false once its engine has loaded them). A function is asked at the
   * check itself, after the awaits before it (an engine may have started meanwhile).
   */
  weights: boolean | (() => boolean);
  /** The tenant's own state: adapters or trainable copy, moments, gradients. */
  tenant: boolean;
  /** One pass's activations and the runtime's workspace. */
  pass: boolean;
}

/** The part of `est` that `parts` selects, as an estimate of its own. */
export function selectParts(est: MemoryEstimate, parts: PlanParts): MemoryEstimate {
  const p = est.parts;
  const weights = typeof parts.weights === 'function' ? parts.weights() : parts.weights;
  const sel = {
    weights: weights ? p.weights : 0,
    trainable: parts.tenant ? p.trainable : 0,
    optimizer: parts.tenant ? p.optimizer : 0,
    gradients: parts.tenant ? p.gradients : 0,
    activations: parts.pass ? p.activations : 0,
    workspace: parts.pass ? p.workspace : 0,
  };
  const total = Object.values(sel).reduce((a, b) => a + b, 0);
  return { totalBytes: total, tensorBytes: total - sel.workspace, parts: sel };
}

/** The outcome of a check that passed: the estimate counted and what was available. */
export interface PlanResult {
  estimate: MemoryEstimate;
  counted: MemoryEstimate;
  /** What was available, net of what other admitted loads had reserved. */
  available: AvailableMemory;
  /** The ledger owners this plan reserved (memoryLedger.release each once its bytes are held, or the load failed). */
  reserved: string[];
}

/**
 * Who holds a plan's bytes until they are held (server/models/memory.ts MemoryLedger).
 * `owner` takes the tenant's and the pass's bytes; `base` (`base:<engine key>`) the weights, once
 * per base: a plan whose base is reserved already does not count the weights again.
 */
export interface PlanReservation {
  owner: string;
  base?: string;
  /** The engine key of the load (its engine is not closed as idle while the reservation lasts). */
  engine?: string;
}

/**
 * Estimates `plan` on `config`, counts `parts` of it against this process's available memory
 * less what admitted loads reserve and do not hold yet (memoryLedger), and with `reserve`
 * reserves the counted bytes in the same synchronous step as the check: requests planned at
 * once get the answers they would get one after another.
 * @param what names the load in the refusal ("a LoRA session of pi05 (lerobot/pi05_base)").
 * @param capName how the operator sets maxMemory, for the message (`--max-memory`, or `VELA_MAX_MEMORY` where no flag exists).
 * @throws HttpError 507 with checkFits's one line when it would not fit (nothing reserved);
 *   RangeError for a --max-memory that does not parse.
 */
export async function planOrRefuse(config: RealPiConfig, plan: MemoryPlan, parts: PlanParts, what: string, maxMemory?: string, capName = '--max-memory', reserve?: PlanReservation): Promise<PlanResult> {
  const estimate = estimateMemory(config, plan);
  const measured = await availableMemory({ maxMemory, capName });
  // No await from here to the reservation: no other plan is checked in between.
  const basePending = reserve?.base !== undefined && memoryLedger.has(reserve.base);
  const weights = !basePending && (typeof parts.weights === 'function' ? parts.weights() : parts.weights);
  const counted = selectParts(estimate, { ...parts, weights });
  const available = memoryLedger.less(measured);
  const opts = { batch: parts.pass ? plan.batch : undefined, use: plan.use };
  let why: string | null;
  let take: Record<string, number> = {};
  if (reserve) {
    take = reserve.base !== undefined ? { [reserve.base]: counted.parts.weights, [reserve.owner]: counted.totalBytes - counted.parts.weights } : { [reserve.owner]: counted.totalBytes };
    why = memoryLedger.admit(counted, measured, what, take, { ...opts, engine: reserve.engine });
  } else why = checkFits(counted, available, what, opts);
  if (why) throw new HttpError(INSUFFICIENT_MEMORY, why);
  return { estimate, counted, available, reserved: Object.keys(take).filter((o) => take[o]! > 0) };
}
