/**
 * The default recipe: one place for every default a surface fills in when the request leaves a
 * recipe field out (issue 35 item 7). `POST /v1/fine-tunes` and `vela finetune` (jobs/config.ts,
 * jobs/cli.ts's help text), training sessions (sessions.ts), the sidecar's job_start
 * (sidecar/routes.ts) and the dashboard's new-job form (through `GET /v1/defaults`) read it.
 *
 * The default depends on the kind of base: a seeded preset (flow0-tiny, ...: random weights) trains
 * every weight; a trained base (the real pi0 / pi05 checkpoints, a previous job's output) trains
 * LoRA adapters, at openpi's ranks on the real models. A training session is the one surface that
 * differs: LoRA on every base (SESSION_DEFAULTS says why).
 */
import { OPENPI_LORA } from '../../kernels/pi/policy.ts';

/** The preset a fine-tune (REST, CLI, sidecar) trains when the request names none. */
export const DEFAULT_PRESET = 'flow0-tiny';

/**
 * The default recipe, the best row of bench/results/recipe.md (issue 16: held-out G1 episodes
 * 4, 7 and 12, ~21 minutes of training on 2 CPU cores): flow0-tiny (then named pi0-tiny), full
 * fine-tune, batch 32, lr 3e-4, EMA 0.99, 1500 steps scored 0.69x and 0.62x the hold-state
 * baseline with seeds 0 and 1 (0.70x / 0.61x in raw units; PyTorch's twin 0.66x / 0.69x), where
 * the same recipe on flow05-tiny (pi05-tiny) scored 0.98x. A field the request leaves out takes
 * this value. Units: learning_rate per step; eval_fraction a share of episodes in [0, 1);
 * eval_stride frames.
 */
export const RECIPE = {
  model: DEFAULT_PRESET,
  steps: 1500,
  batch_size: 32,
  learning_rate: 3e-4,
  eval_fraction: 0.1,
  eval_stride: 4,
  lr_floor: 0.1,
  adam_eps: 1e-8,
  weight_decay: 1e-10,
  ema_decay: 0.99,
  augment: false,
  time_sampling: 'beta' as 'beta' | 'uniform',
} as const;

/**
 * The fine-tune mode when the request does not name one: `full` on a base that is a seeded random
 * initialisation (the small presets: LoRA adapters on random weights cannot make up for them),
 * `lora` on a trained base (the real pi0 / pi0.5 checkpoints, a previous job's output).
 */
export function defaultFinetune(trainedBase: boolean): 'lora' | 'full' {
  return trainedBase ? 'lora' : 'full';
}

/** LoRA's default sizes: rank and alpha of the adapters; the action expert's where they differ (null: the same). */
export interface LoraDefaults {
  rank: number;
  alpha: number;
  action_rank: number | null;
  action_alpha: number | null;
}

/** LoRA on a small preset: rank 16, alpha 32 everywhere. */
const PRESET_LORA: LoraDefaults = Object.freeze({ rank: 16, alpha: 32, action_rank: null, action_alpha: null });
/** openpi's LoRA on the real pi0 / pi0.5: rank 16 / alpha 16 on the VLM, 32 / 32 on the action expert. */
const REAL_LORA: LoraDefaults = Object.freeze({ rank: OPENPI_LORA.rank, alpha: OPENPI_LORA.alpha, action_rank: OPENPI_LORA.actionRank, action_alpha: OPENPI_LORA.actionAlpha });

/**
 * The LoRA sizes a request that names none gets (a fine-tune's lora_rank / lora_alpha, a
 * session's rank / alpha). The action expert's differ only on the real models, and only when the
 * request set no rank (a rank given is for both; see jobs/config.ts and sessions.ts).
 * @param realModel the base is the real pi0 / pi05.
 */
export function defaultLora(realModel: boolean): LoraDefaults {
  return realModel ? REAL_LORA : PRESET_LORA;
}

/**
 * A training session's defaults. base_model is required (a session names the engine it opens).
 * The mode is LoRA on every base, where a job on a seeded preset trains every weight: a session
 * is driven step by step by a client (the Tinker-style loop, PROTOCOL.md section 2), and many
 * sessions share one engine's base weights, each adding only its adapters and their optimizer
 * moments; a full-weight session holds its own copy of every weight and moment, so it is asked
 * for (finetune "full").
 */
export const SESSION_DEFAULTS = Object.freeze({ finetune: 'lora' as 'lora' | 'full', seed: 0 });

/** The sidecar's job_start defaults: model_size is the fine-tunes' preset; num_train_steps its own short run. */
export const SIDECAR_DEFAULTS = Object.freeze({ model_size: DEFAULT_PRESET, num_train_steps: 100 });

/**
 * The body of `GET /v1/defaults` (PROTOCOL.md section 1): what each surface fills in, for clients
 * and the dashboard's new-job form to show rather than keep their own copies.
 */
export function defaultsJson(): Record<string, unknown> {
  return {
    fine_tune: {
      ...RECIPE,
      finetune: { seeded_preset: defaultFinetune(false), trained_base: defaultFinetune(true) },
      lora: { seeded_preset: defaultLora(false), real_model: defaultLora(true) },
      seed: 0,
    },
    session: { ...SESSION_DEFAULTS, lora: { seeded_preset: defaultLora(false), real_model: defaultLora(true) } },
    sidecar: { ...SIDECAR_DEFAULTS },
  };
}
