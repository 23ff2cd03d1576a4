// The kernels' public names (re-exports only).
export { initBackend, backendReport, type BackendReport, type BackendChoice } from './backend.ts';
export { ConfigError, PRESETS, PRESET_ALIASES, countParams, describePresets, makeConfig, resolvePreset, type ConfigErrorCode, type ConfigFields, type PolicyConfig, type Variant } from './config.ts';
export { Rng, type RngState } from './rng.ts';
export { ShapeError, fakeBatch, makeBatch, sliceBatch, tokenizePrompt, type DatumInput, type FakeBatchOptions, type MakeBatchOptions, type ModelBatch, type ShapeErrorCode } from './batch.ts';
export { linearSpecs, paramSpecs, tableParamCount, type LinearSpec, type ParamSpec, type WeightsView } from './policy.ts';
export { drawNoiseTime, mseVelocityGrad, type LossFn } from './flow.ts';
export { LORA_TARGETS, LoraError, selectTargets, type LoraErrorCode, type LoraTarget } from './lora.ts';
export { BaseWeights, TrainerError, TrainingState, type ExportedState, type ForwardResult, type NamedTensors, type NoiseTime, type TrainerErrorCode, type TrainingOptions } from './trainer.ts';
export { AdamWMoments, DEFAULT_ADAMW, OptimError, adamwStep, type AdamWOptions } from './optim.ts';
