/**
 * The README, followed as written (issue 14), so the documentation cannot rot:
 * - the quickstart's `vela finetune` (2 steps, a temp --output) trains on the shipped sample
 *   and keeps its checkpoints; its `vela policy` (port 0 instead of 8000) serves the result;
 * - the README's Python client (the package's, and the raw-websocket one it links in
 *   examples/openpi_wire) runs unchanged against that `vela policy`, and, with its job line
 *   uncommented, against a job's policy on `vela serve`, started as the README's curl body asks;
 * - the raw real-time chunking loop the README links (examples/openpi_wire/rtc_loop.py) runs
 *   against the same `vela policy` with a synthetic robot, splicing each answer in at the row it
 *   should (the package's loop: python-package.test.ts);
 * - the README's training-session example (TypeScript) runs against the same server;
 * - "Try the real models offline": `vela models init` a tiny pi0.5, inspect it, serve it, one request.
 * Code is cut from README.md (and read from the files it links) at run time; only addresses, keys,
 * ids and step counts are swapped.
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, startTestServer, TEST_KEY, type TestServer } from './helpers/server.ts';
import { missing, pythonEnv } from './helpers/requires.ts';
import { PolicyClient } from '../bench/harness/policy-stub.ts';
import { ndarray } from '../protocol/ndarray.ts';

const run = promisify(execFile);
const REPO = path.resolve(import.meta.dirname, '..');
const README = fs.readFileSync(path.join(REPO, 'README.md'), 'utf8');
const PY = pythonEnv();
const noPython = missing('the Python test environment', PY.reason);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-readme-'));
const children: ChildProcess[] = [];
afterAll(() => {
  for (const c of children) c.kill('SIGKILL');
  fs.rmSync(tmp, { recursive: true, force: true });
});

/** The first ```lang block after the heading that starts with `heading`. */
function block(heading: string, lang: string, n = 0): string {
  const at = README.indexOf(`\n## ${heading}`);
  expect(at, `README heading "## ${heading}"`).toBeGreaterThan(0);
  let open = README.indexOf('```' + lang + '\n', at);
  for (let i = 0; i < n; i++) open = README.indexOf('```' + lang + '\n', open + 1);
  expect(open, `a \`\`\`${lang} block under "## ${heading}"`).toBeGreaterThan(0);
  return README.slice(open + lang.length + 4, README.indexOf('\n```', open + 3));
}

/** `text` with `from` replaced by `to`; fails when the README no longer has `from`. */
function swap(text: string, from: string, to: string): string {
  expect(text, 'the README text this test swaps').toContain(from);
  return text.replace(from, to);
}

/** The raw-websocket examples the README links (examples/openpi_wire): wire.py's helpers, the client, the RTC loop. */
const WIRE_DIR = path.join(REPO, 'examples/openpi_wire');
const wireExample = (name: string) => {
  expect(README, `the README links examples/openpi_wire/${name}`).toContain(`(examples/openpi_wire/${name})`);
  return fs.readFileSync(path.join(WIRE_DIR, name), 'utf8');
};

/** The README's policy client with the package (`vela`), and the one on raw websockets it links. */
const PY_CLIENTS = { package: block('Python clients', 'python', 0), raw: wireExample('policy_client.py') };
const POLICY_LINE = 'url, api_key = "ws://127.0.0.1:8000", None';
const JOB_LINE = '# url, api_key = "ws://127.0.0.1:8080/v1/fine-tunes/<id>/policy", "my-key"';

/**
 * Runs both of the README's Python clients with their first url line replaced; returns the lines
 * each printed (the package from its source folder, as `pip install ./clients/python` gives it).
 */
async function runPythonClients(urlLine: string): Promise<Record<keyof typeof PY_CLIENTS, string[]>> {
  const out = {} as Record<keyof typeof PY_CLIENTS, string[]>;
  for (const [which, code] of Object.entries(PY_CLIENTS) as [keyof typeof PY_CLIENTS, string][]) {
    const script = path.join(tmp, `client-${which}-${Date.now()}.py`);
    fs.writeFileSync(script, swap(code, POLICY_LINE, urlLine));
    try {
      const env = { ...process.env, PYTHONPATH: path.join(REPO, which === 'package' ? 'clients/python/src' : 'examples/openpi_wire') };
      const { stdout, stderr } = await run(PY.python!, [script], { timeout: 120_000, env });
      expect(stderr, `the README's ${which} client printed warnings`).toBe('');
      out[which] = stdout.trim().split('\n');
    } catch (e) {
      throw new Error(`the README's ${which} Python client failed:\n${(e as { stderr?: string }).stderr ?? (e as Error).message}`);
    }
  }
  return out;
}

/** A command line of the README as argv (the README's commands need no shell quoting). */
/** The websocket URL a spawned `vela policy` prints once it listens (kept in `children` to be stopped). */
function listening(child: ChildProcess): Promise<string> {
  children.push(child);
  let stderr = '';
  child.stderr!.on('data', (d) => (stderr += d));
  return new Promise<string>((resolve, reject) => {
    let text = '';
    child.stdout!.on('data', (d) => {
      text += d;
      const m = /Vela policy server on (ws:\/\/\S+)/.exec(text);
      if (m) resolve(m[1]!);
    });
    child.once('exit', (code) => reject(new Error(`vela policy exited ${code}: ${stderr}`)));
  });
}

function argvOf(line: string): string[] {
  return line.replace(/\s+#.*$/, '').trim().split(/\s+/);
}

describe('the quickstart', () => {
  const quick = block('Quickstart', 'sh').split('\n');
  const finetuneLine = quick.find((l) => l.startsWith('npx vela finetune '))!;
  const policyLine = quick.find((l) => l.startsWith('npx vela policy '))!;
  const out = path.join(tmp, 'g1');
  let policyUrl = '';
  let finetuneLog = '';

  beforeAll(async () => {
    expect(finetuneLine).toBeDefined();
    expect(policyLine).toBeDefined();
    // `npx vela` runs bin/vela.js; 2 steps instead of 300, and a temp folder for --output.
    let args = argvOf(finetuneLine).slice(2);
    args[args.indexOf('--steps') + 1] = '2';
    args[args.indexOf('--output') + 1] = out;
    const r = await run(process.execPath, ['bin/vela.js', ...args], { cwd: REPO, timeout: 280_000, env: { ...process.env, VELA_BACKEND: process.env.VELA_BACKEND ?? 'wasm' } });
    finetuneLog = r.stderr;
    args = argvOf(policyLine).slice(2);
    expect(args.slice(0, 2)).toEqual(['policy', '~/vela-runs/g1/weights/final']);
    args[1] = path.join(out, 'weights', 'final');
    args[args.indexOf('--port') + 1] = '0';
    const child = spawn(process.execPath, ['bin/vela.js', ...args], { cwd: REPO, env: { ...process.env, VELA_BACKEND: process.env.VELA_BACKEND ?? 'wasm', VELA_API_KEY: '' }, stdio: ['ignore', 'pipe', 'pipe'] });
    policyUrl = await listening(child);
  }, 300_000);

  it('trains on the shipped sample and keeps every checkpoint\'s weights, not the resumable state', () => {
    expect(finetuneLog).toMatch(/succeeded after 2 steps/);
    // checkpoint_every defaults to the eval interval: a quarter of 2 steps, rounded up.
    expect(fs.readdirSync(path.join(out, 'weights')).sort()).toEqual(['final', 'step-0000001']);
    // The default, a full fine-tune; the final model also keeps how it was made (its card's Training section).
    expect(fs.readdirSync(path.join(out, 'weights', 'step-0000001')).sort()).toEqual(['config.json', 'model.safetensors', 'norm_stats.json']);
    expect(fs.readdirSync(path.join(out, 'weights', 'final')).sort()).toEqual(['config.json', 'model.safetensors', 'norm_stats.json', 'vela_training.json']);
    expect(JSON.parse(fs.readFileSync(path.join(out, 'weights', 'final', 'vela_training.json'), 'utf8'))).toMatchObject({ job_id: null, recipe: { steps: 2 } });
    expect(fs.existsSync(path.join(out, 'states'))).toBe(false);
    expect(fs.existsSync(path.join(out, 'resume.json'))).toBe(false);
    expect(finetuneLog).toContain(`checkpoint written at step 1: weights in ${path.join(out, 'weights', 'step-0000001')} (eval_loss `);
    expect(finetuneLog).toContain(`checkpoints kept in ${path.join(out, 'weights')}: step-0000001\n`);
    expect(finetuneLog).toContain(`serve it: vela policy ${path.join(out, 'weights', 'final')}\n`);
  });

  it.skipIf(noPython)('the README\'s Python clients (the package and raw websockets) get actions from `vela policy`, with no key', async () => {
    const lines = await runPythonClients(`url, api_key = "${policyUrl}", None`);
    expect(lines).toEqual({ package: ["['cam_high'] 26 16 26", '(16, 26) float32'], raw: ["['cam_high'] 26 16 26", '(16, 26) float32'] });
  });

  it.skipIf(noPython)('the README\'s real-time chunking loop runs against `vela policy`: RTC chunks after the first, each spliced in at the row it says', async () => {
    // wire.py's infer wrapped to keep what was sent and answered, then the RTC loop the README
    // links (examples/openpi_wire/rtc_loop.py) at 10 Hz for 60 ticks with a synthetic robot.
    const record = [
      'import json, wire',
      'sent, answers, executed_actions = [], [], []',
      '_infer = wire.infer',
      'def infer(ws, obs):',
      '    answer = _infer(ws, obs)',
      '    sent.append({k: v for k, v in obs.items() if k.startswith("rtc/")})',
      '    answers.append({"actions": answer["actions"].tolist(), "rtc": answer["server_timing"].get("rtc")})',
      '    return answer',
      'wire.infer = infer',
    ].join('\n');
    let rtc = wireExample('rtc_loop.py'); // the loop with the package: python-package.test.ts
    rtc = swap(rtc, 'url = "ws://127.0.0.1:8000"', `url = "${policyUrl}"`);
    rtc = swap(rtc, 'control_hz, execute_horizon, ticks = 30, 8, 300', 'control_hz, execute_horizon, ticks = 10, 8, 60');
    rtc = swap(rtc, 'np.zeros((480, 640, 3), np.uint8)', 'np.random.default_rng(done).integers(0, 256, (48, 64, 3), np.uint8)');
    rtc = swap(rtc, '"observation/state": np.zeros(26, np.float32)', '"observation/state": np.full(26, 0.01 * done, np.float32)');
    rtc = swap(rtc, 'def robot_step(action):                              # replace: command one action [action_dim], raw units\n    pass',
      'def robot_step(action):\n    executed_actions.append(action.tolist())');
    const script = path.join(tmp, 'rtc.py');
    fs.writeFileSync(script, [record, rtc, 'print(json.dumps({"sent": sent, "answers": answers, "executed": executed_actions}))'].join('\n'));
    let stdout = '';
    try {
      ({ stdout } = await run(PY.python!, [script], { timeout: 120_000, env: { ...process.env, PYTHONPATH: WIRE_DIR } }));
    } catch (e) {
      throw new Error(`the README's RTC loop failed:\n${(e as { stderr?: string }).stderr ?? (e as Error).message}`);
    }
    const lines = stdout.trim().split('\n');
    const seen = JSON.parse(lines.pop()!) as { sent: Record<string, number>[]; answers: { actions: number[][]; rtc: any }[]; executed: number[][] };
    const summary = /^(\d+) actions in 60 ticks; (\d+) ticks without one$/.exec(lines.pop()!);
    expect(summary, stdout).not.toBeNull();
    const [done, late] = [Number(summary![1]), Number(summary![2])];
    expect(done + late).toBe(60);
    expect(seen.executed).toHaveLength(done);
    // One line per answer: where it asked (rtc/executed) and the row k it spliced the answer in at.
    const splices = lines.map((l) => {
      const m = /^asked at action (None|\d+), spliced at row (\d+), rtc (\w+) \(delay (None|\d+)\)$/.exec(l);
      expect(m, l).not.toBeNull();
      return { executed: m![1] === 'None' ? null : Number(m![1]), k: Number(m![2]), mode: m![3], delay: m![4] };
    });
    expect(splices.length).toBeGreaterThanOrEqual(3);
    expect(seen.answers).toHaveLength(splices.length);
    expect(splices[0]).toEqual({ executed: null, k: 0, mode: 'plain', delay: 'None' });
    expect(seen.sent[0]).toEqual({ 'rtc/control_hz': 10 });
    expect(seen.answers[0]!.rtc).toBeNull();
    splices.slice(1).forEach((s, j) => {
      const i = j + 1;
      expect(s.executed).toBeGreaterThanOrEqual(8); // asked once 8 actions of the chunk had run
      expect(seen.sent[i]).toEqual({ 'rtc/control_hz': 10, 'rtc/executed': s.executed });
      expect(seen.answers[i]!.rtc).toMatchObject({ mode: 'guided', executed: s.executed, control_hz: 10, delay: Number(s.delay) });
      expect(seen.answers[i]!.rtc.weights).toHaveLength(16);
    });
    // Each executed action is the row the splices say: chunk i from row k_i until the next
    // request's capture (its rtc/executed) plus the k actions run while that one was out.
    const expected: number[][] = [];
    splices.forEach((s, i) => {
      const next = splices[i + 1];
      const end = next ? next.executed! + next.k : 16;
      for (let r = s.k; r < end && expected.length < done; r++) expected.push(seen.answers[i]!.actions[r]!);
    });
    expect(seen.executed).toEqual(expected);
    process.stdout.write(`README RTC loop: ${done} actions in 60 ticks at 10 Hz, ${late} without one; splices (rtc/executed / k / server's d): ${splices.slice(1).map((s) => `${s.executed}/${s.k}/d${s.delay}`).join(' ')}\n`);
  });
});

describe('"Try the real models offline", followed as written', () => {
  const lines = block('Try the real models offline', 'sh').split('\n').filter((l) => l.startsWith('npx vela '));
  const cwd = path.join(tmp, 'offline');
  const env = { ...process.env, VELA_BACKEND: process.env.VELA_BACKEND ?? 'wasm', VELA_API_KEY: '' };

  it('models init writes the tiny pi0.5, inspect reads it, and vela policy --base serves it an OpenPI request', { timeout: 180_000 }, async () => {
    expect(lines.map((l) => argvOf(l).slice(2, 4).join(' '))).toEqual(['models init', 'models inspect', 'policy --base']);
    fs.mkdirSync(cwd);
    const init = await run(process.execPath, [path.join(REPO, 'bin/vela.js'), ...argvOf(lines[0]!).slice(2)], { cwd, env, timeout: 60_000 });
    expect(init.stdout).toBe('./tiny_pi05\n');
    expect(fs.readdirSync(path.join(cwd, 'tiny_pi05')).sort()).toEqual(['README.md', 'config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json']);
    const inspect = await run(process.execPath, [path.join(REPO, 'bin/vela.js'), ...argvOf(lines[1]!).slice(2)], { cwd, env, timeout: 60_000 });
    // What the README's comment on that line says.
    expect(inspect.stdout).toMatch(/^\.\/tiny_pi05: pi05\n/);
    expect(inspect.stdout).toMatch(/parameters {2}370\.1K \(370112\), dtypes BF16 x\d+/);
    const args = argvOf(lines[2]!).slice(2);
    args[args.indexOf('--port') + 1] = '0';
    const child = spawn(process.execPath, [path.join(REPO, 'bin/vela.js'), ...args], { cwd, env, stdio: ['ignore', 'pipe', 'pipe'] });
    const url = await listening(child);
    const c = await PolicyClient.connect(url);
    try {
      expect(c.metadata).toMatchObject({ model: 'pi05', action_horizon: 10 });
      const image = ndarray(new Uint8Array(224 * 224 * 3).fill(128), [224, 224, 3]);
      const answer = await c.infer({ 'observation/image': image, 'observation/state': ndarray(new Float32Array(32).fill(0.1), [32]), prompt: 'pick up the cube' });
      expect(answer.actions.shape).toEqual([10, 32]);
      expect(Array.from(answer.actions.data as Float32Array).every(Number.isFinite)).toBe(true);
    } finally {
      c.close();
    }
  });
});

describe('the server, as "First fine-tune on the server" starts it', () => {
  let server: TestServer;
  let job: any;

  beforeAll(async () => {
    const sh = block('First fine-tune on the server', 'sh');
    expect(sh).toContain('VELA_API_KEY=my-key VELA_DATASETS_DIR=./datasets npm start');
    server = await startTestServer({ env: { VELA_DATASETS_DIR: path.join(REPO, 'datasets') } });
    const body = JSON.parse(/-d '([^']+)'/.exec(sh)![1]!);
    expect(body).toEqual({ dataset_name: 'g1_pick_bottle_sample', steps: 300 });
    const created = await api(server, 'POST', '/v1/fine-tunes', { ...body, steps: 2 });
    expect(created.status, JSON.stringify(created.json)).toBe(200);
    for (const deadline = Date.now() + 240_000; Date.now() < deadline; await new Promise((r) => setTimeout(r, 500))) {
      job = (await api(server, 'GET', `/v1/fine-tunes/${created.json.id}`)).json;
      if (['succeeded', 'failed', 'cancelled'].includes(job.status)) break;
    }
    expect(job.status, job.error).toBe('succeeded');
  }, 300_000);
  afterAll(() => server?.close());

  it('the job shows the cameras and action space it used, not null', () => {
    expect(job).toMatchObject({ cameras: ['cam_high'], action_space: 'delta' });
  });

  it.skipIf(noPython)('the README\'s Python clients, with their job line, get actions from the job\'s policy with the key (the package sends Api-Key, the raw client Bearer)', async () => {
    const line = swap(swap(swap(JOB_LINE, '# ', ''), 'ws://127.0.0.1:8080', server.baseUrl.replace('http', 'ws')), '<id>', job.id).replace('"my-key"', `"${TEST_KEY}"`);
    expect(await runPythonClients(line)).toEqual({ package: ["['cam_high'] 26 16 26", '(16, 26) float32'], raw: ["['cam_high'] 26 16 26", '(16, 26) float32'] });
  });

  it('the README\'s training-session example runs as written', async () => {
    const code = block('Training sessions', 'ts');
    const lines = code.split('\n');
    const imports = lines.filter((l) => l.startsWith('import ')).map((l) => l.replace("'./", "'../"));
    const rest = lines.filter((l) => !l.startsWith('import ')).join('\n');
    const script = [...imports, swap(swap(rest, "'http://127.0.0.1:8080'", `'${server.baseUrl}'`), "'my-key'", `'${TEST_KEY}'`),
      'console.log(JSON.stringify({ loss, shape: actions.shape, dtype: actions.dtype }));'].join('\n');
    const dir = path.join(REPO, '.tmp');
    fs.mkdirSync(dir, { recursive: true });
    const file = path.join(dir, `readme-session-${process.pid}.ts`);
    fs.writeFileSync(file, script);
    try {
      const { stdout } = await run(process.execPath, ['--import', 'tsx', file], { cwd: REPO, timeout: 200_000 });
      const r = JSON.parse(stdout.trim().split('\n').at(-1)!);
      expect(Number.isFinite(r.loss)).toBe(true);
      expect(r.loss).toBeGreaterThan(0);
      expect(r).toMatchObject({ shape: [1, 16, 32], dtype: '<f4' });
    } finally {
      fs.rmSync(file, { force: true });
    }
  }, 240_000);
});
