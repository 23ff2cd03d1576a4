/**
 * The LeRobot dataset reader on the real G1 data (v2.1, AV1 video) and on two small datasets in
 * test/fixtures (v3.0 with h264 video, v2.1 with PNG/JPEG image features), whose values are
 * closed-form (see test/fixtures/make_lerobot_fixtures.py). Broken datasets are copies in a temp
 * folder (videos symlinked, so nothing big is copied).
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { resizeWithPadSync } from '../protocol/resize.ts';
import {
  actionChunk,
  ByteLruCache,
  DatasetError,
  defaultActionSpace,
  deltaPairs,
  describeDataset,
  gatherNormRows,
  makeDatum,
  openDataset,
  pairsFor,
  sampleBatch,
  seededRng,
  splitEpisodes,
} from '../server/datasets/index.ts';
import type { Dataset } from '../server/datasets/index.ts';
import { ffmpegPath } from '../server/datasets/video.ts';
import { G1_DIR } from '../bench/harness/g1.ts';

const G1 = G1_DIR; // the shipped 3-episode sample (290, 421, 372 frames)
const V30 = path.join(import.meta.dirname, 'fixtures', 'lerobot_v30');
const IMAGE = path.join(import.meta.dirname, 'fixtures', 'lerobot_image');

const tmpDirs: string[] = [];
afterAll(() => {
  for (const d of tmpDirs) fs.rmSync(d, { recursive: true, force: true });
});

/** Copies a dataset into a temp folder; files under videos/ become symlinks. */
function copyDataset(src: string): string {
  const dst = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-ds-'));
  tmpDirs.push(dst);
  const walk = (rel: string) => {
    for (const ent of fs.readdirSync(path.join(src, rel), { withFileTypes: true })) {
      const r = path.join(rel, ent.name);
      if (ent.isDirectory()) {
        fs.mkdirSync(path.join(dst, r), { recursive: true });
        walk(r);
      } else if (r.startsWith('videos')) {
        fs.symlinkSync(path.join(src, r), path.join(dst, r));
      } else {
        fs.copyFileSync(path.join(src, r), path.join(dst, r));
        fs.chmodSync(path.join(dst, r), 0o644);
      }
    }
  };
  walk('');
  return dst;
}

/** The DatasetError a promise rejects with (fails the test when it resolves or throws another). */
async function datasetError(p: Promise<unknown>): Promise<DatasetError> {
  try {
    await p;
  } catch (err) {
    expect(err).toBeInstanceOf(DatasetError);
    return err as DatasetError;
  }
  throw new Error('expected a DatasetError');
}

function jsonl(file: string): Record<string, unknown>[] {
  return fs.readFileSync(file, 'utf8').split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l) as Record<string, unknown>);
}

describe('G1 pick-bottle (v2.1, AV1)', () => {
  let ds: Dataset;
  const lengths = new Map(jsonl(path.join(G1, 'meta/episodes.jsonl')).map((r) => [Number(r.episode_index), Number(r.length)]));

  it('opens with the metadata of info.json and episodes.jsonl', async () => {
    ds = await openDataset(G1);
    const m = ds.meta;
    expect(m.codebaseVersion).toBe('v2.1');
    expect(m.fps).toBe(30);
    expect(m.episodes.length).toBe(3);
    expect(m.totalFrames).toBe(1083);
    expect(m.cameras).toEqual([{ key: 'observation.images.cam_high', name: 'cam_high', kind: 'video', height: 480, width: 640, codec: 'av1' }]);
    expect([m.stateDim, m.actionDim]).toEqual([26, 26]);
    expect(m.stateNames?.[0]).toBe('kLeftShoulderPitch');
    expect(m.actionNames).toEqual(m.stateNames);
    expect(defaultActionSpace(m)).toBe('delta');
    expect(m.tasks.get(0)).toBe('Pick up the yellow bottle on the table.');
    expect(m.episodes[2].dataFile).toBe('data/chunk-000/episode_000002.parquet');
    expect(m.episodes[2].videos['observation.images.cam_high'].file).toBe('videos/chunk-000/observation.images.cam_high/episode_000002.mp4');
  });

  it('reads as many parquet rows per episode as episodes.jsonl says, in frame order', () => {
    let total = 0;
    for (const e of ds.episodeIndices) {
      const t = ds.table(e);
      expect(t.length).toBe(lengths.get(e));
      expect(t.state.length).toBe(t.length * 26);
      expect(t.action.length).toBe(t.length * 26);
      expect(t.timestamp[t.length - 1]).toBeCloseTo((t.length - 1) / 30, 4);
      total += t.length;
    }
    expect(total).toBe(1083);
    // Values as the parquet stores them (float32), read once with hyparquet by hand.
    expect(ds.table(0).state[0]).toBe(Math.fround(-0.7153264284133911));
    expect(ds.table(0).action[0]).toBe(Math.fround(-0.7146168947219849));
    expect(ds.prompt(2, 10)).toBe('Pick up the yellow bottle on the table.');
  });

  it('decodes exactly episode 0 length frames at 96x96 with centred black padding', async () => {
    const t0 = performance.now();
    const f = await ds.frames(0, 'cam_high', 96);
    console.log(`G1 episode 0 (290 AV1 frames 640x480) -> 96x96 in ${(performance.now() - t0).toFixed(0)} ms`);
    expect([f.count, f.width, f.height]).toEqual([290, 96, 96]);
    expect(f.data.length).toBe(290 * 96 * 96 * 3);
    // 640x480 scales to 96x72: rows 0..11 and 84..95 are padding, the rest is picture.
    const frame = f.data.subarray(100 * 96 * 96 * 3, 101 * 96 * 96 * 3);
    const row = (y: number) => frame.subarray(y * 96 * 3, (y + 1) * 96 * 3);
    for (const y of [0, 11, 84, 95]) expect(Math.max(...row(y))).toBe(0);
    for (const y of [12, 48, 83]) expect(Math.max(...row(y))).toBeGreaterThan(0);
    // Second request comes from the cache.
    const again = await ds.frames(0, 'observation.images.cam_high', 96);
    expect(again).toBe(f);
    expect(ds.cache.hits).toBeGreaterThanOrEqual(1);
  });

  it('pads action chunks at the episode end with the last action and masks them', () => {
    const t = ds.table(0); // 290 frames
    const A = 26;
    const last = t.action.subarray(289 * A, 290 * A);
    const abs = actionChunk(t, 285, 16, A, 26, []);
    expect([...abs.mask]).toEqual([1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    for (let h = 0; h < 5; h++) expect(abs.actions.subarray(h * A, (h + 1) * A)).toEqual(t.action.subarray((285 + h) * A, (286 + h) * A));
    for (let h = 5; h < 16; h++) expect(abs.actions.subarray(h * A, (h + 1) * A)).toEqual(last);
    const atEnd = actionChunk(t, 289, 16, A, 26, []);
    expect(atEnd.mask[0]).toBe(1);
    expect(atEnd.mask.slice(1).every((v) => v === 0)).toBe(true);
    expect(actionChunk(t, 0, 16, A, 26, []).mask.every((v) => v === 1)).toBe(true);
    // delta: every row (padding too) minus the state at t, on all 26 name-shared dims.
    const pairs = pairsFor(ds.meta, 'delta');
    expect(pairs.length).toBe(26);
    const delta = actionChunk(t, 285, 16, A, 26, pairs);
    for (let h = 0; h < 16; h++) {
      const src = Math.min(285 + h, 289);
      for (let a = 0; a < A; a++) expect(delta.actions[h * A + a]).toBe(Math.fround(t.action[src * A + a] - t.state[285 * 26 + a]));
    }
  });

  it('builds datums and seeded batches from the decoded frames', async () => {
    const d = await makeDatum(ds, 0, 287, { horizon: 16, imageSize: 96, actionSpace: 'absolute' });
    expect(Object.keys(d.images)).toEqual(['cam_high']);
    expect(d.images.cam_high.data).toEqual((await ds.frames(0, 'cam_high', 96)).data.subarray(287 * 27648, 288 * 27648));
    expect(d.state).toEqual(ds.table(0).state.subarray(287 * 26, 288 * 26));
    expect(d.prompt).toBe('Pick up the yellow bottle on the table.');
    expect(d.actionMask.reduce((s, v) => s + v, 0)).toBe(3);
    expect(ds.frameBytes([0, 1], ['cam_high'], 96)).toBe((290 + 421) * 96 * 96 * 3);
    const opts = { episodes: [0], batchSize: 6, horizon: 16, cameras: ['cam_high'], imageSize: 96, actionSpace: 'delta' as const };
    const a = await sampleBatch(ds, { ...opts, seed: 7 });
    const b = await sampleBatch(ds, { ...opts, seed: 7 });
    expect(a.map((x) => x.frameIndex)).toEqual(b.map((x) => x.frameIndex));
    expect(a.every((x) => x.episodeIndex === 0 && x.frameIndex >= 0 && x.frameIndex < 290)).toBe(true);
    const rng = seededRng(7);
    const c1 = await sampleBatch(ds, { ...opts, rng });
    const c2 = await sampleBatch(ds, { ...opts, rng });
    expect(c1.map((x) => x.frameIndex)).toEqual(a.map((x) => x.frameIndex));
    expect(c2.map((x) => x.frameIndex)).not.toEqual(c1.map((x) => x.frameIndex));
  });

  it('gathers per-frame norm-stat rows of the training episodes in the chosen space', () => {
    const { train } = splitEpisodes(ds.episodeIndices, { seed: 0 });
    const rows = gatherNormRows(ds, train, 'delta', 1);
    expect(rows.count).toBe(train.reduce((s, e) => s + (lengths.get(e) ?? 0), 0));
    expect(rows.state.length).toBe(rows.count * 26);
    const first = ds.table(train[0]);
    expect(rows.state.subarray(0, 26)).toEqual(first.state.subarray(0, 26));
    for (let a = 0; a < 26; a++) expect(rows.action[a]).toBe(Math.fround(first.action[a] - first.state[a]));
    const absRows = gatherNormRows(ds, train, 'absolute', 1);
    expect(absRows.action.subarray(0, 26)).toEqual(first.action.subarray(0, 26));
  });

  it('describes the dataset for `vela datasets inspect`', () => {
    const text = describeDataset(ds.meta);
    expect(text).toContain('episodes  3 (length min 290, mean 361.0, max 421 frames)');
    expect(text).toContain('frames    1083 (36.1 s)');
    expect(text).toContain('cam_high         video 640x480 av1 (observation.images.cam_high)');
    expect(text).toContain('state     26 dims');
    expect(text).toContain('fps       30');
  });

  it('names a missing video file', async () => {
    const dir = copyDataset(G1);
    fs.rmSync(path.join(dir, 'videos/chunk-000/observation.images.cam_high/episode_000002.mp4'));
    const err = await datasetError(openDataset(dir));
    expect(err.code).toBe('missing_file');
    expect(err.message).toContain('videos/chunk-000/observation.images.cam_high/episode_000002.mp4');
  });

  it('names a corrupt or missing parquet file', async () => {
    const dir = copyDataset(G1);
    const rel = 'data/chunk-000/episode_000001.parquet';
    const bytes = fs.readFileSync(path.join(dir, rel));
    fs.writeFileSync(path.join(dir, rel), bytes.subarray(0, bytes.length >> 1));
    const err = await datasetError(openDataset(dir));
    expect(err.code).toBe('corrupt_file');
    expect(err.message).toContain(rel);
    fs.rmSync(path.join(dir, rel));
    const missing = await datasetError(openDataset(dir));
    expect(missing.code).toBe('missing_file');
    expect(missing.message).toContain(rel);
  });

  it('rejects metadata that disagrees with the parquet rows or is missing', async () => {
    const dir = copyDataset(G1);
    const epPath = path.join(dir, 'meta/episodes.jsonl');
    const eps = jsonl(epPath);
    eps[2].length = Number(eps[2].length) + 1;
    fs.writeFileSync(epPath, eps.map((e) => JSON.stringify(e)).join('\n') + '\n');
    const total = await datasetError(openDataset(dir));
    expect(total.code).toBe('row_count_mismatch');
    expect(total.message).toContain('total_frames 1083');
    const infoPath = path.join(dir, 'meta/info.json');
    const info = JSON.parse(fs.readFileSync(infoPath, 'utf8')) as Record<string, unknown>;
    fs.writeFileSync(infoPath, JSON.stringify({ ...info, total_frames: 1084 }));
    const rows = await datasetError(openDataset(dir));
    expect(rows.code).toBe('row_count_mismatch');
    expect(rows.message).toBe('data/chunk-000/episode_000002.parquet has 372 rows, but meta/episodes.jsonl gives its episodes 373 frames');
    fs.writeFileSync(infoPath, JSON.stringify({ ...info, codebase_version: 'v1.6' }));
    const version = await datasetError(openDataset(dir));
    expect(version.code).toBe('unsupported_version');
    expect(version.message).toContain('"v1.6"');
    fs.rmSync(infoPath);
    const noInfo = await datasetError(openDataset(dir));
    expect(noInfo.code).toBe('missing_file');
    expect(noInfo.message).toContain('meta/info.json');
  });

  it('fails a video whose frame count differs from the episode length, naming it', async () => {
    const dir = copyDataset(G1);
    const vid = (e: number) => path.join(dir, `videos/chunk-000/observation.images.cam_high/episode_${String(e).padStart(6, '0')}.mp4`);
    // Episode 2 (372 frames) gets episode 0's video (290 frames).
    fs.rmSync(vid(2));
    fs.symlinkSync(path.join(G1, 'videos/chunk-000/observation.images.cam_high/episode_000000.mp4'), vid(2));
    const copy = await openDataset(dir);
    const err = await datasetError(copy.frames(2, 'cam_high', 8));
    expect(err.code).toBe('bad_video');
    expect(err.message).toBe('video file videos/chunk-000/observation.images.cam_high/episode_000002.mp4: decoded 290 frames, but the episode has 372');
  });
});

describe('v3.0 fixture (many episodes per file, h264)', () => {
  let ds: Dataset;

  it('reads the episodes metadata, tasks and names', async () => {
    ds = await openDataset(V30);
    const m = ds.meta;
    expect(m.codebaseVersion).toBe('v3.0');
    expect(m.episodes.map((e) => [e.index, e.length, e.dataFile, e.rowStart])).toEqual([
      [0, 5, 'data/chunk-000/file-000.parquet', 0],
      [1, 7, 'data/chunk-000/file-000.parquet', 5],
      [2, 4, 'data/chunk-000/file-001.parquet', 0],
    ]);
    const front = 'observation.images.front';
    expect(m.episodes.map((e) => e.videos[front].file)).toEqual([
      'videos/observation.images.front/chunk-000/file-000.mp4',
      'videos/observation.images.front/chunk-000/file-000.mp4',
      'videos/observation.images.front/chunk-000/file-001.mp4',
    ]);
    expect(m.episodes[1].videos[front].fromS).toBeCloseTo(0.5, 9);
    expect([...m.tasks.entries()]).toEqual([[0, 'pick the cube'], [1, 'place the cube']]);
    expect(m.episodes.map((e) => e.tasks)).toEqual([['pick the cube'], ['place the cube'], ['pick the cube']]);
    expect(m.stateNames).toEqual(['x', 'y', 'gripper']);
    expect(defaultActionSpace(m)).toBe('delta');
    expect(m.cameras.map((c) => [c.name, c.kind, c.width, c.height, c.codec])).toEqual([['front', 'video', 32, 24, 'h264']]);
  });

  it('splits the shared data file by episode with the stored values', () => {
    for (const e of [0, 1, 2]) {
      const t = ds.table(e);
      for (let i = 0; i < t.length; i++) {
        const b = 100 * e + i;
        expect([...t.state.subarray(i * 3, i * 3 + 3)]).toEqual([b, 0 - b + 0, i / 2]);
        expect([...t.action.subarray(i * 3, i * 3 + 3)]).toEqual([b + 0.25, -b + 0.5, i]);
      }
    }
    expect(ds.prompt(1, 3)).toBe('place the cube');
    expect(ds.prompt(2, 0)).toBe('pick the cube');
  });

  it('seeks each episode in the shared video by its from_timestamp', async () => {
    await ds.checkVideos();
    let g = 0;
    for (const e of [0, 1, 2]) {
      const f = await ds.frames(e, 'front', null);
      expect([f.count, f.width, f.height]).toEqual([ds.episode(e).length, 32, 24]);
      for (let t = 0; t < f.count; t++, g++) {
        const o = (t * 32 * 24 + 12 * 32 + 16) * 3;
        // Frame g was encoded as grey 20 + 12 g (h264 yuv420p: within a few levels).
        for (let c = 0; c < 3; c++) expect(Math.abs(f.data[o + c] - (20 + 12 * g))).toBeLessThanOrEqual(3);
      }
    }
    expect(g).toBe(16);
    const sq = await ds.frames(1, 'front', 16);
    // 32x24 -> 16x12 centred: rows 0..1 and 14..15 are black.
    const frame0 = sq.data.subarray(0, 16 * 16 * 3);
    expect(Math.max(...frame0.subarray(0, 2 * 48))).toBe(0);
    expect(Math.max(...frame0.subarray(14 * 48))).toBe(0);
    expect(Math.abs(frame0[8 * 48 + 24] - 80)).toBeLessThanOrEqual(3);
    // The square frames are the full-size ones through protocol/resize.ts, byte for byte (MODEL.md D12).
    const full = await ds.frames(1, 'front', null);
    for (let t = 0; t < sq.count; t++) {
      const one = resizeWithPadSync({ data: full.data.subarray(t * 32 * 24 * 3, (t + 1) * 32 * 24 * 3), height: 24, width: 32 }, 16);
      expect(Buffer.from(sq.data.subarray(t * 16 * 16 * 3, (t + 1) * 16 * 16 * 3)).equals(Buffer.from(one.data)), `frame ${t}`).toBe(true);
    }
  });

  it('makes delta action chunks that cross no episode boundary', async () => {
    const d = await makeDatum(ds, 0, 3, { horizon: 4, imageSize: 16, actionSpace: 'delta' });
    // Episode 0 frames 3, 4, then padding with frame 4; minus state[3] = [3, -3, 1.5].
    expect([...d.actions]).toEqual([0.25, 0.5, 1.5, 1.25, -0.5, 2.5, 1.25, -0.5, 2.5, 1.25, -0.5, 2.5]);
    expect([...d.actionMask]).toEqual([1, 1, 0, 0]);
    expect([...d.state]).toEqual([3, -3, 1.5]);
    expect(d.prompt).toBe('pick the cube');
  });

  it('names a corrupt video with ffmpeg\'s words, and a missing one', async () => {
    const dir = copyDataset(V30);
    const rel = 'videos/observation.images.front/chunk-000/file-001.mp4';
    fs.rmSync(path.join(dir, rel));
    fs.writeFileSync(path.join(dir, rel), Buffer.alloc(4000, 0x5a));
    const copy = await openDataset(dir);
    const probe = await datasetError(copy.checkVideos());
    expect(probe.code).toBe('bad_video');
    expect(probe.message).toContain(rel);
    const err = await datasetError(copy.frames(2, 'front', 16));
    expect(err.code).toBe('bad_video');
    expect(err.message).toContain(rel);
    expect(err.message).toContain('ffmpeg said:');
    expect(err.message).toContain('Invalid data found when processing input');
    // The other file still decodes.
    expect((await copy.frames(1, 'front', 16)).count).toBe(7);
    fs.rmSync(path.join(dir, rel));
    const missing = await datasetError(openDataset(dir));
    expect(missing.code).toBe('missing_file');
    expect(missing.message).toBe(`video file ${rel} (episode 2) is missing`);
  });

  it('names the file when info.json gives a camera size that cannot be decoded into (no bare RangeError)', async () => {
    const rel = 'videos/observation.images.front/chunk-000/file-000.mp4';
    for (const [shape, size] of [[[1e6, 1e6, 3], 16], [[1e6, 1e6, 3], null], [[24.5, 33, 3], 16]] as const) {
      const dir = copyDataset(V30);
      const infoFile = path.join(dir, 'meta/info.json');
      const info = JSON.parse(fs.readFileSync(infoFile, 'utf8'));
      info.features['observation.images.front'].shape = shape;
      fs.writeFileSync(infoFile, JSON.stringify(info));
      const err = await datasetError((await openDataset(dir)).frames(1, 'front', size));
      expect(err.code, `${shape} at ${size}`).toBe('bad_metadata');
      expect(err.message).toContain(`video file ${rel}: info.json's shape gives ${shape[1]}x${shape[0]} frames`);
    }
  });

  it('decodes a video tagged with a rotation at its coded size, the size info.json gives', async () => {
    const dir = copyDataset(V30);
    const rel = 'videos/observation.images.front/chunk-000/file-000.mp4';
    fs.rmSync(path.join(dir, rel));
    // The same stream, only tagged: a phone-recorded camera; LeRobot writes the coded size in info.json and PyAV ignores the tag.
    execFileSync(ffmpegPath(), ['-nostdin', '-loglevel', 'error', '-i', path.join(V30, rel), '-c', 'copy', '-metadata:s:v:0', 'rotate=90', path.join(dir, rel)]);
    const copy = await openDataset(dir);
    const plain = await openDataset(V30);
    for (const size of [16, null]) {
      const [got, want] = [await copy.frames(1, 'front', size), await plain.frames(1, 'front', size)];
      expect([got.width, got.height]).toEqual([want.width, want.height]);
      expect(Buffer.from(got.data).equals(Buffer.from(want.data)), `size ${size}`).toBe(true);
    }
  });

  it('decodes square frames at the real size when info.json\'s shape is stale, and never misreads a swapped one', async () => {
    // A chatty ffmpeg (20 kB of warnings after its header, as a damaged stream gives): the header with the output size
    // must still be read, or a shape of the same byte count (h and w swapped) is cut into frames of the wrong width.
    const dir = copyDataset(V30);
    const chatty = path.join(dir, 'chatty-ffmpeg.sh');
    fs.writeFileSync(chatty, `#!/bin/sh\n"${ffmpegPath()}" "$@"\nrc=$?\nfor i in $(seq 400); do echo "[h264 @ 0x1] warning $i: concealing errors in a damaged stream, ok" >&2; done\nexit $rc\n`, { mode: 0o755 });
    const plain = await openDataset(V30);
    const infoFile = path.join(dir, 'meta/info.json');
    const info = JSON.parse(fs.readFileSync(infoFile, 'utf8'));
    for (const shape of [[24, 32, 3], [32, 24, 3], [48, 64, 3]]) {
      info.features['observation.images.front'].shape = shape;
      fs.writeFileSync(infoFile, JSON.stringify(info));
      const copy = await openDataset(dir, { ffmpeg: chatty });
      const [got, want] = [await copy.frames(1, 'front', 16), await plain.frames(1, 'front', 16)];
      expect(Buffer.from(got.data).equals(Buffer.from(want.data)), `info.json shape ${shape} at 16`).toBe(true);
      if (shape[0] === 24) continue;
      const err = await datasetError(copy.frames(1, 'front', null));
      expect(err.message).toBe(`video file videos/observation.images.front/chunk-000/file-000.mp4: ffmpeg produced 32x24 frames; info.json's shape gives ${shape[1]}x${shape[0]}`);
    }
  });

  it('rejects a v3.0 data file whose rows disagree with the episodes metadata', async () => {
    const dir = copyDataset(V30);
    // file-001 (episode 2, 4 frames) replaced by file-000 (12 rows).
    fs.copyFileSync(path.join(V30, 'data/chunk-000/file-000.parquet'), path.join(dir, 'data/chunk-000/file-001.parquet'));
    const err = await datasetError(openDataset(dir));
    expect(err.code).toBe('row_count_mismatch');
    expect(err.message).toBe('data/chunk-000/file-001.parquet has 12 rows, but meta/episodes gives its episodes 4 frames');
  });
});

describe('image-feature fixture (v2.1, PNG and JPEG in parquet)', () => {
  let ds: Dataset;

  it('decodes PNG frames exactly and JPEG frames closely', async () => {
    ds = await openDataset(IMAGE);
    expect(ds.meta.cameras.map((c) => [c.name, c.kind, c.width, c.height])).toEqual([['top', 'image', 8, 6], ['wrist', 'image', 8, 6]]);
    for (const e of [0, 1]) {
      const top = await ds.frames(e, 'top', null);
      const wrist = await ds.frames(e, 'observation.images.wrist', null);
      expect([top.count, top.width, top.height]).toEqual([e === 0 ? 3 : 4, 8, 6]);
      expect(wrist.count).toBe(top.count);
      for (let t = 0; t < top.count; t++) {
        for (let y = 0; y < 6; y++) {
          for (let x = 0; x < 8; x++) {
            const o = ((t * 6 + y) * 8 + x) * 3;
            expect([...top.data.subarray(o, o + 3)]).toEqual([50 * e + 10 * t, 20 * x, 30 * y]);
            const want = [40 + 60 * t, 100, 200 - 50 * e];
            for (let c = 0; c < 3; c++) expect(Math.abs(wrist.data[o + c] - want[c])).toBeLessThanOrEqual(4);
          }
        }
      }
    }
  });

  it('pads image features to a square like the video path', async () => {
    const f = await ds.frames(1, 'top', 16);
    expect([f.count, f.width, f.height]).toEqual([4, 16, 16]);
    const frame = f.data.subarray(0, 16 * 16 * 3);
    // 8x6 -> 16x12 centred: rows 0..1 and 14..15 black; green grows along x inside.
    expect(Math.max(...frame.subarray(0, 2 * 48))).toBe(0);
    expect(Math.max(...frame.subarray(14 * 48))).toBe(0);
    expect(frame[8 * 48 + 15 * 3 + 1]).toBeGreaterThan(frame[8 * 48 + 1]);
    const full = await ds.frames(1, 'top', null);
    for (let t = 0; t < f.count; t++) {
      const one = resizeWithPadSync({ data: full.data.subarray(t * 8 * 6 * 3, (t + 1) * 8 * 6 * 3), height: 6, width: 8 }, 16);
      expect(Buffer.from(f.data.subarray(t * 16 * 16 * 3, (t + 1) * 16 * 16 * 3)).equals(Buffer.from(one.data)), `frame ${t}`).toBe(true);
    }
  });

  it('subtracts the state only on dims shared by name, and defaults to absolute', async () => {
    expect(defaultActionSpace(ds.meta)).toBe('absolute');
    expect(deltaPairs(ds.meta)).toEqual([[0, 0], [1, 1]]);
    const d = await makeDatum(ds, 1, 2, { horizon: 3, cameras: ['top'], imageSize: 16, actionSpace: 'delta' });
    // state[2] = [1.2, 4]; action[2] = [2.2, 3, 0], action[3] = [2.3, 5, 1] (padding repeats it).
    const f = Math.fround;
    const s = [f(1.2), 4];
    const a2 = [f(2.2), 3, 0];
    const a3 = [f(2.3), 5, 1];
    const want = [a2, a3, a3].flatMap((r) => [f(r[0] - s[0]), f(r[1] - s[1]), r[2]]);
    expect([...d.actions]).toEqual(want);
    expect([...d.actionMask]).toEqual([1, 1, 0]);
    expect(Object.keys(d.images)).toEqual(['top']);
    expect(d.prompt).toBe('unstack');
    expect(() => pairsFor({ stateNames: ['p'], actionNames: ['q'] }, 'delta')).toThrow(/shared names/);
  });

  it('reports unknown cameras and episodes by name', async () => {
    const cam = await datasetError(ds.frames(0, 'cam_high', 16));
    expect(cam.code).toBe('unknown_camera');
    expect(cam.message).toBe('camera "cam_high" is not in the dataset; its cameras are top, wrist');
    const ep = await datasetError(ds.frames(5, 'top', 16));
    expect(ep.code).toBe('unknown_episode');
    const text = describeDataset(ds.meta);
    expect(text).toContain('top              image 8x6 (observation.images.top)');
    expect(text).toContain('action space default: absolute');
  });
});

describe('splitEpisodes', () => {
  it('is deterministic, disjoint, and holds out 10% (at least one)', () => {
    const all = Array.from({ length: 15 }, (_, i) => i);
    const a = splitEpisodes(all, { seed: 3 });
    expect(a).toEqual(splitEpisodes([...all].reverse(), { seed: 3 }));
    expect(a.heldOut.length).toBe(2);
    expect([...a.train, ...a.heldOut].sort((x, y) => x - y)).toEqual(all);
    const seeds = new Set(Array.from({ length: 8 }, (_, s) => splitEpisodes(all, { seed: s }).heldOut.join(',')));
    expect(seeds.size).toBeGreaterThan(1);
    expect(splitEpisodes([4, 9], {}).heldOut.length).toBe(1);
    expect(splitEpisodes([4], {})).toEqual({ train: [4], heldOut: [] });
    expect(splitEpisodes(Array.from({ length: 100 }, (_, i) => i), { evalFraction: 0.25 }).heldOut.length).toBe(25);
    expect(() => splitEpisodes(all, { evalFraction: 1 })).toThrow(DatasetError);
  });
});

describe('ByteLruCache', () => {
  it('evicts the least recently used entries past its byte budget and shares computations', async () => {
    const cache = new ByteLruCache<{ data: Uint8Array }>(300, 1);
    let computed = 0;
    const make = (n: number) => async () => {
      computed++;
      return { data: new Uint8Array(n) };
    };
    const [x, y] = await Promise.all([cache.get('a', make(100)), cache.get('a', make(100))]);
    expect(x).toBe(y);
    expect(computed).toBe(1);
    await cache.get('b', make(100));
    await cache.get('c', make(100));
    await cache.get('a', make(100)); // a becomes most recent
    await cache.get('d', make(100)); // evicts b
    expect([cache.has('a'), cache.has('b'), cache.has('c'), cache.has('d')]).toEqual([true, false, true, true]);
    expect(cache.usedBytes).toBe(300);
    await cache.get('huge', make(1000)); // larger than the budget: returned, not kept
    expect(cache.has('huge')).toBe(false);
    expect(cache.usedBytes).toBe(300);
  });
});
