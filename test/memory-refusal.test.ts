/**
 * Memory planning through the real server (issue 24): what would not fit in --max-memory is
 * refused before anything loads, with one line naming the estimate, what is available and the
 * fix: a session on a real base and a fine-tune (HTTP 507, nothing left open), and `vela policy
 * --base` (exit 1). With room, the same requests go through and the plan is reported in the
 * session's info and in /health.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { VelaClient } from '../protocol/client.ts';
import { ConfigError, loadConfig } from '../server/config.ts';
import { HttpError } from '../server/http/http.ts';
import { g1Subset } from '../bench/harness/g1.ts';
import { writeTinyBase } from './helpers/real-pi-base.ts';
import { api, startTestServer, type TestServer } from './helpers/server.ts';

const LINE = /needs about [\d.]+ [KMG]?B \(.*\); [\d.]+ [KMG]?B is available \(--max-memory [\d.]+ [KMG]?B less [\d.]+ [KMG]?B in use\): .*raise --max-memory/;

let base: string;
let datasets: string;
beforeAll(async () => {
  base = await writeTinyBase('pi05');
  datasets = g1Subset(2).root;
});

it('vela serve refuses a --max-memory that is no size at start, in one line', () => {
  for (const v of ['abc', '0', '-1', '1e400', '0GiB']) {
    expect(() => loadConfig(['--max-memory', v], {}), v).toThrow(ConfigError);
  }
  expect(() => loadConfig(['--max-memory', 'abc'], {})).toThrow(/^--max-memory is "abc"; expected bytes with a unit, e\.g\. 8GiB/);
  expect(loadConfig(['--max-memory', '8 GiB'], {}).config.maxMemory).toBe('8 GiB');
});

describe('too little memory', () => {
  let server: TestServer;
  beforeAll(async () => {
    // Less than this process already holds: nothing more fits.
    server = await startTestServer({ env: { VELA_MAX_MEMORY: '64MiB', VELA_DATASETS_DIR: datasets } });
  });
  afterAll(() => server.close());

  it('refuses a session and a fine-tune with one line naming the estimate and the fix; nothing is left open', async () => {
    const s = await api(server, 'POST', '/v1/training_sessions', { base_model: 'pi05', base });
    expect(s.status).toBe(507);
    expect(s.json.error).toMatch(/^a LoRA session of pi05 \(.*\) needs about /);
    expect(s.json.error).toMatch(LINE);
    expect(s.json.error).not.toContain('\n');
    expect((await api(server, 'GET', '/v1/training_sessions')).json.data).toEqual([]);
    expect(server.sessions.runningEngines()).toEqual([]);

    const j = await api(server, 'POST', '/v1/fine-tunes', { model: 'pi05', base, dataset_name: 'g1_subset', batch_size: 2, steps: 2 });
    expect(j.status).toBe(507);
    // Refused only when even micro-batches of 1 (gradient accumulation, issue 34) do not fit.
    expect(j.json.error).toMatch(/^a LoRA fine-tune of pi05 \(.*\) at batch_size 2 in micro-batches of 1 needs about /);
    expect(j.json.error).toMatch(LINE);
    expect((await api(server, 'GET', '/v1/fine-tunes')).json.data).toEqual([]);
  });

  it('refuses a fine-tune of a small preset whose step would not fit even in micro-batches of 1 (issue 33: batch_size up to 1,024; issue 34)', async () => {
    const j = await api(server, 'POST', '/v1/fine-tunes', { model: 'flow0-small', dataset_name: 'g1_subset', batch_size: 1024, steps: 2 });
    expect(j.status).toBe(507);
    expect(j.json.error).toMatch(/^a fine-tune of flow0-small at batch_size 1024 in micro-batches of 1 needs about [\d.]+ [MG]B .*\(activations /);
    expect(j.json.error).toMatch(LINE);
    expect(j.json.error).not.toContain('use LoRA');
    expect((await api(server, 'GET', '/v1/fine-tunes')).json.data).toEqual([]);
  });
});

describe('room enough', () => {
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer({ env: { VELA_MAX_MEMORY: '20GiB' } }); // below this machine's memory, so the cap is the limit
  });
  afterAll(() => server.close());

  it('refuses a base whose config asks for a million layers in one line, at once, and stays up', async () => {
    const huge = await writeTinyBase('pi05');
    const file = path.join(huge, 'config.json');
    const cfg = JSON.parse(fs.readFileSync(file, 'utf8'));
    cfg.vela_real_pi_config.vlm.depth = 1e6;
    cfg.vela_real_pi_config.expert.depth = 1e6;
    fs.writeFileSync(file, JSON.stringify(cfg));
    for (const [route, body] of [['/v1/training_sessions', { base_model: 'pi05', base: huge }], ['/v1/fine-tunes', { model: 'pi05', base: huge, dataset_name: 'x' }]] as const) {
      const r = await api(server, 'POST', route, body);
      expect(r.status, route).toBe(400);
      expect(r.json.error).toMatch(/vlm\.depth is 1000000; at most 512 for a pi0 \/ pi0\.5 config$/);
    }
    expect((await api(server, 'GET', '/healthz', undefined, null)).status).toBe(200);
    fs.rmSync(path.dirname(huge), { recursive: true, force: true });
  });

  it('frees the engines of bases nothing uses before a plan refuses: closed sessions leave their base until then', async () => {
    const client = new VelaClient(server.baseUrl, server.apiKey);
    const bases = [await writeTinyBase('pi05'), await writeTinyBase('pi0')];
    const ids: string[] = [];
    for (const [i, b] of bases.entries()) ids.push((await client.waitReady((await client.createSession({ base_model: i === 0 ? 'pi05' : 'pi0', base: b } as never)).id)).id);
    const busy = (await client.waitReady((await client.createSession({ base_model: 'pi05', base: bases[0] } as never)).id)).id;
    for (const id of ids) await api(server, 'POST', `/v1/training_sessions/${id}/close`);
    const before = server.sessions.runningEngines().length;
    // The pi05 base still has a session; the pi0 base has none: only its engine goes.
    expect(await server.sessions.releaseIdleEngines()).toBe(1);
    expect(server.sessions.runningEngines().length).toBe(before - 1);
    // A plan that does not fit frees idle bases and is tried again; one that still does not fit stays refused.
    let tries = 0;
    const refusal = new HttpError(507, 'does not fit');
    await api(server, 'POST', `/v1/training_sessions/${busy}/close`);
    expect(await server.sessions.planFreeing(async () => (++tries === 1 ? Promise.reject(refusal) : 'planned'))).toBe('planned');
    expect(tries).toBe(2);
    await expect(server.sessions.planFreeing(async () => Promise.reject(refusal))).rejects.toBe(refusal); // nothing left to free
    for (const b of bases) fs.rmSync(path.dirname(b), { recursive: true, force: true });
  });

  it('plans the session, reports planned and held bytes in its info and /health', async () => {
    const client = new VelaClient(server.baseUrl, server.apiKey);
    const s = await client.waitReady((await client.createSession({ base_model: 'pi05', base } as never)).id);
    const info = (await api(server, 'GET', `/v1/training_sessions/${s.id}`)).json;
    // The base (not loaded before) and the tenant: the tiny base's 370,112 params in float32 and more.
    expect(info.memory.planned_bytes).toBeGreaterThan(370_112 * 4);
    expect(info.memory.tenant_bytes).toBeGreaterThan(0);
    const health = (await api(server, 'GET', '/health', undefined, null)).json;
    expect(health.engines).toEqual(['pi05']);
    expect(health.memory.limit_bytes).toBe(20 * 2 ** 30);
    expect(health.memory.limit_source).toBe('--max-memory');
    const engine = health.memory.engines.find((e: { model: string }) => e.model === 'pi05');
    expect(engine.base_params).toBe(370_112);
    expect(engine.tensor_bytes).toBeGreaterThanOrEqual(370_112 * 4);
    expect(JSON.stringify(health)).not.toContain(base); // no server paths to unauthenticated callers
  });
});

it('vela policy --base refuses what does not fit before loading: one line, exit 1', async () => {
  const proc = spawn(process.execPath, ['bin/vela.js', 'policy', '--base', base, '--port', '0', '--backend', 'wasm'], { env: { ...process.env, VELA_MAX_MEMORY: '64MiB' }, stdio: ['ignore', 'pipe', 'pipe'] });
  let err = '';
  proc.stderr!.on('data', (b) => (err += b));
  const code = await new Promise<number | null>((r) => proc.once('exit', r));
  expect(code).toBe(1);
  const lines = err.trim().split('\n').filter((l) => l.startsWith('vela policy:'));
  expect(lines).toHaveLength(1);
  expect(lines[0]).toMatch(/^vela policy: serving pi05 from .* needs about .* is available \(VELA_MAX_MEMORY .*raise VELA_MAX_MEMORY/);
});

it('vela finetune on a real base refuses what does not fit before loading: one line, exit 1, nothing written', async () => {
  const out = path.join(path.dirname(base), 'ft-out');
  const proc = spawn(process.execPath, ['bin/vela.js', 'finetune', '--model', 'pi05', '--base', base, '--dataset', path.join(datasets, 'g1_subset'), '--steps', '2', '--batch-size', '2', '--output', out, '--backend', 'wasm'],
    { env: { ...process.env, VELA_MAX_MEMORY: '64MiB' }, stdio: ['ignore', 'pipe', 'pipe'] });
  let err = '';
  proc.stderr!.on('data', (b) => (err += b));
  const code = await new Promise<number | null>((r) => proc.once('exit', r));
  expect(code).toBe(1);
  const lines = err.trim().split('\n').filter((l) => l.startsWith('vela finetune:') && l.includes('needs about'));
  expect(lines).toHaveLength(1);
  expect(lines[0]).toMatch(/^vela finetune: a LoRA fine-tune of pi05 \(.*\) at batch_size 2 in micro-batches of 1 needs about .* is available \(VELA_MAX_MEMORY .*raise VELA_MAX_MEMORY/);
  expect(lines[0]).not.toMatch(/use LoRA/);
  expect(fs.existsSync(out)).toBe(false);
});

afterAll(() => fs.rmSync(path.dirname(base), { recursive: true, force: true }));
