/**
 * The arrows of the layout (the developers' brief): server -> protocol, server -> kernels, never
 * back; protocol/ holds no tfjs; nothing outside test/ imports test/ (what the tests and the bench
 * both drive lives in bench/harness); server/http and server/store import no route, engine or
 * model (their README.md); and no module imports itself through others (a cycle). Read from the
 * sources' static and dynamic relative imports.
 */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const ROOMS = ['server', 'protocol', 'kernels', 'bench', 'scripts', 'test'];
const SPEC = /(?:^|\n)\s*(?:import|export)\s[^'"`;]*?from\s*['"]([^'"]+)['"]|\bimport\(\s*['"]([^'"]+)['"]\s*\)|(?:^|\n)\s*import\s*['"]([^'"]+)['"]/g;

/** Every .ts file under the rooms, relative to the root, with the specifiers it imports. */
function sources(): Map<string, string[]> {
  const out = new Map<string, string[]>();
  const walk = (dir: string) => {
    for (const e of fs.readdirSync(path.join(ROOT, dir), { withFileTypes: true })) {
      const rel = path.join(dir, e.name);
      if (e.isDirectory()) {
        if (e.name !== 'node_modules' && e.name !== 'vectors') walk(rel);
      } else if (e.name.endsWith('.ts')) {
        const src = fs.readFileSync(path.join(ROOT, rel), 'utf8');
        out.set(rel, [...src.matchAll(SPEC)].map((m) => (m[1] ?? m[2] ?? m[3])!));
      }
    }
  };
  for (const r of ROOMS) if (fs.existsSync(path.join(ROOT, r))) walk(r);
  return out;
}

/**
 * The rooms of server/ and what each must not import (server/<room>/README.md says so): a name is
 * a room of server/ ('kernels' is the top-level folder); 'server' means every file of server/
 * outside the room but log.ts, 'server-but-http' the same but http/ too.
 */
const SERVER_ROOM_RULES: Record<string, string[]> = {
  http: ['sessions', 'jobs', 'engine', 'policy', 'kernels'],
  store: ['http', 'sessions', 'jobs', 'engine', 'policy', 'kernels'],
  engine: ['http', 'sessions', 'jobs', 'policy'],
  hub: ['models'],
  jobs: ['sessions', 'policy'],
  models: ['sessions', 'jobs', 'policy'],
  cluster: ['sessions', 'jobs'],
  datasets: ['sessions', 'engine', 'kernels'],
  policy: ['sessions'],
  db: ['server'],
  metrics: ['server-but-http'],
  ui: ['server-but-http'],
};

/** Whether an import from `from` to `to` (both relative to the root) breaks SERVER_ROOM_RULES. */
function breaksRoomRule(from: string, to: string): boolean {
  const inRoom = (p: string, r: string) => p.startsWith(path.join('server', r) + path.sep);
  const entry = Object.entries(SERVER_ROOM_RULES).find(([r]) => inRoom(from, r));
  if (!entry) return false;
  const [own, banned] = entry;
  return banned.some((d) => {
    if (d === 'kernels') return to.startsWith('kernels' + path.sep);
    if (d === 'server' || d === 'server-but-http') {
      return to.startsWith('server' + path.sep) && !inRoom(to, own) && to !== path.join('server', 'log.ts') && !(d === 'server-but-http' && inRoom(to, 'http'));
    }
    return inRoom(to, d);
  });
}

const files = sources();
const resolved = (from: string, spec: string) => path.normalize(path.join(path.dirname(from), spec));
const room = (rel: string) => rel.split(path.sep)[0]!;

describe('imports', () => {
  it('reads the project (a parse that finds nothing cannot fail)', () => {
    expect(files.size).toBeGreaterThan(300);
    expect(files.get(path.join('server', 'app.ts'))!.length).toBeGreaterThan(10);
  });

  it('point one way: protocol/ and kernels/ import no server/, each other not back, protocol/ no tfjs, server/http and server/store no route or engine', () => {
    const wrong: string[] = [];
    for (const [f, specs] of files) {
      for (const s of specs) {
        const to = s.startsWith('.') ? room(resolved(f, s)) : null;
        if (room(f) === 'protocol' && (to === 'server' || to === 'kernels' || s.startsWith('@tensorflow/'))) wrong.push(`${f} -> ${s}`);
        if (room(f) === 'kernels' && (to === 'server' || to === 'protocol')) wrong.push(`${f} -> ${s}`);
        if (room(f) !== 'test' && to === 'test') wrong.push(`${f} -> ${s}`);
        // What each room of server/ must not import, as its README.md says.
        if (s.startsWith('.') && breaksRoomRule(f, resolved(f, s))) wrong.push(`${f} -> ${s}`);
      }
    }
    expect(wrong).toEqual([]);
  });

  it("leave only the wiring at server/'s root (app, config, log); the rest is in rooms", () => {
    const loose = fs.readdirSync(path.join(ROOT, 'server'), { withFileTypes: true }).filter((e) => e.isFile()).map((e) => e.name).sort();
    expect(loose).toEqual(['app.ts', 'config.ts', 'log.ts']);
    const rooms = fs.readdirSync(path.join(ROOT, 'server'), { withFileTypes: true }).filter((e) => e.isDirectory()).map((e) => e.name);
    expect(rooms.filter((r) => !fs.existsSync(path.join(ROOT, 'server', r, 'README.md')))).toEqual([]);
  });

  it('make no cycle', () => {
    // Tarjan's strongly connected components over the relative imports.
    const graph = new Map([...files].map(([f, specs]) => [f, specs.filter((s) => s.startsWith('.')).map((s) => resolved(f, s)).filter((t) => files.has(t))]));
    let next = 0;
    const index = new Map<string, number>(), low = new Map<string, number>(), stack: string[] = [], onStack = new Set<string>();
    const cycles: string[][] = [];
    const visit = (v: string) => {
      index.set(v, next); low.set(v, next); next++;
      stack.push(v); onStack.add(v);
      for (const w of graph.get(v)!) {
        if (!index.has(w)) { visit(w); low.set(v, Math.min(low.get(v)!, low.get(w)!)); } else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, index.get(w)!));
      }
      if (low.get(v) === index.get(v)) {
        const scc: string[] = [];
        let w: string;
        do { w = stack.pop()!; onStack.delete(w); scc.push(w); } while (w !== v);
        if (scc.length > 1 || graph.get(v)!.includes(v)) cycles.push(scc.sort());
      }
    };
    for (const v of graph.keys()) if (!index.has(v)) visit(v);
    expect(cycles).toEqual([]);
  });
});
