/**
 * Command-line arguments shared by every `vela` command: flags split from positionals, and
 * mistakes reported as one line that names the flag and the value as the user typed them
 * (`--steps abc: must be an integer in 1..1000000`). `vela` prints a UsageError as
 * `vela <command>: <message>` and exits 2, without a stack trace (server/cli/main.ts).
 */
import { resemblance } from '../../protocol/resemble.ts';

/** A mistake in how a command was called (a flag, a value, a missing argument). Exit code 2. */
export class UsageError extends Error {
  readonly code = 'usage';
  constructor(message: string) {
    super(message);
    this.name = 'UsageError';
  }
}

/** One flag as given: `typed` is how it appeared (`--steps abc` or `--steps=abc`; `--debug`). */
export interface FlagArg {
  flag: string;
  value: string;
  typed: string;
}

/** Each known flag of a command: `value` takes one argument, `switch` none. */
export type FlagSpec = Record<string, 'value' | 'switch'>;

/** A value as the user would type it: bare when it is one plain word, else JSON-quoted. */
export function shown(value: string): string {
  return /^[\w.,:/@+~=-]+$/.test(value) ? value : JSON.stringify(value);
}

/**
 * Splits `argv` into the flags of `spec` (`--flag value` and `--flag=value`) and positionals.
 * `help` is the command to point at, e.g. `vela finetune --help`.
 * @throws UsageError for an unknown flag, a flag without its value, or a value given to a switch.
 */
export function splitArgs(argv: readonly string[], spec: FlagSpec, help: string): { flags: FlagArg[]; positional: string[] } {
  const flags: FlagArg[] = [];
  const positional: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (!a.startsWith('-') || a === '-') {
      positional.push(a);
      continue;
    }
    const eq = a.indexOf('=');
    const flag = a.startsWith('--') && eq > 0 ? a.slice(0, eq) : a;
    const kind = spec[flag];
    if (!kind) {
      const like = flag.startsWith('--') ? resemblance(flag.slice(2), Object.keys(spec).filter((f) => f.startsWith('--')).map((f) => f.slice(2))) : null;
      throw new UsageError(`unknown option ${shown(flag)} (${like ? `did you mean --${like}? ` : ''}see ${help})`);
    }
    if (kind === 'switch') {
      if (eq > 0) throw new UsageError(`${shown(a)}: ${flag} takes no value`);
      flags.push({ flag, value: '', typed: flag });
    } else if (eq > 0) {
      flags.push({ flag, value: a.slice(eq + 1), typed: `${flag}=${shown(a.slice(eq + 1))}` });
    } else {
      const v = argv[i + 1];
      if (v === undefined || (v.startsWith('--') && spec[v.split('=')[0]!] !== undefined)) throw new UsageError(`${flag} needs a value (see ${help})`);
      i++;
      flags.push({ flag, value: v, typed: `${flag} ${shown(v)}` });
    }
  }
  return { flags, positional };
}

/** `--flag value: <rule>`: the message of a value that breaks the flag's rule. */
export function badValue(arg: FlagArg, rule: string): UsageError {
  return new UsageError(`${arg.typed}: ${rule}`);
}

/**
 * An integer flag in lo..hi.
 * @throws UsageError `--port abc: must be an integer in 0..65535`.
 */
export function intArg(arg: FlagArg, lo: number, hi: number): number {
  const n = Number(arg.value);
  if (arg.value.trim() === '' || !Number.isInteger(n) || n < lo || n > hi) throw badValue(arg, `must be an integer in ${lo}..${hi}`);
  return n;
}

/**
 * A number flag in lo..hi.
 * @throws UsageError `--batch-window-ms x: must be a number in 0..10000`.
 */
export function numberArg(arg: FlagArg, lo: number, hi: number): number {
  const n = Number(arg.value);
  if (arg.value.trim() === '' || !Number.isFinite(n) || n < lo || n > hi) throw badValue(arg, `must be a number in ${lo}..${hi}`);
  return n;
}

/**
 * One of a fixed list of words.
 * @throws UsageError `--log-level loud: must be one of error, warn, info, debug`.
 */
export function choiceArg<T extends string>(arg: FlagArg, choices: readonly T[]): T {
  if (!(choices as readonly string[]).includes(arg.value)) throw badValue(arg, `must be one of ${choices.join(', ')}`);
  return arg.value as T;
}
