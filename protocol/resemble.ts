/**
 * "Did you mean": the known name a misspelt one resembles (a request field, a CLI option), so an
 * error can name it. Case, separators and word order are ignored; then two swapped neighbours;
 * then a Levenshtein distance of 1 (names of 4-7 characters) or 2 (8 and more); then a shortened
 * or lengthened name.
 */
import { distance } from 'fastest-levenshtein';

function norm(s: string): string {
  return s.toLowerCase().replace(/[^a-z0-9]/g, '');
}

function tokens(s: string): string {
  return s.toLowerCase().split(/[^a-z0-9]+/).filter(Boolean).sort().join(' ');
}

function oneSwap(a: string, b: string): boolean {
  if (a.length !== b.length || a === b) return false;
  let i = 0;
  while (a[i] === b[i]) i++;
  return a[i] === b[i + 1] && a[i + 1] === b[i] && a.slice(i + 2) === b.slice(i + 2);
}

/** The known field that `field` looks like a misspelling of (the closest one), or null. */
export function resemblance(field: string, known: readonly string[]): string | null {
  const nf = norm(field);
  const same = known.find((k) => norm(k) === nf || tokens(k) === tokens(field));
  if (same) return same;
  // Two neighbouring letters swapped (`stpes`, `prot`): the commonest typo, distance 2 for Levenshtein.
  const swapped = known.find((k) => oneSwap(norm(k), nf));
  if (swapped) return swapped;
  let best: string | null = null;
  let bestD = Infinity;
  for (const k of known) {
    const nk = norm(k);
    const d = distance(nf, nk);
    const limit = nk.length >= 8 ? 2 : nk.length >= 4 ? 1 : 0;
    if (d <= limit && d < bestD) [best, bestD] = [k, d];
  }
  if (best) return best;
  // A shortened or lengthened name (`grad_clip`, `learning_rate_peak`) changes a knob too.
  return known.find((k) => Math.min(nf.length, norm(k).length) >= 4 && (nf.includes(norm(k)) || norm(k).includes(nf))) ?? null;
}

/**
 * ` (did you mean "x"?)` for an error about the unknown `name`, or ''. `aliases` maps names of
 * another API to ours (a fine-tune's `lora_rank` is a session's `rank`).
 */
export function meant(name: string, known: readonly string[], aliases: Readonly<Record<string, string>> = {}): string {
  const like = (Object.hasOwn(aliases, name) ? aliases[name] : undefined) ?? resemblance(name, known);
  return like ? ` (did you mean "${like}"?)` : '';
}
