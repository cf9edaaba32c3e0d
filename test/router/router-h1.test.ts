// The router's built-in HTTP/1.1 upstream client against raw TCP servers that
// answer byte by byte, chunked, with 1xx, Connection: close, or close idle
// keep-alive connections: the parser and connection reuse under real sockets.
import t from 'tap';
import type { Socket } from 'node:net';
import { NativeUpstreamClient } from '../../src/proxy/native-client.js';
import { EndpointSet } from '../../src/endpoints/endpoint.js';
import type { UpstreamClient } from '../../src/proxy/upstream.js';
import { DEFAULTS } from '../../src/config/schema.js';
import { collect as collectAt, rawEngine } from '../support/router-util.js';


// the native client over an endpoint given by IP address, and by DNS name (the
// TypeScript client these cases also ran over served names until it was retired)
const CLIENTS = [
  ['native', NativeUpstreamClient, '127.0.0.1'],
  ['native, endpoint named localhost', NativeUpstreamClient, 'localhost'],
] as const;

const collect = collectAt;


async function dribble(sock: Socket, text: string): Promise<void> {
  for (const ch of text) {
    sock.write(ch, 'latin1');
    await new Promise((r) => setImmediate(r));
  }
}

for (const [name, Client, host] of CLIENTS) {
  const rawServer = (t: Tap.Test, f: Parameters<typeof rawEngine>[1]) => rawEngine(t, f, host);
  t.test(`${name}: chunked body and headers arriving one byte at a time; 1xx skipped; keep-alive reuse`, async (t) => {
    const { set, conns } = await rawServer(t, (sock, n) => {
      const body = `data: {"n":${n}}\n\n`;
      const resp =
        'HTTP/1.1 100 Continue\r\n\r\n' +
        'HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nX-Other: y\r\n\r\n' +
        `${body.length.toString(16)};ext=1\r\n${body}\r\n` +
        `5\r\nhello\r\n0\r\nTrailer-A: b\r\n\r\n`;
      void dribble(sock, resp);
    });
    const client = new Client(DEFAULTS.proxy);
    t.teardown(() => client.close());
    for (let i = 1; i <= 3; i++) {
      const r = await collect(client, set);
      t.equal(r.error, undefined, `request ${i}: no error`);
      t.equal(r.status, 200);
      t.equal(r.contentType, 'text/event-stream');
      t.equal(r.body, `data: {"n":${i}}\n\nhello`, `request ${i}: de-chunked body`);
    }
    t.equal(conns(), 1, 'one keep-alive connection reused');
  });

  t.test(`${name}: content-length body split across writes; Connection: close is honoured`, async (t) => {
    const { set, conns } = await rawServer(t, (sock, n) => {
      const body = JSON.stringify({ n, pad: 'x'.repeat(5000) });
      sock.write(`HTTP/1.1 201 Created\r\nContent-Length: ${body.length}\r\ncontent-type: application/json\r\n${n === 1 ? 'Connection: close\r\n' : ''}\r\n`);
      sock.write(body.slice(0, 100));
      setTimeout(() => {
        sock.write(body.slice(100));
        if (n === 1) sock.end();
      }, 5);
    });
    const client = new Client(DEFAULTS.proxy);
    t.teardown(() => client.close());
    const a = await collect(client, set);
    t.equal(a.status, 201);
    t.equal(JSON.parse(a.body).n, 1);
    const b = await collect(client, set);
    t.equal(JSON.parse(b.body).n, 2);
    t.equal(conns(), 2, 'the closed connection was not reused');
  });

  t.test(`${name}: an idle keep-alive connection closed by the endpoint: the next request goes out on a fresh one`, async (t) => {
    const { set, conns } = await rawServer(t, (sock, n, conn) => {
      sock.write(`HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n${n}${conn}`);
      if (n === 1) setTimeout(() => sock.destroy(), 20); // close the idle connection after the response
    });
    const client = new Client(DEFAULTS.proxy);
    t.teardown(() => client.close());
    t.equal((await collect(client, set)).body, '11');
    await new Promise((r) => setTimeout(r, 60));
    const r = await collect(client, set);
    t.equal(r.error, undefined, 'no error surfaced');
    t.equal(r.body, '22', 'answered on connection 2');
    t.equal(conns(), 2);
  });

  t.test(`${name}: errors: refused connection, reset mid-body, malformed status line`, async (t) => {
    const refused = new EndpointSet([{ name: 'p', engine: 'vllm', accelerator: 'nvidia', models: ['m'], endpoints: [{ name: 'gone', url: `http://${host}:1`, role: 'both' }] }]);
    const client = new Client(DEFAULTS.proxy);
    t.teardown(() => client.close());
    const a = await collect(client, refused);
    t.match(a.error, { code: 'ECONNREFUSED' });
    const { set } = await rawServer(t, (sock, n) => {
      if (n === 1) {
        sock.write('HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial');
        setTimeout(() => sock.destroy(), 10);
      } else sock.write('SPDY/9 what\r\n\r\n');
    });
    const client2 = new Client(DEFAULTS.proxy); // pools are keyed by endpoint id: a new set needs its own client
    t.teardown(() => client2.close());
    const b = await collect(client2, set);
    t.equal(b.status, 200);
    t.equal(b.body, 'partial');
    t.match(b.error, { code: 'ECONNRESET' }, 'reset mid-body surfaces as an error after the data');
    const c = await collect(client2, set);
    t.match(c.error, { code: 'EPROTO' }, 'malformed status line');
  });

  t.test(`${name}: a malformed or conflicting content-length and an unasked-for 101 are protocol errors, not a body read until close`, async (t) => {
    const heads = [
      'HTTP/1.1 200 OK\r\nContent-Length: 2x\r\n\r\nok',
      'HTTP/1.1 200 OK\r\nContent-Length:\r\n\r\nok',
      'HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok',
      'HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\nok',
      'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n',
    ];
    // the engine leaves every connection open: a client that read "until close" would hang
    const { set } = await rawServer(t, (sock, n) => {
      sock.write(n <= heads.length ? heads[n - 1]! : 'HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok');
    });
    const client = new Client({ ...DEFAULTS.proxy, bodyTimeoutMs: 5000 });
    t.teardown(() => client.close());
    for (const head of heads) {
      const r = await collect(client, set);
      t.match(r.error, { code: 'EPROTO' }, `${JSON.stringify(head.slice(0, 60))}: ${r.error?.message ?? `answered ${r.status} ${JSON.stringify(r.body)}`}`);
    }
    const ok = await collect(client, set);
    t.equal(ok.error, undefined, 'a repeated content-length with the same value is fine');
    t.equal(ok.body, 'ok');
  });
}
