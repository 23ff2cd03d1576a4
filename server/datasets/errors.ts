/**
 * The dataset layer's one error type. Every failure to read a LeRobot dataset throws a
 * `DatasetError` whose `code` says what kind of failure it was and whose message names the file
 * (relative to the dataset root where possible) and quotes the real values, so a fine-tune job
 * can fail before any work with a readable reason.
 */
export type DatasetErrorCode =
  | 'not_found' // the dataset folder itself does not exist
  | 'missing_file' // info.json, an episodes/tasks file, a parquet or a video file is absent
  | 'corrupt_file' // a file exists but cannot be parsed (JSON, parquet, image bytes)
  | 'unsupported_version' // codebase_version other than v2.0, v2.1, v3.0
  | 'bad_metadata' // info.json / episodes / tasks disagree with the format or with each other
  | 'row_count_mismatch' // parquet rows or decoded frames disagree with the metadata
  | 'bad_video' // ffmpeg failed or returned an unexpected number of frames
  | 'unknown_camera' // a requested camera is not a video/image feature of the dataset
  | 'unknown_episode' // a requested episode index is not in the dataset
  | 'bad_argument'; // a caller's argument is out of range (horizon, size, batch...)

export class DatasetError extends Error {
  readonly code: DatasetErrorCode;
  constructor(code: DatasetErrorCode, message: string) {
    super(message);
    this.name = 'DatasetError';
    this.code = code;
  }
}
