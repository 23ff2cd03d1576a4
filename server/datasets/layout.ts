/**
 * LeRobot layout helpers shared by the v2.x and v3.0 readers: info.json's types, Python-style
 * path templates, per-dimension names, JSON / JSON-lines files with errors naming the file.
 */
import fs from 'node:fs';
import path from 'node:path';
import { DatasetError } from './errors.ts';

export interface Feature {
  dtype: string;
  shape: number[];
  names: unknown;
  info?: Record<string, unknown>;
}

export interface Info {
  codebase_version: string;
  fps: number;
  robot_type?: string | null;
  total_frames?: number;
  total_episodes?: number;
  chunks_size?: number;
  data_path?: string;
  video_path?: string | null;
  features: Record<string, Feature>;
}

/** Python `str.format` for the `{name}` / `{name:03d}` fields that LeRobot path templates use. */
export function formatTemplate(template: string, values: Record<string, string | number>): string {
  return template.replace(/\{(\w+)(?::0?(\d+)d)?\}/g, (_match, name: string, width?: string) => {
    const v = values[name];
    if (v === undefined) throw new DatasetError('bad_metadata', `meta/info.json path template ${template} uses {${name}}, which is unknown`);
    return width ? String(v).padStart(Number(width), '0') : String(v);
  });
}

/** Per-dimension names: `["a", ...]`, `[["a", ...]]` or `{"motors": ["a", ...]}`; null otherwise. */
export function parseNames(names: unknown, dim: number): string[] | null {
  let list: unknown = names;
  if (Array.isArray(list) && list.length === 1 && Array.isArray(list[0])) list = list[0];
  if (list && typeof list === 'object' && !Array.isArray(list)) {
    const values = Object.values(list);
    list = values.length === 1 ? values[0] : null;
  }
  if (!Array.isArray(list) || list.length !== dim || !list.every((n) => typeof n === 'string')) return null;
  return list as string[];
}

export function readJson(root: string, rel: string): unknown {
  const abs = path.join(root, rel);
  if (!fs.existsSync(abs)) throw new DatasetError('missing_file', `${rel} is missing`);
  try {
    return JSON.parse(fs.readFileSync(abs, 'utf8'));
  } catch (err) {
    throw new DatasetError('corrupt_file', `${rel} is not valid JSON: ${(err as Error).message}`);
  }
}

export function readJsonl(root: string, rel: string): Record<string, unknown>[] {
  const abs = path.join(root, rel);
  if (!fs.existsSync(abs)) throw new DatasetError('missing_file', `${rel} is missing`);
  const lines = fs.readFileSync(abs, 'utf8').split('\n');
  const out: Record<string, unknown>[] = [];
  lines.forEach((line, i) => {
    if (!line.trim()) return;
    try {
      out.push(JSON.parse(line) as Record<string, unknown>);
    } catch (err) {
      throw new DatasetError('corrupt_file', `${rel} line ${i + 1} is not valid JSON: ${(err as Error).message}`);
    }
  });
  return out;
}

export function stringList(v: unknown): string[] {
  if (Array.isArray(v)) return v.map(String);
  if (typeof v === 'string') return [v];
  return [];
}
