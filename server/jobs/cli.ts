/**
 * `vela finetune`: the server's fine-tune job run locally, without the server: same config,
 * same training code (train.ts), same output folder layout, a live progress bar, and the events
 * as JSON lines in `<output>/events.jsonl`.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { badValue, splitArgs, UsageError, type FlagArg } from '../cli/args.ts';
import { BACKEND_CHOICES } from '../config.ts';
import { DatasetError, openDataset } from '../datasets/index.ts';
import { FieldError, parseFineTuneConfig, type FineTuneConfig, type MemoryPlanNote } from './config.ts';
import { RECIPE, defaultFinetune, defaultLora } from './recipes.ts';
import { noEvaluationReason, prepareRun, runFineTune, writeJsonAtomic } from './train.ts';
import { trainingRecord, writeTrainingRecord } from './record.ts';
import { engineModelOf, planFineTune, realEngineModel } from './base.ts';
import { isRealModel } from '../models/bases.ts';
import { tokenizerFileFor } from '../models/layout.ts';
import { cliModelsDir, resolveBase } from '../models/resolve.ts';

/** Where `vela finetune` writes without --output: outside any repository, under the user's cache. */
export function defaultFinetuneRoot(env: NodeJS.ProcessEnv = process.env): string {
  return path.join(env.XDG_CACHE_HOME || path.join(os.homedir(), '.cache'), 'vela', 'finetunes');
}

// The defaults shown are server/jobs/recipes.ts's, the ones every surface fills in.
const REAL_LORA = defaultLora(true);
const PRESET_LORA = defaultLora(false);

export const FINETUNE_USAGE = `Usage: vela finetune --dataset DIR [options]

Fine-tunes a policy on a LeRobot dataset on this machine (the same job as POST /v1/fine-tunes),
then prints the held-out evaluation: the policy's MSE next to holding the current state and the
training set's mean chunk. Each evaluation line gives the MSE of sampled action chunks against
the recorded ones, as a ratio to those two baselines (below 1 beats them), and the flow-matching
loss (the training objective) on the same frames.

Writes weights/step-N at each checkpoint and weights/final (each one a folder that vela policy
serves), norm stats, and events.jsonl to the output folder; for pi0 / pi05 also model/, the
result as a base checkpoint (Hub layout, LoRA merged in) for --base of a later run. Interrupted (Ctrl-C), the same
command resumes from the last checkpoint; an output folder holding a finished run, or a run
started with other settings, is refused rather than mixed.

Options (defaults in brackets: the recipe measured in bench/results/recipe.md):
  --dataset DIR            LeRobot dataset folder (v2.x or v3.0)       [required]
  --model NAME             pi0, pi05 (the real models, on --base), or the small presets
                           flow0-tiny, flow05-tiny, flow0-small, flow05-small  [${RECIPE.model}]
                           (old names pi0-tiny ... still work; see vela presets)
  --base REF               pi0 / pi05: a Hub id in the Hugging Face cache (vela models
                           download) or a checkpoint folder: a path, or a name under
                           --models-dir  [lerobot/pi0_base, lerobot/pi05_base]
  --models-dir DIR         where --base names are looked up [$VELA_MODELS_DIR, else
                           $VELA_DATA_DIR/models, else ./vela-data/models: the server's]
  --steps N                optimizer steps                              [${RECIPE.steps}]
  --batch-size N           datums per step                              [${RECIPE.batch_size}]
  --micro-batch-size N     datums per taped pass, summed into one step  [the memory plan's]
  --learning-rate X        peak learning rate                           [${RECIPE.learning_rate}]
  --warmup-steps N         linear warm-up steps                         [steps / 10, at most 100]
  --lr-floor X             cosine decay ends at X * learning rate       [${RECIPE.lr_floor}]
  --adam-eps X / --weight-decay X   AdamW                               [${RECIPE.adam_eps} / ${RECIPE.weight_decay}]
  --ema-decay X            moving average of the weights, evaluated and exported; 0 = none [${RECIPE.ema_decay}]
  --augment true|false     random crop, rotation and colour jitter of training frames [${RECIPE.augment}]
  --time-sampling beta|uniform   flow-matching time distribution in training [${RECIPE.time_sampling}]
  --rtc-max-delay N        training-time real-time chunking: a random delay 0..N per datum, N
                           below the action horizon (0..63); the policy then serves RTC's
                           prefix mode (docs/PROTOCOL.md section 6); 0 = off [0]
  --finetune lora|full     [${defaultFinetune(true)} on pi0 / pi05 (a pretrained base); ${defaultFinetune(false)} on a preset (seeded)]
  --lora-rank N / --lora-alpha X   with --finetune lora  [pi0 / pi05: ${REAL_LORA.rank} / ${REAL_LORA.alpha}, the action expert ${REAL_LORA.action_rank} / ${REAL_LORA.action_alpha} (openpi's); presets ${PRESET_LORA.rank} / ${PRESET_LORA.alpha}]
  --targets a,b            LoRA targets: attn, mlp, action_expert, prefix_expert, all [all]
  --cameras a,b            camera names                                 [every camera]
  --action-space delta|absolute                                         [delta when names match]
  --eval-fraction X        share of episodes held out (0: none, no evaluation)  [${RECIPE.eval_fraction}]
  --eval-episodes a,b      hold out these episodes instead
  --eval-dataset DIR       evaluate on every episode of this dataset; train on all of --dataset
  --eval-stride N          score every Nth frame of the held-out episodes [${RECIPE.eval_stride}]
  --eval-every N           steps between held-out evals (0: at the end) [steps/4, at most 500]
  --checkpoint-every N     steps between kept checkpoints               [as --eval-every's default]
  --seed N                                                              [0]
  --name NAME              a name for the run                           [none]
  --output DIR             output folder                                [${path.join('~/.cache/vela/finetunes', '<dataset>-<time>')}]
  --backend B              ${BACKEND_CHOICES.join(', ')}              [$VELA_BACKEND or auto]
`;

/** Flag -> [config field, how the value is read]. */
const FLAGS: Record<string, [string, 'int' | 'number' | 'string' | 'list' | 'ints' | 'bool']> = {
  '--model': ['model', 'string'], '--base': ['base', 'string'], '--steps': ['steps', 'int'], '--batch-size': ['batch_size', 'int'], '--micro-batch-size': ['micro_batch_size', 'int'], '--learning-rate': ['learning_rate', 'number'],
  '--finetune': ['finetune', 'string'], '--lora-rank': ['lora_rank', 'int'], '--lora-alpha': ['lora_alpha', 'number'], '--targets': ['targets', 'list'],
  '--cameras': ['cameras', 'list'], '--action-space': ['action_space', 'string'], '--eval-every': ['eval_every', 'int'],
  '--checkpoint-every': ['checkpoint_every', 'int'], '--seed': ['seed', 'int'], '--name': ['name', 'string'],
  '--eval-fraction': ['eval_fraction', 'number'], '--eval-episodes': ['eval_episodes', 'ints'], '--eval-stride': ['eval_stride', 'int'],
  '--warmup-steps': ['warmup_steps', 'int'], '--lr-floor': ['lr_floor', 'number'], '--adam-eps': ['adam_eps', 'number'], '--weight-decay': ['weight_decay', 'number'],
  '--ema-decay': ['ema_decay', 'number'],
  '--augment': ['augment', 'bool'],
  '--time-sampling': ['time_sampling', 'string'],
  '--rtc-max-delay': ['rtc_max_delay', 'int'],
};
const SPEC = Object.fromEntries([...Object.keys(FLAGS), '--dataset', '--eval-dataset', '--output', '--backend', '--models-dir'].map((f) => [f, 'value' as const]));
const HELP = 'vela finetune --help';

/** A config message with its field names spelled as this command's flags (`eval_fraction` -> `--eval-fraction`). */
function flagNames(message: string): string {
  // `base` is also a plain word of messages ("seeded base weights"); its errors name --base themselves.
  const fields = [...Object.values(FLAGS).map(([key]) => key).filter((k) => k !== 'base'), 'eval_dataset', 'dataset_name'];
  return message.replace(new RegExp(`\\b(${fields.join('|')})\\b`, 'g'), (key) => (key === 'dataset_name' ? '--dataset' : `--${key.replace(/_/g, '-')}`));
}

/** A flag's number as typed: decimal, with an optional exponent (what JSON takes; not 0x1, not Infinity). */
const DECIMAL = /^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/;

/** The settings a run in an --output folder was started with (what a resume must repeat). */
export const RUN_FILE = 'run.json';

/**
 * An --output folder takes a new run (it is empty or new), or resumes the interrupted run in it
 * (resume.json) with the same settings; a finished run (weights/final) is never overwritten and
 * two runs never mix their checkpoints and events.
 * @throws UsageError naming --output and, for a resume, each setting that differs.
 */
function checkOutputFolder(arg: FlagArg, dir: string, cfg: FineTuneConfig): void {
  if (!fs.existsSync(dir)) return;
  if (!fs.statSync(dir).isDirectory()) throw badValue(arg, 'is a file, not a folder');
  const has = (...p: string[]) => fs.existsSync(path.join(dir, ...p));
  if (has('resume.json')) {
    let saved: Record<string, unknown>;
    try {
      saved = JSON.parse(fs.readFileSync(path.join(dir, RUN_FILE), 'utf8'));
    } catch {
      return; // a run from before run.json: resumed as it comes
    }
    const now = cfg as unknown as Record<string, unknown>;
    // engine_model is the base's folder, resolved after this check (the same base gives the same one).
    // micro_batch_size and the memory plan do not change what a step computes (to float32 rounding), only its memory.
    const same = new Set(['engine_model', 'micro_batch_size', 'memory_plan']);
    const differs = Object.keys(now).filter((k) => !same.has(k) && JSON.stringify(now[k]) !== JSON.stringify(saved[k]));
    if (differs.length > 0) {
      const was = differs.map((k) => `${k} ${JSON.stringify(saved[k])} (now ${JSON.stringify(now[k])})`).join(', ');
      throw badValue(arg, flagNames(`holds an interrupted run started with ${was}: give the same settings to resume it, or a new --output`));
    }
    return;
  }
  if (has('weights', 'final')) throw badValue(arg, 'holds a finished run (weights/final): give a new --output (a finished run is never overwritten)');
  if (has('weights') || has('states')) throw badValue(arg, 'holds checkpoints of another run but nothing to resume: give a new --output');
}

/**
 * The job config and local options from `vela finetune`'s arguments.
 * @throws UsageError naming the flag and the value as typed (`--steps abc: must be an integer in 1..1000000`).
 */
export function parseFinetuneArgs(argv: string[], env: NodeJS.ProcessEnv = process.env) {
  const { flags, positional } = splitArgs(argv, SPEC, HELP);
  if (positional.length > 0) throw new UsageError(`unexpected argument ${positional[0]} (options take the form --name value; see ${HELP})`);
  const body: Record<string, unknown> = {};
  const byField = new Map<string, FlagArg>();
  let dataset: FlagArg | null = null;
  let outputArg: FlagArg | null = null;
  let modelsDirArg: string | undefined;
  let backend = env.VELA_BACKEND || 'auto';
  for (const f of flags) {
    if (f.flag === '--dataset') dataset = f;
    else if (f.flag === '--eval-dataset') {
      const dir = path.resolve(f.value);
      if (!fs.existsSync(dir) || !fs.statSync(dir).isDirectory()) throw badValue(f, 'no such folder');
      body.eval_dataset = dir;
      byField.set('eval_dataset', f);
    } else if (f.flag === '--output') outputArg = f;
    else if (f.flag === '--models-dir') modelsDirArg = f.value;
    else if (f.flag === '--backend') {
      if (!(BACKEND_CHOICES as string[]).includes(f.value)) throw badValue(f, `must be one of ${BACKEND_CHOICES.join(', ')}`);
      backend = f.value;
    } else {
      const [key, kind] = FLAGS[f.flag]!;
      byField.set(key, f);
      // A value that is not a number goes through as typed: the config check names the rule.
      const num = (x: string) => (DECIMAL.test(x.trim()) ? Number(x) : x);
      const list = () => f.value.split(',').map((x) => x.trim());
      const truth = f.value === 'true' ? true : f.value === 'false' ? false : f.value; // anything else: the config's rule
      body[key] = kind === 'bool' ? truth : kind === 'list' ? list() : kind === 'ints' ? list().map(num) : kind === 'string' ? f.value : num(f.value);
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
    if (arg) throw badValue(arg, flagNames([(e as FieldError).rule, (e as FieldError).hint].filter(Boolean).join(': ')));
    throw new UsageError(flagNames((e as Error).message));
  }
  const stamp = new Date().toISOString().replace(/[:.]/g, '-').slice(0, 19);
  const outDir = path.resolve(outputArg?.value ?? path.join(defaultFinetuneRoot(env), `${path.basename(datasetDir)}-${stamp}`));
  if (outputArg) checkOutputFolder(outputArg, outDir, cfg);
  return { cfg, datasetDir, dataset, outDir, backend, byField, modelsDir: cliModelsDir(modelsDirArg, env) };
}

const f4 = (x: unknown) => (typeof x === 'number' && Number.isFinite(x) ? (Math.abs(x) >= 0.01 || x === 0 ? x.toFixed(4) : x.toExponential(3)) : String(x));
const ratio = (x: unknown) => (typeof x === 'number' && Number.isFinite(x) ? `${x.toFixed(2)}x` : '-');

/**
 * The held-out evaluation of a progress record as a table: MSE of the policy, of holding the
 * state and of the training mean chunk (and the policy's ratio to each), overall and per action
 * group, in the normalised absolute-action space; the overall line again in raw units.
 * Returns '' for a record without an evaluation.
 */
export function evalSummary(record: Record<string, unknown>): string {
  if (typeof record.eval_mse !== 'number') return '';
  type Row = { mse: number; mse_hold_state: number; mse_mean_chunk: number; ratio_hold_state: number; ratio_mean_chunk: number };
  const line = (label: string, r: Row) =>
    `  ${label.padEnd(12)} ${f4(r.mse).padStart(10)} ${f4(r.mse_hold_state).padStart(10)} ${ratio(r.ratio_hold_state).padStart(7)} ${f4(r.mse_mean_chunk).padStart(10)} ${ratio(r.ratio_mean_chunk).padStart(7)}`;
  const groups = (record.eval_groups as (Row & { group: string })[] | undefined) ?? [];
  return [
    `held-out evaluation at step ${record.step}: ${record.eval_frames} frames, MSE of ${record.eval_horizon ?? '?'}-step chunks (${record.eval_num_steps ?? '?'} Euler steps), normalised absolute actions`,
    `  ${''.padEnd(12)} ${'policy'.padStart(10)} ${'hold state'.padStart(10)} ${'ratio'.padStart(7)} ${'mean chunk'.padStart(10)} ${'ratio'.padStart(7)}`,
    line('all', { mse: record.eval_mse, mse_hold_state: record.eval_mse_hold_state, mse_mean_chunk: record.eval_mse_mean_chunk, ratio_hold_state: record.eval_ratio_hold_state, ratio_mean_chunk: record.eval_ratio_mean_chunk } as Row),
    ...groups.map((g) => line(g.group, g)),
    line('all (raw)', record.eval_raw as Row),
  ].join('\n') + '\n';
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
 * The real model's base folder (undefined for a preset), cfg.engine_model set: a path from the
 * working directory, a name under `modelsDir`, or a Hub id that must be in the Hugging Face cache
 * (this command does not download, and its refusal says so: `vela models download`, then run it again).
 * @throws UsageError naming the flag: the resolver's or the tokenizer's one line.
 */
async function localBase(cfg: FineTuneConfig, arg: FlagArg | undefined, modelsDir: string): Promise<string | undefined> {
  if (!isRealModel(cfg.model) || !cfg.base) return undefined;
  const refuse = (e: unknown): never => {
    throw arg ? badValue(arg, (e as Error).message) : new UsageError(`--base ${cfg.base}: ${(e as Error).message}`);
  };
  const dir = await resolveBase(cfg.base, { modelsDir, serverDownloads: false }).then((r) => r.dir, refuse);
  try {
    tokenizerFileFor(dir);
  } catch (e) {
    refuse(e);
  }
  cfg.engine_model = realEngineModel(cfg, dir);
  return dir;
}

/**
 * `vela finetune`'s memory plan of a real base, once the dataset's cameras are known: one line,
 * exit 1, before loading; its fixes are spelled as this command's flags (the server's name fields).
 * Resolves the micro-batch the run accumulates in (undefined for a preset: the whole batch).
 */
async function planLocal(cfg: FineTuneConfig, baseDir: string | undefined): Promise<MemoryPlanNote | undefined> {
  if (!baseDir) return undefined;
  return planFineTune(cfg, baseDir, { maxMemory: process.env.VELA_MAX_MEMORY || undefined, capName: 'VELA_MAX_MEMORY' }).catch((e: Error) => {
    e.message = e.message.replace('lower batch_size', 'lower --batch-size').replace('lower micro_batch_size', 'lower --micro-batch-size').replace('use LoRA (the default) instead of a full fine-tune', 'use --finetune lora (the default) instead of a full fine-tune');
    throw e;
  });
}

/**
 * `vela finetune`: validate the config and dataset, start an engine, run the job with a progress bar
 * on stderr, write events.jsonl and the outputs under --output.
 * @throws Error for bad flags or a bad dataset (one line, naming the flag or file).
 */
export async function finetuneCommand(argv: string[]): Promise<void> {
  if (argv.includes('--help') || argv.includes('-h')) return void process.stdout.write(FINETUNE_USAGE);
  const { cfg, datasetDir, dataset, outDir, backend, byField, modelsDir } = parseFinetuneArgs(argv);
  let index = 0;
  const tty = process.stderr.isTTY;
  const started = Date.now();
  let firstStepAt = 0;
  let firstStep = 0;
  // Validate the dataset before any work (a missing or corrupt file is named), then reuse it.
  process.stderr.write(`vela finetune: ${cfg.model}${cfg.base ? ` (base ${cfg.base})` : ''} on ${datasetDir} -> ${outDir}\n`);
  const evalDatasetDir = cfg.eval_dataset ?? undefined;
  const baseDir = await localBase(cfg, byField.get('base') ?? byField.get('model'), modelsDir);
  let opened;
  try {
    opened = await prepareRun(cfg, datasetDir, openDataset, evalDatasetDir, baseDir);
  } catch (e) {
    // A camera, action space, held-out episode or eval dataset the data cannot give is a mistake in a flag: name it.
    if (e instanceof FieldError && byField.get(e.field)) throw badValue(byField.get(e.field)!, e.rule);
    const arg = e instanceof DatasetError && e.code === 'unknown_camera' ? byField.get('cameras') : e instanceof DatasetError && e.code === 'bad_argument' ? byField.get('action_space') : undefined;
    if (arg) throw badValue(arg, e instanceof Error ? e.message : String(e));
    if (e instanceof DatasetError) throw new Error(`--dataset ${dataset.value}: ${e.message}`);
    throw e;
  }
  await opened.ds.checkVideos();
  if (opened.evalDs !== opened.ds) await opened.evalDs.checkVideos();
  const memoryPlan = await planLocal({ ...cfg, cameras: cfg.cameras ?? opened.cameras }, baseDir);
  if (memoryPlan) cfg.memory_plan = memoryPlan; // the micro-batch the run accumulates in (train.ts)
  fs.mkdirSync(outDir, { recursive: true });
  const runFile = path.join(outDir, RUN_FILE);
  if (!fs.existsSync(path.join(outDir, 'resume.json'))) writeJsonAtomic(runFile, cfg); // a new run (a resume keeps the first)
  // A resumed run's events continue its log, as a server job's do.
  const eventsPath = path.join(outDir, 'events.jsonl');
  index = fs.existsSync(eventsPath) ? fs.readFileSync(eventsPath, 'utf8').split('\n').filter((l) => l.trim()).length : 0;
  const eventsFile = fs.openSync(eventsPath, 'a');
  const { Engine } = await import('../engine/host.ts');
  const engine = await Engine.start({ preset: engineModelOf(cfg), backend });
  process.stderr.write(`engine: ${engine.info.preset}, ${engine.info.backendLine}\n`);
  let stop = false;
  let lastEval: Record<string, unknown> | null = null;
  process.once('SIGINT', () => {
    stop = true;
    process.stderr.write('\nSIGINT: stopping at the next step (the last checkpoint stays resumable with the same --output)\n');
  });
  try {
    const result = await runFineTune(cfg, {
      jobId: 'local',
      datasetDir,
      evalDatasetDir,
      baseDir,
      openDataset: async (dir) => (dir === evalDatasetDir ? opened.evalDs : opened.ds),
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
          const evalText = typeof data.eval_mse === 'number'
            ? ` held-out MSE ${f4(data.eval_mse)} = ${ratio(data.eval_ratio_hold_state)} hold-state (${f4(data.eval_mse_hold_state)}), ${ratio(data.eval_ratio_mean_chunk)} mean-chunk; flow-matching loss ${f4(data.eval_loss)}`
            : '';
          if (evalText) lastEval = data;
          if (tty) process.stderr.write(`\r\x1b[K${line}${evalText ? `\n${evalText.trim()}\n` : ''}`);
          else if (evalText || step % Math.max(1, Math.floor(cfg.steps / 20)) === 0 || step === cfg.steps) process.stderr.write(line + evalText + '\n');
        }
      },
    });
    // What `vela models upload` of the model writes its card's Training section from.
    if (result.status === 'succeeded') for (const dir of new Set([result.modelDir ?? result.outputDir!, result.outputDir!])) await writeTrainingRecord(dir, trainingRecord(null, cfg, lastEval));
    process.stderr.write(`${tty ? '\n' : ''}${result.status} after ${result.step} steps in ${fmtDuration((Date.now() - started) / 1000)}; ${result.outputDir ? `weights in ${result.outputDir}` : 'no final weights'}\n`);
    const kept = fs.existsSync(path.join(outDir, 'weights')) ? fs.readdirSync(path.join(outDir, 'weights')).filter((n) => n.startsWith('step-')).sort() : [];
    if (kept.length > 0) process.stderr.write(`checkpoints kept in ${path.join(outDir, 'weights')}: ${kept.join(', ')}\n`);
    if (result.outputDir) process.stderr.write(`serve it: vela policy ${result.outputDir}\n`);
    if (result.modelDir) process.stderr.write(`as a base: --base ${result.modelDir}\n`);
    if (lastEval) process.stderr.write(evalSummary(lastEval));
    else if (result.status === 'succeeded') process.stderr.write(`held-out evaluation: none (${flagNames(noEvaluationReason(cfg, opened.split))})\n`);
  } finally {
    fs.closeSync(eventsFile);
    await engine.close();
  }
}
