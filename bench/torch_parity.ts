/**
 * Is bench/torch_reference.py the same model as Vela's? For each preset given, Vela builds its
 * seeded weights (constant tensors made random) and a small batch that exercises the masks (two image slots of three, prompt
 * padding, state and action dims padded, one datum's chunk cut short, unequal datum weights),
 * computes the velocity for explicit noise and time and the gradient of sum_i w_i loss_i (the
 * G that forward_backward accumulates), and writes weights, inputs and results as safetensors;
 * `torch_reference.py --parity DIR` loads the same weights into the torch model, repeats both
 * and prints the largest differences. Float32 on both sides: agreement to ~1e-5 is parity.
 *
 *   npx tsx bench/torch_parity.ts [--presets flow0-tiny,flow05-tiny] [--backend cpu]
 *
 * Prints one JSON line per preset: {preset, params, velocity_max_abs, velocity_scale,
 * loss_max_abs, grad_max_abs, grad_worst, grad_max_rel, grads_compared, missing}; exits 1 when
 * a difference is over --tolerance (relative to the tensor's largest value, default 1e-5).
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { initBackend } from '../kernels/backend/backend.ts';
import { makeBatch, type DatumInput } from '../kernels/small/batch.ts';
import { makeConfig } from '../kernels/small/config.ts';
import { Rng } from '../kernels/rng.ts';
import { encodeSafetensors, type SafeTensor } from '../kernels/safetensors.ts';
import { BaseWeights, TrainingState } from '../kernels/trainer.ts';

const SCRIPT = fileURLToPath(new URL('./torch_reference.py', import.meta.url));
const USAGE = `Usage: npx tsx bench/torch_parity.ts [--presets flow0-tiny,flow05-tiny] [--backend cpu] [--tolerance 1e-5] [--keep]

Compares bench/torch_reference.py's forward and gradients with Vela's on the same weights and inputs.
`;

const f32 = (shape: number[], data: Float32Array): SafeTensor => ({ dtype: 'F32', shape, data });

/** Writes Vela's weights, a masked batch, noise/time, the velocity and G for one preset into dir. */
function writeCase(preset: string, dir: string): number {
  const c = makeConfig(preset);
  const rng = new Rng(11);
  // The seeded init with its constant tensors made random (norm weights 1 + N(0, 0.1), biases
  // N(0, 0.02), pi0.5's zero-initialised adaptive-norm Linears like any linear layer), so that every
  // path counts: at init the adaptive norms pass nothing of the time to a pi0.5 action expert.
  const named = BaseWeights.create(c, 7).exportWeights();
  for (const [name, t] of Object.entries(named)) {
    const d = t.data as Float32Array;
    const noise = rng.normals(d.length);
    if (/norm\d?\.weight$/.test(name)) d.forEach((x, i) => (d[i] = x + 0.1 * noise[i]!));
    else if (name.endsWith('.bias')) d.forEach((x, i) => (d[i] = x + 0.02 * noise[i]!));
    else if (/\.ada\d\.weight$/.test(name)) d.forEach((_, i) => (d[i] = noise[i]! / Math.sqrt(t.shape[0]!) / Math.sqrt(3)));
  }
  const base = BaseWeights.fromTensors(c, named);
  const state = new TrainingState(base, { finetune: 'full' });
  const S = c.imageSize;
  const frame = () => Uint8Array.from({ length: S * S * 3 }, () => rng.nextU32() & 255);
  const sd = 14;
  const ad = 14;
  const datums: DatumInput[] = [0, 1].map((i) => {
    const h = i === 0 ? c.horizon : c.horizon - 5; // datum 1's chunk ends early: padding masked
    return {
      images: [frame(), null, frame()], // slots 0 and 2: the empty slot is not computed (D13)
      state: rng.normals(sd), // normalised, zero-padded to state_dim by makeBatch
      prompt: i === 0 ? 'pick up the bottle' : 'pick up the green bottle and place it on the tray',
      actions: { data: rng.normals(h * ad), horizon: h, dim: ad },
      weight: i === 0 ? 1 : 0.5,
    };
  });
  const batch = makeBatch(c, datums);
  const n = batch.size * c.horizon * c.actionDim;
  const noise = rng.normals(n);
  const time = Float32Array.from([0.83, 0.27]);
  const fwd = state.forward(batch, { noise, time });
  const { lossPerDatum } = state.forwardBackward(batch, { noise, time });
  const { grads, denominator } = state.accumulatedGradients();
  const weights: Record<string, SafeTensor> = {};
  for (const [name, t] of Object.entries(base.exportWeights())) weights[name] = f32(t.shape, t.data);
  const shapes = new Map(Object.entries(base.exportWeights()).map(([k, t]) => [k, t.shape]));
  const out: Record<string, SafeTensor> = {
    velocity: f32([batch.size, c.horizon, c.actionDim], fwd.velocity),
    loss_per_datum: f32([batch.size], lossPerDatum),
  };
  for (const [name, g] of grads) out[`grad.${name}`] = f32(shapes.get(name)!, g);
  const B = batch.size;
  const inputs: Record<string, SafeTensor> = {
    images: { dtype: 'U8', shape: [B, c.slots, S, S, 3], data: batch.images },
    image_mask: { dtype: 'U8', shape: [B, c.slots], data: batch.imageMask },
    tokens: { dtype: 'I32', shape: [B, c.maxTokenLen], data: batch.tokens },
    token_mask: { dtype: 'U8', shape: [B, c.maxTokenLen], data: batch.tokenMask },
    state: f32([B, c.stateDim], batch.state),
    actions: f32([B, c.horizon, c.actionDim], batch.actions),
    action_mask: f32([B, c.horizon, c.actionDim], batch.actionMask),
    weight: f32([B], batch.weight),
    noise: f32([B, c.horizon, c.actionDim], noise),
    time: f32([B], time),
  };
  fs.writeFileSync(path.join(dir, 'weights.safetensors'), encodeSafetensors(weights));
  fs.writeFileSync(path.join(dir, 'inputs.safetensors'), encodeSafetensors(inputs));
  fs.writeFileSync(path.join(dir, 'vela.safetensors'), encodeSafetensors(out, { denominator: String(denominator) }));
  state.dispose();
  base.dispose();
  return base.paramCount;
}

async function main(): Promise<void> {
  const { values } = parseArgs({ options: {
    presets: { type: 'string', default: 'flow0-tiny,flow05-tiny' }, backend: { type: 'string', default: 'cpu' },
    tolerance: { type: 'string', default: '1e-5' }, keep: { type: 'boolean' }, help: { type: 'boolean' },
  } });
  if (values.help) return void process.stdout.write(USAGE);
  const tolerance = Number(values.tolerance);
  if (!(tolerance > 0)) throw new Error(`--tolerance is '${values.tolerance}'; expected a positive number`);
  await initBackend(values.backend, (line) => process.stderr.write(`${line}\n`));
  let failed = false;
  for (const preset of values.presets.split(',').map((p) => p.trim()).filter(Boolean)) {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), `vela-parity-${preset}-`));
    try {
      const params = writeCase(preset, dir);
      const r = spawnSync('python3', [SCRIPT, '--parity', dir, '--preset', preset, '--tolerance', String(tolerance)], { encoding: 'utf8' });
      if (r.error) throw new Error(`python3 did not start: ${r.error.message}`);
      if (r.stderr.trim()) process.stderr.write(r.stderr);
      const line = r.stdout.trim().split('\n').at(-1) ?? '';
      if (!line.startsWith('{')) throw new Error(`torch_reference.py --parity exited with ${r.status} and printed no result`);
      process.stdout.write(`${JSON.stringify({ params, ...JSON.parse(line) })}\n`);
      if (r.status !== 0) failed = true;
    } finally {
      if (values.keep) process.stderr.write(`kept ${dir}\n`);
      else fs.rmSync(dir, { recursive: true, force: true });
    }
  }
  if (failed) process.exit(1);
}

main().catch((e) => {
  process.stderr.write(`torch_parity: ${(e as Error).message}\n`);
  process.exit(1);
});
