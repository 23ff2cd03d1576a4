/**
 * Test helper: real datums from the Unitree G1 dataset (../shared/datasets/g1_pick_bottle), with
 * frames JPEG-encoded at full size (480x640) as a robot client would send them.
 */
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { encodeFrame } from '../../protocol/frames.ts';
import { ndarray } from '../../protocol/ndarray.ts';
import type { Datum } from '../../protocol/client.ts';
import { openDataset, type Dataset } from '../../server/datasets/index.ts';

export const G1_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../shared/datasets/g1_pick_bottle');

let ds: Promise<Dataset> | undefined;
export function g1(): Promise<Dataset> {
  return (ds ??= openDataset(G1_DIR));
}

/**
 * `count` datums from one episode at evenly spaced frames: a JPEG frame of camera cam_high, the
 * 26-dim state, the task prompt and a `horizon`-step action chunk (valid rows only), values
 * scaled to roughly unit range as a client sends normalised data.
 */
export async function g1Datums(count: number, opts: { episode?: number; horizon?: number; offset?: number } = {}): Promise<Datum[]> {
  const d = await g1();
  const ep = opts.episode ?? 0;
  const horizon = opts.horizon ?? 16;
  const len = d.episode(ep).length;
  const table = d.table(ep);
  const A = d.meta.actionDim;
  const S = d.meta.stateDim;
  const out: Datum[] = [];
  for (let i = 0; i < count; i++) {
    const t = Math.floor(((i + 0.5 + (opts.offset ?? 0)) * (len - horizon)) / count) % (len - horizon);
    const frame = await d.frame(ep, 'cam_high', t, null);
    const jpeg = (await encodeFrame('JPEG', frame)) as Uint8Array;
    out.push({
      observation: {
        image: { cam_high: jpeg },
        state: ndarray(table.state.slice(t * S, (t + 1) * S), [S]),
        prompt: d.prompt(ep, t),
      },
      actions: ndarray(table.action.slice(t * A, (t + horizon) * A), [horizon, A]),
    });
  }
  return out;
}
