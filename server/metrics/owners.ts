/**
 * Who may see a series that names an object (issue 32, item 13): a label whose value is an
 * object's id (OBJECT_LABELS: today `policy`, the served policy's id: `policy-<fine-tune>`,
 * `policy-<sampling session>`, a training session's id) belongs to the API key that owns the
 * object. A scrape is either the operator's, which sees every series, or a tenant key's, which
 * sees the series without object labels (the aggregates) and those naming its own objects; a
 * series naming an object whose owner is not known here (a policy `vela serve` did not record,
 * one already unloaded) is the operator's only. The owners are recorded by the code that
 * creates the series (policy.ts holdPolicySeries) and forgotten when the object goes.
 */

/** Labels whose values are object ids: their series are filtered by owner in a tenant's scrape. */
export const OBJECT_LABELS = ['policy'] as const;
export type ObjectLabel = (typeof OBJECT_LABELS)[number];

/** label -> object id -> owner (an API key's id, store.findApiKey's answer). */
const owners = new Map<ObjectLabel, Map<string, string>>(OBJECT_LABELS.map((l) => [l, new Map()]));

/** Series whose `label` is `value` are `owner`'s (and the operator's). */
export function setSeriesOwner(label: ObjectLabel, value: string, owner: string): void {
  owners.get(label)!.set(value, owner);
}

/** The object is gone: its series (if any are left) become the operator's only. */
export function clearSeriesOwner(label: ObjectLabel, value: string): void {
  owners.get(label)!.delete(value);
}

/** The owner recorded for `label="value"`, or undefined. */
export function seriesOwner(label: ObjectLabel, value: string): string | undefined {
  return owners.get(label)!.get(value);
}

/**
 * An object label in a sample line of the text format 0.0.4 (`name{a="x",policy="y"} 1`): the
 * label name and its escaped value (`\\`, `\"` and `\n` are the format's escapes).
 */
const OBJECT_LABEL_RE = new RegExp(`[{,](${OBJECT_LABELS.join('|')})="((?:[^"\\\\\\n]|\\\\.)*)"`, 'g');

function unescapeLabel(v: string): string {
  return v.replace(/\\(.)/g, (_, c: string) => (c === 'n' ? '\n' : c));
}

/**
 * The exposition `text` as `owner`'s scrape shows it: every `# HELP` / `# TYPE` line and every
 * sample without an object label, and the samples whose object labels all name `owner`'s
 * objects; the rest are left out.
 */
export function tenantView(text: string, owner: string): string {
  const out: string[] = [];
  for (const line of text.split('\n')) {
    if (!line.startsWith('#') && line.includes('{')) {
      let mine = true;
      for (const m of line.matchAll(OBJECT_LABEL_RE)) {
        if (seriesOwner(m[1] as ObjectLabel, unescapeLabel(m[2]!)) !== owner) {
          mine = false;
          break;
        }
      }
      if (!mine) continue;
    }
    out.push(line);
  }
  return out.join('\n');
}
