/**
 * Dataset datums -> the model's batch, normalised (kernels/normalize.ts order: raw -> delta ->
 * normalise -> model). Used by training and by the held-out evaluation alike.
 */
import { makeBatch, type DatumInput, type ModelBatch } from '../../kernels/small/batch.ts';
import type { PolicyConfig } from '../../kernels/small/config.ts';
import type { Normalizer, NormStatsSet } from '../../kernels/normalize.ts';
import type { TrainingDatum } from '../datasets/index.ts';

/** Valid rows at the head of a datum's chunk (the mask is 1 then 0: padding is at the end). */
export function validRows(d: TrainingDatum): number {
  let valid = 0;
  while (valid < d.horizon && d.actionMask[valid] === 1) valid++;
  return valid;
}

/**
 * Normalised datums -> the model's batch [b, ...]. Only valid action rows are given: padding is
 * masked. `ad` is the dataset's action dim (the model pads to its own).
 */
export function toBatch(model: PolicyConfig, datums: TrainingDatum[], cameras: string[], norm: NormStatsSet, normalizer: Normalizer, ad: number): ModelBatch {
  const inputs: DatumInput[] = datums.map((d) => {
    const valid = validRows(d);
    return {
      images: cameras.map((c) => d.images[c]!.data),
      state: normalizer.normalize(d.state, d.state.length, norm.state),
      prompt: d.prompt,
      actions: { data: normalizer.normalize(d.actions.subarray(0, valid * ad), ad, norm.actions), horizon: valid, dim: ad },
    };
  });
  return makeBatch(model, inputs);
}
