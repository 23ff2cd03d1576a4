/**
 * One training step (forward_backward + optim_step) of the tiny real pi0 / pi0.5 (FACTS 5.2,
 * kernels/pi/config.ts) through the shared trainer, batch 2 (three cameras, one masked), on the
 * active backend (native TensorFlow when it loads): full fine-tune with the 16.5 M-value token
 * embedding trained (as openpi does) and frozen, and LoRA at openpi's ranks (16 VLM, 32
 * expert). Burns in, then prints the median of the timed steps in ms.
 *
 *   npx tsx bench/real-pi-train.ts [--steps 5] [--backend node|wasm]
 *
 * Measured 2026-12-01 16:17 UTC, tfjs-node, 2 cores under load ~7 from other work (medians of 7):
 *   pi0  full 564 ms (forward_backward 145, optim_step 415); embedding frozen 93; LoRA 16/32 86
 *   pi05 full 528 ms (forward_backward 126, optim_step 405); embedding frozen 85; LoRA 16/32 80
 * The trained embedding (16.5 M values) is ~85% of a full step: a dense [V, D] gradient out of
 * the gather, then AdamW and the global norm over all of it.
 */
import { parseArgs } from 'node:util';
import { activateBackend, type BackendKind } from '../kernels/backend/backend.ts';
import { applyNativeEnv } from '../kernels/backend/native.ts';
import { REAL_PI_TINY_PI0, REAL_PI_TINY_PI05, type RealPiConfig } from '../kernels/pi/config.ts';
import { fakeRealPiBatch } from '../kernels/pi/fake.ts';
import { NAMES } from '../kernels/pi/params.ts';
import { OPENPI_LORA, realPiPolicy } from '../kernels/pi/policy.ts';
import { BaseWeights, TrainingState, type TrainingOptions } from '../kernels/trainer.ts';

const { values } = parseArgs({ options: { steps: { type: 'string', default: '5' }, backend: { type: 'string', default: 'node' } } });
const steps = Number(values.steps);


async function main(): Promise<void> {
  applyNativeEnv();
  await activateBackend(values.backend as BackendKind);
  const rows: [string, TrainingOptions][] = [
    ['full', { finetune: 'full' }],
    ['full, embedding frozen', { finetune: 'full', frozen: [NAMES.embedding] }],
    ['lora 16/32', { finetune: 'lora', ...OPENPI_LORA }],
  ];
  for (const c of [REAL_PI_TINY_PI0, REAL_PI_TINY_PI05]) {
    const base = BaseWeights.create(realPiPolicy(c), 0);
    const batch = fakeRealPiBatch(c);
    for (const [label, opts] of rows) {
      const state = new TrainingState(base, { ...opts, seed: 0 });
      // forwardBackward returns the loss (read back) and optimStep the grad norm: each has finished when it returns.
      const step = (): [number, number] => {
        const t0 = performance.now();
        state.forwardBackward(batch);
        const t1 = performance.now();
        state.optimStep({ learningRate: 1e-4 });
        return [t1 - t0, performance.now() - t1];
      };
      step(); // burn-in
      const times = Array.from({ length: steps }, step);
      const median = (xs: number[]) => xs.sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
      const total = median(times.map(([a, b]) => a + b));
      console.log(`${c.variant} ${label}: ${total.toFixed(0)} ms/step (forward_backward ${median(times.map(([a]) => a)).toFixed(0)}, optim_step ${median(times.map(([, b]) => b)).toFixed(0)}; median of ${steps}; trainable ${state.trainableParamCount})`);
      state.dispose();
    }
    base.dispose();
  }
}

await main();
