/**
 * `vela models download|init|list|inspect|upload`: pi0 / pi0.5 checkpoints (and PaliGemma's
 * tokenizer) through the Hugging Face cache (download.ts, inspect.ts), random-weight ones written
 * offline (init-checkpoint.ts), and a checkpoint folder sent to a Hub model repo (upload.ts).
 */
import fs from 'node:fs';
import path from 'node:path';
import { choiceArg, intArg, shown, splitArgs, UsageError } from '../cli/args.ts';
import { progressPrinter } from '../hub/progress.ts';
import { downloadModel } from './download.ts';
import { ModelError } from './errors.ts';
import { cachedSnapshot, hubCacheDir, isHubRepoId } from './hf-cache.ts';
import { checkpointTokenizer, findPaligemmaTokenizer, PALIGEMMA_TOKENIZER_REPO } from './tokenizer.ts';
import { formatBytes, formatCount, inspectModel, listModels, type ModelSummary } from './inspect.ts';
import { resolveWriteToken, TOKEN_SOURCES, uploadModel } from './upload.ts';
import { INIT_SEED_MAX } from './init-seed.ts';
// Loaded by init when it runs: the model code is half a second of every `vela models` process otherwise.
import type { InitCheckpointOptions, InitCheckpointPlan } from './init-checkpoint.ts';

export const UPLOAD_USAGE = `  vela models upload FOLDER REPO_ID [--private] [--revision R] [--endpoint URL] [--token T]
      Uploads every file of a checkpoint folder (subfolders too; .git/ and .cache/ at its top
      are left out) to the Hugging Face Hub model repo REPO_ID (namespace/name) in one commit,
      creating the repo if it does not exist. Weights go as LFS objects, and those the hub
      already holds are not sent again. A folder without README.md gets a short model card
      naming what its config.json says (model, base checkpoint, dataset; unknown where it does
      not say). Progress on stderr; prints the repo's address.
      --private        create the repo private (an existing repo keeps its visibility)
      --revision R     the branch to commit to (it must exist; main always does)   [main]
      --endpoint URL   the hub's address                          [$HF_ENDPOINT or https://huggingface.co]
      --token T        a write token             [$HF_TOKEN, $HUGGING_FACE_HUB_TOKEN, $HF_HOME/token]
`;

export const MODELS_USAGE = `Usage:
  vela models download REPO_ID [--revision R] [--endpoint URL] [--token T] [--include GLOB]...
      Fetches a model repository from the Hugging Face Hub into the Hugging Face cache
      ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub), the layout LeRobot,
      openpi and transformers use: what they downloaded is found without a copy, and the other
      way round. Resumable (run it again after an interruption); each file's size and hash
      (SHA-256 for LFS files, the git blob id for the others) is checked against the hub's list
      before it enters the cache. Prints the snapshot folder.
      --revision R     branch, tag or commit                      [main]
      --endpoint URL   the hub's address                          [$HF_ENDPOINT or https://huggingface.co]
      --token T        a read token, for gated or private repos   [$HF_TOKEN]
      --include GLOB   only matching files (repeatable; * crosses /)  [all]
      PaliGemma's tokenizer (pi0 / pi0.5 use it; the repository is gated, accept its licence
      on huggingface.co first):
        vela models download google/paligemma-3b-pt-224 --include 'tokenizer*'
  vela models init FOLDER --variant pi05|pi0 [--size tiny|full] [--seed N] [--dtype bf16|f32] [--no-tokenizer] [--force] [--dry-run]
      Writes a random-weight checkpoint in the Hub base layout (config.json, model.safetensors
      keyed as lerobot/pi05_base, README.md) with a small test tokenizer (1,011 ids, NOT
      PaliGemma's), so every real-model path runs offline: vela policy --base FOLDER, fine-tunes
      and sessions with "base": FOLDER. Its actions are noise. Built in a temporary folder beside
      FOLDER and renamed into place; prints FOLDER.
      --variant pi05|pi0   which model                                              (required)
      --size tiny|full     tiny: the CI architecture, ~0.4 M parameters, ~1 MB; full: the
                           public bases' shapes (pi0.5 3.35 G parameters, 7.2 GB in bf16;
                           minutes to write, streamed tensor by tensor, ~0.3 GB of memory)  [tiny]
      --seed N             another set of values, N in 0..${INIT_SEED_MAX}     [the parity contract's]
      --dtype bf16|f32     on-disk dtype, as the public bases ship                  [bf16]
      --no-tokenizer       leave the test tokenizer out (PaliGemma's from the cache is used then)
      --force              replace FOLDER when it is not empty
      --dry-run            print the tensors, parameters and bytes; write nothing
  vela models list [FOLDER...] [--json]
      The pi0 / pi0.5 checkpoints and PaliGemma tokenizers in the Hugging Face cache, and the
      folders given: repo id or folder, revision, type, parameters, dtypes, size, norm stats, path.
  vela models inspect REPO_ID[@REVISION] | FOLDER [--json]
      One checkpoint: its config (variant, widths, depths, action horizon, token limit),
      parameter count and dtypes from the safetensors headers (no weights are read), norm stats
      (LeRobot's policy_preprocessor files, openpi's assets/*/norm_stats.json), size on disk.
${UPLOAD_USAGE}`;

const HELP = 'vela models --help';

/** `vela models ...`. @throws UsageError for bad arguments; ModelError (one line) otherwise. */
export async function modelsCommand(argv: string[]): Promise<void> {
  const [sub, ...rest] = argv;
  if (argv.includes('--help') || argv.includes('-h')) return void process.stdout.write(sub === 'upload' ? `Usage:\n${UPLOAD_USAGE}` : MODELS_USAGE);
  if (sub === 'download') return download(rest);
  if (sub === 'init') return init(rest);
  if (sub === 'list') return list(rest);
  if (sub === 'inspect') return inspect(rest);
  if (sub === 'upload') return upload(rest);
  throw new UsageError(sub === undefined ? `which one? download, init, list, inspect or upload (see ${HELP})` : `unknown subcommand ${shown(sub)}; the subcommands are download, init, list, inspect and upload (see ${HELP})`);
}

/** Parses `vela models upload` arguments against `env`. @throws UsageError naming the argument, or when no token is found. */
export function parseModelUploadArgs(argv: string[], env: NodeJS.ProcessEnv = process.env) {
  const help = 'vela models upload --help';
  const { flags, positional } = splitArgs(argv, { '--revision': 'value', '--endpoint': 'value', '--token': 'value', '--private': 'switch' }, help);
  if (positional.length !== 2) throw new UsageError(`expected FOLDER and REPO_ID (namespace/name), got ${positional.length ? positional.map(shown).join(' ') : 'none'} (see ${help})`);
  const [dir, repoId] = positional as [string, string];
  if (!isHubRepoId(repoId)) throw new UsageError(`REPO_ID ${shown(repoId)}: must be namespace/name, e.g. my-user/pi05_pusht`);
  const get = (f: string) => flags.findLast((x) => x.flag === f);
  const endpoint = hubEndpoint(get('--endpoint'), env);
  const tokenArg = get('--token');
  if (tokenArg && tokenArg.value === '') throw new UsageError(`${tokenArg.typed}: the token is empty`);
  const token = resolveWriteToken(tokenArg?.value, env);
  if (!token) throw new UsageError(`no Hugging Face token: uploading needs a write token, from ${TOKEN_SOURCES}`);
  // @huggingface/hub refuses any other token before sending it; say so here, naming where it came from.
  if (!token.startsWith('hf_')) throw new UsageError(`the Hugging Face token ${tokenArg ? `of ${tokenArg.flag}` : 'found (HF_TOKEN, HUGGING_FACE_HUB_TOKEN or the token file)'} does not start with hf_; a write token from https://huggingface.co/settings/tokens does`);
  return { dir, repoId, revision: get('--revision')?.value ?? 'main', endpoint, token, private: flags.some((f) => f.flag === '--private') };
}

async function upload(argv: string[]): Promise<void> {
  const args = parseModelUploadArgs(argv);
  process.stderr.write(`uploading ${args.dir} to ${args.repoId}@${args.revision} on ${args.endpoint}\n`);
  const started = Date.now();
  const r = await uploadModel({ ...args, onLine: (l) => process.stderr.write(l + '\n') });
  const secs = (Date.now() - started) / 1000;
  process.stderr.write(`${r.files.length} files committed to ${args.repoId}@${args.revision} (commit ${r.commit}) in ${secs.toFixed(1)} s: ${r.lfsUploaded} LFS files sent, ${r.lfsSkipped} already on the hub${r.cardAdded ? '; README.md is a generated model card (the folder had none)' : ''}\n`);
  const base = args.endpoint.replace(/\/+$/, '');
  process.stdout.write(`${base}/${args.repoId}${args.revision === 'main' ? '' : `/tree/${encodeURIComponent(args.revision)}`}\n`);
}

/** Parses `vela models init` arguments. @throws UsageError naming the argument. */
export function parseModelInitArgs(argv: string[]): { dir: string; dryRun: boolean; opts: InitCheckpointOptions } {
  const { flags, positional } = splitArgs(argv, {
    '--variant': 'value', '--size': 'value', '--seed': 'value', '--dtype': 'value', '--no-tokenizer': 'switch', '--force': 'switch', '--dry-run': 'switch',
  }, HELP);
  if (positional.length !== 1) throw new UsageError(`expected one FOLDER to write, got ${positional.length ? positional.map(shown).join(' ') : 'none'} (see ${HELP})`);
  const get = (f: string) => flags.findLast((x) => x.flag === f);
  const variantArg = get('--variant');
  if (!variantArg) throw new UsageError(`--variant pi05|pi0 is required (see ${HELP})`);
  const sizeArg = get('--size');
  const seedArg = get('--seed');
  const dtypeArg = get('--dtype');
  const has = (f: string) => flags.some((x) => x.flag === f);
  return {
    dir: positional[0]!,
    dryRun: has('--dry-run'),
    opts: {
      variant: choiceArg(variantArg, ['pi05', 'pi0'] as const),
      size: sizeArg ? choiceArg(sizeArg, ['tiny', 'full'] as const) : 'tiny',
      seed: seedArg ? intArg(seedArg, 0, INIT_SEED_MAX) : undefined,
      dtype: dtypeArg ? (choiceArg(dtypeArg, ['bf16', 'f32'] as const) === 'bf16' ? 'BF16' : 'F32') : 'BF16',
      tokenizer: !has('--no-tokenizer'),
      force: has('--force'),
    },
  };
}

function planText(p: InitCheckpointPlan): string {
  return `${p.config.variant}: ${p.tensors} tensors, ${p.values} values (${p.parameters} parameters), ${p.dtype}: ${p.dataBytes} bytes of tensor data, model.safetensors ${p.fileBytes} bytes (${formatBytes(p.fileBytes)})`;
}

async function init(argv: string[]): Promise<void> {
  const { dir, dryRun, opts } = parseModelInitArgs(argv);
  const { checkInitTarget, initCheckpoint, initCheckpointPlan } = await import('./init-checkpoint.ts');
  const plan = initCheckpointPlan(opts);
  if (dryRun) {
    process.stdout.write(`${planText(plan)}
would write ${dir}: ${plan.files.join(', ')}
`);
    return;
  }
  checkInitTarget(dir, opts.force ?? false);
  process.stderr.write(`writing a random-weight ${opts.variant} (${opts.size}) into ${dir}: ${planText(plan)}
`);
  const tty = process.stderr.isTTY;
  const started = Date.now();
  let lastDraw = 0;
  let lastTenth = 0;
  const line = (done: number, total: number) => {
    const secs = (Date.now() - started) / 1000;
    return `${formatBytes(done)} of ${formatBytes(total)} (${Math.floor((100 * done) / total)} %) in ${secs.toFixed(0)} s`;
  };
  await initCheckpoint(dir, {
    ...opts,
    // Full size takes minutes: a live line on a terminal, else a line per tenth (logs, CI).
    onProgress: (done, total) => {
      if (tty) {
        if (Date.now() - lastDraw < 200 && done < total) return;
        lastDraw = Date.now();
        process.stderr.write(`\r\x1b[K${line(done, total)}`);
      } else if (total >= 64 * 2 ** 20 && Math.floor((10 * done) / total) > lastTenth) {
        lastTenth = Math.floor((10 * done) / total);
        process.stderr.write(`${line(done, total)}\n`);
      }
    },
  }).finally(() => {
    if (tty) process.stderr.write('\n');
  });
  const tok = opts.tokenizer === false ? 'no tokenizer' : 'the test tokenizer (NOT PaliGemma\'s)';
  process.stderr.write(`wrote ${dir} in ${((Date.now() - started) / 1000).toFixed(1)} s, with ${tok}; serve it: vela policy --base ${dir}\n`);
  process.stdout.write(dir + '\n');
}

/** Parses `vela models download` arguments against `env`. @throws UsageError naming the argument. */
export function parseModelDownloadArgs(argv: string[], env: NodeJS.ProcessEnv = process.env) {
  const { flags, positional } = splitArgs(argv, { '--revision': 'value', '--endpoint': 'value', '--token': 'value', '--include': 'value' }, HELP);
  if (positional.length !== 1) throw new UsageError(`expected one REPO_ID (namespace/name), got ${positional.length ? positional.map(shown).join(' ') : 'none'} (see ${HELP})`);
  const repoId = positional[0]!;
  if (!isHubRepoId(repoId)) throw new UsageError(`REPO_ID ${shown(repoId)}: must be namespace/name, e.g. lerobot/pi05_base`);
  const get = (f: string) => flags.findLast((x) => x.flag === f);
  const endpoint = hubEndpoint(get('--endpoint'), env);
  const include = flags.filter((f) => f.flag === '--include').map((f) => f.value);
  for (const f of flags) if (f.flag === '--include' && f.value === '') throw new UsageError(`${f.typed}: the glob is empty`);
  return {
    repoId,
    revision: get('--revision')?.value ?? 'main',
    endpoint,
    token: get('--token')?.value ?? (env.HF_TOKEN || null),
    include,
    cacheDir: hubCacheDir(env),
  };
}

async function download(argv: string[]): Promise<void> {
  const args = parseModelDownloadArgs(argv);
  const tty = process.stderr.isTTY;
  process.stderr.write(`downloading ${args.repoId}@${args.revision}${args.include.length ? ` (${args.include.join(' ')})` : ''} from ${args.endpoint} into ${args.cacheDir}\n`);
  const started = Date.now();
  const result = await downloadModel({
    ...args,
    onProgress: progressPrinter(started, '(already in the cache)'),
  }).finally(() => {
    if (tty) process.stderr.write('\n');
  });
  const secs = (Date.now() - started) / 1000;
  process.stderr.write(`${result.files} files (${formatBytes(result.totalBytes)}) at commit ${result.commit}: ${formatBytes(result.transferredBytes)} fetched in ${secs.toFixed(1)} s, ${result.skipped} already in the cache\n`);
  process.stdout.write(result.snapshot + '\n');
}

function dtypesText(s: ModelSummary): string {
  const d = Object.keys(s.dtypes).sort();
  return d.length ? d.join('+') : '-';
}

async function list(argv: string[]): Promise<void> {
  const { flags, positional } = splitArgs(argv, { '--json': 'switch' }, HELP);
  const cacheDir = hubCacheDir();
  const rows = await listModels(cacheDir, positional);
  if (flags.some((f) => f.flag === '--json')) return void process.stdout.write(JSON.stringify(rows, null, 2) + '\n');
  if (rows.length === 0) {
    process.stdout.write(`no pi0 / pi0.5 checkpoint or PaliGemma tokenizer in ${cacheDir}; fetch one with: vela models download lerobot/pi05_base\n`);
    return;
  }
  const table = [['MODEL', 'REVISION', 'TYPE', 'PARAMS', 'DTYPE', 'SIZE', 'NORM STATS', 'PATH']];
  for (const r of rows) {
    table.push([r.name, r.revision ?? '-', r.kind, formatCount(r.parameters), dtypesText(r), formatBytes(r.sizeBytes), r.kind === 'tokenizer' ? '-' : r.normStats ? 'yes' : 'no', r.path]);
  }
  const widths = table[0]!.map((_, c) => Math.max(...table.map((row) => row[c]!.length)));
  process.stdout.write(table.map((row) => row.map((cell, c) => (c === row.length - 1 ? cell : cell.padEnd(widths[c]!))).join('  ')).join('\n') + '\n');
}

async function inspect(argv: string[]): Promise<void> {
  const { flags, positional } = splitArgs(argv, { '--json': 'switch' }, HELP);
  if (positional.length !== 1) throw new UsageError(`expected one REPO_ID or FOLDER, got ${positional.length ? positional.map(shown).join(' ') : 'none'} (see ${HELP})`);
  const ref = positional[0]!;
  const s = await inspectRef(ref);
  if (flags.some((f) => f.flag === '--json')) return void process.stdout.write(JSON.stringify(s, null, 2) + '\n');
  const c = s.config;
  const lines = [
    `${s.name}${s.revision ? ` @ ${s.revision}` : ''}: ${s.kind === 'unknown' ? 'not a pi0 / pi0.5 checkpoint (config.json has no type pi0 or pi05)' : s.kind}`,
    `path        ${s.path}`,
  ];
  if (c) {
    lines.push(
      `model       ${c.variant}: PaliGemma ${c.paligemmaVariant ?? '?'} (width ${c.vlmWidth ?? '?'}, ${c.vlmDepth ?? '?'} layers), action expert ${c.actionExpertVariant ?? '?'} (width ${c.expertWidth ?? '?'}, ${c.expertDepth ?? '?'} layers), vision width ${c.visionWidth ?? '?'}`,
      `actions     horizon ${c.actionHorizon ?? '?'} (${c.actionSteps ?? '?'} per call), max action dim ${c.maxActionDim ?? '?'}, max state dim ${c.maxStateDim ?? '?'}`,
      `prompt      up to ${c.tokenLimit ?? '?'} tokens`,
      `parameters  ${formatCount(s.parameters)}${s.parameters !== null ? ` (${s.parameters})` : ''}, dtypes ${Object.entries(s.dtypes).map(([d, n]) => `${d} x${n}`).join(', ') || '-'}, in ${s.weightFiles.join(', ') || 'no weight file'}`,
      `norm stats  ${s.normStats ? s.normStatsFiles.join(', ') : 'none (a fine-tune computes its dataset\'s; serving this base as it is runs unnormalised, with a warning)'}`,
      `tokenizer   ${tokenizerText(s.path)}`,
    );
  }
  lines.push(`size        ${formatBytes(s.sizeBytes)}`);
  if (s.problem) lines.push(`problem     ${s.problem}`);
  process.stdout.write(lines.join('\n') + '\n');
}

/**
 * Where serving and training this checkpoint would get its tokenizer (server/models/layout.ts
 * tokenizerFileFor): the folder's own (tokenizer.json, LeRobot's tokenizer/), else PaliGemma's in
 * the HF cache, else neither (both refuse then), with the command that fetches it.
 */
function tokenizerText(dir: string): string {
  let own;
  try {
    own = checkpointTokenizer(dir);
  } catch (e) {
    return `refused: ${(e as Error).message}`;
  }
  if (own) return testTokenizerNote(own.file) ? `${own.from}: the small test tokenizer of \`vela models init\`, NOT PaliGemma's` : own.from;
  const cached = findPaligemmaTokenizer();
  if (cached) return `none in the folder; PaliGemma's from the Hugging Face cache (${cached})`;
  return `none in the folder, nor PaliGemma's in the Hugging Face cache: serving and training refuse without one; ${PALIGEMMA_TOKENIZER_REPO} is gated: accept its licence, set HF_TOKEN, run \`vela models download ${PALIGEMMA_TOKENIZER_REPO} --include 'tokenizer*'\``;
}

/** Whether tokenizer.json's tokenizer_config.json carries the test tokenizer's `vela_note`. */
function testTokenizerNote(file: string): boolean {
  try {
    const c = JSON.parse(fs.readFileSync(path.join(path.dirname(file), 'tokenizer_config.json'), 'utf8')) as { vela_note?: unknown };
    return typeof c.vela_note === 'string';
  } catch {
    return false;
  }
}

/** A folder as given, else a Hub id in the cache (never downloads). */
async function inspectRef(ref: string): Promise<ModelSummary> {
  const looksLikePath = ref.startsWith('.') || ref.startsWith('/') || path.isAbsolute(ref);
  const at = ref.indexOf('@');
  const repoId = at < 0 ? ref : ref.slice(0, at);
  if (looksLikePath || !isHubRepoId(repoId)) return inspectModel(ref);
  if (fs.existsSync(ref)) return inspectModel(ref);
  const revision = at < 0 ? 'main' : ref.slice(at + 1);
  const cacheDir = hubCacheDir();
  const snap = cachedSnapshot(cacheDir, repoId, revision);
  if (!snap) throw new ModelError('not_downloaded', `${ref} is not in the Hugging Face cache (${cacheDir}) nor a folder; run \`vela models download ${repoId}${at < 0 ? '' : ` --revision ${revision}`}\``);
  return inspectModel(snap.dir, { name: repoId, repoId, revision, commit: snap.commit });
}

/**
 * The Hub to talk to: `--endpoint`, else HF_ENDPOINT (empty counts as unset), else huggingface.co.
 * @throws UsageError naming the flag or the variable when it is not an http(s) URL.
 */
function hubEndpoint(flag: { value: string; typed: string } | undefined, env: NodeJS.ProcessEnv): string {
  const endpoint = flag?.value ?? (env.HF_ENDPOINT || 'https://huggingface.co');
  try {
    const u = new URL(endpoint);
    if (u.protocol !== 'http:' && u.protocol !== 'https:') throw new Error('not http');
  } catch {
    throw new UsageError(`${flag ? flag.typed : `HF_ENDPOINT=${shown(endpoint)}`}: must be an http(s) URL`);
  }
  return endpoint;
}
