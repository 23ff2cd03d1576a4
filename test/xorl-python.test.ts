/**
 * An xorl-style Python client (test/python/xorl_client_check.py, written from xorl's API
 * reference alone) against the real server and engine: its own model ids, the two-phase futures
 * pattern, Tinker's input wrappers and xorl's field names, and recovery by "restart from the last
 * checkpoint" (kill, create_model again, load_weights by the path save_weights returned), whose
 * next step must equal an uninterrupted twin's. Needs python3 (standard library only).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runPythonJson } from './helpers/python.ts';
import { startTestServer, type TestServer } from './helpers/server.ts';


let server: TestServer;
let seen: any;
beforeAll(async () => {
  server = await startTestServer({ env: { VELA_FUTURE_WAIT_S: '0.5' } });
  seen = await runPythonJson('xorl_client_check.py', [server.baseUrl, server.apiKey], 240_000);
}, 300_000);
afterAll(() => server?.close());

describe('an xorl-style Python client', () => {
  it('sees xorl\'s health shapes, the key-less Tinker alias and root info as JSON', () => {
    expect(seen.health).toMatchObject({ status: 'healthy', engine_running: false });
    expect(seen.healthz_without_key).toEqual({ status: 'ok' });
    expect(seen.root).toMatchObject({ name: 'vela', apis: { xorl_tinker: `${server.baseUrl}/api/v1` } });
  });

  it('names its models, and a taken name is a 409', () => {
    expect(seen.created.policy.ack_model_id).toBe('policy');
    expect(seen.created.policy.ready).toMatchObject({ model_id: 'policy', status: 'ready', base_model: 'flow05-tiny', finetune: 'lora', rank: 4, alpha: 8 });
    expect(seen.created.policy.ready.training_session_id).toMatch(/^ts-/);
    expect(seen.duplicate.error).toBe('model_id "policy" is taken by an open model of this key; kill_session or unload_model it first, or pick another name');
    expect(seen.heartbeat.models.sort()).toEqual(['policy', 'twin']);
  });

  it('trains both models alike, with forward_backward_input, adam_params and gradient_clip', () => {
    for (const row of seen.steps) {
      expect(row.policy).toEqual(row.twin);
      expect(row.policy.skipped).toBe(false);
      expect(row.policy.grad_norm).toBeGreaterThan(0);
    }
    expect(seen.steps[1].policy.loss).not.toBe(seen.steps[0].policy.loss);
  });

  it('after kill, create_model and load_weights by the saved path, takes the step the twin takes', () => {
    const id = seen.created.policy.ready.training_session_id;
    expect(seen.saved.checkpoint_id).toMatch(new RegExp(`^${id}/states/ckpt-\\d{8}T\\d{6}Z-[0-9a-f]{6}$`));
    expect(seen.list_checkpoints.checkpoints.map((c: any) => c.checkpoint_id)).toEqual([seen.saved.checkpoint_id]);
    expect(seen.weights_info).toMatchObject({ checkpoint_id: seen.saved.checkpoint_id, base_model: 'flow05-tiny', is_lora: true, lora_rank: 4, lora_alpha: 8, has_optimizer_state: true });
    expect(seen.killed).toEqual({ model_id: 'policy', status: 'closed' });
    expect(seen.recreated.training_session_id).not.toBe(id);
    expect(seen.loaded).toMatchObject({ path: seen.saved.path, checkpoint_id: seen.saved.checkpoint_id });
    expect(seen.after_policy).toEqual(seen.after_twin);
    expect(seen.after_policy.loss).not.toBe(seen.steps[1].twin.loss);
  });

  it('ignores unrelated unknown fields and names them; refuses a misspelling, naming the field it resembles', () => {
    expect(seen.ignored_ack).toMatchObject({ model_id: 'twin', ignored_fields: ['type'] });
    expect(seen.ignored_retrieve.loss).toBeGreaterThan(0);
    expect(seen.misspelt.error).toMatch(/^optim_step has no field "learnig_rate" \(did you mean "learning_rate"\?\)/);
  });

  it('lists training runs, and sleeps and wakes every model of the key', () => {
    const runs = seen.training_runs.training_runs;
    expect(runs.filter((r: any) => r.model_id === 'policy').map((r: any) => r.status).sort()).toEqual(['closed', 'ready']);
    expect(runs.find((r: any) => r.status === 'closed').last_checkpoint.checkpoint_id).toBe(seen.saved.checkpoint_id);
    expect(seen.sleep).toEqual({ status: 'sleeping', models: expect.arrayContaining(['policy', 'twin']), refused: [] });
    expect(seen.asleep_forward).toMatch(/asleep: call wake_up first/);
    expect(seen.wake_up).toMatchObject({ status: 'awake', refused: [] });
    expect(seen.awake_forward_keys).toEqual(['noise', 'target', 'time', 'velocity', 'x_t']);
  });
});
