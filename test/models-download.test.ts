/**
 * `vela models download|list|inspect` (the real CLI, bin/vela.js, in a child process) and
 * resolveBase, against a local stand-in for the Hugging Face Hub (test/helpers/fake-hub.ts) on
 * 127.0.0.1 that serves a tiny pi0.5 checkpoint written by writeHubCheckpoint as
 * `lerobot-test/pi05_tiny`, and a gated `google/paligemma-3b-pt-224` with tokenizer files.
 * Shown: the Hugging Face cache layout (refs, snapshot links into blobs named by hash), a resume
 * after a cut connection and after a killed run (Range from the kept bytes), a corrupt file
 * refused and kept out of the cache, a rerun that transfers nothing, the gated errors; and
 * Python's huggingface_hub reading what Vela downloaded, and the other way round.
 */
import { execFile, spawn, spawnSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { piParamShapes } from '../kernels/pi/keys.ts';
import { writeHubCheckpoint } from '../server/models/hub-checkpoint.ts';
import { downloadModel } from '../server/models/download.ts';
import { ModelError } from '../server/models/errors.ts';
import { hubCacheDir } from '../server/models/hf-cache.ts';
import { inspectModel } from '../server/models/inspect.ts';
import { resolveBase } from '../server/models/resolve.ts';
import { findPaligemmaTokenizer } from '../server/models/tokenizer.ts';
import { startFakeHub, type FakeHub, type FakeHubOptions } from './helpers/fake-hub.ts';
import { missing, pythonEnv } from './helpers/requires.ts';
import { fakeParam, tinyShapes } from './helpers/real-pi-tiny.ts';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const REPO = 'lerobot-test/pi05_tiny';
const PALI = 'google/paligemma-3b-pt-224';
const WEIGHTS = 'model.safetensors';
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-models-'));
const ckpt = path.join(tmp, 'pi05_tiny');
const ckptBf16 = path.join(tmp, 'pi05_tiny_bf16');
const tokDir = path.join(tmp, 'paligemma');
const cfg = { ...tinyShapes('pi05'), actionHorizon: 10 };
const nParams = piParamShapes(cfg).reduce((s, [, shape]) => s + shape.reduce((a, b) => a * b, 1), 0);
const hubs: FakeHub[] = [];

beforeAll(async () => {
  await writeHubCheckpoint(ckpt, cfg, (name, shape) => fakeParam(name, shape.reduce((a, b) => a * b, 1)));
  await writeHubCheckpoint(ckptBf16, cfg, (name, shape) => fakeParam(name, shape.reduce((a, b) => a * b, 1)), { dtype: 'BF16', maxShardBytes: 400_000 });
  // LeRobot's norm stats beside the weights (contents do not matter here).
  fs.writeFileSync(path.join(ckpt, 'policy_preprocessor.json'), '{"name": "policy_preprocessor", "steps": []}\n');
  fs.writeFileSync(path.join(ckpt, 'policy_preprocessor_step_3_normalizer_processor.safetensors'), Buffer.from('stats'));
  fs.writeFileSync(path.join(ckpt, 'README.md'), '# a tiny pi0.5\n');
  fs.writeFileSync(path.join(ckpt, 'notes #1.md'), 'a file name the URL must quote\n');
  fs.mkdirSync(tokDir);
  fs.writeFileSync(path.join(tokDir, 'tokenizer.json'), JSON.stringify({ model: { type: 'BPE', byte_fallback: true, vocab: {}, merges: [] } }));
  fs.writeFileSync(path.join(tokDir, 'tokenizer_config.json'), '{}');
  fs.writeFileSync(path.join(tokDir, 'config.json'), '{"model_type": "paligemma"}');
  fs.writeFileSync(path.join(tokDir, 'model-00001-of-00003.safetensors'), Buffer.alloc(1000, 7));
});
afterAll(async () => {
  for (const h of hubs) await h.close();
  fs.rmSync(tmp, { recursive: true, force: true });
});

async function hub(opts: Partial<FakeHubOptions> = {}): Promise<FakeHub> {
  const h = await startFakeHub({ models: [{ repoId: REPO, dir: ckpt }, { repoId: PALI, dir: tokDir, gated: { tokens: ['hf_granted'] } }], ...opts });
  hubs.push(h);
  return h;
}

/** Runs bin/vela.js with `env` over a clean HF environment; resolves with its exit code and output. */
function vela(args: string[], env: Record<string, string>): { done: Promise<{ code: number | null; stdout: string; stderr: string }>; kill: () => void } {
  const base = { ...process.env };
  for (const k of ['HF_HOME', 'HF_HUB_CACHE', 'HF_TOKEN', 'HF_ENDPOINT', 'XDG_CACHE_HOME']) delete base[k];
  const child = spawn(process.execPath, [path.join(ROOT, 'bin/vela.js'), ...args], { cwd: ROOT, env: { ...base, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const done = new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => child.once('close', (code) => resolve({ code, stdout, stderr })));
  return { done, kill: () => child.kill('SIGKILL') };
}

const sha256 = (b: Buffer) => crypto.createHash('sha256').update(b).digest('hex');
const gitSha1 = (b: Buffer) => crypto.createHash('sha1').update(`blob ${b.length}\0`).update(b).digest('hex');
const repoDir = (home: string, id: string) => path.join(home, 'hub', `models--${id.split('/').join('--')}`);
const fileRequests = (h: FakeHub, from = 0) => h.requests.slice(from).filter((q) => q.url.includes('/resolve/') || q.url.startsWith('/cdn/'));

describe('vela models download', () => {
  it('lands in the Hugging Face cache layout (refs, snapshot links into hash-named blobs, same bytes); a rerun transfers nothing', async () => {
    const h = await hub();
    const home = path.join(tmp, 'home-layout');
    const r = await vela(['models', 'download', REPO], { HF_HOME: home, HF_ENDPOINT: h.url }).done;
    expect(r.stderr).not.toMatch(/error/i);
    expect(r.code).toBe(0);
    const commit = h.commitOf(REPO);
    const repo = repoDir(home, REPO);
    const snapshot = path.join(repo, 'snapshots', commit);
    expect(r.stdout.trim()).toBe(snapshot);
    expect(fs.readFileSync(path.join(repo, 'refs', 'main'), 'utf8')).toBe(commit);
    const files = fs.readdirSync(ckpt).sort();
    expect(fs.readdirSync(snapshot).sort()).toEqual(files);
    for (const f of files) {
      const want = fs.readFileSync(path.join(ckpt, f));
      const lfs = f.endsWith('.safetensors');
      const p = path.join(snapshot, f);
      expect(fs.lstatSync(p).isSymbolicLink(), f).toBe(true);
      expect(fs.readlinkSync(p), f).toBe(`../../blobs/${lfs ? sha256(want) : gitSha1(want)}`);
      expect(Buffer.compare(fs.readFileSync(p), want), f).toBe(0);
    }
    expect(fs.readdirSync(path.join(repo, 'blobs')).filter((n) => n.endsWith('.incomplete'))).toEqual([]);

    const before = h.requests.length;
    const again = await vela(['models', 'download', REPO], { HF_HOME: home, HF_ENDPOINT: h.url }).done;
    expect(again.code).toBe(0);
    expect(again.stdout.trim()).toBe(snapshot);
    expect(fileRequests(h, before)).toEqual([]);
    expect(again.stderr).toMatch(new RegExp(`${files.length} files \\(.*\\) at commit ${commit}: 0 B fetched in [\\d.]+ s, ${files.length} already in the cache`));
  });

  it('resumes a file whose connection was cut, with a Range request from the bytes it kept', async () => {
    const cut = 300_000;
    const size = fs.statSync(path.join(ckpt, WEIGHTS)).size;
    expect(size).toBeGreaterThan(2 * cut);
    const h = await hub({ cutAfter: new Map([[WEIGHTS, cut]]) });
    const home = path.join(tmp, 'home-cut');
    const r = await vela(['models', 'download', REPO], { HF_HOME: home, HF_ENDPOINT: h.url }).done;
    expect(r.code).toBe(0);
    expect(r.stderr).toContain(`connection broke on ${WEIGHTS}; resuming`);
    const blob = fs.readFileSync(path.join(repoDir(home, REPO), 'snapshots', h.commitOf(REPO), WEIGHTS));
    expect(Buffer.compare(blob, fs.readFileSync(path.join(ckpt, WEIGHTS)))).toBe(0);
    // The resumed GET (the library's ranged WebBlob read of /resolve/, redirected to the CDN with
    // the same Range) starts where the kept bytes end; `bytes=0-0` is the library's probe.
    const resumed = h.requests.filter((q) => q.range !== undefined && q.range !== 'bytes=0-0');
    expect(resumed.map((q) => q.url.split('/')[1])).toEqual(['lerobot-test', 'cdn']);
    expect(resumed[0]!.range).toBe(resumed[1]!.range);
    const m = /^bytes=(\d+)-(\d+)$/.exec(resumed[1]!.range!)!;
    const from = Number(m[1]);
    expect(Number(m[2])).toBe(size - 1);
    expect(from).toBeGreaterThan(0);
    expect(from).toBeLessThanOrEqual(cut);
    // Bytes moved by the resumed request: the rest of the file only.
    expect(size - from).toBeLessThan(size);
  });

  it('a killed run keeps its bytes in blobs/<sha256>.incomplete and the next run continues them', async () => {
    const stall = 250_000;
    const h = await hub({ stallAfter: new Map([[WEIGHTS, stall]]) });
    const home = path.join(tmp, 'home-kill');
    const weights = fs.readFileSync(path.join(ckpt, WEIGHTS));
    const partial = path.join(repoDir(home, REPO), 'blobs', `${sha256(weights)}.incomplete`);
    const run = vela(['models', 'download', REPO], { HF_HOME: home, HF_ENDPOINT: h.url });
    const deadline = Date.now() + 60_000;
    while ((fs.statSync(partial, { throwIfNoEntry: false })?.size ?? 0) < stall) {
      if (Date.now() > deadline) throw new Error('the first run never wrote the stalled bytes');
      await new Promise((r) => setTimeout(r, 50));
    }
    run.kill();
    expect((await run.done).code).toBe(null);
    expect(fs.statSync(partial).size).toBe(stall);
    expect(fs.existsSync(path.join(repoDir(home, REPO), 'snapshots', h.commitOf(REPO), WEIGHTS))).toBe(false);

    const before = h.requests.length;
    const r = await vela(['models', 'download', REPO], { HF_HOME: home, HF_ENDPOINT: h.url }).done;
    expect(r.code).toBe(0);
    expect(Buffer.compare(fs.readFileSync(path.join(repoDir(home, REPO), 'snapshots', h.commitOf(REPO), WEIGHTS)), weights)).toBe(0);
    const ranged = h.requests.slice(before).filter((q) => q.range !== undefined && q.range !== 'bytes=0-0');
    expect(ranged.map((q) => [q.url.split('/')[1], q.range])).toEqual([['lerobot-test', `bytes=${stall}-${weights.length - 1}`], ['cdn', `bytes=${stall}-${weights.length - 1}`]]);
    // Nothing before the kept bytes came again: only the probe's one byte and the rest of the file.
    expect(h.requests.slice(before).filter((q) => q.url === `/cdn/${sha256(weights)}` && q.range === undefined)).toEqual([]);
    expect(fs.existsSync(partial)).toBe(false);
  });

  it('refuses a file whose bytes do not hash to the hub\'s SHA-256, names it, and keeps it out of the cache', async () => {
    const h = await hub({ corrupt: new Set([WEIGHTS]) });
    const home = path.join(tmp, 'home-corrupt');
    const r = await vela(['models', 'download', REPO], { HF_HOME: home, HF_ENDPOINT: h.url }).done;
    expect(r.code).toBe(1);
    const want = sha256(fs.readFileSync(path.join(ckpt, WEIGHTS)));
    const lines = r.stderr.trim().split('\n');
    expect(lines.at(-1)).toMatch(new RegExp(`^vela models download: ${REPO}: ${WEIGHTS}: SHA-256 of the downloaded bytes is [0-9a-f]{64}; the hub's list says ${want}\\. The file was discarded, not saved in the cache$`));
    const blobs = fs.readdirSync(path.join(repoDir(home, REPO), 'blobs'));
    expect(blobs.filter((n) => n.startsWith(want))).toEqual([]);
    expect(fs.existsSync(path.join(repoDir(home, REPO), 'snapshots', h.commitOf(REPO), WEIGHTS))).toBe(false);
  });

  it('stops at the listed size when the hub sends an endless body: nothing past it is written, nothing kept (issue 32 item 10)', async () => {
    const h = await hub({ endless: new Set([WEIGHTS]) });
    const home = path.join(tmp, 'home-endless');
    const r = await vela(['models', 'download', REPO], { HF_HOME: home, HF_ENDPOINT: h.url }).done;
    expect(r.code).toBe(1);
    const size = fs.statSync(path.join(ckpt, WEIGHTS)).size;
    expect(r.stderr.trim().split('\n').at(-1)).toBe(`vela models download: ${REPO}: ${WEIGHTS}: the hub sent more than the ${size} bytes its file list gives; the bytes were discarded, not saved in the cache`);
    const blobs = path.join(repoDir(home, REPO), 'blobs');
    // Nothing of the file is left: neither a blob nor a partial (which never held more than the listed size).
    expect(fs.readdirSync(blobs).filter((n) => n.startsWith(sha256(fs.readFileSync(path.join(ckpt, WEIGHTS)))))).toEqual([]);
  });

  it('refuses a listed oid that is not 40 / 64 hex digits before building any path from it (issue 32 item 11)', async () => {
    const h = await hub({ listedOid: new Map([[WEIGHTS, '../../../outside/x']]) });
    const home = path.join(tmp, 'home-oid');
    const r = await vela(['models', 'download', REPO], { HF_HOME: home, HF_ENDPOINT: h.url }).done;
    expect(r.code).toBe(1);
    expect(r.stderr.trim().split('\n').at(-1)).toBe(`vela models download: ${REPO}: ${WEIGHTS}: the hub listed an LFS SHA-256 of "../../../outside/x", not 64 hex digits; nothing was written`);
    const hub0 = hubCacheDir({ HF_HOME: home });
    expect(fs.existsSync(path.join(hub0, '..', 'outside'))).toBe(false);
    expect(fs.existsSync(path.join(path.dirname(hub0), 'outside'))).toBe(false);
    expect(fs.existsSync(path.join(home, 'outside'))).toBe(false);
  });

  it('hashes a blob of the listed size before linking it: other bytes are fetched again (issue 32 item 11)', async () => {
    const h = await hub();
    const home = path.join(tmp, 'home-samesize');
    const want = sha256(fs.readFileSync(path.join(ckpt, WEIGHTS)));
    const blob = path.join(repoDir(home, REPO), 'blobs', want);
    fs.mkdirSync(path.dirname(blob), { recursive: true });
    fs.writeFileSync(blob, Buffer.alloc(fs.statSync(path.join(ckpt, WEIGHTS)).size, 7));
    const r = await vela(['models', 'download', REPO], { HF_HOME: home, HF_ENDPOINT: h.url }).done;
    expect(r.code, r.stderr).toBe(0);
    expect(sha256(fs.readFileSync(path.join(repoDir(home, REPO), 'snapshots', h.commitOf(REPO), WEIGHTS)))).toBe(want);
  });

  it('a gated repository: one line naming the cause and the fix, without a token and with a token that has no access', async () => {
    const h = await hub();
    const home = path.join(tmp, 'home-gated');
    const args = ['models', 'download', PALI, '--include', 'tokenizer*'];
    // Refused both ways (nothing is written): the two runs are independent, started together.
    const [none, wrong] = await Promise.all([
      vela(args, { HF_HOME: home, HF_ENDPOINT: h.url }).done,
      vela(args, { HF_HOME: home, HF_ENDPOINT: h.url, HF_TOKEN: 'hf_someone_else' }).done,
    ]);
    expect(none.code).toBe(1);
    expect(none.stderr.trim().split('\n').at(-1)).toBe(`vela models download: ${PALI} is gated: accept its licence at https://huggingface.co/${PALI} while logged in, then set HF_TOKEN=<a read token> (or pass --token)`);
    expect(wrong.code).toBe(1);
    expect(wrong.stderr.trim().split('\n').at(-1)).toBe(`vela models download: ${PALI} is gated and the token given has no access to it: accept its licence at https://huggingface.co/${PALI} while logged in as that token's account (or use a read token of an account that has), then set HF_TOKEN=<that token> (or pass --token)`);
    expect(findPaligemmaTokenizer({ HF_HOME: home })).toBe(null);

    const ok = await vela([...args, '--token', 'hf_granted'], { HF_HOME: home, HF_ENDPOINT: h.url }).done;
    expect(ok.code).toBe(0);
    const snapshot = path.join(repoDir(home, PALI), 'snapshots', h.commitOf(PALI));
    expect(fs.readdirSync(snapshot).sort()).toEqual(['tokenizer.json', 'tokenizer_config.json']);
    expect(findPaligemmaTokenizer({ HF_HOME: home })).toBe(path.join(snapshot, 'tokenizer.json'));
    // Found where huggingface_hub's HF_HUB_CACHE puts it too.
    expect(findPaligemmaTokenizer({ HF_HUB_CACHE: path.join(home, 'hub') })).toBe(path.join(snapshot, 'tokenizer.json'));
  });
});

describe('downloadModel', () => {
  it('two downloads of one repository in one process fetch each blob once', async () => {
    const h = await hub();
    const cacheDir = path.join(tmp, 'home-twice', 'hub');
    const weights = fs.readFileSync(path.join(ckpt, WEIGHTS));
    const [a, b] = await Promise.all([0, 1].map(() => downloadModel({ repoId: REPO, endpoint: h.url, cacheDir })));
    expect(a!.snapshot).toBe(b!.snapshot);
    expect(Buffer.compare(fs.readFileSync(path.join(a!.snapshot, WEIGHTS)), weights)).toBe(0);
    expect(a!.transferredBytes + b!.transferredBytes).toBe(a!.totalBytes);
    expect(a!.skipped + b!.skipped).toBe(a!.files);
    expect(h.requests.filter((q) => q.url === `/cdn/${sha256(weights)}` && q.range === undefined).length).toBe(1);
  });

  it('a transfer that goes silent is broken off after idleTimeoutMs and resumed from the bytes it kept', async () => {
    const stall = 200_000;
    const h = await hub({ stallAfter: new Map([[WEIGHTS, stall]]) });
    const weights = fs.readFileSync(path.join(ckpt, WEIGHTS));
    const phases: string[] = [];
    const r = await downloadModel({ repoId: REPO, endpoint: h.url, cacheDir: path.join(tmp, 'home-silent', 'hub'), idleTimeoutMs: 2000, onProgress: (p) => p.file === WEIGHTS && phases.push(p.phase) });
    expect(Buffer.compare(fs.readFileSync(path.join(r.snapshot, WEIGHTS)), weights)).toBe(0);
    expect(phases).toContain('retry');
    // The first resumed GET (resolve, then the CDN) starts at the stalled bytes; a loaded machine may add more.
    const ranged = h.requests.filter((q) => q.range !== undefined && q.range !== 'bytes=0-0').map((q) => q.range);
    expect(ranged.slice(0, 2)).toEqual([`bytes=${stall}-${weights.length - 1}`, `bytes=${stall}-${weights.length - 1}`]);
  });

  it('a revision that is not a ref name is refused before any request', async () => {
    const h = await hub();
    const err = await downloadModel({ repoId: REPO, endpoint: h.url, cacheDir: path.join(tmp, 'home-rev', 'hub'), revision: '../../etc' }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ModelError);
    expect((err as ModelError).message).toBe('revision "../../etc" is not a branch, tag or commit name');
    expect(h.requests).toEqual([]);
  });

  it('a server that answers a resumed range with the whole file: the file starts over instead of growing', async () => {
    const h = await hub({ cutAfter: new Map([[WEIGHTS, 300_000]]), ignoreResumeRange: true });
    const cacheDir = path.join(tmp, 'home-norange', 'hub');
    const phases: string[] = [];
    const r = await downloadModel({ repoId: REPO, endpoint: h.url, cacheDir, onProgress: (p) => p.file === WEIGHTS && phases.push(p.phase) });
    const weights = fs.readFileSync(path.join(ckpt, WEIGHTS));
    expect(Buffer.compare(fs.readFileSync(path.join(r.snapshot, WEIGHTS)), weights)).toBe(0);
    expect(phases).toContain('retry');
    // Asked to resume, refused (200), then fetched whole.
    const gets = h.requests.filter((q) => q.url === `/cdn/${sha256(weights)}` && q.range !== 'bytes=0-0').map((q) => q.range ?? 'whole');
    expect(gets[0]).toBe('whole');
    expect(gets.at(-1)).toBe('whole');
    expect(gets.some((g) => /^bytes=[1-9]\d*-/.test(g))).toBe(true);
  });
});

describe('vela models list / inspect', () => {
  it('inspect reads the parameter count, dtypes, config and norm stats from the headers of a writeHubCheckpoint folder', async () => {
    const [f32, bf16] = await Promise.all([vela(['models', 'inspect', ckpt, '--json'], {}).done, vela(['models', 'inspect', ckptBf16], {}).done]);
    expect(f32.code).toBe(0);
    const s = JSON.parse(f32.stdout);
    expect(s).toMatchObject({
      kind: 'pi05', parameters: nParams, storedValues: nParams + cfg.vlm.vocabSize * cfg.expert.width,
      dtypes: { F32: piParamShapes(cfg).length + 1 }, normStats: true, weightFiles: [WEIGHTS],
      normStatsFiles: ['policy_preprocessor.json', 'policy_preprocessor_step_3_normalizer_processor.safetensors'],
      config: { variant: 'pi05', vlmWidth: 64, vlmDepth: 4, expertWidth: 32, expertDepth: 4, visionWidth: 32, actionHorizon: 10, tokenLimit: 200, maxActionDim: 32 },
    });
    expect(s.sizeBytes).toBe(fs.readdirSync(ckpt).reduce((a: number, f: string) => a + fs.statSync(path.join(ckpt, f)).size, 0));
    expect(bf16.code).toBe(0);
    expect(bf16.stdout).toContain(`parameters  ${(nParams / 1e3).toFixed(1)}K (${nParams}), dtypes BF16 x${piParamShapes(cfg).length + 1}, in model-00001-of-`);
    expect(bf16.stdout).toContain('norm stats  none');
  });

  it('openpi\'s norm stats (assets/<id>/norm_stats.json) count; LeRobot\'s need both the processor json and its safetensors', async () => {
    const dir = path.join(tmp, 'openpi_style');
    fs.mkdirSync(path.join(dir, 'assets', 'trossen'), { recursive: true });
    fs.copyFileSync(path.join(ckpt, 'config.json'), path.join(dir, 'config.json'));
    fs.copyFileSync(path.join(ckpt, WEIGHTS), path.join(dir, WEIGHTS));
    fs.writeFileSync(path.join(dir, 'policy_preprocessor.json'), '{}');
    expect(await inspectModel(dir)).toMatchObject({ kind: 'pi05', normStats: false, normStatsFiles: [] });
    fs.writeFileSync(path.join(dir, 'assets', 'trossen', 'norm_stats.json'), '{"norm_stats": {}}');
    expect(await inspectModel(dir)).toMatchObject({ kind: 'pi05', normStats: true, normStatsFiles: ['assets/trossen/norm_stats.json'], parameters: nParams });
    // A folder without a pi config is told apart, not an error; a missing one is.
    expect((await inspectModel(tokDir)).kind).toBe('tokenizer');
    await expect(inspectModel(path.join(tmp, 'nope'))).rejects.toThrow(`${path.join(tmp, 'nope')}: no such folder`);
  });

  it('list shows the cached checkpoint and tokenizer and the folders given, one row each', async () => {
    const h = await hub();
    const home = path.join(tmp, 'home-list');
    // Two repositories' downloads into one cache, and then three reads of it: each set independent, started together.
    const downloads = await Promise.all([
      vela(['models', 'download', REPO], { HF_HOME: home, HF_ENDPOINT: h.url }).done,
      vela(['models', 'download', PALI, '--include', 'tokenizer*', '--token', 'hf_granted'], { HF_HOME: home, HF_ENDPOINT: h.url }).done,
    ]);
    expect(downloads.map((d) => d.code)).toEqual([0, 0]);
    const [r, table, byId] = await Promise.all([
      vela(['models', 'list', ckptBf16, '--json'], { HF_HOME: home }).done,
      vela(['models', 'list'], { HF_HOME: home }).done,
      // inspect by Hub id reads the cache, never the network.
      vela(['models', 'inspect', REPO, '--json'], { HF_HOME: home, HF_ENDPOINT: 'http://127.0.0.1:9' }).done,
    ]);
    expect(r.code).toBe(0);
    const rows = JSON.parse(r.stdout) as { name: string; revision: string | null; kind: string; parameters: number | null; dtypes: Record<string, number>; normStats: boolean; path: string }[];
    expect(rows.map((x) => [x.name, x.revision, x.kind, x.parameters, Object.keys(x.dtypes), x.normStats])).toEqual([
      [PALI, 'main', 'tokenizer', null, [], false],
      [REPO, 'main', 'pi05', nParams, ['F32'], true],
      [ckptBf16, null, 'pi05', nParams, ['BF16'], false],
    ]);
    expect(rows[1]!.path).toBe(path.join(repoDir(home, REPO), 'snapshots', h.commitOf(REPO)));
    expect(table.stdout.split('\n')[0]).toMatch(/^MODEL\s+REVISION\s+TYPE\s+PARAMS\s+DTYPE\s+SIZE\s+NORM STATS\s+PATH$/);
    expect(table.stdout).toMatch(new RegExp(`${REPO}\\s+main\\s+pi05\\s+${(nParams / 1e3).toFixed(1)}K\\s+F32\\s+[\\d.]+ MB\\s+yes\\s+/`));
    expect(JSON.parse(byId.stdout)).toMatchObject({ repoId: REPO, revision: 'main', parameters: nParams });
  });

  it('--help on every subcommand', async () => {
    const all = [['models', '--help'], ['models', 'download', '--help'], ['models', 'init', '--help'], ['models', 'list', '--help'], ['models', 'inspect', '--help']];
    // Independent processes, started together.
    const results = await Promise.all(all.map((args) => vela(args, {}).done));
    for (const [i, args] of all.entries()) {
      const r = results[i]!;
      expect(r.code, args.join(' ')).toBe(0);
      expect(r.stdout).toContain('vela models download REPO_ID [--revision R] [--endpoint URL] [--token T] [--include GLOB]...');
      expect(r.stdout).toContain(`vela models download ${PALI} --include 'tokenizer*'`);
      expect(r.stdout).toContain('vela models init FOLDER --variant pi05|pi0 [--size tiny|full] [--seed N] [--dtype bf16|f32] [--no-tokenizer] [--force] [--dry-run]');
    }
  });
});

describe('resolveBase', () => {
  it('the cache folder: HF_HUB_CACHE, else HF_HOME/hub, else XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub', () => {
    expect(hubCacheDir({ HF_HUB_CACHE: '/a/hub', HF_HOME: '/b', XDG_CACHE_HOME: '/c' })).toBe('/a/hub');
    expect(hubCacheDir({ HF_HOME: '/b', XDG_CACHE_HOME: '/c' })).toBe('/b/hub');
    expect(hubCacheDir({ XDG_CACHE_HOME: '/c' })).toBe('/c/huggingface/hub');
    expect(hubCacheDir({})).toBe(path.join(os.homedir(), '.cache', 'huggingface', 'hub'));
  });

  it('a folder as is; a Hub id from the cache; absent: the one-line fix, or a download when allowed', async () => {
    const h = await hub();
    const home = path.join(tmp, 'home-resolve');
    const env = { HF_HOME: home, HF_ENDPOINT: h.url };
    expect(await resolveBase(ckpt, { env })).toEqual({ dir: ckpt, repoId: null, revision: null });
    const err = await resolveBase(REPO, { env }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ModelError);
    expect((err as ModelError).code).toBe('not_downloaded');
    expect((err as ModelError).message).toBe(`base ${REPO} is not in the Hugging Face cache (${repoDir(home, REPO)}); run \`vela models download ${REPO}\` or start the server with --allow-downloads`);
    const phases: string[] = [];
    const got = await resolveBase(REPO, { env, allowDownload: true, onProgress: (p) => phases.push(p.phase) });
    const snapshot = path.join(repoDir(home, REPO), 'snapshots', h.commitOf(REPO));
    expect(got).toEqual({ dir: snapshot, repoId: REPO, revision: h.commitOf(REPO) });
    expect(phases.filter((p) => p === 'done').length).toBe(fs.readdirSync(ckpt).length);
    const before = h.requests.length;
    expect(await resolveBase(`${REPO}@main`, { env })).toEqual(got);
    expect(h.requests.length).toBe(before);
    expect(((await resolveBase(`${REPO}@v9`, { env, allowDownload: true }).catch((e: unknown) => e)) as ModelError).message).toBe(`${REPO} has no revision v9 on ${h.url}`);
    expect(((await resolveBase('./no/such/dir', { env }).catch((e: unknown) => e)) as ModelError).code).toBe('not_found');
    expect(((await resolveBase('not a ref', { env }).catch((e: unknown) => e)) as ModelError).code).toBe('bad_argument');
  });
});

const python = pythonEnv().python ?? 'python3';
function hfHubReason(): string | null {
  const r = spawnSync(python, ['-c', 'import huggingface_hub'], { encoding: 'utf8' });
  return r.status === 0 ? null : `Python's huggingface_hub is not importable by ${python} (${(r.stderr || r.error?.message || '').trim().split('\n').at(-1)})`;
}

/** test/python/hf_cache_check.py: huggingface_hub's own view of a cache, as JSON. */
function hfCacheCheck(args: string[], env: Record<string, string> = {}): Promise<any> {
  return new Promise((resolve, reject) => {
    execFile(python, [path.join(ROOT, 'test/python/hf_cache_check.py'), ...args], { env: { ...process.env, HF_HUB_DISABLE_TELEMETRY: '1', ...env }, timeout: 120_000 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`hf_cache_check.py ${args.join(' ')} failed: ${stderr.slice(-2000)}`));
      else resolve(JSON.parse(stdout));
    });
  });
}

describe('resolveBase on a partial download', () => {
  it('a snapshot without its weights is not a base: named as partial, and completed (only the missing files) when downloads are allowed', async () => {
    const h = await hub();
    const cacheDir = path.join(tmp, 'home-partial', 'hub');
    const env = { HF_HUB_CACHE: cacheDir, HF_ENDPOINT: h.url };
    await downloadModel({ repoId: REPO, endpoint: h.url, cacheDir, include: ['config.json'] });
    const snapshot = path.join(cacheDir, `models--${REPO.replace('/', '--')}`, 'snapshots', h.commitOf(REPO));
    const err = (await resolveBase(REPO, { env }).catch((e: unknown) => e)) as ModelError;
    expect(err.code).toBe('not_downloaded');
    expect(err.message).toBe(`base ${REPO} is only partly in the Hugging Face cache (${snapshot}: ${snapshot} has neither model.safetensors nor model.safetensors.index.json); run \`vela models download ${REPO}\` or start the server with --allow-downloads`);
    const done: string[] = [];
    const got = await resolveBase(REPO, { env, allowDownload: true, onProgress: (p) => p.phase === 'done' && done.push(p.file) });
    expect(got.dir).toBe(snapshot);
    expect(done.sort()).toEqual(fs.readdirSync(ckpt).filter((f) => f !== 'config.json').sort());
  });
});

describe.skipIf(missing('Python huggingface_hub', hfHubReason()))('the same cache as huggingface_hub (LeRobot, transformers)', () => {
  it('huggingface_hub finds what Vela downloaded offline, with no cache warnings; Vela finds what huggingface_hub downloaded and fetches nothing', async () => {
    const h = await hub();
    const commit = h.commitOf(REPO);
    const files = fs.readdirSync(ckpt).sort();
    // Vela -> huggingface_hub, and huggingface_hub's own download into another cache: independent, started together.
    const velaCache = path.join(tmp, 'interop-vela', 'hub');
    const pyCache = path.join(tmp, 'interop-py', 'hub');
    const [seen, got] = await Promise.all([
      (async () => {
        expect((await vela(['models', 'download', REPO], { HF_HUB_CACHE: velaCache, HF_ENDPOINT: h.url }).done).code).toBe(0);
        return hfCacheCheck(['read', velaCache, REPO], { HF_HUB_OFFLINE: '1' });
      })(),
      hfCacheCheck(['download', h.url, pyCache, REPO]),
    ]);
    expect(seen.snapshot).toBe(path.join(velaCache, `models--${REPO.replace('/', '--')}`, 'snapshots', commit));
    expect(seen.warnings).toEqual([]);
    expect(seen.repos).toEqual([{ repo_id: REPO, repo_type: 'model', revisions: [{ commit, refs: ['main'], files, size: expect.any(Number) }] }]);

    // huggingface_hub (from the same mirror) -> Vela: used in place, nothing transferred.
    expect(got.snapshot).toBe(path.join(pyCache, `models--${REPO.replace('/', '--')}`, 'snapshots', commit));
    const before = h.requests.length;
    const again = await vela(['models', 'download', REPO], { HF_HUB_CACHE: pyCache, HF_ENDPOINT: h.url }).done;
    expect(again.code).toBe(0);
    expect(again.stdout.trim()).toBe(got.snapshot);
    expect(fileRequests(h, before)).toEqual([]);
    expect(await resolveBase(REPO, { env: { HF_HUB_CACHE: pyCache } })).toEqual({ dir: got.snapshot, repoId: REPO, revision: commit });
    const inspected = JSON.parse((await vela(['models', 'inspect', REPO, '--json'], { HF_HUB_CACHE: pyCache }).done).stdout);
    expect(inspected).toMatchObject({ kind: 'pi05', parameters: nParams, normStats: true });
  });
});

describe('a resumed transfer checks where the 206 starts (issue 32 item 12)', () => {
  it('a 206 whose Content-Range starts elsewhere than the kept bytes is not appended: the file starts over and arrives whole', async () => {
    const h = await hub({ cutAfter: new Map([[WEIGHTS, 300_000]]), wrongRangeStart: true });
    const phases: string[] = [];
    const r = await downloadModel({ repoId: REPO, endpoint: h.url, cacheDir: path.join(tmp, 'home-wrongrange', 'hub'), onProgress: (p) => p.file === WEIGHTS && phases.push(p.phase) });
    expect(phases).toContain('retry');
    expect(Buffer.compare(fs.readFileSync(path.join(r.snapshot, WEIGHTS)), fs.readFileSync(path.join(ckpt, WEIGHTS)))).toBe(0);
    // The answer from byte 0 to the resumed request was refused, then the file was fetched from 0.
    const ranged = h.requests.filter((q) => q.range !== undefined && q.range !== 'bytes=0-0').map((q) => q.range!);
    expect(ranged.some((q) => /^bytes=[1-9]\d*-/.test(q))).toBe(true);
  });
});
