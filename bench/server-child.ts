/**
 * The bench's server process: a real Vela server (session websocket, REST) on 127.0.0.1 with a
 * temporary data folder, run apart from the clients so its RSS is the server's alone. The parent
 * (bench/server-proc.ts) drives it over Node IPC:
 *   {id, cmd: 'stats'}          -> {rssBytes, heapUsedBytes, tensors: number | null, engine}
 *   {id, cmd: 'policy', dir, another?} -> {wsUrl}: a policy server (OpenPI protocol) on the same engine (another: beside the one served)
 *   {id, cmd: 'close'}          -> {} then exits
 * Tensor counts come from the engine op `stats` ({numTensors}); null when the engine lacks it.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { loadConfig } from '../server/config.ts';
import { startServer } from '../server/app.ts';
import { Engine, type EngineLike } from '../server/engine/host.ts';
import { startPolicyServer, type PolicyServerHandle } from '../server/policy/index.ts';
import { log } from '../server/log.ts';
import { engineOptions } from '../server/sessions/sessions.ts';

const API_KEY = 'vela-bench-key-0123456789';
const preset = process.env.VELA_BENCH_PRESET ?? 'flow05-tiny';
const backend = process.env.VELA_BACKEND ?? 'auto';

async function main(): Promise<void> {
  log.setLevel(process.env.VELA_BENCH_LOG ?? 'error');
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'vela-bench-'));
  const { config } = loadConfig([], { VELA_HOST: '127.0.0.1', VELA_PORT: '0', VELA_DATA_DIR: dataDir, VELA_API_KEY: API_KEY, VELA_BACKEND: backend, VELA_SESSIONS_PER_KEY: '64', VELA_POLICY_BACKEND: process.env.VELA_POLICY_BACKEND ?? 'same', VELA_TRAINING_YIELD_MS: process.env.VELA_TRAINING_YIELD_MS ?? '' });
  const engines = new Map<string, EngineLike>();
  const server = await startServer(config, {
    // The server's own lanes (a policy engine beside the training one, training yielding to it),
    // recorded for the stats command.
    engineFactory: async (p, lane) => {
      const e = await Engine.start(engineOptions(config, p, lane));
      engines.set(`${p}/${lane.role}`, e);
      return e;
    },
  });
  const policies: PolicyServerHandle[] = [];
  const engine = () => server.sessions.engineFor(preset);
  const handlers: Record<string, (m: any) => Promise<unknown>> = {
    async stats() {
      const e = await engine();
      let tensors: number | null = null;
      try {
        const r = await e.call<{ result: { numTensors: number } }>('__bench__', 'stats');
        tensors = r.result.numTensors;
      } catch {
        tensors = null; // the engine has no stats op
      }
      const mem = process.memoryUsage();
      return { rssBytes: mem.rss, heapUsedBytes: mem.heapUsed, tensors, engine: e.stats(), trainingHeld: server.sessions.gate.held };
    },
    async policy(m) {
      // `another`: a second policy server beside the first (its own port, batcher and clients).
      if (!m.another) {
        for (const p of policies) await p.close();
        policies.length = 0;
      }
      const p = await startPolicyServer({ engine: await server.sessions.policyEngineFor(preset), checkpointDir: m.dir, policyId: `bench-policy-${policies.length}`, seed: 0, port: 0 });
      policies.push(p);
      return { wsUrl: p.wsUrl };
    },
    async close() {
      for (const p of policies) await p.close();
      await server.close();
      fs.rmSync(dataDir, { recursive: true, force: true });
      return {};
    },
  };
  process.on('message', (m: any) => {
    const h = handlers[m.cmd];
    const p = h ? h(m) : Promise.reject(new Error(`unknown command ${m.cmd}`));
    p.then(
      (result) => {
        process.send!({ id: m.id, result });
        if (m.cmd === 'close') setTimeout(() => process.exit(0), 50);
      },
      (e: Error) => process.send!({ id: m.id, error: e.message }),
    );
  });
  process.send!({ kind: 'ready', baseUrl: server.baseUrl, apiKey: API_KEY, pid: process.pid });
}

main().catch((e) => {
  process.stderr.write(`bench server: ${(e as Error).stack ?? e}\n`);
  process.exit(1);
});
