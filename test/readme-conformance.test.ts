/**
 * The README's conformance table (## If your client speaks another API) is checked against the
 * tests it names (issue 33: "no row says same that a test does not show"). A row is
 * `| Document | Route | In Vela | Shown by |`; this test fails when
 * - a row's verdict is not one of same, adapted, not applicable (a broken or missing item is an
 *   issue to fix, not a row);
 * - a "same" or "adapted" row names no test file in "Shown by";
 * - a named file is not a test file of test/, or starts no real server (it must call
 *   startTestServer, startPolicyServer, startPolicyProc or NodeProc.start, or spawn `vela`);
 * - a route, op or field of the row's Route column (each `backticked` item) appears in none of
 *   the row's named files, nor in the test/python/ scripts those files run.
 * How an item is looked for: a path (`POST /api/v1/forward`, the method dropped) as written,
 * `{id}` standing for any segment or `${...}`; a one-segment path (`/sleep`, `/api/v1/sleep`)
 * also as its name in quotes (`'sleep'`: the futures client helper and the Python clients take
 * the route's name); anything else (an op, a field, `zorl_*`) as a whole word, case ignored.
 * It cannot know that a test asserts what the row says: that is for whoever names the file.
 */
import fs from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';

const REPO = path.resolve(import.meta.dirname, '..');
const README = fs.readFileSync(path.join(REPO, 'README.md'), 'utf8');
const DOCUMENTS = ['Relay', 'xorl', 'sidecar'];
const VERDICTS = ['same', 'adapted', 'not applicable'];

export interface ConformanceRow {
  line: number;
  document: string;
  route: string;
  verdict: string;
  shownBy: string[];
}

/** The table's rows (after the header `| Document | Route | In Vela | Shown by |`). */
export function conformanceRows(readme: string): ConformanceRow[] {
  const lines = readme.split('\n');
  const head = lines.findIndex((l) => /^\| Document \| Route \| In Vela \| Shown by \|$/.test(l));
  if (head < 0) throw new Error('README has no table headed "| Document | Route | In Vela | Shown by |"');
  const rows: ConformanceRow[] = [];
  for (let i = head + 2; i < lines.length && lines[i]!.startsWith('|'); i++) {
    const cells = lines[i]!.trim().slice(1, -1).split('|'); // no cell holds a |
    if (cells.length !== 4) throw new Error(`README line ${i + 1}: ${cells.length} cells, not 4: ${lines[i]}`);
    const [document, route, verdict, shown] = cells.map((c) => c.trim()) as [string, string, string, string];
    rows.push({ line: i + 1, document, route, verdict, shownBy: shown ? shown.split(/,\s*/) : [] });
  }
  return rows;
}

/** The backticked items of a Route cell. */
export function routeItems(route: string): string[] {
  return [...route.matchAll(/`([^`]+)`/g)].map((m) => m[1]!.trim());
}

/** How a test starts a real server: in process (HTTP + websockets on a port), or as a process. */
const REAL_SERVER = /\b(?:startTestServer|startPolicyServer|startPolicyProc|NodeProc\.start)\(|\bspawn\(/;

const escape = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/** The regular expressions any one of which finds `item` in a test's text. */
export function itemPatterns(item: string): RegExp[] {
  const bare = item.replace(/^(GET|POST|PUT|DELETE|PATCH)\s+/, '');
  if (bare.startsWith('/')) {
    if (bare === '/') return [/['"`]\/['"`?]/];
    const body = bare.split(/(\{[^}]*\})/).map((part) => (/^\{[^}]*\}$/.test(part) ? '(?:\\$\\{[^}]*\\}|[\\w.%-]+)' : escape(part))).join('');
    const out = [new RegExp(`(?<![\\w-])${body}(?![\\w-])`)];
    const one = /^(?:\/api\/v1)?\/([\w-]+)$/.exec(bare);
    if (one) out.push(new RegExp(`['"\`]${escape(one[1]!)}['"\`]`));
    return out;
  }
  return [new RegExp(`(?<![\\w-])${escape(bare).replace(/\\\*/g, '\\w*')}(?![\\w-])`, 'i')];
}

/** A test file's text with the test/python/ scripts it names. */
function testText(file: string): string {
  const text = fs.readFileSync(path.join(REPO, 'test', file), 'utf8');
  const scripts = fs.readdirSync(path.join(REPO, 'test', 'python')).filter((f) => f.endsWith('.py') && text.includes(f));
  return [text, ...scripts.map((f) => fs.readFileSync(path.join(REPO, 'test', 'python', f), 'utf8'))].join('\n');
}

/** What is wrong with `rows` (empty when nothing is). */
export function tableProblems(rows: ConformanceRow[], readFile: (file: string) => string | null): string[] {
  const problems: string[] = [];
  for (const r of rows) {
    const at = `README line ${r.line} (${r.document}: ${r.route.slice(0, 60)})`;
    if (!DOCUMENTS.includes(r.document)) problems.push(`${at}: document "${r.document}" is not one of ${DOCUMENTS.join(', ')}`);
    const verdict = VERDICTS.find((v) => r.verdict === v || r.verdict.startsWith(`${v} `) || r.verdict.startsWith(`${v}:`));
    if (!verdict) {
      problems.push(`${at}: verdict "${r.verdict.slice(0, 40)}" is not ${VERDICTS.join(', ')}`);
      continue;
    }
    if (verdict !== 'not applicable' && r.shownBy.length === 0) problems.push(`${at}: says "${verdict}" but names no test in "Shown by"`);
    const texts: string[] = [];
    for (const f of r.shownBy) {
      if (!/^[\w.-]+\.test\.ts$/.test(f)) {
        problems.push(`${at}: "${f}" is not a test file name (test/<name>.test.ts)`);
        continue;
      }
      const text = readFile(f);
      if (text === null) problems.push(`${at}: test/${f} does not exist`);
      else if (!REAL_SERVER.test(text)) problems.push(`${at}: test/${f} starts no real server`);
      else texts.push(text);
    }
    if (texts.length === 0) continue;
    for (const item of routeItems(r.route)) {
      const patterns = itemPatterns(item);
      if (!texts.some((t) => patterns.some((p) => p.test(t)))) problems.push(`${at}: \`${item}\` appears in none of ${r.shownBy.join(', ')}`);
    }
  }
  return problems;
}

const readTest = (file: string): string | null => (fs.existsSync(path.join(REPO, 'test', file)) ? testText(file) : null);

describe("the README's conformance table", () => {
  const rows = conformanceRows(README);

  it('has rows for the three documents', () => {
    for (const d of DOCUMENTS) expect(rows.filter((r) => r.document === d).length, d).toBeGreaterThan(5);
  });

  it('names, for every "same" and "adapted" row, existing tests that mention each of its routes', () => {
    expect(tableProblems(rows, readTest)).toEqual([]);
  });

  it('finds each kind of problem (a table edited to be wrong fails)', () => {
    const row = rows.find((r) => r.route.includes('/api/v1/forward_backward'))!;
    expect(row.shownBy.length).toBeGreaterThan(0);
    const broken: ConformanceRow[] = [
      { ...row, shownBy: [] },
      { ...row, shownBy: ['no-such-file.test.ts'] },
      { ...row, shownBy: ['readme.test.ts'] }, // a real file that does not call the futures routes
      { ...row, verdict: 'broken: refuses everything' },
      { ...row, shownBy: ['../server/app.ts'] },
      { ...row, shownBy: ['frames.test.ts'] }, // codecs decoded in process: no server
    ];
    const problems = broken.map((r) => tableProblems([r], readTest));
    expect(problems[0]).toEqual([expect.stringMatching(/says "same" but names no test/)]);
    expect(problems[1]).toEqual([expect.stringMatching(/test\/no-such-file\.test\.ts does not exist/)]);
    expect(problems[2]!.length).toBe(routeItems(row.route).length);
    expect(problems[2]![0]).toMatch(/`POST \/api\/v1\/forward_backward` appears in none of readme\.test\.ts/);
    expect(problems[3]).toEqual([expect.stringMatching(/verdict "broken: refuses everything" is not same, adapted, not applicable/)]);
    expect(problems[4]).toEqual([expect.stringMatching(/is not a test file name/)]);
    expect(problems[5]).toEqual([expect.stringMatching(/test\/frames\.test\.ts starts no real server/)]);
  });

  it('looks for paths, one-segment route names and words as it says', () => {
    const find = (item: string, text: string) => itemPatterns(item).some((p) => p.test(text));
    expect(find('GET /v1/fine-tunes/{id}', 'api(s, "GET", `/v1/fine-tunes/${job.id}`)')).toBe(true);
    expect(find('GET /v1/fine-tunes/{id}', "api(s, 'GET', '/v1/fine-tunes')")).toBe(false);
    expect(find('POST /v1/fine-tunes/{id}/cancel', '`/v1/fine-tunes/${a.id}/cancel`')).toBe(true);
    expect(find('POST /api/v1/forward', "'/api/v1/forward_backward'")).toBe(false);
    expect(find('POST /api/v1/forward', "fc.run('forward', {})")).toBe(true);
    expect(find('GET /health', "fetch(base + '/healthz')")).toBe(false);
    expect(find('GET /', "fetch(s.baseUrl + '/', {})")).toBe(true);
    expect(find('zorl_*', '{ zorl_rank: 4 }')).toBe(true);
    expect(find('forward', 'conn.forwardBackward(data)')).toBe(false);
    expect(find('Authorization', "headers: { authorization: 'Bearer k' }")).toBe(true);
  });
});
