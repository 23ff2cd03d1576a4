/**
 * The built dashboard on disk (ui/dist, made by scripts/build-ui.ts from ui/src), read into memory
 * with the headers each file is served with. No uWS here: the build script imports this too.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

/** Where `npm run build:ui` writes and `mountUi` reads by default. */
export const UI_DIST_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../ui/dist');

export const CONTENT_TYPES: Readonly<Record<string, string>> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.map': 'application/json; charset=utf-8',
  '.txt': 'text/plain; charset=utf-8',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.ico': 'image/x-icon',
};

/** esbuild's `[name]-[hash]` names: 8 base32 characters; such a file never changes content. */
const HASHED = /-[A-Z0-9]{8}\.[A-Za-z.]+$/;

export interface Asset {
  body: Buffer;
  contentType: string;
  /** `public, max-age=31536000, immutable` for hashed names; `no-cache` (revalidate) otherwise. */
  cacheControl: string;
  /** A strong ETag: the first 16 hex digits of the body's SHA-256, quoted. */
  etag: string;
}

export interface AssetSet {
  dir: string;
  /** index.html's mtime when read: a rebuild changes it, and the set is read again. */
  stampMs: number;
  /** URL path under /ui/ ("" is index.html) -> asset. */
  files: Map<string, Asset>;
}

/** mtime of `dir`/index.html, or null when the dashboard is not built. */
export function buildStamp(dir: string): number | null {
  try {
    return fs.statSync(path.join(dir, 'index.html')).mtimeMs;
  } catch {
    return null;
  }
}

/**
 * Read every file of a build. Returns null when `dir`/index.html is missing.
 * Files of unknown extension are served as `application/octet-stream`.
 */
export function loadAssets(dir: string): AssetSet | null {
  try {
    return readAll(dir);
  } catch (e) {
    // A rebuild swaps the folder with renames: a read that races it sees a file vanish.
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw e;
  }
}

function readAll(dir: string): AssetSet | null {
  const stampMs = buildStamp(dir);
  if (stampMs === null) return null;
  const files = new Map<string, Asset>();
  for (const entry of fs.readdirSync(dir, { recursive: true, encoding: 'utf8' })) {
    const full = path.join(dir, entry);
    if (!fs.statSync(full).isFile()) continue;
    const rel = entry.split(path.sep).join('/');
    const body = fs.readFileSync(full);
    const asset: Asset = {
      body,
      contentType: CONTENT_TYPES[path.extname(full).toLowerCase()] ?? 'application/octet-stream',
      cacheControl: HASHED.test(path.basename(full)) ? 'public, max-age=31536000, immutable' : 'no-cache',
      etag: `"${crypto.createHash('sha256').update(body).digest('hex').slice(0, 16)}"`,
    };
    files.set(rel, asset);
    if (rel === 'index.html') files.set('', asset);
  }
  return { dir, stampMs, files };
}
