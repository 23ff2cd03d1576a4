/**
 * The models layer's error (`vela models`, resolveBase): one line naming the repository or folder,
 * the cause and the fix.
 */

/**
 * - `bad_argument`: a repo id, revision, glob or token that cannot be right as typed.
 * - `not_found`: no such repository, revision, file or folder.
 * - `not_downloaded`: a Hub id that is not in the Hugging Face cache, downloads not allowed.
 * - `unauthorized`: the hub refused the token itself, or the repository is private.
 * - `gated`: the repository needs its licence accepted (google/paligemma-3b-pt-224).
 * - `network`: the hub could not be reached, or a transfer broke after the retries.
 * - `integrity`: downloaded bytes whose size or hash differ from the hub's list (discarded).
 */
export type ModelErrorCode = 'not_found' | 'not_downloaded' | 'unauthorized' | 'gated' | 'network' | 'integrity' | 'bad_argument';

export class ModelError extends Error {
  readonly code: ModelErrorCode;
  constructor(code: ModelErrorCode, message: string) {
    super(message);
    this.name = 'ModelError';
    this.code = code;
  }
}
