/**
 * `vela`: the command line. `vela serve` (what `npm start` runs), `vela keys create`, and the
 * local tools (finetune, datasets, policy, presets). Every command answers `--help`.
 *
 * Errors: a mistake in the command line (UsageError, ConfigError) is one line naming the flag and
 * the value as typed, exit code 2; any other failure is one line, exit code 1. Stack traces only
 * with `--debug`.
 */
import fs from 'node:fs';
import path from 'node:path';
import { shown, splitArgs, UsageError } from './args.ts';
import { ConfigError, loadConfig, settingsHelp, SETTINGS } from '../config.ts';
import { resemblance } from '../../protocol/resemble.ts';
import { log } from '../log.ts';
import { stopOnSignals } from './signals.ts';
import { Store } from '../store/store.ts';

export const USAGE = `vela: a training and policy server for flow-matching VLA policies

Usage:
  vela serve [settings]              run the server (REST, session websockets, jobs)
  vela keys create [--name N]        create an API key and print it (shown once)
  vela finetune --dataset DIR        fine-tune locally with a progress bar (same job as the server's)
  vela datasets inspect DIR          describe a LeRobot dataset
  vela datasets download REPO_ID     fetch a LeRobot dataset from the Hugging Face Hub
  vela models download REPO_ID       fetch a checkpoint into the Hugging Face cache (init, list, inspect, upload too)
  vela policy CHECKPOINT [opts]      serve a checkpoint to robots over OpenPI's websocket protocol
  vela presets                       print each model preset's parameter count
  vela backend                       print the backend engines run on, and why not a faster one
  vela help                          this text

Every command answers --help. --debug (any command) prints the stack trace of a failure.

Settings of vela serve and vela keys (flag, environment variable, default):
${settingsHelp()}
`;

export const SERVE_USAGE = `Usage: vela serve [settings]

Runs the server: REST, the session and policy websockets, fine-tune jobs, the dashboard at /ui/.
Each setting is a flag or an environment variable; a flag wins over the variable, the variable
over the default.

Settings (flag, environment variable, default):
${settingsHelp()}
`;

const KEYS_USAGE = `Usage: vela keys create [--name NAME] [--data-dir DIR] [--database-url URL]

Creates an API key in the store and prints it; only its hash is kept, so this is the one time it
is shown. The store is the server's: SQLite in --data-dir (VELA_DATA_DIR, default ./vela-data),
or the cluster's PostgreSQL with --database-url (VELA_DATABASE_URL). Any other setting of
vela serve --help is taken and ignored.
`;

const PRESETS_USAGE = 'Usage: vela presets\n\nPrints each small model preset with its parameter count and deprecated alias, then the real pi0 / pi0.5\nwith their parameter counts and how to get their public checkpoints (MODEL.md).\n';

function wantsHelp(args: string[]): boolean {
  return args.includes('--help') || args.includes('-h');
}

async function serve(argv: string[]): Promise<void> {
  if (wantsHelp(argv)) return void process.stdout.write(SERVE_USAGE);
  const { config, rest } = loadConfig(argv);
  if (rest.length > 0) {
    const a = rest[0]!;
    if (!a.startsWith('-')) throw new UsageError(`unexpected argument ${shown(a)} (see vela serve --help)`);
    const like = resemblance(a.replace(/^-+/, '').split('=')[0]!, SETTINGS.map((s) => s.flag.slice(2)));
    throw new UsageError(`unknown option ${shown(a)} (${like ? `did you mean --${like}? ` : ''}see vela serve --help)`);
  }
  log.setLevel(config.logLevel);
  const { startServer } = await import('../app.ts');
  const server = await startServer(config, {
    onNewKey: (key) => process.stdout.write(`\nNo API key existed, so one was created. It is shown only this once:\n\n    ${key}\n\nUse it as: Authorization: Bearer ${key}\n\n`),
  });
  // Before the backend probe below (seconds): the server already answers, so a Ctrl-C from now
  // on must close it cleanly (the database checkpointed, its -wal and -shm files removed).
  stopOnSignals(() => server.close());
  // Chosen now, in a short-lived worker, so the operator sees it before the first session.
  const backend = await server.sessions.backend().then((b) => b.line, (e: Error) => `no backend: ${e.message}`);
  process.stdout.write(
    `Vela listening on ${server.baseUrl} (data: ${path.resolve(config.dataDir)}, datasets: ${path.resolve(config.datasetsDir)}${fs.existsSync(config.datasetsDir) ? '' : ': no such folder yet'})\n` +
      `Dashboard: ${server.baseUrl}/ui/\n${backend}\n` +
      (config.apiKey ? 'Accepting the key from VELA_API_KEY / --api-key (stored with this data folder\'s keys as "from VELA_API_KEY": it stays valid after a restart without it).\n' : ''),
  );
}

async function keys(argv: string[]): Promise<void> {
  if (wantsHelp(argv)) return void process.stdout.write(KEYS_USAGE);
  const [sub, ...rest] = argv;
  if (sub !== 'create') throw new UsageError(sub === undefined ? 'which one? the only subcommand is "create" (see vela keys --help)' : `unknown subcommand ${shown(sub)}; the only one is "create" (see vela keys --help)`);
  const { config, rest: other } = loadConfig(rest);
  const { flags, positional } = splitArgs(other, { '--name': 'value' }, 'vela keys --help');
  if (positional.length > 0) throw new UsageError(`unexpected argument ${shown(positional[0]!)} (see vela keys --help)`);
  const name = flags.find((f) => f.flag === '--name')?.value ?? null;
  const store = await Store.open(config);
  const { key } = await store.createApiKey(name);
  await store.close();
  process.stdout.write(key + '\n');
}

async function presets(argv: string[]): Promise<void> {
  if (wantsHelp(argv)) return void process.stdout.write(PRESETS_USAGE);
  splitArgs(argv, {}, 'vela presets --help');
  if (argv.length > 0) throw new UsageError(`unexpected argument ${shown(argv[0]!)} (see vela presets --help)`);
  const { describePresets } = await import('../../kernels/small/config.ts');
  const { describeRealModels } = await import('../models/presets.ts');
  process.stdout.write(`${describePresets()}\n${describeRealModels()}\n`);
}

async function policy(argv: string[]): Promise<void> {
  const { policyCommand } = await import('../policy/cli.ts');
  await policyCommand(argv);
}

async function finetune(argv: string[]): Promise<void> {
  const { finetuneCommand } = await import('../jobs/cli.ts');
  await finetuneCommand(argv);
}

async function datasets(argv: string[]): Promise<void> {
  const { datasetsCommand } = await import('../datasets/cli.ts');
  await datasetsCommand(argv);
}

async function models(argv: string[]): Promise<void> {
  const { modelsCommand } = await import('../models/cli.ts');
  await modelsCommand(argv);
}

const BACKEND_USAGE = `Usage: vela backend [settings]

Chooses the TF.js backend as an engine of vela serve would (--backend, VELA_BACKEND; auto tries
node-gpu, node, wasm, cpu) and prints one line: the backend, where it runs, and why each faster
one is not in use. Takes vela serve's settings (--backend, --tf-intra-op-threads, ...).
`;

async function backend(argv: string[]): Promise<void> {
  if (wantsHelp(argv)) return void process.stdout.write(BACKEND_USAGE);
  const { config, rest } = loadConfig(argv);
  if (rest.length > 0) throw new UsageError(`unexpected argument ${shown(rest[0]!)} (see vela backend --help)`);
  const { Engine } = await import('../engine/host.ts');
  const { threadsOf } = await import('../sessions/sessions.ts');
  process.stdout.write((await Engine.probe(config.backend, threadsOf(config))).line + '\n');
}

const COMMANDS: Record<string, (argv: string[]) => Promise<void>> = { serve, keys, presets, policy, finetune, datasets, models, backend };

/** What `vela` prints for a failure, and its exit code: 2 for a usage mistake, else 1. */
export function describeFailure(command: string | undefined, e: unknown, debug: boolean): { text: string; exitCode: number } {
  const usage = e instanceof UsageError || e instanceof ConfigError;
  const message = e instanceof Error ? e.message : String(e);
  const head = `vela${command ? ` ${command}` : ''}: ${message.split('\n')[0]}`;
  const stack = debug && e instanceof Error && e.stack ? `\n${e.stack}` : '';
  return { text: head + stack + '\n', exitCode: usage ? 2 : 1 };
}

/**
 * Runs `vela` with `argv` (without node and the script). Resolves to the exit code for errors
 * caught here (2 usage, 1 failure) or 0; long-running commands (serve, policy) resolve once
 * they listen. Writes the one-line error to `stderr`.
 */
export async function runCli(argv: string[], stderr: (text: string) => void = (t) => process.stderr.write(t)): Promise<number> {
  // --debug belongs to every command; `vela policy` also reads it (stack traces in error frames).
  const debug = argv.includes('--debug');
  const [cmd, ...rest] = argv[0] === 'policy' ? argv : argv.filter((a) => a !== '--debug');
  if (!cmd || cmd === 'help' || cmd === '--help' || cmd === '-h') {
    process.stdout.write(USAGE);
    return 0;
  }
  const fn = COMMANDS[cmd];
  if (!fn) {
    stderr(`vela: unknown command ${shown(cmd)}; the commands are ${Object.keys(COMMANDS).join(', ')} (see vela --help)\n`);
    return 2;
  }
  try {
    await fn(rest);
    return 0;
  } catch (e) {
    const sub = cmd === 'datasets' || cmd === 'models' || cmd === 'keys' ? [cmd, rest[0]].filter((x) => x && !x.startsWith('-')).join(' ') : cmd;
    const { text, exitCode } = describeFailure(sub, e, debug);
    stderr(text);
    return exitCode;
  }
}
