/**
 * A minimal OpenPI websocket client (PROTOCOL.md section 6) for the bench: metadata on connect,
 * then `infer(bytes)` sends one packed (optionally zstd-compressed) observation and resolves with
 * the decoded answer; answers come in request order. A text frame is the server's error.
 */
import WebSocket from 'ws';
import { unpackNumpy } from '../protocol/ndarray.ts';

export class OpenPiClient {
  metadata: Record<string, any> = {};
  private queue: { resolve: (v: any) => void; reject: (e: Error) => void }[] = [];
  private closedWith: Error | null = null;

  private constructor(private ws: WebSocket) {}

  static connect(url: string): Promise<OpenPiClient> {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(url, { perMessageDeflate: false, maxPayload: 0 });
      const c = new OpenPiClient(ws);
      let opened = false;
      ws.on('message', (data: Buffer, binary: boolean) => {
        if (!opened) {
          opened = true;
          c.metadata = unpackNumpy(data) as Record<string, any>;
          return resolve(c);
        }
        const w = c.queue.shift();
        if (!w) return;
        if (binary) w.resolve(unpackNumpy(data));
        else w.reject(new Error(`policy server error: ${data.toString().split('\n')[0]}`));
      });
      ws.on('error', (e) => !opened && reject(e));
      ws.on('close', (code, reason) => {
        c.closedWith = new Error(`policy connection closed (${code}${reason.length ? `: ${reason}` : ''})`);
        for (const w of c.queue.splice(0)) w.reject(c.closedWith);
        if (!opened) reject(c.closedWith);
      });
    });
  }

  /** Sends one observation message; resolves with the answer map (actions, policy_timing, ...). */
  infer(message: Uint8Array): Promise<Record<string, any>> {
    if (this.closedWith) return Promise.reject(this.closedWith);
    return new Promise((resolve, reject) => {
      this.queue.push({ resolve, reject });
      this.ws.send(message, { binary: true });
    });
  }

  close(): Promise<void> {
    if (this.closedWith) return Promise.resolve();
    return new Promise((r) => {
      this.ws.once('close', () => r());
      this.ws.close(1000);
    });
  }
}
