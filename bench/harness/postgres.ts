/**
 * Test and bench harness: a throwaway PostgreSQL cluster in a temporary folder, with Debian's binaries
 * (`/usr/lib/postgresql/<v>/bin`, or `initdb` on PATH), on 127.0.0.1 and a free port, trust
 * authentication, durability off (a test cluster is thrown away). PostgreSQL refuses to run as
 * root, so under root (CI) the cluster runs as the `postgres` user that Debian's package makes.
 * `stop()` stops it and deletes the folder.
 *
 * Without the binaries: `startPostgres()` resolves null; callers skip with
 * `missing('PostgreSQL', postgresSkipReason)` (helpers/requires.ts), which fails under CI=true.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import pg from 'pg';

export interface TestPostgres {
  /** `postgres://vela@127.0.0.1:<port>/postgres` */
  url: string;
  port: number;
  /** A new empty database on the cluster; its URL. */
  newDatabase(prefix?: string): Promise<string>;
  /** Stop the server (fast shutdown: clients are disconnected), keeping its data. */
  pause(): Promise<void>;
  /** Start it again on the same port, with the same data. */
  resume(): Promise<void>;
  stop(): Promise<void>;
}

/** Why PostgreSQL tests cannot run here, or null when the binaries are present. */
export const postgresSkipReason: string | null = findBinDir() ? null : 'no initdb in /usr/lib/postgresql/*/bin or on PATH (Debian: apt-get install postgresql)';

function findBinDir(): string | null {
  const root = '/usr/lib/postgresql';
  if (fs.existsSync(root)) {
    const versions = fs.readdirSync(root).filter((v) => fs.existsSync(path.join(root, v, 'bin', 'initdb'))).sort((a, b) => Number(b) - Number(a));
    if (versions.length > 0) return path.join(root, versions[0]!, 'bin');
  }
  const which = spawnSync('sh', ['-c', 'command -v initdb'], { encoding: 'utf8' });
  return which.status === 0 && which.stdout.trim() ? path.dirname(which.stdout.trim()) : null;
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(port));
    });
  });
}

/** Start a cluster (see the module comment); null without the binaries. @throws when it fails to start. */
export async function startPostgres(): Promise<TestPostgres | null> {
  const bin = findBinDir();
  if (!bin) return null;
  const asRoot = process.getuid?.() === 0;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-pg-'));
  let uid: number | null = null;
  if (asRoot) {
    try {
      uid = Number(execFileSync('id', ['-u', 'postgres'], { encoding: 'utf8' }).trim());
      const gid = Number(execFileSync('id', ['-g', 'postgres'], { encoding: 'utf8' }).trim());
      fs.chownSync(dir, uid, gid);
    } catch {
      throw new Error('running as root and there is no "postgres" user to run PostgreSQL as (Debian\'s postgresql package makes one)');
    }
  }
  const runAs = (cmd: string, args: string[]) => {
    const [file, argv] = asRoot ? ['runuser', ['-u', 'postgres', '--', path.join(bin, cmd), ...args]] : [path.join(bin, cmd), args];
    const r = spawnSync(file, argv, { encoding: 'utf8', cwd: dir });
    if (r.status !== 0) throw new Error(`${cmd} failed (${r.status}): ${r.stderr || r.stdout}`);
  };
  const data = path.join(dir, 'data');
  runAs('initdb', ['-D', data, '-U', 'vela', '--auth=trust', '-E', 'UTF8', '--no-sync', '--no-instructions']);
  let port = 0;
  const optsFor = (p: number) => `-c listen_addresses=127.0.0.1 -p ${p} -k ${dir} -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200`;
  for (let attempt = 0; ; attempt++) {
    port = await freePort();
    try {
      runAs('pg_ctl', ['-D', data, '-o', optsFor(port), '-l', path.join(dir, 'log'), '-w', '-t', '60', 'start']);
      break;
    } catch (e) {
      if (attempt >= 2) throw new Error(`${(e as Error).message}\n${fs.existsSync(path.join(dir, 'log')) ? fs.readFileSync(path.join(dir, 'log'), 'utf8') : ''}`);
    }
  }
  const url = `postgres://vela@127.0.0.1:${port}/postgres`;
  let n = 0;
  return {
    url,
    port,
    async newDatabase(prefix = 'vela_test') {
      const name = `${prefix}_${process.pid}_${++n}`;
      const c = new pg.Client({ connectionString: url });
      await c.connect();
      try {
        await c.query(`CREATE DATABASE ${name}`);
      } finally {
        await c.end();
      }
      return `postgres://vela@127.0.0.1:${port}/${name}`;
    },
    async pause() {
      runAs('pg_ctl', ['-D', data, '-m', 'fast', '-w', '-t', '60', 'stop']);
    },
    async resume() {
      runAs('pg_ctl', ['-D', data, '-o', optsFor(port), '-l', path.join(dir, 'log'), '-w', '-t', '60', 'start']);
    },
    async stop() {
      try {
        runAs('pg_ctl', ['-D', data, '-m', 'immediate', '-w', 'stop']);
      } finally {
        fs.rmSync(dir, { recursive: true, force: true });
      }
    },
  };
}
