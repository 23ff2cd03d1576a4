/**
 * `vela`: the command line. `vela serve` (what `npm start` runs), `vela keys create`, and the
 * local tools added by later modules. Every command answers `--help`.
 */
import path from 'node:path';
import { loadConfig, settingsHelp, ConfigError } from './config.ts';
import { log } from './log.ts';
import { stopOnSignals } from './signals.ts';
import { Store } from './store.ts';

const USAGE = `vela: a training and policy server for flow-matching VLA policies

Usage:
  vela serve [settings]          run the server (REST, session websockets, jobs)
  vela keys create [--name N]    create an API key and print it (shown once)
  vela finetune --dataset DIR    fine-tune locally with a progress bar (same job as the server's)
  vela datasets inspect DIR      describe a LeRobot dataset
  vela policy CHECKPOINT [opts]  serve a checkpoint to robots over OpenPI's websocket protocol
  vela presets                   print each model preset's parameter count
  vela help                      this text

Settings (flag, environment variable, meaning):
${settingsHelp()}
`;

function wantsHelp(args: string[]): boolean {
  return args.includes('--help') || args.includes('-h');
}

async function serve(argv: string[]): Promise<void> {
  if (wantsHelp(argv)) return void process.stdout.write(`Usage: vela serve [settings]\n\nSettings:\n${settingsHelp()}\n`);
  const { config, rest } = loadConfig(argv);
  if (rest.length > 0) throw new ConfigError(`unexpected arguments: ${rest.join(' ')} (see vela serve --help)`);
  log.setLevel(config.logLevel);
  const { startServer } = await import('./app.ts');
  const server = await startServer(config, {
    onNewKey: (key) => process.stdout.write(`\nNo API key existed, so one was created. It is shown only this once:\n\n    ${key}\n\nUse it as: Authorization: Bearer ${key}\n\n`),
  });
  process.stdout.write(
    `Vela listening on ${server.baseUrl} (data: ${path.resolve(config.dataDir)}, datasets: ${config.datasetsDir}, backend: ${config.backend})\n` +
      (config.apiKey ? 'Accepting the key from VELA_API_KEY / --api-key.\n' : ''),
  );
  stopOnSignals(() => server.close());
}

async function keys(argv: string[]): Promise<void> {
  const [sub, ...rest] = argv;
  if (sub !== 'create' || wantsHelp(argv)) {
    process.stdout.write('Usage: vela keys create [--name NAME] [--data-dir DIR]\n\nCreates an API key in the store and prints it; only its hash is kept.\n');
    if (sub !== 'create' && !wantsHelp(argv)) process.exitCode = 2;
    return;
  }
  const ni = rest.indexOf('--name');
  const name = ni >= 0 ? rest[ni + 1] ?? null : null;
  const settings = ni >= 0 ? [...rest.slice(0, ni), ...rest.slice(ni + 2)] : rest;
  const { config } = loadConfig(settings);
  const store = new Store(config.dataDir);
  const { key } = store.createApiKey(name);
  store.close();
  process.stdout.write(key + '\n');
}

async function presets(argv: string[]): Promise<void> {
  if (wantsHelp(argv)) return void process.stdout.write('Usage: vela presets\n\nPrints each model preset with its parameter count (MODEL.md).\n');
  const { describePresets } = await import('../kernels/config.ts');
  process.stdout.write(describePresets() + '\n');
}

async function policy(argv: string[]): Promise<void> {
  const { policyCommand } = await import('./policy/cli.ts');
  await policyCommand(argv);
}

async function finetune(argv: string[]): Promise<void> {
  const { finetuneCommand } = await import('./jobs/cli.ts');
  await finetuneCommand(argv);
}

async function datasets(argv: string[]): Promise<void> {
  const { datasetsCommand } = await import('./jobs/cli.ts');
  await datasetsCommand(argv);
}

const COMMANDS: Record<string, (argv: string[]) => Promise<void>> = { serve, keys, presets, policy, finetune, datasets };

async function main(argv: string[]): Promise<void> {
  const [cmd, ...rest] = argv;
  if (!cmd || cmd === 'help' || cmd === '--help' || cmd === '-h') return void process.stdout.write(USAGE);
  const fn = COMMANDS[cmd];
  if (!fn) {
    process.stderr.write(`vela: unknown command "${cmd}"\n\n${USAGE}`);
    process.exitCode = 2;
    return;
  }
  await fn(rest);
}

main(process.argv.slice(2)).catch((e) => {
  // Errors a user caused (bad flags, a bad dataset) are one line; anything else keeps its stack.
  const code = (e as { code?: unknown }).code;
  if (e instanceof ConfigError || typeof code === 'string' || /\(see vela /.test((e as Error).message)) process.stderr.write(`vela: ${(e as Error).message}\n`);
  else log.error(`vela: ${(e as Error).message}`, e);
  process.exitCode = 1;
});
