/**
 * The policy's configuration: the presets of MODEL.md's table, validated and frozen. The model
 * (kernels/small/model.ts) is built from a PolicyConfig and nothing else.
 *
 * Axis legend used in shape comments across kernels/: `b` batch, `ah` action horizon, `ad`
 * action dim, `s` state dim, `p` prefix tokens, `t` tokens, `w` width, `h` heads, `hd` head
 * dim, `n` rows (b * tokens), `m` mlp width.
 */

import { ConfigError } from '../errors.ts';

export { ConfigError, type ConfigErrorCode } from '../errors.ts';

/** pi0: the state is one suffix token, time enters the action tokens by an MLP.
 * pi05: the state is discretised into prefix tokens, time conditions adaptive RMSNorm. */
export type Variant = 'pi0' | 'pi05';

export interface PolicyConfig {
  readonly preset: string;
  readonly variant: Variant;
  readonly imageSize: number; // pixels, square
  readonly patch: number; // pixels, square patches
  readonly slots: number; // image slots (cameras)
  readonly width: number;
  readonly depth: number;
  readonly heads: number;
  readonly headDim: number;
  readonly mlpDim: number;
  readonly maxTokenLen: number; // prompt bytes
  readonly stateDim: number;
  readonly actionDim: number;
  readonly horizon: number; // action horizon
  // Derived.
  readonly patchesPerSlot: number; // (imageSize / patch)^2
  readonly patchDim: number; // patch * patch * 3
  readonly vocab: number; // 257: bytes 0..255 and padding 256 (D5)
  readonly padToken: number; // 256
}

export type ConfigFields = Omit<PolicyConfig, 'preset' | 'patchesPerSlot' | 'patchDim' | 'vocab' | 'padToken'>;

const TINY = { imageSize: 96, patch: 16, slots: 3, width: 128, depth: 4, heads: 4, headDim: 32, mlpDim: 512, maxTokenLen: 48, stateDim: 32, actionDim: 32, horizon: 16 };
const SMALL = { imageSize: 224, patch: 16, slots: 3, width: 384, depth: 8, heads: 6, headDim: 64, mlpDim: 1536, maxTokenLen: 48, stateDim: 32, actionDim: 32, horizon: 50 };

/**
 * MODEL.md "Presets", verbatim: Vela's small flow-matching policies in pi0's (`flow0-*`) and
 * pi0.5's (`flow05-*`) shape, seeded, not the real models (those are kernels/pi).
 */
export const PRESETS: Readonly<Record<string, ConfigFields>> = Object.freeze({
  'flow0-tiny': { variant: 'pi0', ...TINY },
  'flow05-tiny': { variant: 'pi05', ...TINY },
  'flow0-small': { variant: 'pi0', ...SMALL },
  'flow05-small': { variant: 'pi05', ...SMALL },
});

/**
 * The presets' names until December 2026, deprecated: accepted everywhere (stored jobs, sessions,
 * checkpoints, requests, flags) as the preset they name; a new request naming one gets a warning.
 */
export const PRESET_ALIASES: Readonly<Record<string, string>> = Object.freeze({
  'pi0-tiny': 'flow0-tiny',
  'pi05-tiny': 'flow05-tiny',
  'pi0-small': 'flow0-small',
  'pi05-small': 'flow05-small',
});

/**
 * Bare `pi0` / `pi05` meant the small presets until December 2026; they now name the real models
 * (kernels/pi). Only records stored before that change keep the old meaning (resolveStoredPreset).
 */
export const LEGACY_BARE_NAMES: Readonly<Record<string, string>> = Object.freeze({ pi0: 'flow0-small', pi05: 'flow05-small' });

/** Every preset name a new request may give: the presets, then their deprecated aliases. */
export const PRESET_NAMES: readonly string[] = Object.freeze([...Object.keys(PRESETS), ...Object.keys(PRESET_ALIASES)]);

/**
 * The one-line refusal where a small preset is required and `pi0` / `pi05` (the real models) was
 * given (any other name: an unknown-preset line), e.g. "pi05 is the real pi0.5 (PaliGemma 3B +
 * Gemma 300M expert), not a small preset; the small pi0.5-style preset is flow05-small". Where
 * the real models are served (sessions, fine-tunes, policies) the server takes them by name.
 */
export function realModelMessage(name: string): string {
  const small = LEGACY_BARE_NAMES[name];
  if (small === undefined) return `unknown preset '${name}'; known presets: ${PRESET_NAMES.join(', ')}`;
  const shown = name === 'pi05' ? 'pi0.5' : 'pi0';
  return `${name} is the real ${shown} (PaliGemma 3B + Gemma 300M expert), not a small preset; the small ${shown}-style preset is ${small}`;
}

/** The warning line for a deprecated preset name, or undefined for a current one. */
export function deprecationNotice(name: string): string | undefined {
  const now = PRESET_ALIASES[name];
  return now === undefined ? undefined : `preset name '${name}' is deprecated; it is now '${now}' (the same model)`;
}

/**
 * The canonical preset name of `name` in a new request: a preset, or a deprecated alias
 * (resolved; `onDeprecated` gets deprecationNotice's one line to log).
 * @throws ConfigError('real_model') for bare `pi0` / `pi05` (realModelMessage), or
 *   ConfigError('unknown_preset') naming the known presets.
 */
export function resolvePreset(name: string, onDeprecated?: (line: string) => void): string {
  if (name in LEGACY_BARE_NAMES) throw new ConfigError('real_model', realModelMessage(name));
  const canonical = PRESET_ALIASES[name] ?? name;
  if (!(canonical in PRESETS)) {
    throw new ConfigError('unknown_preset', `unknown preset '${name}'; known presets: ${PRESET_NAMES.join(', ')}`);
  }
  const notice = deprecationNotice(name);
  if (notice !== undefined) onDeprecated?.(notice);
  return canonical;
}

/**
 * The canonical preset name of a stored record's `name` (a job's config, a session row, a
 * checkpoint's config.json, written before the rename or after): deprecated aliases and bare
 * `pi0` / `pi05` resolve to the small presets they named then, silently; a `+custom` suffix
 * (makeConfig's mark of overridden sizes) is kept.
 * @throws ConfigError('unknown_preset') for a name that was never a preset.
 */
export function resolveStoredPreset(name: string): string {
  const custom = name.endsWith('+custom');
  const bare = custom ? name.slice(0, -'+custom'.length) : name;
  const canonical = LEGACY_BARE_NAMES[bare] ?? PRESET_ALIASES[bare] ?? bare;
  if (!(canonical in PRESETS)) {
    throw new ConfigError('unknown_preset', `unknown preset '${name}'; known presets: ${PRESET_NAMES.join(', ')}`);
  }
  return custom ? `${canonical}+custom` : canonical;
}

function positiveInt(name: string, value: unknown): void {
  if (typeof value !== 'number' || !Number.isInteger(value) || value <= 0) {
    throw new ConfigError('bad_config', `${name} is ${String(value)}; it must be a positive integer`);
  }
}

/**
 * Builds a validated, frozen config from a preset (or deprecated alias, resolved silently; a
 * stored record's name goes through resolveStoredPreset first) and optional overrides; tests use
 * overrides for micro configs (e.g. `{ width: 16, depth: 1 }`). The `preset` field keeps the
 * preset name, with `+custom` appended when overrides change anything, so checkpoints of a
 * modified config are never mistaken for the preset.
 * Throws ConfigError: 'real_model' (bare pi0 / pi05), 'unknown_preset', or 'bad_config' for a non-positive size, a patch that
 * does not divide image_size, or an unknown variant.
 */
export function makeConfig(preset: string, overrides: Partial<ConfigFields> = {}): PolicyConfig {
  const name = resolvePreset(preset);
  const base = PRESETS[name]!;
  const fields: ConfigFields = { ...base, ...overrides };
  const changed = (Object.keys(overrides) as (keyof ConfigFields)[]).some((k) => overrides[k] !== base[k]);
  if (fields.variant !== 'pi0' && fields.variant !== 'pi05') {
    throw new ConfigError('bad_config', `variant is '${String(fields.variant)}'; expected 'pi0' or 'pi05'`);
  }
  for (const key of ['imageSize', 'patch', 'slots', 'width', 'depth', 'heads', 'headDim', 'mlpDim', 'maxTokenLen', 'stateDim', 'actionDim', 'horizon'] as const) {
    positiveInt(key, fields[key]);
  }
  if (fields.imageSize % fields.patch !== 0) {
    throw new ConfigError('bad_config', `patch ${fields.patch} does not divide image_size ${fields.imageSize}`);
  }
  if (fields.width % 2 !== 0) {
    throw new ConfigError('bad_config', `width is ${fields.width}; the sine-cosine time embedding needs an even width`);
  }
  const grid = fields.imageSize / fields.patch;
  return Object.freeze({
    preset: changed ? `${name}+custom` : name,
    ...fields,
    patchesPerSlot: grid * grid,
    patchDim: fields.patch * fields.patch * 3,
    vocab: 257,
    padToken: 256,
  });
}

/**
 * The parameter count of a config by MODEL.md's closed form (pure arithmetic, no tensors);
 * kernels/small/model.ts's parameter table must agree (a test checks both against the presets).
 * flow0-tiny 1,790,752; flow05-tiny 2,202,272; flow0-small 29,368,352; flow05-small 36,408,992.
 */
export function countParams(c: PolicyConfig): number {
  const w = c.width;
  const hd = c.heads * c.headDim;
  const linear = (i: number, o: number) => i * o + o; // D1: every linear has a bias
  const grid = c.imageSize / c.patch;
  const patchDim = c.patch * c.patch * 3;
  const embeddings =
    linear(patchDim, w) + grid * grid * w + c.slots * w + 257 * w + c.maxTokenLen * w + linear(c.actionDim, w) + c.horizon * w;
  const block = linear(w, 3 * hd) + linear(hd, w) + linear(w, c.mlpDim) + linear(c.mlpDim, w); // without norms
  const prefixLayer = block + 2 * w;
  const actionLayer = c.variant === 'pi0' ? block + 2 * w : block + 2 * linear(w, 3 * w);
  const variantParts =
    c.variant === 'pi0'
      ? linear(c.stateDim, w) + linear(2 * w, w) + linear(w, w)
      : 256 * w + c.stateDim * w + 2 * linear(w, w);
  const head = w + linear(w, c.actionDim); // final norm + velocity head
  return embeddings + variantParts + c.depth * (prefixLayer + actionLayer) + head;
}

/**
 * One line per preset with its parameter count and deprecated alias, e.g.
 * "flow0-tiny     1,790,752 parameters (deprecated alias: pi0-tiny)", then a line saying what
 * bare `pi0` / `pi05` name now.
 */
export function describePresets(): string {
  const rows = Object.keys(PRESETS).map((name) => {
    const aliases = Object.entries(PRESET_ALIASES).filter(([, v]) => v === name).map(([k]) => k);
    const count = countParams(makeConfig(name)).toLocaleString('en-US');
    return `${name.padEnd(12)} ${count.padStart(11)} parameters${aliases.length ? ` (deprecated alias: ${aliases.join(', ')})` : ''}`;
  });
  return rows.join('\n');
}
