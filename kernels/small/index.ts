// The small presets' public names (re-exports only): Vela's seeded flow-matching policies in pi0's
// and pi0.5's shape (config.ts: the presets; model.ts: the model; batch.ts: its input).
export { ConfigError, LEGACY_BARE_NAMES, PRESETS, PRESET_ALIASES, PRESET_NAMES, countParams, deprecationNotice, describePresets, makeConfig, realModelMessage, resolvePreset, resolveStoredPreset, type ConfigErrorCode, type ConfigFields, type PolicyConfig, type Variant } from './config.ts';
export { ShapeError, batchBuffers, fakeBatch, makeBatch, sliceBatch, tokenizePrompt, type DatumInput, type FakeBatchOptions, type MakeBatchOptions, type ModelBatch, type ShapeErrorCode } from './batch.ts';
export { decodeSuffix, disposeCache, encodePrefix, initialValues, linearSpecs, paramSpecs, tableParamCount, velocity, type LinearSpec, type ParamSpec, type PrefixCache, type WeightsView } from './model.ts';
