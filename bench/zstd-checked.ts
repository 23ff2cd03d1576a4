/**
 * zstd compression for the bench's clients. protocol/zstd.ts's dictionary compression traps
 * ("memory access out of bounds") on real G1 frames, and after the trap the wasm module's heap
 * is broken for every later call (seen: a 2.7 MB observation compressed to 111 bytes). So the
 * bench never calls it: dictionary frames are made by Python's zstandard (level 1, the same
 * dictionary) when python3 has it, as an OpenPI client would (Python checks its own round trip);
 * otherwise plain zstd from the wasm module.
 */
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { zstdCompress, zstdDecompress } from '../protocol/zstd.ts';

const DICT_PATH = fileURLToPath(new URL('../protocol/observation.zdict', import.meta.url));
const PY = `import sys, zstandard
d = zstandard.ZstdCompressionDict(open(sys.argv[1], 'rb').read())
src = sys.stdin.buffer.read()
z = zstandard.ZstdCompressor(level=1, dict_data=d, write_content_size=True).compress(src)
assert zstandard.ZstdDecompressor(dict_data=d).decompress(z) == src, 'round trip failed'
sys.stdout.buffer.write(z)`;

/** A dictionary frame of `plain` made by python3's zstandard, or the reason it could not be made. */
export function pythonDictZstd(plain: Uint8Array): Uint8Array | string {
  const r = spawnSync('python3', ['-c', PY, DICT_PATH], { input: plain, maxBuffer: 256 << 20 });
  if (r.error) return `python3 not found (${r.error.message})`;
  if (r.status !== 0) return `python3 zstandard failed: ${r.stderr.toString().trim().split('\n').pop()}`;
  return new Uint8Array(r.stdout.buffer, r.stdout.byteOffset, r.stdout.byteLength);
}

function same(a: Uint8Array, b: Uint8Array): boolean {
  return Buffer.compare(Buffer.from(a.buffer, a.byteOffset, a.byteLength), Buffer.from(b.buffer, b.byteOffset, b.byteLength)) === 0;
}

/**
 * A zstd frame of `plain`: with the dictionary (made by Python) when `dict` is given and Python
 * can, else plain zstd (wasm, verified by a round trip). Needs initZstd().
 * @returns the frame, whether it uses the dictionary, and why not when it was asked to.
 * @throws Error when no verified frame can be made.
 */
export function checkedZstd(plain: Uint8Array, dict: Uint8Array | undefined): { bytes: Uint8Array; dict: boolean; problem: string | null } {
  let problem: string | null = null;
  if (dict) {
    const z = pythonDictZstd(plain);
    if (typeof z === 'string') problem = z;
    else return { bytes: z, dict: true, problem: null };
  }
  const z = zstdCompress(plain);
  if (!same(zstdDecompress(z, { maxBytes: plain.byteLength + 1024 }), plain)) throw new Error(`plain zstd of ${plain.byteLength} bytes does not round-trip`);
  return { bytes: z, dict: false, problem };
}
