/**
 * `vela datasets download REPO_ID [--revision R] [--datasets-dir DIR] [--endpoint URL] [--token T]`:
 * download.ts with a progress bar on stderr, then the dataset is opened (every file it needs is
 * named if missing) and described.
 */
import path from 'node:path';
import { shown, splitArgs, UsageError } from '../cli/args.ts';
import { defaultDatasetsDir } from '../config.ts';
import { describeDataset, openDataset } from '../datasets/index.ts';
import { downloadDataset, HubError } from './download.ts';
import { mb, progressPrinter } from './progress.ts';

export { downloadProgressLine, progressPrinter } from './progress.ts';

const HELP = 'vela datasets --help';

/** Parses the arguments. @throws UsageError naming the argument. */
export function parseDownloadArgs(argv: string[], env: NodeJS.ProcessEnv = process.env) {
  const { flags, positional } = splitArgs(argv, { '--revision': 'value', '--datasets-dir': 'value', '--endpoint': 'value', '--token': 'value' }, HELP);
  if (positional.length !== 1) throw new UsageError(`expected one REPO_ID (namespace/name), got ${positional.length ? positional.map(shown).join(' ') : 'none'} (see ${HELP})`);
  const get = (f: string) => flags.findLast((x) => x.flag === f);
  const repoId = positional[0]!;
  if (!/^[A-Za-z0-9][\w.-]*(\/[A-Za-z0-9][\w.-]*)?$/.test(repoId) || repoId.includes('..')) throw new UsageError(`REPO_ID ${shown(repoId)}: must be namespace/name, e.g. lerobot/pusht`);
  const endpointArg = get('--endpoint');
  const endpoint = endpointArg?.value ?? env.HF_ENDPOINT ?? 'https://huggingface.co';
  try {
    const u = new URL(endpoint);
    if (u.protocol !== 'http:' && u.protocol !== 'https:') throw new Error('not http');
  } catch {
    throw new UsageError(`${endpointArg ? endpointArg.typed : `HF_ENDPOINT=${shown(endpoint)}`}: must be an http(s) URL`);
  }
  const root = get('--datasets-dir')?.value ?? (env.VELA_DATASETS_DIR || defaultDatasetsDir(env));
  return {
    repoId,
    revision: get('--revision')?.value ?? 'main',
    endpoint,
    token: get('--token')?.value ?? (env.HF_TOKEN || null),
    dest: path.resolve(root, ...repoId.split('/')),
  };
}

/** The `vela datasets download` command. @throws UsageError, HubError (one line each). */
export async function downloadCommand(argv: string[]): Promise<void> {
  const args = parseDownloadArgs(argv);
  const tty = process.stderr.isTTY;
  process.stderr.write(`downloading ${args.repoId}@${args.revision} from ${args.endpoint} into ${args.dest}\n`);
  const started = Date.now();
  const result = await downloadDataset({
    ...args,
    onProgress: progressPrinter(started, '(already here, verified)'),
  }).catch((e) => {
    if (tty) process.stderr.write('\n');
    throw e instanceof HubError ? new Error(e.message) : e;
  });
  if (tty) process.stderr.write('\n');
  const secs = (Date.now() - started) / 1000;
  process.stderr.write(`${result.files} files (${mb(result.totalBytes)} MB) at commit ${result.commit}: ${mb(result.transferredBytes)} MB fetched in ${secs.toFixed(1)} s, ${result.skipped} already here\n`);
  const ds = await openDataset(args.dest);
  process.stdout.write(describeDataset(ds.meta) + '\n');
  process.stderr.write(`train on it: vela finetune --dataset ${args.dest}\n(or, with vela serve on the same datasets root: "dataset_name": "${args.repoId}")\n`);
}
