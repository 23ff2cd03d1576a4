#!/usr/bin/env node
/**
 * Sets up TensorFlow's native runtime for @tensorflow/tfjs-node (and tfjs-node-gpu when a GPU is
 * visible). npm runs it after every `npm ci` / `npm install` (package.json "postinstall"); run it
 * by hand with `npm run setup:native`. It never fails the install: every path that does not work
 * leaves one line saying why, and Vela then runs on the wasm backend.
 *
 * The native library (~800 MiB) lives once in a cache outside node_modules
 * ($VELA_CACHE_DIR, else $XDG_CACHE_HOME/vela, else ~/.cache/vela) under native/<variant>/ with
 * the package's own layout (deps/lib, lib/napi-v8); the package's `deps` and `lib/napi-v8` are
 * symbolic links to it, so a later `npm ci` links again in a second. Paths, in order:
 *   1. a variant already in the cache;
 *   2. the package's own install (downloads libtensorflow 2.9.1 and a prebuilt addon from
 *      Google's storage; needs that host), moved into the cache;
 *   3. a build from pip's tensorflow-cpu wheel: libtensorflow_cc.so.2 (the TF_* / TFE_* C API)
 *      and its headers, and the addon compiled with npm's bundled node-gyp against the local
 *      Node headers (needs python3 + pip reaching an index with the wheel, make and a C++
 *      compiler);
 *   4. none: the wasm backend.
 * Settings: VELA_NATIVE_SETUP=off skips it all; VELA_NATIVE_SOURCE=prebuilt|wheel tries one path.
 * What happened is written to node_modules/.vela-native.json, which kernels/backend/backend.ts reads to
 * say why the native backend is not in use.
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const TF_WHEEL = 'tensorflow-cpu==2.21.0';
const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const NM = path.join(ROOT, 'node_modules');
const STATUS_FILE = path.join(NM, '.vela-native.json');
// The C headers the addon includes, and the headers they include in turn.
const HEADER_DIRS = ['tensorflow/c/', 'tensorflow/core/platform/', 'tsl/platform/', 'xla/tsl/c/'];
const started = Date.now();

function cacheRoot() {
  if (process.env.VELA_CACHE_DIR) return path.resolve(process.env.VELA_CACHE_DIR);
  return path.join(process.env.XDG_CACHE_HOME || path.join(os.homedir(), '.cache'), 'vela');
}

function say(line) {
  console.log(`vela native: ${line}`);
}

/** Runs a command; returns null on success, else a one-line reason (the last line it printed). */
function run(cmd, args, opts = {}) {
  const r = spawnSync(cmd, args, { encoding: 'utf8', maxBuffer: 64 << 20, timeout: (opts.timeoutS ?? 900) * 1000, ...opts });
  if (r.error) return `${path.basename(cmd)}: ${r.error.code === 'ETIMEDOUT' ? `timed out after ${opts.timeoutS ?? 900} s` : r.error.message}`;
  if (r.status === 0) return null;
  const out = `${r.stdout ?? ''}\n${r.stderr ?? ''}`.split('\n').map((l) => l.trim()).filter(Boolean);
  const tell = out.filter((l) => /error|not found|cannot|could not|no matching|ENOTFOUND|EAI_AGAIN/i.test(l)).pop() ?? out.pop() ?? `exit ${r.status}`;
  return `${path.basename(cmd)} ${args[0] ?? ''} failed: ${tell.slice(0, 240)}`;
}

function pkgInfo(name) {
  const dir = path.join(NM, name);
  try {
    return { dir, version: JSON.parse(fs.readFileSync(path.join(dir, 'package.json'), 'utf8')).version };
  } catch {
    return null;
  }
}

/** True when an NVIDIA GPU is visible to this process (CUDA_VISIBLE_DEVICES may hide them all). */
function gpuVisible(env = process.env) {
  const cvd = env.CUDA_VISIBLE_DEVICES;
  if (cvd !== undefined && (cvd.trim() === '' || cvd.trim() === '-1')) return false;
  try {
    return fs.readdirSync('/proc/driver/nvidia/gpus').length > 0;
  } catch {
    return false;
  }
}

/** Loads the package in a child process and runs one op; null when it works, else why not. */
function loads(pkgName) {
  const code = `const tf = require(${JSON.stringify(pkgName)}); const t = tf.tensor([1, 2, 3]).square().sum().dataSync()[0];
    if (tf.getBackend() !== 'tensorflow' || t !== 14) throw new Error('backend ' + tf.getBackend() + ' gave ' + t); `;
  return run(process.execPath, ['-e', code], { cwd: ROOT, env: { ...process.env, TF_CPP_MIN_LOG_LEVEL: '3' }, timeoutS: 120 });
}

/** Points the package's deps/ and lib/napi-v8 at a cached variant. */
function link(pkg, variantDir) {
  for (const rel of ['deps', 'lib/napi-v8']) {
    const at = path.join(pkg.dir, rel);
    fs.rmSync(at, { recursive: true, force: true });
    fs.mkdirSync(path.dirname(at), { recursive: true });
    fs.symlinkSync(path.join(variantDir, rel), at);
  }
}

function unlink(pkg) {
  for (const rel of ['deps', 'lib/napi-v8']) fs.rmSync(path.join(pkg.dir, rel), { recursive: true, force: true });
}

/** Moves a finished staging folder into place; another install may have won the race. */
function publish(stage, variantDir) {
  try {
    fs.renameSync(stage, variantDir);
  } catch (e) {
    if (!fs.existsSync(path.join(variantDir, 'lib/napi-v8/tfjs_binding.node'))) throw e;
  }
  fs.rmSync(stage, { recursive: true, force: true });
}

/** Path 2: the package's own install script, then its output moved into the cache. */
function viaPackageInstall(pkg, variantDir, kind) {
  const env = { ...process.env, PATH: `${path.join(NM, '.bin')}${path.delimiter}${process.env.PATH}` };
  const why = run(process.execPath, ['scripts/install.js', kind === 'node-gpu' ? 'gpu' : 'cpu', 'download'], { cwd: pkg.dir, env, timeoutS: 900 });
  if (why) {
    unlink(pkg);
    return `the package's own install could not fetch libtensorflow (${why})`;
  }
  const stage = `${variantDir}.tmp-${process.pid}`;
  fs.mkdirSync(path.join(stage, 'lib'), { recursive: true });
  fs.renameSync(path.join(pkg.dir, 'deps'), path.join(stage, 'deps'));
  fs.renameSync(path.join(pkg.dir, 'lib/napi-v8'), path.join(stage, 'lib/napi-v8'));
  publish(stage, variantDir);
  return null;
}

/** Path 3: libtensorflow from pip's tensorflow-cpu wheel, the addon built with node-gyp. */
function viaWheel(pkg, variantDir) {
  const python = ['python3', 'python'].find((p) => !spawnSync(p, ['-m', 'pip', '--version']).status);
  if (!python) return 'no python3 with pip to fetch the tensorflow-cpu wheel';
  const stage = `${variantDir}.tmp-${process.pid}`;
  fs.rmSync(stage, { recursive: true, force: true });
  fs.mkdirSync(path.join(stage, 'deps/lib'), { recursive: true });
  try {
    say(`building from pip's ${TF_WHEEL} wheel (262 MiB download, about 1-3 minutes)`);
    const wheels = path.join(stage, 'wheel');
    let why = run(python, ['-m', 'pip', 'download', '--no-deps', '--only-binary=:all:', '--disable-pip-version-check', '-q', '-d', wheels, TF_WHEEL], { timeoutS: 900 });
    if (why) return `pip could not fetch ${TF_WHEEL} (${why})`;
    // Unpack only the two libraries and the C headers (the wheel holds ~13,000 headers).
    const unpack = `import sys, zipfile, shutil, os
z = zipfile.ZipFile(sys.argv[1]); out = sys.argv[2]; heads = sys.argv[3].split(',')
for n in ('libtensorflow_cc.so.2', 'libtensorflow_framework.so.2'):
    with z.open('tensorflow/' + n) as s, open(os.path.join(out, 'lib', n), 'wb') as d: shutil.copyfileobj(s, d, 1 << 22)
for i in z.infolist():
    rel = i.filename[len('tensorflow/include/'):]
    if i.filename.startswith('tensorflow/include/') and rel.endswith('.h') and any(rel.startswith(h) for h in heads):
        dest = os.path.join(out, 'include', rel); os.makedirs(os.path.dirname(dest), exist_ok=True)
        with z.open(i) as s, open(dest, 'wb') as d: shutil.copyfileobj(s, d)`;
    const wheel = path.join(wheels, fs.readdirSync(wheels).find((f) => f.endsWith('.whl')));
    why = run(python, ['-c', unpack, wheel, path.join(stage, 'deps'), HEADER_DIRS.join(',')]);
    fs.rmSync(wheels, { recursive: true, force: true });
    if (why) return `could not unpack the wheel (${why})`;
    // The addon links -ltensorflow; the wheel's library of the eager C API is libtensorflow_cc.
    fs.symlinkSync('libtensorflow_cc.so.2', path.join(stage, 'deps/lib/libtensorflow.so'));
    fs.symlinkSync('libtensorflow_framework.so.2', path.join(stage, 'deps/lib/libtensorflow_framework.so'));
    const build = path.join(stage, 'build');
    fs.mkdirSync(build);
    fs.cpSync(path.join(pkg.dir, 'binding'), path.join(build, 'binding'), { recursive: true });
    fs.copyFileSync(path.join(pkg.dir, 'binding.gyp'), path.join(build, 'binding.gyp'));
    fs.symlinkSync(path.join(stage, 'deps'), path.join(build, 'deps'));
    const gyp = nodeGyp();
    if (!gyp) return "npm's bundled node-gyp was not found";
    const args = [gyp, 'rebuild', '--napi_build_version=8', '--module_name=tfjs_binding', `--module_path=${path.join(stage, 'lib/napi-v8')}`, `-j${Math.max(1, os.availableParallelism?.() ?? 2)}`];
    // Local headers when this Node ships them (Debian's nodejs does): no header download.
    const nodedir = path.resolve(path.dirname(process.execPath), '..');
    if (fs.existsSync(path.join(nodedir, 'include/node/node_api.h'))) args.push(`--nodedir=${nodedir}`);
    why = run(process.execPath, args, { cwd: build, timeoutS: 900 });
    if (why) return `the addon did not build (${why})`;
    fs.rmSync(build, { recursive: true, force: true });
    fs.writeFileSync(path.join(stage, 'SOURCE'), `libtensorflow from pip's ${TF_WHEEL} wheel; addon ${pkg.version} built here with node-gyp\n`);
    publish(stage, variantDir);
    return null;
  } catch (e) {
    return `the wheel build failed (${e.message.split('\n')[0]})`;
  } finally {
    fs.rmSync(stage, { recursive: true, force: true });
  }
}

/** npm sets npm_config_node_gyp for lifecycle scripts; otherwise look beside npm itself. */
function nodeGyp() {
  const cands = [process.env.npm_config_node_gyp, path.join(path.dirname(process.execPath), '../lib/node_modules/npm/node_modules/node-gyp/bin/node-gyp.js')];
  return cands.find((c) => c && fs.existsSync(c)) ?? null;
}

/** Sets up one package ('node' or 'node-gpu'); returns { ok, source } or { ok: false, reason }. */
function setup(kind) {
  const name = kind === 'node-gpu' ? '@tensorflow/tfjs-node-gpu' : '@tensorflow/tfjs-node';
  const pkg = pkgInfo(name);
  if (!pkg) return { ok: false, reason: `${name} is not installed` };
  const native = path.join(cacheRoot(), 'native');
  fs.mkdirSync(native, { recursive: true });
  const variants = kind === 'node-gpu'
    ? [{ source: 'prebuilt', dir: `tfjs-node-gpu-${pkg.version}-prebuilt` }]
    : [{ source: 'prebuilt', dir: `tfjs-node-${pkg.version}-prebuilt` }, { source: 'wheel', dir: `tfjs-node-${pkg.version}-${TF_WHEEL.replace('==', '-')}` }];
  const only = process.env.VELA_NATIVE_SOURCE;
  const reasons = [];
  for (const v of variants) {
    if (only && only !== v.source) continue;
    const dir = path.join(native, v.dir);
    const cached = fs.existsSync(path.join(dir, 'lib/napi-v8/tfjs_binding.node'));
    if (!cached) {
      const why = v.source === 'prebuilt' ? viaPackageInstall(pkg, dir, kind) : viaWheel(pkg, dir);
      if (why) {
        reasons.push(why);
        continue;
      }
    }
    link(pkg, dir);
    const why = loads(name);
    if (!why) return { ok: true, source: v.source, dir, cached };
    unlink(pkg);
    reasons.push(`${dir} did not load (${why})`);
  }
  return { ok: false, reason: reasons.join('; ') || `no source for ${name} (VELA_NATIVE_SOURCE=${only})` };
}

function main() {
  if ((process.env.VELA_NATIVE_SETUP ?? '').toLowerCase() === 'off') {
    return { node: { ok: false, reason: 'skipped (VELA_NATIVE_SETUP=off)' } };
  }
  const status = {};
  if (pkgInfo('@tensorflow/tfjs-node-gpu')) {
    status['node-gpu'] = gpuVisible() ? setup('node-gpu') : { ok: false, reason: 'no NVIDIA GPU is visible' };
  }
  status.node = setup('node');
  return status;
}

let status;
try {
  status = main();
} catch (e) {
  status = { node: { ok: false, reason: `setup failed: ${e.message.split('\n')[0]}` } };
}
const s = (Date.now() - started) / 1000;
const best = status['node-gpu']?.ok ? 'node-gpu' : status.node?.ok ? 'node' : null;
if (best) {
  const r = status[best];
  say(`${best === 'node-gpu' ? 'tfjs-node-gpu' : 'tfjs-node'} ready (${r.source === 'wheel' ? `libtensorflow from ${TF_WHEEL}` : 'the package\'s own libtensorflow'}, ${r.cached ? 'cached' : 'new'} in ${r.dir}; ${s.toFixed(0)} s)`);
} else {
  say(`not available, Vela will use the wasm backend: ${status.node?.reason}`);
}
try {
  fs.writeFileSync(STATUS_FILE, JSON.stringify({ at: new Date().toISOString(), best, ...status }, null, 2) + '\n');
} catch {
  // No node_modules to write into: nothing reads the file then either.
}
process.exit(0);
