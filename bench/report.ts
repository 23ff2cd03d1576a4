/**
 * The bench's outputs: target checks (issue 7's "must show"), a markdown table for stdout and the
 * README, and the SVG series.
 */
import type { BenchResult, InferResult, TargetCheck } from './schema.ts';
import type { PlotSeries } from './svg.ts';

const ms = (x: number) => (x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x.toFixed(2));
const mb = (b: number) => (b / 2 ** 20).toFixed(1);
const kb = (b: number) => (b >= 2 ** 20 ? `${mb(b)} MiB` : `${(b / 1024).toFixed(1)} KiB`);

/** The issue's targets that this result can check. */
export function targets(r: Omit<BenchResult, 'targets'>): TargetCheck[] {
  const out: TargetCheck[] = [];
  if (r.step) {
    const s = r.step;
    out.push({ name: `protocol overhead, ${s.preset} b${s.batch} ${s.cameras} ${s.codec} camera(s), each answer awaited, median of paired steps`, value: s.overheadPaired, limit: 0.1, pass: s.overheadPaired < 0.1 });
    out.push({ name: `protocol overhead, ${s.preset} b${s.batch} ${s.cameras} ${s.codec} camera(s), pipelined one step ahead, mean`, value: s.pipelined.overhead, limit: 0.1, pass: s.pipelined.overhead < 0.1 });
    // Issue 36: an awaited step through the Python package within 1.10x of the in-process step.
    if (s.python) out.push({ name: `Python package overhead, ${s.preset} b${s.batch} ${s.cameras} camera(s) as numpy frames (${s.python.codec}), each answer awaited, median of paired steps`, value: s.python.overheadPaired, limit: 0.1, pass: s.python.overheadPaired <= 0.1 });
  }
  if (r.torch) {
    // Issue 15 holds native TensorFlow to 2x of PyTorch; issue 7 held wasm to 3x.
    const limit = r.machine.backend === 'tensorflow' ? 2 : 3;
    out.push({ name: `Vela ${r.machine.backend} step / PyTorch 1 thread, p50`, value: r.torch.ratio, limit, pass: r.torch.ratio <= limit });
  }
  if (r.infer) {
    // Issue 25: the default backend's sample() within 1.2x of PyTorch (flow05-tiny, flow0-tiny),
    // the policy round trip (one client, one camera) within 1.3x of PyTorch's sampling.
    // Each model's first row: the default backend, graphs allowed where it has them.
    const firsts = [...new Set(r.infer.sample.map((s) => s.model))].map((m) => r.infer!.sample.find((s) => s.model === m)!);
    for (const s of firsts) {
      if (s.torchRatio === null || !s.model.startsWith('flow')) continue;
      out.push({ name: `sample() / PyTorch, ${s.model} b1 1 camera, ${s.backend}, p50`, value: s.torchRatio, limit: 1.2, pass: s.torchRatio <= 1.2 });
    }
    for (const t of r.infer.roundTrip) {
      if (t.batch !== 1 || t.cameras !== 1 || t.ratio === null) continue;
      out.push({ name: `policy round trip / PyTorch sampling, ${t.model} b1 1 ${t.codec} camera, p50`, value: t.ratio, limit: 1.3, pass: t.ratio <= 1.3 });
    }
  }
  if (r.load) {
    const l = r.load;
    out.push({ name: `load errors (${l.sessions} sessions, ${l.policyClients} policy clients, ${l.durationS.toFixed(0)} s)`, value: l.errors, limit: 0, pass: l.errors === 0 });
    // Issue 25: under training load a robot's p99 stays within 2x of one idle client's (same run).
    if (l.p99OverIdle !== null) out.push({ name: `policy p99 under load / one idle client's p99 (${l.sessions} sessions, ${l.policyClients} policy clients${l.policyHz > 0 ? ` at ${l.policyHz} Hz` : ''})`, value: l.p99OverIdle, limit: 2, pass: l.p99OverIdle <= 2 });
    const growth = l.rss.floorEndBytes - l.rss.floorStartBytes;
    // Flat: the post-GC floor grows under 5% after warm-up (allocator and JIT noise), or under 32 MiB.
    const limit = Math.max(32 * 2 ** 20, 0.05 * l.rss.floorStartBytes);
    out.push({ name: 'server RSS floor growth after warm-up (last third vs first third), bytes', value: growth, limit, pass: growth <= limit });
    const t = l.tensors;
    if (t.afterWarmup !== null && t.end !== null) out.push({ name: 'engine tensors: end - after warm-up', value: t.end - t.afterWarmup, limit: 0, pass: t.end === t.afterWarmup });
    if (t.before !== null && t.afterClose !== null) out.push({ name: 'engine tensors: after close - before', value: t.afterClose - t.before, limit: 0, pass: t.afterClose === t.before });
  }
  return out;
}

/** Markdown tables of every part that ran, then the targets. */
export function markdown(r: BenchResult): string {
  const L: string[] = [];
  const m = r.machine;
  L.push(`Machine: ${m.cpus} x ${m.cpuModel}, Node ${m.node}, backend ${m.backend}. Run "${r.name}" ${r.date}, ${r.wallS.toFixed(0)} s.`, '');
  if (r.step) {
    const s = r.step;
    L.push(`**Training step** (${s.preset}, ${s.finetune}, batch ${s.batch}, ${s.cameras} ${s.codec} camera(s) 480x640, request ${kb(s.requestBytes)}), ms`, '');
    L.push('| path | p50 | p95 | p99 | n |', '| - | - | - | - | - |');
    L.push(`| in-process (Engine.call) | ${ms(s.inproc.p50)} | ${ms(s.inproc.p95)} | ${ms(s.inproc.p99)} | ${s.inproc.n} |`);
    L.push(`| session websocket (TS client) | ${ms(s.ws.p50)} | ${ms(s.ws.p95)} | ${ms(s.ws.p99)} | ${s.ws.n} |`);
    if (s.python) L.push(`| Python package, numpy frames shrunk to image_size, ${s.python.codec} (request ${kb(s.python.requestBytes)}) | ${ms(s.python.summary.p50)} | ${ms(s.python.summary.p95)} | ${ms(s.python.summary.p99)} | ${s.python.summary.n} |`);
    L.push(`| websocket, pipelined one step ahead (mean) | ${ms(s.pipelined.wsMsPerStep)} | | | ${s.inproc.n} |`);
    L.push(`| in-process (mean, same run) | ${ms(s.pipelined.inprocMsPerStep)} | | | ${s.inproc.n} |`);
    L.push('', `Protocol overhead (ws - in-process) / in-process with each answer awaited: **${(s.overheadPaired * 100).toFixed(1)}%** (median of paired steps; ${(s.overhead * 100).toFixed(1)}% between the p50s); pipelined one step ahead: **${(s.pipelined.overhead * 100).toFixed(1)}%** (means)` +
      (s.python ? `; through the Python package, awaited: **${(s.python.overheadPaired * 100).toFixed(1)}%** (median of paired steps)` : `; Python package: ${s.pythonSkipped ?? 'not measured'}`), '');
  }
  if (r.torch) {
    const t = r.torch;
    L.push(`**Vela vs PyTorch ${t.torchVersion}** (same model, ${t.params.toLocaleString('en-US')} parameters, full fine-tune, forward + backward + AdamW), ms per step`, '');
    L.push('| implementation | threads | p50 | p95 | n |', '| - | - | - | - | - |');
    L.push(`| Vela (TF.js ${m.backend}) | 1 | ${ms(t.velaStepMs.p50)} | ${ms(t.velaStepMs.p95)} | ${t.velaStepMs.n} |`);
    for (const row of t.rows) L.push(`| PyTorch CPU | ${row.threads} | ${ms(row.stepMs.p50)} | ${ms(row.stepMs.p95)} | ${row.stepMs.n} |`);
    L.push('', `Ratio Vela / PyTorch (1 thread, p50): **${t.ratio.toFixed(2)}x** (the two took turns, ${t.blockSteps} steps at a time)`, '');
  }
  if (r.policy) {
    L.push('**Policy inference over the OpenPI protocol** (one client, one request at a time, 480x640 frames, 10 Euler steps), ms', '');
    L.push('| cameras | frames | message | p50 | p95 | p99 | server infer p50 |', '| - | - | - | - | - | - | - |');
    for (const p of r.policy) L.push(`| ${p.cameras} | ${p.codec}${p.zstd ? (p.zstdDict ? ' + zstd (dict)' : ' + zstd (no dict)') : ''} | ${kb(p.messageBytes)} | ${ms(p.latency.p50)} | ${ms(p.latency.p95)} | ${ms(p.latency.p99)} | ${ms(p.serverInferMs)} |`);
    L.push('');
  }
  if (r.codecs) {
    L.push('**Encode / decode**, ms p50 (MB/s of the raw side)', '');
    L.push('| what | op | in | out | p50 ms | MB/s |', '| - | - | - | - | - | - |');
    for (const c of r.codecs) L.push(`| ${c.name} | ${c.op} | ${kb(c.inputBytes)} | ${kb(c.outputBytes)} | ${ms(c.ms.p50)} | ${c.mbPerS.toFixed(0)} |`);
    L.push('');
  }
  if (r.load) {
    const l = r.load;
    L.push(`**Load** (${l.sessions} sessions and ${l.policyClients} policy clients${l.policyHz > 0 ? ` at ${l.policyHz} Hz each` : ' in closed loops'} for ${l.durationS.toFixed(0)} s, warm-up ${l.warmupS} s)`, '');
    L.push('| | value |', '| - | - |');
    L.push(`| training steps | ${l.steps} (${l.stepsPerS.toFixed(2)}/s)${l.stepLatency ? `, p50 ${ms(l.stepLatency.p50)} ms, p99 ${ms(l.stepLatency.p99)} ms` : ''} |`);
    L.push(`| inferences | ${l.inferences} (${l.inferencesPerS.toFixed(2)}/s)${l.inferLatency ? `, p50 ${ms(l.inferLatency.p50)} ms, p99 ${ms(l.inferLatency.p99)} ms` : ''} |`);
    // The load's policy clients send the 1-camera JPEG observation; the idle phase sent the same alone.
    if (l.idleLatency) L.push(`| one policy client alone first (idle phase) | ${l.idleLatency.n} requests, p50 ${ms(l.idleLatency.p50)} ms, p99 ${ms(l.idleLatency.p99)} ms |`);
    if (l.p99OverIdle !== null && l.inferLatency && l.idleLatency) L.push(`| inference p99 under load / idle p99 (same run) | ${ms(l.inferLatency.p99)} / ${ms(l.idleLatency.p99)} ms = **${l.p99OverIdle.toFixed(2)}x** |`);
    const e = l.engineInferMs;
    if (e.idle !== null || e.loaded !== null) L.push(`| engine call of a request's batch, p50 idle / under load | ${e.idle === null ? 'n/a' : ms(e.idle)} / ${e.loaded === null ? 'n/a' : ms(e.loaded)} ms |`);
    L.push(`| errors | ${l.errors}${l.errorMessages.length ? ` (${l.errorMessages.join('; ')})` : ''} |`);
    L.push(`| server RSS floor, first / last third after warm-up | ${mb(l.rss.floorStartBytes)} / ${mb(l.rss.floorEndBytes)} MiB |`);
    L.push(`| server RSS at warm-up end / end / max | ${mb(l.rss.afterWarmupBytes)} / ${mb(l.rss.endBytes)} / ${mb(l.rss.maxBytes)} MiB (fitted slope ${mb(l.rss.slopeBytesPerMin)} MiB/min) |`);
    const t = l.tensors;
    L.push(`| engine tensors before / after warm-up / end / after close | ${[t.before, t.afterWarmup, t.end, t.afterClose].map((x) => x ?? 'n/a').join(' / ')} |`);
    L.push('');
  }
  if (r.infer) L.push(...inferMarkdown(r.infer));
  for (const [part, why] of Object.entries(r.skipped)) L.push(`Skipped ${part}: ${why}`);
  for (const n of r.notes) L.push(`Note: ${n}`);
  if (Object.keys(r.skipped).length || r.notes.length) L.push('');
  if (r.targets.length) {
    L.push('**Targets**', '', '| target | value | limit | pass |', '| - | - | - | - |');
    for (const t of r.targets) L.push(`| ${t.name} | ${Number(t.value.toFixed(3))} | ${Number(t.limit.toFixed(3))} | ${t.pass ? 'yes' : '**no**'} |`);
  }
  return L.join('\n') + '\n';
}

const x = (v: number | null) => (v === null ? 'n/a' : `${v.toFixed(2)}x`);
const sci = (v: number | null) => (v === null ? 'n/a' : v === 0 ? '0' : v.toExponential(1));

/** The infer part's two tables (sample() alone; the policy round trip), lines. */
export function inferMarkdown(f: InferResult): string[] {
  const L: string[] = [];
  const torch = f.torchVersion ? `PyTorch ${f.torchVersion}` : 'PyTorch (not run)';
  L.push(`**What a robot waits for: sample() alone** (batch 1, one camera, 10 Euler steps, prefix keys/values once; ${f.callsPerRow} calls per row, every row in turns of ${f.blockCalls}; ${torch} on ${f.threads} thread(s) = TensorFlow's intra-op threads), ms`, '');
  L.push('| model | implementation | p50 | p90 | / PyTorch p50 | max abs diff vs PyTorch | vs first row | n |', '| - | - | - | - | - | - | - | - |');
  for (const model of [...new Set([...f.sample.map((s) => s.model), ...f.torch.map((t) => t.model)])]) {
    for (const s of f.sample.filter((s) => s.model === model)) {
      const how = s.graphs ? (s.graphUsed ? 'graph' : 'graphs allowed, none for this family: eager') : 'eager (VELA_GRAPHS=0)';
      L.push(`| ${model} | Vela ${s.backend}, ${s.backend === 'wasm' ? 'eager' : how} | ${ms(s.ms.p50)} | ${ms(s.ms.p90)} | ${x(s.torchRatio)} | ${sci(s.maxAbsDiffTorch)} | ${sci(s.maxAbsDiffHome)} | ${s.ms.n} |`);
    }
    const t = f.torch.find((t) => t.model === model && t.batch === 1 && t.cameras === 1);
    if (t) L.push(`| ${model} | PyTorch | ${ms(t.ms.p50)} | ${ms(t.ms.p90)} | 1.00x | | | ${t.ms.n} |`);
  }
  L.push('');
  if (f.roundTrip.length) {
    L.push(`**What a robot waits for: the policy server's round trip** (${f.roundTrip[0]!.model}, OpenPI client, 480x640 frames; batch 8 = eight clients sending at once), ms`, '');
    L.push('| cameras | frames | batch (per engine call) | message | p50 | p90 | server infer p50 | PyTorch sample p50 | round trip / PyTorch | n |', '| - | - | - | - | - | - | - | - | - | - |');
    for (const t of f.roundTrip) L.push(`| ${t.cameras} | ${t.codec} | ${t.batch} (${t.serverBatchMean === null ? '?' : t.serverBatchMean.toFixed(1)}) | ${kb(t.messageBytes)} | ${ms(t.ms.p50)} | ${ms(t.ms.p90)} | ${t.serverInferMs === null ? 'n/a' : ms(t.serverInferMs)} | ${t.torchP50 === null ? 'n/a' : ms(t.torchP50)} | ${x(t.ratio)} | ${t.ms.n} |`);
    L.push('');
  }
  L.push(`Backend: ${f.backend}`, '');
  for (const n of f.notes) L.push(`Note: ${n}`);
  if (f.notes.length) L.push('');
  return L;
}

/** The latency series the SVG shows. */
export function plotSeries(r: BenchResult): PlotSeries[] {
  const out: PlotSeries[] = [];
  if (r.step) {
    out.push({ label: 'step in-process', samplesMs: r.step.samplesMs.inproc });
    out.push({ label: 'step websocket', samplesMs: r.step.samplesMs.ws });
    if (r.step.python) out.push({ label: 'step Python package', samplesMs: r.step.python.samplesMs });
  }
  for (const p of r.policy ?? []) out.push({ label: `infer ${p.cameras} cam ${p.codec}${p.zstd ? '+zstd' : ''}`, samplesMs: p.samplesMs });
  for (const s of r.infer?.sample ?? []) out.push({ label: `sample ${s.model} ${s.backend}${s.graphUsed ? ' graph' : ''}`, samplesMs: s.samplesMs });
  for (const t of r.infer?.torch ?? []) if (t.batch === 1 && t.cameras === 1) out.push({ label: `sample ${t.model} PyTorch`, samplesMs: t.samplesMs });
  for (const t of r.infer?.roundTrip ?? []) out.push({ label: `round trip ${t.cameras} cam ${t.codec} b${t.batch}`, samplesMs: t.samplesMs });
  return out;
}
