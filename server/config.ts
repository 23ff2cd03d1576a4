/**
 * Operator settings (PROTOCOL.md sections 8 and 9): every setting is a flag and an environment
 * variable. Flags win over the environment, the environment over the defaults.
 */
import os from 'node:os';
import path from 'node:path';
import type { BackendChoice } from '../kernels/backend/backend.ts';
import { shown, UsageError } from './cli/args.ts';
import { defaultThreads } from '../kernels/backend/native.ts';
import { parseAllowlist } from './inference/addresses.ts';
import { parseBytes } from './models/memory.ts';
import { DEFAULT_WS_CAPS } from './http/ws-admission.ts';

/** A setting with a bad value, or an unknown one: `vela` prints it as one line and exits 2. */
export class ConfigError extends UsageError {
  constructor(message: string) {
    super(message);
    this.name = 'ConfigError';
  }
}

const MiB = 1024 * 1024;

/** Every TF.js backend name `--backend` takes (checked against kernels/backend/backend.ts's type). */
const BACKEND_NAMES = { auto: 1, 'node-gpu': 1, node: 1, wasm: 1, cpu: 1 } satisfies Record<BackendChoice, 1>;
export const BACKEND_CHOICES = Object.keys(BACKEND_NAMES) as BackendChoice[];
export const LOG_LEVELS = ['error', 'warn', 'info', 'debug'] as const;

/** One setting: its flag, its environment variable, its default and how to parse it. */
interface Setting {
  key: keyof ServerConfig;
  flag: string;
  env: string;
  help: string;
  /** `list`: comma-separated, and the flag may be repeated (its values add up; flags replace the variable's). */
  kind: 'string' | 'int' | 'number' | 'bool' | 'choice' | 'list';
  choices?: readonly string[];
  /** Largest value of an int setting. */
  max?: number;
  def: (env: NodeJS.ProcessEnv) => string | number | boolean | string[] | undefined;
  /** The default as `--help` shows it, where the value alone would not say it (derived, or none). */
  defaultText?: string;
}

export interface ServerConfig {
  host: string;
  port: number;
  dataDir: string;
  datasetsDir: string;
  apiKey: string | undefined;
  backend: string;
  policyBackend: string;
  trainingYieldMs: number;
  tfIntraOpThreads: number;
  tfInterOpThreads: number;
  publicUrl: string | undefined;
  allowAbsoluteDatasets: boolean;
  /** Folder under which any key may name a base checkpoint folder; undefined: `<data dir>/models`. */
  modelsDir: string | undefined;
  /** Let `base` be any folder of the server's disk (a one-user server). */
  allowAbsoluteBases: boolean;
  /** Fine-tunes may download a Hub dataset (and base checkpoint) that is not on disk. */
  allowDownloads: boolean;
  maxSessionMessageBytes: number;
  maxPolicyMessageBytes: number;
  /** Websocket caps (ws-admission.ts): connections and reserved bytes per API key and in total. */
  maxWsConnectionsPerKey: number;
  maxWsConnections: number;
  maxWsBufferedBytesPerKey: number;
  maxWsBufferedBytes: number;
  maxObservationBytes: number;
  maxImagePixels: number;
  maxBatch: number;
  maxPromptBytes: number;
  sessionsPerKey: number;
  sessionIdleTimeoutS: number;
  /** Seconds a real base's engine may hold nothing before it is closed (0: kept until memory is needed). */
  baseIdleS: number;
  futureTtlS: number;
  futureWaitS: number;
  futureSeqGapS: number;
  readAhead: number;
  maxResidentSessions: number;
  /** Cap on this process's memory for planning real-model loads and ops (bytes text, e.g. 20GiB); undefined: the cgroup's or machine's. */
  maxMemory: string | undefined;
  storagePerKeyBytes: number;
  inferIdleS: number;
  allowEndpoint: string | undefined;
  maxEvalBytesPerKey: number;
  endpointsPerKey: number;
  maxDatasetBytes: number;
  datasetsPerKeyBytes: number;
  logLevel: string;
  databaseUrl: string | undefined;
  dbBufferRecords: number;
  storageDir: string | undefined;
  nodeId: string | undefined;
  nodeCapacity: number;
  nodeHeartbeatS: number;
  nodeLostS: number;
  metricsPublic: boolean;
  metricsKey: string | undefined;
  /** The operator's zstd dictionary files for policy observations (beside Vela's own), e.g. Relay's observation.zdict. */
  zstdDicts: string[];
}

/** LeRobot's dataset cache: $HF_LEROBOT_HOME, else $HF_HOME/lerobot, else ~/.cache/huggingface/lerobot. */
export function defaultDatasetsDir(env: NodeJS.ProcessEnv = process.env): string {
  if (env.HF_LEROBOT_HOME) return env.HF_LEROBOT_HOME;
  return path.join(env.HF_HOME || path.join(os.homedir(), '.cache', 'huggingface'), 'lerobot');
}

export const SETTINGS: Setting[] = [
  { key: 'host', flag: '--host', env: 'VELA_HOST', kind: 'string', def: () => '127.0.0.1', help: 'address to bind' },
  { key: 'port', flag: '--port', env: 'VELA_PORT', kind: 'int', max: 65535, def: () => 8080, help: 'port to listen on (0 picks a free one)' },
  { key: 'dataDir', flag: '--data-dir', env: 'VELA_DATA_DIR', kind: 'string', def: () => './vela-data', help: 'the SQLite file, checkpoints and job outputs' },
  { key: 'datasetsDir', flag: '--datasets-dir', env: 'VELA_DATASETS_DIR', kind: 'string', def: defaultDatasetsDir, help: 'root that dataset_name resolves under (LeRobot\'s cache; `vela datasets download` writes there)', defaultText: '$HF_LEROBOT_HOME, else $HF_HOME/lerobot, else ~/.cache/huggingface/lerobot' },
  { key: 'apiKey', flag: '--api-key', env: 'VELA_API_KEY', kind: 'string', def: () => undefined, help: 'an API key to accept (one is created and printed when the store has none)', defaultText: 'none' },
  { key: 'backend', flag: '--backend', env: 'VELA_BACKEND', kind: 'choice', choices: BACKEND_CHOICES, def: () => 'auto', help: `TF.js backend of the engines: ${BACKEND_CHOICES.join(' | ')} (native TensorFlow runs the small models' sampler and training step as graphs; VELA_GRAPHS=0 turns that off)` },
  { key: 'policyBackend', flag: '--policy-backend', env: 'VELA_POLICY_BACKEND', kind: 'choice', choices: ['same', ...BACKEND_CHOICES], def: () => 'same', help: 'backend of the engines that serve policies: same (as --backend) | ' + BACKEND_CHOICES.join(' | ') },
  { key: 'trainingYieldMs', flag: '--training-yield-ms', env: 'VELA_TRAINING_YIELD_MS', kind: 'int', max: 60000, def: () => 250, help: 'while policy requests wait, a training op waits up to this long before it runs (0: no yielding)' },
  { key: 'tfIntraOpThreads', flag: '--tf-intra-op-threads', env: 'VELA_TF_INTRA_OP_THREADS', kind: 'int', max: 1024, def: (env) => Number(env.TF_NUM_INTRAOP_THREADS) || defaultThreads().intraOp, help: 'native TensorFlow: threads one op may use, shared by all engines', defaultText: 'half the cores, at least 1' },
  { key: 'tfInterOpThreads', flag: '--tf-inter-op-threads', env: 'VELA_TF_INTER_OP_THREADS', kind: 'int', max: 1024, def: (env) => Number(env.TF_NUM_INTEROP_THREADS) || defaultThreads().interOp, help: 'native TensorFlow: threads running independent ops at once' },
  { key: 'publicUrl', flag: '--public-url', env: 'VELA_PUBLIC_URL', kind: 'string', def: () => undefined, help: 'base of session and policy URLs behind a proxy', defaultText: 'none (the address it listens on)' },
  { key: 'allowAbsoluteDatasets', flag: '--allow-absolute-datasets', env: 'VELA_ALLOW_ABSOLUTE_DATASETS', kind: 'bool', def: () => false, help: 'let dataset_name be an absolute path' },
  { key: 'modelsDir', flag: '--models-dir', env: 'VELA_MODELS_DIR', kind: 'string', def: () => undefined, help: 'folder whose checkpoint folders any key may name as `base`, relative to it as dataset_name is to the datasets folder (`tiny_pi05_base`; besides Hub ids in the Hugging Face cache and its own fine-tunes\' model_dir)', defaultText: '<data dir>/models' },
  { key: 'allowAbsoluteBases', flag: '--allow-absolute-bases', env: 'VELA_ALLOW_ABSOLUTE_BASES', kind: 'bool', def: () => false, help: 'let `base` be any folder of this machine (a server with one user)' },
  { key: 'allowDownloads', flag: '--allow-downloads', env: 'VELA_ALLOW_DOWNLOADS', kind: 'bool', def: () => false, help: 'let a fine-tune download a Hub dataset (into the datasets root) or base checkpoint (into the HF cache) that is not here yet ($HF_ENDPOINT, $HF_TOKEN)' },
  { key: 'maxSessionMessageBytes', flag: '--max-session-message-bytes', env: 'VELA_MAX_SESSION_MESSAGE_BYTES', kind: 'int', def: () => 64 * MiB, help: 'session websocket message limit' },
  { key: 'maxPolicyMessageBytes', flag: '--max-policy-message-bytes', env: 'VELA_MAX_POLICY_MESSAGE_BYTES', kind: 'int', def: () => 16 * MiB, help: 'policy websocket message limit' },
  { key: 'maxWsConnectionsPerKey', flag: '--max-ws-connections-per-key', env: 'VELA_MAX_WS_CONNECTIONS_PER_KEY', kind: 'int', def: () => DEFAULT_WS_CAPS.connectionsPerKey, help: 'open websocket connections (policy and session) per API key; past it an upgrade gets 429' },
  { key: 'maxWsConnections', flag: '--max-ws-connections', env: 'VELA_MAX_WS_CONNECTIONS', kind: 'int', def: () => DEFAULT_WS_CAPS.connections, help: 'open websocket connections in all; past it an upgrade gets 429' },
  { key: 'maxWsBufferedBytesPerKey', flag: '--max-ws-buffered-bytes-per-key', env: 'VELA_MAX_WS_BUFFERED_BYTES_PER_KEY', kind: 'int', def: () => DEFAULT_WS_CAPS.bufferedBytesPerKey, help: 'bytes one API key\'s websockets may make the server hold (each connection reserves its message limit plus its backpressure limit: 80 MiB policy, 576 MiB session); past it an upgrade gets 429', defaultText: '4294967296 (4 GiB)' },
  { key: 'maxWsBufferedBytes', flag: '--max-ws-buffered-bytes', env: 'VELA_MAX_WS_BUFFERED_BYTES', kind: 'int', def: () => DEFAULT_WS_CAPS.bufferedBytes, help: 'bytes all websockets may make the server hold; past it an upgrade gets 429', defaultText: '17179869184 (16 GiB)' },
  { key: 'maxObservationBytes', flag: '--max-observation-bytes', env: 'VELA_MAX_OBSERVATION_BYTES', kind: 'int', def: () => 64 * MiB, help: 'decompressed observation limit' },
  { key: 'maxImagePixels', flag: '--max-image-pixels', env: 'VELA_MAX_IMAGE_PIXELS', kind: 'int', def: () => 4096 * 4096, help: 'largest frame, in pixels', defaultText: '16777216 (4096 x 4096)' },
  { key: 'maxBatch', flag: '--max-batch', env: 'VELA_MAX_BATCH', kind: 'int', def: () => 256, help: 'datums per request' },
  { key: 'maxPromptBytes', flag: '--max-prompt-bytes', env: 'VELA_MAX_PROMPT_BYTES', kind: 'int', def: () => 1024, help: 'prompt length in UTF-8 bytes' },
  { key: 'sessionsPerKey', flag: '--sessions-per-key', env: 'VELA_SESSIONS_PER_KEY', kind: 'int', def: () => 4, help: 'open training sessions per API key' },
  { key: 'sessionIdleTimeoutS', flag: '--session-idle-timeout-s', env: 'VELA_SESSION_IDLE_TIMEOUT_S', kind: 'number', def: () => 1800, help: 'close a session after this long without a message' },
  { key: 'baseIdleS', flag: '--base-idle-timeout-s', env: 'VELA_BASE_IDLE_TIMEOUT_S', kind: 'number', def: () => 300, help: 'close a real pi0 / pi0.5 base\'s engine (its weights: 13.4 GB at full size) after it held no session, job or policy this long; 0 keeps it until a memory plan needs the memory' },
  { key: 'futureTtlS', flag: '--future-ttl-s', env: 'VELA_FUTURE_TTL_S', kind: 'number', def: () => 3600, help: 'how long futures results are kept' },
  { key: 'futureWaitS', flag: '--future-wait-s', env: 'VELA_FUTURE_WAIT_S', kind: 'number', def: () => 45, help: 'how long retrieve_future waits before answering try_again' },
  { key: 'futureSeqGapS', flag: '--future-seq-gap-s', env: 'VELA_FUTURE_SEQ_GAP_S', kind: 'number', def: () => 30, help: 'how long a futures request waits for a missing smaller seq_id' },
  { key: 'readAhead', flag: '--read-ahead', env: 'VELA_READ_AHEAD', kind: 'int', def: () => 32, help: 'queued requests per session connection before new ones are refused as busy' },
  { key: 'maxResidentSessions', flag: '--max-resident-sessions', env: 'VELA_MAX_RESIDENT_SESSIONS', kind: 'int', def: () => 64, help: 'sessions whose tensors stay in an engine at once; the least recently used others wait on disk' },
  { key: 'maxMemory', flag: '--max-memory', env: 'VELA_MAX_MEMORY', kind: 'string', def: () => undefined, help: 'memory the server plans loads, steps and samples against (e.g. 20GiB): real pi0 / pi0.5 bases, sessions and jobs, and the presets\' passes and jobs; one that would not fit is refused with the estimate', defaultText: 'the cgroup limit, else the machine\'s memory' },
  { key: 'storagePerKeyBytes', flag: '--storage-per-key-bytes', env: 'VELA_STORAGE_PER_KEY_BYTES', kind: 'int', def: () => 20 * 1024 * 1024 * 1024, help: 'saved states and weights per API key; a save past it is refused (507)' },
  { key: 'inferIdleS', flag: '--infer-idle-s', env: 'VELA_INFER_IDLE_S', kind: 'number', def: () => 60, help: 'seconds a served policy stays loaded after its last request or connection' },
  { key: 'allowEndpoint', flag: '--allow-endpoint', env: 'VELA_ALLOW_ENDPOINT', kind: 'string', def: () => undefined, help: 'inference endpoints the server may contact although they are loopback, private, link-local or its own: comma-separated CIDRs, addresses or host names (e.g. 127.0.0.0/8,10.1.2.0/24,robot-1.lan)', defaultText: 'none (only public addresses)' },
  { key: 'endpointsPerKey', flag: '--endpoints-per-key', env: 'VELA_ENDPOINTS_PER_KEY', kind: 'int', def: () => 16, help: 'inference endpoints (add_inference_endpoint) per API key' },
  { key: 'maxEvalBytesPerKey', flag: '--max-eval-bytes-per-key', env: 'VELA_MAX_EVAL_BYTES_PER_KEY', kind: 'int', def: () => 64 * MiB, help: 'largest eval dataset of one API key (POST /evals/add_to_dataset); an add past it is refused (413)' },
  { key: 'maxDatasetBytes', flag: '--max-dataset-bytes', env: 'VELA_MAX_DATASET_BYTES', kind: 'int', def: () => 8 * 1024 * 1024 * 1024, help: 'largest uploaded dataset (PUT /v1/datasets/{name}, job_start dataset_content), archive and extracted' },
  { key: 'datasetsPerKeyBytes', flag: '--datasets-per-key-bytes', env: 'VELA_DATASETS_PER_KEY_BYTES', kind: 'int', def: () => 20 * 1024 * 1024 * 1024, help: 'uploaded datasets per API key, extracted bytes; an upload past it is refused (413)' },
  { key: 'logLevel', flag: '--log-level', env: 'VELA_LOG_LEVEL', kind: 'choice', choices: LOG_LEVELS, def: () => 'info', help: `least severe log lines shown: ${LOG_LEVELS.join(' | ')}` },
  { key: 'zstdDicts', flag: '--zstd-dict', env: 'VELA_ZSTD_DICT', kind: 'list', def: () => [], help: `more zstd dictionaries for policy observations, beside Vela's own (still the one served at GET /v1/observation.zdict): trained dictionary files, e.g. Relay's observation.zdict; a frame is decoded with the one whose id its header names. Comma-separated or repeated, at most 16 files of at most 1 MiB`, defaultText: "none (Vela's own only)" },
  { key: 'metricsPublic', flag: '--metrics-public', env: 'VELA_METRICS_PUBLIC', kind: 'bool', def: () => false, help: 'answer GET /metrics without an API key, with every series (for a Prometheus on a trusted network); by default it needs a key, and an API key\'s scrape leaves out the series naming other keys\' jobs, policies and sessions' },
  { key: 'metricsKey', flag: '--metrics-key', env: 'VELA_METRICS_KEY', kind: 'string', def: () => undefined, help: 'the operator\'s GET /metrics key (not an API key: it opens no other route): its scrape has every series, those naming any key\'s objects included', defaultText: 'none' },
  // A cluster (README "Several nodes"): nodes that share one PostgreSQL and one storage folder.
  { key: 'databaseUrl', flag: '--database-url', env: 'VELA_DATABASE_URL', kind: 'string', def: () => undefined, help: 'postgres://... : the store every node of a cluster shares', defaultText: 'none (SQLite in --data-dir, one node)' },
  { key: 'dbBufferRecords', flag: '--db-buffer-records', env: 'VELA_DB_BUFFER_RECORDS', kind: 'int', def: () => 10_000, help: 'job records (events) held in memory while PostgreSQL is unreachable, stored when it returns; at this many a job pauses at its next step until the database takes them (none is dropped)' },
  { key: 'storageDir', flag: '--storage-dir', env: 'VELA_STORAGE_DIR', kind: 'string', def: () => undefined, help: 'checkpoints and job outputs; a folder every node mounts at the same path', defaultText: '--data-dir' },
  { key: 'nodeId', flag: '--node-id', env: 'VELA_NODE_ID', kind: 'string', def: () => undefined, help: 'this node\'s id in a cluster', defaultText: 'a new random one each start' },
  { key: 'nodeCapacity', flag: '--node-sessions', env: 'VELA_NODE_SESSIONS', kind: 'int', def: () => 16, help: 'open training sessions this node takes before placement sends new ones elsewhere' },
  { key: 'nodeHeartbeatS', flag: '--node-heartbeat-s', env: 'VELA_NODE_HEARTBEAT_S', kind: 'number', def: () => 2, help: 'seconds between a node\'s heartbeats (and its checks for lost nodes)' },
  { key: 'nodeLostS', flag: '--node-lost-s', env: 'VELA_NODE_LOST_S', kind: 'number', def: () => 15, help: 'a node without a heartbeat for this long is lost: its jobs resume elsewhere, its sessions become lost' },
];

/** `typed` is how the value was given: `--port abc`, `--port=abc` or `VELA_PORT=abc`. */
function parseValue(s: Setting, raw: string, typed: string): string | number | boolean | string[] {
  switch (s.kind) {
    case 'string':
      return raw;
    case 'list':
      return raw.split(',').map((v) => v.trim()).filter((v) => v !== '');
    case 'choice':
      if (!s.choices!.includes(raw)) throw new ConfigError(`${typed}: must be one of ${s.choices!.join(', ')}`);
      return raw;
    case 'bool':
      if (/^(1|true|yes|on)$/i.test(raw)) return true;
      if (/^(0|false|no|off)$/i.test(raw)) return false;
      throw new ConfigError(`${typed}: must be true or false`);
    case 'int':
    case 'number': {
      const n = Number(raw);
      if (raw.trim() === '' || !Number.isFinite(n) || n < 0 || (s.kind === 'int' && !Number.isInteger(n)) || (s.max !== undefined && n > s.max)) {
        throw new ConfigError(`${typed}: must be ${s.max !== undefined ? `an integer in 0..${s.max}` : `a non-negative ${s.kind === 'int' ? 'integer' : 'number'}`}`);
      }
      return n;
    }
  }
}

/**
 * Resolve the configuration from flags (`--port 9000` or `--port=9000`), the environment and
 * the defaults. Returns the config and the arguments that were not settings.
 * @throws ConfigError (one line naming the flag or variable and the value as given) for a value
 *   that does not parse or is out of range. Unknown flags are returned in `rest`.
 */
export function loadConfig(argv: string[], env: NodeJS.ProcessEnv = process.env): { config: ServerConfig; rest: string[] } {
  const out: Record<string, unknown> = {};
  for (const s of SETTINGS) {
    const fromEnv = env[s.env];
    out[s.key] = fromEnv !== undefined && fromEnv !== '' ? parseValue(s, fromEnv, `${s.env}=${shown(fromEnv)}`) : s.def(env);
  }
  const rest: string[] = [];
  const listed = new Set<string>(); // list settings given by flag so far: later flags add to them
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (!arg.startsWith('--')) {
      rest.push(arg);
      continue;
    }
    const eq = arg.indexOf('=');
    const flag = eq >= 0 ? arg.slice(0, eq) : arg;
    const s = SETTINGS.find((x) => x.flag === flag);
    if (!s) {
      rest.push(arg);
      continue;
    }
    let raw: string | undefined;
    if (eq >= 0) raw = arg.slice(eq + 1);
    else if (s.kind === 'bool' && (argv[i + 1] === undefined || argv[i + 1]!.startsWith('--'))) raw = 'true';
    else raw = argv[++i];
    if (raw === undefined) throw new ConfigError(`${flag} needs a value (see vela serve --help)`);
    const value = parseValue(s, raw, eq >= 0 ? `${flag}=${shown(raw)}` : `${flag} ${shown(raw)}`);
    if (s.kind === 'list') {
      out[s.key] = listed.has(s.key) ? [...(out[s.key] as string[]), ...(value as string[])] : value;
      listed.add(s.key);
    } else out[s.key] = value;
  }
  const config = out as unknown as ServerConfig;
  for (const [flag, n] of [['--tf-intra-op-threads', config.tfIntraOpThreads], ['--tf-inter-op-threads', config.tfInterOpThreads]] as const) {
    if (n < 1) throw new ConfigError(`${flag} must be at least 1, got ${n}`);
  }
  if (config.databaseUrl !== undefined && !/^postgres(ql)?:\/\//.test(config.databaseUrl)) {
    throw new ConfigError(`--database-url must be a postgres:// or postgresql:// URL, got "${config.databaseUrl.replace(/:[^:@/]*@/, ':***@')}"`);
  }
  if (config.dbBufferRecords < 1) throw new ConfigError(`--db-buffer-records must be at least 1, got ${config.dbBufferRecords}`);
  if (config.maxMemory !== undefined) {
    // Checked here, not at the first real-model request: a cap that does not parse would fail every plan (and /health).
    let bytes: number;
    try {
      bytes = parseBytes(config.maxMemory, '--max-memory');
    } catch (e) {
      throw new ConfigError((e as Error).message);
    }
    if (!(bytes > 0) || !Number.isFinite(bytes)) throw new ConfigError(`--max-memory is ${shown(config.maxMemory)}; it must be a size above 0, e.g. 20GiB`);
  }
  if (config.nodeId !== undefined && !/^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/.test(config.nodeId)) {
    throw new ConfigError(`--node-id must be letters, digits, '.', '_' or '-' (at most 64), got "${config.nodeId}"`);
  }
  try {
    parseAllowlist(config.allowEndpoint);
  } catch (e) {
    throw new ConfigError(`--allow-endpoint: ${(e as Error).message}`);
  }
  if (config.nodeHeartbeatS <= 0 || config.nodeLostS < 2 * config.nodeHeartbeatS) {
    throw new ConfigError(`--node-lost-s (${config.nodeLostS}) must be at least twice --node-heartbeat-s (${config.nodeHeartbeatS}), which must be > 0`);
  }
  return { config, rest };
}

/** A setting's default for `--help`: `64 MiB` beside a byte count, `none` when unset. */
function defaultShown(s: Setting): string {
  if (s.defaultText) return s.defaultText;
  const v = s.def({});
  if (v === undefined || (Array.isArray(v) && v.length === 0)) return 'none';
  if (typeof v === 'number' && s.key.endsWith('Bytes') && v >= MiB) return `${v} (${v % (1024 * MiB) === 0 ? `${v / 1024 / MiB} GiB` : `${v / MiB} MiB`})`;
  return String(v);
}

/**
 * The settings for `--help`: two lines each, the flag with its environment variable and default,
 * then what it does.
 */
export function settingsHelp(): string {
  return SETTINGS.map((s) => {
    const flag = s.flag + (s.kind === 'bool' ? '' : s.kind === 'int' || s.kind === 'number' ? ' N' : s.kind === 'list' ? ' V[,V]' : ' V');
    return `  ${flag.padEnd(30)} ${s.env.padEnd(31)} default: ${defaultShown(s)}\n      ${s.help}`;
  }).join('\n');
}
