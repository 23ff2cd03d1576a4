/**
 * Server paths never reach a client (PROTOCOL.md section 0): the folders a server was started with
 * (data dir, datasets root) are registered here, and every error text that goes to a client
 * passes through `redactPaths`, which names each registered folder by its label instead. Error
 * messages should name what the client sent in the first place; this is the safety net for the
 * ones that come from deeper layers (dataset readers, checkpoint loaders) with a path inside.
 * The full text, with paths, still goes to the server log where it is logged.
 */
import path from 'node:path';

const roots: { dir: string; label: string; re: RegExp }[] = [];

/** Register a server folder: `label` (e.g. `<data dir>`) replaces it in client-visible errors. */
export function hideServerPath(dir: string, label: string): void {
  const abs = path.resolve(dir);
  if (abs === path.parse(abs).root) return;
  // Messages built from a relative setting (./vela-data) carry it as given. Only path-like
  // spellings are replaced: a bare word (`datasets` from ./datasets) also occurs in plain prose
  // ("the datasets root", "--allow-absolute-datasets") and in what the client sent.
  const forms = [abs];
  if (!path.isAbsolute(dir)) {
    const given = dir.replace(/[\\/]+$/, '');
    const rel = path.normalize(dir).replace(/[\\/]+$/, '');
    for (const f of [given, rel]) if (/[\\/]/.test(f)) forms.push(f);
  }
  for (const d of new Set(forms)) {
    // A relative spelling counts only where a path starts: not inside `../datasets` or `x/datasets`.
    const start = path.isAbsolute(d) ? '' : '(?<![\\w.\\\\/-])';
    const re = new RegExp(start + d.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'), 'g');
    if (!roots.some((r) => r.dir === d)) roots.push({ dir: d, label, re });
  }
  roots.sort((a, b) => b.dir.length - a.dir.length); // the deepest folder first
}

/** `text` with every registered server folder replaced by its label. */
export function redactPaths(text: string): string {
  let out = text;
  for (const { dir, label, re } of roots) if (out.includes(dir)) out = out.replace(re, label);
  return out;
}
