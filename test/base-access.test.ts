/**
 * Which folders a key may name as `base` (server/models/access.ts) on a server with more than one
 * user (no --allow-absolute-bases): a folder under the models folder, a fine-tune output of its
 * own; not any folder of the machine (no existence oracle either), not another key's fine-tune
 * output (the same words as a folder that is not there). Through the real server.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { nowS } from '../server/store/store.ts';
import { writeTinyBase } from './helpers/real-pi-base.ts';
import { api, startTestServer, type TestServer } from './helpers/server.ts';

let server: TestServer;
let outside: string;
beforeAll(async () => {
  server = await startTestServer({ env: { VELA_ALLOW_ABSOLUTE_BASES: '0' } });
  outside = await writeTinyBase('pi05');
});
afterAll(async () => {
  await server.close();
  fs.rmSync(path.dirname(outside), { recursive: true, force: true });
});

const RULE = /^base .+: a folder base must be under the server's models folder \(--models-dir\) or be one of this key's fine-tunes' model_dir, or the operator may allow any folder with --allow-absolute-bases; (name a folder under the models folder by its relative name: .+|there is no pi0 \/ pi0\.5 checkpoint folder under the models folder \(--models-dir\) nor in the Hugging Face cache yet; name a Hub id \(e\.g\. lerobot\/pi05_base\) once it is downloaded)$/;

describe('base folders on a shared server', () => {
  it('refuses a folder outside the models folder, existing or not, in the same words, for sessions, xorl and fine-tunes', async () => {
    // (A relative base is a name under the models folder: test/base-names.test.ts.)
    for (const base of [outside, '/etc', '/nonexistent/x', '/proc/self']) {
      const s = await api(server, 'POST', '/v1/training_sessions', { base_model: 'pi05', base });
      expect(s.status, base).toBe(400);
      expect(s.json.error).toMatch(RULE);
      const j = await api(server, 'POST', '/v1/fine-tunes', { model: 'pi05', base, dataset_name: 'x' });
      expect(j.status, base).toBe(400);
      expect(j.json.error).toMatch(RULE);
    }
    const x = await api(server, 'POST', '/api/v1/create_model', { model_id: 'm', base_model: 'pi05', base: outside });
    expect(x.status).toBe(400);
    expect(x.json.error ?? x.json.detail).toMatch(/a folder base must be under the server's models folder/);
    expect((await api(server, 'GET', '/v1/training_sessions')).json.data).toEqual([]);
  });

  it('takes a folder under the models folder', async () => {
    const dir = path.join(server.dataDir, 'models', 'tiny_pi05');
    await writeTinyBase('pi05', { dir });
    const s = await api(server, 'POST', '/v1/training_sessions', { base_model: 'pi05', base: dir });
    expect(s.status, JSON.stringify(s.json)).toBe(200);
    await api(server, 'POST', `/v1/training_sessions/${s.json.id}/close`);
  });

  it('takes its own fine-tune output; another key\'s reads as a folder that is not there', async () => {
    const owner = (await server.store.findApiKey(server.apiKey))!;
    const id = 'ft-accesstest01';
    const modelDir = path.join(server.dataDir, 'jobs', id, 'model');
    await writeTinyBase('pi05', { dir: modelDir });
    await server.store.insertJob({
      id, owner, status: 'succeeded', created_at: nowS(), config: { model: 'pi05', dataset_name: 'g1' },
      step: 1, loss: null, eval_loss: null, error: null, output_dir: path.join(server.dataDir, 'jobs', id, 'weights', 'final'), started_at: nowS(), finished_at: nowS(), cancel_requested: false,
    });
    const mine = await api(server, 'POST', '/v1/training_sessions', { base_model: 'pi05', base: modelDir });
    expect(mine.status, JSON.stringify(mine.json)).toBe(200);
    await api(server, 'POST', `/v1/training_sessions/${mine.json.id}/close`);
    const { key: other } = await server.store.createApiKey('other');
    for (const base of [modelDir, path.join(server.dataDir, 'jobs', id, 'weights', 'final'), path.join(server.dataDir, 'jobs', 'ft-nosuchjob', 'model')]) {
      const theirs = await api(server, 'POST', '/v1/training_sessions', { base_model: 'pi05', base }, other);
      expect(theirs.status).toBe(400);
      expect(theirs.json.error).toBe(`base ${base}: no such folder`.replace(server.dataDir, '<data dir>'));
    }
  });
});
