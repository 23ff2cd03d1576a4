/**
 * How an engine splits a policy batch for sampling. On native TensorFlow each batch size is a
 * graph of its own (kernels/sample-graph.ts), traced on its first use at the cost of about one
 * to three eager samples (0.5-1.2 s for flow05-tiny): a policy batcher that forms every size
 * from 1 to 16 would stall robots on 16 traces, some of them long after start, whenever load
 * shifts the batch sizes (bench/results/README.md, issue 25). Powers of two bound that to
 * log2(max) + 1 graphs, and a split costs only the extra calls' fixed part (a padded batch would
 * compute rows nobody asked for).
 */

/**
 * Sizes summing to `n`, each a power of two, largest first (13 -> [8, 4, 1]).
 * @throws RangeError for n that is not a positive integer.
 */
export function powerOfTwoChunks(n: number): number[] {
  if (!Number.isInteger(n) || n < 1) throw new RangeError(`a batch of ${n}; expected a positive integer`);
  const out: number[] = [];
  for (let bit = 2 ** Math.floor(Math.log2(n)); bit >= 1; bit /= 2) if (n & bit) out.push(bit);
  return out;
}
