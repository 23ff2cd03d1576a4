/**
 * Encode/decode costs of the wire formats, per message size: frames (RAW, JPEG, ZPNG) at the
 * camera's 480x640 and at the model's 96x96, msgpack of session requests of 1 and 8 datums, and
 * zstd (level 1, with and without the observation dictionary) of OpenPI observations.
 */
import { decodeFrame, encodeFrame, resizeWithPad } from '../protocol/frames.ts';
import { pack, unpack } from '../protocol/msgpack.ts';
import { fromWire, ndarray, packNumpy, toWire } from '../protocol/ndarray.ts';
import { initZstd, loadObservationDictionary, zstdCompress, zstdDecompress } from '../protocol/zstd.ts';
import type { Datum } from '../protocol/client.ts';
import type { Frame } from '../server/datasets/index.ts';
import { summarize, timeCalls } from './stats.ts';
import type { CodecRow } from './schema.ts';

function row(kind: CodecRow['kind'], name: string, op: CodecRow['op'], inputBytes: number, outputBytes: number, ms: number[]): CodecRow {
  const s = summarize(ms);
  return { kind, name, op, inputBytes, outputBytes, ms: s, mbPerS: (op === 'encode' ? inputBytes : outputBytes) / 1e6 / (s.p50 / 1000) };
}

function byteLength(x: Uint8Array | { data: Uint8Array }): number {
  return x instanceof Uint8Array ? x.byteLength : x.data.byteLength;
}

/** Frame codecs on one real frame at its size and at `small` x `small`. */
async function frameRows(frame: Frame, small: number, reps: number): Promise<CodecRow[]> {
  const out: CodecRow[] = [];
  const frames: [string, Frame][] = [[`${frame.height}x${frame.width}`, frame], [`${small}x${small}`, await resizeWithPad(frame, small)]];
  for (const [size, f] of frames) {
    for (const codec of ['RAW', 'JPEG', 'LOSSLESS']) {
      const enc = await encodeFrame(codec, f);
      const label = `${codec === 'LOSSLESS' ? 'ZPNG' : codec} ${size}`;
      out.push(row('frame', label, 'encode', f.data.byteLength, byteLength(enc as any), await timeCalls(reps, 1, () => encodeFrame(codec, f))));
      out.push(row('frame', label, 'decode', byteLength(enc as any), f.data.byteLength, await timeCalls(reps, 1, () => decodeFrame(codec, enc))));
    }
  }
  return out;
}

/** msgpack of a forward_backward request, as the client packs it and the server unpacks it. */
function msgpackRows(datums: Datum[], codec: string, reps: number): Promise<CodecRow[]> {
  return Promise.all([1, datums.length].map(async (n) => {
    const req = { id: 1, op: 'forward_backward', data: datums.slice(0, n), codec };
    const bytes = Uint8Array.from(pack(toWire(req))); // pack reuses its buffer: keep a copy
    const name = `forward_backward ${n} datum${n > 1 ? 's' : ''} ${codec}`;
    return [
      row('msgpack', name, 'encode', bytes.byteLength, bytes.byteLength, await timeCalls(reps, 1, () => pack(toWire(req)))),
      row('msgpack', name, 'decode', bytes.byteLength, bytes.byteLength, await timeCalls(reps, 1, () => fromWire(unpack(bytes)))),
    ];
  })).then((r) => r.flat());
}

/**
 * zstd level 1 on OpenPI observations (RAW frames): plain zstd both ways, and the decoding of a
 * dictionary frame made by Python. A dictionary frame that cannot be made is a note.
 */
async function zstdRows(frame: Frame, small: number, reps: number, notes: string[]): Promise<CodecRow[]> {
  await initZstd();
  const dict = loadObservationDictionary();
  const out: CodecRow[] = [];
  const smallFrame = await resizeWithPad(frame, small);
  for (const [label, f] of [[`observation ${small}x${small}`, smallFrame], [`observation ${frame.height}x${frame.width}`, frame]] as const) {
    const obs = {
      'observation/image': ndarray(f.data, [f.height, f.width, 3]),
      'observation/state': ndarray(new Float32Array(26).map((_, i) => Math.sin(i)), [26]),
      prompt: 'Pick up the yellow bottle on the table.',
    };
    const plain = Uint8Array.from(packNumpy(obs)); // packNumpy reuses its buffer: keep a copy
    out.push(row('msgpack', `OpenPI ${label}`, 'encode', plain.byteLength, plain.byteLength, await timeCalls(reps, 1, () => packNumpy(obs))));
    for (const [name, opts] of [[`zstd+dict ${label}`, { dict }], [`zstd ${label}`, {}]] as const) {
      const z = zstdCompress(plain, opts);
      const back = zstdDecompress(z, { ...opts, maxBytes: 64 << 20 });
      if (Buffer.compare(Buffer.from(back), Buffer.from(plain)) !== 0) notes.push(`${name}: the round trip changed the bytes`);
      out.push(row('zstd', name, 'encode', plain.byteLength, z.byteLength, await timeCalls(reps, 1, () => zstdCompress(plain, opts))));
      out.push(row('zstd', name, 'decode', z.byteLength, plain.byteLength, await timeCalls(reps, 1, () => zstdDecompress(z, { ...opts, maxBytes: 64 << 20 }))));
    }
  }
  return out;
}
/** Every codec row. `frame` is a real camera frame; `datums` the step run's datums; problems go to `notes`. */
export async function runCodecs(frame: Frame, datums: Datum[], codec: string, imageSize: number, reps: number, notes: string[]): Promise<CodecRow[]> {
  await initZstd();
  return [...(await frameRows(frame, imageSize, reps)), ...(await msgpackRows(datums, codec, reps)), ...(await zstdRows(frame, imageSize, reps, notes))];
}
