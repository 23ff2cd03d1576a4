/**
 * The record a fine-tune leaves beside the model it made (`vela_training.json`, TrainingRecord in
 * server/models/upload.ts): written by a server job and by `vela finetune` when they succeed, read
 * by `vela models upload` and a job's `push_to_hub` for the model card's Training section.
 */
import { atomicWrite } from '../models/norm-stats.ts';
import { TRAINING_RECORD, type TrainingRecord } from '../models/upload.ts';
import type { FineTuneConfig } from './config.ts';

/**
 * What the job records beside its model (TRAINING_RECORD): its recipe as the server ran it, what
 * was held out, and its last held-out evaluation (PROTOCOL.md section 1's `eval_*` numbers), or
 * that none was run. The model card is written from it (trainingCard). `id` null: a local
 * `vela finetune` run, which has no job id.
 */
export function trainingRecord(id: string | null, cfg: FineTuneConfig, lastEval: Record<string, unknown> | null): TrainingRecord {
  const held = cfg.eval_dataset ? `every episode of ${cfg.eval_dataset}` : cfg.eval_episodes ? `episodes ${cfg.eval_episodes.join(', ')}` : cfg.eval_fraction > 0 ? `a seeded ${cfg.eval_fraction} of the episodes` : 'none';
  const num = (v: unknown) => (typeof v === 'number' ? v : null);
  return {
    job_id: id,
    model: cfg.model,
    base: cfg.base ?? null,
    dataset_name: cfg.dataset_name,
    held_out: held,
    recipe: {
      finetune: cfg.finetune,
      lora_rank: cfg.finetune === 'lora' ? cfg.lora_rank : null,
      lora_alpha: cfg.finetune === 'lora' ? cfg.lora_alpha : null,
      steps: cfg.steps,
      batch_size: cfg.batch_size,
      learning_rate: cfg.learning_rate,
      warmup_steps: cfg.warmup_steps,
      lr_floor: cfg.lr_floor,
      weight_decay: cfg.weight_decay,
      ema_decay: cfg.ema_decay ?? null,
      seed: cfg.seed,
    },
    held_out_eval: lastEval && typeof lastEval.eval_mse === 'number'
      ? { step: lastEval.step as number, eval_mse: lastEval.eval_mse, eval_ratio_hold_state: num(lastEval.eval_ratio_hold_state), eval_ratio_mean_chunk: num(lastEval.eval_ratio_mean_chunk), eval_frames: num(lastEval.eval_frames) }
      : null,
  };
}

/** Writes `record` as `dir`/TRAINING_RECORD atomically and fsynced. @throws CheckpointError `io`. */
export async function writeTrainingRecord(dir: string, record: TrainingRecord): Promise<void> {
  await atomicWrite(dir, TRAINING_RECORD, `${JSON.stringify(record, null, 2)}\n`);
}
