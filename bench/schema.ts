/**
 * The JSON that `npm run bench` writes to bench/results/<name>.json (documented in
 * bench/results/README.md), and a validator for it. Every time is in milliseconds, every size in
 * bytes; `null` marks a part that did not run (see `skipped`).
 */
import type { LatencySummary } from './stats.ts';

export const SCHEMA = 'vela-bench/1';

/** Step latency: in-process on the engine vs over the session websocket. */
export interface StepResult {
  preset: string;
  batch: number;
  cameras: number;
  codec: string;
  finetune: 'lora' | 'full';
  inproc: LatencySummary; // forward_backward + optim_step via Engine.call, batch already decoded
  ws: LatencySummary; // the same two ops over the websocket (TS client), awaited one by one
  /** (ws.p50 - inproc.p50) / inproc.p50 */
  overhead: number;
  /**
   * Median over step pairs of (ws_i - inproc_i) / inproc_i, step i of each path run back to back:
   * the drift of a shared machine's load cancels within a pair, so this is the figure the target
   * checks; `overhead` compares two medians taken over the whole run.
   */
  overheadPaired: number;
  /** Mean ms per step with the websocket client one step ahead (pipelined) vs in-process steps. */
  pipelined: { inprocMsPerStep: number; wsMsPerStep: number; overhead: number };
  /** Bytes of one forward_backward request on the wire. */
  requestBytes: number;
  samplesMs: { inproc: number[]; ws: number[] };
  /**
   * The same step through the Python package (bench/python_step.py: `forward_backward(data).result()`
   * then `optim_step(...).result()`, timed inside Python), frames sent as the camera gives them with
   * the package's default codec (RAW); overheadPaired against the in-process step of the same
   * round. Null when no Python with the package is found (pythonSkipped says why). Absent before
   * the row existed.
   */
  python?: { codec: string; summary: LatencySummary; overheadPaired: number; requestBytes: number; samplesMs: number[] } | null;
  pythonSkipped?: string;
}

/** One encode or decode measurement. */
export interface CodecRow {
  kind: 'msgpack' | 'frame' | 'zstd';
  name: string; // e.g. "JPEG 480x640", "zstd+dict observation"
  op: 'encode' | 'decode';
  inputBytes: number;
  outputBytes: number;
  ms: LatencySummary;
  /** inputBytes (encode) or outputBytes (decode) per second, MB/s (1e6 bytes). */
  mbPerS: number;
}

/** Inference over the OpenPI protocol, one client, one request at a time. */
export interface PolicyRow {
  cameras: number;
  codec: 'RAW' | 'JPEG';
  zstd: boolean;
  /** zstd with the observation dictionary (false: plain zstd, when dictionary compression failed; see notes). */
  zstdDict: boolean;
  messageBytes: number;
  latency: LatencySummary; // client send -> answer decoded
  serverInferMs: number; // p50 of the server's policy_timing.infer_ms
  samplesMs: number[];
}

/** A point of the load run's memory trace. */
export interface MemorySample {
  tS: number; // seconds since the load started
  rssBytes: number; // the server process
}

/** N sessions and M policy clients at once for a duration. */
export interface LoadResult {
  sessions: number;
  policyClients: number;
  /** Requests a second per policy client (0: closed loops, each sends again at its answer). */
  policyHz: number;
  durationS: number;
  warmupS: number;
  steps: number; // training steps completed (forward_backward + optim_step)
  stepsPerS: number;
  stepLatency: LatencySummary | null;
  inferences: number;
  inferencesPerS: number;
  inferLatency: LatencySummary | null;
  /** One policy client alone on the same server and checkpoint, before the sessions open (null: no policy clients). */
  idleLatency: LatencySummary | null;
  /** inferLatency.p99 / idleLatency.p99: what the load costs a robot (issue 25: at most 2). */
  p99OverIdle: number | null;
  /** p50 of the answers' policy_timing.infer_ms (the engine calls of their batches), idle and under load. */
  engineInferMs: { idle: number | null; loaded: number | null };
  errors: number;
  errorMessages: string[]; // the first few
  /** Samples at warm-up end and at the end; floors: minimum over the first and last third after warm-up. */
  rss: { afterWarmupBytes: number; endBytes: number; floorStartBytes: number; floorEndBytes: number; maxBytes: number; slopeBytesPerMin: number; trace: MemorySample[] };
  /** Engine tensor counts (engine op `stats`), null when the engine lacks the op. */
  tensors: { before: number | null; afterWarmup: number | null; end: number | null; afterClose: number | null };
}

/** The PyTorch reference (bench/torch_reference.py) and the ratio Vela / PyTorch. */
export interface TorchResult {
  torchVersion: string;
  params: number; // must equal MODEL.md's count
  paramsExpected: number;
  rows: { threads: number; batch: number; stepMs: LatencySummary }[];
  velaStepMs: LatencySummary; // the same step on the engine (full fine-tune, same data layout)
  /** velaStepMs.p50 / the 1-thread torch row's p50 */
  ratio: number;
  /** Vela and PyTorch took turns in blocks of this many steps (every thread count per turn). */
  blockSteps: number;
}

/** LatencySummary plus the 90th percentile (numpy's linear quantile), ms. */
export type InferLatency = LatencySummary & { p90: number };

/** Vela's sampler alone (sampleActions, 10 steps, prefix cached), in the bench process. */
export interface InferSampleRow {
  model: string; // flow05-tiny, flow0-tiny, real pi05 tiny, real pi0 tiny
  backend: string; // the kind: node, node-gpu, wasm, cpu
  /** Graphs allowed (VELA_GRAPHS unset) or turned off (VELA_GRAPHS=0). */
  graphs: boolean;
  /** Graphs allowed and the model family has sampleInputs (else the sampler runs eagerly anyway). */
  graphUsed: boolean;
  batch: number;
  cameras: number;
  ms: InferLatency;
  /** ms.p50 / PyTorch's p50 of the same model, batch 1, one camera; null without PyTorch. */
  torchRatio: number | null;
  /** Largest |Vela - PyTorch| of the actions from the same noise; null without PyTorch. */
  maxAbsDiffTorch: number | null;
  /** Largest |this row - the model's first row| (home backend, graphs), 0 for that row. */
  maxAbsDiffHome: number | null;
  samplesMs: number[];
}

/** PyTorch sampling (bench/torch_reference.py --sample-serve), prefix cached, 10 Euler steps. */
export interface InferTorchRow {
  model: string;
  batch: number;
  cameras: number;
  ms: InferLatency;
  samplesMs: number[];
}

/** The policy server's round trip over the OpenPI protocol (client send -> every answer decoded). */
export interface InferRoundTripRow {
  model: string;
  cameras: number;
  codec: 'RAW' | 'JPEG';
  /** 1: one client; 8: eight clients sending at once (the server batches them). */
  batch: number;
  messageBytes: number; // one client's observation
  ms: InferLatency;
  /** Requests per engine call in the timed rounds (the policy server's GET /stats); null when unknown. */
  serverBatchMean: number | null;
  /** p50 of the server's policy_timing.infer_ms (the largest of a round's answers); null when absent. */
  serverInferMs: number | null;
  /** PyTorch's p50 for the same model, batch and cameras; null without PyTorch. */
  torchP50: number | null;
  /** ms.p50 / torchP50. */
  ratio: number | null;
  samplesMs: number[];
}

/** The `infer` part (bench/infer.ts): what a robot waits for, every row measured in turns. */
export interface InferResult {
  /** The backend line of the bench process (the same choice as the server's). */
  backend: string;
  /** The TF.js backend's name (tensorflow, wasm, cpu), as machine.backend. */
  backendName: string;
  /** TensorFlow's intra-op threads = torch.set_num_threads. */
  threads: number;
  torchVersion: string | null;
  blockCalls: number;
  callsPerRow: number;
  sample: InferSampleRow[];
  torch: InferTorchRow[];
  roundTrip: InferRoundTripRow[];
  notes: string[];
}

export interface TargetCheck {
  name: string;
  value: number;
  limit: number;
  pass: boolean;
}

export interface BenchResult {
  schema: typeof SCHEMA;
  name: string;
  date: string; // ISO 8601
  wallS: number;
  machine: { node: string; platform: string; cpus: number; cpuModel: string; backend: string };
  options: Record<string, unknown>;
  step: StepResult | null;
  codecs: CodecRow[] | null;
  policy: PolicyRow[] | null;
  load: LoadResult | null;
  torch: TorchResult | null;
  /** Absent in results written before the part existed. */
  infer?: InferResult | null;
  /** The RTC replay's summary (bench/rtc.ts: its rows, target checks and timing; the whole in rtc.json). Absent before the part existed. */
  rtc?: Record<string, unknown> | null;
  skipped: Record<string, string>; // part -> reason
  /** Things found while measuring (e.g. a codec that failed and what was used instead). */
  notes: string[];
  targets: TargetCheck[];
}

const SUMMARY_KEYS = ['n', 'mean', 'p50', 'p95', 'p99', 'min', 'max'];

/**
 * Checks a parsed result file against the schema (field presence and types, summaries
 * complete and ordered). Returns the list of problems, empty when the file is valid.
 */
export function validateResult(json: unknown): string[] {
  const errs: string[] = [];
  const obj = (v: unknown): v is Record<string, any> => v !== null && typeof v === 'object' && !Array.isArray(v);
  const num = (v: unknown, at: string) => {
    if (typeof v !== 'number' || !Number.isFinite(v)) errs.push(`${at} is ${JSON.stringify(v)}; expected a finite number`);
  };
  const summary = (v: unknown, at: string) => {
    if (!obj(v)) return void errs.push(`${at} is not a latency summary`);
    for (const k of SUMMARY_KEYS) num(v[k], `${at}.${k}`);
    if (!(v.min <= v.p50 && v.p50 <= v.p95 && v.p95 <= v.p99 && v.p99 <= v.max)) errs.push(`${at}: expected min <= p50 <= p95 <= p99 <= max; got ${v.min}, ${v.p50}, ${v.p95}, ${v.p99}, ${v.max}`);
  };
  if (!obj(json)) return ['the result is not a JSON object'];
  if (json.schema !== SCHEMA) errs.push(`schema is ${JSON.stringify(json.schema)}; expected "${SCHEMA}"`);
  for (const k of ['name', 'date']) if (typeof json[k] !== 'string') errs.push(`${k} is missing`);
  num(json.wallS, 'wallS');
  if (!obj(json.machine)) errs.push('machine is missing');
  if (!obj(json.skipped)) errs.push('skipped is missing');
  if (!Array.isArray(json.notes)) errs.push('notes is missing');
  for (const part of ['step', 'codecs', 'policy', 'load', 'torch']) {
    if (!(part in json)) errs.push(`${part} is missing (null when it did not run)`);
    else if (json[part] === null && !(obj(json.skipped) && typeof json.skipped[part] === 'string')) errs.push(`${part} is null but skipped.${part} gives no reason`);
  }
  if (obj(json.step)) {
    summary(json.step.inproc, 'step.inproc');
    summary(json.step.ws, 'step.ws');
    num(json.step.overhead, 'step.overhead');
    num(json.step.overheadPaired, 'step.overheadPaired');
    num(json.step.pipelined?.overhead, 'step.pipelined.overhead');
    if (obj(json.step.python)) {
      summary(json.step.python.summary, 'step.python.summary');
      num(json.step.python.overheadPaired, 'step.python.overheadPaired');
    }
  }
  if (Array.isArray(json.codecs)) json.codecs.forEach((r: any, i: number) => {
    summary(r?.ms, `codecs[${i}].ms`);
    num(r?.inputBytes, `codecs[${i}].inputBytes`);
    num(r?.outputBytes, `codecs[${i}].outputBytes`);
  });
  if (Array.isArray(json.policy)) json.policy.forEach((r: any, i: number) => summary(r?.latency, `policy[${i}].latency`));
  if (obj(json.load)) {
    for (const k of ['sessions', 'policyClients', 'durationS', 'steps', 'errors']) num(json.load[k], `load.${k}`);
    if (json.load.idleLatency !== null) summary(json.load.idleLatency, 'load.idleLatency');
    if (json.load.p99OverIdle !== null) num(json.load.p99OverIdle, 'load.p99OverIdle');
    if (!obj(json.load.engineInferMs)) errs.push('load.engineInferMs is missing');
    if (!obj(json.load.rss)) errs.push('load.rss is missing');
    if (!obj(json.load.tensors)) errs.push('load.tensors is missing');
  }
  if (obj(json.torch)) {
    num(json.torch.ratio, 'torch.ratio');
    if (json.torch.params !== json.torch.paramsExpected) errs.push(`torch.params is ${json.torch.params}; MODEL.md says ${json.torch.paramsExpected}`);
  }
  if ('rtc' in json && json.rtc === null && !(obj(json.skipped) && typeof json.skipped.rtc === 'string')) errs.push('rtc is null but skipped.rtc gives no reason');
  if ('infer' in json && json.infer === null && !(obj(json.skipped) && typeof json.skipped.infer === 'string')) errs.push('infer is null but skipped.infer gives no reason');
  if (obj(json.infer)) {
    for (const k of ['sample', 'torch', 'roundTrip'] as const) {
      if (!Array.isArray(json.infer[k])) errs.push(`infer.${k} is missing`);
      else json.infer[k].forEach((r: any, i: number) => {
        summary(r?.ms, `infer.${k}[${i}].ms`);
        num(r?.ms?.p90, `infer.${k}[${i}].ms.p90`);
      });
    }
  }
  if (!Array.isArray(json.targets)) errs.push('targets is missing');
  else json.targets.forEach((t: any, i: number) => {
    if (typeof t?.name !== 'string' || typeof t?.pass !== 'boolean') errs.push(`targets[${i}] needs name and pass`);
  });
  return errs;
}
