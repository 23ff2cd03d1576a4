/**
 * Test helper: a local stand-in for the Hugging Face Hub's file API on 127.0.0.1, serving folders
 * as dataset and model repositories the way the hub does (huggingface_hub's and @huggingface/hub's
 * clients read the same):
 * - `GET /api/{datasets|models}/{repo}/revision/{rev}` -> `{_id, id, sha, siblings, ...}` (404 +
 *   X-Error-Code otherwise).
 * - `GET /api/{datasets|models}/{repo}/tree/{rev}?recursive=true` -> `[{type, oid, size, path,
 *   lfs?}]`, two entries per page with a `Link: <...>; rel="next"` header (the hub pages long lists).
 * - `GET /datasets/{repo}/resolve/{rev}/{path}` and, for models, `/{repo}/resolve/{rev}/{path}`:
 *   plain files answer 200 with `ETag: "<git blob sha1>"` and `X-Repo-Commit`; LFS files
 *   (.parquet, .mp4, .safetensors, .bin) answer 302 to `http://localhost:<port>/cdn/<sha256>` (another
 *   host, like the hub's CDN) with `X-Linked-Etag:
 *   "<sha256>"`, `X-Linked-Size`, `X-Repo-Commit`, like the hub's CDN redirect. Both honour
 *   `Range: bytes=N-` and `bytes=N-M` with 206 and Content-Range, 416 past the end.
 * Faults for tests: `cutAfter` (path -> bytes: the first GET of that file that would send more
 * than that many bytes is cut after that many), `stallAfter` (the same, but the connection then
 * hangs), `corrupt` (paths served with one byte flipped), `ignoreResumeRange` (a range from
 * byte N > 0 is answered with the whole file), `wrongRangeStart` (such a range answered 206 from
 * byte 0: a malicious hub), `token` (Bearer required for everything but the
 * CDN: a private repo). A model repo may be
 * `gated` like google/paligemma-3b-pt-224: its metadata and file list are public, its files need
 * a token of an account that accepted the licence (401 without a token, 403 with another one,
 * each with the hub's X-Error-Code: GatedRepo and X-Error-Message).
 * Uploads, as @huggingface/hub's createRepo and uploadFiles(WithProgress) call them (any Bearer
 * token may write, none: 401; `readOnly` repos answer 403 to every write, as the hub does for a
 * gated or another's repo or a read-only token):
 * - `POST /api/repos/create` `{name, organization, type}` -> `{url, id}`; 409 when it exists.
 * - `POST /api/models/{repo}/preupload/{rev}` `{files: [{path, size, sample}]}` -> `{files: [{path,
 *   uploadMode}]}`, `lfs` for the LFS suffixes above or files over 10 MB, else `regular`.
 * - `POST /{repo}.git/info/lfs/objects/batch` (git-lfs batch, `transfer: basic`): objects the hub
 *   already holds come back without actions; the others with an upload action `PUT
 *   {hub}/lfs-upload/{sha256}`, whose body must hash to the oid (counted in `lfsPuts`).
 * - `POST /api/models/{repo}/commit/{rev}` (NDJSON: a `header` line, then `file` lines with base64
 *   content and `lfsFile` lines naming an uploaded oid) -> `{commitOid, commitUrl}`; the files
 *   join the repo, so the download routes serve them at the new commit.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import type { AddressInfo } from 'node:net';

/** A model repository served beside the dataset. */
export interface FakeModelRepo {
  repoId: string;
  dir: string;
  /** Branch name the commit is reachable by; default `main`. */
  revision?: string;
  /** Gated: only these tokens may fetch files. */
  gated?: { tokens: string[] };
}

export interface FakeHubOptions {
  /** The dataset repository (optional when only models are served). */
  repoId?: string;
  dir?: string;
  revision?: string;
  token?: string;
  models?: FakeModelRepo[];
  cutAfter?: Map<string, number>;
  /** path -> bytes: the first GET of that file sends that many bytes, then nothing more (a hung transfer, for killing the client). */
  stallAfter?: Map<string, number>;
  corrupt?: Set<string>;
  /** Answer a range that does not start at 0 with the whole file (200), as some proxies do. */
  ignoreResumeRange?: boolean;
  /** A malicious hub: a range from byte N > 0 is answered 206 with the bytes (and Content-Range) from byte 0. */
  wrongRangeStart?: boolean;
  /** Paths whose GET answers the file, then goes on sending (no Content-Length) up to 50 MiB: a hub that lies about sizes. */
  endless?: Set<string>;
  /** path -> the oid the file list gives for it (as `lfs.oid` for an LFS file, else `oid`): a hub that lies in its listing. */
  listedOid?: Map<string, string>;
  /** Model repos (existing or not) that answer 403 to every write. */
  readOnly?: Set<string>;
}

export interface FakeHub {
  url: string;
  /** The dataset's commit (or the first model's, without a dataset). */
  commit: string;
  /** The commit of any served repository. */
  commitOf(repoId: string): string;
  /** Every request: method, path and the Range and Authorization headers. */
  requests: { method: string; url: string; range: string | undefined; authorization: string | undefined }[];
  /** Repos made by POST /api/repos/create: id and the visibility asked for (absent: the account's default). */
  created: { id: string; visibility: string | undefined }[];
  /** LFS objects received (PUT /lfs-upload/{sha256}), in order. */
  lfsPuts: { oid: string; bytes: number }[];
  /** The files a served repository holds now (uploads included): path -> bytes. */
  filesOf(repoId: string): Map<string, Buffer>;
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

interface Repo {
  kind: 'datasets' | 'models';
  id: string;
  revision: string;
  commit: string;
  gated?: { tokens: string[] };
  files: { path: string; bytes: Buffer; lfs: boolean; sha256: string; oid: string; pointerSize: number }[];
}

const LFS_SUFFIX = /\.(parquet|mp4|safetensors|bin)$/;

function repoFile(p: string, bytes: Buffer, lfs: boolean): Repo['files'][number] {
  const pointer = Buffer.from(`version https://git-lfs.github.com/spec/v1\noid sha256:${sha256(bytes)}\nsize ${bytes.length}\n`);
  return { path: p, bytes, lfs, sha256: sha256(bytes), oid: gitBlobSha1(lfs ? pointer : bytes), pointerSize: pointer.length };
}

function loadRepo(kind: Repo['kind'], id: string, dir: string, revision = 'main', gated?: Repo['gated']): Repo {
  const commit = crypto.createHash('sha1').update(`${kind}/${id}`).digest('hex');
  const files = walk(dir).sort().map((p) => repoFile(p, fs.readFileSync(path.join(dir, p)), LFS_SUFFIX.test(p)));
  return { kind, id, revision, commit, gated, files };
}

/** The whole request body. */
function readBody(req: http.IncomingMessage): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const parts: Buffer[] = [];
    req.on('data', (d: Buffer) => parts.push(d));
    req.on('end', () => resolve(Buffer.concat(parts)));
    req.on('error', reject);
  });
}

export async function startFakeHub(opts: FakeHubOptions): Promise<FakeHub> {
  const repos: Repo[] = [];
  if (opts.repoId && opts.dir) repos.push(loadRepo('datasets', opts.repoId, opts.dir, opts.revision));
  for (const m of opts.models ?? []) repos.push(loadRepo('models', m.repoId, m.dir, m.revision, m.gated));
  const cutOnce = new Map(opts.cutAfter ?? []);
  const stallOnce = new Map(opts.stallAfter ?? []);
  const requests: FakeHub['requests'] = [];
  const lfsPuts: FakeHub['lfsPuts'] = [];
  const created: FakeHub['created'] = [];
  /** LFS objects uploaded and not yet (or already) committed: sha256 -> bytes. */
  const lfsStore = new Map<string, Buffer>();
  const hasLfs = (oid: string) => lfsStore.has(oid) || repos.some((r) => r.files.some((f) => f.lfs && f.sha256 === oid));

  const sendBytes = (req: http.IncomingMessage, res: http.ServerResponse, file: Repo['files'][number], headers: Record<string, string>) => {
    let body = file.bytes;
    if (opts.corrupt?.has(file.path)) {
      body = Buffer.from(body);
      body[body.length >> 1]! ^= 0x40;
    }
    let m = /^bytes=(\d+)-(\d*)$/.exec(req.headers.range ?? '');
    if (m && opts.ignoreResumeRange && m[1] !== '0') m = null;
    if (m && opts.wrongRangeStart && m[1] !== '0') m = /^bytes=(\d+)-(\d*)$/.exec(`bytes=0-${m[2]}`);
    const start = m ? Number(m[1]) : 0;
    const end = m && m[2] ? Math.min(Number(m[2]), body.length - 1) : body.length - 1;
    if (m && (start >= body.length || end < start)) {
      res.writeHead(416, { 'content-range': `bytes */${body.length}` }).end();
      return;
    }
    const slice = body.subarray(start, end + 1);
    res.writeHead(m ? 206 : 200, {
      ...headers, 'content-type': 'application/octet-stream', 'accept-ranges': 'bytes',
      ...(opts.endless?.has(file.path) && req.method !== 'HEAD' ? {} : { 'content-length': String(slice.length) }),
      ...(m ? { 'content-range': `bytes ${start}-${end}/${body.length}` } : {}),
    });
    if (req.method === 'HEAD') {
      // huggingface_hub reads a file's metadata with HEAD; faults are for the bytes of a GET.
      res.end();
      return;
    }
    if (opts.endless?.has(file.path)) {
      // A body that goes on past the listed size, bounded (50 MiB) so the fault itself stops.
      res.write(slice);
      const chunk = Buffer.alloc(64 * 1024, 0x61);
      let sent = slice.length;
      const more = () => {
        while (sent < 50 * 2 ** 20 && !res.destroyed) {
          sent += chunk.length;
          if (!res.write(chunk)) return void res.once('drain', more);
        }
        res.end();
      };
      more();
      return;
    }
    const cut = cutOnce.get(file.path);
    if (cut !== undefined && slice.length > cut) {
      cutOnce.delete(file.path);
      res.write(slice.subarray(0, cut), () => setTimeout(() => res.socket?.destroy(), 20));
      return;
    }
    const stall = stallOnce.get(file.path);
    if (stall !== undefined && slice.length > stall) {
      stallOnce.delete(file.path);
      res.write(slice.subarray(0, stall));
      return;
    }
    res.end(slice);
  };

  // The CDN is another host, `localhost` (still the loopback), as the hub's CDN is another host:
  // clients must follow the redirect for the bytes, drop the Authorization header on the way, and
  // read a file's metadata from the redirect itself (huggingface_hub follows same-host redirects).
  let cdnOrigin = '';
  const handler = (req: http.IncomingMessage, res: http.ServerResponse) => {
    requests.push({ method: req.method!, url: req.url!, range: req.headers.range, authorization: req.headers.authorization });
    if (opts.token && req.headers.authorization !== `Bearer ${opts.token}` && !req.url!.startsWith('/cdn/')) {
      res.writeHead(401, { 'content-type': 'application/json', 'x-error-code': 'RepoNotFound' }).end(JSON.stringify({ error: 'Invalid username or password.' }));
      return;
    }
    const u = new URL(req.url!, 'http://x');
    const json = (status: number, body: unknown, headers: Record<string, string> = {}) => res.writeHead(status, { 'content-type': 'application/json', ...headers }).end(JSON.stringify(body));
    const write = writeRoute(req, res, u);
    if (write) {
      void write.catch((e: Error) => {
        if (!res.headersSent) json(500, { error: `fake hub: ${e.message}` });
      });
      return;
    }
    if (u.pathname.startsWith('/cdn/')) {
      const sha = u.pathname.slice('/cdn/'.length);
      const f = repos.flatMap((r) => r.files).find((x) => x.lfs && x.sha256 === sha);
      if (!f) return json(404, { error: 'no such object' });
      return sendBytes(req, res, f, { etag: `"${f.sha256}"` });
    }
    for (const repo of repos) {
      const atRev = (rev: string) => rev === repo.revision || rev === repo.commit;
      const api = `/api/${repo.kind}/${repo.id}/`;
      if (u.pathname.startsWith(`${api}revision/`)) {
        const rev = decodeURIComponent(u.pathname.slice(`${api}revision/`.length));
        if (!atRev(rev)) return json(404, { error: `Invalid rev id: ${rev}` }, { 'x-error-code': 'RevisionNotFound' });
        return json(200, {
          _id: crypto.createHash('md5').update(repo.id).digest('hex').slice(0, 24), id: repo.id, sha: repo.commit, private: false,
          gated: repo.gated ? 'manual' : false, lastModified: '2026-01-01T00:00:00.000Z', siblings: repo.files.map((f) => ({ rfilename: f.path })),
        });
      }
      if (u.pathname.startsWith(`${api}tree/`)) {
        const rev = decodeURIComponent(u.pathname.slice(`${api}tree/`.length));
        if (!atRev(rev)) return json(404, { error: `Invalid rev id: ${rev}` }, { 'x-error-code': 'RevisionNotFound' });
        const lie = (f: Repo['files'][number], real: string) => opts.listedOid?.get(f.path) ?? real;
        const entries = repo.files.map((f) => ({
          type: 'file', oid: f.lfs ? f.oid : lie(f, f.oid), size: f.bytes.length, path: f.path, ...(f.lfs ? { lfs: { oid: lie(f, f.sha256), size: f.bytes.length, pointerSize: f.pointerSize } } : {}),
        }));
        const page = Number(u.searchParams.get('cursor') ?? 0);
        const next = page + 2 < entries.length ? `<http://${req.headers.host}${u.pathname}?recursive=true&cursor=${page + 2}>; rel="next"` : undefined;
        return json(200, entries.slice(page, page + 2), next ? { link: next } : {});
      }
      const resolve = `${repo.kind === 'datasets' ? '/datasets' : ''}/${repo.id}/resolve/`;
      if (u.pathname.startsWith(resolve)) {
        const [rev, ...rest] = u.pathname.slice(resolve.length).split('/').map(decodeURIComponent);
        if (!atRev(rev!)) return json(404, { error: `Invalid rev id: ${rev}` }, { 'x-error-code': 'RevisionNotFound' });
        if (repo.gated) {
          const auth = req.headers.authorization;
          if (!auth) {
            return json(401, { error: `Access to model ${repo.id} is restricted. You must have access to it and be authenticated to access it. Please log in.` }, {
              'x-error-code': 'GatedRepo', 'x-error-message': `Access to model ${repo.id} is restricted. You must have access to it and be authenticated to access it. Please log in.`,
            });
          }
          if (!repo.gated.tokens.some((t) => auth === `Bearer ${t}`)) {
            const msg = `Access to model ${repo.id} is restricted and you are not in the authorized list. Visit https://huggingface.co/${repo.id} to ask for access.`;
            return json(403, { error: msg }, { 'x-error-code': 'GatedRepo', 'x-error-message': msg });
          }
        }
        const f = repo.files.find((x) => x.path === rest.join('/'));
        if (!f) return json(404, { error: 'Entry not found' }, { 'x-error-code': 'EntryNotFound', 'x-error-message': 'Entry not found' });
        if (f.lfs) {
          res.writeHead(302, { location: `${cdnOrigin}/cdn/${f.sha256}`, 'x-repo-commit': repo.commit, 'x-linked-etag': `"${f.sha256}"`, 'x-linked-size': String(f.bytes.length), etag: `"${f.oid}"` }).end();
          return;
        }
        return sendBytes(req, res, f, { etag: `"${f.oid}"`, 'x-repo-commit': repo.commit });
      }
    }
    if (u.pathname.startsWith('/api/')) return json(401, { error: 'Repository not found' }, { 'x-error-code': 'RepoNotFound', 'x-error-message': 'Repository not found' });
    json(404, { error: `no route ${u.pathname}` });
  };
  /**
   * The upload routes, or null for another request. Each answers through `res` itself; the
   * promise rejects only on a fake-hub bug (answered 500).
   */
  function writeRoute(req: http.IncomingMessage, res: http.ServerResponse, u: URL): Promise<void> | null {
    const json = (status: number, body: unknown, headers: Record<string, string> = {}) => void res.writeHead(status, { 'content-type': 'application/json', ...headers }).end(JSON.stringify(body));
    const p = u.pathname;
    let route: { repoId: string; rev?: string; kind: 'create' | 'preupload' | 'batch' | 'commit' } | null = null;
    let m: RegExpExecArray | null;
    if (req.method === 'PUT' && (m = /^\/lfs-upload\/([0-9a-f]{64})$/.exec(p))) {
      const oid = m[1]!;
      return readBody(req).then((body) => {
        if (sha256(body) !== oid) return json(400, { error: `the body hashes to ${sha256(body)}, not ${oid}` });
        lfsStore.set(oid, body);
        lfsPuts.push({ oid, bytes: body.length });
        res.writeHead(200, { etag: `"${oid}"` }).end();
      });
    }
    if (req.method !== 'POST') return null;
    if (p === '/api/repos/create') route = { repoId: '', kind: 'create' };
    else if ((m = /^\/api\/models\/([^/]+\/[^/]+)\/preupload\/([^/]+)$/.exec(p))) route = { repoId: m[1]!, rev: decodeURIComponent(m[2]!), kind: 'preupload' };
    else if ((m = /^\/api\/models\/([^/]+\/[^/]+)\/commit\/([^/]+)$/.exec(p))) route = { repoId: m[1]!, rev: decodeURIComponent(m[2]!), kind: 'commit' };
    else if ((m = /^\/([^/]+\/[^/]+)\.git\/info\/lfs\/objects\/batch$/.exec(p))) route = { repoId: m[1]!, kind: 'batch' };
    if (!route) return null;
    const r = route;
    return readBody(req).then((body) => {
      if (!/^Bearer \S+$/.test(req.headers.authorization ?? '')) return json(401, { error: 'Invalid credentials in Authorization header' }, { 'x-error-code': 'Unauthorized' });
      if (r.kind === 'create') {
        const b = JSON.parse(body.toString()) as { name: string; organization?: string; type?: string; visibility?: string };
        const id = `${b.organization}/${b.name}`;
        if ((b.type ?? 'model') !== 'model') return json(400, { error: `the fake hub creates model repos only, not ${b.type}` });
        if (opts.readOnly?.has(id)) return json(403, { error: 'You don\'t have the rights to create a model under the namespace' });
        if (repos.some((x) => x.kind === 'models' && x.id === id)) return json(409, { error: 'You already created this model repo', url: `http://${req.headers.host}/${id}` });
        created.push({ id, visibility: b.visibility });
        repos.push({ kind: 'models', id, revision: 'main', commit: crypto.createHash('sha1').update(`models/${id}`).digest('hex'), files: [] });
        return json(200, { url: `http://${req.headers.host}/${id}`, name: id, id: crypto.createHash('md5').update(id).digest('hex').slice(0, 24) });
      }
      if (opts.readOnly?.has(r.repoId)) return json(403, { error: `You don't have write access to ${r.repoId}` });
      const repo = repos.find((x) => x.kind === 'models' && x.id === r.repoId);
      if (!repo) return json(404, { error: 'Repository not found' }, { 'x-error-code': 'RepoNotFound', 'x-error-message': 'Repository not found' });
      if (r.rev !== undefined && r.rev !== repo.revision) return json(404, { error: `Invalid rev id: ${r.rev}` }, { 'x-error-code': 'RevisionNotFound' });
      if (r.kind === 'preupload') {
        const b = JSON.parse(body.toString()) as { files: { path: string; size: number }[] };
        return json(200, { files: b.files.map((f) => ({ path: f.path, uploadMode: LFS_SUFFIX.test(f.path) || f.size > 10 * 2 ** 20 ? 'lfs' : 'regular', shouldIgnore: false })) });
      }
      if (r.kind === 'batch') {
        const b = JSON.parse(body.toString()) as { operation: string; objects: { oid: string; size: number }[] };
        if (b.operation !== 'upload') return json(400, { error: `the fake hub takes uploads only, not ${b.operation}` });
        return json(200, {
          transfer: 'basic',
          objects: b.objects.map((o) => ({
            oid: o.oid, size: o.size, authenticated: true,
            ...(hasLfs(o.oid) ? {} : { actions: { upload: { href: `http://${req.headers.host}/lfs-upload/${o.oid}`, expires_at: '2099-01-01T00:00:00Z' } } }),
          })),
        }, { 'content-type': 'application/vnd.git-lfs+json' });
      }
      // commit: NDJSON, a header line first.
      const lines = body.toString().split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l) as { key: string; value: Record<string, any> });
      if (lines[0]?.key !== 'header') return json(400, { error: 'the first line must be the header' });
      const next = new Map(repo.files.map((f) => [f.path, f]));
      for (const { key, value } of lines.slice(1)) {
        if (key === 'file') {
          if (value.encoding !== 'base64') return json(400, { error: `file ${value.path}: encoding ${value.encoding}, not base64` });
          next.set(value.path, repoFile(value.path, Buffer.from(value.content, 'base64'), false));
        } else if (key === 'lfsFile') {
          const bytes = lfsStore.get(value.oid) ?? repos.flatMap((x) => x.files).find((f) => f.lfs && f.sha256 === value.oid)?.bytes;
          if (!bytes) return json(422, { error: `lfsFile ${value.path}: no LFS object ${value.oid} was uploaded` });
          if (value.algo !== 'sha256' || value.size !== bytes.length) return json(422, { error: `lfsFile ${value.path}: algo ${value.algo}, size ${value.size}: not the object's` });
          next.set(value.path, repoFile(value.path, bytes, true));
        } else if (key === 'deletedFile') next.delete(value.path);
        else return json(400, { error: `unknown commit line ${key}` });
      }
      repo.files = [...next.values()].sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
      repo.commit = crypto.createHash('sha1').update(repo.commit).update(repo.files.map((f) => `${f.path}:${f.oid}`).join('\n')).digest('hex');
      return json(200, { success: true, commitOid: repo.commit, commitUrl: `http://${req.headers.host}/${repo.id}/commit/${repo.commit}`, hookOutput: '' });
    });
  }

  const server = http.createServer(handler);
  const cdn = http.createServer(handler);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  await new Promise<void>((r) => cdn.listen(0, 'localhost', r));
  const { port } = server.address() as AddressInfo;
  cdnOrigin = `http://localhost:${(cdn.address() as AddressInfo).port}`;
  return {
    url: `http://127.0.0.1:${port}`,
    commit: repos[0]?.commit ?? '',
    commitOf: (id) => {
      const r = repos.find((x) => x.id === id);
      if (!r) throw new Error(`the fake hub does not serve ${id}`);
      return r.commit;
    },
    requests,
    lfsPuts,
    created,
    filesOf: (id) => {
      const r = repos.find((x) => x.id === id);
      if (!r) throw new Error(`the fake hub does not serve ${id}`);
      return new Map(r.files.map((f) => [f.path, f.bytes]));
    },
    close: async () => {
      for (const srv of [server, cdn]) {
        await new Promise<void>((r) => {
          srv.closeAllConnections();
          srv.close(() => r());
        });
      }
    },
  };
}
