/**
 * Hostile bodies against a real `vela serve` (a child process, default settings but a temporary
 * data folder): what they cost it in RSS and in `/healthz` latency. `npx tsx bench/abuse.ts`.
 *
 * 1. idle: `/healthz` alone.
 * 2. at once: `PUT /v1/datasets/bomb` with a ~10 MB .tgz that inflates to 1 GiB (extracted in
 *    full: the default --max-dataset-bytes is 8 GiB; then refused, it holds no dataset) and an
 *    unauthenticated `POST /v1/fine-tunes` declaring a 900 MB body, sent in full whatever the answer.
 * 3. `POST /training/job_start` with 600 MB of base64 `dataset_content` (not an archive: a 400
 *    once decoded to disk).
 * Prints p50 / p99 / max of `/healthz` during each, the server's RSS growth (peak over before),
 * and each answer.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { NodeProc } from './harness/node-proc.ts';
import WebSocket from 'ws';
import { VelaClient, type Datum } from '../protocol/client.ts';
import { PolicyClient } from './harness/policy-stub.ts';
import { g1Datums } from './harness/g1.ts';
import { fileChunks, probeHealth, quantile, rssBytes, sendBody, watchRss, writeBombTgz, type SentBody } from './harness/abuse.ts';

const KEY = 'bench-abuse-key';
const MiB = 1024 * 1024;
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-abuse-'));

async function measure(server: NodeProc, what: string, work: () => Promise<SentBody[]>): Promise<void> {
  const pid = server.child.pid!;
  global.gc?.();
  const before = rssBytes(pid);
  const rss = watchRss(pid);
  const probe = probeHealth(server.baseUrl);
  const t0 = performance.now();
  const answers = await work();
  const ms = performance.now() - t0;
  await new Promise((r) => setTimeout(r, 300));
  const times = await probe.stop();
  const peak = rss.stop();
  const f = (x: number) => x.toFixed(1);
  console.log(`${what}: ${(ms / 1000).toFixed(1)} s; /healthz x${times.length} p50 ${f(quantile(times, 0.5))} ms, p99 ${f(quantile(times, 0.99))} ms, max ${f(Math.max(...times))} ms; RSS ${f(before / MiB)} MiB -> peak ${f(peak / MiB)} MiB (+${f((peak - before) / MiB)} MiB)`);
  for (const a of answers) console.log(`  -> ${a.status} ${a.body.slice(0, 160)} (${f(a.sentBytes / MiB)} MiB of body sent; answered after ${a.answeredAfterBytes === null ? '-' : f(a.answeredAfterBytes / MiB)} MiB)`);
}

async function main(): Promise<void> {
  const bomb = path.join(tmp, 'bomb.tgz');
  const bombBytes = writeBombTgz(bomb, 1024 * MiB);
  console.log(`bomb: ${(bombBytes / MiB).toFixed(1)} MiB .tgz inflating to 1024 MiB`);
  const server = await NodeProc.start({ VELA_API_KEY: KEY, VELA_DATA_DIR: path.join(tmp, 'data'), VELA_DATASETS_DIR: path.join(tmp, 'datasets') });
  const port = Number(new URL(server.baseUrl).port);
  try {
    await new Promise((r) => setTimeout(r, 1000));
    await measure(server, 'idle 3 s', async () => (await new Promise((r) => setTimeout(r, 3000)), []));
    await measure(server, 'bomb .tgz + 900 MB unauthenticated body, at once', () => Promise.all([
      sendBody(port, `PUT /v1/datasets/bomb HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nContent-Length: ${bombBytes}`, bombBytes, { source: fileChunks(bomb), waitMs: 120_000 }),
      // An attacker sends it all, whatever the answer.
      sendBody(port, 'POST /v1/fine-tunes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 900000000', 900_000_000, { keepSending: true }),
    ]));
    const content = 600_000_000; // base64 characters
    const head = '{"dataset": "big", "dataset_content": "';
    const tail = '"}';
    const chunk = Buffer.alloc(1024 * 1024, 'A');
    async function* body() {
      yield Buffer.from(head);
      for (let left = content; left > 0; left -= chunk.length) yield left >= chunk.length ? chunk : chunk.subarray(0, left);
      yield Buffer.from(tail);
    }
    const total = head.length + content + tail.length;
    await measure(server, 'job_start with 600 MB of dataset_content', async () => [
      await sendBody(port, `POST /training/job_start HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nContent-Type: application/json\r\nContent-Length: ${total}`, total, { source: body(), waitMs: 120_000 }),
    ]);
  } finally {
    await server.stop();
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

// ---- Websocket frames and connections (issue 32, item 8) ----------------------------------------

/** Open a websocket; resolves with the socket once its greeting arrives, or the refusal's status and body. */
function openWs(url: string, headers: Record<string, string>): Promise<{ ws: WebSocket } | { status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url, { headers });
    ws.once('message', () => resolve({ ws }));
    ws.on('unexpected-response', (_req, res) => {
      let body = '';
      res.on('data', (d: Buffer) => (body += d.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    ws.on('error', (e) => { if (!/Unexpected server response/.test(e.message)) reject(e); });
  });
}

/**
 * Three 1000 MiB frames on three authenticated policy connections (a training session's policy
 * websocket), then 20 policy connections of one key: the server's RSS before, at the peak during,
 * and after; the close codes and refusals. Written to bench/results/ws-frames.json.
 */
async function wsFrames(server: NodeProc): Promise<void> {
  const pid = server.child.pid!;
  const client = new VelaClient(server.baseUrl, KEY);
  const s = await client.waitReady((await client.createSession({ base_model: 'flow05-tiny' })).id);
  // One forward_backward binds the session's cameras, so its policy websocket takes connections.
  const conn = await client.connect(s);
  await conn.forwardBackward(await g1Datums(2, { episode: 0 }), { codec: 'JPEG' });
  await conn.close();
  const policyUrl = server.baseUrl.replace(/^http/, 'ws') + `/v1/training_sessions/${s.id}/policy`;
  const auth = { authorization: `Bearer ${KEY}` };
  const f = (x: number) => Number((x / MiB).toFixed(1));
  const frame = Buffer.alloc(1000 * MiB, 1);
  await new Promise((r) => setTimeout(r, 500));
  const before1 = rssBytes(pid);
  let rss = watchRss(pid);
  const codes = await Promise.all([0, 1, 2].map(async () => {
    const o = await openWs(policyUrl, auth);
    if (!('ws' in o)) return `refused ${o.status}`;
    return new Promise<string>((resolve) => {
      o.ws.on('close', (code, reason) => resolve(`${code} ${JSON.stringify(reason.toString())}`));
      o.ws.on('error', () => {});
      o.ws.send(frame);
    });
  }));
  const peak1 = rss.stop();
  await new Promise((r) => setTimeout(r, 500));
  const after1 = rssBytes(pid);
  const health1 = (await fetch(`${server.baseUrl}/healthz`)).status;
  console.log(`three 1000 MiB frames on three policy connections: RSS ${f(before1)} MiB -> peak ${f(peak1)} MiB (+${f(peak1 - before1)} MiB) -> after ${f(after1)} MiB; closes ${codes.join(', ')}; /healthz ${health1}`);

  const before2 = rssBytes(pid);
  rss = watchRss(pid);
  const opened: WebSocket[] = [];
  const refused: string[] = [];
  for (let i = 0; i < 20; i++) {
    const o = await openWs(policyUrl, auth);
    if ('ws' in o) opened.push(o.ws);
    else refused.push(`${o.status} ${o.body}`);
  }
  // Each open connection tries its own 1000 MiB frame as well.
  await Promise.all(opened.map((ws) => new Promise<void>((resolve) => { ws.on('close', () => resolve()); ws.on('error', () => {}); ws.send(frame); })));
  const peak2 = rss.stop();
  await new Promise((r) => setTimeout(r, 500));
  const after2 = rssBytes(pid);
  console.log(`20 policy connections of one key, each sending 1000 MiB: ${opened.length} opened, ${refused.length} refused (${refused[0] ?? '-'}); RSS ${f(before2)} MiB -> peak ${f(peak2)} MiB (+${f(peak2 - before2)} MiB) -> after ${f(after2)} MiB`);
  const out = {
    date: new Date().toISOString(),
    frames: { rss_before_mib: f(before1), rss_peak_mib: f(peak1), rss_after_mib: f(after1), closes: codes, healthz: health1 },
    connections: { tried: 20, opened: opened.length, refused: refused.length, first_refusal: refused[0] ?? null, rss_before_mib: f(before2), rss_peak_mib: f(peak2), rss_after_mib: f(after2) },
  };
  fs.writeFileSync(path.join(path.dirname(new URL(import.meta.url).pathname), 'results', 'ws-frames.json'), JSON.stringify(out, null, 2) + '\n');
}

// ---- Two keys on one engine: every client-settable value (issue 32, item 7) ----------------------

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** G1 frame, state and prompt as a robot sends them to a policy websocket (the session binds cam_high). */
function robotObservation(d: Datum, camera = true): Record<string, unknown> {
  return { ...(camera ? { 'observation/cam_high': Buffer.from(d.observation.image!.cam_high as Uint8Array), image_codec: 'JPEG' } : {}), 'observation/state': d.observation.state, prompt: d.observation.prompt };
}

/** Percentile summary of request times, ms (one decimal). */
function summary(times: number[]): { n: number; p50_ms: number; p99_ms: number; max_ms: number } {
  const r = (x: number) => Number(x.toFixed(1));
  return { n: times.length, p50_ms: r(quantile(times, 0.5)), p99_ms: r(quantile(times, 0.99)), max_ms: r(Math.max(...times)) };
}

function loadAvg(): string {
  return fs.readFileSync('/proc/loadavg', 'utf8').trim();
}

/**
 * Key A's robot: a closed loop at 30 Hz on its session's policy websocket with real-time chunking
 * (rtc/control_hz 30, rtc/executed the ticks since its last answer: guided chunks), until
 * `stop()` says so. Returns each request's time from send to answer, ms.
 */
async function robotAt30Hz(c: PolicyClient, obs: Record<string, unknown>, stop: () => boolean): Promise<number[]> {
  const period = 1000 / 30;
  const times: number[] = [];
  let next = performance.now();
  let lastAnswer: number | null = null;
  while (!stop()) {
    const wait = next - performance.now();
    if (wait > 0) await sleep(wait);
    const executed = lastAnswer === null ? null : Math.min(15, Math.max(1, Math.round((performance.now() - lastAnswer) / period)));
    const t0 = performance.now();
    await c.infer({ ...obs, 'rtc/control_hz': 30, ...(executed === null ? {} : { 'rtc/executed': executed }) });
    lastAnswer = performance.now();
    times.push(lastAnswer - t0);
    next = Math.max(next + period, performance.now()); // late: the next tick is now (no catch-up burst)
  }
  return times;
}

/**
 * Key B: connection after connection on its own session's policy websocket, as fast as answers
 * come, each with the settings `settings(k)` gives (query string, observations to send), until
 * `stop()`. Returns B's request times and how many connections it made.
 */
async function sweeper(url: string, auth: Record<string, string>, settings: (k: number) => { query: string; requests: Record<string, unknown>[]; parallel?: number }, stop: () => boolean): Promise<{ times: number[]; connections: number; errors: string[] }> {
  const times: number[] = [];
  const errors: string[] = [];
  let k = 0;
  while (!stop()) {
    const { query, requests, parallel = 1 } = settings(k++);
    // `parallel` connections with the same settings send together: the batcher's batch sizes.
    const conns = await Promise.all(Array.from({ length: parallel }, () => PolicyClient.connect(`${url}?${query}`, auth)));
    for (const obs of requests) {
      await Promise.all(conns.map(async (c) => {
        const t0 = performance.now();
        try {
          await c.infer(obs);
          times.push(performance.now() - t0);
        } catch (e) {
          if (errors.length < 5) errors.push((e as Error).message.slice(0, 200));
        }
      }));
    }
    for (const c of conns) c.close();
    await Promise.all(conns.map((c) => c.closed()));
  }
  return { times, connections: k, errors };
}

/**
 * Two keys, one engine (`vela serve`, native TensorFlow: the sessions' live policies share the
 * flow05-tiny engine and, with the same LoRA structure, its graphs). Key A's robot runs at
 * 30 Hz throughout; its request times are measured alone, then while key B (1) reconnects
 * with one fixed setting (the load of B's requests alone), (2) sweeps every client-settable
 * number (rtc_max_guidance 3.000001, 3.000002, ..., rtc_delay, rtc_schedule, control_hz, seed,
 * stream, rtc/executed, rtc/delay, rtc/control_hz), (3) sweeps the layouts it can choose (rtc
 * mode guided / prefix / off, the camera sent or not, 1-4 connections at once: batch parts 1, 2,
 * 4). Written to bench/results/rtc-sweep.json with A's p50 / p99 ratios.
 */
async function rtcSweep(seconds: number): Promise<void> {
  const dataDir = path.join(tmp, 'data');
  // VELA_GRAPH_DEBUG: the engine prints a line per graph it traces (counted per phase from the server's stderr).
  const env = { VELA_API_KEY: KEY, VELA_DATA_DIR: dataDir, VELA_DATASETS_DIR: path.join(tmp, 'datasets'), VELA_BACKEND: 'node', VELA_GRAPH_DEBUG: '1' };
  const bin = path.join(path.dirname(new URL(import.meta.url).pathname), '..', 'bin', 'vela.js');
  const keyB = execFileSync(process.execPath, [bin, 'keys', 'create', '--name', 'sweeper'], { env: { ...process.env, ...env } }).toString().trim();
  const server = await NodeProc.start(env);
  try {
    const datums = await g1Datums(2, { episode: 0 });
    const wsUrl = async (key: string) => {
      const client = new VelaClient(server.baseUrl, key);
      const s = await client.waitReady((await client.createSession({ base_model: 'flow05-tiny' })).id);
      const conn = await client.connect(s);
      await conn.forwardBackward(datums, { codec: 'JPEG' }); // binds cam_high: the policy websocket takes robots
      await conn.close();
      return server.baseUrl.replace(/^http/, 'ws') + `/v1/training_sessions/${s.id}/policy`;
    };
    const urlA = await wsUrl(KEY);
    const urlB = await wsUrl(keyB);
    const authA = { authorization: `Bearer ${KEY}` };
    const authB = { authorization: `Bearer ${keyB}` };
    const obs = robotObservation(datums[0]!);
    const robot = await PolicyClient.connect(urlA, authA);
    // A's own graphs (plain, then guided at batch 1) trace in its first requests, alone.
    let until = performance.now() + 5000;
    await robotAt30Hz(robot, obs, () => performance.now() > until);
    await sleep(1000); // the worker's stderr lines arrive late
    // The sampling layouts the engine traced (kernels/sample-graph.ts prints each under VELA_GRAPH_DEBUG).
    const traces = () => [...server.stderr.matchAll(/^sample graph: tracing layout (\S+)/gm)].map((m) => m[1]!);
    const warmTraces = traces();
    const phases: Record<string, unknown> = {};
    const phase = async (name: string, settings: Parameters<typeof sweeper>[2] | null) => {
      const load0 = loadAvg();
      const traces0 = traces().length;
      until = performance.now() + seconds * 1000;
      const stop = () => performance.now() > until;
      const [a, b] = await Promise.all([robotAt30Hz(robot, obs, stop), settings ? sweeper(urlB, authB, settings, stop) : Promise.resolve(null)]);
      await sleep(1000);
      const traced = traces().slice(traces0);
      phases[name] = {
        a: summary(a), ...(b ? { b: { ...summary(b.times), connections: b.connections, errors: b.errors } } : {}),
        layouts_traced: traced, loadavg_before: load0, loadavg_after: loadAvg(),
      };
      console.log(`${name}: traced ${JSON.stringify(traced)}; A ${JSON.stringify(summary(a))}${b ? `; B ${b.connections} connections, ${JSON.stringify(summary(b.times))}${b.errors.length ? ` errors ${JSON.stringify(b.errors)}` : ''}` : ''}; load ${loadAvg()}`);
    };
    const two = (extra: Record<string, unknown>) => [obs, { ...obs, 'rtc/executed': 1, ...extra }];
    await phase('a_alone', null);
    await phase('b_fixed', () => ({ query: 'rtc_max_guidance=5', requests: two({ 'rtc/delay': 2 }) }));
    await phase('b_sweeps_numbers', (k) => ({
      query: new URLSearchParams({
        rtc_max_guidance: (3 + (k + 1) * 1e-6).toFixed(6), rtc_delay: String(k % 9), rtc_schedule: k % 2 ? 'exp' : 'linear',
        control_hz: String(5 + (k % 200) * 0.5), seed: String(k), stream: `s${k}`,
      }).toString(),
      requests: two({ 'rtc/executed': k % 16, 'rtc/delay': k % 7, 'rtc/control_hz': 1 + k }),
    }));
    await phase('b_sweeps_layouts', (k) => ({
      query: `rtc=${['guided', 'prefix', 'off'][k % 3]}`,
      requests: [robotObservation(datums[0]!, k % 2 === 0), { ...robotObservation(datums[0]!, k % 4 < 2), 'rtc/executed': 1, 'rtc/delay': 2 }],
      parallel: 1 + (k % 4),
    }));
    robot.close();
    const ratio = (p: string, q: 'p50_ms' | 'p99_ms') => Number(((phases[p] as any).a[q] / (phases.a_alone as any).a[q]).toFixed(2));
    const out = {
      date: new Date().toISOString(),
      what: 'key A: one robot at 30 Hz (guided RTC) on its session\'s policy websocket; key B on its own session, same flow05-tiny engine (vela serve, native TensorFlow)',
      seconds_per_phase: seconds,
      layouts_traced_before_phases: warmTraces,
      cores: os.cpus().length,
      phases,
      a_ratio_to_alone: Object.fromEntries(['b_fixed', 'b_sweeps_numbers', 'b_sweeps_layouts'].map((p) => [p, { p50: ratio(p, 'p50_ms'), p99: ratio(p, 'p99_ms') }])),
      a_p99_sweep_numbers_over_fixed: Number(((phases.b_sweeps_numbers as any).a.p99_ms / (phases.b_fixed as any).a.p99_ms).toFixed(2)),
    };
    console.log(JSON.stringify(out.a_ratio_to_alone), 'numbers/fixed p99', out.a_p99_sweep_numbers_over_fixed);
    fs.writeFileSync(path.join(path.dirname(new URL(import.meta.url).pathname), 'results', 'rtc-sweep.json'), JSON.stringify(out, null, 2) + '\n');
  } finally {
    await server.stop();
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

if (process.argv.includes('--rtc-sweep')) {
  const i = process.argv.indexOf('--seconds');
  await rtcSweep(i > 0 ? Number(process.argv[i + 1]) : 20);
} else if (process.argv.includes('--ws')) {
  const server = await NodeProc.start({ VELA_API_KEY: KEY, VELA_DATA_DIR: path.join(tmp, 'data'), VELA_DATASETS_DIR: path.join(tmp, 'datasets') });
  try {
    await wsFrames(server);
  } finally {
    await server.stop();
    fs.rmSync(tmp, { recursive: true, force: true });
  }
} else if (process.argv.includes('--help') || process.argv.includes('-h')) {
  console.log(`usage: npx tsx bench/abuse.ts

Starts vela serve (a child process, temporary folders) and sends it hostile bodies: a .tgz that
inflates to 1 GiB with a 900 MB unauthenticated body at the same time, then job_start with 600 MB
of dataset_content. Prints /healthz p50 / p99 / max during each and the server's RSS growth.
Takes no options; about a minute on 2 cores, and ~2.6 GB of temporary disk.
  --ws   only the websocket attack instead: three 1000 MiB frames on three policy connections,
         then 20 connections of one key; RSS before / peak / after to bench/results/ws-frames.json
  --rtc-sweep [--seconds S]   only the two-key attack on one engine instead (native TensorFlow):
         key A's robot at 30 Hz alone, then while key B reconnects with a fixed setting, sweeps
         every client-settable number (rtc_max_guidance 3.000001, ...), sweeps the layouts it can
         pick; S seconds each (20); A's p50 / p99 and ratios to bench/results/rtc-sweep.json`);
} else {
  await main();
}
