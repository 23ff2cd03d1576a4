/**
 * `vela models upload FOLDER REPO_ID` (the real CLI, bin/vela.js, in a child process) against
 * the local stand-in for the Hugging Face Hub (test/helpers/fake-hub.ts), which takes what
 * @huggingface/hub sends when uploading (create, preupload, git-lfs batch, LFS PUTs, the NDJSON
 * commit). Shown: a `vela models init` folder (its README.md removed, a file in a subfolder
 * added) lands byte for byte with a generated model card; a second upload sends no LFS object;
 * no token is exit 2 naming where a token may come from; a repo the hub refuses writes to is
 * exit 1 naming the repo; what was uploaded downloads back (`vela models download`) and
 * `vela models inspect` reads it. And in process: the model card's words for a fine-tune's
 * config, the token's sources in order, which files go.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { checkpointFiles, modelCard, resolveWriteToken } from '../server/models/upload.ts';
import { startFakeHub, type FakeHub } from './helpers/fake-hub.ts';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const REPO = 'vela-test/pi05_uploaded';
const FORBIDDEN = 'someone-else/pi05_base';
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-upload-'));
const ckpt = path.join(tmp, 'ckpt');
const hfHome = path.join(tmp, 'hf-home');
let hub: FakeHub;

/** `vela ARGS` with `env` over a parent environment that holds no Hugging Face token. */
function vela(args: string[], env: Record<string, string> = {}): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const base: NodeJS.ProcessEnv = { ...process.env, HF_HOME: hfHome, HF_HUB_DISABLE_TELEMETRY: '1' };
  for (const k of ['HF_TOKEN', 'HUGGING_FACE_HUB_TOKEN', 'HF_ENDPOINT', 'HF_HUB_CACHE', 'XDG_CACHE_HOME']) delete base[k];
  const child = spawn(process.execPath, [path.join(ROOT, 'bin/vela.js'), ...args], { cwd: ROOT, env: { ...base, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  return new Promise((resolve) => child.on('close', (code) => resolve({ code, stdout, stderr })));
}

/** Every file under `dir`: relative path with `/` -> bytes. */
function filesUnder(dir: string, rel = ''): Map<string, Buffer> {
  const out = new Map<string, Buffer>();
  for (const e of fs.readdirSync(path.join(dir, rel), { withFileTypes: true })) {
    const r = rel ? `${rel}/${e.name}` : e.name;
    if (e.isDirectory()) for (const [k, v] of filesUnder(dir, r)) out.set(k, v);
    else out.set(r, fs.readFileSync(path.join(dir, r)));
  }
  return out;
}

beforeAll(async () => {
  const init = await vela(['models', 'init', ckpt, '--variant', 'pi05', '--size', 'tiny']);
  expect(init.code, init.stderr).toBe(0);
  // init writes its own card; without it the upload must write one.
  fs.rmSync(path.join(ckpt, 'README.md'));
  fs.mkdirSync(path.join(ckpt, 'assets', 'pusht'), { recursive: true });
  fs.writeFileSync(path.join(ckpt, 'assets', 'pusht', 'norm_stats.json'), '{"norm_stats": {}}\n');
  hub = await startFakeHub({ models: [], readOnly: new Set([FORBIDDEN]) });
}, 120_000);
afterAll(async () => {
  await hub?.close();
  fs.rmSync(tmp, { recursive: true, force: true });
});

describe('vela models upload', () => {
  it('prints its own usage for --help, not the parent\'s', async () => {
    const r = await vela(['models', 'upload', '--help']);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/^Usage:\n {2}vela models upload FOLDER REPO_ID/);
    expect(r.stdout).not.toContain('vela models download');
  });

  it('creates the repo and commits every file byte for byte, with a generated model card', async () => {
    const r = await vela(['models', 'upload', ckpt, REPO, '--endpoint', hub.url], { HF_TOKEN: 'hf_write' });
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout.trim()).toBe(`${hub.url}/${REPO}`);
    expect(r.stderr).toContain(`created model repo ${REPO}`);
    expect(r.stderr).toContain('uploaded model.safetensors');
    const local = filesUnder(ckpt);
    const held = hub.filesOf(REPO);
    expect([...held.keys()].sort()).toEqual([...local.keys(), 'README.md'].sort());
    for (const [p, bytes] of local) expect(held.get(p)!.equals(bytes), p).toBe(true);
    const card = held.get('README.md')!.toString();
    expect(card).toContain(`# ${REPO}`);
    expect(card).toContain('- model: pi05');
    expect(card).toContain('- base checkpoint: unknown (config.json does not say)');
    expect(card).toContain('- dataset: unknown (config.json does not say)');
    // The weights went once, as an LFS object; the JSON files inline in the commit.
    expect(hub.lfsPuts).toEqual([{ oid: expect.stringMatching(/^[0-9a-f]{64}$/), bytes: local.get('model.safetensors')!.length }]);
    const creates = hub.requests.filter((q) => q.method === 'POST' && q.url === '/api/repos/create');
    expect(creates).toHaveLength(1);
    expect(creates[0]!.authorization).toBe('Bearer hf_write');
    expect(hub.created).toEqual([{ id: REPO, visibility: undefined }]);
  }, 120_000);

  it('a second upload of the same folder sends no LFS object and keeps the files', async () => {
    const before = hub.lfsPuts.length;
    const commitBefore = hub.commitOf(REPO);
    // The token from the token file this time ($HF_HOME/token).
    fs.mkdirSync(hfHome, { recursive: true });
    fs.writeFileSync(path.join(hfHome, 'token'), 'hf_from_file\n');
    const r = await vela(['models', 'upload', ckpt, REPO], { HF_ENDPOINT: hub.url });
    fs.rmSync(path.join(hfHome, 'token'));
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toContain(`model repo ${REPO} exists`);
    expect(r.stderr).toContain('model.safetensors (824240 bytes): already on the hub, not sent');
    expect(r.stderr).toContain('0 LFS files sent, 1 already on the hub');
    expect(hub.lfsPuts.length).toBe(before);
    expect(hub.requests.filter((q) => q.method === 'POST' && q.url.endsWith('/lfs/objects/batch')).at(-1)!.authorization).toBe('Bearer hf_from_file');
    expect(hub.commitOf(REPO)).not.toBe(commitBefore);
    expect(hub.filesOf(REPO).get('model.safetensors')!.equals(fs.readFileSync(path.join(ckpt, 'model.safetensors')))).toBe(true);
  }, 120_000);

  it('--private creates the repo private; a branch the repo lacks is refused by name', async () => {
    const priv = 'vela-test/pi05_private';
    const r = await vela(['models', 'upload', ckpt, priv, '--private', '--endpoint', hub.url, '--token', 'hf_write']);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toContain(`created private model repo ${priv}`);
    expect(hub.created.at(-1)).toEqual({ id: priv, visibility: 'private' });
    const dev = await vela(['models', 'upload', ckpt, priv, '--revision', 'dev', '--endpoint', hub.url, '--token', 'hf_write']);
    expect(dev.code).toBe(1);
    expect(dev.stderr.trim().split('\n').at(-1)).toBe(`vela models upload: ${priv} has no branch dev on ${hub.url}: create it first, or upload to main`);
  }, 120_000);

  it('a token that is not a Hugging Face one: exit 2 before anything is sent', async () => {
    const n = hub.requests.length;
    const r = await vela(['models', 'upload', ckpt, REPO, '--endpoint', hub.url, '--token', 'abc']);
    expect(r.code).toBe(2);
    expect(r.stderr.trim()).toBe('vela models upload: the Hugging Face token of --token does not start with hf_; a write token from https://huggingface.co/settings/tokens does');
    expect(hub.requests.length).toBe(n);
  }, 60_000);

  it('without a token: exit 2, naming where a token may come from', async () => {
    const n = hub.requests.length;
    const r = await vela(['models', 'upload', ckpt, REPO, '--endpoint', hub.url]);
    expect(r.code).toBe(2);
    expect(r.stderr.trim()).toBe('vela models upload: no Hugging Face token: uploading needs a write token, from --token, HF_TOKEN, HUGGING_FACE_HUB_TOKEN, or the token file ($HF_HOME/token, else ~/.cache/huggingface/token, written by `hf auth login`)');
    expect(hub.requests.length).toBe(n);
  }, 60_000);

  it('a repo the hub refuses writes to: exit 1 naming the repo, nothing stored', async () => {
    const r = await vela(['models', 'upload', ckpt, FORBIDDEN, '--endpoint', hub.url], { HUGGING_FACE_HUB_TOKEN: 'hf_read_only' });
    expect(r.code).toBe(1);
    const lines = r.stderr.trim().split('\n');
    expect(lines.at(-1)).toMatch(new RegExp(`^vela models upload: ${FORBIDDEN}: no write access \\(a gated or another's repo, or a read-only token\\) on ${hub.url.replace(/\./g, '\\.')}: the hub answered 403`));
    expect(() => hub.filesOf(FORBIDDEN)).toThrow(/does not serve/);
  }, 60_000);

  it('what was uploaded downloads back and inspects as the pi0.5 it is', async () => {
    const d = await vela(['models', 'download', REPO], { HF_ENDPOINT: hub.url });
    expect(d.code, d.stderr).toBe(0);
    const snapshot = d.stdout.trim();
    expect(snapshot).toBe(path.join(hfHome, 'hub', 'models--vela-test--pi05_uploaded', 'snapshots', hub.commitOf(REPO)));
    const back = filesUnder(snapshot);
    for (const [p, bytes] of filesUnder(ckpt)) expect(back.get(p)?.equals(bytes), p).toBe(true);
    const i = await vela(['models', 'inspect', REPO, '--json']);
    expect(i.code, i.stderr).toBe(0);
    const s = JSON.parse(i.stdout) as { kind: string; parameters: number; repoId: string };
    expect(s.kind).toBe('pi05');
    expect(s.repoId).toBe(REPO);
    expect(s.parameters).toBe(370112);
  }, 120_000);
});

describe('the upload\'s parts', () => {
  it('the card names what a fine-tune\'s config.json records, and says unknown for the rest', () => {
    const ft = modelCard('me/pi05_pusht', { preset: 'pi05', type: 'ignored', base_checkpoint: '/data/hf/models--lerobot--pi05_base/snapshots/abc', dataset: { repo_id: 'lerobot/pusht' }, finetune: 'lora' });
    expect(ft).toContain('- model: pi05\n');
    expect(ft).toContain('- base checkpoint: lerobot/pi05_base (from the Hugging Face cache: /data/hf/models--lerobot--pi05_base/snapshots/abc)\n');
    expect(modelCard('me/x', { preset: 'pi0', base_checkpoint: '/work/tiny_pi0' })).toContain('- base checkpoint: /work/tiny_pi0 (a folder on the machine that trained it)\n');
    expect(ft).toContain('- dataset: lerobot/pusht\n');
    expect(ft).toContain('- fine-tune: lora\n');
    expect(ft.startsWith('---\ntags:\n- vela\n- robotics\n- pi05\npipeline_tag: robotics\n---\n')).toBe(true);
    const none = modelCard('me/x', null);
    expect(none).toContain('- model: unknown (the folder has no readable config.json)\n');
    expect(none).not.toContain('fine-tune');
    expect(modelCard('me/x', { type: 'pi0', dataset: 'lerobot/aloha' })).toContain('- model: pi0\n- base checkpoint: unknown (config.json does not say)\n- dataset: lerobot/aloha\n');
  });

  it('the token: --token, HF_TOKEN, HUGGING_FACE_HUB_TOKEN, then $HF_HOME/token, then none', () => {
    const home = fs.mkdtempSync(path.join(tmp, 'tok-'));
    fs.writeFileSync(path.join(home, 'token'), '  hf_file\n');
    const env = { HF_HOME: home, HF_TOKEN: 'hf_env', HUGGING_FACE_HUB_TOKEN: 'hf_old' };
    expect(resolveWriteToken('hf_flag', env)).toBe('hf_flag');
    expect(resolveWriteToken(undefined, env)).toBe('hf_env');
    expect(resolveWriteToken(undefined, { ...env, HF_TOKEN: '' })).toBe('hf_old');
    expect(resolveWriteToken(undefined, { HF_HOME: home })).toBe('hf_file');
    expect(resolveWriteToken(undefined, { HF_HOME: path.join(home, 'nope'), XDG_CACHE_HOME: path.join(home, 'nope') })).toBeNull();
  });

  it('files: every one under the folder, subfolders too, .git and .cache at the top left out', () => {
    const d = fs.mkdtempSync(path.join(tmp, 'files-'));
    for (const f of ['config.json', 'a/b/c.bin', '.git/HEAD', '.cache/huggingface/x.lock', 'sub/.cache/kept']) {
      fs.mkdirSync(path.dirname(path.join(d, f)), { recursive: true });
      fs.writeFileSync(path.join(d, f), f);
    }
    expect(checkpointFiles(d)).toEqual(['a/b/c.bin', 'config.json', 'sub/.cache/kept']);
  });
});
