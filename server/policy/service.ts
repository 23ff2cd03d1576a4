/**
 * One served policy: its checkpoint loaded in an engine, its meta, its batcher. The websocket
 * layer (socket.ts) calls `infer` per observation; everything that is work happens in the
 * engine's worker, so the event loop only decodes, batches and encodes.
 */
import { performance } from 'node:perf_hooks';
import { ndarray, type NDArray } from '../../protocol/ndarray.ts';
import { dictionaryId, initZstd, loadObservationDictionary } from '../../protocol/zstd.ts';
import { batchBuffers, makeBatch, type ModelBatch } from '../../kernels/batch.ts';
import type { EngineLike } from '../engine/host.ts';
import { log } from '../log.ts';
import { Batcher, type BatchStats } from './batcher.ts';
import { policyMeta, type PolicyMeta } from './meta.ts';
import { DEFAULT_POLICY_LIMITS, parseObservation, toDatum, toRobotActions, type PolicyLimits } from './observation.ts';

export interface PolicyServerOptions {
  engine: EngineLike;
  /** The checkpoint folder (PROTOCOL.md section 4), loaded by the engine's `load_policy`. */
  checkpointDir: string;
  /** The engine session that holds this policy's weights. */
  policyId: string;
  /** `--seed`: reproducible per-connection seed streams (seeds.ts); absent = random seeds. */
  seed?: number | null;
  /** `--debug`: error frames carry the stack trace. */
  debug?: boolean;
  /** How long the first request of a batch waits for others, ms (default 5). */
  batchWindowMs?: number;
  /** Requests per engine call at most (default 16). */
  maxBatch?: number;
  /** When set, clients must send `Authorization: Api-Key <k>` or `Bearer <k>` (standalone server). */
  apiKey?: string | null;
  limits?: Partial<PolicyLimits>;
}

/** A served request's answer, before encoding. */
export interface PolicyAnswer {
  actions: NDArray; // float32 [action_horizon, action_dim], robot units
  policyInferMs: number; // the engine call of its batch
  batchSize: number;
}

export interface PolicyStats extends BatchStats {
  connections: number;
  errors: number;
}

export interface PolicyServer {
  readonly meta: PolicyMeta;
  readonly limits: PolicyLimits;
  readonly seed: number | null;
  readonly debug: boolean;
  readonly apiKey: string | null;
  /** The zstd dictionary served at GET /v1/observation.zdict. */
  readonly dictionary: Uint8Array;
  /** The handshake map sent first on every connection. */
  metadata(): Record<string, unknown>;
  /** Runs one decoded observation. @throws ProtocolError and the like for bad input (see socket.ts). */
  infer(obs: Record<string, unknown>, seed: number): Promise<PolicyAnswer>;
  stats(): PolicyStats;
  /** Counters kept by the websocket layer. */
  readonly counters: { connections: number; errors: number };
  /** Refuse new work; queued requests fail. The engine is the caller's to close. */
  close(): void;
}


/**
 * Loads a checkpoint into the engine (`load_policy`) and returns the policy ready to serve.
 * @throws PolicyConfigError / NormError for a checkpoint that cannot be served; the engine's
 *   error when it cannot load the weights.
 */
export async function createPolicyServer(opts: PolicyServerOptions): Promise<PolicyServer> {
  await initZstd();
  const { engine, policyId } = opts;
  const limits: PolicyLimits = { ...DEFAULT_POLICY_LIMITS, ...opts.limits };
  const loaded = await engine.call<{ result: { config: unknown; normStats: unknown } }>(policyId, 'load_policy', { dir: opts.checkpointDir });
  const meta = policyMeta(engine.info, loaded.result.config, loaded.result.normStats);
  if (!meta.norm) log.warn(`policy ${policyId}: the checkpoint has no norm_stats.json; states and actions pass unnormalised`);
  const { horizon: H, actionDim: A } = meta.model;
  const counters = { connections: 0, errors: 0 };
  const batcher = new Batcher(
    async (datums, seeds) => {
      const batch = makeBatch(meta.model, datums, { maxPromptBytes: limits.maxPromptBytes });
      const t0 = performance.now();
      const ans = await engine.call<{ result: { actions: Float32Array } }>(policyId, 'infer', { batch, seeds, numSteps: meta.numSteps }, batchBuffers(batch));
      const inferMs = performance.now() - t0;
      const actions = ans?.result?.actions;
      if (!(actions instanceof Float32Array) || actions.length !== datums.length * H * A) {
        throw new Error(`engine infer answered ${actions instanceof Float32Array ? `${actions.length} floats` : typeof actions}; expected ${datums.length} x ${H} x ${A}`);
      }
      return { rows: datums.map((_, i) => actions.subarray(i * H * A, (i + 1) * H * A)), inferMs };
    },
    opts.batchWindowMs ?? 5,
    opts.maxBatch ?? 16,
    () => counters.connections,
  );
  const dictionary = loadObservationDictionary();
  const metadata = {
    server: 'vela',
    model: meta.preset,
    action_horizon: meta.actionHorizon,
    action_dim: meta.actionDim,
    action_space: meta.actionSpace,
    cameras: meta.cameras,
    state_dim: meta.stateDim ?? meta.model.stateDim,
    image_size: meta.model.imageSize,
    image_codecs: ['RAW', 'LOSSLESS', 'PNG', 'JPEG', 'CODEC_JPEG_Q<N>'],
    zstd_dictionary_id: dictionaryId(dictionary),
    zstd_dictionary_path: '/v1/observation.zdict',
    max_message_bytes: limits.maxMessageBytes,
    max_batch: batcher.maxBatch,
    seeded: opts.seed !== undefined && opts.seed !== null,
  };
  return {
    meta,
    limits,
    seed: opts.seed ?? null,
    debug: opts.debug ?? false,
    apiKey: opts.apiKey ?? null,
    dictionary,
    counters,
    metadata: () => metadata,
    async infer(obs, seed) {
      const parsed = parseObservation(obs, meta, limits);
      const datum = await toDatum(parsed, meta, limits);
      const r = await batcher.submit(datum, seed);
      const actions = toRobotActions(r.row, meta, parsed.state);
      return { actions: ndarray(actions, [meta.actionHorizon, meta.actionDim]), policyInferMs: r.inferMs, batchSize: r.batchSize };
    },
    stats: () => ({ ...batcher.stats(), ...counters }),
    close: () => batcher.close(new Error('the policy server is shutting down')),
  };
}
