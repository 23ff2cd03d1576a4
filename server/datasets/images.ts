/**
 * Frames of `image` features: PNG/JPEG bytes stored in the data parquet as a struct
 * `{bytes, path}` (LeRobot's `datasets.Image`), decoded with sharp. A square size is made with
 * protocol/resize.ts, as the video path and the session ops make it (MODEL.md D12).
 */
import fs from 'node:fs';
import path from 'node:path';
import sharp from 'sharp';
import { resizeWithPadSync } from '../../protocol/resize.ts';
import { DatasetError } from './errors.ts';
import { readRows } from './parquet.ts';
import type { ParquetHandle } from './parquet.ts';
import type { EpisodeFrames, EpisodeMeta } from './types.ts';

const PARALLEL_DECODES = 8;

function imageBytes(root: string, v: unknown, where: string): Uint8Array {
  const cell = v as { bytes?: unknown; path?: unknown } | null;
  if (cell && cell.bytes instanceof Uint8Array && cell.bytes.length > 0) return cell.bytes;
  if (cell && typeof cell.path === 'string' && cell.path) {
    const abs = path.resolve(root, cell.path);
    if (!fs.existsSync(abs)) throw new DatasetError('missing_file', `${where}: image file ${cell.path} is missing`);
    return fs.readFileSync(abs);
  }
  throw new DatasetError('corrupt_file', `${where}: the image cell has neither bytes nor a path`);
}

async function decodeOne(bytes: Uint8Array, size: number | null, where: string): Promise<{ data: Uint8Array; width: number; height: number }> {
  try {
    const { data, info } = await sharp(bytes).removeAlpha().toColourspace('srgb').raw().toBuffer({ resolveWithObject: true });
    if (info.channels !== 3) throw new Error(`decoded to ${info.channels} channels`);
    if (size === null) return { data, width: info.width, height: info.height };
    const small = resizeWithPadSync({ data, width: info.width, height: info.height }, size);
    return { data: small.data, width: size, height: size };
  } catch (err) {
    throw new DatasetError('corrupt_file', `${where}: image bytes do not decode (${(err as Error).message})`);
  }
}

/**
 * Decodes every frame of one episode's image feature.
 * @returns [l, h, w, 3] uint8 (h = w = size when size is given).
 * @throws DatasetError `corrupt_file` naming the parquet and the frame; `row_count_mismatch`
 *   when frames of one episode differ in size (full-size decode only).
 */
export async function decodeImageFeature(root: string, h: ParquetHandle, ep: EpisodeMeta, key: string, size: number | null): Promise<EpisodeFrames> {
  if (!h.columns.includes(key)) throw new DatasetError('bad_metadata', `${h.rel} lacks the image column ${key}`);
  const rows = await readRows(h, [key], ep.rowStart, ep.rowStart + ep.length, false);
  let out: EpisodeFrames | null = null;
  for (let start = 0; start < rows.length; start += PARALLEL_DECODES) {
    const batch = rows.slice(start, start + PARALLEL_DECODES);
    const decoded = await Promise.all(batch.map((r, j) => {
      const where = `${h.rel} episode ${ep.index} frame ${start + j} ${key}`;
      return decodeOne(imageBytes(root, r[key], where), size, where);
    }));
    for (let j = 0; j < decoded.length; j++) {
      const d = decoded[j];
      out ??= { count: ep.length, width: d.width, height: d.height, data: new Uint8Array(ep.length * d.width * d.height * 3) };
      if (d.width !== out.width || d.height !== out.height) {
        throw new DatasetError('row_count_mismatch', `${h.rel} episode ${ep.index} frame ${start + j} ${key} is ${d.width}x${d.height}; frame 0 is ${out.width}x${out.height}`);
      }
      out.data.set(d.data, (start + j) * d.data.length);
    }
  }
  if (!out) throw new DatasetError('row_count_mismatch', `${h.rel} has no rows for episode ${ep.index}`);
  return out;
}
