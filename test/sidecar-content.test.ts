/**
 * job_start's body split off disk (server/sidecar/content.ts): `dataset_content` base64-decoded
 * into a file, JSON's `\/` escapes undone (also where one straddles two reads of the file),
 * other escapes refused by position, the other fields parsed.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { splitDatasetContent } from '../server/sidecar/content.ts';

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-content-'));
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

/** Split `json` (written to a file); the fields, the decoded bytes' count and the decoded file. */
async function split(json: string): Promise<{ fields: Record<string, unknown>; contentBytes: number | null; decoded: Buffer }> {
  const dir = fs.mkdtempSync(path.join(tmp, 'c-'));
  fs.writeFileSync(path.join(dir, 'body.json'), json);
  const r = await splitDatasetContent(path.join(dir, 'body.json'), path.join(dir, 'content'), 1024 * 1024);
  return { ...r, decoded: fs.readFileSync(path.join(dir, 'content')) };
}

describe('splitDatasetContent', () => {
  it('decodes base64 written with \\/ escapes, wherever the file\'s reads cut them', async () => {
    const bytes = Buffer.from(Array.from({ length: 3000 }, (_, i) => (i * 131 + 7) % 256));
    const b64 = bytes.toString('base64');
    expect(b64).toContain('/');
    const r = await split(JSON.stringify({ dataset: 'd', dataset_content: b64, num_train_steps: 3 }).replaceAll('/', '\\/'));
    expect(r.fields).toEqual({ dataset: 'd', dataset_content: true, num_train_steps: 3 });
    expect(r.contentBytes).toBe(3000);
    expect(r.decoded.equals(bytes)).toBe(true);
    // Nothing but escapes, over several 256 KiB reads; the leading spaces move the escapes'
    // backslashes onto both parities of each read's last byte.
    for (const pad of ['', ' ']) {
      const slashes = 4 * 100_000; // '////' is 0xff 0xff 0xff
      const all = await split(`${pad}{"dataset_content": "${'\\/'.repeat(slashes)}", "dataset": "d"}`);
      expect(all.contentBytes).toBe((slashes / 4) * 3);
      expect(all.decoded.every((b) => b === 0xff)).toBe(true);
      expect(all.fields).toEqual({ dataset_content: true, dataset: 'd' });
    }
  });

  it('refuses other escapes with their position, and a string that never ends', async () => {
    await expect(split('{"dataset_content": "QUJD\\nRA=="}')).rejects.toThrow('dataset_content is not valid base64 (an escape other than \\/ at character 4)');
    await expect(split('{"dataset_content": "QUJD\\"RA=="}')).rejects.toThrow('dataset_content is not valid base64 (an escape other than \\/ at character 4)');
    await expect(split('{"dataset_content": "QUJDRA==')).rejects.toThrow('body is not valid JSON: it ends inside dataset_content');
  });
});
