/**
 * `vela policy CHECKPOINT [options]`: serve a checkpoint to OpenPI clients
 * (`openpi_client.websocket_client_policy.WebsocketClientPolicy(host, port, api_key)`).
 */
import fs from 'node:fs';
import path from 'node:path';
import { log } from '../log.ts';
import { stopOnSignals } from '../signals.ts';
import { DEFAULT_POLICY_LIMITS } from './observation.ts';

export const POLICY_USAGE = `Usage: vela policy CHECKPOINT [options]

Serves a checkpoint folder (config.json, weights, norm_stats.json) over OpenPI's websocket
protocol: ws://HOST:PORT/ for openpi_client's WebsocketClientPolicy, GET /healthz, GET
/v1/observation.zdict (the zstd dictionary for compressed observations), GET /stats, and
PUT /weights: new weights pushed by a Vela server's sync_inference_weights, swapped in between
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
  --backend B           auto | node-gpu | node | wasm | cpu (default auto; also VELA_BACKEND)
  --max-message-bytes N largest observation message (default ${DEFAULT_POLICY_LIMITS.maxMessageBytes})
  --log-level L         error | warn | info | debug (default info)
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
  backend: string;
  maxMessageBytes: number;
  logLevel: string;
}

/** Parses the arguments; throws Error with a message naming the bad flag. */
export function parsePolicyArgs(argv: string[], env: NodeJS.ProcessEnv = process.env): Parsed {
  const out: Parsed = {
    checkpoint: '', port: 8000, host: '127.0.0.1', seed: null, debug: false, batchWindowMs: 5, maxBatch: 16,
    apiKey: env.VELA_API_KEY || null, backend: env.VELA_BACKEND || 'auto', maxMessageBytes: DEFAULT_POLICY_LIMITS.maxMessageBytes, logLevel: 'info',
  };
  const int = (flag: string, v: string | undefined, lo: number, hi: number): number => {
    const n = Number(v);
    if (v === undefined || !Number.isInteger(n) || n < lo || n > hi) throw new Error(`${flag} must be an integer in ${lo}..${hi}, got ${JSON.stringify(v ?? null)}`);
    return n;
  };
  const positional: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    const [flag, inline] = a.startsWith('--') && a.includes('=') ? [a.slice(0, a.indexOf('=')), a.slice(a.indexOf('=') + 1)] : [a, undefined];
    const value = () => {
      if (inline !== undefined) return inline;
      const v = argv[++i];
      if (v === undefined) throw new Error(`${flag} needs a value`);
      return v;
    };
    switch (flag) {
      case '--port': out.port = int(flag, value(), 0, 65535); break;
      case '--host': out.host = value(); break;
      case '--seed': out.seed = int(flag, value(), 0, 2 ** 32 - 1); break;
      case '--debug': out.debug = true; break;
      case '--batch-window-ms': {
        const v = value();
        const n = Number(v);
        if (!Number.isFinite(n) || n < 0 || n > 10_000) throw new Error(`--batch-window-ms must be a number in 0..10000, got ${JSON.stringify(v)}`);
        out.batchWindowMs = n;
        break;
      }
      case '--max-batch': out.maxBatch = int(flag, value(), 1, 256); break;
      case '--api-key': out.apiKey = value(); break;
      case '--backend': out.backend = value(); break;
      case '--max-message-bytes': out.maxMessageBytes = int(flag, value(), 1024, 1024 * 1024 * 1024); break;
      case '--log-level': out.logLevel = value(); break;
      default:
        if (a.startsWith('-')) throw new Error(`unknown option ${a} (see vela policy --help)`);
        positional.push(a);
    }
  }
  if (positional.length !== 1) throw new Error(`expected one CHECKPOINT folder, got ${positional.length ? positional.join(' ') : 'none'} (see vela policy --help)`);
  out.checkpoint = positional[0]!;
  return out;
}

/** The `vela policy` command: starts an engine for the checkpoint's preset and serves it until SIGINT/SIGTERM. */
export async function policyCommand(argv: string[]): Promise<void> {
  if (argv.includes('--help') || argv.includes('-h')) return void process.stdout.write(POLICY_USAGE);
  const args = parsePolicyArgs(argv);
  log.setLevel(args.logLevel);
  const dir = path.resolve(args.checkpoint);
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
  const baseSeed = typeof ckConfig.base_seed === 'number' ? ckConfig.base_seed : 0;
  const { Engine } = await import('../engine/host.ts');
  const { startPolicyServer } = await import('./standalone.ts');
  const engine = await Engine.start({ preset, backend: args.backend, seed: baseSeed });
  let server;
  try {
    server = await startPolicyServer({
      engine, checkpointDir: dir, policyId: 'policy', seed: args.seed, debug: args.debug, batchWindowMs: args.batchWindowMs,
      maxBatch: args.maxBatch, apiKey: args.apiKey, limits: { maxMessageBytes: args.maxMessageBytes }, host: args.host, port: args.port,
    });
  } catch (e) {
    await engine.close();
    throw e;
  }
  const m = server.policy.meta;
  process.stdout.write(
    `Vela policy server on ${server.wsUrl} (${m.preset} on ${engine.info.backend}; cameras ${m.cameras.join(', ')}; ` +
      `actions [${m.actionHorizon}, ${m.actionDim}] ${m.actionSpace}${args.seed !== null ? `; seed ${args.seed}` : ''}${args.apiKey ? '; API key required' : ''})\n`,
  );
  stopOnSignals(() => server.close().then(() => engine.close()), 'shutting down');
}
