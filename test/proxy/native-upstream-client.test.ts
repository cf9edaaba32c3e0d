// The native HTTP/1.1 upstream client (native/upstream_client.cc through
// src/proxy/native-client.ts) over real loopback sockets: backpressure
// (pause/resume), abort mid-stream, resets mid-body, chunked bodies split at
// every byte, connection reuse and the per-endpoint connection limit, 16 MiB
// bodies both ways, a throwing sink, close(), argument validation, and worker
// threads torn down with requests in flight. Runs under ASan+UBSan too
// (scripts/asan.js picks up test/native-*.test.ts).
import t from 'tap';
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { createServer, type Server, type Socket } from 'node:net';
import { listenRaw } from '../support/router-util.js';
import { Worker } from 'node:worker_threads';
import { existsSync, statSync } from 'node:fs';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { NativeUpstreamClient } from '../../src/proxy/native-client.js';
import { NativeUpstreamConnections } from '../../bindings/upstream-client.js';
import { EndpointSet } from '../../src/endpoints/endpoint.js';
import type { UpstreamCall, UpstreamClient, UpstreamSink } from '../../src/proxy/upstream.js';
import { DEFAULTS, validateConfig, API_VERSION } from '../../src/config/schema.js';
import { ConfigError } from '../../src/errors.js';

const ASAN = process.env.SWITCHYARD_UNDER_ASAN === '1';

interface Result {
  status: number;
  contentType: string;
  contentLength: number;
  chunks: Buffer[];
  body: Buffer;
  error?: Error & { code?: string };
  events: string[];
}

function collect(client: UpstreamClient, set: EndpointSet, body: Buffer | null = Buffer.from('{}'), hooks: { onData?: (r: Result, call: UpstreamCall) => void } = {}): { call: UpstreamCall; done: Promise<Result> } {
  let call!: UpstreamCall;
  const done = new Promise<Result>((resolve) => {
    const r: Result = { status: 0, contentType: '', contentLength: -2, chunks: [], body: Buffer.alloc(0), events: [] };
    const finish = () => {
      r.body = Buffer.concat(r.chunks);
      resolve(r);
    };
    const sink: UpstreamSink = {
      onUpstreamHeaders: (status, ct, cl) => {
        r.events.push('head');
        r.status = status;
        r.contentType = ct;
        r.contentLength = cl;
      },
      onUpstreamData: (chunk) => {
        r.events.push('data');
        r.chunks.push(Buffer.from(chunk)); // a copy: the chunk is valid only during the call
        hooks.onData?.(r, call);
      },
      onUpstreamEnd: () => {
        r.events.push('end');
        finish();
      },
      onUpstreamError: (err) => {
        r.events.push('error');
        r.error = err;
        finish();
      },
    };
    call = client.send(set.all[0]!, { method: body === null ? 'GET' : 'POST', path: '/x', headers: ['content-type', 'application/json'], body }, sink);
  });
  return { call, done };
}

interface Raw {
  set: EndpointSet;
  conns: () => number;
  open: () => number;
  socks: Set<Socket>;
}

/** A raw TCP server: calls onRequest(sock, n, conn, body) once per complete request (content-length framing). */
async function rawServer(t: Tap.Test, onRequest: (sock: Socket, n: number, conn: number, body: Buffer) => void): Promise<Raw> {
  let conns = 0;
  let requests = 0;
  const { port, socks } = await listenRaw(t, (sock) => {
    const conn = ++conns;
    sock.setNoDelay(true); // split writes must go out as separate segments, now
    let buf = Buffer.alloc(0);
    sock.on('data', (b: Buffer) => {
      buf = buf.length === 0 ? b : Buffer.concat([buf, b]);
      for (;;) {
        const end = buf.indexOf('\r\n\r\n');
        if (end < 0) return;
        const head = buf.toString('latin1', 0, end);
        const len = Number(/content-length: (\d+)/i.exec(head)?.[1] ?? 0);
        if (buf.length < end + 4 + len) return;
        const body = buf.subarray(end + 4, end + 4 + len);
        buf = buf.subarray(end + 4 + len);
        onRequest(sock, ++requests, conn, body);
      }
    });
  });
  const set = new EndpointSet([{ name: 'p', engine: 'vllm', accelerator: 'nvidia', models: ['m'], endpoints: [{ name: 'raw', url: `http://127.0.0.1:${port}`, role: 'both' }] }]);
  return { set, conns: () => conns, open: () => socks.size, socks };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');

function client(t: Tap.Test, cfg = DEFAULTS.proxy): NativeUpstreamClient {
  const c = new NativeUpstreamClient(cfg);
  t.teardown(() => c.close());
  return c;
}

t.test('a chunked response split into two reads at every byte boundary is de-chunked exactly', async (t) => {
  const resp = Buffer.from(
    'HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n' +
      '1a;name=value\r\ndata: {"a":"0123456789"}\n\n\r\n' +
      '3\r\nxyz\r\n' +
      'A\r\n0123456789\r\n' +
      '0\r\nX-Trailer: 1\r\n\r\n',
    'latin1',
  );
  const expected = 'data: {"a":"0123456789"}\n\nxyz0123456789';
  let cut = 0;
  const raw = await rawServer(t, (sock) => {
    const k = cut;
    sock.write(resp.subarray(0, k));
    setTimeout(() => sock.write(resp.subarray(k)), 2);
  });
  const c = client(t);
  const bad: string[] = [];
  for (cut = 1; cut < resp.length; cut++) {
    const r = await collect(c, raw.set).done;
    if (r.error || r.status !== 200 || r.contentType !== 'text/event-stream' || r.body.toString('latin1') !== expected || r.contentLength !== -1)
      bad.push(`cut ${cut}: ${r.error?.message ?? ''} ${r.status} ${JSON.stringify(r.body.toString('latin1'))}`);
  }
  t.same(bad, [], `${resp.length - 1} split points, every one de-chunked exactly`);
  t.equal(raw.conns(), 1, 'all on one keep-alive connection');
  t.equal(c.stats().opened, 1, 'the client opened one connection');
});

t.test('every byte in its own read (head, chunk sizes, data, trailers)', async (t) => {
  const resp = 'HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n4\r\nabcd\r\n2\r\nef\r\n0\r\n\r\n';
  const raw = await rawServer(t, async (sock) => {
    for (const ch of resp) {
      sock.write(ch, 'latin1');
      await new Promise((r) => setImmediate(r));
    }
  });
  const c = client(t);
  for (let i = 0; i < 2; i++) {
    const r = await collect(c, raw.set).done;
    t.equal(r.error, undefined);
    t.equal(r.body.toString(), 'abcdef');
    t.equal(r.contentType, 'text/plain');
  }
});

t.test('malformed chunked framing and content-length are EPROTO, after the good bytes', async (t) => {
  const answers = [
    'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nzz\r\n',
    'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX',
    'HTTP/1.1 200 OK\r\nContent-Length: 12x\r\n\r\n',
    'HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nab',
    'HTTP/1.1 2000 OK\r\n\r\n',
  ];
  const raw = await rawServer(t, (sock, n) => sock.write(answers[n - 1]!));
  const c = client(t);
  const first = await collect(c, raw.set).done;
  t.equal(first.body.toString(), 'abc', 'the good chunk was relayed');
  t.match(first.error, { code: 'EPROTO' });
  for (let i = 1; i < answers.length; i++) {
    const r = await collect(c, raw.set).done;
    t.match(r.error, { code: 'EPROTO' }, `answer ${i}: EPROTO (${r.error?.message})`);
  }
});

t.test('connection reuse, and connectionsPerEndpoint caps open connections (waiting calls queue)', async (t) => {
  const raw = await rawServer(t, (sock, n) => {
    setTimeout(() => sock.write(`HTTP/1.1 200 OK\r\nContent-Length: ${String(n).length}\r\n\r\n${n}`), 5);
  });
  const c = client(t, { ...DEFAULTS.proxy, connectionsPerEndpoint: 3 });
  for (let i = 0; i < 20; i++) t.equal((await collect(c, raw.set).done).status, 200);
  t.equal(raw.conns(), 1, 'sequential requests share one connection');
  const many = await Promise.all(Array.from({ length: 30 }, () => collect(c, raw.set).done));
  t.ok(many.every((r) => r.status === 200 && r.error === undefined), 'all 30 concurrent requests answered');
  t.same(new Set(many.map((r) => r.body.toString())).size, 30, 'each got its own answer');
  t.ok(raw.conns() <= 3, `at most 3 connections (${raw.conns()})`);
});

t.test('pause holds the engine back (its writes block); resume delivers every byte', async (t) => {
  const size = 8 << 20;
  const payload = Buffer.alloc(size);
  for (let i = 0; i < size; i += 4) payload.writeUInt32LE(i * 2654435761 >>> 0, i);
  let blocked = false;
  let drained = false;
  const raw = await rawServer(t, (sock) => {
    sock.write(`HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\nContent-Length: ${size}\r\n\r\n`);
    let off = 0;
    const pump = () => {
      while (off < size) {
        const ok = sock.write(payload.subarray(off, off + 65536));
        off += 65536;
        if (!ok) {
          blocked = true;
          sock.once('drain', () => {
            drained = true;
            pump();
          });
          return;
        }
      }
    };
    pump();
  });
  const c = client(t);
  let paused = false;
  let whilePaused = 0;
  let bytesAtPause = 0;
  let checked!: () => void;
  const pauseChecked = new Promise<void>((r) => (checked = r));
  const { done } = collect(c, raw.set, Buffer.from('{}'), {
    onData: (r, call) => {
      if (paused) whilePaused++;
      if (!paused && r.chunks.length === 1) {
        paused = true;
        bytesAtPause = r.chunks.reduce((a, b) => a + b.length, 0);
        call.pause();
        setTimeout(() => {
          t.ok(blocked, "the engine's socket backed up while the call was paused");
          t.notOk(drained, 'and did not drain while paused');
          t.ok(whilePaused <= 1, `at most the rest of the current batch arrived while paused (${whilePaused})`);
          t.ok(bytesAtPause < size / 2, `the pause came early in the body (${bytesAtPause} bytes)`);
          paused = false;
          call.resume();
          checked();
        }, 300);
      }
    },
  });
  const r = await done;
  await Promise.race([pauseChecked, sleep(1000)]);
  t.ok(r.chunks.length > 1 && !paused, 'the body completed only after the resume');
  t.equal(r.error, undefined);
  t.equal(r.body.length, size, '8 MiB arrived');
  t.equal(sha(r.body), sha(payload), 'byte for byte');
});

t.test('16 MiB request and response bodies (content-length and chunked)', async (t) => {
  const size = 16 << 20;
  const big = Buffer.alloc(size, 0x61);
  for (let i = 0; i < size; i += 4093) big[i] = i & 0xff;
  const raw = await rawServer(t, (sock, n, _conn, body) => {
    const digest = sha(body);
    if (n === 1) {
      sock.write(`HTTP/1.1 200 OK\r\nContent-Length: ${body.length + 64}\r\n\r\n${digest}`);
      sock.write(body);
    } else {
      sock.write('HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n');
      sock.write(`40\r\n${digest}\r\n`);
      for (let off = 0; off < body.length; off += 1 << 20) {
        const part = body.subarray(off, off + (1 << 20));
        sock.write(`${part.length.toString(16)}\r\n`);
        sock.write(part);
        sock.write('\r\n');
      }
      sock.write('0\r\n\r\n');
    }
  });
  const c = client(t);
  for (const label of ['content-length', 'chunked']) {
    const r = await collect(c, raw.set, big).done;
    t.equal(r.error, undefined, `${label}: no error`);
    t.equal(r.body.subarray(0, 64).toString(), sha(big), `${label}: the engine received the 16 MiB request intact`);
    t.equal(r.body.length - 64, size, `${label}: 16 MiB came back`);
    t.ok(r.body.subarray(64).equals(big), `${label}: byte for byte`);
  }
  t.equal(raw.conns(), 1, 'one connection for both');
});

t.test('abort mid-stream: the engine sees the disconnect, no sink call follows, the client carries on', async (t) => {
  let closedAt = 0;
  const raw = await rawServer(t, (sock, n) => {
    if (n === 1) {
      sock.write('HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n');
      const iv = setInterval(() => sock.write('5\r\nagain\r\n'), 5);
      sock.on('close', () => {
        clearInterval(iv);
        closedAt = Date.now();
      });
    } else sock.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok');
  });
  const c = client(t);
  const events: string[] = [];
  let call!: UpstreamCall;
  await new Promise<void>((resolve) => {
    call = c.send(raw.set.all[0]!, { method: 'POST', path: '/s', headers: [], body: Buffer.from('{}') }, {
      onUpstreamHeaders: () => events.push('head'),
      onUpstreamData: () => {
        events.push('data');
        call.abort();
        call.abort(); // twice is fine
        resolve();
      },
      onUpstreamEnd: () => events.push('end'),
      onUpstreamError: () => events.push('error'),
    });
  });
  await sleep(60);
  t.ok(closedAt > 0, 'the engine saw the connection close');
  t.same(events, ['head', 'data'], 'nothing after the abort');
  call.pause(); // after the end: no-ops
  call.resume();
  const r = await collect(c, raw.set).done;
  t.equal(r.body.toString(), 'ok', 'the next request goes out on a fresh connection');
  t.equal(raw.conns(), 2);
});

t.test('an engine reset mid-body (chunked and content-length) fails the call after the relayed bytes', async (t) => {
  const raw = await rawServer(t, (sock, n) => {
    sock.write(n === 1 ? 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n' : 'HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc');
    setTimeout(() => sock.resetAndDestroy(), 10);
  });
  const c = client(t);
  for (const label of ['chunked', 'content-length']) {
    const r = await collect(c, raw.set).done;
    t.equal(r.body.toString(), 'abc', `${label}: the bytes before the reset were relayed`);
    t.match(r.error, { code: /^(ECONNRESET|EPIPE)$/ }, `${label}: then ${r.error?.code}`);
    t.same(r.events.slice(-1), ['error'], `${label}: error is the last event`);
  }
});

t.test('bodies until close (no length), 204 without a body, HTTP/1.0', async (t) => {
  const raw = await rawServer(t, (sock, n) => {
    if (n === 1) {
      sock.write('HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil close');
      setTimeout(() => sock.end(), 10);
    } else if (n === 2) sock.write('HTTP/1.1 204 No Content\r\n\r\n');
    else if (n === 3) sock.write('HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc');
    else sock.end('HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok');
  });
  const c = client(t);
  const a = await collect(c, raw.set).done;
  t.equal(a.error, undefined);
  t.equal(a.body.toString(), 'until close');
  t.equal(a.contentLength, -1);
  const b = await collect(c, raw.set).done;
  t.equal(b.status, 204);
  t.equal(b.body.length, 0);
  t.same(b.events, ['head', 'end']);
  const d = await collect(c, raw.set).done;
  t.equal(d.body.toString(), 'abc', 'the 204 connection was reused (no phantom body)');
  t.equal(raw.conns(), 2);
  const e = await collect(c, raw.set, null).done;
  t.equal(e.body.toString(), 'ok', 'GET without a body; HTTP/1.0 answer');
});

t.test('a throwing sink fails only its own call; the client keeps serving', async (t) => {
  const raw = await rawServer(t, (sock) => sock.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi'));
  const c = client(t);
  const err = await new Promise<Error & { code?: string }>((resolve) => {
    c.send(raw.set.all[0]!, { method: 'POST', path: '/', headers: [], body: Buffer.from('{}') }, {
      onUpstreamHeaders: () => {
        throw new Error('sink bug');
      },
      onUpstreamData: () => {},
      onUpstreamEnd: () => {},
      onUpstreamError: (e) => resolve(e),
    });
  });
  t.equal(err.code, 'EINTERNAL');
  t.match(err.message, /sink bug/);
  t.equal((await collect(c, raw.set).done).body.toString(), 'hi');
});

t.test('a sink that throws again in onUpstreamError (after a throw in onUpstreamHeaders) raises no uncaught exception', async (t) => {
  const raw = await rawServer(t, (sock) => sock.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi'));
  const c = client(t);
  const uncaught: Error[] = [];
  const onUncaught = (e: Error) => uncaught.push(e);
  process.prependListener('uncaughtException', onUncaught);
  t.teardown(() => process.removeListener('uncaughtException', onUncaught));
  const first = collect(c, raw.set);
  const got = await new Promise<string>((resolve) => {
    c.send(raw.set.all[0]!, { method: 'POST', path: '/', headers: [], body: Buffer.from('{}') }, {
      onUpstreamHeaders: () => {
        throw new Error('sink bug in headers');
      },
      onUpstreamData: () => {},
      onUpstreamEnd: () => resolve('end'),
      onUpstreamError: (e) => {
        resolve((e as Error & { code?: string }).code ?? '');
        throw new Error('sink bug in error');
      },
    });
  });
  t.equal(got, 'EINTERNAL');
  t.equal((await first.done).body.toString(), 'hi');
  t.equal((await collect(c, raw.set).done).body.toString(), 'hi', 'the client keeps serving');
  await sleep(10);
  t.same(uncaught.map((e) => e.message), [], 'nothing escaped the event batch');
});

t.test('re-entrant calls from inside the event callback: abort, a new send on the freed slot, pause/resume, destroy', async (t) => {
  const raw = await rawServer(t, (sock, n) => {
    if (n === 1) sock.write('HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n'); // never ends: aborted
    else sock.write('HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond');
  });
  const c = client(t);
  let inner: Promise<Result> | null = null;
  const outer = collect(c, raw.set, Buffer.from('{}'), {
    onData: (_r, call) => {
      call.abort(); // the addon closes the connection while this batch is being delivered
      inner = collect(c, raw.set, Buffer.from('{}'), {
        onData: (_r2, call2) => {
          call2.pause();
          call2.resume();
        },
      }).done; // takes the slot just freed (next generation)
    },
  });
  const done = await Promise.race([outer.done.then(() => 'outer finished'), sleep(300).then(() => 'no sink call after abort')]);
  t.equal(done, 'no sink call after abort');
  t.ok(inner !== null);
  const r = await inner!;
  t.equal(r.error, undefined);
  t.equal(r.body.toString(), 'second');

  // destroy() from inside a callback while another call's events may follow in the same batch
  const seen: number[] = [];
  const d = new NativeUpstreamConnections({ ...DEFAULTS.proxy }, (count) => {
    seen.push(count);
    d.destroy();
  });
  const port = Number(new URL(raw.set.all[0]!.url).port);
  d.addPool(0, '127.0.0.1', port);
  d.send(1, 0, 'POST / HTTP/1.1\r\ncontent-length: 2\r\n\r\n', Buffer.from('{}'));
  d.send(2, 0, 'POST / HTTP/1.1\r\ncontent-length: 2\r\n\r\n', Buffer.from('{}'));
  await sleep(100);
  t.equal(seen.length, 1, 'one callback, none after destroy()');
  t.throws(() => d.send(3, 0, 'GET / HTTP/1.1\r\n\r\n', null), /shut down/);
  d.abort(1); // harmless after destroy()
  d.pause(2);
  d.resume(2);
  d.close();
});

t.test('an early answer while the request body is still being written; content-length with chunked: chunked wins', async (t) => {
  const server: Server = createServer((sock) => {
    sock.on('error', () => {});
    sock.once('data', () => {
      // answers after the first bytes of a 16 MiB body, never reads the rest
      sock.end('HTTP/1.1 413 Payload Too Large\r\nContent-Length: 3\r\nConnection: close\r\n\r\nbig');
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  const port = (server.address() as { port: number }).port;
  const set = new EndpointSet([{ name: 'p', engine: 'vllm', accelerator: 'nvidia', models: ['m'], endpoints: [{ name: 'early', url: `http://127.0.0.1:${port}`, role: 'both' }] }]);
  const c = client(t);
  const r = await collect(c, set, Buffer.alloc(16 << 20, 97)).done;
  t.equal(r.error, undefined, 'the answer, not a write error');
  t.equal(r.status, 413);
  t.equal(r.body.toString(), 'big');

  const both = await rawServer(t, (sock, n) => {
    if (n === 1) sock.write('HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n');
    else sock.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok');
  });
  const c2 = client(t);
  const a = await collect(c2, both.set).done;
  t.equal(a.error, undefined);
  t.equal(a.body.toString(), 'abc');
  t.equal(a.contentLength, -1, 'no content-length reported for a chunked body');
  const b = await collect(c2, both.set).done;
  t.equal(b.body.toString(), 'ok', 'no leftover of the chunked body on the reused connection');
});

t.test('refused connections, close() with queued calls, sends after close', async (t) => {
  const refused = new EndpointSet([{ name: 'p', engine: 'vllm', accelerator: 'nvidia', models: ['m'], endpoints: [{ name: 'gone', url: 'http://127.0.0.1:1', role: 'both' }] }]);
  const c = client(t);
  const r = await collect(c, refused).done;
  t.match(r.error, { code: 'ECONNREFUSED' });
  const raw = await rawServer(t, () => {}); // never answers
  const c2 = new NativeUpstreamClient({ ...DEFAULTS.proxy, connectionsPerEndpoint: 1 });
  const first = collect(c2, raw.set);
  const second = collect(c2, raw.set); // queued behind the first
  await sleep(20);
  await c2.close();
  const s = await second.done;
  t.match(s.error, { code: 'ECLOSED' }, 'a queued call fails with ECLOSED');
  const after = await collect(c2, raw.set).done;
  t.match(after.error, { code: 'ECLOSED' }, 'a send after close fails with ECLOSED');
  first.call.abort();
  // once the last call is gone the client is destroyed; an endpoint it never sent to (id 1)
  // has no pool, and none can be registered any more
  await sleep(20);
  const url = raw.set.all[0]!.url;
  const two = new EndpointSet([{ name: 'p', engine: 'vllm', accelerator: 'nvidia', models: ['m'], endpoints: [{ name: 'a', url, role: 'both' }, { name: 'b', url, role: 'both' }] }]);
  const fresh = await new Promise<unknown>((resolve) => {
    const sink: UpstreamSink = { onUpstreamHeaders: () => {}, onUpstreamData: () => true, onUpstreamEnd: () => resolve('end'), onUpstreamError: (err) => resolve(err) };
    try {
      c2.send(two.all[1]!, { method: 'GET', path: '/x', headers: [], body: null }, sink);
    } catch (err) {
      resolve({ thrown: err });
    }
  });
  t.match(fresh, { code: 'ECLOSED' }, 'a send after close to a new endpoint fails with ECLOSED, not a throw');
});

t.test('request heads of every length around the native head buffer (4 KiB) and far past it arrive byte-exact', async (t) => {
  const heads: string[] = [];
  const { port } = await listenRaw(t, (sock) => {
    let buf = Buffer.alloc(0);
    sock.on('data', (b: Buffer) => {
      buf = Buffer.concat([buf, b]);
      for (;;) {
        const end = buf.indexOf('\r\n\r\n');
        if (end < 0 || buf.length < end + 6) return;
        heads.push(buf.toString('latin1', 0, end + 4));
        buf = buf.subarray(end + 6); // every body is 2 bytes
        sock.write('HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n');
      }
    });
  });
  const set = new EndpointSet([{ name: 'p', engine: 'vllm', accelerator: 'nvidia', models: ['m'], endpoints: [{ name: 'raw', url: `http://127.0.0.1:${port}`, role: 'both' }] }]);
  const c = client(t);
  const base = `POST /x HTTP/1.1\r\nhost: 127.0.0.1:${port}\r\nx-pad: \r\ncontent-length: 2\r\n\r\n`.length;
  const pads: number[] = [];
  for (let len = 4090; len <= 4100; len++) pads.push(len - base);
  pads.push(70_000, 1);
  const sent: string[] = [];
  for (const pad of pads) {
    const value = 'a'.repeat(pad - 1) + '\u00e9'; // latin1: one byte per char
    const done = new Promise<Error | null>((resolve) => {
      c.send(set.all[0]!, { method: 'POST', path: '/x', headers: ['x-pad', value], body: Buffer.from('{}') }, {
        onUpstreamHeaders() {},
        onUpstreamData() {},
        onUpstreamEnd: () => resolve(null),
        onUpstreamError: (err) => resolve(err),
      });
    });
    t.equal(await done, null);
    sent.push(`POST /x HTTP/1.1\r\nhost: 127.0.0.1:${port}\r\nx-pad: ${value}\r\ncontent-length: 2\r\n\r\n`);
  }
  t.equal(heads.length, sent.length);
  for (let i = 0; i < sent.length; i++) if (heads[i] !== sent[i]) t.fail(`head ${i} (${sent[i]!.length} bytes) differs`);
  t.ok(sent.some((h) => h.length === 4095) && sent.some((h) => h.length === 4096), 'the boundary lengths were covered');
});

t.test('bad arguments are TypeError/RangeError, never a crash; hostnames are refused clearly', async (t) => {
  const opts = { connectTimeoutMs: 100, headersTimeoutMs: 100, bodyTimeoutMs: 100, connectionsPerEndpoint: 1 };
  t.throws(() => new NativeUpstreamConnections({ ...opts, connectionsPerEndpoint: 0 }, () => {}), RangeError);
  t.throws(() => new NativeUpstreamConnections({ ...opts, bodyTimeoutMs: -1 }, () => {}), RangeError);
  t.throws(() => new NativeUpstreamConnections({ ...opts, headersTimeoutMs: 'x' as unknown as number }, () => {}), TypeError);
  t.throws(() => new NativeUpstreamConnections(opts, () => {}, 2), RangeError, 'too few event records');
  t.throws(() => new NativeUpstreamConnections(opts, () => {}, 64, 1024), RangeError, 'arena too small');
  const n = new NativeUpstreamConnections(opts, () => {});
  t.teardown(() => n.destroy());
  t.throws(() => n.addPool(0, 'not an ip', 80), TypeError);
  t.throws(() => n.addPool(0, '127.0.0.1', 0), RangeError);
  t.throws(() => n.send(0, 5, 'GET / HTTP/1.1\r\n\r\n', null), RangeError, 'unknown pool');
  n.addPool(0, '127.0.0.1', 1);
  t.throws(() => n.send(-1, 0, 'GET / HTTP/1.1\r\n\r\n', null), RangeError);
  t.throws(() => n.send(0, 0, 42 as unknown as string, null), TypeError);
  t.throws(() => n.send(0, 0, 'GET / HTTP/1.1\r\n\r\n', 'body' as unknown as Uint8Array), TypeError);
  t.throws(() => n.send(0, 0, 'GET / HTTP/1.1\r\n\r\n', new Int32Array(2) as unknown as Uint8Array), TypeError, 'a typed array of another type');
  t.throws(() => n.send(0, 0, 'GET / HTTP/1.1\r\n\r\n', {} as unknown as Uint8Array), TypeError);
  t.throws(() => n.send('1' as unknown as number, 0, 'GET / HTTP/1.1\r\n\r\n', null), TypeError, 'id not a number');
  t.throws(() => n.send(0, null as unknown as number, 'GET / HTTP/1.1\r\n\r\n', null), TypeError, 'poolId not a number');
  t.throws(() => n.send(0, 0, '', null), RangeError, 'empty head');
  // numbers a 32-bit read would wrap or truncate onto a valid id or pool
  for (const id of [2 ** 32, 2 ** 31, 1.5, NaN, Infinity]) t.throws(() => n.send(id, 0, 'GET / HTTP/1.1\r\n\r\n', null), RangeError, `call id ${id}`);
  for (const pool of [2 ** 32, 2 ** 32 + 1, 0.5, -1, NaN]) t.throws(() => n.send(0, pool, 'GET / HTTP/1.1\r\n\r\n', null), RangeError, `poolId ${pool}`);
  n.abort(12345); // unknown ids are ignored
  n.pause(12345);
  n.resume(12345);
  // https is not the native client's: refused at the send and by config validation
  const tls = new EndpointSet([{ name: 'p', engine: 'vllm', accelerator: 'nvidia', models: ['m'], endpoints: [{ name: 'tls', url: 'https://10.0.0.1:8443', role: 'both' }] }]);
  const c = client(t);
  const noop = { onUpstreamHeaders() {}, onUpstreamData() {}, onUpstreamEnd() {}, onUpstreamError() {} };
  t.throws(() => c.send(tls.all[0]!, { method: 'GET', path: '/', headers: [], body: null }, noop), { code: 'EPROTO', message: /plain http only/ });
  t.throws(
    () => validateConfig({ apiVersion: API_VERSION, kind: 'Router', proxy: { client: 'native' }, pools: [{ name: 'p', models: ['m'], endpoints: [{ name: 'a', url: 'https://10.0.0.1:8443' }] }] }),
    ConfigError,
    'config validation names the problem',
  );
  // endpoints named by DNS name are the native client's too (looked up by the router: test/proxy/native-dns.test.ts)
  t.doesNotThrow(() => validateConfig({ apiVersion: API_VERSION, kind: 'Router', proxy: { client: 'native' }, pools: [{ name: 'p', models: ['m'], endpoints: [{ name: 'a', url: 'http://engine.internal:8000' }] }] }));
  t.doesNotThrow(() => validateConfig({ apiVersion: API_VERSION, kind: 'Router', proxy: { client: 'native' }, pools: [{ name: 'p', models: ['m'], endpoints: [{ name: 'a', url: 'http://localhost:8000' }] }] }));
});

// ---- worker threads ------------------------------------------------------------------------

function bindingsFor(): { url: string; loaders: string[] } {
  const src = ['../../bindings/upstream-client.ts', '../../bindings/native.ts'].map((f) => fileURLToPath(new URL(f, import.meta.url)));
  const dist = ['../../dist/bindings/upstream-client.js', '../../dist/bindings/native.js'].map((f) => fileURLToPath(new URL(f, import.meta.url)));
  const fresh = dist.every((d, i) => existsSync(d) && statSync(d).mtimeMs >= statSync(src[i]!).mtimeMs);
  if (fresh) return { url: pathToFileURL(dist[0]!).href, loaders: [] };
  return {
    url: new URL('../../bindings/upstream-client.ts', import.meta.url).href,
    loaders: process.execArgv.filter((a) => a.startsWith('--import=')).map((a) => a.slice('--import='.length)),
  };
}

t.test('worker threads: a request completes in a worker; a worker terminated mid-request leaves the process healthy', { timeout: ASAN ? 120_000 : 30_000 }, async (t) => {
  const { url, loaders } = bindingsFor();
  const raw = await rawServer(t, (sock, n) => {
    if (n === 1) sock.write('HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nworks');
    // later requests are never answered: the workers die with them in flight
  });
  const port = Number(new URL(raw.set.all[0]!.url).port);
  const src = `
    const { parentPort, workerData } = require('node:worker_threads');
    (async () => { for (const l of ${JSON.stringify(loaders)}) await import(l); return import(${JSON.stringify(url)}); })().then((m) => {
      let conns;
      conns = new m.NativeUpstreamConnections({ connectTimeoutMs: 1000, headersTimeoutMs: 60000, bodyTimeoutMs: 60000, connectionsPerEndpoint: 4 }, (count) => {
        for (let k = 0; k < count; k++) {
          const o = k * 8;
          const type = conns.events[o];
          if (type === 2) parentPort.postMessage({ data: conns.arena.toString('latin1', conns.events[o + 2], conns.events[o + 2] + conns.events[o + 3]) });
          if (type === 3) parentPort.postMessage({ end: true });
          if (type === 4) parentPort.postMessage({ error: conns.events[o + 3] });
        }
      });
      conns.addPool(0, '127.0.0.1', workerData.port);
      conns.send(1, 0, 'POST /w HTTP/1.1\\r\\nhost: x\\r\\ncontent-length: 2\\r\\n\\r\\n', Buffer.from('{}'));
      if (workerData.hang) conns.send(2, 0, 'POST /w HTTP/1.1\\r\\nhost: x\\r\\ncontent-length: 2\\r\\n\\r\\n', Buffer.from('{}'));
      parentPort.postMessage({ sent: true });
    }).catch((err) => parentPort.postMessage({ fatal: String(err && err.stack || err) }));
  `;
  const w1 = new Worker(src, { eval: true, workerData: { port, hang: false } });
  const got: unknown[] = [];
  w1.on('message', (m) => got.push(m));
  await new Promise<void>((resolve) => {
    const check = () => (got.some((m) => (m as { end?: boolean }).end) || got.some((m) => 'fatal' in (m as object)) ? resolve() : setTimeout(check, 10));
    check();
  });
  t.same(
    got.filter((m) => !('sent' in (m as object))),
    [{ data: 'works' }, { end: true }],
    'the worker received the answer',
  );
  await w1.terminate();
  // workers terminated while their requests (and connections) are open
  for (let i = 0; i < 3; i++) {
    const w = new Worker(src, { eval: true, workerData: { port, hang: true } });
    await once(w, 'message');
    await sleep(30);
    const [code] = (await Promise.all([w.terminate()])) as [number];
    t.equal(code, 1, `worker ${i} terminated with calls in flight`);
  }
  // and one that exits by itself with an idle client and a pending call: its environment teardown closes the sockets
  const w2 = new Worker(src.replace("parentPort.postMessage({ sent: true });", "parentPort.postMessage({ sent: true }); setTimeout(() => process.exit(0), 50);"), { eval: true, workerData: { port, hang: true } });
  const [code2] = (await once(w2, 'exit')) as [number];
  t.equal(code2, 0, 'a worker exiting on its own with open connections exits cleanly');
  await sleep(50);
  t.equal(raw.open(), 0, 'every worker connection was closed');
});

t.test('proxy.client auto picks the native client for http endpoints (by IP address or DNS name), undici when one is https', async (t) => {
  const { newUpstreamClient } = await import('../../src/server/core.js');
  const { UndiciUpstreamClient } = await import('../../src/proxy/undici-client.js');
  const setOf = (...urls: string[]) =>
    new EndpointSet([{ name: 'p', engine: 'vllm', accelerator: 'nvidia', models: ['m'], endpoints: urls.map((url, i) => ({ name: `e${i}`, url, role: 'both' as const })) }]);
  const cases: [string, EndpointSet, Function][] = [
    ['auto', setOf('http://127.0.0.1:1', 'http://[::1]:2'), NativeUpstreamClient],
    // names are looked up by the router (every address tried: localhost may be served on ::1 only)
    ['auto', setOf('http://127.0.0.1:1', 'http://localhost:3'), NativeUpstreamClient],
    ['auto', setOf('http://127.0.0.1:1', 'http://engine.internal:2'), NativeUpstreamClient],
    ['auto', setOf('http://127.0.0.1:1', 'https://10.0.0.1:2'), UndiciUpstreamClient],
    ['h1', setOf('http://127.0.0.1:1'), NativeUpstreamClient], // an older name of native
    ['native', setOf('http://127.0.0.1:1'), NativeUpstreamClient],
  ];
  for (const [client, set, cls] of cases) {
    const c = newUpstreamClient({ ...DEFAULTS.proxy, client: client as 'auto' }, set);
    t.ok(c instanceof cls, `${client} over ${set.all.map((e) => e.url).join(', ')}: ${cls.name}`);
    await c.close();
  }
});

t.test('connectTimeoutMs: an endpoint whose accept queue is full (SYNs dropped) fails with ETIMEDOUT', async (t) => {
  // A listener that never accepts (Node accepts on its own, so a python3 one), its backlog filled first.
  const { spawn, spawnSync } = await import('node:child_process');
  if (spawnSync('python3', ['-c', 'pass']).status !== 0) {
    t.skip('python3 is not installed (needed for a listener that never accepts)');
    return;
  }
  const py = spawn('python3', ['-c', 'import socket,time\ns=socket.socket()\ns.bind(("127.0.0.1",0))\ns.listen(0)\nprint(s.getsockname()[1],flush=True)\ntime.sleep(60)']);
  t.teardown(() => py.kill());
  const port = await new Promise<number>((r) => py.stdout.once('data', (d) => r(Number(String(d).trim()))));
  const { connect } = await import('node:net');
  const fillers = Array.from({ length: 4 }, () => connect(port, '127.0.0.1').on('error', () => {}));
  t.teardown(() => fillers.forEach((f) => f.destroy()));
  await sleep(100);
  const set = new EndpointSet([{ name: 'p', engine: 'vllm', accelerator: 'nvidia', models: ['m'], endpoints: [{ name: 'full', url: `http://127.0.0.1:${port}`, role: 'both' }] }]);
  const c = client(t, { ...DEFAULTS.proxy, connectTimeoutMs: 200 });
  const t0 = performance.now();
  const r = await collect(c, set).done;
  const ms = performance.now() - t0;
  t.equal(r.error?.code, 'ETIMEDOUT', `timed out (${r.error?.message})`);
  t.match(r.error?.message, /connect timeout/);
  t.ok(ms >= 195 && ms < 2000, `after ${ms.toFixed(0)} ms (limit 200 ms)`);
});

t.test('a stale queued id that names a call waiting for another endpoint (generation wrap) does not send it there', async (t) => {
  // the addon sees ids only: an aborted waiting call leaves its id in its pool's queue, and after
  // the JS side's generations wrap the same id can name a call waiting in another pool
  const got = [0, 0];
  const held: Socket[][] = [[], []];
  const engine = (i: number) =>
    rawServer(t, (sock) => {
      got[i]++;
      held[i].push(sock); // answered when the test says so
    });
  const [e0, e1] = await Promise.all([engine(0), engine(1)]);
  const seen: string[] = [];
  const d = new NativeUpstreamConnections({ ...DEFAULTS.proxy, connectionsPerEndpoint: 1 }, (count) => {
    for (let k = 0; k < count; k++) seen.push(`${d.events[k * 8]}:${d.events[k * 8 + 1]}`);
  });
  t.teardown(() => d.destroy());
  d.addPool(0, '127.0.0.1', Number(new URL(e0.set.all[0]!.url).port));
  d.addPool(1, '127.0.0.1', Number(new URL(e1.set.all[0]!.url).port));
  const head = 'POST /x HTTP/1.1\r\ncontent-length: 2\r\n\r\n';
  const body = Buffer.from('{}');
  d.send(1, 0, head, body); // pool 0's one connection
  d.send(2, 0, head, body); // waits for it
  d.abort(2); // its id stays in pool 0's queue
  d.send(3, 1, head, body); // pool 1's one connection
  d.send(2, 1, head, body); // the same id again, waiting in pool 1
  for (let i = 0; i < 100 && (held[0].length === 0 || held[1].length === 0); i++) await sleep(5);
  held[0][0]!.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok'); // pool 0's connection is free
  await sleep(100);
  t.equal(got[0], 1, "pool 0's engine got only its own request");
  t.same(seen, ['1:1', '2:1', '3:1'], 'call 1 answered (head, data, end), nothing for call 2 yet');
  held[1][0]!.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok'); // pool 1's connection is free: call 2 goes out
  for (let i = 0; i < 100 && got[1] < 2; i++) await sleep(5);
  t.equal(got[1], 2, 'call 2 went to its own endpoint once a connection there was free');
});
