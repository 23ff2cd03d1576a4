/**
 * Test helper: a local stand-in for the Hugging Face Hub's file API on 127.0.0.1, serving a folder
 * as a dataset repository the way the hub does (huggingface_hub's client reads the same):
 * - `GET /api/datasets/{repo}/revision/{rev}` -> `{id, sha}` (404 + X-Error-Code otherwise).
 * - `GET /api/datasets/{repo}/tree/{sha}?recursive=true` -> `[{type, oid, size, path, lfs?}]`,
 *   two entries per page with a `Link: <...>; rel="next"` header (the hub pages long lists).
 * - `GET /datasets/{repo}/resolve/{sha}/{path}`: plain files answer 200 with `ETag: "<git blob
 *   sha1>"` and `X-Repo-Commit`; LFS files (.parquet, .mp4) answer 302 to `/cdn/<sha256>` with
 *   `X-Linked-Etag: "<sha256>"`, `X-Linked-Size`, `X-Repo-Commit`, like the hub's CDN redirect.
 *   Both honour `Range: bytes=N-` with 206 and Content-Range.
 * Faults for tests: `cutAfter` (path -> bytes: the first GET of that file is cut after that many
 * bytes), `corrupt` (paths served with one byte flipped), `token` (Bearer required).
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import type { AddressInfo } from 'node:net';

export interface FakeHubOptions {
  repoId: string;
  dir: string;
  revision?: string;
  token?: string;
  cutAfter?: Map<string, number>;
  corrupt?: Set<string>;
}

export interface FakeHub {
  url: string;
  commit: string;
  /** Every request: method, path and the Range and Authorization headers. */
  requests: { url: string; range: string | undefined; authorization: string | undefined }[];
  close(): Promise<void>;
}

function walk(dir: string, rel = ''): string[] {
  return fs.readdirSync(path.join(dir, rel), { withFileTypes: true }).flatMap((e) => {
    const r = rel ? `${rel}/${e.name}` : e.name;
    return e.isDirectory() ? walk(dir, r) : [r];
  });
}

const gitBlobSha1 = (b: Buffer) => crypto.createHash('sha1').update(`blob ${b.length}\0`).update(b).digest('hex');
const sha256 = (b: Buffer) => crypto.createHash('sha256').update(b).digest('hex');

export async function startFakeHub(opts: FakeHubOptions): Promise<FakeHub> {
  const commit = crypto.createHash('sha1').update(opts.repoId).digest('hex');
  const files = walk(opts.dir).sort().map((p) => {
    const bytes = fs.readFileSync(path.join(opts.dir, p));
    const lfs = /\.(parquet|mp4)$/.test(p);
    const pointer = Buffer.from(`version https://git-lfs.github.com/spec/v1\noid sha256:${sha256(bytes)}\nsize ${bytes.length}\n`);
    return { path: p, bytes, lfs, sha256: sha256(bytes), oid: gitBlobSha1(lfs ? pointer : bytes), pointerSize: pointer.length };
  });
  const cutOnce = new Map(opts.cutAfter ?? []);
  const requests: FakeHub['requests'] = [];

  const sendBytes = (req: http.IncomingMessage, res: http.ServerResponse, file: (typeof files)[number], headers: Record<string, string>) => {
    let body = file.bytes;
    if (opts.corrupt?.has(file.path)) {
      body = Buffer.from(body);
      body[body.length >> 1]! ^= 0x40;
    }
    const m = /^bytes=(\d+)-$/.exec(req.headers.range ?? '');
    const start = m ? Number(m[1]) : 0;
    if (start >= body.length && m) {
      res.writeHead(416, { 'content-range': `bytes */${body.length}` }).end();
      return;
    }
    const slice = body.subarray(start);
    res.writeHead(m ? 206 : 200, {
      ...headers, 'content-type': 'application/octet-stream', 'content-length': String(slice.length), 'accept-ranges': 'bytes',
      ...(m ? { 'content-range': `bytes ${start}-${body.length - 1}/${body.length}` } : {}),
    });
    const cut = cutOnce.get(file.path);
    if (cut !== undefined) {
      cutOnce.delete(file.path);
      res.write(slice.subarray(0, cut), () => setTimeout(() => res.socket?.destroy(), 20));
      return;
    }
    res.end(slice);
  };

  const server = http.createServer((req, res) => {
    requests.push({ url: req.url!, range: req.headers.range, authorization: req.headers.authorization });
    if (opts.token && req.headers.authorization !== `Bearer ${opts.token}` && !req.url!.startsWith('/cdn/')) {
      res.writeHead(401, { 'content-type': 'application/json', 'x-error-code': 'RepoNotFound' }).end(JSON.stringify({ error: 'Invalid username or password.' }));
      return;
    }
    const u = new URL(req.url!, 'http://x');
    const repo = opts.repoId;
    const json = (status: number, body: unknown, headers: Record<string, string> = {}) => res.writeHead(status, { 'content-type': 'application/json', ...headers }).end(JSON.stringify(body));
    if (u.pathname.startsWith(`/api/datasets/${repo}/revision/`)) {
      const rev = decodeURIComponent(u.pathname.slice(`/api/datasets/${repo}/revision/`.length));
      if (rev !== (opts.revision ?? 'main') && rev !== commit) return json(404, { error: `Invalid rev id: ${rev}` }, { 'x-error-code': 'RevisionNotFound' });
      return json(200, { id: repo, sha: commit, siblings: files.map((f) => ({ rfilename: f.path })) });
    }
    if (u.pathname === `/api/datasets/${repo}/tree/${commit}`) {
      const entries = files.map((f) => ({
        type: 'file', oid: f.oid, size: f.bytes.length, path: f.path, ...(f.lfs ? { lfs: { oid: f.sha256, size: f.bytes.length, pointerSize: f.pointerSize } } : {}),
      }));
      const page = Number(u.searchParams.get('cursor') ?? 0);
      const next = page + 2 < entries.length ? `<http://${req.headers.host}${u.pathname}?recursive=true&cursor=${page + 2}>; rel="next"` : undefined;
      return json(200, entries.slice(page, page + 2), next ? { link: next } : {});
    }
    const resolvePrefix = `/datasets/${repo}/resolve/${commit}/`;
    if (u.pathname.startsWith(resolvePrefix)) {
      const p = u.pathname.slice(resolvePrefix.length).split('/').map(decodeURIComponent).join('/');
      const f = files.find((x) => x.path === p);
      if (!f) return json(404, { error: 'Entry not found' }, { 'x-error-code': 'EntryNotFound' });
      if (f.lfs) {
        res.writeHead(302, { location: `/cdn/${f.sha256}`, 'x-repo-commit': commit, 'x-linked-etag': `"${f.sha256}"`, 'x-linked-size': String(f.bytes.length), etag: `"${f.oid}"` }).end();
        return;
      }
      return sendBytes(req, res, f, { etag: `"${f.oid}"`, 'x-repo-commit': commit });
    }
    if (u.pathname.startsWith('/cdn/')) {
      const f = files.find((x) => x.lfs && x.sha256 === u.pathname.slice('/cdn/'.length));
      if (!f) return json(404, { error: 'no such object' });
      return sendBytes(req, res, f, { etag: `"${f.sha256}"` });
    }
    if (u.pathname.startsWith(`/api/datasets/`)) return json(401, { error: 'Repository not found' }, { 'x-error-code': 'RepoNotFound' });
    json(404, { error: `no route ${u.pathname}` });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    commit,
    requests,
    close: () => new Promise((r) => {
      server.closeAllConnections();
      server.close(() => r());
    }),
  };
}
