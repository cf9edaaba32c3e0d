// The floor of Switchyard's HTTP stack: the least a proxy built from the same
// parts (uWebSockets.js for clients, the addon's native upstream client for
// engines, one JS thread) can cost per request. It relays every POST to one
// engine and the engine's answer back, and does nothing a router does: no
// JSON parsing, no prompt hashing, no scheduling, no metrics, no flow control,
// no retries. The overhead scenario runs it beside Switchyard and nginx, so a
// report shows how much of Switchyard's cost is its own work and how much the
// stack it stands on costs per request.
//
//   node dist/bench/lib/relay-floor.js <port> <engine port>
// GET /health answers 200 (readiness); other methods get 404.
import { uws, type HttpResponse } from '../../src/uws.js';
import {
  NativeUpstreamConnections,
  UPSTREAM_EVENT_DATA,
  UPSTREAM_EVENT_END,
  UPSTREAM_EVENT_ERROR,
  UPSTREAM_EVENT_HEAD,
} from '../../bindings/upstream-client.js';

class Relay {
  readonly res: HttpResponse;
  aborted = false;
  status = 0;
  body: Buffer | null = null;
  chunks: Buffer[] = [];

  constructor(res: HttpResponse) {
    this.res = res;
  }

  onAborted(): void {
    this.aborted = true;
  }

  onData(ab: ArrayBuffer, last: boolean): void {
    const piece = Buffer.from(new Uint8Array(ab)); // a copy: uWS reuses the memory after the callback
    if (!last) {
      this.chunks.push(piece);
      return;
    }
    this.chunks.push(piece);
    send(this, this.chunks.length === 1 ? piece : Buffer.concat(this.chunks));
    this.chunks = [];
  }
}

const [port, enginePort] = process.argv.slice(2).map(Number);
if (!(port! > 0) || !(enginePort! > 0)) {
  console.error('usage: relay-floor <port> <engine port>');
  process.exit(2);
}
const HEAD = `POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1:${enginePort}\r\ncontent-type: application/json\r\n`;
const calls: (Relay | undefined)[] = [];
const free: number[] = [];
let cur: Relay;

function corkedAnswer(): void {
  const r = cur;
  if (r.status !== 200) r.res.writeStatus(`${r.status} Upstream`);
  r.res.writeHeader('content-type', 'application/json').end(r.body ?? '');
}

const conns = new NativeUpstreamConnections(
  { connectTimeoutMs: 5000, headersTimeoutMs: 60_000, bodyTimeoutMs: 60_000, connectionsPerEndpoint: 4096 },
  (count) => {
    const ev = conns.events;
    for (let k = 0; k < count; k++) {
      const o = k << 3;
      const id = ev[o + 1]!;
      const r = calls[id];
      if (r === undefined) continue;
      switch (ev[o]) {
        case UPSTREAM_EVENT_HEAD:
          r.status = ev[o + 2]!;
          break;
        case UPSTREAM_EVENT_DATA: {
          const off = ev[o + 2]!;
          const piece = Buffer.from(conns.arena.subarray(off, off + ev[o + 3]!)); // the arena is reused next turn
          r.body = r.body === null ? piece : Buffer.concat([r.body, piece]);
          break;
        }
        case UPSTREAM_EVENT_END:
        case UPSTREAM_EVENT_ERROR:
          calls[id] = undefined;
          free.push(id);
          if (ev[o] === UPSTREAM_EVENT_ERROR) {
            r.status = 502;
            r.body = null;
          }
          if (!r.aborted) {
            cur = r;
            r.res.cork(corkedAnswer);
          }
          break;
      }
    }
  },
);
conns.addPool(0, '127.0.0.1', enginePort!);

function send(r: Relay, body: Buffer): void {
  let id = free.pop();
  if (id === undefined) id = calls.length;
  calls[id] = r;
  conns.send(id, 0, `${HEAD}content-length: ${body.length}\r\n\r\n`, body);
}

const app = uws.App();
app.post('/*', (res) => {
  const r = new Relay(res);
  res.onAborted(r.onAborted.bind(r));
  res.onData(r.onData.bind(r));
});
app.get('/health', (res) => {
  res.cork(() => res.end('ok'));
});
app.any('/*', (res) => {
  res.cork(() => res.writeStatus('404 Not Found').end());
});
app.listen('127.0.0.1', port!, (sock) => {
  if (!sock) {
    console.error(`relay-floor: cannot listen on ${port}`);
    process.exit(1);
  }
});
for (const sig of ['SIGINT', 'SIGTERM'] as const) process.once(sig, () => process.exit(0));
