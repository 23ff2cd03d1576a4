/**
 * `vela datasets inspect DIR` (describe a LeRobot dataset) and `vela datasets download REPO_ID`
 * (fetch one from the Hugging Face Hub into LeRobot's cache layout, server/hub/).
 */
import fs from 'node:fs';
import path from 'node:path';
import { badValue, shown, splitArgs, UsageError } from '../cli/args.ts';
import { describeDataset, openDataset } from './index.ts';

export const DATASETS_USAGE = `Usage:
  vela datasets inspect DIR
      Prints a LeRobot dataset's episodes, frames, cameras, state/action dims and fps.
  vela datasets download REPO_ID [--revision R] [--datasets-dir DIR] [--endpoint URL] [--token T]
      Fetches a LeRobot dataset from the Hugging Face Hub into DIR/REPO_ID, LeRobot's cache
      layout: DIR is --datasets-dir, else $VELA_DATASETS_DIR, else $HF_LEROBOT_HOME, else
      $HF_HOME/lerobot, else ~/.cache/huggingface/lerobot (where vela serve looks for
      dataset_name). Resumable: run it again after an interruption. Each file's size and hash
      (SHA-256 for LFS files, the git blob id for the others) is checked against the hub's list.
      --revision R     branch, tag or commit                     [main]
      --endpoint URL   the hub's address                         [$HF_ENDPOINT or https://huggingface.co]
      --token T        for private or gated datasets             [$HF_TOKEN]
`;

/** `vela datasets inspect|download ...`. @throws UsageError for bad arguments; DatasetError naming the file. */
export async function datasetsCommand(argv: string[]): Promise<void> {
  if (argv.includes('--help') || argv.includes('-h')) return void process.stdout.write(DATASETS_USAGE);
  const [sub, ...rest] = argv;
  if (sub === 'inspect') return inspect(rest);
  if (sub === 'download') {
    const { downloadCommand } = await import('../hub/cli.ts');
    return downloadCommand(rest);
  }
  throw new UsageError(sub === undefined ? 'which one? inspect DIR or download REPO_ID (see vela datasets --help)' : `unknown subcommand ${shown(sub)}; the subcommands are inspect and download (see vela datasets --help)`);
}

async function inspect(argv: string[]): Promise<void> {
  const { positional } = splitArgs(argv, {}, 'vela datasets --help');
  if (positional.length !== 1) throw new UsageError(`expected one dataset folder, got ${positional.length ? positional.map(shown).join(' ') : 'none'} (see vela datasets --help)`);
  const dir = positional[0]!;
  if (!fs.existsSync(dir) || !fs.statSync(dir).isDirectory()) throw badValue({ flag: 'DIR', value: dir, typed: `DIR ${shown(dir)}` }, 'no such folder');
  const ds = await openDataset(path.resolve(dir)).catch((e: Error) => {
    // The reader names the file inside the dataset; say which dataset too.
    e.message = `${shown(dir)}: ${e.message}`;
    throw e;
  });
  process.stdout.write(describeDataset(ds.meta) + '\n');
}
