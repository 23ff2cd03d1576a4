/**
 * xorl's rules that the futures API follows (issue 33, items 4-8), through the real server on
 * flow05-tiny with synthetic RAW frames: full-weight training only as the reserved model
 * "default"; `normalize_loss_before_backward: true` refuses forward_backward; clipping norm
 * types other than L2 refuse optim_step; session_info says `asleep` after sleep; ZORL's fields
 * are a migration error on every route. A refused request never runs: the model's pending
 * gradients and its next step are those of a twin that was never sent it.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { syntheticBatch } from './helpers/synthetic.ts';
import { api, startTestServer, type TestServer } from './helpers/server.ts';
import { FuturesClient } from './helpers/futures-client.ts';

const LORA = { base_model: 'flow05-tiny', lora_config: { rank: 4, alpha: 8 }, seed: 5 };
let server: TestServer;
let c: FuturesClient;

beforeAll(async () => {
  server = await startTestServer();
  c = new FuturesClient(server.baseUrl, server.apiKey);
});
afterAll(() => server.close());

/** The model's session_info entry. */
async function info(model: string): Promise<any> {
  const { sessions } = await c.call('session_info', { model_id: model });
  expect(sessions).toHaveLength(1);
  return sessions[0];
}

/** Names of the key's open models. */
async function openModels(): Promise<string[]> {
  return (await c.call('session_info', undefined, 'GET')).sessions.map((s: any) => s.model_id).sort();
}

describe('xorl: full-weight training is the reserved model "default" (item 4)', () => {
  it('refuses a full-weight model by any other name, or without one; "default" is made, killed and made again', async () => {
    const d = await c.createModel({ base_model: 'flow05-tiny', model_id: 'default' });
    expect(d).toMatchObject({ model_id: 'default', finetune: 'full', status: 'ready' });
    expect(await c.raw('POST', 'create_model', { base_model: 'flow05-tiny', model_id: 'fullx', finetune: 'full' })).toEqual({
      status: 400,
      body: { error: 'full-weight mode only supports the reserved model_id="default" session (xorl); got model_id "fullx": create model_id "default" for full-weight training, or leave finetune out for a LoRA model' },
    });
    expect(await c.raw('POST', 'create_model', { base_model: 'flow05-tiny', finetune: 'full' })).toEqual({
      status: 400,
      body: { error: 'full-weight mode only supports the reserved model_id="default" session (xorl); got no model_id: create model_id "default" for full-weight training, or leave finetune out for a LoRA model' },
    });
    // A second "default" is the name taken; LoRA models of any name still open beside it.
    expect((await c.raw('POST', 'create_model', { base_model: 'flow05-tiny', model_id: 'default' })).status).toBe(409);
    expect(await c.createModel({ ...LORA, model_id: 'fullx' })).toMatchObject({ model_id: 'fullx', finetune: 'lora' });
    expect(await openModels()).toEqual(['default', 'fullx']);
    // kill_session on "default" closes it (PROTOCOL.md section 7: Vela's adaptation of xorl's "reset"), and it can be made again.
    expect(await c.call('kill_session', { model_id: 'default' })).toEqual({ model_id: 'default', status: 'closed' });
    expect(await openModels()).toEqual(['fullx']);
    expect(await c.createModel({ base_model: 'flow05-tiny', model_id: 'default' })).toMatchObject({ model_id: 'default', finetune: 'full' });
    for (const m of ['default', 'fullx']) await c.call('kill_session', { model_id: m });
  }, 120_000);
});
