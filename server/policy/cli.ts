/**
 * `vela policy CHECKPOINT [options]` / `vela policy --base REF [--model pi0|pi05]`: serve a
 * checkpoint, or a real pi0 / pi0.5 base as it is, to OpenPI clients
 * (`openpi_client.websocket_client_policy.WebsocketClientPolicy(host, port, api_key)`).
 */
import fs from 'node:fs';
import path from 'node:path';
import { badValue, choiceArg, intArg, numberArg, shown, splitArgs, UsageError, type FlagSpec } from '../cli/args.ts';
import { BACKEND_CHOICES, LOG_LEVELS } from '../config.ts';
import { log } from '../log.ts';
import { stopOnSignals } from '../cli/signals.ts';
import { DEFAULT_POLICY_LIMITS } from './observation.ts';
import { storedPreset } from '../models/presets.ts';
import { answeredAs } from '../datasets/actions.ts';
import { cliModelsDir, REAL_MODELS, type RealModel } from '../models/bases.ts';
import { baseServing, classifyFolder, OPENPI_CAMERAS, type ServedFolder } from './checkpoint.ts';
import { DEFAULT_RTC_SETTINGS, RTC_QUERY_KEYS, rtcSettings, type RtcSettings } from './rtc.ts';
import { DEFAULT_WS_CAPS, type WsCaps } from '../http/ws-admission.ts';
import { loadDictionaryFiles, MAX_EXTRA_DICTIONARIES } from '../../protocol/zstd.ts';

const HELP = 'vela policy --help';

export const POLICY_USAGE = `Usage: vela policy CHECKPOINT [options]
       vela policy --checkpoint DIR [--base REF] [options]
       vela policy --base REF [--model pi0|pi05] [options]

Serves a checkpoint folder (config.json, weights, norm_stats.json) over OpenPI's websocket
protocol: ws://HOST:PORT/ for openpi_client's WebsocketClientPolicy, GET /healthz (503 WARMING
until the graphs a robot asks for are traced, then OK: start a robot on its 200), GET
/v1/observation.zdict (the zstd dictionary for compressed observations), GET /stats, GET
/metrics (Prometheus text; needs the --api-key when one is set, unless --metrics-public), and PUT
/weights: new weights pushed by a Vela server's sync_inference_weights, swapped in between
batches without dropping a connection (only with --api-key).

The real pi0 / pi0.5: --base serves a base checkpoint as it is (a Hub id such as
lerobot/pi05_base, found in the Hugging Face cache, or a folder in the Hub layout: config.json +
model.safetensors), with its own norm stats when it has them (else unnormalised, with a
warning). A Vela checkpoint of a real-model session or fine-tune (config.json preset pi0 / pi05)
names the base it was trained on (base_checkpoint) and is served on it; --base overrides that
folder (a checkpoint copied from another machine).

Options:
  --checkpoint DIR      the checkpoint folder (the same as the CHECKPOINT argument)
  --base REF            the real model's base: a Hub id already in the Hugging Face cache
                        (HF_HUB_CACHE, HF_HOME; vela models download puts it there) or a
                        folder (a path, or a name under --models-dir); alone, it is served as it is
  --models-dir DIR      where --base names are looked up (default $VELA_MODELS_DIR, else
                        $VELA_DATA_DIR/models, else ./vela-data/models: the server's)
  --model M             ${REAL_MODELS.join(' | ')}: the variant of --base (default: its config.json's "type")
  --cameras A,B,C       --base only: camera names bound to the base's image slots, in order
                        (default: its config.json's input_features, else openpi's
                        ${OPENPI_CAMERAS.join(',')}); a fine-tune's output (its
                        vela_dataset.json) is served with the cameras, action space and
                        names it was trained with, and --cameras only renames them
  --port N              port (default 8000; 0 picks a free one)
  --host H              address to bind (default 127.0.0.1; 0.0.0.0 for every interface)
  --seed N              reproducible sampling: request n of a connection on stream K (the
                        ?stream=K query parameter, default 0) draws its noise from
                        SHA-256("vela-policy-seed:N:K:n"); batching never changes it.
                        Without --seed, every request gets a random seed. A connection
                        may pick its own N with ?seed=N.
  --debug               error frames carry stack traces (never use on a shared network)
  --batch-window-ms MS  how long a request waits for others to batch with (default 5)
  --max-batch N         requests per model call at most (default 16)
  --api-key K           require "Authorization: Api-Key K" or "Bearer K" (also VELA_API_KEY)
  --metrics-public      answer GET /metrics without the --api-key (also VELA_METRICS_PUBLIC=1)
  --backend B           ${BACKEND_CHOICES.join(' | ')} (default auto; also VELA_BACKEND)
  --max-message-bytes N largest observation message (default ${DEFAULT_POLICY_LIMITS.maxMessageBytes})
  --zstd-dict FILE[,FILE]
                        more zstd dictionaries for observations, beside Vela's own (still the
                        one GET /v1/observation.zdict serves): trained dictionary files such
                        as Relay's observation.zdict; each frame is decoded with the one whose
                        id its header names. Repeatable; at most ${MAX_EXTRA_DICTIONARIES} files of at most
                        1 MiB (also VELA_ZSTD_DICT, comma-separated)
  --log-level L         ${LOG_LEVELS.join(' | ')} (default info)
  --max-ws-connections-per-key N
                        open connections per API key, or per remote address without
                        --api-key; past it a connection gets 429 (default ${DEFAULT_WS_CAPS.connectionsPerKey})
  --max-ws-connections N  open connections in all (default ${DEFAULT_WS_CAPS.connections})
  --max-ws-buffered-bytes-per-key N
                        bytes one key's (address's) connections may make the server hold: each
                        reserves --max-message-bytes + 64 MiB of unsent answers (default ${DEFAULT_WS_CAPS.bufferedBytesPerKey})
  --max-ws-buffered-bytes N  the same in all (default ${DEFAULT_WS_CAPS.bufferedBytes})
  -h, --help            this text

Real-time chunking (a robot that sends rtc/executed gets a chunk that continues the one it is
executing; docs/PROTOCOL.md section 6). Defaults for every connection, each may override them
with the query parameter in brackets:
  --rtc MODE            auto | guided | prefix | off [rtc] (default auto: prefix for a
                        checkpoint fine-tuned with --rtc-max-delay, else guided; guided works
                        with any checkpoint)
  --control-hz HZ       the robots' control rate (0..10000), for the measured delay [control_hz]
                        (default: none until a robot sends rtc/control_hz)
  --rtc-delay N         plan for a fixed delay of N control steps (0..1024) instead of measuring [rtc_delay]
  --rtc-schedule S      exp | linear: how guidance weights fall over the overlap [rtc_schedule] (default exp)
  --rtc-max-guidance B  the cap on the guidance weight, 0..20 [rtc_max_guidance] (default 5)
`;

interface Parsed {
  /** The checkpoint folder as typed; null with --base alone. */
  checkpoint: string | null;
  /** --base as typed (a Hub id or a folder); null when not given. */
  base: string | null;
  /** The folder --base names are under (--models-dir, cliModelsDir's default). */
  modelsDir: string;
  model: RealModel | null;
  cameras: string[] | null;
  port: number;
  host: string;
  seed: number | null;
  debug: boolean;
  batchWindowMs: number;
  maxBatch: number;
  apiKey: string | null;
  metricsPublic: boolean;
  backend: string;
  maxMessageBytes: number;
  /** Websocket caps (ws-admission.ts). */
  wsCaps: WsCaps;
  logLevel: string;
  /** Real-time chunking defaults (server/policy/rtc.ts). */
  rtc: RtcSettings;
  /** --zstd-dict / VELA_ZSTD_DICT: the operator's dictionary files (read by policyCommand). */
  zstdDicts: string[];
}

/** `vela policy`'s RTC flags and the query parameter each stands for. */
const RTC_FLAGS: Record<string, string> = Object.fromEntries(RTC_QUERY_KEYS.map((name) => [`--${name.replaceAll('_', '-')}`, name]));

const SPEC: FlagSpec = {
  '--port': 'value', '--host': 'value', '--seed': 'value', '--debug': 'switch', '--batch-window-ms': 'value', '--max-batch': 'value',
  '--api-key': 'value', '--metrics-public': 'switch', '--backend': 'value', '--max-message-bytes': 'value', '--log-level': 'value',
  '--max-ws-connections-per-key': 'value', '--max-ws-connections': 'value', '--max-ws-buffered-bytes-per-key': 'value', '--max-ws-buffered-bytes': 'value',
  '--checkpoint': 'value', '--base': 'value', '--models-dir': 'value', '--model': 'value', '--cameras': 'value', '--zstd-dict': 'value',
  ...Object.fromEntries(Object.keys(RTC_FLAGS).map((f) => [f, 'value' as const])),
};

/** What an RTC request gets, for the startup line: `real-time chunking guided (β 5) at 30 Hz`. */
function rtcLine(rtc: Record<string, unknown>): string {
  if (rtc.mode === 'off') return 'real-time chunking off';
  const how = rtc.mode === 'guided' ? `guided (β ${rtc.max_guidance})` : `prefix (trained up to delay ${rtc.trained_max_delay})`;
  return `real-time chunking ${how}${rtc.control_hz ? ` at ${rtc.control_hz} Hz` : ''}${rtc.delay !== null ? `, delay ${rtc.delay}` : ''}`;
}


/** A comma-separated list, blanks dropped. */
function listOf(text: string): string[] {
  return text.split(',').map((v) => v.trim()).filter((v) => v !== '');
}

/**
 * Parses the arguments.
 * @throws UsageError naming the flag and the value as typed (`--port abc: must be an integer in 0..65535`).
 */
export function parsePolicyArgs(argv: string[], env: NodeJS.ProcessEnv = process.env): Parsed {
  const out: Parsed = {
    checkpoint: null, base: null, modelsDir: cliModelsDir(undefined, env), model: null, cameras: null, port: 8000, host: '127.0.0.1', seed: null, debug: false, batchWindowMs: 5, maxBatch: 16,
    apiKey: env.VELA_API_KEY || null, metricsPublic: /^(1|true|yes|on)$/i.test(env.VELA_METRICS_PUBLIC ?? ''), backend: env.VELA_BACKEND || 'auto', maxMessageBytes: DEFAULT_POLICY_LIMITS.maxMessageBytes, logLevel: 'info',
    wsCaps: { ...DEFAULT_WS_CAPS },
    rtc: { ...DEFAULT_RTC_SETTINGS },
    zstdDicts: listOf(env.VELA_ZSTD_DICT ?? ''),
  };
  let dictFlags = false; // the first --zstd-dict replaces VELA_ZSTD_DICT, later ones add to it
  const { flags, positional } = splitArgs(argv, SPEC, HELP);
  for (const f of flags) {
    switch (f.flag) {
      case '--port': out.port = intArg(f, 0, 65535); break;
      case '--host': out.host = f.value; break;
      case '--seed': out.seed = intArg(f, 0, 2 ** 32 - 1); break;
      case '--debug': out.debug = true; break;
      case '--batch-window-ms': out.batchWindowMs = numberArg(f, 0, 10_000); break;
      case '--max-batch': out.maxBatch = intArg(f, 1, 256); break;
      case '--api-key': out.apiKey = f.value; break;
      case '--metrics-public': out.metricsPublic = true; break;
      case '--backend': out.backend = choiceArg(f, BACKEND_CHOICES); break;
      case '--max-message-bytes': out.maxMessageBytes = intArg(f, 1024, 1024 * 1024 * 1024); break;
      case '--max-ws-connections-per-key': out.wsCaps.connectionsPerKey = intArg(f, 1, 1_000_000); break;
      case '--max-ws-connections': out.wsCaps.connections = intArg(f, 1, 1_000_000); break;
      case '--max-ws-buffered-bytes-per-key': out.wsCaps.bufferedBytesPerKey = intArg(f, 1, 2 ** 50); break;
      case '--max-ws-buffered-bytes': out.wsCaps.bufferedBytes = intArg(f, 1, 2 ** 50); break;
      case '--log-level': out.logLevel = choiceArg(f, LOG_LEVELS); break;
      case '--checkpoint': out.checkpoint = f.value; break;
      case '--base': out.base = f.value; break;
      case '--models-dir': out.modelsDir = cliModelsDir(f.value, env); break;
      case '--model': out.model = choiceArg(f, REAL_MODELS); break;
      case '--zstd-dict': {
        const files = listOf(f.value);
        if (files.length === 0) throw badValue(f, 'must name a dictionary file (or several, comma-separated)');
        out.zstdDicts = dictFlags ? [...out.zstdDicts, ...files] : files;
        dictFlags = true;
        break;
      }
      case '--cameras': {
        const names = f.value.split(',').map((c) => c.trim());
        if (names.length > 3 || names.some((c) => !/^[A-Za-z0-9_.-]{1,64}$/.test(c)) || new Set(names).size !== names.length) {
          throw badValue(f, 'must be 1 to 3 distinct camera names (letters, digits, _ . -), comma-separated');
        }
        out.cameras = names;
        break;
      }
      default:
        if (f.flag in RTC_FLAGS) {
          try {
            out.rtc = rtcSettings(out.rtc, { get: (name) => (name === RTC_FLAGS[f.flag] ? f.value : null) });
          } catch (e) {
            const rule = /; expected (.*)$/.exec((e as Error).message);
            throw badValue(f, rule ? `must be ${rule[1]}` : (e as Error).message);
          }
        }
    }
  }
  const given = out.checkpoint !== null ? 1 : 0;
  if (positional.length + given > 1) throw new UsageError(`expected one CHECKPOINT folder, got ${[...(out.checkpoint !== null ? [out.checkpoint] : []), ...positional].map(shown).join(' ')} (see ${HELP})`);
  if (positional.length === 1) out.checkpoint = positional[0]!;
  if (out.checkpoint === null && out.base === null) throw new UsageError(`expected one CHECKPOINT folder or --base <hub id | folder>, got none (see ${HELP})`);
  if (out.cameras && out.checkpoint !== null) throw new UsageError(`--cameras applies to --base alone: a checkpoint's config.json binds its cameras (see ${HELP})`);
  return out;
}

/** The checks of a typed folder argument that are usage mistakes (a mistyped path). @throws UsageError */
function checkFolderArg(name: string, value: string): string {
  const dir = path.resolve(value);
  const arg = { flag: name, value, typed: `${name} ${shown(value)}` };
  if (!fs.existsSync(dir) || !fs.statSync(dir).isDirectory()) throw badValue(arg, 'no such folder');
  if (!fs.existsSync(path.join(dir, 'config.json'))) {
    throw badValue(arg, 'has no config.json; a checkpoint is a folder such as <output>/weights/final or <output>/weights/step-N of vela finetune');
  }
  return dir;
}

/**
 * What `vela policy` serves, from its arguments: the folder classified (a Vela checkpoint, or a
 * real base served as it is) with its engine key, --base resolved to a local folder.
 * @throws UsageError (a missing folder, flags that do not go together, --model against the
 *   folder's type), ModelError (a Hub id not in the cache, one line with the command to fetch
 *   it), PolicyConfigError (a config.json that names no model).
 */
export async function resolvePolicyTarget(args: Parsed): Promise<ServedFolder> {
  const { resolveBase } = await import('../models/resolve.ts');
  const baseDir = args.base !== null ? (await resolveBase(args.base, { serverDownloads: false, modelsDir: args.modelsDir })).dir : null;
  let target: ServedFolder;
  if (args.checkpoint !== null) {
    target = await classifyFolder(checkFolderArg('CHECKPOINT', args.checkpoint), { base: baseDir });
    if (target.kind === 'base' && baseDir !== null) throw new UsageError(`CHECKPOINT ${shown(args.checkpoint)} is itself a base checkpoint (config.json type ${target.variant}): serve it alone, or give --base alone (see ${HELP})`);
  } else {
    target = await classifyFolder(baseDir!);
    if (target.kind !== 'base') throw new UsageError(`--base ${shown(args.base!)} is a Vela checkpoint (config.json preset ${target.preset}), not a base: serve it as CHECKPOINT (see ${HELP})`);
  }
  if (target.kind === 'checkpoint' && target.baseDir !== null && baseDir === null && !fs.existsSync(path.join(target.baseDir, 'config.json'))) {
    throw new UsageError(`CHECKPOINT ${shown(args.checkpoint!)} was trained on the base ${target.baseDir} (config.json base_checkpoint), which is not on this machine: give --base <hub id | folder> (see ${HELP})`);
  }
  const variant = target.kind === 'base' ? target.variant : target.preset;
  if (args.model !== null && args.model !== variant) {
    throw new UsageError(`--model ${args.model}: ${target.kind === 'base' ? target.dir : args.checkpoint} is a ${variant} checkpoint (config.json ${target.kind === 'base' ? 'type' : 'preset'}); drop --model or pick ${variant} (see ${HELP})`);
  }
  return target;
}

/**
 * A checkpoint folder's config.json, read before any engine starts.
 * @throws UsageError when the folder or its config.json is missing (a mistyped path);
 *   Error when config.json is not JSON or has no preset.
 */
export function readCheckpointConfig(checkpoint: string): { preset: string; baseSeed: number } {
  const dir = checkFolderArg('CHECKPOINT', checkpoint);
  const configPath = path.join(dir, 'config.json');
  let ckConfig: { preset?: unknown; base_seed?: unknown };
  try {
    ckConfig = JSON.parse(fs.readFileSync(configPath, 'utf8'));
  } catch (e) {
    throw new Error(`cannot read ${configPath}: ${(e as Error).message}`);
  }
  const preset = ckConfig.preset;
  if (typeof preset !== 'string') throw new Error(`${configPath} has no "preset"`);
  // LoRA adapters only make sense on the base weights they were trained on: the same init seed.
  // A checkpoint written before issue 23 may name pi05-tiny, or a bare pi05 (then flow05-small).
  return { preset: storedPreset(preset), baseSeed: typeof ckConfig.base_seed === 'number' ? ckConfig.base_seed : 0 };
}

/**
 * The `vela policy` command: starts an engine for the checkpoint's model (a small preset, or
 * the real pi0 / pi0.5 on its base) and serves it until SIGINT/SIGTERM.
 */
export async function policyCommand(argv: string[]): Promise<void> {
  if (argv.includes('--help') || argv.includes('-h')) return void process.stdout.write(POLICY_USAGE);
  const args = parsePolicyArgs(argv);
  log.setLevel(args.logLevel);
  // Read (and tried) first: a bad --zstd-dict is one line now, not a 1011 at a robot's first observation.
  const zstdDictionaries = await loadDictionaryFiles(args.zstdDicts).catch((e: Error) => {
    throw new UsageError(`--zstd-dict: ${e.message} (see ${HELP})`);
  });
  const target = await resolvePolicyTarget(args);
  if (target.baseDir) {
    // The real model's prompts need PaliGemma's tokenizer: refused now, before a 14 GB load.
    const { tokenizerFileFor } = await import('../models/layout.ts');
    tokenizerFileFor(target.baseDir);
    // Planned, not discovered: the weights and one 3-camera pass (batch 1) must fit before loading.
    const { planOrRefuse, realConfigOf } = await import('../models/plan.ts');
    const config = await realConfigOf(target.baseDir);
    const lora = target.kind === 'checkpoint' && target.config.finetune === 'lora';
    await planOrRefuse(config, { use: 'serve', batch: 1, cameras: 3, ...(lora ? { loraRank: Number(target.config.lora_rank) || 16, loraActionRank: Number(target.config.lora_action_rank ?? target.config.lora_rank) || 32 } : {}) },
      { weights: true, tenant: true, pass: true }, `serving ${config.variant} from ${target.baseDir}`, process.env.VELA_MAX_MEMORY || undefined, 'VELA_MAX_MEMORY');
  }
  const { Engine } = await import('../engine/host.ts');
  const { startPolicyServer } = await import('./standalone.ts');
  // Before the engine starts: a --cameras that does not fit a fine-tuned base is refused at once.
  const served = target.kind === 'checkpoint'
    ? { checkpointDir: target.dir }
    : { base: baseServing(target, args.cameras), checkpointDir: target.dir };
  const engine = await Engine.start({ preset: target.engineModel, backend: args.backend, seed: target.kind === 'checkpoint' ? target.baseSeed : 0 });
  let server;
  try {
    server = await startPolicyServer({
      engine, ...served, policyId: 'policy', seed: args.seed, debug: args.debug, batchWindowMs: args.batchWindowMs,
      maxBatch: args.maxBatch, apiKey: args.apiKey, metricsPublic: args.metricsPublic, limits: { maxMessageBytes: args.maxMessageBytes }, host: args.host, port: args.port, rtc: args.rtc, wsCaps: args.wsCaps,
      zstdDictionaries,
    });
  } catch (e) {
    await engine.close();
    throw e;
  }
  const m = server.policy.meta;
  const what = target.kind === 'base' ? `the ${m.preset} base ${target.dir}` : target.baseDir ? `${m.preset} on the base ${target.baseDir}` : m.preset;
  process.stdout.write(
    `Vela policy server on ${server.wsUrl} (${what} on ${engine.info.backend}; cameras ${m.cameras.join(', ')}; ` +
      `actions [${m.actionHorizon}, ${m.actionDim}], ${answeredAs(m.actionSpace)}${m.norm ? '' : ', unnormalised'}${args.seed !== null ? `; seed ${args.seed}` : ''}${args.apiKey ? '; API key required' : ''}; ${rtcLine(server.policy.metadata().rtc as Record<string, unknown>)})\n` +
      `${engine.info.backendLine}\n`,
  );
  stopOnSignals(() => server.close().then(() => engine.close()), 'shutting down');
  const { ready, warming } = server.policy.readiness();
  if (!ready) {
    // Until this line /healthz answers 503 WARMING: a robot's first request would wait for the trace.
    const t0 = performance.now();
    process.stdout.write(`warming up: ${warming} (GET /healthz answers 503 until ready)\n`);
    await server.policy.whenReady();
    if (server.policy.readiness().ready) process.stdout.write(`ready: warmed up in ${((performance.now() - t0) / 1000).toFixed(1)} s\n`);
  } else process.stdout.write('ready\n');
}
