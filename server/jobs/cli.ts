/**
 * `vela finetune`: the server's fine-tune job run locally, without the server: same config,
 * same training code (train.ts), same output folder layout, a live progress bar, and the events
 * as JSON lines in `<output>/events.jsonl`.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { badValue, splitArgs, UsageError, type FlagArg } from '../cli-args.ts';
import { BACKEND_CHOICES } from '../config.ts';
import { DatasetError } from '../datasets/index.ts';
import { FieldError, parseFineTuneConfig } from './config.ts';
import { prepareRun, runFineTune } from './train.ts';

/** Where `vela finetune` writes without --output: outside any repository, under the user's cache. */
export function defaultFinetuneRoot(env: NodeJS.ProcessEnv = process.env): string {
  return path.join(env.XDG_CACHE_HOME || path.join(os.homedir(), '.cache'), 'vela', 'finetunes');
}

export const FINETUNE_USAGE = `Usage: vela finetune --dataset DIR [options]

Fine-tunes a policy on a LeRobot dataset on this machine (the same job as POST /v1/fine-tunes).
Writes weights/step-N at each checkpoint and weights/final (each one a folder that
vela policy serves), norm stats, and events.jsonl to the output folder.

Options (defaults in brackets):
  --dataset DIR            LeRobot dataset folder (v2.x or v3.0)       [required]
  --model NAME             pi0-tiny, pi05-tiny, pi0-small, pi05-small  [pi05-tiny]
  --steps N                optimizer steps                              [1000]
  --batch-size N           datums per step                              [32]
  --learning-rate X        peak learning rate (warmup, cosine)          [1e-4]
  --finetune lora|full                                                  [lora]
  --lora-rank N / --lora-alpha X                                        [16 / 32]
  --targets a,b            attn, mlp, action_expert, prefix_expert, all [all]
  --cameras a,b            camera names                                 [every camera]
  --action-space delta|absolute                                         [delta when names match]
  --eval-every N           steps between held-out evals (0: at the end) [steps/4, at most 500]
  --checkpoint-every N     steps between kept checkpoints               [as --eval-every's default]
  --seed N                                                              [0]
  --name NAME              a name for the run                           [none]
  --output DIR             output folder                                [${path.join('~/.cache/vela/finetunes', '<dataset>-<time>')}]
  --backend B              ${BACKEND_CHOICES.join(', ')}              [$VELA_BACKEND or auto]
`;

/** Flag -> [config field, how the value is read]. */
const FLAGS: Record<string, [string, 'int' | 'number' | 'string' | 'list']> = {
  '--model': ['model', 'string'], '--steps': ['steps', 'int'], '--batch-size': ['batch_size', 'int'], '--learning-rate': ['learning_rate', 'number'],
  '--finetune': ['finetune', 'string'], '--lora-rank': ['lora_rank', 'int'], '--lora-alpha': ['lora_alpha', 'number'], '--targets': ['targets', 'list'],
  '--cameras': ['cameras', 'list'], '--action-space': ['action_space', 'string'], '--eval-every': ['eval_every', 'int'],
  '--checkpoint-every': ['checkpoint_every', 'int'], '--seed': ['seed', 'int'], '--name': ['name', 'string'],
};
const SPEC = Object.fromEntries([...Object.keys(FLAGS), '--dataset', '--output', '--backend'].map((f) => [f, 'value' as const]));
const HELP = 'vela finetune --help';

/**
 * The job config and local options from `vela finetune`'s arguments.
 * @throws UsageError naming the flag and the value as typed (`--steps abc: must be an integer in 1..1000000`).
 */
export function parseFinetuneArgs(argv: string[], env: NodeJS.ProcessEnv = process.env) {
  const { flags, positional } = splitArgs(argv, SPEC, HELP);
  if (positional.length > 0) throw new UsageError(`unexpected argument ${positional[0]} (options take the form --name value; see ${HELP})`);
  const body: Record<string, unknown> = { model: 'pi05-tiny' };
  const byField = new Map<string, FlagArg>();
  let dataset: FlagArg | null = null;
  let output: string | null = null;
  let backend = env.VELA_BACKEND || 'auto';
  for (const f of flags) {
    if (f.flag === '--dataset') dataset = f;
    else if (f.flag === '--output') output = f.value;
    else if (f.flag === '--backend') {
      if (!(BACKEND_CHOICES as string[]).includes(f.value)) throw badValue(f, `must be one of ${BACKEND_CHOICES.join(', ')}`);
      backend = f.value;
    } else {
      const [key, kind] = FLAGS[f.flag]!;
      byField.set(key, f);
      // A value that is not a number goes through as typed: the config check names the rule.
      const n = Number(f.value);
      body[key] = kind === 'list' ? f.value.split(',').map((x) => x.trim()) : kind === 'string' || f.value.trim() === '' || !Number.isFinite(n) ? f.value : n;
    }
  }
  if (!dataset) throw new UsageError(`--dataset DIR is required (see ${HELP})`);
  const datasetDir = path.resolve(dataset.value);
  if (!fs.existsSync(datasetDir) || !fs.statSync(datasetDir).isDirectory()) throw badValue(dataset, 'no such folder');
  body.dataset_name = datasetDir;
  let cfg;
  try {
    cfg = parseFineTuneConfig(body);
  } catch (e) {
    const arg = e instanceof FieldError ? byField.get(e.field) : undefined;
    if (arg) throw badValue(arg, (e as FieldError).rule);
    throw new UsageError((e as Error).message);
  }
  const stamp = new Date().toISOString().replace(/[:.]/g, '-').slice(0, 19);
  const outDir = path.resolve(output ?? path.join(defaultFinetuneRoot(env), `${path.basename(datasetDir)}-${stamp}`));
  return { cfg, datasetDir, dataset, outDir, backend, byField };
}

function fmtDuration(s: number): string {
  if (!Number.isFinite(s)) return '--:--';
  const m = Math.floor(s / 60);
  return `${m}:${String(Math.floor(s % 60)).padStart(2, '0')}`;
}

/** One line of the progress bar: `[#####.....] step 120/1000 loss 0.0412 3.1 steps/s ETA 4:44`. */
export function progressLine(step: number, steps: number, loss: number | null, stepsPerS: number, width = 24): string {
  const filled = Math.round((step / steps) * width);
  const eta = stepsPerS > 0 ? (steps - step) / stepsPerS : Infinity;
  return `[${'#'.repeat(filled)}${'.'.repeat(width - filled)}] step ${step}/${steps} loss ${loss === null ? 'nan' : loss.toFixed(4)} ${stepsPerS.toFixed(2)} steps/s ETA ${fmtDuration(eta)}`;
}

/**
 * `vela finetune`: validate the config and dataset, start an engine, run the job with a progress bar
 * on stderr, write events.jsonl and the outputs under --output.
 * @throws Error for bad flags or a bad dataset (one line, naming the flag or file).
 */
export async function finetuneCommand(argv: string[]): Promise<void> {
  if (argv.includes('--help') || argv.includes('-h')) return void process.stdout.write(FINETUNE_USAGE);
  const { cfg, datasetDir, dataset, outDir, backend, byField } = parseFinetuneArgs(argv);
  let index = 0;
  const tty = process.stderr.isTTY;
  const started = Date.now();
  let firstStepAt = 0;
  let firstStep = 0;
  // Validate the dataset before any work (a missing or corrupt file is named), then reuse it.
  process.stderr.write(`vela finetune: ${cfg.model} on ${datasetDir} -> ${outDir}\n`);
  let opened;
  try {
    opened = await prepareRun(cfg, datasetDir);
  } catch (e) {
    // A camera or action space the dataset cannot give is a mistake in a flag: name it.
    const arg = e instanceof DatasetError && e.code === 'unknown_camera' ? byField.get('cameras') : e instanceof DatasetError && e.code === 'bad_argument' ? byField.get('action_space') : undefined;
    if (arg) throw badValue(arg, e instanceof Error ? e.message : String(e));
    if (e instanceof DatasetError) throw new Error(`--dataset ${dataset.value}: ${e.message}`);
    throw e;
  }
  await opened.ds.checkVideos();
  fs.mkdirSync(outDir, { recursive: true });
  const eventsFile = fs.openSync(path.join(outDir, 'events.jsonl'), 'a');
  const { Engine } = await import('../engine/host.ts');
  const engine = await Engine.start({ preset: cfg.model, backend });
  process.stderr.write(`engine: ${engine.info.preset}, ${engine.info.backendLine}\n`);
  let stop = false;
  process.once('SIGINT', () => {
    stop = true;
    process.stderr.write('\nSIGINT: stopping at the next step (the last checkpoint stays resumable with the same --output)\n');
  });
  try {
    const result = await runFineTune(cfg, {
      jobId: 'local',
      datasetDir,
      openDataset: async () => opened.ds,
      workDir: outDir,
      engine,
      isCancelled: () => stop,
      emit: (type, data) => {
        fs.writeSync(eventsFile, JSON.stringify({ index: index++, type, timestamp: Date.now() / 1000, ...data }) + '\n');
        if (type === 'log') process.stderr.write(`${tty ? '\r\x1b[K' : ''}${data.message}\n`);
        if (type === 'progress') {
          const step = data.step as number;
          if (!firstStepAt) {
            firstStepAt = Date.now();
            firstStep = step;
          }
          const rate = step > firstStep ? (step - firstStep) / ((Date.now() - firstStepAt) / 1000) : 0;
          const line = progressLine(step, cfg.steps, data.loss as number | null, rate);
          const evalText = data.eval_loss !== undefined ? ` eval_loss ${(data.eval_loss as number).toFixed(4)} (mean-chunk ${(data.eval_loss_baseline_mean_chunk as number).toFixed(4)}, hold-state ${(data.eval_loss_baseline_hold_state as number).toFixed(4)})` : '';
          if (tty) process.stderr.write(`\r\x1b[K${line}${evalText ? `\n${evalText.trim()}\n` : ''}`);
          else if (evalText || step % Math.max(1, Math.floor(cfg.steps / 20)) === 0 || step === cfg.steps) process.stderr.write(line + evalText + '\n');
        }
      },
    });
    process.stderr.write(`${tty ? '\n' : ''}${result.status} after ${result.step} steps in ${fmtDuration((Date.now() - started) / 1000)}; ${result.outputDir ? `weights in ${result.outputDir}` : 'no final weights'}\n`);
    const kept = fs.existsSync(path.join(outDir, 'weights')) ? fs.readdirSync(path.join(outDir, 'weights')).filter((n) => n.startsWith('step-')).sort() : [];
    if (kept.length > 0) process.stderr.write(`checkpoints kept in ${path.join(outDir, 'weights')}: ${kept.join(', ')}\n`);
    if (result.outputDir) process.stderr.write(`serve it: vela policy ${result.outputDir}\n`);
  } finally {
    fs.closeSync(eventsFile);
    await engine.close();
  }
}
