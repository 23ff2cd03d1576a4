/**
 * Inference latency over the OpenPI protocol: a checkpoint saved from a real session (3 cameras
 * bound, LoRA), served by the policy server of the bench server process, one client sending one
 * observation at a time with 1 or 3 cameras as RAW frames, JPEG bytes, or RAW compressed with
 * zstd and the observation dictionary. Frames are the camera's 480x640; the server resizes them.
 */
import { VelaClient } from '../protocol/client.ts';
import { encodeFrame } from '../protocol/frames.ts';
import { ndarray, packNumpy } from '../protocol/ndarray.ts';
import { initZstd, loadObservationDictionary, zstdCompress, zstdDecompress } from '../protocol/zstd.ts';
import { CAMERA_NAMES, toDatums, type RawSample } from './data.ts';
import { PolicyConnection } from '../protocol/policy-client.ts';
import { summarize, timeCalls } from './stats.ts';
import type { PolicyRow } from './schema.ts';
import type { ServerProc } from './server-proc.ts';
import { sessionOptions } from './step.ts';

/**
 * Trains one step of a session (LoRA unless `finetune` says full) on 3-camera datums and saves
 * its weights; returns the checkpoint folder (on this machine, written by the server).
 */
export async function makeCheckpoint(server: ServerProc, preset: string, samples3: RawSample[], finetune: 'lora' | 'full' = 'lora'): Promise<string> {
  const client = new VelaClient(server.baseUrl, server.apiKey);
  const s = await client.waitReady((await client.createSession({ base_model: preset, ...sessionOptions(finetune) })).id);
  const conn = await client.connect(s);
  try {
    await conn.forwardBackward(await toDatums(samples3, 'JPEG'), { codec: 'JPEG' });
    await conn.optimStep({ learning_rate: 1e-4 });
    return await conn.saveWeights('bench-policy', true);
  } finally {
    await conn.close();
    await client.closeSession(s.id);
  }
}

export type PolicyVariant = { codec: 'RAW' | 'JPEG'; zstd: boolean };
export const POLICY_VARIANTS: PolicyVariant[] = [{ codec: 'RAW', zstd: false }, { codec: 'JPEG', zstd: false }, { codec: 'RAW', zstd: true }];

/**
 * One OpenPI observation message of a sample with `cameras` frames. zstd uses the observation
 * dictionary (the round trip is checked; a mismatch is a note).
 */
export async function observationMessage(sample: RawSample, cameras: number, v: PolicyVariant, notes: string[] = []): Promise<{ bytes: Uint8Array; dict: boolean }> {
  const obs: Record<string, unknown> = {
    'observation/state': ndarray(sample.state, [sample.state.length]),
    prompt: sample.prompt,
    image_codec: v.codec,
  };
  for (let k = 0; k < cameras; k++) {
    const f = sample.frames[k]!;
    obs[`observation/${CAMERA_NAMES[k]}`] = v.codec === 'RAW' ? ndarray(f.data, [f.height, f.width, 3]) : await encodeFrame('JPEG', f);
  }
  const plain = Uint8Array.from(packNumpy(obs)); // packNumpy reuses its buffer: keep a copy
  if (!v.zstd) return { bytes: plain, dict: false };
  await initZstd();
  const dict = loadObservationDictionary();
  const z = zstdCompress(plain, { dict });
  if (Buffer.compare(Buffer.from(zstdDecompress(z, { dict, maxBytes: plain.byteLength })), Buffer.from(plain)) !== 0) {
    notes.push(`policy ${cameras} camera(s): the zstd dictionary round trip changed the bytes`);
  }
  return { bytes: z, dict: true };
}

/** Latency rows for 1 and 3 cameras x the variants, `requests` timed each. */
export async function runPolicy(wsUrl: string, sample: RawSample, requests: number, notes: string[]): Promise<PolicyRow[]> {
  const client = await PolicyConnection.open(wsUrl);
  const rows: PolicyRow[] = [];
  try {
    for (const cameras of [1, 3]) {
      for (const v of POLICY_VARIANTS) {
        const { bytes: msg, dict } = await observationMessage(sample, cameras, v, notes);
        const inferMs: number[] = [];
        const samples = await timeCalls(requests, 2, async () => {
          const a = await client.infer(msg).catch((e: Error) => {
            throw new Error(`${cameras} camera(s) ${v.codec}${v.zstd ? ` + zstd (${dict ? 'dict' : 'no dict'})` : ''}, ${msg.byteLength} bytes: ${e.message}`);
          });
          inferMs.push(Number(a.policy_timing?.infer_ms ?? NaN));
        });
        rows.push({
          cameras, codec: v.codec, zstd: v.zstd, zstdDict: dict, messageBytes: msg.byteLength, latency: summarize(samples),
          serverInferMs: summarize(inferMs.slice(2).filter(Number.isFinite).concat(inferMs.some(Number.isFinite) ? [] : [0])).p50,
          samplesMs: samples,
        });
      }
    }
  } finally {
    await client.close();
  }
  return rows;
}
