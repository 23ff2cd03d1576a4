/**
 * server/http/redact.ts: server folders never reach a client, and nothing else in a message changes.
 * A bare relative setting (`./datasets`, as the README starts the server) once turned every
 * "datasets" of every error into `<datasets dir>` ("--allow-absolute-<datasets dir>").
 */
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { hideServerPath, redactPaths } from '../server/http/redact.ts';

describe('redactPaths', () => {
  hideServerPath('./redact-sets', '<datasets dir>');
  hideServerPath('rel/redact-data', '<data dir>');

  it('replaces the folders, absolute or as given', () => {
    expect(redactPaths(`open ${path.resolve('redact-sets')}/g1/meta/info.json`)).toBe('open <datasets dir>/g1/meta/info.json');
    expect(redactPaths("open './redact-sets/g1/meta/info.json'")).toBe("open '<datasets dir>/g1/meta/info.json'");
    expect(redactPaths('in rel/redact-data/jobs')).toBe('in <data dir>/jobs');
    expect(redactPaths(`in ${path.resolve('rel/redact-data')}`)).toBe('in <data dir>');
  });

  it('leaves the same word alone where it is not the folder', () => {
    const prose = 'no such folder under the redact-sets root (--allow-absolute-redact-sets); you sent "../redact-sets/g1"';
    expect(redactPaths(prose)).toBe(prose);
  });
});
