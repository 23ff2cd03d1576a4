/**
 * Test helper: a real Vela server on 127.0.0.1 with a free port and a temporary data folder.
 * `engineFactory` may inject a stub engine (tests of the transport without model compute).
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { loadConfig, type ServerConfig } from '../../server/config.ts';
import { startServer, type ServerHandle, type StartOptions } from '../../server/app.ts';
import type { EngineFactory } from '../../server/sessions/sessions.ts';
import { log } from '../../server/log.ts';
import { TEST_BACKENDS } from './tf.ts';

export interface TestServer extends ServerHandle {
  apiKey: string;
  dataDir: string;
  config: ServerConfig;
}

export const TEST_KEY = 'vela-test-key-0123456789';

export async function startTestServer(opts: { env?: Record<string, string>; engineFactory?: EngineFactory; dataDir?: string; start?: StartOptions } = {}): Promise<TestServer> {
  log.setLevel(process.env.VELA_TEST_LOG ?? 'error');
  const dataDir = opts.dataDir ?? fs.mkdtempSync(path.join(os.tmpdir(), 'vela-test-'));
  // Tests name their tiny bases by temp folders: a one-user server (test/base-access.test.ts runs without it).
  const { config } = loadConfig([], { VELA_PORT: '0', VELA_DATA_DIR: dataDir, VELA_API_KEY: TEST_KEY, VELA_BACKEND: TEST_BACKENDS[0]!, VELA_ALLOW_ABSOLUTE_BASES: '1', ...opts.env });
  const server = await startServer(config, { ...opts.start, engineFactory: opts.engineFactory });
  return Object.assign(server, { apiKey: TEST_KEY, dataDir, config });
}

/** fetch with the test key; returns status and parsed JSON. */
export async function api(server: { baseUrl: string }, method: string, url: string, body?: unknown, key: string | null = TEST_KEY): Promise<{ status: number; json: any }> {
  const res = await fetch(server.baseUrl + url, {
    method,
    headers: { ...(key ? { authorization: `Bearer ${key}` } : {}), ...(body !== undefined ? { 'content-type': 'application/json' } : {}) },
    body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let json: any = null;
  try {
    json = JSON.parse(text);
  } catch {
    json = text;
  }
  return { status: res.status, json };
}
