/**
 * Per-request sampling seeds of the policy server.
 *
 * Rule (documented in the server's help): with `--seed S`, the n-th request (n = 0, 1, ...) of
 * a connection on stream `K` samples its noise from
 *   seed = u32 little-endian of the first 4 bytes of SHA-256("vela-policy-seed:S:K:n").
 * `K` is the connection's `?stream=` query parameter (default "0"), so a client's actions depend
 * only on S, its stream and its own request count: never on which other clients are connected
 * or how their requests were batched with its own. A client that reconnects starts its stream
 * over (an episode replays exactly). Robots sharing a server and a seed should pick distinct
 * streams, else they draw the same noise. Without `--seed` every request gets a fresh random
 * seed.
 */
import crypto from 'node:crypto';

/** The longest accepted `?stream=` value, in characters. */
export const MAX_STREAM_CHARS = 64;

/** The seed of request `n` of stream `stream` under server seed `seed` (a uint32). */
export function requestSeed(seed: number, stream: string, n: number): number {
  const digest = crypto.createHash('sha256').update(`vela-policy-seed:${seed}:${stream}:${n}`).digest();
  return digest.readUInt32LE(0);
}

/** A fresh random uint32 seed (no `--seed`). */
export function randomSeed(): number {
  return crypto.randomBytes(4).readUInt32LE(0);
}

/**
 * A connection's seed source: `next()` returns the seed of its next request.
 * @param seed the server's `--seed`, or null for random seeds.
 */
export function seedStream(seed: number | null, stream: string): { next(): number } {
  let n = 0;
  return { next: () => (seed === null ? randomSeed() : requestSeed(seed, stream, n++)) };
}
