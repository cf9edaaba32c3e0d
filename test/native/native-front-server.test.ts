// The native front end (native/front_server.cc through bindings/front-end.ts FrontServer) on its
// own, over real loopback sockets: answers in request order for pipelined requests (the second
// answered first by the handler), HTTP/1.0 close-delimited and keep-alive when asked, a parse error
// answered at once with its status and the connection closed, a body over the limit answered 413
// and readable by Node's fetch (not EPIPE), Expect: 100-continue, a streamed (chunked) answer, a
// client that leaves seen as an abort, the head timeout (408) against a slow client.
import net from 'node:net';
import t from 'tap';
import { FrontServer, frontFields, type FrontRequest } from '../../bindings/front-end.js';

interface Fixture {
  port: number;
  requests: FrontRequest[];
  aborted: number[];
  server: FrontServer;
}

/** A server whose handler answers `echo` at once, and holds `/slow` until released. */
function start(t: Tap.Test, o: ConstructorParameters<typeof FrontServer>[2] = {}): Fixture & { held: Map<string, number> } {
  const requests: FrontRequest[] = [];
  const aborted: number[] = [];
  const held = new Map<string, number>();
  const server = new FrontServer(
    (r) => {
      requests.push(r);
      if (r.target.startsWith('/slow')) {
        held.set(r.target, r.id);
        return;
      }
      if (r.target === '/stream') {
        server.respond(r.id, 200, 'content-type: text/plain\r\n', Buffer.from('a'), false);
        setTimeout(() => server.write(r.id, Buffer.from('bc'), true), 20);
        return;
      }
      server.respond(r.id, 200, 'content-type: text/plain\r\n', Buffer.from(`${r.method} ${r.target} ${r.body.length}`), true);
    },
    (id) => aborted.push(id),
    o,
  );
  const port = server.listen('127.0.0.1', 0);
  t.teardown(() => server.close());
  return { port, requests, aborted, server, held };
}

/** Sends the pieces, collects everything until the server closes or `ms` pass. */
function exchange(port: number, pieces: string[], ms = 1500, gapMs = 0): Promise<{ data: string; closed: boolean }> {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    let data = '';
    let closed = false;
    s.on('data', (d) => (data += d.toString('latin1')));
    s.on('error', () => {});
    s.on('close', () => {
      closed = true;
      clearTimeout(timer);
      resolve({ data, closed });
    });
    const timer = setTimeout(() => {
      s.destroy();
      resolve({ data, closed });
    }, ms);
    s.on('connect', async () => {
      for (const p of pieces) {
        s.write(Buffer.from(p, 'latin1'));
        if (gapMs) await new Promise((r) => setTimeout(r, gapMs));
      }
    });
  });
}

const statuses = (data: string) => [...data.matchAll(/HTTP\/1\.[01] (\d{3})/g)].map((m) => Number(m[1]));

t.test('a GET, its fields byte for byte', async (t) => {
  const f = start(t);
  const r = await exchange(f.port, ['GET /a HTTP/1.1\r\nHost: x\r\nX-Id: \xffid\xff\r\n\r\n'], 300);
  t.match(r.data, /^HTTP\/1\.1 200 OK\r\n/, "the status line carries its reason phrase");
  t.match(r.data, /content-length: 8\r\n/);
  t.match(r.data, /\r\n\r\nGET \/a 0$/);
  t.same(frontFields(f.requests[0]!), [['Host', 'x'], ['X-Id', '\xffid\xff']]);
  t.equal(r.closed, false, 'kept alive');
});

t.test('two pipelined POSTs are answered in order, the second answered first by the handler', async (t) => {
  const f = start(t);
  const post = (p: string) => `POST ${p} HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello`;
  const pending = exchange(f.port, [post('/slow1') + post('/b')], 600);
  await new Promise((r) => setTimeout(r, 200));
  t.equal(f.requests.length, 2, 'both delivered (parsed ahead)');
  f.server.respond(f.held.get('/slow1')!, 201, '', Buffer.from('first'), true);
  const r = await pending;
  t.same(statuses(r.data), [201, 200], 'in order');
  t.match(r.data, /^HTTP\/1\.1 201 Created\r\n/, 'each with its reason phrase');
  t.ok(r.data.indexOf('first') < r.data.indexOf('POST /b 5'));
});

t.test('HTTP/1.0: close-delimited, or kept alive when asked', async (t) => {
  const f = start(t);
  const a = await exchange(f.port, ['GET /healthz HTTP/1.0\r\n\r\n']);
  t.match(a.data, /^HTTP\/1\.0 200 /);
  t.equal(a.closed, true, 'closed after the answer');
  const b = await exchange(f.port, ['GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n'], 300);
  t.match(b.data, /connection: keep-alive\r\n/);
  t.equal(b.closed, false);
  const c = await exchange(f.port, ['GET /stream HTTP/1.0\r\n\r\n']);
  t.match(c.data, /\r\n\r\nabc$/, 'a streamed answer to HTTP/1.0 ends at the close');
  t.equal(c.closed, true);
});

t.test('a streamed answer is chunked on HTTP/1.1', async (t) => {
  const f = start(t);
  const r = await exchange(f.port, ['GET /stream HTTP/1.1\r\nHost: x\r\n\r\n'], 300);
  t.match(r.data, /transfer-encoding: chunked\r\n\r\n1\r\na\r\n2\r\nbc\r\n0\r\n\r\n$/);
});

t.test('parse errors are answered at once and the connection closed', async (t) => {
  const f = start(t);
  for (const [req, status] of [
    ['GET /healthz HTTP/1.1\r\nX-A : 1\r\n\r\n', 400],
    ['PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n', 505],
    [`GET / HTTP/1.1\r\nHost: x\r\n${'X-H: v\r\n'.repeat(120)}\r\n`, 431],
    ['POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n', 501],
  ] as const) {
    const r = await exchange(f.port, [req]);
    t.same(statuses(r.data), [status], `${JSON.stringify(req.slice(0, 30))}: ${status}`);
    t.match(r.data, /"error":\{"message":/);
    t.equal(r.closed, true);
  }
  t.equal(f.requests.length, 0, 'none reached the handler');
});

t.test('a GET pipelined behind a malformed request is never served; one before it is', async (t) => {
  const f = start(t);
  const r = await exchange(f.port, ['GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nno colon\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n']);
  t.same(statuses(r.data), [200, 400]);
  t.same(f.requests.map((q) => q.target), ['/a']);
});

t.test('Expect: 100-continue is answered before the body', async (t) => {
  const f = start(t);
  const s = net.connect(f.port, '127.0.0.1');
  let data = '';
  s.on('data', (d) => (data += d.toString('latin1')));
  await new Promise((r) => s.on('connect', r));
  s.write('POST /e HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n');
  await new Promise((r) => setTimeout(r, 100));
  t.equal(data, 'HTTP/1.1 100 Continue\r\n\r\n');
  s.write('abc');
  await new Promise((r) => setTimeout(r, 100));
  t.match(data, /POST \/e 3$/);
  s.destroy();
});

t.test('a body over the limit: 413, readable by fetch (undici), not EPIPE', async (t) => {
  const f = start(t, { maxBody: 1024 * 1024 });
  const res = await fetch(`http://127.0.0.1:${f.port}/v1/chat/completions`, { method: 'POST', body: Buffer.alloc(20 * 1024 * 1024, 'a') });
  t.equal(res.status, 413);
  t.match(await res.json(), { error: { message: /exceeds the limit of \d+ bytes/, type: 'invalid_request_error', code: 'request_too_large' } });
  t.equal(f.requests.length, 0);
  // a client that is still sending when the 413 goes out (a streamed 20 MB body, 1 MiB at a time)
  let sent = 0;
  const body = new ReadableStream<Uint8Array>({
    async pull(c) {
      if (sent >= 20) return c.close();
      sent++;
      await new Promise((r) => setTimeout(r, 5));
      c.enqueue(new Uint8Array(1024 * 1024));
    },
  });
  const res2 = await fetch(`http://127.0.0.1:${f.port}/v1/files`, { method: 'POST', body, duplex: 'half' } as RequestInit);
  t.equal(res2.status, 413, 'a streamed body gets the 413 too');
});

t.test('a client that leaves: its pending requests are aborted', async (t) => {
  const f = start(t);
  await exchange(f.port, ['GET /slow2 HTTP/1.1\r\nHost: x\r\n\r\n'], 150);
  await new Promise((r) => setTimeout(r, 50));
  t.same(f.aborted, [f.held.get('/slow2')]);
  t.equal(f.server.respond(f.held.get('/slow2')!, 200, '', null, true), 0, 'answering it is a no-op (GONE)');
});

t.test('slowloris: a head that trickles in gets 408 at the head timeout, not later', async (t) => {
  const f = start(t, { headMs: 300 });
  const t0 = Date.now();
  const r = await exchange(f.port, 'GET /x HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n'.split(''), 3000, 30);
  t.same(statuses(r.data), [408]);
  t.ok(Date.now() - t0 < 1200, `within the head timeout (${Date.now() - t0} ms)`);
  t.equal(r.closed, true);
});

t.test('an idle connection is closed without an answer', async (t) => {
  const f = start(t, { idleMs: 200 });
  const r = await exchange(f.port, [], 1500);
  t.equal(r.closed, true);
  t.equal(r.data, '');
});

t.test('wanted: the values of the named fields, any case, repeated lines joined with ",", absent ones undefined', async (t) => {
  const got: (string | undefined)[][] = [];
  const server = new FrontServer(
    (r) => {
      t.equal(r.wanted.length, 4, 'one slot per wanted name');
      got.push(Array.from(r.wanted));
      server.respond(r.id, 200, '', null, true);
    },
    () => {},
    { wanted: ['x-request-id', 'TraceState', 'authorization', 'x-absent'] },
  );
  const port = server.listen('127.0.0.1', 0);
  t.teardown(() => server.close());
  await exchange(port, ['GET / HTTP/1.1\r\nHost: x\r\nX-Request-ID: \xffa\r\ntracestate: a=1\r\nTRACESTATE: b=2\r\nAuthorization: Bearer k\r\n\r\n'], 300);
  t.strictSame(got, [['\xffa', 'a=1,b=2', 'Bearer k', undefined]]);
});

t.test('respond(..., close): the connection closes after that answer, nothing behind it is served', async (t) => {
  const server = new FrontServer(
    (r) => server.respond(r.id, 200, '', Buffer.from('x'), true, true),
    () => {},
  );
  const port = server.listen('127.0.0.1', 0);
  t.teardown(() => server.close());
  const r = await exchange(port, ['GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n'], 1000);
  t.same(statuses(r.data), [200]);
  t.match(r.data, /connection: close\r\n/);
  t.ok(r.closed);
});

t.test('backpressure: FULL past the high-water mark, onDrain once the client reads', async (t) => {
  let id = 0;
  const drained: number[] = [];
  const server = new FrontServer(
    (r) => {
      id = r.id;
      server.respond(r.id, 200, '', null, false);
    },
    () => {},
    { onDrain: (i) => drained.push(i) },
  );
  const port = server.listen('127.0.0.1', 0);
  t.teardown(() => server.close());
  const s = net.connect(port, '127.0.0.1');
  s.on('error', () => {});
  t.teardown(() => s.destroy());
  await new Promise((r) => s.on('connect', r));
  s.pause(); // the client does not read
  s.write('GET / HTTP/1.1\r\nHost: x\r\n\r\n');
  while (id === 0) await new Promise((r) => setTimeout(r, 10));
  const chunk = Buffer.alloc(256 * 1024, 'a');
  let result = 1;
  let writes = 0;
  while (result === 1 && writes < 400) {
    result = server.write(id, chunk, false);
    writes++;
    await new Promise((r) => setImmediate(r));
  }
  t.equal(result, 2, `FULL after ${writes} writes of 256 KiB to a client that does not read`);
  t.same(drained, [], 'no drain while the client does not read');
  let read = 0;
  s.on('data', (b) => (read += b.length));
  s.resume();
  for (let i = 0; i < 200 && drained.length === 0; i++) await new Promise((r) => setTimeout(r, 10));
  t.same(drained, [id], 'onDrain once the client read');
  t.equal(server.write(id, null, true), 1, 'then the end is SENT');
});

t.test('abort(id) cuts the connection and reports its unanswered requests', async (t) => {
  const aborted: number[] = [];
  const server = new FrontServer(
    (r) => {
      server.respond(r.id, 200, '', Buffer.from('partial'), false);
      setTimeout(() => server.abort(r.id), 20);
    },
    (i) => aborted.push(i),
  );
  const port = server.listen('127.0.0.1', 0);
  t.teardown(() => server.close());
  const r = await exchange(port, ['GET / HTTP/1.1\r\nHost: x\r\n\r\n'], 1000);
  t.ok(r.closed, 'closed');
  t.notMatch(r.data, /0\r\n\r\n$/, 'no last chunk: the client sees the answer cut');
  t.equal(aborted.length, 1, 'reported aborted');
});

t.test('maxConnections and setAccepting(false): new connections closed at once, counted', async (t) => {
  const server = new FrontServer(
    (r) => server.respond(r.id, 200, '', Buffer.from('ok'), true),
    () => {},
    { maxConnections: 1 },
  );
  const port = server.listen('127.0.0.1', 0);
  t.teardown(() => server.close());
  const first = net.connect(port, '127.0.0.1');
  first.on('error', () => {});
  t.teardown(() => first.destroy());
  await new Promise((r) => first.on('connect', r));
  await new Promise((r) => setTimeout(r, 50));
  const over = await exchange(port, ['GET / HTTP/1.1\r\nHost: x\r\n\r\n'], 1000);
  t.ok(over.closed && over.data === '', 'the second connection: closed, unanswered');
  t.same(server.stats(), { connections: 1, refused: 1 });
  first.destroy();
  await new Promise((r) => setTimeout(r, 50));
  server.setAccepting(false);
  const paused = await exchange(port, ['GET / HTTP/1.1\r\nHost: x\r\n\r\n'], 1000);
  t.ok(paused.closed && paused.data === '', 'not accepting: closed, unanswered');
  server.setAccepting(true);
  const again = await exchange(port, ['GET / HTTP/1.1\r\nHost: x\r\n\r\n'], 300);
  t.same(statuses(again.data), [200], 'accepting again');
  t.equal(server.stats().refused, 2);
});

// Many requests on one connection, each with its own values: keys one byte apart (a shared proxy
// connection carries several clients' keys), values of ~160-200 bytes, repeated lines joined, a field
// that changes on every request and then stops changing, absent fields. A front end that kept a
// connection's last strings to hand back (tried for #29: bench/RESULTS.md, 2026-12-05) must pass this.
t.test('one connection, many requests: every request carries its own field values', async (t) => {
  const fc = (await import('fast-check')).default;
  const requests: FrontRequest[] = [];
  const server = new FrontServer(
    (r) => {
      requests.push(r);
      server.respond(r.id, 200, '', Buffer.from('ok'), true);
    },
    () => {},
    { wanted: ['authorization', 'x-request-id', 'content-type'] },
  );
  const port = server.listen('127.0.0.1', 0);
  t.teardown(() => server.close());
  const keyA = 'Bearer sk-tenant-a-000000000000000001';
  const auth = fc.constantFrom(undefined, keyA, keyA.slice(0, -1) + '2', '2' + keyA.slice(1), 'Bearer sk-b', `Bearer ${'k'.repeat(200)}`, `Bearer ${'k'.repeat(199)}j`, 'Bearer \xffx', '');
  const rid = fc.oneof(fc.constantFrom(undefined, 'r-1', 'r-2'), fc.integer({ min: 0, max: 1e6 }).map((n) => `u-${n}`));
  const one = fc.record({
    method: fc.constantFrom('GET', 'POST', 'DELETE'),
    target: fc.constantFrom('/v1/chat/completions', '/v1/chat/completionz', '/healthz', `/${'p'.repeat(170)}`),
    auth,
    twice: fc.boolean(),
    rid,
    type: fc.constantFrom(undefined, 'application/json', 'application/jsoN'),
  });
  let runs = 0;
  await fc.assert(
    fc.asyncProperty(fc.array(one, { minLength: 1, maxLength: 24 }), async (seq) => {
      runs++;
      requests.length = 0;
      let wire = '';
      for (const [i, q] of seq.entries()) {
        wire += `${q.method} ${q.target} HTTP/1.1\r\nHost: x\r\n`;
        if (q.auth !== undefined) wire += `Authorization: ${q.auth}\r\n` + (q.twice ? `authorization: ${q.auth}\r\n` : '');
        if (q.rid !== undefined) wire += `X-Request-Id: ${q.rid}\r\n`;
        if (q.type !== undefined) wire += `Content-Type: ${q.type}\r\n`;
        wire += i === seq.length - 1 ? 'Connection: close\r\n\r\n' : '\r\n';
      }
      const r = await exchange(port, [wire], 3000);
      if (!r.closed || requests.length !== seq.length) return false;
      return seq.every((q, i) => {
        const got = requests[i]!;
        const a = q.auth === undefined ? undefined : q.twice ? `${q.auth},${q.auth}` : q.auth;
        return got.method === q.method && got.target === q.target && got.wanted[0] === a && got.wanted[1] === q.rid && got.wanted[2] === q.type;
      });
    }),
    { numRuns: 150 },
  );
  t.equal(runs, 150);
  // one connection, the same key 40 times, then one a byte apart, then the key again
  requests.length = 0;
  const wire = [...Array(40).fill(keyA), keyA.slice(0, -1) + '9', keyA].map((k, i, all) => `GET / HTTP/1.1\r\nHost: x\r\nAuthorization: ${k}\r\n${i === all.length - 1 ? 'Connection: close\r\n' : ''}\r\n`).join('');
  await exchange(port, [wire], 3000);
  t.same(
    requests.slice(-3).map((q) => q.wanted[0]),
    [keyA, keyA.slice(0, -1) + '9', keyA],
  );
});

t.test('backpressure: an answer that said FULL while it waited behind a pipelined one gets onDrain when it goes out whole', async (t) => {
  const ids = new Map<string, number>();
  const drained: number[] = [];
  const server = new FrontServer(
    (r) => {
      ids.set(r.target, r.id);
    },
    () => {},
    { onDrain: (i) => drained.push(i) },
  );
  const port = server.listen('127.0.0.1', 0);
  t.teardown(() => server.close());
  const s = net.connect(port, '127.0.0.1');
  s.on('error', () => {});
  t.teardown(() => s.destroy());
  let read = 0;
  s.on('data', (b) => (read += b.length));
  await new Promise((r) => s.on('connect', r));
  s.write('GET /first HTTP/1.1\r\nHost: x\r\n\r\nGET /second HTTP/1.1\r\nHost: x\r\n\r\n');
  while (ids.size < 2) await new Promise((r) => setTimeout(r, 10));
  const first = ids.get('/first')!;
  const second = ids.get('/second')!;
  // the second answer's bytes wait in its slot behind the first: past the high-water mark, FULL
  t.equal(server.respond(second, 200, '', Buffer.alloc(96 * 1024, 'b'), false), 2, 'the waiting answer is FULL');
  t.same(drained, [], 'no drain while it waits');
  // the first ends: the slot goes out (a reading client on loopback takes 96 KiB whole: no write completion)
  server.respond(first, 200, '', Buffer.from('one'), true);
  for (let i = 0; i < 100 && drained.length === 0; i++) await new Promise((r) => setTimeout(r, 10));
  t.same(drained, [second], 'onDrain for the answer that was FULL');
  t.equal(server.write(second, Buffer.from('end'), true), 1, 'then it ends');
  for (let i = 0; i < 100 && read < 96 * 1024 + 3; i++) await new Promise((r) => setTimeout(r, 10));
  t.ok(read > 96 * 1024, `the client read both answers (${read} bytes)`);
});
