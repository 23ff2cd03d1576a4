/**
 * A `base` is named like a dataset (issue 35, items 2 and 3): relative to the server's models
 * folder (`--models-dir`), as `dataset_name` is relative to the datasets folder, or as a Hub id;
 * refusals that show `<models dir>` say what the client may name instead. Through the real server
 * (sessions, xorl's create_model, fine-tunes) on a shared server (no --allow-absolute-bases), and
 * the real CLIs (`vela finetune`, `vela policy`), where a path from the working directory still
 * works. And every hint `vela finetune` prints about a missing base is a command that works
 * there: each suggested command is run (downloads from a fake hub on 127.0.0.1).
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parsePolicyArgs, resolvePolicyTarget } from '../server/policy/cli.ts';
import { startFakeHub, type FakeHub } from './helpers/fake-hub.ts';
import { TEST_TOKENIZER_DIR, writeTinyBase } from './helpers/real-pi-base.ts';
import { api, startTestServer, type TestServer } from './helpers/server.ts';

/** Most names of each kind a refusal lists (server/models/resolve.ts NAMEABLE_CAP). */
const NAMEABLE_CAP = 20;
const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const FIXTURE = path.join(ROOT, 'test/fixtures/lerobot_image');
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-base-names-'));
const hfCache = path.join(tmp, 'hf-cache');
const savedCache = process.env.HF_HUB_CACHE;
let server: TestServer;
let models = '';
let outside = '';

/** A snapshot of `repoId` in the Hugging Face cache layout (refs/main -> snapshots/<commit>), written by writeTinyBase. */
async function cacheSnapshot(cache: string, repoId: string): Promise<void> {
  const repo = path.join(cache, `models--${repoId.replace('/', '--')}`);
  const commit = 'c'.repeat(40);
  await writeTinyBase('pi05', { dir: path.join(repo, 'snapshots', commit) });
  fs.mkdirSync(path.join(repo, 'refs'), { recursive: true });
  fs.writeFileSync(path.join(repo, 'refs', 'main'), commit);
}

beforeAll(async () => {
  // The server reads the Hugging Face cache of this process: one with a single cached base.
  process.env.HF_HUB_CACHE = hfCache;
  await cacheSnapshot(hfCache, 'lerobot-test/pi05_cached');
  server = await startTestServer({ env: { VELA_ALLOW_ABSOLUTE_BASES: '0' } });
  models = path.join(server.dataDir, 'models');
  await writeTinyBase('pi05', { dir: path.join(models, 'tiny_pi05_base') });
  await writeTinyBase('pi05', { dir: path.join(models, 'team', 'pi05_b') });
  fs.mkdirSync(path.join(models, 'not_a_checkpoint')); // no config.json: not listed
  outside = await writeTinyBase('pi05');
}, 120_000);
afterAll(async () => {
  await server?.close();
  if (savedCache === undefined) delete process.env.HF_HUB_CACHE;
  else process.env.HF_HUB_CACHE = savedCache;
  fs.rmSync(tmp, { recursive: true, force: true });
  if (outside) fs.rmSync(path.dirname(outside), { recursive: true, force: true });
});

/** What the refusals end with on this server: the folders under the models folder by name, then the cached Hub ids. */
const NAMEABLE = 'name a folder under the models folder by its relative name: team/pi05_b, tiny_pi05_base, or a Hub id in the Hugging Face cache: lerobot-test/pi05_cached';

async function closeAll(): Promise<void> {
  for (const s of (await api(server, 'GET', '/v1/training_sessions')).json.data) {
    if (s.status === 'starting' || s.status === 'ready') await api(server, 'POST', `/v1/training_sessions/${s.id}/close`);
  }
}

describe('a base named relative to --models-dir, through the server', () => {
  it('sessions, create_model and fine-tunes take "tiny_pi05_base" and "team/pi05_b"', async () => {
    const s = await api(server, 'POST', '/v1/training_sessions', { base_model: 'pi05', base: 'tiny_pi05_base' });
    expect(s.status, JSON.stringify(s.json)).toBe(200);
    const x = await api(server, 'POST', '/api/v1/create_model', { model_id: 'm', base_model: 'pi05', base: 'team/pi05_b' });
    expect(x.status, JSON.stringify(x.json)).toBe(200);
    await closeAll();
    // The base resolves first; the (missing) dataset is then what the fine-tune is refused for.
    for (const base of ['tiny_pi05_base', 'team/pi05_b', path.join(models, 'tiny_pi05_base')]) {
      const j = await api(server, 'POST', '/v1/fine-tunes', { model: 'pi05', base, dataset_name: 'nosuch' });
      expect(j.status).toBe(400);
      expect(j.json.error, base).toMatch(/^dataset_name "nosuch" not found/);
    }
  });

  it('refuses what is not there, naming what may be named instead', async () => {
    const cases: [string, string][] = [
      ['nosuch_base', 'base "nosuch_base" is neither a checkpoint folder under the models folder (--models-dir) nor a Hub id namespace/name[@revision] (e.g. lerobot/pi05_base)'],
      ['no such base', 'base "no such base" is neither a checkpoint folder under the models folder (--models-dir) nor a Hub id namespace/name[@revision] (e.g. lerobot/pi05_base)'],
      // A folder there that is no checkpoint (no config.json): named as the client named it.
      ['not_a_checkpoint', 'base not_a_checkpoint: <models dir>/not_a_checkpoint has no config.json, so it is no checkpoint'],
      // As dataset_name: plain segments only, so a name never leaves the models folder.
      ['../models/tiny_pi05_base', 'base "../models/tiny_pi05_base": a folder base is named relative to the models folder (--models-dir) in plain segments (no "..", ".", or empty parts)'],
      ['./tiny_pi05_base', 'base "./tiny_pi05_base": a folder base is named relative to the models folder (--models-dir) in plain segments (no "..", ".", or empty parts)'],
      // An absolute path under the models folder that is not there: the error shows <models dir> and the names.
      [path.join(models, 'gone'), `base <models dir>/gone: no such folder (<models dir>/gone)`],
      ['lerobot/pi05_base', 'base lerobot/pi05_base is not in the Hugging Face cache (<Hugging Face cache>/models--lerobot--pi05_base); run `vela models download lerobot/pi05_base`; or'],
    ];
    for (const [base, head] of cases) {
      const s = await api(server, 'POST', '/v1/training_sessions', { base_model: 'pi05', base });
      expect(s.status, base).toBe(400);
      expect(s.json.error).toBe(`${head}; ${NAMEABLE}`.replace('; or; ', '; or '));
      const j = await api(server, 'POST', '/v1/fine-tunes', { model: 'pi05', base, dataset_name: 'nosuch' });
      expect(j.status, base).toBe(400);
      expect(j.json.error).toContain(NAMEABLE);
      const x = await api(server, 'POST', '/api/v1/create_model', { model_id: 'm2', base_model: 'pi05', base });
      expect(x.status, base).toBe(400);
      expect(x.json.error ?? x.json.detail).toContain(NAMEABLE);
    }
    // A folder outside the models folder stays refused (no --allow-absolute-bases), with the names.
    const o = await api(server, 'POST', '/v1/training_sessions', { base_model: 'pi05', base: outside });
    expect(o.status).toBe(400);
    expect(o.json.error).toBe(`base ${outside}: a folder base must be under the server's models folder (--models-dir) or be one of this key's fine-tunes' model_dir, or the operator may allow any folder with --allow-absolute-bases; ${NAMEABLE}`);
    expect((await api(server, 'GET', '/v1/training_sessions')).json.data.filter((s: any) => s.status !== 'closed')).toEqual([]);
  });

  it(`lists at most ${NAMEABLE_CAP} folders, counting the rest`, async () => {
    const extra = Array.from({ length: 25 }, (_, i) => `zz${String(i).padStart(2, '0')}`);
    for (const n of extra) {
      fs.mkdirSync(path.join(models, n));
      fs.writeFileSync(path.join(models, n, 'config.json'), '{"type": "pi05"}');
    }
    const s = await api(server, 'POST', '/v1/training_sessions', { base_model: 'pi05', base: 'nosuch_base' });
    const all = ['team/pi05_b', 'tiny_pi05_base', ...extra];
    expect(s.json.error).toContain(`by its relative name: ${all.slice(0, NAMEABLE_CAP).join(', ')} and ${all.length - NAMEABLE_CAP} more, or a Hub id`);
    for (const n of extra) fs.rmSync(path.join(models, n), { recursive: true });
  });
});

/** Runs bin/vela.js in `cwd` with `env` over a clean HF / Vela environment. */
function vela(args: string[], env: Record<string, string>, cwd = ROOT): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const base = { ...process.env };
  for (const k of ['HF_HOME', 'HF_HUB_CACHE', 'HF_TOKEN', 'HF_ENDPOINT', 'XDG_CACHE_HOME', 'VELA_MODELS_DIR', 'VELA_DATA_DIR']) delete base[k];
  const child = spawn(process.execPath, [path.join(ROOT, 'bin/vela.js'), ...args], { cwd, env: { ...base, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  return new Promise((resolve) => child.once('close', (code) => resolve({ code, stdout, stderr })));
}

describe('a base named relative to --models-dir, through the CLIs', () => {
  it('vela policy --base: a name under --models-dir (or $VELA_MODELS_DIR), and a path from the working directory', async () => {
    const byName = await resolvePolicyTarget(parsePolicyArgs(['--base', 'tiny_pi05_base', '--models-dir', models]));
    expect(byName.dir).toBe(path.join(models, 'tiny_pi05_base'));
    const byEnv = await resolvePolicyTarget(parsePolicyArgs(['--base', 'team/pi05_b'], { VELA_MODELS_DIR: models }));
    expect(byEnv.dir).toBe(path.join(models, 'team', 'pi05_b'));
    const rel = path.relative(process.cwd(), outside);
    expect((await resolvePolicyTarget(parsePolicyArgs(['--base', rel, '--models-dir', models]))).dir).toBe(outside);
    const r = await vela(['policy', '--base', 'nosuch_base', '--models-dir', models], { HF_HUB_CACHE: hfCache });
    expect(r.code).not.toBe(0);
    expect(r.stderr).toContain(`base "nosuch_base" is neither an existing folder (here or under the models folder) nor a Hub id namespace/name[@revision] (e.g. lerobot/pi05_base); ${NAMEABLE}`);
  });

  it('vela finetune --base: a name under --models-dir resolves (the run then stops at a camera the data lacks)', { timeout: 120_000 }, async () => {
    const r = await vela(['finetune', '--model', 'pi05', '--base', 'tiny_pi05_base', '--models-dir', models, '--dataset', FIXTURE, '--cameras', 'nosuch_cam', '--output', path.join(tmp, 'out-name')], { HF_HUB_CACHE: hfCache });
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/--cameras nosuch_cam: /);
    expect(r.stderr).not.toMatch(/neither an existing folder/);
  });
});

/** `vela ...` commands a message suggests in backticks, split as a shell would ('...' quoted). */
function suggestedCommands(text: string): string[][] {
  return [...text.matchAll(/`(vela [^`]+)`/g)].map((m) => [...m[1]!.matchAll(/'([^']*)'|(\S+)/g)].map((w) => w[1] ?? w[2]!).slice(1));
}

/** Flags a message advises outside its backticked commands ("with --x", "use --x", "lower --x", ...). */
function suggestedFlags(text: string): string[] {
  return [...text.replace(/`[^`]*`/g, '').matchAll(/\b(?:with|use|add|pass|lower|raise|give)\s+(--[a-z][a-z0-9-]*)/g)].map((m) => m[1]!);
}

/** The flags `vela <command> --help` lists. */
async function usageFlags(command: string): Promise<Set<string>> {
  const r = await vela([command, '--help'], {});
  expect(r.code).toBe(0);
  return new Set([...r.stdout.matchAll(/--[a-z][a-z0-9-]*/g)].map((m) => m[0]));
}

describe('every hint vela finetune prints about its base works there', () => {
  let hub: FakeHub;
  let hubBase = '';
  let pali = '';
  beforeAll(async () => {
    // lerobot/pi05_base without a tokenizer of its own (as the public one), and PaliGemma's tokenizer, gated.
    hubBase = await writeTinyBase('pi05', { tokenizer: false });
    pali = path.join(tmp, 'paligemma');
    fs.mkdirSync(pali);
    for (const f of ['tokenizer.json', 'tokenizer_config.json']) fs.copyFileSync(path.join(TEST_TOKENIZER_DIR, f), path.join(pali, f));
    hub = await startFakeHub({ models: [{ repoId: 'lerobot/pi05_base', dir: hubBase }, { repoId: 'google/paligemma-3b-pt-224', dir: pali, gated: { tokens: ['hf_granted'] } }] });
  });
  afterAll(async () => {
    await hub?.close();
    if (hubBase) fs.rmSync(path.dirname(hubBase), { recursive: true, force: true });
  });

  it('in an empty Hugging Face cache: each suggested command runs, and then the run gets past its base', { timeout: 300_000 }, async () => {
    const cache = path.join(tmp, 'empty-cache');
    fs.mkdirSync(cache);
    const env = { HF_HUB_CACHE: cache, HF_ENDPOINT: hub.url, HF_TOKEN: 'hf_granted', VELA_MODELS_DIR: path.join(tmp, 'no-models') };
    // --cameras a camera the data lacks: once the base and its tokenizer are found, the run stops there (no training).
    const cmd = ['finetune', '--model', 'pi05', '--dataset', FIXTURE, '--cameras', 'nosuch_cam', '--output', path.join(tmp, 'out-hints')];
    const known = await usageFlags('finetune');
    const seen: string[] = [];
    let last = '';
    for (let round = 0; round < 4; round++) {
      const r = await vela(cmd, env);
      expect(r.code).not.toBe(0);
      last = r.stderr;
      const commands = suggestedCommands(r.stderr);
      const flags = suggestedFlags(r.stderr);
      if (commands.length === 0 && flags.length === 0) break;
      // A flag advised to this command is one it takes.
      for (const flag of flags) expect(known.has(flag), `${flag}, advised by: ${r.stderr}`).toBe(true);
      for (const c of commands) {
        seen.push(c.join(' '));
        const run = await vela(c, env);
        expect(run.stderr, `vela ${c.join(' ')}`).not.toMatch(/unknown option|needs a value|Usage:/);
        expect(run.code, `vela ${c.join(' ')}: ${run.stderr}`).toBe(0);
      }
    }
    expect(seen).toEqual(['models download lerobot/pi05_base', "models download google/paligemma-3b-pt-224 --include tokenizer*"]);
    expect(last).toMatch(/--cameras nosuch_cam: /);
    expect(last).not.toMatch(/start the server|--allow-downloads/);
  });

  it('vela policy --base in an empty cache: its hint is a command that runs, and it names only its own flags', { timeout: 120_000 }, async () => {
    const cache = path.join(tmp, 'empty-cache-policy');
    fs.mkdirSync(cache);
    const env = { HF_HUB_CACHE: cache, HF_ENDPOINT: hub.url, VELA_MODELS_DIR: path.join(tmp, 'no-models') };
    const known = await usageFlags('policy');
    const r = await vela(['policy', '--base', 'lerobot/pi05_base', '--port', '0'], env);
    expect(r.code).toBe(1);
    for (const flag of suggestedFlags(r.stderr)) expect(known.has(flag), `${flag}, advised by: ${r.stderr}`).toBe(true);
    const commands = suggestedCommands(r.stderr);
    expect(commands.map((c) => c.join(' '))).toEqual(['models download lerobot/pi05_base']);
    const run = await vela(commands[0]!, env);
    expect(run.code, run.stderr).toBe(0);
  });

  it('a memory refusal advises this command\'s flags (--batch-size, --finetune), not the REST fields', { timeout: 120_000 }, async () => {
    const known = await usageFlags('finetune');
    const r = await vela(['finetune', '--model', 'pi05', '--base', 'tiny_pi05_base', '--models-dir', models, '--dataset', FIXTURE, '--batch-size', '4', '--finetune', 'full', '--output', path.join(tmp, 'out-mem')],
      { HF_HUB_CACHE: hfCache, VELA_MAX_MEMORY: '64MiB' });
    expect(r.code).toBe(1);
    const line = r.stderr.split('\n').find((l) => l.includes('needs about'))!;
    const fixes = line.slice(line.lastIndexOf('): ') + 3);
    // Planned down to micro-batches of 1 (issue 34): a lower --batch-size would not help, so it is not advised.
    expect(line).toMatch(/at batch_size 4 in micro-batches of 1 needs about/);
    expect(fixes).toMatch(/^use --finetune lora \(the default\) instead of a full fine-tune, or free memory or run on a machine with >= \d+ GB, or raise VELA_MAX_MEMORY \(now 67\.1 MB\)$/); // 64 MiB = 67 108 864 bytes
    const flags = suggestedFlags(fixes);
    expect(flags).toEqual(['--finetune']);
    for (const flag of flags) expect(known.has(flag), flag).toBe(true);
    // A forced micro-batch that does not fit: the fix is a lower --micro-batch-size, a flag of this command.
    const forced = await vela(['finetune', '--model', 'pi05', '--base', 'tiny_pi05_base', '--models-dir', models, '--dataset', FIXTURE, '--batch-size', '8', '--micro-batch-size', '4', '--output', path.join(tmp, 'out-mem')],
      { HF_HUB_CACHE: hfCache, VELA_MAX_MEMORY: '64MiB' });
    const forcedLine = forced.stderr.split('\n').find((l) => l.includes('needs about'))!;
    expect(forcedLine).toMatch(/at batch_size 8 in micro-batches of 4 needs about .*lower --micro-batch-size \(or leave it out: the plan chooses one that fits\)/);
    expect(known.has('--micro-batch-size')).toBe(true);
    // The advised command runs past the plan's flags (LoRA at batch 1 still does not fit 64 MiB: the same refusal, no usage error).
    const again = await vela(['finetune', '--model', 'pi05', '--base', 'tiny_pi05_base', '--models-dir', models, '--dataset', FIXTURE, '--batch-size', '1', '--finetune', 'lora', '--output', path.join(tmp, 'out-mem')],
      { HF_HUB_CACHE: hfCache, VELA_MAX_MEMORY: '64MiB' });
    expect(again.stderr).not.toMatch(/unknown option|needs a value|Usage:/);
    expect(again.stderr).toMatch(/needs about/);
  });
});
