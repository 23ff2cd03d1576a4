/**
 * A finished fine-tune served to robots from the main server: the OpenPI websocket protocol at
 * `/v1/fine-tunes/{id}/policy` (PROTOCOL.md section 6), on the engine of the job's model (its
 * `engine_model`: a preset, or the real pi0 / pi0.5 on the job's base). Each job's policy is
 * loaded on first use and kept.
 */
import { storedEngineModel } from './base.ts';
import type { TemplatedApp } from 'uWebSockets.js';
import { loadObservationDictionary } from '../../protocol/zstd.ts';
import { credentialOf } from '../auth.ts';
import { HttpError, route, statusLine } from '../http.ts';
import { createFolderPolicy, mountPolicySocket, type PolicyServer } from '../policy/index.ts';
import type { EngineLike } from '../engine/host.ts';
import type { ServerConfig } from '../config.ts';
import type { Store } from '../store.ts';

export function mountJobPolicies(app: TemplatedApp, deps: { store: Store; config: ServerConfig; engineFor: (preset: string) => Promise<EngineLike> }): { close(): Promise<void> } {
  const { store, config, engineFor } = deps;
  const served = new Map<string, Promise<PolicyServer>>();

  app.get('/v1/observation.zdict', route(0, (r) => {
    if (r.aborted) return;
    r.aborted = true;
    const dict = loadObservationDictionary();
    r.res.cork(() => r.res.writeStatus(statusLine(200)).writeHeader('content-type', 'application/octet-stream').end(dict));
  }));

  mountPolicySocket(app, '/v1/fine-tunes/:id/policy', async (req) => {
    const key = credentialOf(req.headers);
    const owner = key ? await store.findApiKey(key) : null;
    if (!owner) throw new HttpError(401, key ? 'invalid API key' : 'missing API key: send "Authorization: Api-Key <key>" or Bearer');
    const job = await store.getJob(req.params[0]!);
    if (!job || job.owner !== owner) throw new HttpError(404, `no fine-tune ${req.params[0]}`);
    if (job.status !== 'succeeded') throw new HttpError(409, `fine-tune ${job.id} is ${job.status}; only a succeeded job has a policy to serve`);
    let p = served.get(job.id);
    if (!p) {
      p = storedEngineModel(job.config).then((engineModel) => createFolderPolicy(engineFor, job.output_dir, { engineModel, policyId: `policy-${job.id}`, owner: job.owner, limits: { maxMessageBytes: config.maxPolicyMessageBytes } }));
      served.set(job.id, p);
      p.catch(() => served.delete(job.id));
    }
    return p;
  }, { maxMessageBytes: config.maxPolicyMessageBytes, limitFlag: '--max-policy-message-bytes' });

  return {
    async close() {
      for (const p of served.values()) await p.then((s) => s.close()).catch(() => undefined);
    },
  };
}
