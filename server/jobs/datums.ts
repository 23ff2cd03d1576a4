/**
 * Dataset datums -> the model's batch, normalised (kernels/normalize.ts order: raw -> delta ->
 * normalise -> model). Used by training and by the held-out evaluation alike.
 */
import { makeBatch, type BatchLayout, type DatumInput, type MakeBatchOptions, type ModelBatch } from '../../kernels/small/batch.ts';
import type { Normalizer, NormStatsSet } from '../../kernels/normalize.ts';
import type { TrainingDatum } from '../datasets/index.ts';

/** Valid rows at the head of a datum's chunk (the mask is 1 then 0: padding is at the end). */
export function validRows(d: TrainingDatum): number {
  let valid = 0;
  while (valid < d.horizon && d.actionMask[valid] === 1) valid++;
  return valid;
}

/** How a job lays out its batches: the engine's (server/models/layout.ts modelLayout), with the real model's prompt encoder. */
export type JobLayout = BatchLayout & { encodePrompt?: MakeBatchOptions['encodePrompt'] };

/**
 * Normalised datums -> the model's batch [b, ...]. Only valid action rows are given: padding is
 * masked. `ad` is the dataset's action dim (the model pads to its own).
 */
export function toBatch(model: JobLayout, datums: TrainingDatum[], cameras: string[], norm: NormStatsSet, normalizer: Normalizer, ad: number): ModelBatch {
  const inputs: DatumInput[] = datums.map((d) => {
    const valid = validRows(d);
    return {
      images: cameras.map((c) => d.images[c]!.data),
      state: normalizer.normalize(d.state, d.state.length, norm.state),
      prompt: d.prompt,
      actions: { data: normalizer.normalize(d.actions.subarray(0, valid * ad), ad, norm.actions), horizon: valid, dim: ad },
    };
  });
  // pi0.5's prompt carries the state: the normalised one, as openpi tokenizes it.
  return makeBatch(model, inputs, { encodePrompt: model.encodePrompt });
}
