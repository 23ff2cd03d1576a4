/**
 * Bounds on LoRA settings shared by sessions (server/sessions/sessions.ts), fine-tunes
 * (server/jobs/config.ts) and xorl's lora_config (which becomes a session's).
 */

/**
 * The largest LoRA alpha accepted (VLM and action expert alike). alpha / rank scales every
 * adapter's output, so a huge alpha (1e308) overflows float32 and turns every output to NaN
 * silently; openpi uses 16 / 32, and 65536 leaves room for any rank up to 256 with scales far
 * beyond anything that trains.
 */
export const MAX_LORA_ALPHA = 65536;

/**
 * Why `alpha` is not a LoRA alpha, as a rule after the field's name, or null when it is.
 * @param alpha the client's value, any JSON.
 */
export function loraAlphaProblem(alpha: unknown): string | null {
  if (typeof alpha !== 'number' || !(alpha > 0) || !Number.isFinite(alpha)) return 'must be a number > 0';
  if (alpha > MAX_LORA_ALPHA) return `must be <= ${MAX_LORA_ALPHA} (alpha / rank scales the adapter's output: a larger one overflows float32 and every output turns NaN)`;
  return null;
}
