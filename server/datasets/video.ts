/**
 * Video frames through an ffmpeg child process (never blocking the event loop): the static binary
 * of `@ffmpeg-installer/ffmpeg` unless `VELA_FFMPEG` or the caller names another. ffmpeg decodes
 * AV1 (libaom / dav1d) and h264 and writes rawvideo rgb24 at the source size; a square size is
 * then made frame by frame with protocol/resize.ts (MODEL.md D12), the resize that the session
 * ops, the policy server and the Python package use, so a job trains on the pixels its policy serves.
 */
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import path from 'node:path';
import { resizeWithPadSync } from '../../protocol/resize.ts';
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
  /** Square output size, or null for the source size. */
  size: number | null;
  /** The source size from info.json; 0 when it does not say (then ffmpeg is asked for it). */
  sourceWidth: number;
  sourceHeight: number;
  ffmpeg?: string;
}

/**
 * The output stream size that ffmpeg reports ("Stream #0:0: Video: rawvideo ..., 640x480"), once
 * the line has come whole (a character after the height, so "640x4" of a cut chunk is not read).
 */
function outputSize(stderr: string): { width: number; height: number } | null {
  const at = stderr.indexOf('Output #0');
  if (at < 0) return null;
  const m = /Video: rawvideo[^\n]*?, (\d+)x(\d+)(?=\D)/.exec(stderr.slice(at));
  return m ? { width: Number(m[1]), height: Number(m[2]) } : null;
}

/** ffmpeg's frames are not the size they were read at; `reported` is theirs. */
class SizeMismatch extends DatasetError {
  constructor(message: string, readonly reported: { width: number; height: number }) {
    super('bad_video', message);
  }
}

/**
 * The first video stream's size as ffmpeg reports it when opening the file (no frame decoded).
 * @throws DatasetError `bad_video` when ffmpeg cannot open the file or names no size.
 */
export function videoSize(root: string, file: string, ffmpeg?: string): Promise<{ width: number; height: number }> {
  return new Promise((resolve, reject) => {
    // No output named: ffmpeg prints the input's streams and exits 1, having decoded nothing.
    const child = spawn(ffmpegPath(ffmpeg), ['-nostdin', '-hide_banner', '-i', path.join(root, file)], { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (chunk: Buffer) => {
      stderr = (stderr + chunk.toString('utf8')).slice(-4 * STDERR_TAIL_BYTES);
    });
    child.on('error', (err) => reject(new DatasetError('bad_video', `video file ${file}: could not run ffmpeg (${err.message})`)));
    child.on('close', () => {
      const m = /Stream #0:\d+[^\n]*?: Video: [^\n]*?, (\d+)x(\d+)/.exec(stderr);
      if (m && Number(m[1]) > 0 && Number(m[2]) > 0) return resolve({ width: Number(m[1]), height: Number(m[2]) });
      const tail = stderr.trim().split('\n').slice(-6).join('\n');
      reject(new DatasetError('bad_video', `video file ${file}: ffmpeg names no video stream size${tail ? `; ffmpeg said: ${tail}` : ''}`));
    });
  });
}

/**
 * Decodes `frames` frames starting at `fromS` to RGB, resized to `size` (MODEL.md D12) when given.
 * @returns [frames, h, w, 3] uint8 (h = w = size when size is given).
 * A square size decodes at the size ffmpeg reports when info.json's shape turns out stale.
 * @throws DatasetError `bad_video` naming the file with ffmpeg's stderr tail when ffmpeg fails,
 *   its frames are not the source size (full size), or the frame count differs from the episode length;
 *   `bad_argument` for a full-size decode of a camera whose size the metadata does not give;
 *   `bad_metadata` for an info.json shape that is not whole pixels or too large to hold.
 */
export async function decodeVideo(req: DecodeRequest): Promise<EpisodeFrames> {
  const fromInfo = req.sourceWidth > 0 && req.sourceHeight > 0;
  if (!fromInfo && req.size === null) {
    throw new DatasetError('bad_argument', `video ${req.file}: the source size is unknown (info.json has no shape); ask for a square size`);
  }
  const source = fromInfo ? { width: req.sourceWidth, height: req.sourceHeight } : await videoSize(req.root, req.file, req.ffmpeg);
  try {
    return await decodeAt(req, source, fromInfo ? "info.json's shape gives" : 'ffmpeg reports');
  } catch (err) {
    // A square size needs no size from info.json (ffmpeg's scale filter, before the resize moved
    // here, never read it): a stale shape, a video re-encoded at another size, decodes again at
    // the size ffmpeg reports rather than failing a dataset that trained before.
    if (err instanceof SizeMismatch && fromInfo && req.size !== null) return decodeAt(req, err.reported, 'ffmpeg reports');
    throw err;
  }
}

async function decodeAt(req: DecodeRequest, source: { width: number; height: number }, said: string): Promise<EpisodeFrames> {
  if (!(Number.isInteger(source.width) && Number.isInteger(source.height))) {
    throw new DatasetError('bad_metadata', `video file ${req.file}: ${said} ${source.width}x${source.height} frames; a size is whole pixels`);
  }
  const width = req.size ?? source.width;
  const height = req.size ?? source.height;
  const sourceBytes = source.width * source.height * 3;
  const frameBytes = width * height * 3;
  // Allocated before ffmpeg starts: a size past what a typed array holds would otherwise throw a
  // bare RangeError and leave the child blocked on its full stdout pipe for good.
  let data: Uint8Array;
  let current: Uint8Array | null;
  try {
    data = new Uint8Array(req.frames * frameBytes);
    // One source frame at a time when resizing: a whole episode at full size is ~0.9 MB a frame.
    current = req.size === null ? null : new Uint8Array(sourceBytes);
  } catch (err) {
    throw new DatasetError(said.startsWith('info.json') ? 'bad_metadata' : 'bad_video',
      `video file ${req.file}: ${said} ${source.width}x${source.height} frames; ${req.size === null ? `${req.frames} of them` : 'one'} cannot be held in memory (${(err as Error).message})`);
  }
  const args = ['-nostdin', '-hide_banner', '-nostats', '-loglevel', 'info'];
  // Half a frame before the start, so a timestamp rounded a hair late still keeps its frame.
  if (req.fromS > 0) args.push('-ss', Math.max(0, req.fromS - 0.5 / req.fps).toFixed(6));
  // The coded size, as info.json and videoSize() give it (and LeRobot's PyAV decode): ffmpeg
  // would otherwise turn a rotation-tagged stream and refuse its frames as the wrong size.
  args.push('-noautorotate', '-i', path.join(req.root, req.file), '-map', '0:v:0', '-an', '-sn', '-vsync', 'passthrough');
  args.push('-frames:v', String(req.wholeFile ? req.frames + 1 : req.frames));
  args.push('-pix_fmt', 'rgb24', '-f', 'rawvideo', 'pipe:1');

  return new Promise((resolve, reject) => {
    const child = spawn(ffmpegPath(req.ffmpeg), args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let received = 0; // source bytes
    let stderr = '';
    // Read as it comes: the tail kept below loses ffmpeg's header on a chatty decode, and with it
    // the one check that a shape of the right byte count (h and w swapped) is not misread.
    let reported: { width: number; height: number } | null = null;
    child.stdout.on('data', (chunk: Buffer) => {
      for (let at = 0; at < chunk.length;) {
        const frame = Math.floor(received / sourceBytes);
        const into = received % sourceBytes;
        const n = Math.min(chunk.length - at, sourceBytes - into);
        if (frame < req.frames && !current) data.set(chunk.subarray(at, at + n), frame * frameBytes + into);
        if (frame < req.frames && current) {
          current.set(chunk.subarray(at, at + n), into);
          if (into + n === sourceBytes) {
            data.set(resizeWithPadSync({ data: current, height: source.height, width: source.width }, req.size!).data, frame * frameBytes);
          }
        }
        received += n;
        at += n;
      }
    });
    child.stderr.on('data', (chunk: Buffer) => {
      stderr += chunk.toString('utf8');
      reported ??= outputSize(stderr);
      if (stderr.length > 4 * STDERR_TAIL_BYTES) stderr = stderr.slice(-2 * STDERR_TAIL_BYTES);
    });
    const fail = (msg: string, withTail = true) => {
      const tail = withTail ? stderr.trim().split('\n').slice(-6).join('\n').slice(-STDERR_TAIL_BYTES) : '';
      reject(new DatasetError('bad_video', `video file ${req.file}: ${msg}${tail ? `; ffmpeg said: ${tail}` : ''}`));
    };
    child.on('error', (err) => fail(`could not run ffmpeg (${err.message})`));
    child.on('close', (code, signal) => {
      if (code !== 0) return fail(`ffmpeg exited with ${code ?? signal}`);
      if (reported && (reported.width !== source.width || reported.height !== source.height)) {
        return reject(new SizeMismatch(`video file ${req.file}: ffmpeg produced ${reported.width}x${reported.height} frames; ${said} ${source.width}x${source.height}`, reported));
      }
      const expected = req.frames * sourceBytes;
      if (received !== expected) {
        const what = received > expected ? `more than ${req.frames}` : String(Math.floor(received / sourceBytes));
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
