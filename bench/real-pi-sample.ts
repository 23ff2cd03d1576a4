/**
 * sample() time of the real pi0 / pi0.5 (kernels/pi/) at the tiny config of FACTS 5.2 (contract
 * init weights), batch 1, on the backend VELA_BACKEND picks (default: the best present): burn-in,
 * then the median of the timed runs, each waiting for the result's data.
 *
 *   npx tsx bench/real-pi-sample.ts [--cameras 1] [--runs 10] [--variant pi0|pi05|both]
 */
import { parseArgs } from 'node:util';
import { initBackend } from '../kernels/backend/backend.ts';
import { REAL_PI_TINY_PI0, REAL_PI_TINY_PI05, createRealPiParams, disposeRealPiParams, sample, type RealPiBatch } from '../kernels/pi/index.ts';

const { values } = parseArgs({ options: { cameras: { type: 'string', default: '1' }, runs: { type: 'string', default: '10' }, variant: { type: 'string', default: 'both' } } });
const cameras = Number(values.cameras);
const runs = Number(values.runs);
const report = await initBackend();
console.log(report.line);
for (const config of [REAL_PI_TINY_PI0, REAL_PI_TINY_PI05].filter((c) => values.variant === 'both' || values.variant === c.variant)) {
  const params = createRealPiParams(config, 'contract-init');
  const S = config.vision.imageSize;
  const L = config.maxTokenLen;
  const batch: RealPiBatch = {
    size: 1,
    numCameras: cameras,
    images: new Float32Array(cameras * 3 * S * S).map((_, i) => Math.sin(i * 0.37)),
    imageMasks: new Array(cameras).fill(1),
    tokens: Int32Array.from({ length: L }, (_, i) => (i < 20 ? 2 + i * 97 : 0)),
    tokenMasks: Array.from({ length: L }, (_, i) => (i < 20 ? 1 : 0)),
    state: new Float32Array(config.stateDim).fill(0.1),
  };
  const noise = new Float32Array(config.actionHorizon * config.actionDim).map((_, i) => Math.cos(i));
  const ms: number[] = [];
  for (let r = 0; r < runs + 2; r++) {
    const t0 = performance.now();
    const out = sample({ config, params }, batch, noise);
    await out.data();
    out.dispose();
    if (r >= 2) ms.push(performance.now() - t0);
  }
  ms.sort((a, b) => a - b);
  const median = ms.length % 2 ? ms[(ms.length - 1) / 2]! : (ms[ms.length / 2 - 1]! + ms[ms.length / 2]!) / 2;
  console.log(`${config.variant} tiny, batch 1, ${cameras} camera(s), prompt ${L} (20 real), ${config.numSteps} steps: median ${median.toFixed(1)} ms over ${runs} runs (min ${ms[0]!.toFixed(1)}, max ${ms[ms.length - 1]!.toFixed(1)})`);
  disposeRealPiParams(params);
}
