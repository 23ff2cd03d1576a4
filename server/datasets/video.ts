/**
 * Video frames through an ffmpeg child process (never blocking the event loop): the static binary
 * of `@ffmpeg-installer/ffmpeg` unless `VELA_FFMPEG` or the caller names another. ffmpeg decodes
 * AV1 (libaom / dav1d) and h264 and writes rawvideo rgb24; a square size is produced with
 * MODEL.md D12's aspect-preserving scale and centred black padding.
 */
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import path from 'node:path';
import { DatasetError } from './errors.ts';
import type { EpisodeFrames } from './types.ts';

const STDERR_TAIL_BYTES = 4096;

/** The ffmpeg binary: `configured`, else `$VELA_FFMPEG`, else `@ffmpeg-installer/ffmpeg`'s path. */
export function ffmpegPath(configured?: string): string {
  if (configured) return configured;
  if (process.env.VELA_FFMPEG) return process.env.VELA_FFMPEG;
  const installer = createRequire(import.meta.url)('@ffmpeg-installer/ffmpeg') as { path: string };
  return installer.path;
}

/** The filter of MODEL.md D12 for a square `size`; rgb24 before the pad keeps the centring exact. */
export function squareFilter(size: number): string {
  return `scale=${size}:${size}:force_original_aspect_ratio=decrease,format=rgb24,pad=${size}:${size}:(ow-iw)/2:(oh-ih)/2:black`;
}

export interface DecodeRequest {
  /** Dataset root and the video's path relative to it (named in errors). */
  root: string;
  file: string;
  /** Seconds into the file where the episode starts. */
  fromS: number;
  fps: number;
  /** Frames the episode has (the metadata's length): exactly this many must come out. */
  frames: number;
  /** True when the file holds only this episode, so one frame more than `frames` is an error. */
  wholeFile: boolean;
  /** Square output size, or null for the source size (`sourceWidth` x `sourceHeight`). */
  size: number | null;
  sourceWidth: number;
  sourceHeight: number;
  ffmpeg?: string;
}

/** The output stream size that ffmpeg reports ("Stream #0:0: Video: rawvideo ..., 640x480"). */
function outputSize(stderr: string): { width: number; height: number } | null {
  const out = stderr.slice(stderr.indexOf('Output #0'));
  const m = /Video: rawvideo[^\n]*?, (\d+)x(\d+)/.exec(out);
  return m ? { width: Number(m[1]), height: Number(m[2]) } : null;
}

/**
 * Decodes `frames` frames starting at `fromS` to RGB.
 * @returns [frames, h, w, 3] uint8.
 * @throws DatasetError `bad_video` naming the file with ffmpeg's stderr tail when ffmpeg fails or
 *   the frame count differs from the episode length; `bad_argument` for a full-size decode of a
 *   camera whose size the metadata does not give.
 */
export function decodeVideo(req: DecodeRequest): Promise<EpisodeFrames> {
  const width = req.size ?? req.sourceWidth;
  const height = req.size ?? req.sourceHeight;
  if (!(width > 0 && height > 0)) {
    throw new DatasetError('bad_argument', `video ${req.file}: the source size is unknown (info.json has no shape); ask for a square size`);
  }
  const frameBytes = width * height * 3;
  const args = ['-nostdin', '-hide_banner', '-nostats', '-loglevel', 'info'];
  // Half a frame before the start, so a timestamp rounded a hair late still keeps its frame.
  if (req.fromS > 0) args.push('-ss', Math.max(0, req.fromS - 0.5 / req.fps).toFixed(6));
  args.push('-i', path.join(req.root, req.file), '-map', '0:v:0', '-an', '-sn', '-vsync', 'passthrough');
  args.push('-frames:v', String(req.wholeFile ? req.frames + 1 : req.frames));
  if (req.size !== null) args.push('-vf', squareFilter(req.size));
  args.push('-pix_fmt', 'rgb24', '-f', 'rawvideo', 'pipe:1');

  return new Promise((resolve, reject) => {
    const child = spawn(ffmpegPath(req.ffmpeg), args, { stdio: ['ignore', 'pipe', 'pipe'] });
    const data = new Uint8Array(req.frames * frameBytes);
    let written = 0;
    let extra = 0;
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => {
      const n = Math.min(chunk.length, data.length - written);
      data.set(chunk.subarray(0, n), written);
      written += n;
      extra += chunk.length - n;
    });
    child.stderr.on('data', (chunk: Buffer) => {
      stderr += chunk.toString('utf8');
      if (stderr.length > 4 * STDERR_TAIL_BYTES) stderr = stderr.slice(-2 * STDERR_TAIL_BYTES);
    });
    const fail = (msg: string, withTail = true) => {
      const tail = withTail ? stderr.trim().split('\n').slice(-6).join('\n').slice(-STDERR_TAIL_BYTES) : '';
      reject(new DatasetError('bad_video', `video file ${req.file}: ${msg}${tail ? `; ffmpeg said: ${tail}` : ''}`));
    };
    child.on('error', (err) => fail(`could not run ffmpeg (${err.message})`));
    child.on('close', (code, signal) => {
      if (code !== 0) return fail(`ffmpeg exited with ${code ?? signal}`);
      const reported = outputSize(stderr);
      if (reported && (reported.width !== width || reported.height !== height)) {
        return fail(`ffmpeg produced ${reported.width}x${reported.height} frames; expected ${width}x${height}`, false);
      }
      const decoded = written / frameBytes + extra / frameBytes;
      if (written !== data.length || extra > 0) {
        const what = extra > 0 ? `more than ${req.frames}` : String(Math.floor(decoded));
        const at = req.fromS > 0 ? ` from ${req.fromS}s` : '';
        return fail(`decoded ${what} frames${at}, but the episode has ${req.frames}`, false);
      }
      resolve({ count: req.frames, height, width, data });
    });
  });
}

/**
 * Opens a video and decodes its first frame (about 0.2 s for a G1 AV1 file): catches missing
 * containers, truncated headers and undecodable streams before a job starts, without decoding
 * the whole file.
 * @throws DatasetError `bad_video` naming the file with ffmpeg's stderr tail.
 */
export function probeVideo(root: string, file: string, ffmpeg?: string): Promise<void> {
  const args = ['-nostdin', '-hide_banner', '-loglevel', 'error', '-i', path.join(root, file), '-map', '0:v:0', '-frames:v', '1', '-f', 'null', '-'];
  return new Promise((resolve, reject) => {
    const child = spawn(ffmpegPath(ffmpeg), args, { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (chunk: Buffer) => {
      stderr = (stderr + chunk.toString('utf8')).slice(-STDERR_TAIL_BYTES);
    });
    const fail = (msg: string) => {
      const tail = stderr.trim().split('\n').slice(-6).join('\n');
      reject(new DatasetError('bad_video', `video file ${file}: ${msg}${tail ? `; ffmpeg said: ${tail}` : ''}`));
    };
    child.on('error', (err) => fail(`could not run ffmpeg (${err.message})`));
    child.on('close', (code, signal) => (code === 0 ? resolve() : fail(`ffmpeg exited with ${code ?? signal}`)));
  });
}
