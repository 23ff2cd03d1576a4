/**
 * Test helper: a small parser of Prometheus' text exposition format (0.0.4), enough for the
 * series Vela exports: `name{label="value",...} number` lines, `# HELP` / `# TYPE` comments.
 */

export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

export interface Exposition {
  samples: Sample[];
  /** Metric family name -> its `# TYPE`. */
  types: Map<string, string>;
  /** The value of the one sample of `name` whose labels include `labels`; undefined when none, throws when several. */
  value(name: string, labels?: Record<string, string>): number | undefined;
  /** Every sample of `name` whose labels include `labels`. */
  all(name: string, labels?: Record<string, string>): Sample[];
}

function unescape(v: string): string {
  return v.replace(/\\(.)/g, (_, c: string) => (c === 'n' ? '\n' : c));
}

function parseValue(v: string): number {
  if (v === '+Inf') return Infinity;
  if (v === '-Inf') return -Infinity;
  return Number(v);
}

/** Parses an exposition text. @throws Error naming the line that does not parse. */
export function parseExposition(text: string): Exposition {
  const samples: Sample[] = [];
  const types = new Map<string, string>();
  for (const line of text.split('\n')) {
    if (line.trim() === '') continue;
    const t = /^# TYPE (\S+) (\S+)$/.exec(line);
    if (t) {
      types.set(t[1]!, t[2]!);
      continue;
    }
    if (line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)(?: \d+)?$/.exec(line);
    if (!m) throw new Error(`not an exposition line: ${JSON.stringify(line)}`);
    const labels: Record<string, string> = {};
    if (m[2]) {
      const re = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?/g;
      let lm: RegExpExecArray | null;
      let seen = 0;
      while ((lm = re.exec(m[2]))) {
        labels[lm[1]!] = unescape(lm[2]!);
        seen += lm[0].length;
      }
      if (seen !== m[2].length) throw new Error(`bad labels in ${JSON.stringify(line)}`);
    }
    samples.push({ name: m[1]!, labels, value: parseValue(m[3]!) });
  }
  const all = (name: string, labels: Record<string, string> = {}) =>
    samples.filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v));
  return {
    samples,
    types,
    all,
    value(name, labels = {}) {
      const found = all(name, labels);
      if (found.length > 1) throw new Error(`${found.length} samples of ${name} match ${JSON.stringify(labels)}`);
      return found[0]?.value;
    },
  };
}
