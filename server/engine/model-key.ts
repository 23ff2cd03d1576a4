/**
 * The name of the model an engine holds, one string so that engines can be keyed, shared and
 * started by it: a small preset's name (`flow05-tiny`), or for the real pi0 / pi0.5 the variant
 * and the local checkpoint folder, `pi05@/abs/path/to/snapshot` (one engine, one frozen base in
 * memory, per folder, shared by every session, job and policy on it).
 */

/** What an engine model key names. */
export type EngineModel = { kind: 'preset'; preset: string } | { kind: 'real'; variant: 'pi0' | 'pi05'; dir: string };

/** The key of the real `variant` at checkpoint folder `dir` (an absolute path). */
export function realModelKey(variant: 'pi0' | 'pi05', dir: string): string {
  return `${variant}@${dir}`;
}

/** Whether `key` names a real pi0 / pi0.5 checkpoint (rather than a small preset). */
export function isRealModelKey(key: string): boolean {
  return /^pi05?@./.test(key);
}

/** Splits an engine model key (see the module comment). */
export function parseEngineModel(key: string): EngineModel {
  const m = /^(pi0|pi05)@(.+)$/s.exec(key);
  return m ? { kind: 'real', variant: m[1] as 'pi0' | 'pi05', dir: m[2]! } : { kind: 'preset', preset: key };
}
