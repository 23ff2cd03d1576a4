// The kernels' public names (re-exports only).
export { initBackend, backendReport, type BackendReport, type BackendChoice } from './backend/index.ts';
export { ConfigError, ShapeError, type ConfigErrorCode, type ShapeErrorCode } from './errors.ts';
export { LEGACY_BARE_NAMES, PRESETS, PRESET_ALIASES, PRESET_NAMES, countParams, deprecationNotice, describePresets, makeConfig, realModelMessage, resolvePreset, resolveStoredPreset, type ConfigFields, type PolicyConfig, type Variant } from './small/index.ts';
export { Rng, type RngState } from './rng.ts';
export { fakeBatch, makeBatch, sliceBatch, tokenizePrompt, type DatumInput, type FakeBatchOptions, type MakeBatchOptions, type ModelBatch } from './small/index.ts';
export { linearSpecs, paramSpecs, tableParamCount, type LinearSpec, type ParamSpec, type WeightsView } from './small/index.ts';
export { drawNoiseTime, mseVelocityGrad, type LossFn } from './flow.ts';
export { LORA_TARGETS, LoraError, selectTargets, type LoraErrorCode, type LoraTarget } from './lora.ts';
export { BaseWeights, TrainerError, TrainingState, type ExportedState, type ForwardResult, type NamedTensors, type NoiseTime, type TrainerErrorCode, type TrainingOptions } from './trainer.ts';
export { AdamWMoments, DEFAULT_ADAMW, OptimError, adamwStep, type AdamWOptions } from './optim.ts';
