/**
 * The largest seed `vela models init` takes, apart from init-checkpoint.ts so that the CLI's help
 * and argument parsing do not load the model code (half a second a process) to read it.
 */
/** Largest seed accepted (the seed is hashed as its decimal text; 2^32 - 1 keeps it one word). */
export const INIT_SEED_MAX = 0xffffffff;
