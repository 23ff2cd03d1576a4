/**
 * The kernels' error types shared by both model families (kernels/small, kernels/pi) and the
 * training machinery: a configuration out of range, an input that does not fit the model.
 */

export type ConfigErrorCode = 'unknown_preset' | 'real_model' | 'bad_config';

/** The kernels' configuration error: an unknown preset, a real model's name where a preset is
 * wanted (`pi0`, `pi05`), or a field out of range. */
export class ConfigError extends Error {
  readonly code: ConfigErrorCode;
  constructor(code: ConfigErrorCode, message: string) {
    super(message);
    this.name = 'ConfigError';
    this.code = code;
  }
}

export type ShapeErrorCode = 'shape_mismatch' | 'too_large' | 'bad_value' | 'empty_batch';

/** Input whose shape or values do not fit the model; messages quote the real values. */
export class ShapeError extends Error {
  readonly code: ShapeErrorCode;
  constructor(code: ShapeErrorCode, message: string) {
    super(message);
    this.name = 'ShapeError';
    this.code = code;
  }
}
