// One HTTP/1.1 behaviour for the router: the same scripted engine bytes, over
// real loopback sockets, through the plain-http client (the native one) to an
// endpoint given by IP address and to one given by DNS name (`localhost`,
// resolved in TypeScript) must give the same outcome. Each case is one of the
// places where the native client and the retired TypeScript one had drifted
// (Connection token lists, CRLF after chunk data, the chunk size line, the
// trailer bound, Transfer-Encoding's final coding, the status line); the
// expected outcome is RFC 9112's, as testkit/reference/h1-response-model.ts
// states it.
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

// short limits: a client that waits for bytes that never come fails the case fast instead of hanging it
const CFG = { ...DEFAULTS.proxy, headersTimeoutMs: 3000, bodyTimeoutMs: 3000 };

interface Result {
  status: number;
  body: string;
  error?: Error & { code?: string };
}

const collect = (client: UpstreamClient, set: EndpointSet) => collectAt(client, set, '/v1/completions');

/** A raw engine: answers the n-th request (1-based, over all connections) with answer(n); counts connections. */
const engineAt = (host: string, t: Tap.Test, answer: (n: number, sock: Socket) => void) => rawEngine(t, (sock, n) => answer(n, sock), host);

/** Connection reuse after a first answer `first` (second answer: a plain 200): 1 or 2 connections. */
const reuse: [string, string, number][] = [
  ['Connection: keep-alive, close closes (a close token anywhere in the list)', 'HTTP/1.1 200 OK\r\nConnection: keep-alive, close\r\nContent-Length: 1\r\n\r\na', 2],
  ['Connection: upgrade,CLOSE closes (tokens are case-insensitive)', 'HTTP/1.1 200 OK\r\nConnection: upgrade,CLOSE\r\nContent-Length: 1\r\n\r\na', 2],
  ['a close token in a second Connection field closes', 'HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nConnection: close\r\nContent-Length: 1\r\n\r\na', 2],
  ['Connection: close then keep-alive in another field still closes', 'HTTP/1.1 200 OK\r\nConnection: close\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\na', 2],
  ['Connection: x-closed is not a close token (kept alive)', 'HTTP/1.1 200 OK\r\nConnection: x-closed\r\nContent-Length: 1\r\n\r\na', 1],
  ['HTTP/1.0 without a keep-alive token closes', 'HTTP/1.0 200 OK\r\nConnection: upgrade\r\nContent-Length: 1\r\n\r\na', 2],
  ['HTTP/1.0 with Connection: Keep-Alive is kept alive', 'HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 1\r\n\r\na', 1],
  ['Transfer-Encoding with Content-Length: chunked wins, the connection is not reused', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 1\r\n\r\n1\r\na\r\n0\r\n\r\n', 2],
];

/** One answer, then the expected outcome: a body, or an EPROTO error. */
const outcome: [string, string, { body: string } | { error: 'EPROTO' }, boolean][] = [
  ['chunk data not followed by CRLF is a protocol error', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY4\r\nabcd\r\n0\r\n\r\n', { error: 'EPROTO' }, false],
  ['chunk data followed by a bare LF is accepted', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\n4\r\nabcd\r\n0\r\n\r\n', { body: 'abcabcd' }, false],
  ['a chunk size with trailing garbage is a protocol error', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3zz\r\nabc\r\n0\r\n\r\n', { error: 'EPROTO' }, false],
  ['a chunk size with leading space is a protocol error', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n 3\r\nabc\r\n0\r\n\r\n', { error: 'EPROTO' }, false],
  ['a chunk extension is skipped', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;name="v"\r\nabc\r\n0\r\n\r\n', { body: 'abc' }, false],
  ['a trailer section over 64 KiB is a protocol error', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nz\r\n0\r\nx-t: ' + 't'.repeat(70 * 1024), { error: 'EPROTO' }, false],
  ['trailer fields are skipped', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nz\r\n0\r\nx-a: 1\r\nx-b: 2\r\n\r\n', { body: 'z' }, false],
  ['Transfer-Encoding: xchunked is not chunked (body until close)', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: xchunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n', { body: '3\r\nabc\r\n0\r\n\r\n' }, true],
  ['Transfer-Encoding: chunked, gzip (chunked not last): body until close', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\nraw', { body: 'raw' }, true],
  ['Transfer-Encoding: gzip, Chunked is chunked', 'HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n', { body: 'abc' }, false],
  ['a status line not starting with HTTP/1. is a protocol error', 'HXXX/1.1 200 OK\r\nContent-Length: 1\r\n\r\na', { error: 'EPROTO' }, false],
  ['a status line without a space before the code is a protocol error', 'HTTP/1.1_200 OK\r\nContent-Length: 1\r\n\r\na', { error: 'EPROTO' }, false],
  ['a response head over 64 KiB is a protocol error', 'HTTP/1.1 200 OK\r\nx-pad: ' + 'p'.repeat(70 * 1024) + '\r\nContent-Length: 1\r\n\r\na', { error: 'EPROTO' }, false],
];

for (const [name, Client, host] of CLIENTS) {
  const engine = (t: Tap.Test, answer: (n: number, sock: Socket) => void) => engineAt(host, t, answer);
  for (const [what, first, want] of reuse) {
    t.test(`${name}: ${what}`, async (t) => {
      const { set, conns } = await engine(t, (n, sock) => sock.write(n === 1 ? first : 'HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nb', 'latin1'));
      const client = new Client(CFG);
      t.teardown(() => client.close());
      const a = await collect(client, set);
      t.equal(a.error, undefined, 'first answer: no error');
      t.equal(a.body, 'a', 'first body');
      const b = await collect(client, set);
      t.equal(b.error, undefined, 'second answer: no error');
      t.equal(b.body, 'b', 'second body');
      t.equal(conns(), want, want === 1 ? 'the connection was reused' : 'the connection was not reused');
    });
  }
  for (const [what, bytes, want, close] of outcome) {
    t.test(`${name}: ${what}`, async (t) => {
      const { set } = await engine(t, (_n, sock) => {
        sock.write(bytes, 'latin1');
        if (close) sock.end();
      });
      const client = new Client(CFG);
      t.teardown(() => client.close());
      const r = await collect(client, set);
      if ('error' in want) t.equal(r.error?.code, want.error, `fails with ${want.error} (got ${r.error?.code ?? 'no error'}: ${r.error?.message ?? ''})`);
      else {
        t.equal(r.error, undefined, 'no error');
        t.equal(r.body, want.body, 'body');
      }
    });
  }
}
