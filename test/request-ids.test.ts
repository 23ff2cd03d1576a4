/**
 * Request ids come back exactly as sent (issue 13, item 4; PROTOCOL.md section 3 "Request ids"):
 * the session websocket echoes every msgpack integer (int64 and uint64 extremes included) and
 * every string id byte for byte, and refuses other types with an error answer whose id is nil;
 * the futures API compares and echoes `seq_id` exactly, in JSON and in msgpack. Real server,
 * real engine, raw msgpack bytes on the wire.
 */
import WebSocket from 'ws';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { VelaClient, type SessionJson } from '../protocol/client.ts';
import { mapValueBytes, pack, RawMsgpack, unpack } from '../protocol/msgpack.ts';
import { startTestServer, type TestServer } from './helpers/server.ts';

let server: TestServer;
let client: VelaClient;
let session: SessionJson;

beforeAll(async () => {
  server = await startTestServer();
  client = new VelaClient(server.baseUrl, server.apiKey);
  session = await client.waitReady((await client.createSession({ base_model: 'flow05-tiny' })).id);
});
afterAll(() => server?.close());

const u64 = (n: bigint) => { const b = Buffer.alloc(9); b[0] = 0xcf; b.writeBigUInt64BE(n, 1); return b; };
const i64 = (n: bigint) => { const b = Buffer.alloc(9); b[0] = 0xd3; b.writeBigInt64BE(n, 1); return b; };
const str = (s: string) => pack(s);
const hex = (b: Uint8Array | null) => Buffer.from(b ?? []).toString('hex');

/** A request map `{"id": <raw bytes>, "op": op}` written byte by byte, so the id keeps its exact msgpack type. */
function request(idBytes: Uint8Array | null, op = 'heartbeat'): Buffer {
  const parts: Uint8Array[] = [Buffer.from([idBytes ? 0x82 : 0x81])];
  if (idBytes) parts.push(Buffer.from([0xa2, 0x69, 0x64]), Buffer.from(idBytes));
  parts.push(Buffer.from([0xa2, 0x6f, 0x70]), pack(op));
  return Buffer.concat(parts);
}

/** A raw websocket to the session: sends bytes, resolves each answer's bytes in order. */
async function open(): Promise<{ info: Buffer; send(b: Buffer): Promise<Buffer>; close(): void }> {
  const ws = new WebSocket(session.url, { headers: { authorization: `Bearer ${session.token}` } });
  const queue: ((b: Buffer) => void)[] = [];
  const first = new Promise<Buffer>((resolve) => queue.push(resolve));
  ws.on('message', (d: Buffer) => queue.shift()?.(d));
  const info = await first;
  return {
    info,
    send: (b) => new Promise<Buffer>((resolve) => { queue.push(resolve); ws.send(b); }),
    close: () => ws.close(),
  };
}

describe('session websocket: the id table', () => {
  const table: [string, Buffer][] = [
    ['positive fixint 0', Buffer.from([0x00])],
    ['negative fixint -1', Buffer.from([0xff])],
    ['uint8 200', Buffer.from([0xcc, 200])],
    ['int8 -100', Buffer.from([0xd0, 0x9c])],
    ['uint16 65535', Buffer.from([0xcd, 0xff, 0xff])],
    ['uint32 2^32 - 1', Buffer.from([0xce, 0xff, 0xff, 0xff, 0xff])],
    ['int32 -2^31', Buffer.from([0xd2, 0x80, 0, 0, 0])],
    ['uint64 2^53 + 1 (the issue)', u64(2n ** 53n + 1n)],
    ['int64 2^53 + 1', i64(2n ** 53n + 1n)],
    ['uint64 Python time.time_ns()', u64(1_764_535_123_456_789_123n)],
    ['uint64 max 2^64 - 1', u64(2n ** 64n - 1n)],
    ['int64 max 2^63 - 1', i64(2n ** 63n - 1n)],
    ['int64 min -2^63', i64(-(2n ** 63n))],
    ['uint64 holding 5 (not the shortest form)', u64(5n)],
    ['fixstr', str('req-7')],
    ['str8 (Python writes str8 from 32 bytes)', str('x'.repeat(40))],
    ['str16 of 256 bytes (the limit)', str('y'.repeat(256))],
    ['UTF-8 string', str('étape-ß-🤖')],
  ];

  it('echoes every integer msgpack can hold, and strings, byte for byte: in results, in errors and in last_request_id', async () => {
    const c = await open();
    for (const [name, id] of table) {
      const answer = await c.send(request(id));
      expect(Buffer.from(mapValueBytes(answer, 'id')!).toString('hex'), name).toBe(id.toString('hex'));
      expect((unpack(answer) as Map<string, unknown>).get('result'), name).toEqual(new Map());
      // An error answer carries the same bytes.
      const err = await c.send(request(id, 'dance'));
      expect(Buffer.from(mapValueBytes(err, 'id')!).toString('hex'), `${name} (error)`).toBe(id.toString('hex'));
      expect((unpack(err) as Map<string, unknown>).get('error')).toMatch(/unknown op "dance"/);
    }
    c.close();
    // A new connection learns the last id that got a result, as sent; the REST object has its value.
    const again = await open();
    expect(Buffer.from(mapValueBytes(mapInfo(again.info), 'last_request_id')!).toString('hex')).toBe(str('étape-ß-🤖').toString('hex'));
    const big = await again.send(request(u64(2n ** 64n - 1n), 'abort_gradient_epoch'));
    expect(hex(mapValueBytes(big, 'id'))).toBe(hex(u64(2n ** 64n - 1n)));
    const rest = await client.getSession(session.id);
    expect(rest.last_request_id).toBe('18446744073709551615');
    expect((rest as any).last_op).toMatchObject({ op: 'abort_gradient_epoch', id: '18446744073709551615', ok: true });
    await again.send(request(Buffer.from([0xcd, 0x30, 0x39])));
    expect((await client.getSession(session.id)).last_request_id).toBe(12345);
    again.close();
  });

  it('refuses other types with an error answer whose id is nil, and the session goes on', async () => {
    const c = await open();
    const refused: [Buffer | null, RegExp][] = [
      [Buffer.from([0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0]), /"id" must be an integer or a string, got a float/], // 1.5
      [Buffer.from([0xcb, 0x40, 0x08, 0, 0, 0, 0, 0, 0]), /got a float/], // 3.0: Python writes floats as float64
      [Buffer.from([0xc0]), /got nil/],
      [Buffer.from([0xc3]), /got a boolean/],
      [Buffer.from([0xc4, 0x01, 0x07]), /got bytes/],
      [Buffer.from([0x91, 0x01]), /got an array/],
      [str('z'.repeat(257)), /"id" is a string of 257 bytes; the limit is 256/],
      [null, /the request has no "id": send an integer or a string/],
    ];
    for (const [id, msg] of refused) {
      const a = unpack(await c.send(request(id))) as Map<string, unknown>;
      expect(a.get('id')).toBeNull();
      expect(a.get('error')).toMatch(msg);
    }
    const ok = await c.send(request(Buffer.from([0x2a])));
    expect((unpack(ok) as Map<string, unknown>).get('id')).toBe(42);
    c.close();
  });
});

/** The info message as a Map (it is `{"info": {...}}`): the bytes of its inner map. */
function mapInfo(bytes: Buffer): Uint8Array {
  return mapValueBytes(bytes, 'info')!;
}

describe('futures API: seq_id compared and echoed exactly', () => {
  const post = async (route: string, body: string | Buffer, type: string) => {
    const res = await fetch(`${server.baseUrl}/api/v1/${route}`, { method: 'POST', headers: { authorization: `Bearer ${server.apiKey}`, 'content-type': type }, body });
    return { status: res.status, bytes: Buffer.from(await res.arrayBuffer()) };
  };

  it('JSON: seq_ids past 2^53 stay distinct, run in order and come back with the same digits', async () => {
    const created = JSON.parse((await post('create_model', '{"base_model": "flow05-tiny"}', 'application/json')).bytes.toString());
    const model = created.model_id as string;
    const a = await post('abort_gradient_epoch', `{"model_id": "${model}", "seq_id": 9007199254740993}`, 'application/json');
    expect(a.status).toBe(200);
    expect(a.bytes.toString()).toMatch(/"seq_id":9007199254740993\}$/);
    // 2^53 + 2 is the next in line (a float64 reader would see 2^53 + 1 and 2^53 + 2 as 2^53 and 2^53 + 2).
    const b = await post('abort_gradient_epoch', `{"model_id": "${model}", "seq_id": 9007199254740994}`, 'application/json');
    expect(b.bytes.toString()).toMatch(/"seq_id":9007199254740994\}$/);
    const retrieved = await post('retrieve_future', JSON.stringify({ request_id: JSON.parse(b.bytes.toString()).request_id }), 'application/json');
    expect(JSON.parse(retrieved.bytes.toString())).toEqual({ discarded: 0 });
    // A retry of the same body gets the same request id; another body under that seq_id is a 409 quoting it exactly.
    const retry = await post('abort_gradient_epoch', `{"model_id": "${model}", "seq_id": 9007199254740993}`, 'application/json');
    expect(JSON.parse(retry.bytes.toString()).request_id).toBe(JSON.parse(a.bytes.toString()).request_id);
    const other = await post('abort_gradient_epoch', `{"seq_id": 9007199254740993, "model_id": "${model}"}`, 'application/json');
    expect(other.status).toBe(409);
    expect(JSON.parse(other.bytes.toString()).error).toMatch(/^seq_id 9007199254740993 of model ts-\w+ was already used/);
    for (const [seq, msg] of [['18446744073709551616', /got 18446744073709551616$/], ['-1', /got -1$/], ['1.5', /got 1.5$/], ['"7"', /got "7"$/]] as const) {
      const bad = await post('abort_gradient_epoch', `{"model_id": "${model}", "seq_id": ${seq}}`, 'application/json');
      expect(bad.status, seq).toBe(400);
      expect(JSON.parse(bad.bytes.toString()).error).toMatch(/^seq_id must be an integer in 0\.\.2\^64 - 1, /);
      expect(JSON.parse(bad.bytes.toString()).error).toMatch(msg);
    }
    await post('kill_session', JSON.stringify({ model_id: model }), 'application/json');
  });

  it('msgpack: a uint64 seq_id comes back as the same uint64 bytes', async () => {
    const created = unpack((await post('create_model', pack(new Map([['base_model', 'flow05-tiny']])), 'application/msgpack')).bytes) as Map<string, any>;
    const model = created.get('model_id') as string;
    for (const seq of [u64(2n ** 64n - 2n), u64(2n ** 64n - 1n)]) {
      const body = pack(new Map<string, unknown>([['model_id', model], ['seq_id', new RawMsgpack(seq)]]));
      const a = await post('abort_gradient_epoch', body, 'application/msgpack');
      expect(a.status).toBe(200);
      expect(hex(mapValueBytes(a.bytes, 'seq_id'))).toBe(hex(seq));
    }
    await post('kill_session', pack(new Map([['model_id', model]])), 'application/msgpack');
  });
});
