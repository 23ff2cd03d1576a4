/**
 * Issue 23's preset names: the small presets are flow0-tiny, flow05-tiny, flow0-small,
 * flow05-small; their old names (pi0-tiny, ...) stay accepted everywhere, with one warning line
 * in a new request; bare pi0 / pi05 name the real models (fine-tunes and sessions run them on a
 * base checkpoint; preset-only surfaces refuse them), while records stored before the rename
 * (jobs, sessions, checkpoints) still read them as the small ones.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { ConfigError } from '../kernels/errors.ts';
import { PRESETS, PRESET_ALIASES, describePresets, makeConfig, resolvePreset, resolveStoredPreset } from '../kernels/small/index.ts';
import { checkCompatible, loadCheckpoint, saveCheckpoint } from '../kernels/checkpoint.ts';
import { parseFineTuneConfig } from '../server/jobs/config.ts';
import { parseSessionConfig } from '../server/sessions/sessions.ts';
import { policyMeta } from '../server/policy/meta.ts';
import { readCheckpointConfig } from '../server/policy/cli.ts';
import { runCli } from '../server/cli/main.ts';
import { describeRealModels } from '../server/models/presets.ts';
import { log } from '../server/log.ts';
import { G1_DIR } from '../bench/harness/g1.ts';
import { STUB_CONFIG, STUB_INFO, STUB_STATS, stubEngine } from '../bench/harness/policy-stub.ts';
import { api, startTestServer, type TestServer } from './helpers/server.ts';

const OLD_TO_NEW = { 'pi0-tiny': 'flow0-tiny', 'pi05-tiny': 'flow05-tiny', 'pi0-small': 'flow0-small', 'pi05-small': 'flow05-small' };
const REAL_PI05 = 'pi05 is the real pi0.5 (PaliGemma 3B + Gemma 300M expert), not a small preset; the small pi0.5-style preset is flow05-small';
const REAL_PI0 = 'pi0 is the real pi0 (PaliGemma 3B + Gemma 300M expert), not a small preset; the small pi0-style preset is flow0-small';

/** The warning lines logged while `f` runs. */
function warnings(f: () => void): string[] {
  const spy = vi.spyOn(log, 'warn').mockImplementation(() => {});
  try {
    f();
    return spy.mock.calls.map((c) => String(c[0]));
  } finally {
    spy.mockRestore();
  }
}

function refusal(f: () => unknown): { status?: number; message: string } {
  try {
    f();
  } catch (e) {
    return { status: (e as { status?: number }).status, message: (e as Error).message };
  }
  throw new Error('expected a refusal');
}

describe('kernels: names', () => {
  it('the presets are the flow names; each old name resolves to its new one with one warning naming it', () => {
    expect(Object.keys(PRESETS)).toEqual(['flow0-tiny', 'flow05-tiny', 'flow0-small', 'flow05-small']);
    expect(PRESET_ALIASES).toEqual(OLD_TO_NEW);
    for (const [old, now] of Object.entries(OLD_TO_NEW)) {
      const lines: string[] = [];
      expect(resolvePreset(old, (l) => lines.push(l))).toBe(now);
      expect(lines).toEqual([`preset name '${old}' is deprecated; it is now '${now}' (the same model)`]);
      expect(makeConfig(old)).toEqual(makeConfig(now)); // the same model, under its new name
      const quiet: string[] = [];
      expect(resolvePreset(now, (l) => quiet.push(l))).toBe(now);
      expect(quiet).toEqual([]);
    }
    expect(makeConfig('pi0-tiny').preset).toBe('flow0-tiny');
  });

  it('bare pi0 / pi05 are the real models: refused with one line naming the small preset', () => {
    for (const [name, line] of [['pi0', REAL_PI0], ['pi05', REAL_PI05]] as const) {
      const e = refusal(() => resolvePreset(name));
      expect(e.message).toBe(line);
      expect(() => makeConfig(name)).toThrow(ConfigError);
      try {
        makeConfig(name);
      } catch (err) {
        expect((err as ConfigError).code).toBe('real_model');
      }
    }
  });

  it('a stored name resolves as it meant then: old names, bare pi0 / pi05 (the small ones), +custom kept', () => {
    expect(resolveStoredPreset('pi0')).toBe('flow0-small');
    expect(resolveStoredPreset('pi05')).toBe('flow05-small');
    for (const [old, now] of Object.entries(OLD_TO_NEW)) expect(resolveStoredPreset(old)).toBe(now);
    expect(resolveStoredPreset('pi0-tiny+custom')).toBe('flow0-tiny+custom');
    expect(resolveStoredPreset('flow05-tiny')).toBe('flow05-tiny');
    expect(() => resolveStoredPreset('pi1')).toThrow(/unknown preset 'pi1'/);
  });

  it('`vela presets` lists the new names with their parameter counts and deprecated aliases', async () => {
    let text = '';
    const out = vi.spyOn(process.stdout, 'write').mockImplementation((t) => ((text += String(t)), true));
    try {
      expect(await runCli(['presets'], () => {})).toBe(0);
    } finally {
      out.mockRestore();
    }
    expect(text).toBe(`${describePresets()}\n${describeRealModels()}\n`);
    const lines = text.trim().split('\n');
    expect(lines[0]).toBe('flow0-tiny     1,790,752 parameters (deprecated alias: pi0-tiny)');
    expect(lines[1]).toBe('flow05-tiny    2,202,272 parameters (deprecated alias: pi05-tiny)');
    expect(lines[2]).toBe('flow0-small   29,368,352 parameters (deprecated alias: pi0-small)');
    expect(lines[3]).toBe('flow05-small  36,408,992 parameters (deprecated alias: pi05-small)');
    // The real models with the counts of LeRobot's state dicts less the two unused LM heads
    // (shared/spec/real-pi FACTS 0) and the command that gets each (issue 32 item 6).
    expect(lines[4]).toMatch(/^pi0 +3,238,048,528 parameters, the real pi0 .*; get it: vela models download lerobot\/pi0_base$/);
    expect(lines[5]).toMatch(/^pi05 +3,353,433,872 parameters, the real pi0\.5 .*; get it: vela models download lerobot\/pi05_base$/);
    expect(lines[6]).toContain('"base_model"');
    expect(lines[7]).toBe('(a job or session stored before the small presets were renamed, whose model reads pi0 / pi05, still loads as flow0-small / flow05-small)');
    expect(text).not.toContain('not served');
  });
});

describe('stored records', () => {
  it('a stored job config with an old or bare name re-validates as the small preset, silently', () => {
    const cases: [string, string][] = [['pi0-tiny', 'flow0-tiny'], ['pi05-small', 'flow05-small'], ['pi0', 'flow0-small'], ['pi05', 'flow05-small']];
    for (const [stored, now] of cases) {
      const lines = warnings(() => expect(parseFineTuneConfig({ model: stored, dataset_name: 'd', finetune: 'full' }, { stored: true }).model).toBe(now));
      expect(lines).toEqual([]);
    }
  });

  let dir = '';
  beforeAll(() => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-preset-names-'));
  });
  afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

  it('a checkpoint whose config.json names an old or bare preset loads into the engine of the new name', async () => {
    const weights = { w: { shape: [2], data: new Float32Array([1.5, -2]) } };
    for (const [stored, engine] of [['pi0-tiny', 'flow0-tiny'], ['pi05', 'flow05-small'], ['pi0-tiny+custom', 'flow0-tiny+custom']] as const) {
      const ck = path.join(dir, stored);
      await saveCheckpoint(ck, { config: { preset: stored }, weights });
      const got = await loadCheckpoint(ck, { preset: engine });
      expect(got.config.preset).toBe(stored);
      expect(Array.from(got.weights!.w!.data)).toEqual([1.5, -2]);
    }
    await expect(loadCheckpoint(path.join(dir, 'pi05'), { preset: 'flow0-small' })).rejects.toThrow('checkpoint is for preset pi05; this session runs flow0-small');
    expect(() => checkCompatible({ preset: 'pi05-tiny' }, { preset: 'flow0-tiny' })).toThrow(/checkpoint is for preset pi05-tiny/);
  });

  it('vela policy reads an old or bare stored preset as the small preset it named', () => {
    for (const [stored, now] of [['pi05-tiny', 'flow05-tiny'], ['pi0', 'flow0-small'], ['flow0-tiny', 'flow0-tiny']] as const) {
      const ck = path.join(dir, `policy-${stored}`);
      fs.mkdirSync(ck, { recursive: true });
      fs.writeFileSync(path.join(ck, 'config.json'), JSON.stringify({ preset: stored, base_seed: 3 }));
      expect(readCheckpointConfig(ck)).toEqual({ preset: now, baseSeed: 3 });
    }
  });

  it("a policy checkpoint's old preset name is served by the engine of the new name", () => {
    expect(STUB_INFO.preset).toBe('flow0-tiny');
    expect(policyMeta(STUB_INFO, { ...STUB_CONFIG, preset: 'pi0-tiny' }, STUB_STATS).actionHorizon).toBe(STUB_CONFIG.action_horizon);
    expect(() => policyMeta(STUB_INFO, { ...STUB_CONFIG, preset: 'pi05-tiny' }, STUB_STATS)).toThrow(/preset is pi05-tiny but the engine runs flow0-tiny/);
  });
});

describe('new requests', () => {
  it('a fine-tune or session naming an old preset works under the new name and logs one warning', () => {
    let cfg;
    const ft = warnings(() => (cfg = parseFineTuneConfig({ model: 'pi05-tiny', dataset_name: 'd' })));
    expect(cfg!.model).toBe('flow05-tiny');
    expect(ft).toEqual(["fine-tune: preset name 'pi05-tiny' is deprecated; it is now 'flow05-tiny' (the same model)"]);
    let s;
    const ss = warnings(() => (s = parseSessionConfig({ base_model: 'pi0-small' })));
    expect(s!.base_model).toBe('flow0-small');
    expect(ss).toEqual(["session: preset name 'pi0-small' is deprecated; it is now 'flow0-small' (the same model)"]);
    expect(warnings(() => parseSessionConfig({ base_model: 'flow0-small' }))).toEqual([]);
  });

  it('bare pi0 / pi05 in a fine-tune or a session mean the real models, on their public base checkpoints by default', () => {
    expect(parseFineTuneConfig({ model: 'pi05', dataset_name: 'd' })).toMatchObject({ model: 'pi05', base: 'lerobot/pi05_base', finetune: 'lora' });
    expect(parseSessionConfig({ base_model: 'pi0' })).toMatchObject({ base_model: 'pi0', base: 'lerobot/pi0_base', finetune: 'lora' });
  });

  it('vela finetune --model pi05 with its base not downloaded exits 2 with one line naming the fix', async () => {
    const REPO = path.resolve(import.meta.dirname, '..');
    const rel = path.relative(REPO, G1_DIR);
    const cwd = process.cwd();
    const cache = process.env.HF_HUB_CACHE;
    process.env.HF_HUB_CACHE = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-empty-hf-'));
    process.chdir(REPO);
    try {
      let text = '';
      expect(await runCli(['finetune', '--dataset', rel, '--model', 'pi05'], (t) => (text += t))).toBe(2);
      expect(text).toMatch(/--model pi05: base lerobot\/pi05_base is not in the Hugging Face cache .*`vela models download lerobot\/pi05_base`/);
      expect(text.trim().split('\n')).toHaveLength(1);
    } finally {
      process.chdir(cwd);
      if (cache === undefined) delete process.env.HF_HUB_CACHE;
      else process.env.HF_HUB_CACHE = cache;
    }
  });

  describe('over HTTP', () => {
    let server: TestServer;
    beforeAll(async () => {
      server = await startTestServer({ engineFactory: async () => stubEngine() });
    });
    afterAll(async () => server?.close());
    afterEach(() => vi.restoreAllMocks());

    it('POST /v1/training_sessions: pi05 is the real model (a 400 while its base is not downloaded), pi0-tiny makes a flow0-tiny session and one warning', async () => {
      const cache = process.env.HF_HUB_CACHE;
      process.env.HF_HUB_CACHE = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-empty-hf-'));
      try {
        const refused = await api(server, 'POST', '/v1/training_sessions', { base_model: 'pi05' });
        expect(refused.status).toBe(400);
        expect(refused.json.error).toMatch(/^base lerobot\/pi05_base is not in the Hugging Face cache .*vela models download lerobot\/pi05_base/);
      } finally {
        if (cache === undefined) delete process.env.HF_HUB_CACHE;
        else process.env.HF_HUB_CACHE = cache;
      }
      const spy = vi.spyOn(log, 'warn');
      const ok = await api(server, 'POST', '/v1/training_sessions', { base_model: 'pi0-tiny' });
      expect(ok.status).toBe(200);
      expect(ok.json.base_model).toBe('flow0-tiny');
      expect(spy.mock.calls.map((c) => String(c[0])).filter((l) => l.includes('deprecated'))).toEqual([
        "session: preset name 'pi0-tiny' is deprecated; it is now 'flow0-tiny' (the same model)",
      ]);
    });

    it('an old name and its new one share one engine (a checkpoint stored as pi0-tiny runs on flow0-tiny)', async () => {
      expect(await server.sessions.engineFor('pi0-tiny')).toBe(await server.sessions.engineFor('flow0-tiny'));
      expect(await server.sessions.policyEngineFor('pi0')).toBe(await server.sessions.policyEngineFor('flow0-small'));
    });

    it("the sidecar's job_start: model_size pi05 is the real model (not refused for its name); 4b lists what is", async () => {
      const r = await api(server, 'POST', '/training/job_start', { dataset: 'pick', model_size: 'pi05' });
      expect(r.status).toBe(400);
      expect(r.json.error).toBe('dataset "pick" is not under the datasets root and no dataset_content was sent');
      const size = await api(server, 'POST', '/training/job_start', { dataset: 'pick', model_size: '4b' });
      expect(size.status).toBe(400);
      expect(size.json.error).toMatch(/^model_size must be pi0 or pi05 \(the real models, on `base`: a Hub id or a checkpoint folder\) or a Vela preset: flow0-tiny, /);
    });
  });
});
