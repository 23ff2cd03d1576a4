/**
 * `vela models download|list|inspect`: pi0 / pi0.5 checkpoints (and PaliGemma's tokenizer)
 * through the Hugging Face cache (download.ts, inspect.ts).
 */
import fs from 'node:fs';
import path from 'node:path';
import { shown, splitArgs, UsageError } from '../cli-args.ts';
import { progressPrinter } from '../hub/cli.ts';
import { downloadModel } from './download.ts';
import { ModelError } from './errors.ts';
import { cachedSnapshot, hubCacheDir, isHubRepoId } from './hf-cache.ts';
import { checkpointTokenizer, findPaligemmaTokenizer, PALIGEMMA_TOKENIZER_REPO } from './tokenizer.ts';
import { formatBytes, formatCount, inspectModel, listModels, type ModelSummary } from './inspect.ts';

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
  vela models list [FOLDER...] [--json]
      The pi0 / pi0.5 checkpoints and PaliGemma tokenizers in the Hugging Face cache, and the
      folders given: repo id or folder, revision, type, parameters, dtypes, size, norm stats, path.
  vela models inspect REPO_ID[@REVISION] | FOLDER [--json]
      One checkpoint: its config (variant, widths, depths, action horizon, token limit),
      parameter count and dtypes from the safetensors headers (no weights are read), norm stats
      (LeRobot's policy_preprocessor files, openpi's assets/*/norm_stats.json), size on disk.
`;

const HELP = 'vela models --help';

/** `vela models ...`. @throws UsageError for bad arguments; ModelError (one line) otherwise. */
export async function modelsCommand(argv: string[]): Promise<void> {
  if (argv.includes('--help') || argv.includes('-h')) return void process.stdout.write(MODELS_USAGE);
  const [sub, ...rest] = argv;
  if (sub === 'download') return download(rest);
  if (sub === 'list') return list(rest);
  if (sub === 'inspect') return inspect(rest);
  throw new UsageError(sub === undefined ? `which one? download, list or inspect (see ${HELP})` : `unknown subcommand ${shown(sub)}; the subcommands are download, list and inspect (see ${HELP})`);
}

/** Parses `vela models download` arguments against `env`. @throws UsageError naming the argument. */
export function parseModelDownloadArgs(argv: string[], env: NodeJS.ProcessEnv = process.env) {
  const { flags, positional } = splitArgs(argv, { '--revision': 'value', '--endpoint': 'value', '--token': 'value', '--include': 'value' }, HELP);
  if (positional.length !== 1) throw new UsageError(`expected one REPO_ID (namespace/name), got ${positional.length ? positional.map(shown).join(' ') : 'none'} (see ${HELP})`);
  const repoId = positional[0]!;
  if (!isHubRepoId(repoId)) throw new UsageError(`REPO_ID ${shown(repoId)}: must be namespace/name, e.g. lerobot/pi05_base`);
  const get = (f: string) => flags.findLast((x) => x.flag === f);
  const endpointArg = get('--endpoint');
  const endpoint = endpointArg?.value ?? (env.HF_ENDPOINT || 'https://huggingface.co');
  try {
    const u = new URL(endpoint);
    if (u.protocol !== 'http:' && u.protocol !== 'https:') throw new Error('not http');
  } catch {
    throw new UsageError(`${endpointArg ? endpointArg.typed : `HF_ENDPOINT=${shown(endpoint)}`}: must be an http(s) URL`);
  }
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
  if (own) return own.from;
  const cached = findPaligemmaTokenizer();
  if (cached) return `none in the folder; PaliGemma's from the Hugging Face cache (${cached})`;
  return `none in the folder, nor PaliGemma's in the Hugging Face cache: serving and training refuse without one; ${PALIGEMMA_TOKENIZER_REPO} is gated: accept its licence, set HF_TOKEN, run \`vela models download ${PALIGEMMA_TOKENIZER_REPO} --include 'tokenizer*'\``;
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
