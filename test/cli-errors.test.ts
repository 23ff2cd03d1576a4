/**
 * The exact words `vela` prints for a mistake on its command line, for every command and flag
 * (issue 14): one line naming the flag and the value as typed, exit code 2, no stack trace; a
 * failure that is not a usage mistake is one line with exit code 1; `--debug` adds the stack.
 * Most cases run `runCli` in-process (fast); two run the real `bin/vela.js` to show the process's
 * exit code and stderr. `vela serve --help` is compared with a snapshot file.
 */
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { runCli, SERVE_USAGE } from '../server/cli/main.ts';
import { SETTINGS } from '../server/config.ts';
import { G1_DIR } from '../bench/harness/g1.ts';

const REPO = path.resolve(import.meta.dirname, '..');
const rel = path.relative(REPO, G1_DIR); // datasets/g1_pick_bottle_sample
const MODELS = 'flow0-tiny, flow05-tiny, flow0-small, flow05-small, pi0-tiny, pi05-tiny, pi0-small, pi05-small';

async function cli(argv: string[], env: Record<string, string> = {}): Promise<{ code: number; text: string }> {
  const saved = { ...process.env };
  const cwd = process.cwd();
  Object.assign(process.env, env);
  process.chdir(REPO);
  let text = '';
  try {
    const code = await runCli(argv, (t) => (text += t));
    return { code, text };
  } finally {
    process.env = saved;
    process.chdir(cwd);
  }
}

const ft = (...args: string[]) => ['finetune', '--dataset', rel, ...args];

// [argv, the exact line printed]; every one exits 2.
const USAGE_CASES: [string[], string][] = [
  [ft('--steps', 'abc'), 'vela finetune: --steps abc: must be an integer in 1..1000000'],
  [ft('--steps=1.5'), 'vela finetune: --steps=1.5: must be an integer in 1..1000000'],
  [ft('--model', 'pi9'), `vela finetune: --model pi9: must be one of pi0, pi05 (the real models, on a base checkpoint) or the presets ${MODELS}`],
  [ft('--batch-size', '0'), 'vela finetune: --batch-size 0: must be an integer in 1..1024'],
  [ft('--learning-rate', 'fast'), 'vela finetune: --learning-rate fast: must be > 0 and <= 1'],
  [ft('--learning-rate', '2'), 'vela finetune: --learning-rate 2: must be > 0 and <= 1'],
  [ft('--finetune', 'half'), 'vela finetune: --finetune half: must be "lora" or "full"'],
  [ft('--finetune', 'lora', '--lora-rank', '0'), 'vela finetune: --lora-rank 0: must be an integer in 1..256'],
  [ft('--finetune', 'lora', '--lora-alpha', '-1'), 'vela finetune: --lora-alpha -1: must be a number > 0'],
  [ft('--lora-rank', '8'), 'vela finetune: --lora-rank 8: applies to --finetune "lora" only: this fine-tune is "full" (the default on seeded base weights), which trains every weight; leave --lora-rank out, or add --finetune "lora"'],
  [ft('--model', 'flow05-tiny', '--finetune', 'lora', '--targets', 'attn'), 'vela finetune: --targets attn: must include action_expert or all for LoRA on pi0.5 with seeded base weights: its adaptive-norm gates (the action expert\'s ada1/ada2 Linears) start at zero (adaLN-Zero), so adapters anywhere else get exactly zero gradient; or train in full'],
  [ft('--finetune', 'lora', '--targets', 'attn,ffn'), 'vela finetune: --targets attn,ffn: must be a non-empty list of attn, mlp, action_expert, prefix_expert, all'],
  [ft('--cameras', 'wrist'), 'vela finetune: --cameras wrist: camera "wrist" is not in the dataset; its cameras are cam_high'],
  [ft('--action-space', 'sideways'), 'vela finetune: --action-space sideways: must be "delta" or "absolute"'],
  [ft('--eval-every', '-1'), 'vela finetune: --eval-every -1: must be an integer in 0..1000000'],
  [ft('--checkpoint-every', '0'), 'vela finetune: --checkpoint-every 0: must be an integer in 1..1000000'],
  [ft('--seed', 'x'), 'vela finetune: --seed x: must be an integer in 0..2147483647'],
  [ft('--time-sampling', 'normal'), 'vela finetune: --time-sampling normal: must be "beta" or "uniform"'],
  [ft('--weight-decay', '0x1'), 'vela finetune: --weight-decay 0x1: must be a number in [0, 1]'],
  [ft('--augment', 'yes'), 'vela finetune: --augment yes: must be true or false'],
  [ft('--eval-episodes', '1,2', '--eval-fraction', '0.3'), 'vela finetune: give --eval-episodes or --eval-fraction, not both (--eval-fraction 0.3)'],
  [ft('--eval-episodes', '99'), 'vela finetune: --eval-episodes 99: must be episodes of the dataset (episodes 0..2, 3 of them); not in it'],
  [ft('--warmup-steps', '10', '--steps', '5'), 'vela finetune: --warmup-steps 10: must be an integer in 0..5'],
  [ft('--name', 'x'.repeat(129)), `vela finetune: --name ${'x'.repeat(129)}: must be a string of at most 128 characters`],
  [ft('--backend', 'gpu'), 'vela finetune: --backend gpu: must be one of auto, node-gpu, node, wasm, cpu'],
  [ft('--name'), 'vela finetune: --name needs a value (see vela finetune --help)'],
  [ft('--stpes', '5'), 'vela finetune: unknown option --stpes (did you mean --steps? see vela finetune --help)'],
  [ft('300'), 'vela finetune: unexpected argument 300 (options take the form --name value; see vela finetune --help)'],
  [['finetune', '--dataset', './nope'], 'vela finetune: --dataset ./nope: no such folder'],
  [['finetune', '--steps', '5'], 'vela finetune: --dataset DIR is required (see vela finetune --help)'],
  [['policy'], 'vela policy: expected one CHECKPOINT folder or --base <hub id | folder>, got none (see vela policy --help)'],
  [['policy', 'ck', '--base'], 'vela policy: --base needs a value (see vela policy --help)'],
  [['policy', '--base', 'lerobot/pi05_base', '--model', 'pi1'], 'vela policy: --model pi1: must be one of pi0, pi05'],
  [['policy', 'ck', '--cameras', 'cam_high'], 'vela policy: --cameras applies to --base alone: a checkpoint\'s config.json binds its cameras (see vela policy --help)'],
  [['policy', './nope'], 'vela policy: CHECKPOINT ./nope: no such folder'],
  [['policy', rel], `vela policy: CHECKPOINT ${rel}: has no config.json; a checkpoint is a folder such as <output>/weights/final or <output>/weights/step-N of vela finetune`],
  [['policy', 'ck', '--port', 'abc'], 'vela policy: --port abc: must be an integer in 0..65535'],
  [['policy', 'ck', '--port=70000'], 'vela policy: --port=70000: must be an integer in 0..65535'],
  [['policy', 'ck', '--seed', '-1'], 'vela policy: --seed -1: must be an integer in 0..4294967295'],
  [['policy', 'ck', '--batch-window-ms', 'soon'], 'vela policy: --batch-window-ms soon: must be a number in 0..10000'],
  [['policy', 'ck', '--max-batch', '0'], 'vela policy: --max-batch 0: must be an integer in 1..256'],
  [['policy', 'ck', '--backend', 'gpu'], 'vela policy: --backend gpu: must be one of auto, node-gpu, node, wasm, cpu'],
  [['policy', 'ck', '--max-message-bytes', '10'], 'vela policy: --max-message-bytes 10: must be an integer in 1024..1073741824'],
  [['policy', 'ck', '--log-level', 'loud'], 'vela policy: --log-level loud: must be one of error, warn, info, debug'],
  [['policy', 'ck', '--debug=yes'], 'vela policy: --debug=yes: --debug takes no value'],
  [['policy', 'ck', '--sed', '1'], 'vela policy: unknown option --sed (did you mean --seed? see vela policy --help)'],
  [['policy', 'ck', '--api-key'], 'vela policy: --api-key needs a value (see vela policy --help)'],
  [['serve', '--port', 'abc'], 'vela serve: --port abc: must be an integer in 0..65535'],
  [['serve', '--port=70000'], 'vela serve: --port=70000: must be an integer in 0..65535'],
  [['serve', '--max-batch', '-3'], 'vela serve: --max-batch -3: must be a non-negative integer'],
  [['serve', '--backend', 'gpu'], 'vela serve: --backend gpu: must be one of auto, node-gpu, node, wasm, cpu'],
  [['serve', '--log-level=loud'], 'vela serve: --log-level=loud: must be one of error, warn, info, debug'],
  [['serve', '--allow-absolute-datasets=maybe'], 'vela serve: --allow-absolute-datasets=maybe: must be true or false'],
  [['serve', '--allow-endpoint', '10.0.0.0/33'], 'vela serve: --allow-endpoint: "10.0.0.0/33" is not a CIDR (127.0.0.0/8), an address or a host name'],
  [['serve', '--data-dir'], 'vela serve: --data-dir needs a value (see vela serve --help)'],
  [['serve', '--prot', '9000'], 'vela serve: unknown option --prot (did you mean --port? see vela serve --help)'],
  [['serve', 'now'], 'vela serve: unexpected argument now (see vela serve --help)'],
  [['keys'], 'vela keys: which one? the only subcommand is "create" (see vela keys --help)'],
  [['keys', 'delete'], 'vela keys delete: unknown subcommand delete; the only one is "create" (see vela keys --help)'],
  [['keys', 'create', '--name'], 'vela keys create: --name needs a value (see vela keys --help)'],
  [['keys', 'create', '--owner', 'x'], 'vela keys create: unknown option --owner (see vela keys --help)'],
  [['datasets'], 'vela datasets: which one? inspect DIR or download REPO_ID (see vela datasets --help)'],
  [['datasets', 'list'], 'vela datasets list: unknown subcommand list; the subcommands are inspect and download (see vela datasets --help)'],
  [['datasets', 'inspect'], 'vela datasets inspect: expected one dataset folder, got none (see vela datasets --help)'],
  [['datasets', 'inspect', './nope'], 'vela datasets inspect: DIR ./nope: no such folder'],
  [['datasets', 'inspect', rel, '--episodes', '3'], 'vela datasets inspect: unknown option --episodes (see vela datasets --help)'],
  [['datasets', 'download'], 'vela datasets download: expected one REPO_ID (namespace/name), got none (see vela datasets --help)'],
  [['datasets', 'download', 'lerobot/pusht', '--endpoint', 'ftp://x'], 'vela datasets download: --endpoint ftp://x: must be an http(s) URL'],
  [['models'], 'vela models: which one? download, init, list, inspect or upload (see vela models --help)'],
  [['models', 'fetch', 'lerobot/pi05_base'], 'vela models fetch: unknown subcommand fetch; the subcommands are download, init, list, inspect and upload (see vela models --help)'],
  [['models', 'init'], 'vela models init: expected one FOLDER to write, got none (see vela models --help)'],
  [['models', 'init', './x'], 'vela models init: --variant pi05|pi0 is required (see vela models --help)'],
  [['models', 'init', './x', '--variant', 'pi5'], 'vela models init: --variant pi5: must be one of pi05, pi0'],
  [['models', 'init', './x', '--variant', 'pi05', '--size', 'big'], 'vela models init: --size big: must be one of tiny, full'],
  [['models', 'init', './x', '--variant', 'pi05', '--seed', '-1'], 'vela models init: --seed -1: must be an integer in 0..4294967295'],
  [['models', 'init', './x', '--variant', 'pi05', '--dtype', 'fp16'], 'vela models init: --dtype fp16: must be one of bf16, f32'],
  [['models', 'init', './x', '--variant', 'pi05', '--sead', '1'], 'vela models init: unknown option --sead (did you mean --seed? see vela models --help)'],
  [['models', 'download'], 'vela models download: expected one REPO_ID (namespace/name), got none (see vela models --help)'],
  [['models', 'download', '../etc'], 'vela models download: REPO_ID ../etc: must be namespace/name, e.g. lerobot/pi05_base'],
  [['models', 'download', 'lerobot/pi05_base', '--endpoint', 'ftp://x'], 'vela models download: --endpoint ftp://x: must be an http(s) URL'],
  [['models', 'download', 'lerobot/pi05_base', '--include='], 'vela models download: --include="": the glob is empty'],
  [['models', 'inspect'], 'vela models inspect: expected one REPO_ID or FOLDER, got none (see vela models --help)'],
  [['presets', '--all'], 'vela presets: unknown option --all (see vela presets --help)'],
  [['frobnicate'], 'vela: unknown command frobnicate; the commands are serve, keys, presets, policy, finetune, datasets, models, backend (see vela --help)'],
];

describe('vela: usage mistakes', () => {
  it.each(USAGE_CASES)('%j', async (argv, line) => {
    const { code, text } = await cli(argv);
    expect(text).toBe(line + '\n');
    expect(code).toBe(2);
  });

  it('vela policy --model against the base\'s own type, and a base given as CHECKPOINT with --base', async () => {
    const base = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-base-'));
    fs.writeFileSync(path.join(base, 'config.json'), JSON.stringify({ type: 'pi05' }));
    expect(await cli(['policy', '--base', base, '--model', 'pi0'])).toEqual({ code: 2, text: `vela policy: --model pi0: ${base} is a pi05 checkpoint (config.json type); drop --model or pick pi05 (see vela policy --help)\n` });
    expect(await cli(['policy', base, '--base', base])).toEqual({ code: 2, text: `vela policy: CHECKPOINT ${base} is itself a base checkpoint (config.json type pi05): serve it alone, or give --base alone (see vela policy --help)\n` });
    const ck = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-ck-'));
    fs.writeFileSync(path.join(ck, 'config.json'), JSON.stringify({ preset: 'pi05', base_checkpoint: '/elsewhere/pi05_base' }));
    expect(await cli(['policy', ck])).toEqual({ code: 2, text: `vela policy: CHECKPOINT ${ck} was trained on the base /elsewhere/pi05_base (config.json base_checkpoint), which is not on this machine: give --base <hub id | folder> (see vela policy --help)\n` });
    expect(await cli(['policy', ck, '--base', base, '--model', 'pi0'])).toEqual({ code: 2, text: `vela policy: --model pi0: ${ck} is a pi05 checkpoint (config.json preset); drop --model or pick pi05 (see vela policy --help)\n` });
    fs.rmSync(base, { recursive: true, force: true });
    fs.rmSync(ck, { recursive: true, force: true });
  });

  it('vela policy --base with a Hub id that is not in the Hugging Face cache: one line naming it, exit 1, before any engine', async () => {
    const empty = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-hf-'));
    const r = await cli(['policy', '--base', 'lerobot/pi05_base'], { HF_HOME: empty, HF_HUB_CACHE: path.join(empty, 'hub') });
    fs.rmSync(empty, { recursive: true, force: true });
    expect(r.code).toBe(1);
    expect(r.text).toMatch(/^vela policy: [^\n]*lerobot\/pi05_base[^\n]*\n$/);
  });

  it('an environment variable is named with its value', async () => {
    expect(await cli(['serve'], { VELA_PORT: 'eighty' })).toEqual({ code: 2, text: 'vela serve: VELA_PORT=eighty: must be an integer in 0..65535\n' });
    expect(await cli(['serve'], { VELA_BACKEND: 'tpu' })).toEqual({ code: 2, text: 'vela serve: VELA_BACKEND=tpu: must be one of auto, node-gpu, node, wasm, cpu\n' });
  });

  it('a failure that is not a usage mistake is one line, exit 1; --debug adds the stack', async () => {
    const notADataset = path.join('test', 'fixtures');
    const plain = await cli(['datasets', 'inspect', notADataset]);
    expect(plain).toEqual({ code: 1, text: 'vela datasets inspect: test/fixtures: meta/info.json is missing\n' });
    const debug = await cli(['datasets', 'inspect', notADataset, '--debug']);
    expect(debug.code).toBe(1);
    const lines = debug.text.trim().split('\n');
    expect(lines[0]).toBe(plain.text.trim());
    expect(lines.length).toBeGreaterThan(2);
    expect(lines.slice(2).every((l) => /^\s+at /.test(l))).toBe(true);
  });
});

describe('the real process', () => {
  const run = promisify(execFile);
  const vela = async (args: string[], env: Record<string, string> = {}) => {
    try {
      const r = await run(process.execPath, ['bin/vela.js', ...args], { cwd: REPO, env: { ...process.env, VELA_LOG_LEVEL: 'info', ...env } });
      return { code: 0, stderr: r.stderr };
    } catch (e) {
      const err = e as { code: number; stderr: string };
      return { code: err.code, stderr: err.stderr };
    }
  };

  it('exits 2 with one line on stderr and no stack trace', async () => {
    expect(await vela(['finetune', '--steps', 'abc', '--dataset', rel])).toEqual({ code: 2, stderr: 'vela finetune: --steps abc: must be an integer in 1..1000000\n' });
    expect(await vela(['policy', './nope'])).toEqual({ code: 2, stderr: 'vela policy: CHECKPOINT ./nope: no such folder\n' });
  });

  it('refuses to serve on uWebSockets.js\'s pure-JS shim: exit 1, one line that names the cause', async () => {
    const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-uws-'));
    const r = await vela(['serve', '--port', '0', '--data-dir', dataDir], { UWS_USE_FALLBACK: '1' });
    fs.rmSync(dataDir, { recursive: true, force: true });
    expect(r.code).toBe(1);
    // The package prints its own notice first; ours is the last line.
    expect(r.stderr.trimEnd().split('\n').at(-1)).toBe('vela serve: UWS_USE_FALLBACK is set ("1"): uWebSockets.js would run on its pure-JS shim, and Vela refuses to; unset it');
  });
});

describe('vela serve --help', () => {
  it('shows every setting with its environment variable and default', async () => {
    await expect(SERVE_USAGE).toMatchFileSnapshot('./__snapshots__/serve-help.txt');
    expect(SERVE_USAGE).toContain('  --port N                       VELA_PORT                       default: 8080\n      port to listen on (0 picks a free one)');
    expect(SERVE_USAGE).toContain('VELA_DATASETS_DIR               default: $HF_LEROBOT_HOME, else $HF_HOME/lerobot, else ~/.cache/huggingface/lerobot');
    expect(SERVE_USAGE.match(/ default: /g)).toHaveLength(SETTINGS.length); // one per setting
  });
});
