/**
 * `vela finetune`: the server's fine-tune job run locally, without the server: same config,
 * same training code (train.ts), same output folder layout, a live progress bar, and the events
 * as JSON lines in `<output>/events.jsonl`. `vela datasets inspect DIR` describes a dataset.
 */
import fs from 'node:fs';
import path from 'node:path';
import { describeDataset, openDataset } from '../datasets/index.ts';
import { HttpError } from '../http.ts';
import { parseFineTuneConfig } from './config.ts';
import { prepareRun, runFineTune } from './train.ts';

const FINETUNE_USAGE = `Usage: vela finetune --dataset DIR [options]

Fine-tunes a policy on a LeRobot dataset on this machine (the same job as POST /v1/fine-tunes).

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
  --eval-every N / --checkpoint-every N
  --seed N                                                              [0]
  --output DIR             output folder                                [./vela-finetune-<time>]
  --backend B              auto, node-gpu, node, wasm, cpu              [$VELA_BACKEND or auto]
`;

const FLAGS: Record<string, [string, 'int' | 'number' | 'string' | 'list']> = {
  '--model': ['model', 'string'], '--steps': ['steps', 'int'], '--batch-size': ['batch_size', 'int'], '--learning-rate': ['learning_rate', 'number'],
  '--finetune': ['finetune', 'string'], '--lora-rank': ['lora_rank', 'int'], '--lora-alpha': ['lora_alpha', 'number'], '--targets': ['targets', 'list'],
  '--cameras': ['cameras', 'list'], '--action-space': ['action_space', 'string'], '--eval-every': ['eval_every', 'int'],
  '--checkpoint-every': ['checkpoint_every', 'int'], '--seed': ['seed', 'int'], '--name': ['name', 'string'],
};

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
  const body: Record<string, unknown> = { model: 'pi05-tiny' };
  let dataset: string | null = null;
  let output: string | null = null;
  let backend = process.env.VELA_BACKEND ?? 'auto';
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i]!;
    const value = argv[++i];
    if (value === undefined) throw new Error(`${flag} needs a value (see vela finetune --help)`);
    if (flag === '--dataset') dataset = value;
    else if (flag === '--output') output = value;
    else if (flag === '--backend') backend = value;
    else if (FLAGS[flag]) {
      const [key, kind] = FLAGS[flag]!;
      body[key] = kind === 'list' ? value.split(',').map((s) => s.trim()) : kind === 'string' ? value : Number(value);
    } else throw new Error(`unknown option ${flag} (see vela finetune --help)`);
  }
  if (!dataset) throw new Error('--dataset DIR is required (see vela finetune --help)');
  const datasetDir = path.resolve(dataset);
  body.dataset_name = datasetDir;
  let cfg;
  try {
    cfg = parseFineTuneConfig(body);
  } catch (e) {
    throw new Error(e instanceof HttpError ? e.message.replace(/\b(batch_size|learning_rate|lora_rank|lora_alpha|eval_every|checkpoint_every|action_space)\b/g, (m) => `--${m.replace(/_/g, '-')}`) : (e as Error).message);
  }
  const outDir = path.resolve(output ?? `vela-finetune-${new Date().toISOString().replace(/[:.]/g, '-').slice(0, 19)}`);
  let index = 0;
  const tty = process.stderr.isTTY;
  const started = Date.now();
  let firstStepAt = 0;
  let firstStep = 0;
  // Validate the dataset before any work (a missing or corrupt file is named), then reuse it.
  process.stderr.write(`vela finetune: ${cfg.model} on ${datasetDir} -> ${outDir}\n`);
  const opened = await prepareRun(cfg, datasetDir);
  await opened.ds.checkVideos();
  fs.mkdirSync(outDir, { recursive: true });
  const eventsFile = fs.openSync(path.join(outDir, 'events.jsonl'), 'a');
  const { Engine } = await import('../engine/host.ts');
  const engine = await Engine.start({ preset: cfg.model, backend });
  process.stderr.write(`engine: ${engine.info.preset} on ${engine.info.backend}\n`);
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
  } finally {
    fs.closeSync(eventsFile);
    await engine.close();
  }
}

/** `vela datasets inspect DIR`: print the dataset's description. @throws DatasetError naming the file. */
export async function datasetsCommand(argv: string[]): Promise<void> {
  const [sub, dir] = argv;
  if (sub !== 'inspect' || !dir || argv.includes('--help') || argv.includes('-h')) {
    process.stdout.write('Usage: vela datasets inspect DIR\n\nPrints a LeRobot dataset\'s episodes, frames, cameras, state/action dims and fps.\n');
    if (!argv.includes('--help') && !argv.includes('-h')) process.exitCode = 2;
    return;
  }
  const ds = await openDataset(path.resolve(dir));
  process.stdout.write(describeDataset(ds.meta) + '\n');
}
