/**
 * Load: N training sessions (each a websocket client stepping forward_backward + optim_step in a
 * loop) and M policy clients (each inferring in a loop) at once for a duration, against the bench
 * server process. First, before any session opens, one policy client alone sends `idleRequests`
 * observations (the idle phase: same server, same checkpoint, same message), so the loaded p99
 * has its idle p99 from the same run beside it. Records throughput, latencies, errors, the
 * server's RSS every second and the
 * engine's tensor count at quiet points (no step in flight, every session between steps):
 * before the sessions open, after each has stepped once, when the load stops, after they close.
 */
import { VelaClient, type Datum, type SessionConnection } from '../protocol/client.ts';
import { PolicyConnection } from '../protocol/policy-client.ts';
import { slope, summarize, timeCalls } from './stats.ts';
import type { LoadResult, MemorySample } from './schema.ts';
import type { ServerProc } from './server-proc.ts';
import { sessionOptions } from './step.ts';

export interface LoadSetup {
  preset: string;
  finetune: 'lora' | 'full';
  codec: string;
  sessions: number;
  policyClients: number;
  durationS: number;
  datums: Datum[];
  policyUrl: string | null;
  policyMessage: Uint8Array | null;
  /**
   * Requests a second per policy client: each sends its next observation 1/policyHz s after the
   * last one left (at once when the answer came later), as a robot's control loop does; 0 is a
   * closed loop with no pause (each client sends again as soon as its answer arrives).
   */
  policyHz: number;
  /** Timed requests of the idle phase (after 3 untimed ones); 0 skips it. */
  idleRequests: number;
  /** Called once a second with the elapsed seconds (progress on stderr). */
  onTick?: (tS: number, steps: number, inferences: number) => void;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export function warmupSeconds(durationS: number): number {
  return Math.min(20, Math.max(1, Math.round(durationS * 0.25)));
}

export async function runLoad(server: ServerProc, setup: LoadSetup): Promise<LoadResult> {
  const client = new VelaClient(server.baseUrl, server.apiKey);
  const errors: string[] = [];
  let errorCount = 0;
  const fail = (e: unknown) => {
    errorCount++;
    if (errors.length < 5) errors.push((e as Error).message);
  };
  const before = (await server.stats()).tensors;
  const policies = setup.policyUrl && setup.policyMessage ? await Promise.all(Array.from({ length: setup.policyClients }, () => PolicyConnection.open(setup.policyUrl!))) : [];
  // The idle phase: one client, nothing else running (the other clients are connected but silent).
  const idleMs: number[] = [];
  const idleEngineMs: number[] = [];
  if (policies.length > 0 && setup.idleRequests > 0) {
    const samples = await timeCalls(setup.idleRequests, 3, async () => idleEngineMs.push(Number((await policies[0]!.infer(setup.policyMessage!)).policy_timing?.infer_ms)));
    idleMs.push(...samples);
    idleEngineMs.splice(0, 3);
  }
  const opened: { id: string; conn: SessionConnection }[] = [];
  for (let i = 0; i < setup.sessions; i++) {
    const s = await client.waitReady((await client.createSession({ base_model: setup.preset, ...sessionOptions(setup.finetune), seed: i })).id);
    opened.push({ id: s.id, conn: await client.connect(s) });
  }
  const step = async (conn: SessionConnection) => {
    await conn.forwardBackward(setup.datums, { codec: setup.codec });
    await conn.optimStep({ learning_rate: 1e-5 });
  };
  await Promise.all(opened.map((o) => step(o.conn).catch(fail)));
  const afterWarmupTensors = (await server.stats()).tensors;

  const warmupS = warmupSeconds(setup.durationS);
  const t0 = performance.now();
  const endAt = t0 + setup.durationS * 1000;
  const measureFrom = t0 + warmupS * 1000;
  const stepMs: number[] = [];
  const inferMs: number[] = [];
  const engineMs: number[] = [];
  let steps = 0;
  let inferences = 0;
  const trace: MemorySample[] = [];
  const sampleRss = () => {
    const rss = server.rss();
    if (rss !== null) trace.push({ tS: (performance.now() - t0) / 1000, rssBytes: rss });
  };
  sampleRss();
  const timer = setInterval(() => {
    sampleRss();
    setup.onTick?.((performance.now() - t0) / 1000, steps, inferences);
  }, 1000);
  const loops = [
    ...opened.map(async ({ conn }) => {
      while (performance.now() < endAt && !conn.closed) {
        const s = performance.now();
        try {
          await step(conn);
          if (s >= measureFrom) stepMs.push(performance.now() - s);
          steps++;
        } catch (e) {
          fail(e);
        }
      }
    }),
    ...policies.map(async (p, i) => {
      const periodMs = setup.policyHz > 0 ? 1000 / setup.policyHz : 0;
      // Paced clients start spread over one period, as robots that were switched on apart.
      if (periodMs > 0) await sleep((periodMs * i) / policies.length);
      while (performance.now() < endAt) {
        const s = performance.now();
        try {
          const a = await p.infer(setup.policyMessage!);
          if (s >= measureFrom) {
            inferMs.push(performance.now() - s);
            engineMs.push(Number(a.policy_timing?.infer_ms));
          }
          inferences++;
        } catch (e) {
          fail(e);
          break;
        }
        const rest = s + periodMs - performance.now();
        if (rest > 0) await sleep(rest);
      }
    }),
  ];
  await Promise.all(loops);
  clearInterval(timer);
  sampleRss();
  const elapsedS = (performance.now() - t0) / 1000;
  const end = (await server.stats()).tensors;
  await Promise.all(policies.map((p) => p.close()));
  for (const o of opened) {
    await o.conn.close();
    await client.closeSession(o.id).catch(fail);
  }
  const afterClose = (await server.stats()).tensors;
  const post = trace.filter((m) => m.tS >= warmupS);
  const atWarmup = post[0] ?? trace[trace.length - 1]!;
  // RSS saw-tooths with garbage collection; the floor (minimum) of the first and last thirds
  // after warm-up shows growth that survives collection.
  const third = Math.max(1, Math.floor(post.length / 3));
  const floor = (xs: MemorySample[]) => (xs.length ? Math.min(...xs.map((m) => m.rssBytes)) : 0);
  const inferLatency = inferMs.length ? summarize(inferMs) : null;
  const idleLatency = idleMs.length ? summarize(idleMs) : null;
  const p50 = (xs: number[]) => (xs.filter(Number.isFinite).length ? summarize(xs.filter(Number.isFinite)).p50 : null);
  return {
    sessions: setup.sessions, policyClients: policies.length, policyHz: setup.policyHz, durationS: elapsedS, warmupS,
    steps, stepsPerS: steps / elapsedS, stepLatency: stepMs.length ? summarize(stepMs) : null,
    inferences, inferencesPerS: inferences / elapsedS, inferLatency, idleLatency,
    p99OverIdle: inferLatency && idleLatency ? inferLatency.p99 / idleLatency.p99 : null,
    engineInferMs: { idle: p50(idleEngineMs), loaded: p50(engineMs) },
    errors: errorCount, errorMessages: errors,
    rss: {
      afterWarmupBytes: atWarmup?.rssBytes ?? 0, endBytes: trace[trace.length - 1]?.rssBytes ?? 0,
      floorStartBytes: floor(post.slice(0, third)), floorEndBytes: floor(post.slice(-third)),
      maxBytes: Math.max(0, ...trace.map((m) => m.rssBytes)),
      slopeBytesPerMin: slope(post.map((m) => m.tS / 60), post.map((m) => m.rssBytes)), trace,
    },
    tensors: { before, afterWarmup: afterWarmupTensors, end, afterClose },
  };
}
