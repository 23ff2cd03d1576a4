/**
 * `vela policy CHECKPOINT [options]`: serve a checkpoint to OpenPI clients
 * (`openpi_client.websocket_client_policy.WebsocketClientPolicy(host, port, api_key)`).
 */
import fs from 'node:fs';
import path from 'node:path';
import { badValue, choiceArg, intArg, numberArg, shown, splitArgs, UsageError, type FlagSpec } from '../cli-args.ts';
import { BACKEND_CHOICES, LOG_LEVELS } from '../config.ts';
import { log } from '../log.ts';
import { stopOnSignals } from '../signals.ts';
import { DEFAULT_POLICY_LIMITS } from './observation.ts';
import { storedPreset } from '../presets.ts';

const HELP = 'vela policy --help';

export const POLICY_USAGE = `Usage: vela policy CHECKPOINT [options]

Serves a checkpoint folder (config.json, weights, norm_stats.json) over OpenPI's websocket
protocol: ws://HOST:PORT/ for openpi_client's WebsocketClientPolicy, GET /healthz, GET
/v1/observation.zdict (the zstd dictionary for compressed observations), GET /stats, GET
/metrics (Prometheus text; needs the --api-key when one is set, unless --metrics-public), and PUT
/weights: new weights pushed by a Vela server's sync_inference_weights, swapped in between
batches without dropping a connection (only with --api-key).

Options:
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
  --log-level L         ${LOG_LEVELS.join(' | ')} (default info)
  -h, --help            this text
`;

interface Parsed {
  checkpoint: string;
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
  logLevel: string;
}

const SPEC: FlagSpec = {
  '--port': 'value', '--host': 'value', '--seed': 'value', '--debug': 'switch', '--batch-window-ms': 'value', '--max-batch': 'value',
  '--api-key': 'value', '--metrics-public': 'switch', '--backend': 'value', '--max-message-bytes': 'value', '--log-level': 'value',
};

/**
 * Parses the arguments.
 * @throws UsageError naming the flag and the value as typed (`--port abc: must be an integer in 0..65535`).
 */
export function parsePolicyArgs(argv: string[], env: NodeJS.ProcessEnv = process.env): Parsed {
  const out: Parsed = {
    checkpoint: '', port: 8000, host: '127.0.0.1', seed: null, debug: false, batchWindowMs: 5, maxBatch: 16,
    apiKey: env.VELA_API_KEY || null, metricsPublic: /^(1|true|yes|on)$/i.test(env.VELA_METRICS_PUBLIC ?? ''), backend: env.VELA_BACKEND || 'auto', maxMessageBytes: DEFAULT_POLICY_LIMITS.maxMessageBytes, logLevel: 'info',
  };
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
      case '--log-level': out.logLevel = choiceArg(f, LOG_LEVELS); break;
    }
  }
  if (positional.length !== 1) throw new UsageError(`expected one CHECKPOINT folder, got ${positional.length ? positional.map(shown).join(' ') : 'none'} (see ${HELP})`);
  out.checkpoint = positional[0]!;
  return out;
}

/**
 * A checkpoint folder's config.json, read before any engine starts.
 * @throws UsageError when the folder or its config.json is missing (a mistyped path);
 *   Error when config.json is not JSON or has no preset.
 */
export function readCheckpointConfig(checkpoint: string): { preset: string; baseSeed: number } {
  const dir = path.resolve(checkpoint);
  const arg = { flag: 'CHECKPOINT', value: checkpoint, typed: `CHECKPOINT ${shown(checkpoint)}` };
  if (!fs.existsSync(dir) || !fs.statSync(dir).isDirectory()) throw badValue(arg, 'no such folder');
  const configPath = path.join(dir, 'config.json');
  if (!fs.existsSync(configPath)) {
    throw badValue(arg, 'has no config.json; a checkpoint is a folder such as <output>/weights/final or <output>/weights/step-N of vela finetune');
  }
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

/** The `vela policy` command: starts an engine for the checkpoint's preset and serves it until SIGINT/SIGTERM. */
export async function policyCommand(argv: string[]): Promise<void> {
  if (argv.includes('--help') || argv.includes('-h')) return void process.stdout.write(POLICY_USAGE);
  const args = parsePolicyArgs(argv);
  log.setLevel(args.logLevel);
  const dir = path.resolve(args.checkpoint);
  const { preset, baseSeed } = readCheckpointConfig(args.checkpoint);
  const { Engine } = await import('../engine/host.ts');
  const { startPolicyServer } = await import('./standalone.ts');
  const engine = await Engine.start({ preset, backend: args.backend, seed: baseSeed });
  let server;
  try {
    server = await startPolicyServer({
      engine, checkpointDir: dir, policyId: 'policy', seed: args.seed, debug: args.debug, batchWindowMs: args.batchWindowMs,
      maxBatch: args.maxBatch, apiKey: args.apiKey, metricsPublic: args.metricsPublic, limits: { maxMessageBytes: args.maxMessageBytes }, host: args.host, port: args.port,
    });
  } catch (e) {
    await engine.close();
    throw e;
  }
  const m = server.policy.meta;
  process.stdout.write(
    `Vela policy server on ${server.wsUrl} (${m.preset} on ${engine.info.backend}; cameras ${m.cameras.join(', ')}; ` +
      `actions [${m.actionHorizon}, ${m.actionDim}], absolute${m.actionSpace === 'delta' ? ' (trained as deltas; the state is added back)' : ''}${args.seed !== null ? `; seed ${args.seed}` : ''}${args.apiKey ? '; API key required' : ''})\n` +
      `${engine.info.backendLine}\n`,
  );
  stopOnSignals(() => server.close().then(() => engine.close()), 'shutting down');
}
