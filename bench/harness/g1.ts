/**
 * Test and bench harness: real datums from the Unitree G1 dataset sample the repository ships
 * (datasets/g1_pick_bottle_sample: 3 episodes, see its PROVENANCE.md), with frames JPEG-encoded
 * at full size (480x640) as a robot client would send them.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { encodeFrame } from '../../protocol/frames.ts';
import { ndarray } from '../../protocol/ndarray.ts';
import type { Datum } from '../../protocol/client.ts';
import { openDataset, type Dataset } from '../../server/datasets/index.ts';

/** The repository's datasets folder (what VELA_DATASETS_DIR points at in the quickstart). */
export const DATASETS_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../datasets');
export const G1_NAME = 'g1_pick_bottle_sample';
export const G1_DIR = path.join(DATASETS_DIR, G1_NAME);

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

/**
 * A copy of the first `n` G1 episodes (n <= 3, the sample's) as a dataset of its own in a temp
 * folder (real data, faster tests: frame decoding is most of a job's start-up). Returns the
 * folder; `root/name` for VELA_DATASETS_DIR.
 */
export function g1Subset(n: number, root = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-g1-')), name = 'g1_subset'): { root: string; name: string; dir: string } {
  const dir = path.join(root, name);
  const meta = (f: string) => path.join(G1_DIR, 'meta', f);
  fs.mkdirSync(path.join(dir, 'meta'), { recursive: true });
  const lines = (f: string) => fs.readFileSync(meta(f), 'utf8').split('\n').filter((l) => l.trim()).slice(0, n);
  const episodes = lines('episodes.jsonl');
  const frames = episodes.reduce((s, l) => s + JSON.parse(l).length, 0);
  const info = JSON.parse(fs.readFileSync(meta('info.json'), 'utf8'));
  Object.assign(info, { total_episodes: n, total_frames: frames, total_videos: n, splits: { train: `0:${n}` } });
  fs.writeFileSync(path.join(dir, 'meta', 'info.json'), JSON.stringify(info, null, 2));
  fs.writeFileSync(path.join(dir, 'meta', 'episodes.jsonl'), episodes.join('\n') + '\n');
  fs.writeFileSync(path.join(dir, 'meta', 'episodes_stats.jsonl'), lines('episodes_stats.jsonl').join('\n') + '\n');
  fs.copyFileSync(meta('tasks.jsonl'), path.join(dir, 'meta', 'tasks.jsonl'));
  for (let e = 0; e < n; e++) {
    const p = `data/chunk-000/episode_${String(e).padStart(6, '0')}.parquet`;
    const v = `videos/chunk-000/observation.images.cam_high/episode_${String(e).padStart(6, '0')}.mp4`;
    for (const rel of [p, v]) {
      fs.mkdirSync(path.dirname(path.join(dir, rel)), { recursive: true });
      fs.copyFileSync(path.join(G1_DIR, rel), path.join(dir, rel));
    }
  }
  return { root, name, dir };
}
