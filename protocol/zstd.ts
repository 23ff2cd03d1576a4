/**
 * zstd (RFC 8878) for observations and ZPNG payloads, on @bokuweb/zstd-wasm.
 *
 * The wasm library allocates whatever a frame's header asks for, so every frame is checked here
 * first, in JS, before any byte reaches it: exactly one zstd frame (no skippable frames, nothing
 * after it), whole (its blocks are walked to their end), declaring its decompressed size, that
 * size within the caller's bound, and made with the dictionary we hold.
 *
 * Call (and await) `initZstd()` once before the synchronous functions.
 */
import { readFileSync, statSync } from 'node:fs';
import { createRequire } from 'node:module';
import { ProtocolError } from './errors.ts';

type ZstdWasm = typeof import('@bokuweb/zstd-wasm');

/** The first four bytes of every zstd frame (magic 0xFD2FB528, little-endian). */
export const ZSTD_MAGIC = Uint8Array.of(0x28, 0xb5, 0x2f, 0xfd);
/** The first four bytes of a zstd dictionary in the standard format (magic 0xEC30A437). */
const DICT_MAGIC = 0xec30a437;
const BLOCK_HEADER_BYTES = 3;

let wasm: ZstdWasm | null = null;
let initializing: Promise<void> | null = null;
let cctx = 0;
let dctx = 0;

/**
 * Loads the wasm module. Idempotent: concurrent and repeated calls share one load. Everything in
 * the process that uses @bokuweb/zstd-wasm must come through here: the library's own init()
 * re-instantiates its module on every call, and the contexts made after an earlier call then
 * point into a new heap (every later dictionary decode failed, the first with "memory access out
 * of bounds").
 */
export function initZstd(): Promise<void> {
  if (wasm) return Promise.resolve();
  initializing ??= (async () => {
    // The package's ESM build calls `require`, so load its CommonJS build.
    const mod = createRequire(import.meta.url)('@bokuweb/zstd-wasm') as ZstdWasm;
    await mod.init();
    cctx = mod.createCCtx();
    dctx = mod.createDCtx();
    wasm = mod;
  })();
  return initializing;
}

function lib(): ZstdWasm {
  if (!wasm) throw new Error('zstd is not initialised: await initZstd() first');
  return wasm;
}

/** True when `bytes` starts with the zstd frame magic `28 B5 2F FD`. */
export function isZstdFrame(bytes: Uint8Array): boolean {
  return bytes.byteLength >= 4 && ZSTD_MAGIC.every((b, i) => bytes[i] === b);
}

/**
 * The id of a dictionary: the u32 after its magic for a standard (trained) dictionary, 0 for a
 * raw-content dictionary, which carries no id.
 */
export function dictionaryId(dict: Uint8Array): number {
  if (dict.byteLength < 8) return 0;
  const view = new DataView(dict.buffer, dict.byteOffset, dict.byteLength);
  return view.getUint32(0, true) === DICT_MAGIC ? view.getUint32(4, true) : 0;
}

/** What a zstd frame header says, plus the frame's total length found by walking its blocks. */
export interface ZstdFrameInfo {
  /** Frame_Content_Size in bytes; null when the frame does not declare it. */
  contentSize: number | null;
  /** Dictionary_ID; 0 when the frame names none. */
  dictionaryId: number;
  /** Bytes from the magic to the end of the checksum (or last block). */
  frameBytes: number;
}

function bad(message: string): ProtocolError {
  return new ProtocolError('bad_zstd', message);
}

/**
 * Parses a zstd frame header (RFC 8878 section 3.1.1) and walks its block headers to find the end.
 * @throws ProtocolError `bad_zstd` for a missing magic, a reserved bit set, a truncated frame, a
 *   reserved block type, or bytes after the frame.
 */
export function parseZstdFrame(bytes: Uint8Array): ZstdFrameInfo {
  const n = bytes.byteLength;
  if (!isZstdFrame(bytes)) {
    const head = Array.from(bytes.subarray(0, 4), (b) => b.toString(16).padStart(2, '0')).join(' ');
    throw bad(`not a zstd frame: starts with [${head}]; expected 28 b5 2f fd`);
  }
  if (n < 5) throw bad(`truncated zstd frame: ${n} bytes, no frame header descriptor`);
  const fhd = bytes[4]!;
  const fcsFlag = fhd >> 6;
  const singleSegment = (fhd >> 5) & 1;
  if ((fhd >> 3) & 1) throw bad(`corrupt zstd frame: reserved bit set in descriptor 0x${fhd.toString(16)}`);
  const hasChecksum = (fhd >> 2) & 1;
  const didBytes = [0, 1, 2, 4][fhd & 3]!;
  const fcsBytes = [singleSegment ? 1 : 0, 2, 4, 8][fcsFlag]!;
  const headerBytes = 5 + (singleSegment ? 0 : 1) + didBytes + fcsBytes;
  if (n < headerBytes) throw bad(`truncated zstd frame: ${n} bytes; its header alone needs ${headerBytes}`);
  let pos = 5 + (singleSegment ? 0 : 1);
  let dictId = 0;
  for (let i = 0; i < didBytes; i++) dictId += bytes[pos + i]! * 2 ** (8 * i);
  pos += didBytes;
  let contentSize: number | null = null;
  if (fcsBytes > 0) {
    let v = 0;
    // Sizes past 2^53 lose precision but stay huge, which is all the bound check needs.
    for (let i = 0; i < fcsBytes; i++) v += bytes[pos + i]! * 2 ** (8 * i);
    contentSize = fcsBytes === 2 ? v + 256 : v;
    pos += fcsBytes;
  }
  for (;;) {
    if (pos + BLOCK_HEADER_BYTES > n) throw bad(`truncated zstd frame: ${n} bytes, a block header was cut at byte ${pos}`);
    const h = bytes[pos]! | (bytes[pos + 1]! << 8) | (bytes[pos + 2]! << 16);
    const last = h & 1;
    const type = (h >> 1) & 3;
    const size = h >>> 3;
    if (type === 3) throw bad(`corrupt zstd frame: reserved block type at byte ${pos}`);
    pos += BLOCK_HEADER_BYTES + (type === 1 ? 1 : size);
    if (pos > n) throw bad(`truncated zstd frame: ${n} bytes; a block runs to byte ${pos}`);
    if (last) break;
  }
  if (hasChecksum) pos += 4;
  if (pos > n) throw bad(`truncated zstd frame: ${n} bytes; its checksum ends at byte ${pos}`);
  if (pos < n) throw bad(`${n - pos} bytes follow the zstd frame (frame is ${pos} bytes); expected exactly one frame`);
  return { contentSize, dictionaryId: dictId, frameBytes: pos };
}

/** Options of `zstdCompress`. */
export interface ZstdCompressOptions {
  /** Compression level, 1 (fast, the protocol's default) to 22. */
  level?: number;
  /** A dictionary (standard or raw content); its id is written into the frame. */
  dict?: Uint8Array;
}

/**
 * Compresses `data` into one zstd frame that declares its content size (and the dictionary id
 * when `dict` is a standard dictionary). Requires `initZstd()`.
 */
export function zstdCompress(data: Uint8Array, opts: ZstdCompressOptions = {}): Uint8Array {
  const z = lib();
  const level = opts.level ?? 1;
  return opts.dict ? z.compressUsingDict(cctx, data, opts.dict, level) : z.compress(data, level);
}

/** Options of `zstdDecompress`. */
export interface ZstdDecompressOptions {
  /**
   * The dictionary the frame was made with, needed when the frame names a dictionary id; or
   * several, of which the one whose id the frame names is used (a server that accepts its own
   * dictionary and an operator's: PROTOCOL.md section 6).
   */
  dict?: Uint8Array | readonly Uint8Array[];
  /** Upper bound on the decompressed size in bytes, checked against the header before decoding. */
  maxBytes: number;
}

/**
 * Decompresses exactly one zstd frame. Requires `initZstd()`.
 *
 * A frame that names no dictionary is decoded without one even when `dict` is given: zstd writes
 * the id whenever it compresses with a standard dictionary, and loading a dictionary for a frame
 * made without one would change its initial repeat offsets.
 * @throws ProtocolError `bad_zstd` (not one whole, valid frame; checksum or content mismatch),
 *   `too_large` (no declared content size, or one over `maxBytes`), `dictionary_mismatch` (the
 *   frame names a dictionary id other than `dict`'s, or one when no dictionary is given).
 */
export function zstdDecompress(data: Uint8Array, opts: ZstdDecompressOptions): Uint8Array {
  const z = lib();
  const info = parseZstdFrame(data);
  if (info.contentSize === null) {
    throw new ProtocolError(
      'too_large',
      'zstd frame does not declare its content size, so its size cannot be bounded before decoding; ' +
        'compress it in one shot (or pass the size to a streaming compressor)',
    );
  }
  if (info.contentSize > opts.maxBytes) {
    throw new ProtocolError('too_large', `zstd frame decompresses to ${info.contentSize} bytes; the limit is ${opts.maxBytes}`);
  }
  let dict: Uint8Array | undefined;
  if (info.dictionaryId !== 0) {
    const dicts = opts.dict === undefined ? [] : opts.dict instanceof Uint8Array ? [opts.dict] : opts.dict;
    dict = dicts.find((d) => dictionaryId(d) === info.dictionaryId);
    if (!dict) {
      const ids = dicts.map(dictionaryId);
      const given = ids.length === 0 ? 'no dictionary was given' : ids.length === 1 ? `the given dictionary has id ${ids[0]}` : `the given dictionaries have ids ${ids.join(', ')}`;
      throw new ProtocolError(
        'dictionary_mismatch',
        `zstd dictionary mismatch: the frame was made with dictionary id ${info.dictionaryId}; ${given}`,
      );
    }
  }
  if (info.contentSize === 0) return new Uint8Array(0);
  let out: Uint8Array;
  try {
    // The library sizes its output buffer from the (already bounded) header.
    out = dict ? z.decompressUsingDict(dctx, data, dict) : z.decompress(data);
  } catch (e) {
    throw bad(`corrupt zstd frame (${info.frameBytes} bytes, content size ${info.contentSize}): ${(e as Error).message}`);
  }
  if (out.byteLength !== info.contentSize) {
    throw bad(`corrupt zstd frame: decoded ${out.byteLength} bytes; the header declares ${info.contentSize}`);
  }
  return out;
}

/**
 * Decompresses a zstd page of a container that states the page's decoded size (parquet's
 * uncompressed_page_size), without this module's single-frame checks: such pages come from
 * dataset files, not from the network. The output buffer is `outputLength` bytes unless the
 * frame header declares its size. Requires `initZstd()`.
 * @throws Error from the library when the page is corrupt.
 */
export function zstdDecompressSized(data: Uint8Array, outputLength: number): Uint8Array {
  return lib().decompress(data, { defaultHeapSize: Math.max(outputLength, 1024) });
}

let observationDict: Uint8Array | null = null;

/**
 * The project's observation dictionary (protocol/observation.zdict, trained by
 * scripts/train_zdict.py on OpenPI-style msgpack observations), read once and cached. It is the
 * dictionary served at `GET /v1/observation.zdict` (PROTOCOL.md section 6).
 */
export function loadObservationDictionary(): Uint8Array {
  observationDict ??= new Uint8Array(readFileSync(new URL('./observation.zdict', import.meta.url)));
  return observationDict;
}

/** At most this many operator dictionaries (`--zstd-dict`) beside the project's own. */
export const MAX_EXTRA_DICTIONARIES = 16;
/** The largest operator dictionary, bytes (zstd's default is 110 KiB; `--maxdict` may make more). */
export const MAX_DICTIONARY_BYTES = 1024 * 1024;

/**
 * Reads the operator's observation dictionaries (`vela serve` / `vela policy` `--zstd-dict`, such
 * as Relay's observation.zdict): files of zstd's standard dictionary format, each with an id, so
 * that a frame's header (its Dictionary_ID) picks one. Each is tried once on a small round trip,
 * so a file that the library cannot load is refused here, not at a robot's first observation.
 * Requires nothing first (it awaits `initZstd()`).
 * @returns the dictionaries in the order given (an empty list for no files).
 * @throws Error naming the file: more than MAX_EXTRA_DICTIONARIES files, a file that is missing,
 *   not a file, over MAX_DICTIONARY_BYTES, not a standard dictionary (magic 37 A4 30 EC) or of id
 *   0, that the library cannot use, or whose id is the project's own or another file's.
 */
export async function loadDictionaryFiles(files: readonly string[]): Promise<Uint8Array[]> {
  if (files.length === 0) return [];
  if (files.length > MAX_EXTRA_DICTIONARIES) throw new Error(`${files.length} zstd dictionaries given; at most ${MAX_EXTRA_DICTIONARIES} are taken`);
  await initZstd();
  const ownId = dictionaryId(loadObservationDictionary());
  const seen = new Map<number, string>([[ownId, "Vela's own (GET /v1/observation.zdict)"]]);
  const out: Uint8Array[] = [];
  for (const file of files) {
    let size: number;
    try {
      const st = statSync(file);
      if (!st.isFile()) throw new Error('not a file');
      size = st.size;
    } catch (e) {
      throw new Error(`zstd dictionary ${file}: ${(e as NodeJS.ErrnoException).code === 'ENOENT' ? 'no such file' : (e as Error).message}`);
    }
    // Checked before reading: an operator's typo could name a file of gigabytes.
    if (size > MAX_DICTIONARY_BYTES) throw new Error(`zstd dictionary ${file} is ${size} bytes; the limit is ${MAX_DICTIONARY_BYTES} (1 MiB)`);
    const dict = new Uint8Array(readFileSync(file));
    const id = dictionaryId(dict);
    if (id === 0) {
      throw new Error(`zstd dictionary ${file} is not a trained zstd dictionary with an id (it must start with 37 a4 30 ec and name a dictionary id other than 0, as zstd --train writes it): a frame could not name it`);
    }
    const other = seen.get(id);
    if (other !== undefined) throw new Error(`zstd dictionary ${file} has id ${id}, the id of ${other}: frames could not say which one they were made with`);
    try {
      const probe = new TextEncoder().encode(`zstd dictionary probe ${id}`);
      const back = zstdDecompress(zstdCompress(probe, { dict }), { dict, maxBytes: probe.byteLength });
      if (Buffer.compare(back, probe) !== 0) throw new Error('a round trip changed the bytes');
    } catch (e) {
      throw new Error(`zstd dictionary ${file} (id ${id}) cannot be used: ${(e as Error).message}`);
    }
    seen.set(id, file);
    out.push(dict);
  }
  return out;
}
