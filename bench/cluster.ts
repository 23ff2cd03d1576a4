/**
 * `npm run bench:cluster`: fine-tune job throughput of a cluster with 1 and with 2 nodes, each a
 * real `vela serve` process with one engine, on one throwaway PostgreSQL and one shared folder,
 * everything on 127.0.0.1. Per node count: one untimed job per node first (each node decodes the
 * dataset's frames once and builds its engine), then `--jobs` jobs submitted at once to the first
 * node, timed from the first submit to the last success. Prints a markdown table and writes
 * bench/results/cluster.json.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { startPostgres } from './harness/postgres.ts';
import { NodeProc } from './harness/node-proc.ts';
import { g1Subset } from './harness/g1.ts';

const USAGE = `Usage: npm run bench:cluster -- [--jobs N] [--steps N] [--batch N] [--nodes LIST]

Job throughput with 1 and 2 Vela nodes (one engine each) on one PostgreSQL, on 127.0.0.1.
  --jobs N     timed jobs per run (default 6)
  --steps N    steps per job (default 20)
  --batch N    batch size (default 4)
  --nodes LIST node counts to run (default 1,2)
`;

const { values } = parseArgs({ options: { jobs: { type: 'string', default: '6' }, steps: { type: 'string', default: '20' }, batch: { type: 'string', default: '4' }, nodes: { type: 'string', default: '1,2' }, help: { type: 'boolean' } } });
if (values.help) {
  process.stdout.write(USAGE);
  process.exit(0);
}
const int = (name: string, v: string) => {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1) throw new Error(`--${name} is '${v}'; expected a positive integer`);
  return n;
};
const JOBS = int('jobs', values.jobs!);
const STEPS = int('steps', values.steps!);
const BATCH = int('batch', values.batch!);
const COUNTS = values.nodes!.split(',').map((n) => int('nodes', n));
const KEY = 'vela-bench-cluster-key-0123';

const subset = g1Subset(3);
const job = (seed: number) => ({ model: 'flow05-tiny', dataset_name: subset.name, steps: STEPS, batch_size: BATCH, learning_rate: 3e-3, eval_every: 0, checkpoint_every: 10, seed });

async function call(base: string, method: string, url: string, body?: unknown): Promise<any> {
  const res = await fetch(base + url, { method, headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' }, body: body === undefined ? undefined : JSON.stringify(body) });
  const json = await res.json();
  if (!res.ok) throw new Error(`${method} ${url}: ${res.status} ${JSON.stringify(json)}`);
  return json;
}

/** CPU seconds (user + system, all threads) a process used so far, from /proc (null elsewhere). */
function cpuSeconds(pid: number | undefined): number | null {
  try {
    const fields = fs.readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
    return (Number(fields[11]) + Number(fields[12])) / 100; // utime, stime in clock ticks (USER_HZ = 100)
  } catch {
    return null;
  }
}

async function runJobs(base: string, seeds: number[]): Promise<{ seconds: number; byNode: Record<string, number> }> {
  const t0 = performance.now();
  const ids: string[] = [];
  for (const s of seeds) ids.push((await call(base, 'POST', '/v1/fine-tunes', job(s))).id);
  for (;;) {
    const js = await Promise.all(ids.map((id) => call(base, 'GET', `/v1/fine-tunes/${id}`)));
    const bad = js.find((j) => j.status === 'failed' || j.status === 'cancelled');
    if (bad) throw new Error(`job ${bad.id} ${bad.status}: ${bad.error}`);
    if (js.every((j) => j.status === 'succeeded')) {
      const byNode: Record<string, number> = {};
      for (const j of js) byNode[j.node] = (byNode[j.node] ?? 0) + 1;
      return { seconds: (performance.now() - t0) / 1000, byNode };
    }
    await new Promise((r) => setTimeout(r, 250));
  }
}

const pg = await startPostgres();
if (!pg) throw new Error('bench:cluster needs PostgreSQL binaries (apt-get install postgresql)');
const rows: { nodes: number; jobs: number; seconds: number; jobsPerMin: number; byNode: Record<string, number>; coresPerNode: (number | null)[]; loadAvg: number[] }[] = [];
try {
  for (const count of COUNTS) {
    const url = await pg.newDatabase('vela_bench');
    const storage = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-bench-shared-'));
    const nodes: NodeProc[] = [];
    try {
      for (let i = 0; i < count; i++) {
        nodes.push(await NodeProc.start({
          VELA_DATABASE_URL: url, VELA_STORAGE_DIR: storage, VELA_DATA_DIR: fs.mkdtempSync(path.join(os.tmpdir(), 'vela-bench-node-')),
          VELA_NODE_ID: `n${i + 1}`, VELA_API_KEY: KEY, VELA_DATASETS_DIR: subset.root,
        }));
      }
      const base = nodes[0]!.baseUrl;
      process.stderr.write(`${count} node(s): warm-up (${count} job(s), one per node)\n`);
      await runJobs(base, Array.from({ length: count }, (_, i) => 1000 + i));
      process.stderr.write(`${count} node(s): ${JOBS} timed jobs of ${STEPS} steps, batch ${BATCH}\n`);
      const cpu0 = nodes.map((n) => cpuSeconds(n.child.pid));
      const r = await runJobs(base, Array.from({ length: JOBS }, (_, i) => i));
      const coresPerNode = nodes.map((n, i) => {
        const c = cpuSeconds(n.child.pid);
        return c === null || cpu0[i] === null ? null : (c - cpu0[i]!) / r.seconds;
      });
      rows.push({ nodes: count, jobs: JOBS, seconds: r.seconds, jobsPerMin: (JOBS * 60) / r.seconds, byNode: r.byNode, coresPerNode, loadAvg: os.loadavg() });
    } finally {
      await Promise.all(nodes.map((n) => n.stop()));
      fs.rmSync(storage, { recursive: true, force: true });
    }
  }
} finally {
  await pg.stop();
}

const base = rows[0]!;
process.stdout.write(`\n${os.cpus().length} cores\n\n| nodes | jobs (${STEPS} steps, batch ${BATCH}, flow05-tiny LoRA) | wall time | jobs / min | vs 1 node | jobs per node | cores used per node | host load (1 min) |\n| - | - | - | - | - | - | - | - |\n`);
for (const r of rows) {
  const cores = r.coresPerNode.map((c) => (c === null ? '?' : c.toFixed(2))).join(', ');
  process.stdout.write(`| ${r.nodes} | ${r.jobs} | ${r.seconds.toFixed(1)} s | ${r.jobsPerMin.toFixed(2)} | ${(r.jobsPerMin / base.jobsPerMin).toFixed(2)}x | ${Object.entries(r.byNode).map(([n, c]) => `${n}: ${c}`).join(', ')} | ${cores} | ${r.loadAvg[0]!.toFixed(1)} |\n`);
}
fs.mkdirSync(path.join(import.meta.dirname, 'results'), { recursive: true });
fs.writeFileSync(path.join(import.meta.dirname, 'results', 'cluster.json'), JSON.stringify({ when: new Date().toISOString(), cpus: os.cpus().length, steps: STEPS, batch: BATCH, rows }, null, 2));
