/**
 * Weights pushed into a running policy server (xorl's sync_inference_weights, PROTOCOL.md
 * section 6): `PUT <policy URL>/weights` (the standalone server: `PUT /weights`), body msgpack
 * `{"weights_version": str | int, "model_id": str, "files": {name: bin}}`, the files of a
 * checkpoint folder (section 4: config.json, model.safetensors or adapter_model.safetensors +
 * adapter_config.json, optionally norm_stats.json; F32, BF16 or F16 tensors). The server writes
 * them to a temporary folder, swaps them in (service.ts `swap`: between batches, no connection
 * dropped) and removes the folder. Answer: `{"weights_version", "previous_version", "load_seconds"}`.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { writeCheckpointDir } from '../../kernels/checkpoint.ts';
import { ProtocolError } from '../../protocol/errors.ts';
import { pack, unpack } from '../../protocol/msgpack.ts';
import { EngineError } from '../engine/messages.ts';
import { HttpError } from '../http/http.ts';
import type { PolicyServer, SwapResult } from './service.ts';

/** Default limit of a push body: 1 GiB (full-weight small presets are far below it). */
export const MAX_PUSH_BYTES = 1024 * 1024 * 1024;

export interface WeightsPush {
  weights_version: string | number | null;
  model_id: string | null;
  files: Record<string, Uint8Array>;
}

/** The msgpack body of a push. */
export function encodeWeightsPush(push: WeightsPush): Buffer {
  return Buffer.from(pack({ weights_version: push.weights_version, model_id: push.model_id, files: push.files }));
}

/**
 * Decode a push body. @throws ProtocolError `bad_request` for a body that is not the map above,
 * or a file name that is not a plain name.
 */
export function decodeWeightsPush(bytes: Uint8Array): WeightsPush {
  let v: unknown;
  try {
    v = unpack(bytes);
  } catch (e) {
    throw new ProtocolError('bad_request', `weights push is not msgpack: ${(e as Error).message}`);
  }
  const get = (o: unknown, k: string) => (o instanceof Map ? o.get(k) : (o as Record<string, unknown> | null)?.[k]);
  const files = get(v, 'files');
  if (v === null || typeof v !== 'object' || files === null || typeof files !== 'object') {
    throw new ProtocolError('bad_request', 'a weights push is a msgpack map {"weights_version", "model_id", "files": {name: bytes}}');
  }
  const out: Record<string, Uint8Array> = {};
  for (const [name, data] of files instanceof Map ? files.entries() : Object.entries(files)) {
    if (typeof name !== 'string' || !/^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/.test(name)) throw new ProtocolError('bad_request', `weights push file name ${JSON.stringify(name)} is not a plain file name`);
    if (!(data instanceof Uint8Array)) throw new ProtocolError('bad_request', `weights push file ${name} is not bytes`);
    out[name] = data;
  }
  if (!out['config.json']) throw new ProtocolError('bad_request', 'weights push has no config.json');
  const version = get(v, 'weights_version') ?? null;
  const modelId = get(v, 'model_id') ?? null;
  return { weights_version: typeof version === 'string' || typeof version === 'number' ? version : null, model_id: typeof modelId === 'string' ? modelId : null, files: out };
}

/**
 * Swap a decoded push into `policy` (through a temporary checkpoint folder, removed after).
 * @throws HttpError 400 for weights the policy cannot serve (another preset, a bad file; the
 *   old weights keep serving), 409 for a live policy.
 */
export async function applyWeightsPush(policy: PolicyServer, push: WeightsPush): Promise<SwapResult> {
  if (policy.isLive) throw new HttpError(409, "this policy serves a training session's live weights; it takes no pushed weights");
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-push-'));
  try {
    const dir = path.join(tmp, 'weights');
    await writeCheckpointDir(dir, push.files);
    return await policy.swap(dir, push.weights_version);
  } catch (e) {
    const name = (e as Error)?.name;
    if (e instanceof EngineError || ['PolicyConfigError', 'CheckpointError', 'NormError', 'TrainerError'].includes(name)) {
      // The temporary folder is this server's business: name it as what the client sent.
      throw new HttpError(400, `the pushed weights cannot be served: ${(e as Error).message.split(path.join(tmp, 'weights')).join('<pushed weights>')}`);
    }
    throw e;
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}
