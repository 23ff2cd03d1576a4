/**
 * protocol/resize.ts, the one resize every frame goes through (MODEL.md D12): against LeRobot's
 * pre-processing as PyTorch computes it (scripts/make_resize_vectors.py), and against the Python
 * package's `vela.frames.resize_with_pad` byte for byte on real G1 frames and odd shapes (and its
 * `as_rgb` against the server's reading of every RAW layout), so that a frame the
 * package resized before sending and one the server resized give the model the same pixels.
 */
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { decodeFrame, decodeFrameResized, encodeFrame } from '../protocol/frames.ts';
import type { Frame } from '../protocol/frames.ts';
import { bilinearValues, padGeometry, resizeWithPadSync } from '../protocol/resize.ts';
import { decodeVideo } from '../server/datasets/video.ts';
import { U32 } from './helpers/float32.ts';
import { missing, pythonEnv } from './helpers/requires.ts';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const VEC = path.join(ROOT, 'test/vectors/resize');
const manifest = JSON.parse(fs.readFileSync(path.join(VEC, 'manifest.json'), 'utf8')) as {
  cases: { name: string; height: number; width: number; size: number; rh: number; rw: number; top: number; left: number }[];
};
const input = (name: string) => new Uint8Array(fs.readFileSync(path.join(VEC, `${name}.in.raw`)));

describe('resizeWithPad (protocol/resize.ts)', () => {
  it("equals LeRobot's resize_with_pad_torch (PyTorch, float32) to float32 rounding, with its geometry", () => {
    for (const c of manifest.cases) {
      const frame: Frame = { data: input(c.name), height: c.height, width: c.width };
      expect(padGeometry(c.width, c.height, c.size), c.name).toEqual({ rw: c.rw, rh: c.rh, left: c.left, top: c.top });
      const buf = fs.readFileSync(path.join(VEC, `${c.name}.out.f32`));
      const ref = new Float32Array(buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength));
      const ours = bilinearValues(frame, c.rh, c.rw);
      expect(ours.length).toBe(ref.length);
      // PyTorch computes the same formula in float32 on x / 255: the scale in / out and the source
      // coordinate (i + 0.5) * scale - 0.5 carry ~3 u of the coordinate (up to H or W), which moves a
      // weight, and so a value in [0, 1], by 3 u H per axis; the input's rounding and the seven
      // operations of the interpolation add at most 8 u. An antialiased or align_corners=True
      // resize is off by hundredths to tenths.
      const bound = (3 * (c.height + c.width) + 10) * U32;
      let worst = 0;
      for (let i = 0; i < ref.length; i++) worst = Math.max(worst, Math.abs(ours[i]! / 255 - ref[i]!));
      expect(worst, c.name).toBeLessThanOrEqual(bound);
      // The padded uint8 frame: the values rounded half to even, black around them.
      const out = resizeWithPadSync(frame, c.size).data;
      for (let y = 0; y < c.size; y++) {
        for (let x = 0; x < c.size; x++) {
          const inside = y >= c.top && y < c.top + c.rh && x >= c.left && x < c.left + c.rw;
          for (let k = 0; k < 3; k++) {
            const v = inside ? ours[((y - c.top) * c.rw + (x - c.left)) * 3 + k]! : 0;
            const want = Math.abs(v - Math.round(v)) === 0.5 ? 2 * Math.round(v / 2) : Math.round(v);
            if (out[(y * c.size + x) * 3 + k] !== want) expect.fail(`${c.name} (${y}, ${x}, ${k}): ${out[(y * c.size + x) * 3 + k]} for ${v}`);
          }
        }
      }
    }
  });

  it('rounds halves to even, as torch.round does', () => {
    // 1 x 2 -> 1 x 1 (size 1 keeps the aspect: the picture is 1 x 0.5 -> 1 pixel): the mean of two values.
    const mean = (a: number, b: number) => resizeWithPadSync({ data: new Uint8Array([a, a, a, b, b, b]), height: 1, width: 2 }, 1).data[0];
    expect([mean(2, 3), mean(3, 4), mean(0, 1), mean(254, 255)]).toEqual([2, 4, 0, 254]);
  });

  it('returns a frame of the size as a copy, and refuses a bad size or buffer', () => {
    const data = new Uint8Array(4 * 4 * 3).map((_, i) => i);
    const f = resizeWithPadSync({ data, height: 4, width: 4 }, 4);
    expect(Buffer.from(f.data).equals(Buffer.from(data))).toBe(true);
    expect(f.data).not.toBe(data);
    expect(() => resizeWithPadSync({ data, height: 4, width: 4 }, 0)).toThrow(/positive integer/);
    expect(() => resizeWithPadSync({ data: data.subarray(1), height: 4, width: 4 }, 2)).toThrow(/4x4x3 needs 48/);
  });

  it('gives the same pixels whichever codec carried the frame (decode, then this resize)', async () => {
    const c = manifest.cases[0]!;
    const frame = { data: input(c.name), height: c.height, width: c.width };
    const want = Buffer.from(resizeWithPadSync(frame, c.size).data);
    for (const codec of ['RAW', 'LOSSLESS', 'PNG']) {
      const got = await decodeFrameResized(codec, (await encodeFrame(codec, frame)) as any, c.size);
      expect(Buffer.from(got.data).equals(want), codec).toBe(true);
    }
    // JPEG is lossy: its decoded pixels, resized by the same rule.
    const jpeg = (await encodeFrame('JPEG', frame)) as Uint8Array;
    const viaJpeg = await decodeFrameResized('JPEG', jpeg, c.size);
    expect(Buffer.from(viaJpeg.data).equals(Buffer.from(resizeWithPadSync(await decodeFrame('JPEG', jpeg), c.size).data))).toBe(true);
  });
});

const env = pythonEnv();

describe.skipIf(missing("the Python package's resize", env.reason))("the Python package's resize_with_pad", () => {
  it('equals the server resize byte for byte on real G1 frames (landscape, portrait, 96, 224, 32)', async () => {
    const g1 = path.join(ROOT, 'datasets/g1_pick_bottle_sample');
    const video = await decodeVideo({
      root: g1, file: 'videos/chunk-000/observation.images.cam_high/episode_000001.mp4', fromS: 0, fps: 30, frames: 2,
      wholeFile: false, size: null, sourceWidth: 640, sourceHeight: 480,
    });
    const frames: Frame[] = [0, 1].map((t) => ({ data: video.data.subarray(t * 640 * 480 * 3, (t + 1) * 640 * 480 * 3), height: 480, width: 640 }));
    // The second frame turned on its side: a portrait camera, bands left and right.
    const tall = new Uint8Array(640 * 480 * 3);
    for (let y = 0; y < 480; y++) for (let x = 0; x < 640; x++) tall.set(frames[1]!.data.subarray((y * 640 + x) * 3, (y * 640 + x) * 3 + 3), (x * 480 + y) * 3);
    frames[1] = { data: tall, height: 640, width: 480 };
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-resize-'));
    try {
      const cases: [number, number][] = [[0, 96], [0, 224], [1, 96], [1, 32]];
      frames.forEach((f, i) => fs.writeFileSync(path.join(dir, `${i}.raw`), f.data));
      const script = [
        'import sys, numpy as np',
        'from vela.frames import resize_with_pad',
        `shapes = ${JSON.stringify(frames.map((f) => [f.height, f.width, 3]))}`,
        `for i, size in ${JSON.stringify(cases)}:`,
        '    img = np.fromfile(f"{i}.raw", dtype=np.uint8).reshape(shapes[i])',
        '    resize_with_pad(img, size).tofile(f"{i}_{size}.out")',
        '# The sessions shrink a batch\'s frames of one shape together (encode_data): the same bytes as one by one.',
        'from vela.frames import encode_data',
        'imgs = [np.fromfile(f"{i}.raw", dtype=np.uint8).reshape(shapes[i]) for i in range(len(shapes))]',
        'data = [{"observation": {"image": {"a": imgs[k % 2], "b": imgs[(k + 1) % 2]}}} for k in range(3)]',
        'for d, e in zip(data, encode_data(data, "RAW", 96)):',
        '    for cam in ("a", "b"):',
        '        assert np.array_equal(e["observation"]["image"][cam], resize_with_pad(d["observation"]["image"][cam], 96)), cam',
      ].join('\n');
      fs.writeFileSync(path.join(dir, 'resize.py'), script);
      await promisify(execFile)(env.python!, ['resize.py'], { cwd: dir, env: { ...process.env, PYTHONPATH: path.join(ROOT, 'clients/python/src') }, timeout: 120_000 });
      for (const [i, size] of cases) {
        const ours = Buffer.from(resizeWithPadSync(frames[i]!, size).data);
        const theirs = fs.readFileSync(path.join(dir, `${i}_${size}.out`));
        expect(theirs.length, `${i} -> ${size}`).toBe(size * size * 3);
        expect(theirs.equals(ours), `frame ${i} -> ${size}: the package's bytes differ from the server's`).toBe(true);
      }
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('equals the server on odd shapes, upscaling and numpy views, and reads every RAW layout as the server does; no plan of a large size stays cached', async () => {
    // [h, w, size]: a line each way, a 1x1 blown up, 9 -> 7 (int(9 / (9 / 7)) is 6: a black column, as LeRobot's),
    // upscaling, and sizes 1 and 2.
    const odd: [number, number, number][] = [[1, 4000, 224], [4000, 1, 96], [1, 1, 7], [5, 9, 7], [13, 17, 500], [3, 5, 1], [2, 3, 2]];
    // RAW layouts the server reads (protocol/frames.ts decodeRaw), shrunk by the package through vela.frames.as_rgb.
    const layouts = [[120, 160], [3, 120, 160], [1, 120, 160], [4, 120, 160], [120, 160, 1], [120, 160, 4], [3, 120, 4], [4, 120, 3]];
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-resize-'));
    try {
      const script = [
        'import numpy as np',
        'from vela.frames import as_rgb, resize_with_pad',
        'rng = np.random.default_rng(7)',
        `for k, (h, w, size) in enumerate(${JSON.stringify(odd)}):`,
        '    img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)',
        '    img.tofile(f"odd{k}.raw")',
        '    # A negative-stride, Fortran-order, read-only view of the same pixels.',
        '    view = np.asfortranarray(img[:, ::-1])[:, ::-1]',
        '    view.setflags(write=False)',
        '    resize_with_pad(view, size).tofile(f"odd{k}.out")',
        `for k, shape in enumerate(${JSON.stringify(layouts)}):`,
        '    img = rng.integers(0, 256, shape, dtype=np.uint8)',
        '    img.tofile(f"lay{k}.raw")',
        '    resize_with_pad(as_rgb(img), 32).tofile(f"lay{k}.out")',
        '# Plans are cached up to 256 x 256 only: an upscale to 1000 kept 190 MB alive (8 of 2048: 6.4 GB).',
        'from vela import frames',
        'frames._cached_plan.cache_clear()',
        'resize_with_pad(np.zeros((10, 10, 3), np.uint8), 1000)',
        'assert frames._cached_plan.cache_info().currsize == 0, frames._cached_plan.cache_info()',
        'resize_with_pad(np.zeros((11, 10, 3), np.uint8), 224)',
        'assert frames._cached_plan.cache_info().currsize == 1, frames._cached_plan.cache_info()',
      ].join('\n');
      fs.writeFileSync(path.join(dir, 'odd.py'), script);
      await promisify(execFile)(env.python!, ['odd.py'], { cwd: dir, env: { ...process.env, PYTHONPATH: path.join(ROOT, 'clients/python/src') }, timeout: 120_000 });
      for (const [k, [h, w, size]] of odd.entries()) {
        const ours = Buffer.from(resizeWithPadSync({ data: new Uint8Array(fs.readFileSync(path.join(dir, `odd${k}.raw`))), height: h, width: w }, size).data);
        expect(fs.readFileSync(path.join(dir, `odd${k}.out`)).equals(ours), `${h}x${w} -> ${size}`).toBe(true);
      }
      for (const [k, shape] of layouts.entries()) {
        const data = new Uint8Array(fs.readFileSync(path.join(dir, `lay${k}.raw`)));
        const ours = Buffer.from((await decodeFrameResized('RAW', { dtype: '|u1', shape, data }, 32)).data);
        expect(fs.readFileSync(path.join(dir, `lay${k}.out`)).equals(ours), `[${shape}]`).toBe(true);
      }
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
