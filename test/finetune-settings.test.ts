/**
 * The fine-tune settings of issue 16 reach the trainer and the events: the held-out split
 * (eval_fraction, eval_episodes, eval_dataset), the schedule (warmup_steps, lr_floor), AdamW's
 * eps and weight decay, the default fine-tune mode, and the held-out evaluation against its
 * baselines (overall, per action group, raw units). runFineTune runs on a recording engine stub
 * here (fast, exact: a stub that answers the truth must score 0), and once through `vela finetune`
 * on the real engine.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { computeNormStats, normalizerFor } from '../kernels/normalize.ts';
import { openDataset } from '../server/datasets/index.ts';
import type { EngineLike } from '../server/engine/host.ts';
import { evalSummary, finetuneCommand, parseFinetuneArgs } from '../server/jobs/cli.ts';
import { defaultWarmupSteps, parseFineTuneConfig, RECIPE } from '../server/jobs/config.ts';
import { learningRateAt, runFineTune, type RunContext } from '../server/jobs/train.ts';

const here = path.dirname(fileURLToPath(import.meta.url));
const FIXTURE = path.join(here, 'fixtures/lerobot_image');
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-ft-settings-'));
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

/** A copy of the image fixture (episodes of 3 and 4 frames) whose dims name arms and a gripper. */
function armDataset(name: string): string {
  const dir = path.join(tmp, name);
  fs.cpSync(FIXTURE, dir, { recursive: true });
  const infoFile = path.join(dir, 'meta/info.json');
  const info = JSON.parse(fs.readFileSync(infoFile, 'utf8'));
  info.features['observation.state'].names = ['left_shoulder', 'right_shoulder'];
  info.features.action.names = ['left_shoulder', 'right_shoulder', 'left_gripper'];
  fs.writeFileSync(infoFile, JSON.stringify(info, null, 2));
  return dir;
}

interface Call {
  op: string;
  args: Record<string, any>;
}

/** An engine that records every call; `sample` answers the batch's own (true) actions. */
function recordingEngine(): EngineLike & { calls: Call[] } {
  const calls: Call[] = [];
  return {
    calls,
    info: { preset: 'flow05-tiny', backend: 'stub', backendKind: 'stub', backendDevice: 'none', backendLine: 'backend stub', backendFallbacks: [], imageSize: 96, imageSlots: 3, stateDim: 32, actionDim: 32, actionHorizon: 16, maxTokenLen: 48, padToken: 256, family: 'small', baseDir: null, baseParams: 0 },
    async call<T>(_session: string, op: string, args: Record<string, any> = {}): Promise<T> {
      calls.push({ op, args });
      const n = args.batch ? args.batch.actions.length : 0;
      const answers: Record<string, unknown> = {
        create_session: { trainableParams: 7 },
        forward_backward: { loss: 1, lossPerDatum: new Float32Array(args.batch?.size ?? 0) },
        optim_step: { gradNorm: 0.5, skipped: false },
        forward: { velocity: new Float32Array(n), target: new Float32Array(n) },
        sample: { actions: args.batch?.actions.slice() },
        save_state: args.name,
        save_weights: path.join(tmp, 'weights'),
      };
      return { result: answers[op], pending_gradients: 0 } as T; // the worker's answer shape
    },
    stats: () => ({ queued: 0, sessions: 0, calls: calls.length }),
    close: async () => {},
  };
}

async function run(body: Record<string, unknown>, extra: Partial<RunContext> = {}) {
  const cfg = parseFineTuneConfig({ model: 'flow05-tiny', steps: 6, batch_size: 2, ...body });
  const engine = recordingEngine();
  const events: { type: string; data: Record<string, any> }[] = [];
  const workDir = fs.mkdtempSync(path.join(tmp, 'job-'));
  const result = await runFineTune(cfg, {
    jobId: 'job', datasetDir: cfg.dataset_name, workDir, engine, emit: (type, data) => events.push({ type, data }), isCancelled: () => false, ...extra,
  });
  return { cfg, engine, events, result, progress: events.filter((e) => e.type === 'progress').map((e) => e.data) };
}

describe('fine-tune config (POST /v1/fine-tunes and vela finetune)', () => {
  it('fills the recipe defaults: full fine-tune on the seeded base, 10% held out, warm-up a tenth of the run', () => {
    const cfg = parseFineTuneConfig({ model: 'flow05-tiny', dataset_name: 'd' });
    expect(cfg).toMatchObject({
      finetune: 'full', steps: RECIPE.steps, batch_size: RECIPE.batch_size, learning_rate: RECIPE.learning_rate, eval_fraction: 0.1, eval_episodes: null,
      eval_dataset: null, eval_stride: 4, warmup_steps: defaultWarmupSteps(RECIPE.steps), lr_floor: RECIPE.lr_floor, adam_eps: RECIPE.adam_eps, weight_decay: RECIPE.weight_decay,
      ema_decay: RECIPE.ema_decay, augment: RECIPE.augment, time_sampling: RECIPE.time_sampling, rtc_max_delay: 0,
    });
    // The recipe's model when none is named (vela finetune and POST /v1/fine-tunes alike).
    expect(parseFineTuneConfig({ dataset_name: 'd' })).toMatchObject({ model: RECIPE.model, finetune: 'full', ema_decay: 0.99, steps: 1500, batch_size: 32, learning_rate: 3e-4 });
    expect(parseFineTuneConfig({ model: 'flow05-tiny', dataset_name: 'd' }, { trainedBase: true }).finetune).toBe('lora');
    expect(parseFineTuneConfig({ model: 'flow05-tiny', dataset_name: 'd', finetune: 'lora' }).finetune).toBe('lora');
    expect(defaultWarmupSteps(300)).toBe(30);
    // A second dataset to evaluate on, or named held-out episodes: nothing else is held out by default.
    expect(parseFineTuneConfig({ model: 'flow05-tiny', dataset_name: 'd', eval_dataset: 'e' }).eval_fraction).toBe(0);
    expect(parseFineTuneConfig({ model: 'flow05-tiny', dataset_name: 'd', eval_episodes: [3, 1] }).eval_fraction).toBe(0);
  });

  it('refuses bad values with a 400 that names the field and the value', () => {
    const cases: [Record<string, unknown>, RegExp][] = [
      [{ eval_fraction: 1 }, /eval_fraction must be a number in \[0, 1\), got 1/],
      [{ eval_fraction: -0.1 }, /eval_fraction must be a number in \[0, 1\), got -0.1/],
      [{ eval_episodes: [1, 1] }, /eval_episodes must be a non-empty list of distinct episode indices, got \[1,1\]/],
      [{ eval_episodes: [] }, /eval_episodes must be a non-empty list/],
      [{ eval_episodes: [1], eval_dataset: 'e' }, /not both/],
      [{ eval_episodes: [1], eval_fraction: 0.2 }, /give eval_episodes or eval_fraction, not both/],
      [{ eval_stride: 0 }, /eval_stride must be an integer in 1..10000, got 0/],
      [{ warmup_steps: -1 }, /warmup_steps must be an integer in 0..1500, got -1/],
      [{ lr_floor: 1.5 }, /lr_floor must be a number in \[0, 1\], got 1.5/],
      [{ adam_eps: -1e-8 }, /adam_eps must be a number in \(0, 1\], at least 1.4e-45 \(the smallest float32\), got -1e-8/],
      [{ adam_eps: 0 }, /adam_eps must be a number in \(0, 1\], .*, got 0$/],
      [{ adam_eps: 1e-50 }, /adam_eps must be a number in \(0, 1\], .*, got 1e-50$/],
      // 1e999 parses to Infinity: the message says so (JSON.stringify would say null).
      [{ eval_fraction: Infinity }, /eval_fraction must be a number in \[0, 1\), got Infinity$/],
      [{ eval_episodes: [1, -Infinity] }, /eval_episodes must be .*, got \[1,-Infinity\]$/],
      // A huge value comes back cut short.
      [{ eval_episodes: Array.from({ length: 100_000 }, (_, i) => -i) }, /got \[0,-1,-2,.*\.\.\. \(688890 characters\)$/],
      [{ warmup_steps: 100, steps: 50 }, /warmup_steps must be an integer in 0..50, got 100/],
      [{ eval_dataset: 'd' }, /eval_dataset must be a second dataset, not dataset_name/],
      [{ eval_dataset: 'e', eval_fraction: 0.5 }, /give eval_dataset or eval_fraction, not both/],
      [{ weight_decay: 'x' }, /weight_decay must be a number in \[0, 1\], got "x"/],
      [{ ema_decay: 1 }, /ema_decay must be a number in \[0, 1\), got 1/],
      [{ augment: 'yes' }, /augment must be true or false, got "yes"/],
      [{ time_sampling: 'logit' }, /time_sampling must be "beta" or "uniform", got "logit"/],
      [{ rtc_max_delay: -1 }, /rtc_max_delay must be an integer in 0..63, got -1/],
      [{ rtc_max_delay: 2.5 }, /rtc_max_delay must be an integer in 0..63, got 2.5/],
      // An unknown field names the one it resembles, or the fine-tune name of a session's field.
      [{ step: 5 }, /^unknown field "step" \(did you mean "steps"\?\); known fields: model, /],
      [{ base_model: 'flow05-tiny' }, /^unknown field "base_model" \(did you mean "model"\?\)/],
      [{ colour: 'red' }, /^unknown field "colour"; known fields: /],
      // A LoRA setting on a full fine-tune (here the seeded base's default) would be ignored: refused by name.
      [{ lora_rank: 4 }, /^lora_rank applies to finetune "lora" only, got 4: this fine-tune is "full" \(the default on seeded base weights\), which trains every weight; leave lora_rank out, or add finetune "lora"$/],
      [{ finetune: 'full', lora_alpha: 8 }, /^lora_alpha applies to finetune "lora" only, got 8: this fine-tune is "full", which trains every weight; leave lora_alpha out, or add finetune "lora"$/],
      [{ targets: ['attn'] }, /^targets applies to finetune "lora" only, got \["attn"\]/],
      // LoRA on pi0.5's seeded base must reach its zero adaptive-norm gates, or it learns nothing.
      [{ finetune: 'lora', targets: ['attn', 'mlp'] }, /^targets must include action_expert or all for LoRA on pi0\.5 with seeded base weights: .*; or train in full, got \["attn","mlp"\]$/],
    ];
    for (const [over, re] of cases) expect(() => parseFineTuneConfig({ model: 'flow05-tiny', dataset_name: 'd', ...over }), JSON.stringify(over)).toThrow(re);
    // With LoRA they are taken; a stored full config (its LoRA fields filled in) re-validates as it was.
    expect(parseFineTuneConfig({ model: 'flow05-tiny', dataset_name: 'd', finetune: 'lora', lora_rank: 4 }).lora_rank).toBe(4);
    expect(parseFineTuneConfig({ model: 'flow05-tiny', dataset_name: 'd', lora_rank: 4 }, { trainedBase: true })).toMatchObject({ finetune: 'lora', lora_rank: 4 });
    // attn alone: on a trained pi0.5 (open gates) and on pi0 (no gates).
    expect(parseFineTuneConfig({ model: 'flow05-tiny', dataset_name: 'd', targets: ['attn'] }, { trainedBase: true }).targets).toEqual(['attn']);
    expect(parseFineTuneConfig({ model: 'flow0-tiny', dataset_name: 'd', finetune: 'lora', targets: ['attn'] }).targets).toEqual(['attn']);
    expect(parseFineTuneConfig({ model: 'flow05-tiny', dataset_name: 'd', finetune: 'lora', targets: ['attn', 'action_expert'] }).targets).toEqual(['attn', 'action_expert']);
    const stored = parseFineTuneConfig({ model: 'flow05-tiny', dataset_name: 'd' });
    expect(parseFineTuneConfig(stored as unknown as Record<string, unknown>, { stored: true })).toEqual(stored);
  });

  it('schedules linear warm-up then cosine to the floor', () => {
    expect(learningRateAt(5, 100, 1e-3, 10, 0.2)).toBeCloseTo(5e-4, 15);
    expect(learningRateAt(10, 100, 1e-3, 10, 0.2)).toBeCloseTo(1e-3, 15);
    expect(learningRateAt(55, 100, 1e-3, 10, 0.2)).toBeCloseTo(1e-3 * (0.2 + 0.8 * 0.5), 15); // halfway through the decay
    expect(learningRateAt(100, 100, 1e-3, 10, 0.2)).toBeCloseTo(2e-4, 15);
    expect(learningRateAt(1, 100, 1e-3, 0, 0)).toBeCloseTo(1e-3 * 0.5 * (1 + Math.cos(Math.PI / 100)), 15); // no warm-up
  });
});

describe('runFineTune: settings reach the trainer, the evaluation reaches the events', () => {
  it('passes the schedule, AdamW eps / weight decay and the default full mode to the engine', async () => {
    const dir = armDataset('sched');
    const { engine, progress } = await run({ dataset_name: dir, eval_episodes: [1], warmup_steps: 2, lr_floor: 0.25, learning_rate: 0.01, adam_eps: 1e-6, weight_decay: 0.02, ema_decay: 0.9, time_sampling: 'uniform', rtc_max_delay: 4 });
    expect(engine.calls.find((c) => c.op === 'create_session')!.args).toMatchObject({ finetune: 'full', emaDecay: 0.9, timeSampling: 'uniform', rtcMaxDelay: 4 });
    // The moving average is what the evaluation scores and what the job exports.
    const evalCalls = engine.calls.filter((c) => c.op === 'sample' || c.op === 'forward');
    expect(evalCalls.length).toBeGreaterThan(0);
    expect(evalCalls.every((c) => c.args.ema === true)).toBe(true);
    // ... and what every kept checkpoint's weights hold (each one can be served).
    const saves = engine.calls.filter((c) => c.op === 'save_weights').map((c) => c.args);
    expect(saves.map((a) => [a.name, a.ema])).toEqual([['step-0000002', true], ['step-0000004', true], ['final', true]]);
    const steps = engine.calls.filter((c) => c.op === 'optim_step').map((c) => c.args);
    expect(steps).toHaveLength(6);
    steps.forEach((a, i) => {
      expect(a).toMatchObject({ eps: 1e-6, weightDecay: 0.02, gradClipNorm: 1 });
      expect(a.learningRate).toBeCloseTo(learningRateAt(i + 1, 6, 0.01, 2, 0.25), 15);
    });
    expect(steps.map((a) => a.learningRate)).toEqual(progress.map((p) => p.learning_rate));
    expect(steps[1]!.learningRate).toBeCloseTo(0.01, 15);
    expect(steps[5]!.learningRate).toBeCloseTo(0.0025, 15);
    // Training batches come from the train episode only (3 frames): every eval batch from episode 1.
    expect(engine.calls.filter((c) => c.op === 'forward_backward').every((c) => c.args.batch.size === 2)).toBe(true);
  });

  it('scores held-out chunks: a policy that answers the truth scores 0; the baselines equal a direct computation', async () => {
    const dir = armDataset('score');
    const { progress, events } = await run({ dataset_name: dir, eval_episodes: [1], eval_stride: 1, eval_every: 3, action_space: 'delta' });
    const evals = progress.filter((p) => p.eval_mse !== undefined);
    expect(evals.map((p) => p.step)).toEqual([3, 6]);
    const e = evals.at(-1)!;
    expect(e.eval_frames).toBe(4); // every frame of episode 1 (4 frames)
    expect(e.eval_mse).toBeLessThan(1e-10); // sample -> unnormalise -> add the state back -> the recorded chunk
    expect(e.eval_raw.mse).toBeLessThan(1e-10);

    // The baselines, written out directly: absolute stats of the training chunk entries (episode 0,
    // 3 frames, every (t, k) with t + k < 3), quantile-normalised squared errors over valid entries.
    const ds = await openDataset(dir);
    const t0 = ds.table(0);
    const t1 = ds.table(1);
    const abs: number[][] = [];
    for (let t = 0; t < 3; t++) for (let k = 0; t + k < 3; k++) abs.push(Array.from(t0.action.subarray((t + k) * 3, (t + k + 1) * 3)));
    const stats = computeNormStats(abs);
    const n = (x: number, j: number) => normalizerFor('pi05').normalize([x], 1, { mean: [stats.mean[j]!], std: [stats.std[j]!], q01: [stats.q01[j]!], q99: [stats.q99[j]!] })[0]!;
    let hold = 0, mean = 0, holdRaw = 0, count = 0;
    const groupHold = [0, 0, 0];
    for (let t = 0; t < 4; t++) {
      for (let k = 0; t + k < 4; k++) {
        for (let j = 0; j < 3; j++) {
          const y = t1.action[(t + k) * 3 + j]!;
          const held = j < 2 ? t1.state[t * 2 + j]! : Math.fround(stats.mean[j]!);
          const m = Math.fround(stats.mean[j]!);
          hold += (n(held, j) - n(y, j)) ** 2;
          groupHold[j] += (n(held, j) - n(y, j)) ** 2;
          mean += (n(m, j) - n(y, j)) ** 2;
          holdRaw += (held - y) ** 2;
        }
        count++;
      }
    }
    expect(e.eval_mse_hold_state).toBeCloseTo(hold / (count * 3), 10);
    expect(e.eval_mse_mean_chunk).toBeCloseTo(mean / (count * 3), 10);
    expect(e.eval_raw.mse_hold_state).toBeCloseTo(holdRaw / (count * 3), 10);
    expect(e.eval_ratio_hold_state).toBe(e.eval_mse / e.eval_mse_hold_state);
    expect(e.eval_groups.map((g: any) => [g.group, g.dims])).toEqual([['left arm', ['left_shoulder']], ['right arm', ['right_shoulder']], ['left gripper', ['left_gripper']]]);
    e.eval_groups.forEach((g: any, j: number) => expect(g.mse_hold_state).toBeCloseTo(groupHold[j]! / count, 10));
    expect(events.find((x) => x.type === 'log' && /held-out evaluation: 4 frames \(every frame of episode 1\), groups left arm, right arm, left gripper/.test(x.data.message))).toBeTruthy();
    // The CLI's summary prints the same numbers.
    const text = evalSummary(e);
    expect(text).toContain(`held-out evaluation at step 6: 4 frames, MSE of ${e.eval_horizon}-step chunks (10 Euler steps)`);
    expect(e.eval_horizon).toBe(16); // flow0-tiny's horizon: the chunk the scores are of
    expect(text).toMatch(new RegExp(`left gripper .* ${(groupHold[2]! / count).toFixed(4)}`));
  });

  it('augment changes the training frames only, never the held-out ones', async () => {
    const dir = armDataset('augment');
    const plain = await run({ dataset_name: dir, eval_episodes: [1], steps: 2 });
    const aug = await run({ dataset_name: dir, eval_episodes: [1], steps: 2, augment: true });
    const images = (r: typeof plain, op: string) => r.engine.calls.filter((c) => c.op === op).map((c) => Array.from(c.args.batch.images as Uint8Array));
    expect(images(aug, 'forward_backward')).not.toEqual(images(plain, 'forward_backward'));
    expect(images(aug, 'sample')).toEqual(images(plain, 'sample'));
    expect(aug.cfg.augment).toBe(true);
  });

  it('eval_fraction 0 holds out nothing and evaluates nothing', async () => {
    const { progress, events, engine } = await run({ dataset_name: armDataset('none'), eval_fraction: 0 });
    expect(progress.some((p) => 'eval_mse' in p || 'eval_loss' in p)).toBe(false);
    expect(engine.calls.some((c) => c.op === 'sample' || c.op === 'forward')).toBe(false);
    expect(events[0]!.data.message).toMatch(/train episodes 0,1, held-out none \(no evaluation: eval_fraction 0 and no eval_dataset\)/);
  });

  it('eval_dataset trains on every episode and scores every episode of the second dataset', async () => {
    const dir = armDataset('train-all');
    const other = armDataset('other');
    const { progress, events } = await run({ dataset_name: dir, eval_dataset: other, eval_stride: 2 }, { evalDatasetDir: other });
    expect(events[0]!.data.message).toMatch(new RegExp(`train episodes 0,1, evaluated on every episode of ${other.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}`));
    expect(progress.at(-1)!.eval_frames).toBe(2 + 2); // frames 0, 2 of episode 0 (3 frames) and 0, 2 of episode 1 (4)
  });

  it('refuses held-out episodes the dataset lacks, naming them', async () => {
    await expect(run({ dataset_name: armDataset('missing'), eval_episodes: [1, 9] })).rejects.toThrow('eval_episodes must be episodes of the dataset (episodes 0..1, 2 of them); not in it, got [9]');
    await expect(run({ dataset_name: armDataset('all'), eval_episodes: [0, 1] })).rejects.toThrow('eval_episodes must leave an episode to train on: the dataset has 2, got [0,1]');
  });
});

describe('vela finetune on the real engine', () => {
  it('takes the new flags, trains, and prints the held-out table', { timeout: 300_000 }, async () => {
    await expect(finetuneCommand(['--dataset', FIXTURE, '--lr-floor', '2'])).rejects.toThrow('--lr-floor 2: must be a number in [0, 1]');
    const dir = armDataset('cli');
    const out = path.join(tmp, 'cli-out');
    const written: string[] = [];
    const write = process.stderr.write.bind(process.stderr);
    process.stderr.write = ((s: string) => (written.push(String(s)), true)) as typeof process.stderr.write;
    try {
      await finetuneCommand(['--dataset', dir, '--steps', '3', '--batch-size', '2', '--eval-episodes', '1', '--warmup-steps', '1', '--lr-floor', '0.5',
        '--adam-eps', '1e-6', '--weight-decay', '0.01', '--learning-rate', '0.001', '--output', out, '--backend', 'wasm']);
    } finally {
      process.stderr.write = write;
    }
    const events = fs.readFileSync(path.join(out, 'events.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    const progress = events.filter((e) => e.type === 'progress');
    expect(progress.map((p) => p.learning_rate)).toEqual([1, 2, 3].map((s) => learningRateAt(s, 3, 0.001, 1, 0.5)));
    const last = progress.at(-1);
    for (const k of ['eval_loss', 'eval_mse', 'eval_mse_hold_state', 'eval_mse_mean_chunk', 'eval_ratio_hold_state', 'eval_ratio_mean_chunk']) expect(Number.isFinite(last[k]), k).toBe(true);
    expect(last.eval_frames).toBe(1); // frame 0 of episode 1 (stride 4)
    expect(fs.existsSync(path.join(out, 'weights/final/model.safetensors'))).toBe(true); // full fine-tune by default
    const text = written.join('');
    expect(text).toContain('held-out evaluation at step 3: 1 frames');
    expect(text).toMatch(/ {2}left arm +\d/);
    // A finished run is never overwritten: a second run into the same --output is refused up front.
    await expect(finetuneCommand(['--dataset', dir, '--steps', '3', '--output', out])).rejects.toThrow(`--output ${out}: holds a finished run (weights/final): give a new --output (a finished run is never overwritten)`);
  });

  it('resumes an interrupted --output only with the settings it was started with', () => {
    const dir = armDataset('cli-resume');
    const out = path.join(tmp, 'cli-interrupted');
    const args = (...more: string[]) => ['--dataset', dir, '--steps', '40', '--output', out, ...more];
    const { cfg } = parseFinetuneArgs(args('--batch-size', '8')); // a new folder: fine
    fs.mkdirSync(path.join(out, 'weights', 'step-0000020'), { recursive: true });
    fs.writeFileSync(path.join(out, 'run.json'), JSON.stringify(cfg));
    expect(() => parseFinetuneArgs(args('--batch-size', '8'))).toThrow(`--output ${out}: holds checkpoints of another run but nothing to resume: give a new --output`);
    fs.writeFileSync(path.join(out, 'resume.json'), '{}');
    expect(parseFinetuneArgs(args('--batch-size', '8')).cfg).toEqual(cfg);
    expect(() => parseFinetuneArgs(args('--batch-size', '4', '--model', 'flow05-tiny'))).toThrow(
      `--output ${out}: holds an interrupted run started with --model "flow0-tiny" (now "flow05-tiny"), --batch-size 8 (now 4): give the same settings to resume it, or a new --output`,
    );
  });
});
