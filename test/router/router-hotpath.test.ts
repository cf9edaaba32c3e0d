// Review checks of the router hot-path change (native send reading its
// arguments into a reused head buffer, the cached answer-header block, header
// names as pre-encoded bytes): what reaches the wire must be the bytes the
// plain code wrote, whatever the inputs.
import t from 'tap';
import { connect, type Socket } from 'node:net';
import { listenRaw, startTestRouter } from '../support/router-util.js';
import { uws, uwsProblem } from '../../src/uws.js';
import { headerBytes } from '../../src/server/http-exchange.js';
import { EndpointSet } from '../../src/endpoints/endpoint.js';
import { NativeUpstreamClient } from '../../src/proxy/native-client.js';
import { DEFAULTS } from '../../src/config/schema.js';

const COMPLETION = (i: number) => `{"id":"c","object":"text_completion","model":"open-model","choices":[{"index":0,"text":"engine ${i}","finish_reason":"length"}]}`;

/** One HTTP/1.1 request or response read off a socket: head bytes and body bytes. */
interface Msg {
  head: Buffer;
  body: Buffer;
}

/** Calls `onMsg` for each complete content-length-framed message arriving on `sock` (linear in the bytes: heads of megabytes arrive in many reads). */
function framed(sock: Socket, onMsg: (m: Msg) => void): void {
  let buf = Buffer.allocUnsafe(1 << 16);
  let len = 0;
  let scanned = 0; // no head end starts before this
  sock.on('data', (b: Buffer) => {
    if (len + b.length > buf.length) {
      const grown = Buffer.allocUnsafe(Math.max(buf.length * 2, len + b.length));
      buf.copy(grown, 0, 0, len);
      buf = grown;
    }
    b.copy(buf, len);
    len += b.length;
    for (;;) {
      const end = buf.subarray(0, len).indexOf('\r\n\r\n', scanned);
      if (end < 0) {
        scanned = Math.max(0, len - 3);
        return;
      }
      const m = /\r\ncontent-length: *(\d+)/i.exec(buf.toString('latin1', Math.max(0, end - 4096), end + 2));
      const blen = m ? Number(m[1]) : 0;
      if (len < end + 4 + blen) {
        scanned = end; // found again next time (cheap: it starts here)
        return;
      }
      const head = Buffer.from(buf.subarray(0, end + 4));
      const body = Buffer.from(buf.subarray(end + 4, end + 4 + blen));
      buf.copy(buf, 0, end + 4 + blen, len);
      len -= end + 4 + blen;
      scanned = 0;
      onMsg({ head, body });
    }
  });
}

/** `p`, or an error after `ms` (a request whose bytes were garbled may never be answered). */
function within<T>(ms: number, p: Promise<T>): Promise<T | Error> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<Error>((r) => (timer = setTimeout(() => r(new Error(`no answer within ${ms} ms`)), ms)));
  return Promise.race([p, late]).finally(() => clearTimeout(timer));
}

/** Sends one raw request and returns the first complete response. */
function rawExchange(port: number, req: Buffer): Promise<Msg> {
  return new Promise((resolve, reject) => {
    const s = connect(port, '127.0.0.1');
    const timer = setTimeout(() => {
      s.destroy();
      reject(new Error('no answer'));
    }, 5000);
    s.on('error', reject);
    framed(s, (m) => {
      clearTimeout(timer);
      s.destroy();
      resolve(m);
    });
    s.write(req);
  });
}

function request(path: string, idBytes: Buffer | null, body: string): Buffer {
  const parts = [Buffer.from(`POST ${path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n`)];
  if (idBytes !== null) parts.push(Buffer.from('x-request-id: '), idBytes, Buffer.from('\r\n'));
  parts.push(Buffer.from(`\r\n${body}`));
  return Buffer.concat(parts);
}

/** A response head without its Date line (it differs between two servers). */
const noDate = (h: Buffer) => h.toString('latin1').replace(/\r\nDate: [^\r]*/i, '');

/** The front ends that load on this Node (uWS only where its binary does). */
const FRONT_ENDS = uwsProblem() === null ? (['native', 'uws'] as const) : (['native'] as const);

/**
 * The native front end's answer head, written out by hand: the status line with its reason phrase, the
 * engine's content type, the endpoint's name (UTF-8), the client's request id as it sent it (bytes kept
 * as bytes, none trimmed), the length; no server header.
 */
function nativeHead(ct: Buffer, name: string, id: Buffer, bodyLength: number): string {
  return Buffer.concat([
    Buffer.from('HTTP/1.1 200 OK\r\ncontent-type: '),
    ct,
    Buffer.from(`\r\nx-switchyard-endpoint: ${name}\r\nx-request-id: `),
    id,
    Buffer.from(`\r\ncontent-length: ${bodyLength}\r\n\r\n`),
  ]).toString('latin1');
}

for (const frontEnd of FRONT_ENDS)
for (const client of ['native', 'undici'] as const) {
  t.test(`${frontEnd} front end, ${client} client: answer headers are byte for byte the reference (uWS: three writeHeader calls; native: the bytes written out; the content type as the engine's bytes) (non-ASCII names, content types, request ids)`, async (t) => {
    // content types the engines answer with, as raw bytes; the request names one by index
    const types: Buffer[] = [
      Buffer.from('application/json'),
      Buffer.from('application/json; charset=\xe9', 'latin1'), // a latin1 byte
      Buffer.from('application/json; x="é😀"'), // UTF-8 bytes
      Buffer.from('application/json;\tq=1'),
    ];
    for (let i = 0; i < 20; i++) types.push(Buffer.from(`application/x-${i}`)); // more than the per-endpoint cache holds
    types.push(types[1]!, types[0]!); // and back to early ones after the cache was cleared
    const names = ['plain', 'ëndpoint-名前-😀'];
    const urls: string[] = [];
    for (let e = 0; e < names.length; e++) {
      const { port } = await listenRaw(t, (sock) =>
        framed(sock, (m) => {
          if (m.head.toString('latin1', 0, 4) === 'GET ') {
            sock.write('HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n');
            return;
          }
          const ct = types[Number(/"prompt":"ct (\d+)"/.exec(m.body.toString())![1])]!;
          const body = COMPLETION(e);
          sock.write(Buffer.concat([Buffer.from('HTTP/1.1 200 OK\r\ncontent-type: '), ct, Buffer.from(`\r\ncontent-length: ${body.length}\r\n\r\n${body}`)]));
        }),
      );
      urls.push(`http://127.0.0.1:${port}`);
    }
    const { router } = await startTestRouter(t, {
      n: 1,
      pools: () => [{ name: 'p', models: ['open-model'], endpoints: names.map((name, i) => ({ name, url: urls[i] })) }],
      extra: { scheduling: { scorers: [], picker: 'round-robin' }, proxy: { client }, server: { frontEnd } },
    });
    t.equal(router.core.frontEnd.name, frontEnd);

    // the uWS reference: the three calls the router used to make, the content type as the engine's raw bytes
    let refCt = '';
    let refName = '';
    const app = frontEnd !== 'uws' ? null : uws.App().any('/*', (res, req) => {
      const id = req.getHeader('x-request-id');
      res.onData(() => {});
      res.onAborted(() => {});
      res.cork(() => {
        res.writeHeader('content-type', Buffer.from(refCt, 'latin1')); // the engine's bytes, relayed as they came
        res.writeHeader('x-switchyard-endpoint', refName);
        res.writeHeader('x-request-id', headerBytes(id));
        res.end(COMPLETION(names.indexOf(refName)));
      });
    });
    const refPort = app === null ? 0 : await new Promise<number>((resolve, reject) =>
      app.listen('127.0.0.1', 0, (s) => (s ? resolve(uws.us_socket_local_port(s)) : reject(new Error('listen')))),
    );
    if (app !== null) t.teardown(() => app.close());

    const ids: Buffer[] = [
      Buffer.from('plain-id'),
      Buffer.from([0x69, 0xe9, 0xff, 0x80]), // latin1 bytes
      Buffer.from('ïd-😀'), // UTF-8 bytes
      Buffer.from('r'.repeat(256)),
    ];
    let n = 0;
    for (let k = 0; k < types.length; k++) {
      for (const id of k < 4 ? ids : [ids[n % ids.length]!]) {
        n++;
        const body = JSON.stringify({ model: 'open-model', prompt: `ct ${k}`, max_tokens: 1 });
        const got = await rawExchange(router.port, request('/v1/completions', id, body));
        const served = Number(/engine (\d)/.exec(got.body.toString())![1]);
        // the native client hands the content type over one char per byte
        refCt = types[k]!.toString('latin1');
        refName = names[served]!;
        if (app === null) {
          t.equal(noDate(got.head), nativeHead(types[k]!, refName, id, got.body.length), `content type ${k}, id ${id.toString('hex').slice(0, 16)}: same head bytes`);
          t.equal(got.body.toString(), COMPLETION(served));
          continue;
        }
        const want = await rawExchange(refPort, request('/v1/completions', id, body));
        t.equal(noDate(got.head), noDate(want.head), `content type ${k}, id ${id.toString('hex').slice(0, 16)}: same head bytes`);
        t.equal(got.body.toString(), want.body.toString());
      }
    }
    // a generated id (none sent, or one over 256 bytes) is ASCII and written as it is
    for (const id of [null, Buffer.from('r'.repeat(257))]) {
      const got = await rawExchange(router.port, request('/v1/completions', id, JSON.stringify({ model: 'open-model', prompt: 'ct 0', max_tokens: 1 })));
      t.match(got.head.toString('latin1'), /\r\nx-request-id: [0-9a-f]{8}-[0-9a-z]+\r\n/, 'a generated request id');
    }
  });
}

/** A raw engine that records each request's bytes and answers `ok` (onSocket sees each connection
 * first), and a native client with one connection per endpoint to it. */
async function okEngine(t: Tap.Test, onSocket: (sock: Socket) => void) {
  const got: string[] = [];
  const { port } = await listenRaw(t, (sock) => {
    onSocket(sock);
    framed(sock, (m) => {
      got.push(m.head.toString('latin1') + m.body.toString('latin1'));
      sock.write('HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok');
    });
  });
  const set = new EndpointSet([{ name: 'p', engine: 'vllm', accelerator: 'nvidia', models: ['m'], endpoints: [{ name: 'raw', url: `http://127.0.0.1:${port}`, role: 'both' }] }]);
  const c = new NativeUpstreamClient({ ...DEFAULTS.proxy, connectionsPerEndpoint: 1 });
  t.teardown(() => c.close());
  return { got, port, set, c };
}

t.test('native: requests queued for a connection and partly written ones keep their own head bytes while later sends reuse the head buffer', async (t) => {
  // one connection per endpoint: every send after the first waits in the queue
  let hold: Socket | null = null;
  const { got, port, set, c } = await okEngine(t, (sock) => {
    sock.pause(); // nothing is read until every request was sent: writes go partial and queue
    hold = sock;
  });
  const sent: string[] = [];
  const done: Promise<Error | null>[] = [];
  for (let i = 0; i < 12; i++) {
    // heads of different lengths around and past the 4 KiB buffer; the first body is large enough to
    // stay partly unwritten while the socket is not read
    const value = String.fromCharCode(0x41 + i).repeat([10, 4000, 5000, 70_000][i % 4]!) + '\u00e9';
    const body = Buffer.alloc(i === 0 ? 8 << 20 : 3, 0x30 + i);
    const path = i % 3 === 0 ? '/a' : '/b';
    sent.push(`POST ${path} HTTP/1.1\r\nhost: 127.0.0.1:${port}\r\nx-v: ${value}\r\ncontent-length: ${body.length}\r\n\r\n${body.toString('latin1')}`);
    done.push(
      new Promise((resolve) =>
        c.send(set.all[0]!, { method: 'POST', path, headers: ['x-v', value], body }, {
          onUpstreamHeaders() {},
          onUpstreamData() {},
          onUpstreamEnd: () => resolve(null),
          onUpstreamError: (err) => resolve(err),
        }),
      ),
    );
  }
  await new Promise((r) => setTimeout(r, 50));
  (hold as Socket | null)?.resume();
  const errs = await within(5000, Promise.all(done));
  t.same(errs, sent.map(() => null), 'every call completed');
  t.equal(got.length, sent.length);
  for (let i = 0; i < sent.length; i++) t.ok(got[i] === sent[i], `request ${i} (${sent[i]!.length} bytes) arrived byte-exact`);
});

t.test('native send: bad arguments throw TypeError/RangeError', async (t) => {
  const c = new NativeUpstreamClient();
  t.teardown(() => c.close());
  const set = new EndpointSet([{ name: 'p', engine: 'vllm', accelerator: 'nvidia', models: ['m'], endpoints: [{ name: 'raw', url: 'http://127.0.0.1:9', role: 'both' }] }]);
  // registers pool 0 (the call fails to connect, which is fine)
  await new Promise<void>((resolve) =>
    c.send(set.all[0]!, { method: 'GET', path: '/', headers: [], body: null }, { onUpstreamHeaders() {}, onUpstreamData() {}, onUpstreamEnd: () => resolve(), onUpstreamError: () => resolve() }),
  );
  const n = c.conns;
  const head = 'GET / HTTP/1.1\r\n\r\n';
  const bad: [unknown[], ErrorConstructor][] = [
    [[], TypeError],
    [[0], TypeError],
    [[0, 0], TypeError],
    [[Symbol('x'), 0, head, null], TypeError],
    [[0n, 0, head, null], TypeError],
    [[0, 0n, head, null], TypeError],
    [[0, 0, Symbol('h'), null], TypeError],
    [[0, 0, new String(head), null], TypeError],
    [[0, 0, head, new DataView(new ArrayBuffer(4))], TypeError],
    [[0, 0, head, new ArrayBuffer(4)], TypeError],
    [[0, 0, head, new Uint8ClampedArray(4)], TypeError],
    [[0, 0, head, new BigInt64Array(1)], TypeError],
    [[0, 0, head, 0], TypeError],
    [[0, 0, head, false], TypeError],
    [[0, -1, head, null], RangeError],
    [[-5, 0, head, null], RangeError],
  ];
  for (const [args, E] of bad) {
    t.throws(() => (n.send as (...a: unknown[]) => void)(...args), E, `send(${args.map((a) => typeof a).join(', ')})`);
  }
});

t.test('native: aborting a partly written call and a queued one; the next requests on the pool arrive exact, with their own request line and host', async (t) => {
  const got: { port: number; text: string }[] = [];
  const servers: { port: number; socks: Set<Socket> }[] = [];
  for (let e = 0; e < 2; e++) {
    const srv = await listenRaw(t, (sock) => {
      if (e === 0 && servers[0]!.socks.size === 1) sock.pause(); // the first connection to engine 0 is not read
      framed(sock, (m) => {
        got.push({ port: servers[e]!.port, text: m.head.toString('latin1') + m.body.toString('latin1') });
        sock.write('HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok');
      });
    });
    servers.push(srv);
  }
  const set = new EndpointSet([
    {
      name: 'p',
      engine: 'vllm',
      accelerator: 'nvidia',
      models: ['m'],
      endpoints: servers.map((s, i) => ({ name: `raw${i}`, url: `http://127.0.0.1:${s.port}`, role: 'both' as const })),
    },
  ]);
  const c = new NativeUpstreamClient({ ...DEFAULTS.proxy, connectionsPerEndpoint: 1 });
  t.teardown(() => c.close());
  const want: { port: number; text: string }[] = [];
  const send = (e: number, method: string, path: string, value: string, body: Buffer | null, expect: boolean) => {
    const port = servers[e]!.port;
    const text = `${method} ${path} HTTP/1.1\r\nhost: 127.0.0.1:${port}\r\nx-v: ${value}\r\n` + (body ? `content-length: ${body.length}\r\n\r\n${body.toString('latin1')}` : '\r\n');
    if (expect) want.push({ port, text });
    let settle!: (e: Error | null) => void;
    const done = new Promise<Error | null>((r) => (settle = r));
    const call = c.send(set.all[e]!, { method, path, headers: ['x-v', value], body }, {
      onUpstreamHeaders() {},
      onUpstreamData() {},
      onUpstreamEnd: () => settle(null),
      onUpstreamError: (err) => settle(err),
    });
    return { call, done };
  };
  const a = send(0, 'POST', '/v1/completions', 'a'.repeat(5000), Buffer.alloc(8 << 20, 0x61), false); // stays partly written
  const b = send(0, 'POST', '/v1/completions', 'b'.repeat(6000), Buffer.from('{"b":1}'), false); // queued
  const cc = send(0, 'GET', '/v1/completions', 'c'.repeat(100), null, true); // queued, same path, other method
  const d = send(1, 'GET', '/v1/completions', 'd'.repeat(4090), null, true); // other pool, same method and path
  await new Promise((r) => setTimeout(r, 30));
  b.call.abort();
  a.call.abort(); // mid-write: the connection closes, the queued `cc` takes a new one
  const e2 = send(0, 'POST', '/v1/chat/completions', 'e'.repeat(70_000), Buffer.from('{"e":1}'), true);
  const f = send(1, 'POST', '/v1/chat/completions', 'f', Buffer.from('{"f":1}'), true);
  t.same(await within(5000, Promise.all([cc.done, d.done, e2.done, f.done])), [null, null, null, null], 'the calls not aborted completed');
  const key = (x: { port: number; text: string }) => `${x.port} ${x.text.slice(0, 40)}`;
  const sorted = (xs: { port: number; text: string }[]) => [...xs].sort((p, q) => (key(p) < key(q) ? -1 : 1));
  const g = sorted(got.filter((x) => !x.text.includes('\r\nx-v: a') && !x.text.includes('\r\nx-v: b')));
  const w = sorted(want);
  t.equal(g.length, w.length, 'every request that was not aborted arrived once');
  for (let i = 0; i < w.length; i++) t.ok(g[i]?.port === w[i]!.port && g[i]?.text === w[i]!.text, `${key(w[i]!)}: byte-exact, on its own endpoint`);
  t.notOk(got.some((x) => x.text.includes('\r\nx-v: b')), 'the aborted queued call never reached the engine');
});

t.test('native: a head the socket takes only partly (kept-alive connection, engine not reading) is not overwritten by the next sends', async (t) => {
  let sock0: Socket | null = null;
  const { got, port, set, c } = await okEngine(t, (sock) => {
    sock0 ??= sock;
  });
  const sent: string[] = [];
  const send = (value: string, body: Buffer) => {
    sent.push(`POST /x HTTP/1.1\r\nhost: 127.0.0.1:${port}\r\nx-v: ${value}\r\ncontent-length: ${body.length}\r\n\r\n${body.toString('latin1')}`);
    return new Promise<Error | null>((resolve) =>
      c.send(set.all[0]!, { method: 'POST', path: '/x', headers: ['x-v', value], body }, {
        onUpstreamHeaders() {},
        onUpstreamData() {},
        onUpstreamEnd: () => resolve(null),
        onUpstreamError: (err) => resolve(err),
      }),
    );
  };
  t.equal(await send('warm', Buffer.from('{}')), null, 'the connection is open and idle');
  (sock0 as Socket | null)!.pause();
  const done = [send('A'.repeat(12 << 20), Buffer.from('{"a":1}'))]; // more than the socket buffers take: written in part
  // the next heads overwrite the head buffer, also where the first one's unwritten rest sat
  for (let i = 0; i < 6; i++) done.push(send(String.fromCharCode(0x61 + i).repeat([10, 4095, 12 << 20][i % 3]!), Buffer.from(`{"n":${i}}`)));
  await new Promise((r) => setTimeout(r, 30));
  (sock0 as Socket | null)!.resume();
  t.same(await within(10_000, Promise.all(done)), done.map(() => null), 'every call completed');
  t.equal(got.length, sent.length);
  for (let i = 0; i < sent.length; i++) t.ok(got[i] === sent[i], `request ${i} (${sent[i]!.length} bytes) arrived byte-exact`);
});

for (const client of ['native'] as const) {
  t.test(`${client}: an upstream content type holding CR or NUL reaches the client without them (no header injection through the cached block)`, async (t) => {
    const body = COMPLETION(0);
    const { port } = await listenRaw(t, (sock) =>
      framed(sock, (m) => {
        if (m.head.toString('latin1', 0, 4) === 'GET ') sock.write('HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n');
        else sock.write(`HTTP/1.1 200 OK\r\ncontent-type: application/json\rx-injected: yes\0z\r\ncontent-length: ${body.length}\r\n\r\n${body}`);
      }),
    );
    const { router } = await startTestRouter(t, {
      n: 1,
      pools: () => [{ name: 'p', models: ['open-model'], endpoints: [{ name: 'e', url: `http://127.0.0.1:${port}` }] }],
      extra: { proxy: { client } },
    });
    for (let i = 0; i < 2; i++) {
      // twice: the second answer comes from the cached block
      const got = await rawExchange(router.port, request('/v1/completions', null, JSON.stringify({ model: 'open-model', prompt: 'hi', max_tokens: 1 })));
      const head = got.head.toString('latin1');
      t.notOk(/\r(?!\n)|\0/.test(head), `answer ${i}: no bare CR or NUL in the head (${JSON.stringify(head.slice(0, 80))})`);
      t.notOk(/\nx-injected/i.test(head.replace(/\r/g, '\n')), `answer ${i}: no header a lenient client would split off`);
      t.match(head, /\r\ncontent-type: application\/json x-injected: yes z\r\n/, `answer ${i}: the value, controls as spaces`);
      t.equal(got.body.toString(), body);
    }
  });
}
