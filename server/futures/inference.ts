/**
 * xorl's "Inference Integration" on Vela's policy servers (answered at once, not as futures):
 * - `POST /add_inference_endpoint` `{url | host + port, api_key?, name?}`: register a policy
 *   server of this key (`vela policy`'s `ws://host:port/`, or a `/v1/fine-tunes/{id}/policy`,
 *   `/v1/sampling_sessions/{id}/policy` URL of a Vela server); answers it with `reachable`
 *   (its `/healthz`). Loopback, private, link-local and the server's own addresses are a 403
 *   unless `--allow-endpoint` holds them (inference/egress.ts, checked again at every
 *   connection); at most `--endpoints-per-key` (16) per key, a 429 past it. `POST /remove_inference_endpoint` `{endpoint_id | url}`;
 *   `GET /list_inference_endpoints`. Also under `/api/v1/`. Keys are stored, never listed.
 * - `POST /api/v1/sync_inference_weights` `{model_id, endpoints?}`: the model's current weights
 *   (adapter or full), taken between its ops, pushed to every endpoint (or those named) as
 *   `PUT <url>/weights` (policy/push.ts); each swaps them in between batches. Answers which
 *   endpoint took which `weights_version` (the model's optimizer step), or its error.
 * - `POST /api/v1/set_sync_quantization` `{quantization: none | bf16 | fp16}`: the transfer
 *   precision of this key's syncs (xorl's FP8 has no Vela counterpart: a 400).
 * - `POST /api/v1/create_sampling_session` `{checkpoint_id | path | model_path}`: serve a saved
 *   checkpoint (an adapter or full weights; `model_path` may be `trained/<fine-tune id>`) as a
 *   policy without a job: `/v1/sampling_sessions/{id}/policy` (OpenPI) and `.../infer` (HTTP).
 *   Stored, so its URLs answer after a restart (the policy loads again on first use).
 */
import fs from 'node:fs';
import path from 'node:path';
import { randomId, type EndpointRow } from '../store/store.ts';
import { HttpError } from '../http/http.ts';
import { requestPreset, storedPreset } from '../models/presets.ts';
import { isRealModel } from '../models/bases.ts';
import { encodeWeightsPush } from '../policy/index.ts';
import { targetOf, type InferenceDeps } from '../inference/routes.ts';
import { EgressPolicy } from '../inference/egress.ts';
import { endpointUrl, probe, pushTo, SYNC_QUANTIZATIONS, type SyncQuantization } from '../inference/sync.ts';
import { sendAs } from './codec.ts';
import { checkpointIdOfPath, checkpointPath } from './checkpoints.ts';
import { checkFields, withIgnored } from './fields.ts';
import { modelIdOf } from './requests.ts';
import { publicModelId, type FuturesContext } from './context.ts';

export function mountInferenceIntegration(ctx: FuturesContext, inference: InferenceDeps): void {
  const { store } = ctx.deps;
  const quantization = new Map<string, SyncQuantization>(); // per key
  /** Both at the root (as xorl lists them) and under /api/v1. */
  const both = (method: 'get' | 'post', name: string, fn: Parameters<FuturesContext['handle']>[0]) => {
    ctx.app[method](`/${name}`, ctx.handle(fn));
    ctx.app[method](`/api/v1/${name}`, ctx.handle(fn));
  };
  const endpointJson = (e: EndpointRow) => ({ endpoint_id: e.id, url: e.url, name: e.name, has_api_key: e.api_key !== null, created_at: e.created_at });

  const { config } = ctx.deps;
  const publicHost = config.publicUrl ? new URL(config.publicUrl).hostname : undefined;
  const egress = new EgressPolicy(config.allowEndpoint, publicHost ? [publicHost] : []);
  // One registration per key at a time, so that two at once cannot both pass the cap.
  const registering = new Map<string, Promise<unknown>>();
  const oneAtATime = <T>(owner: string, fn: () => Promise<T>): Promise<T> => {
    const run = (registering.get(owner) ?? Promise.resolve()).then(fn, fn);
    const tail = run.catch(() => undefined);
    registering.set(owner, tail);
    void tail.then(() => registering.get(owner) === tail && registering.delete(owner));
    return run;
  };

  both('post', 'add_inference_endpoint', async (r, owner, body) => {
    const v = body.value;
    checkFields(r, v, ['url', 'host', 'port', 'api_key', 'name'], 'add_inference_endpoint');
    const url = endpointUrl(v);
    if (v.api_key !== undefined && v.api_key !== null && typeof v.api_key !== 'string') throw new HttpError(400, 'api_key must be a string');
    if (v.name !== undefined && v.name !== null && (typeof v.name !== 'string' || v.name.length > 128)) throw new HttpError(400, 'name must be a string of at most 128 characters');
    // The URL as the client wrote it (http://2130706433/ is http://127.0.0.1/ once parsed).
    const given = typeof v.url === 'string' ? v.url : url;
    await egress.checkUrl(given, url);
    const row = await oneAtATime(owner, async () => {
      const existing = await store.listEndpoints(owner);
      if (!existing.some((e) => e.url === url) && existing.length >= config.endpointsPerKey) {
        throw new HttpError(429, `this key has ${existing.length} inference endpoints; the limit is ${config.endpointsPerKey} (--endpoints-per-key): remove one with remove_inference_endpoint first`);
      }
      return store.upsertEndpoint(owner, url, (v.api_key as string | undefined) ?? null, (v.name as string | undefined) ?? null);
    });
    sendAs(r, body.format, 200, withIgnored(r, { ...endpointJson(row), reachable: await probe(egress, url) }));
  });

  both('post', 'remove_inference_endpoint', async (r, owner, body) => {
    checkFields(r, body.value, ['endpoint_id', 'url', 'host', 'port'], 'remove_inference_endpoint');
    const which = body.value.endpoint_id ?? endpointUrl(body.value);
    if (typeof which !== 'string' || !(await store.deleteEndpoint(owner, which))) throw new HttpError(404, `no inference endpoint ${JSON.stringify(which)}`);
    sendAs(r, body.format, 200, withIgnored(r, { removed: which }));
  });

  both('get', 'list_inference_endpoints', async (r, owner, body) => {
    sendAs(r, body.format, 200, { endpoints: (await store.listEndpoints(owner)).map(endpointJson), quantization: quantization.get(owner) ?? 'none' });
  });

  ctx.post('set_sync_quantization', (r, owner, body) => {
    checkFields(r, body.value, ['quantization'], 'set_sync_quantization');
    const q = body.value.quantization;
    if (typeof q !== 'string' || !(q in SYNC_QUANTIZATIONS)) {
      throw new HttpError(400, `quantization must be one of ${Object.keys(SYNC_QUANTIZATIONS).join(', ')}, got ${JSON.stringify(q)} (Vela sends float32, bfloat16 or float16; there is no fp8)`);
    }
    quantization.set(owner, q as SyncQuantization);
    sendAs(r, body.format, 200, withIgnored(r, { quantization: q }));
  });

  ctx.post('sync_inference_weights', async (r, owner, body) => {
    checkFields(r, body.value, ['model_id', 'endpoints'], 'sync_inference_weights');
    const live = await ctx.modelOf(owner, modelIdOf(body.value));
    const all = await store.listEndpoints(owner);
    const wanted = body.value.endpoints;
    if (wanted !== undefined && (!Array.isArray(wanted) || !wanted.every((x) => typeof x === 'string'))) throw new HttpError(400, 'endpoints must be a list of endpoint ids or urls');
    const targets = wanted === undefined ? all : all.filter((e) => (wanted as string[]).includes(e.id) || (wanted as string[]).includes(e.url));
    if (wanted !== undefined && targets.length !== (wanted as string[]).length) {
      const known = new Set(all.flatMap((e) => [e.id, e.url]));
      throw new HttpError(404, `no inference endpoint ${(wanted as string[]).filter((w) => !known.has(w)).map((w) => JSON.stringify(w)).join(', ')}`);
    }
    if (targets.length === 0) throw new HttpError(409, 'this key has no inference endpoints: register one with add_inference_endpoint');
    if (live.cameras.length === 0) throw new HttpError(409, `model ${publicModelId(live.row)} has no camera bound yet: a policy needs them (its first forward_backward, forward or sample binds them)`);
    const q = quantization.get(owner) ?? 'none';
    const exported = await ctx.engineCall<{ files: Record<string, Uint8Array>; step: number }>(live, 'export_weights', {
      cameras: [...live.cameras], actionHorizon: live.actionHorizon, dtype: SYNC_QUANTIZATIONS[q],
    });
    const push = encodeWeightsPush({ weights_version: exported.step, model_id: publicModelId(live.row), files: exported.files });
    const outcomes = await Promise.all(targets.map((e) => pushTo(egress, e, push)));
    sendAs(r, body.format, 200, withIgnored(r, { model_id: publicModelId(live.row), weights_version: exported.step, quantization: q, bytes: push.length, endpoints: outcomes }));
  });

  ctx.post('create_sampling_session', async (r, owner, body) => {
    const v = body.value;
    checkFields(r, v, ['checkpoint_id', 'path', 'model_path', 'base_model', 'session_id', 'sampling_session_seq_id'], 'create_sampling_session');
    const given = ['checkpoint_id', 'path', 'model_path'].filter((k) => v[k] !== undefined);
    if (given.length !== 1) throw new HttpError(400, `create_sampling_session takes one of checkpoint_id, path, model_path; got ${given.length ? given.join(', ') : 'none'}`);
    const raw = String(v[given[0]!]);
    let dir: string;
    let id: string;
    const trained = /^trained\/(ft-[a-z0-9]+)$/.exec(raw);
    if (trained) {
      const job = await store.getJob(trained[1]!);
      if (!job || job.owner !== owner || job.status !== 'succeeded') throw new HttpError(404, `no succeeded fine-tune ${trained[1]}`);
      [dir, id] = [job.output_dir, raw];
    } else {
      const cid = given[0] === 'checkpoint_id' ? raw : checkpointIdOfPath(ctx.ownerRoot(owner), raw);
      if (cid === null) throw new HttpError(400, `${given[0]} ${JSON.stringify(raw)} is a bare name; give the path or checkpoint_id that save_weights returned`);
      [dir, id] = [checkpointPath(ctx.ownerRoot(owner), cid), cid];
    }
    let ck: { preset?: unknown; base_checkpoint?: unknown };
    try {
      ck = JSON.parse(fs.readFileSync(path.join(dir, 'config.json'), 'utf8'));
    } catch {
      throw new HttpError(404, `checkpoint ${id} has no readable config.json`);
    }
    const preset = ck.preset;
    if (typeof preset !== 'string') throw new HttpError(400, `checkpoint ${id} has no preset in config.json`);
    // A real pi0 / pi0.5 checkpoint names its base; bare pi0 / pi05 without one is an old name of a small preset.
    const real = isRealModel(preset) && typeof ck.base_checkpoint === 'string';
    // Old names equal the presets they name: a checkpoint written as flow0-tiny is for flow0-tiny.
    if (v.base_model !== undefined && (real ? v.base_model !== preset : requestPreset('base_model', v.base_model) !== storedPreset(preset))) throw new HttpError(400, `checkpoint ${id} is for ${preset}, not ${JSON.stringify(v.base_model)}`);
    const s = { id: randomId('samp-'), owner, checkpointDir: dir, checkpointId: id, preset, createdAt: Math.floor(Date.now() / 1000) };
    inference.sampling.set(s.id, s);
    // Load it now: a checkpoint that cannot be served is this request's 400, not a robot's.
    let warm;
    try {
      const t = await targetOf(inference, 'sampling_sessions', s.id, r.headers);
      warm = await inference.served.acquire(t.key, t.load, t.alive);
    } catch (e) {
      inference.sampling.delete(s.id);
      if (e instanceof HttpError) throw e;
      throw new HttpError(400, `checkpoint ${id} cannot be served: ${(e as Error).message}`);
    }
    // Stored once it serves: after a restart its URLs still answer (targetOf loads it on first use).
    try {
      await store.insertSamplingSession({ id: s.id, owner, checkpoint_dir: dir, checkpoint_id: id, preset, created_at: s.createdAt });
    } catch (e) {
      inference.sampling.delete(s.id);
      throw e;
    }
    const base = (ctx.deps.config.publicUrl ?? ctx.deps.baseUrl?.() ?? '').replace(/\/$/, '');
    sendAs(r, body.format, 200, withIgnored(r, {
      sampling_session_id: s.id, model: preset, checkpoint_id: id,
      url: `${base.replace(/^http/, 'ws')}/v1/sampling_sessions/${s.id}/policy`, infer_url: `${base}/v1/sampling_sessions/${s.id}/infer`,
      load_seconds: warm.loadSeconds, weights_version: warm.policy.weightsVersion(),
    }));
  });
}
