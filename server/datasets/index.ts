export { DatasetError } from './errors.ts';
export type { DatasetErrorCode } from './errors.ts';
export type {
  ActionSpace,
  CameraMeta,
  CodebaseVersion,
  DatasetMeta,
  EpisodeFrames,
  EpisodeMeta,
  EpisodeTable,
  EpisodeVideo,
  Frame,
  TrainingDatum,
} from './types.ts';
export { Dataset, DEFAULT_FRAME_CACHE_BYTES, openDataset } from './dataset.ts';
export type { OpenOptions } from './dataset.ts';
export { actionChunk, actionGroups, chunkActionRows, defaultActionSpace, deltaPairs, pairsFor } from './actions.ts';
export type { ActionGroup } from './actions.ts';
export { seededRng, splitEpisodes } from './split.ts';
export type { EpisodeSplit, Rng, SplitOptions } from './split.ts';
export { gatherNormRows, makeDatum, sampleBatch } from './sample.ts';
export type { BatchOptions, DatumOptions, NormRows } from './sample.ts';
export { describeDataset } from './describe.ts';
export { ffmpegPath } from './video.ts';
export { ByteLruCache } from './cache.ts';
