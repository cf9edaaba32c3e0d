// HTTP/1.1 framing of the router's front end, over raw loopback sockets
// against a real router and real simulated engines: pipelined POSTs (A),
// ambiguous framing that enables request smuggling (B), malformed or
// unsupported requests that must be answered at once instead of hanging (C),
// and two honesty defects: high bytes at the ends of x-request-id (D1) and a
// `Connection: close` answer followed by a served pipelined request (D2).
//
// Every case asserts the RIGHT behaviour; a hang fails after WAIT_MS (uWS's own
// idle close comes only after 9-12 s). See docs/uws-framing.md for which of
// these the router can fix itself and which need a different front end.
import t from 'tap';
import { connect, type Socket } from 'node:net';
import { startTestRouter, listenRaw } from '../support/router-util.js';
import { uwsProblem } from '../../src/uws.js';

/** Longest wait for an answer: anything slower counts as a hang. */
const WAIT_MS = 1500;
const MODEL = 'open-model';
const CHAT = '/v1/chat/completions';
const BODY = JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });

// ---- raw client -------------------------------------------------------------------------

interface Exchange {
  data: Buffer;
  /** The server closed (or reset) the connection before WAIT_MS. */
  closed: boolean;
  ms: number;
}

/** Writes `parts` to a fresh connection (`gapMs` apart), reads until the server closes, `enough(data)` or `waitMs`. */
function exchange(port: number, parts: (string | Buffer)[], o: { gapMs?: number; waitMs?: number; enough?: (d: Buffer) => boolean } = {}): Promise<Exchange> {
  const { gapMs = 0, waitMs = WAIT_MS, enough } = o;
  const t0 = Date.now();
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let over = false;
    const sock: Socket = connect(port, '127.0.0.1');
    const done = (closed: boolean) => {
      if (over) return;
      over = true;
      clearTimeout(timer);
      sock.destroy();
      resolve({ data: Buffer.concat(chunks), closed, ms: Date.now() - t0 });
    };
    const timer = setTimeout(() => done(false), waitMs);
    sock.on('connect', () => {
      let i = 0;
      const next = () => {
        if (over || i >= parts.length) return;
        sock.write(parts[i++]!);
        if (i < parts.length) setTimeout(next, gapMs);
      };
      next();
    });
    sock.on('data', (b: Buffer) => {
      chunks.push(b);
      if (enough?.(Buffer.concat(chunks))) done(false);
    });
    sock.on('error', () => {});
    sock.on('close', () => done(true));
  });
}

interface Answer {
  status: number;
  /** Lower-cased names; a repeated header keeps its last value. Values as latin1 (one char per byte). */
  headers: Record<string, string>;
  body: string;
}

/** The complete HTTP/1.x answers in `buf` (content-length or chunked bodies), in order. */
function answers(buf: Buffer): Answer[] {
  const out: Answer[] = [];
  let at = 0;
  while (at < buf.length) {
    const headEnd = buf.indexOf('\r\n\r\n', at);
    if (headEnd < 0) break;
    const lines = buf.toString('latin1', at, headEnd).split('\r\n');
    const m = /^HTTP\/1\.[01] (\d{3})/.exec(lines[0]!);
    if (!m) break;
    const headers: Record<string, string> = {};
    for (const line of lines.slice(1)) {
      const c = line.indexOf(':');
      if (c > 0) headers[line.slice(0, c).trim().toLowerCase()] = line.slice(c + 1).trim();
    }
    let p = headEnd + 4;
    const parts: Buffer[] = [];
    if ((headers['transfer-encoding'] ?? '').toLowerCase() === 'chunked') {
      let complete = false;
      for (;;) {
        const nl = buf.indexOf('\r\n', p);
        if (nl < 0) break;
        const size = parseInt(buf.toString('latin1', p, nl), 16);
        if (!(size >= 0) || nl + 2 + size + 2 > buf.length) break;
        parts.push(buf.subarray(nl + 2, nl + 2 + size));
        p = nl + 4 + size;
        if (size === 0) {
          complete = true;
          break;
        }
      }
      if (!complete) break;
    } else {
      const len = Number(headers['content-length'] ?? 0);
      if (p + len > buf.length) break;
      parts.push(buf.subarray(p, p + len));
      p += len;
    }
    const status = Number(m[1]);
    if (status >= 200) out.push({ status, headers, body: Buffer.concat(parts).toString('utf8') });
    at = p;
  }
  return out;
}

const atLeast = (n: number) => (d: Buffer) => answers(d).length >= n;

function post(path: string, body: string, extra = ''): string {
  return `POST ${path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n${extra}\r\n${body}`;
}

/** `r` got exactly one answer, with `status`, and the server closed the connection right after it. */
function rejectedAndClosed(t: Tap.Test, r: Exchange, status: number, label: string): void {
  const got = answers(r.data);
  t.same(
    got.map((a) => a.status),
    [status],
    `${label}: one answer, HTTP ${status} (got ${JSON.stringify(got.map((a) => a.status))}, ${r.data.length} bytes, ${r.ms} ms)`,
  );
  t.ok(r.closed, `${label}: connection closed after it (${r.closed ? 'closed' : 'still open'} at ${r.ms} ms)`);
}


// What uWS 20.30 itself does before any handler of ours runs, and no hook
// lets the router change (evidence, source lines and the proposed front end:
// docs/uws-framing.md). These stay as TODO so the suite shows the gap and
// fails loudly the day a front end fixes it without the marks being removed.
const UWS = 'uWS 20.30 behaviour the router cannot reach (docs/uws-framing.md)';
/** The uWS front end's known failures stay TODO; the native front end must pass them. */
const todo = (fe: string) => (fe === 'uws' ? { todo: UWS } : {});

// every front end that loads on this Node, the same cases (server.frontEnd)
const FRONT_ENDS = uwsProblem() === null ? ['uws', 'native'] : ['native'];

for (const fe of FRONT_ENDS) {
  t.test(`front end: ${fe}`, async (t) => {
  // ---- the world ----------------------------------------------------------------------------

  // Answers at once (virtual clock)...
  const fast = await startTestRouter(t, { n: 2, extra: { server: { frontEnd: fe } } });
  // ...and an engine that holds every request about 300 ms before its first token.
  const slow = await startTestRouter(t, { n: 1, fleet: { timeScale: 1, prefillOverheadMs: 300, itlMs: 1 }, extra: { server: { frontEnd: fe } } });

  // ---- A: pipelining --------------------------------------------------------------------

  t.test('A: pipelined POSTs are all answered, in order', async (t) => {
    t.test('two POSTs in one write', todo(fe), async (t) => {
      const r = await exchange(fast.router.port, [post(CHAT, BODY, 'X-Request-Id: pp-1\r\n') + post(CHAT, BODY, 'X-Request-Id: pp-2\r\n')], {
        enough: atLeast(2),
      });
      const got = answers(r.data);
      t.same(
        got.map((a) => [a.status, a.headers['x-request-id']]),
        [
          [200, 'pp-1'],
          [200, 'pp-2'],
        ],
        `both answered, in order (got ${JSON.stringify(got.map((a) => a.status))}, closed=${r.closed}, ${r.ms} ms)`,
      );
    });

    t.test('a second POST sent while the first waits on the engine', todo(fe), async (t) => {
      const r = await exchange(slow.router.port, [post(CHAT, BODY, 'X-Request-Id: pq-1\r\n'), post(CHAT, BODY, 'X-Request-Id: pq-2\r\n')], {
        gapMs: 100,
        waitMs: 2000,
        enough: atLeast(2),
      });
      const got = answers(r.data);
      t.same(
        got.map((a) => [a.status, a.headers['x-request-id']]),
        [
          [200, 'pq-1'],
          [200, 'pq-2'],
        ],
        `both answered, in order (got ${JSON.stringify(got.map((a) => a.status))}, closed=${r.closed}, ${r.ms} ms)`,
      );
    });

    t.test('a POST and a GET in one write', todo(fe), async (t) => {
      const r = await exchange(fast.router.port, [post(CHAT, BODY, 'X-Request-Id: pg-1\r\n') + 'GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n'], {
        enough: atLeast(2),
      });
      t.same(
        answers(r.data).map((a) => a.status),
        [200, 200],
        `both answered, the POST first (closed=${r.closed}, ${r.ms} ms)`,
      );
    });
  });

  // ---- B: smuggling-grade framing -------------------------------------------------------------

  t.test('B: ambiguous request framing gets 400 and a closed connection', async (t) => {
    const hidden = 'GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n';
    const n = Buffer.byteLength(BODY);
    const head = `POST ${CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n`;
    const chunkedBody = `${n.toString(16)}\r\n${BODY}\r\n0\r\n\r\n`;
    const cases: { name: string; req: string; hides?: boolean; uws?: boolean }[] = [
      {
        name: 'GET with Content-Length 0 and Content-Length N, a request hidden in the N bytes',
        req: `GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: ${hidden.length}\r\n\r\n${hidden}`,
        hides: true,
        uws: true, // closed, the hidden request never served, but no 400: uWS parses the hidden one in the same read
      },
      { name: 'GET with Content-Length 0 and Content-Length 5, nothing hidden', req: 'GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 5\r\n\r\nhello' },
      {
        name: 'POST with Content-Length: body, Content-Length: body + hidden request',
        req: `${head}Content-Length: ${n}\r\nContent-Length: ${n + hidden.length}\r\n\r\n${BODY}${hidden}`,
        hides: true,
        uws: true,
      },
      { name: 'POST with Content-Length: body + hidden request, Content-Length: body', req: `${head}Content-Length: ${n + hidden.length}\r\nContent-Length: ${n}\r\n\r\n${BODY}${hidden}` },
      ...['gzip', 'xchunked', 'chunked, identity', 'identity', 'chunked\x0b'].map((te) => ({
        name: `Transfer-Encoding: ${JSON.stringify(te)} with a chunked body`,
        req: `${head}Transfer-Encoding: ${te}\r\n\r\n${chunkedBody}`,
        uws: te === 'chunked\x0b', // a control byte in a value: uWS never finishes the head (case C)
      })),
      { name: 'two Transfer-Encoding headers (gzip, then chunked)', req: `${head}Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n${chunkedBody}` },
      { name: 'Content-Length and Transfer-Encoding: chunked together', req: `${head}Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n${chunkedBody}`, uws: true },
    ];
    // all at once: a hang costs WAIT_MS once, not once per case
    const pending = cases.map((c) => exchange(fast.router.port, [c.req]));
    for (const [i, c] of cases.entries()) {
      t.test(c.name, c.uws ? todo(fe) : {}, async (t) => {
        const r = await pending[i]!;
        if (c.hides) t.notOk(answers(r.data).some((a) => a.body.includes('"object":"list"')), 'the hidden request is never served');
        rejectedAndClosed(t, r, 400, c.name);
      });
    }

    t.test('control: Transfer-Encoding: chunked is served', async (t) => {
      const r = await exchange(fast.router.port, [`${head}Transfer-Encoding: chunked\r\n\r\n${chunkedBody}`], { enough: atLeast(1) });
      t.equal(answers(r.data)[0]?.status, 200, 'served');
    });

    t.test('control: two identical Content-Length headers are served', async (t) => {
      const r = await exchange(fast.router.port, [`${head}Content-Length: ${n}\r\nContent-Length: ${n}\r\n\r\n${BODY}`], { enough: atLeast(1) });
      t.equal(answers(r.data)[0]?.status, 200, 'served (RFC 9110 8.6 allows identical duplicates)');
    });
  });

  // ---- C: no silence -------------------------------------------------------------------------

  t.test('C: malformed or unsupported requests are answered at once', async (t) => {
    const port = fast.router.port;
    const lines = (n: number) => Array.from({ length: n }, (_, i) => `X-H${i}: v\r\n`).join('');
    const cases: { name: string; req: string; want: number[] }[] = [
      { name: 'HTTP/1.0 GET /healthz without Host', req: 'GET /healthz HTTP/1.0\r\n\r\n', want: [200] },
      { name: 'HTTP/1.0 GET /healthz with Host', req: 'GET /healthz HTTP/1.0\r\nHost: x\r\n\r\n', want: [200] },
      {
        name: 'HTTP/1.0 POST inference',
        req: `POST ${CHAT} HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(BODY)}\r\n\r\n${BODY}`,
        want: [200],
      },
      // #31: at least 100 field lines are served (server.maxHeaderLines), more answer 431
      { name: '60 header lines: served', req: `POST ${CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n${lines(57)}Content-Length: ${Buffer.byteLength(BODY)}\r\n\r\n${BODY}`, want: [200] },
      { name: '101 header lines: 431', req: `POST ${CHAT} HTTP/1.1\r\nHost: x\r\n${lines(99)}Content-Length: ${Buffer.byteLength(BODY)}\r\n\r\n${BODY}`, want: [431] },
      { name: '70 KiB of header: 431', req: `GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(70 * 1024)}\r\n\r\n`, want: [431] },
      { name: '49 header lines (one over uWS 20.30\'s 48)', req: `GET /healthz HTTP/1.1\r\nHost: x\r\n${lines(48)}\r\n`, want: [200, 431] },
      { name: 'obs-fold', req: 'GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n folded\r\n\r\n', want: [400] },
      { name: 'NUL in a header value', req: 'GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n', want: [400] },
      { name: 'bare LF line ends', req: 'GET /healthz HTTP/1.1\nHost: x\n\n', want: [200, 400] },
      { name: 'space before the colon', req: 'GET /healthz HTTP/1.1\r\nHost: x\r\nX-A : 1\r\n\r\n', want: [400] },
      { name: 'absolute-form target', req: 'GET http://x/healthz HTTP/1.1\r\nHost: x\r\n\r\n', want: [200, 400] },
      { name: 'no Host header', req: 'GET /healthz HTTP/1.1\r\nX-A: 1\r\n\r\n', want: [400] },
      { name: 'no header lines at all', req: 'GET /healthz HTTP/1.1\r\n\r\n', want: [400] },
      { name: 'HTTP/2 connection preface', req: 'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n', want: [400, 505] },
      { name: 'HTTP/1.2', req: 'GET /healthz HTTP/1.2\r\nHost: x\r\n\r\n', want: [200, 505] },
    ];
    // all at once: a hang costs WAIT_MS once, not once per case
    const pending = cases.map((c) => exchange(port, [c.req], { enough: atLeast(1) }));
    for (const [i, c] of cases.entries()) {
      t.test(c.name, todo(fe), async (t) => {
        const r = await pending[i]!;
        const got = answers(r.data);
        t.ok(
          got.length > 0 && c.want.includes(got[0]!.status),
          `answered ${c.want.join(' or ')} within ${WAIT_MS} ms (got ${got.length ? got[0]!.status : 'nothing'}, closed=${r.closed}, ${r.ms} ms)`,
        );
      });
    }
  });

  // ---- D: honesty -----------------------------------------------------------------------------

  t.test('D: request ids and Connection: close mean what they say', async (t) => {
    t.test('x-request-id with 0xff at its ends: echoed byte for byte', todo(fe), async (t) => {
      for (const id of [Buffer.from('id-\xff', 'latin1'), Buffer.from('\xffid', 'latin1'), Buffer.from('ok-é', 'utf8')]) {
        const req = Buffer.concat([
          Buffer.from(`POST ${CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(BODY)}\r\nX-Request-Id: `),
          id,
          Buffer.from(`\r\n\r\n${BODY}`),
        ]);
        const r = await exchange(fast.router.port, [req], { enough: atLeast(1) });
        const a = answers(r.data)[0];
        t.equal(a?.status, 200, `${id.toString('hex')}: served`);
        t.equal(Buffer.from(a?.headers['x-request-id'] ?? '', 'latin1').toString('hex'), id.toString('hex'), `${id.toString('hex')}: echoed as sent`);
      }
    });

    t.test('x-request-id with 0xff at its end: sent upstream byte for byte', todo(fe), async (t) => {
      // an engine that records the x-request-id bytes of each inference request
      const seen: Buffer[] = [];
      const { port: enginePort } = await listenRaw(t, (sock) => {
        let buf = Buffer.alloc(0);
        sock.on('data', (b: Buffer) => {
          buf = Buffer.concat([buf, b]);
          for (;;) {
            const end = buf.indexOf('\r\n\r\n');
            if (end < 0) return;
            const head = buf.subarray(0, end);
            const cl = /content-length: *(\d+)/i.exec(head.toString('latin1'));
            const len = cl ? Number(cl[1]) : 0;
            if (buf.length < end + 4 + len) return;
            const text = head.toString('latin1');
            const m = /\r\nx-request-id: ?([^\r]*)/i.exec(text);
            if (text.startsWith('POST') && m) seen.push(Buffer.from(m[1]!, 'latin1'));
            buf = buf.subarray(end + 4 + len);
            const out = text.startsWith('POST')
              ? JSON.stringify({ id: 'x', object: 'chat.completion', choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }] })
              : '';
            sock.write(`HTTP/1.1 200 OK\r\nContent-Type: ${out ? 'application/json' : 'text/plain'}\r\nContent-Length: ${out.length}\r\n\r\n${out}`);
          }
        });
      });
      const rr = await startTestRouter(t, {
        n: 1,
        pools: () => [{ name: 'raw', models: [MODEL], endpoints: [{ name: 'raw', url: `http://127.0.0.1:${enginePort}` }] }],
        extra: { dataLayer: { scrapeIntervalMs: 0, healthIntervalMs: 0 }, server: { frontEnd: fe } },
      });
      const id = Buffer.from('up-\xff', 'latin1');
      const req = Buffer.concat([
        Buffer.from(`POST ${CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(BODY)}\r\nX-Request-Id: `),
        id,
        Buffer.from(`\r\n\r\n${BODY}`),
      ]);
      const r = await exchange(rr.router.port, [req], { enough: atLeast(1) });
      t.equal(answers(r.data)[0]?.status, 200, 'served');
      t.equal(seen[0]?.toString('hex'), id.toString('hex'), 'the engine got the id as sent');
    });

    t.test('a 404 to a POST, a GET pipelined behind it', async (t) => {
      const r = await exchange(fast.router.port, [post('/nope', '{"a":1}') + 'GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n'], { enough: atLeast(2) });
      const got = answers(r.data);
      t.equal(got[0]?.status, 404, 'the POST gets its 404');
      if (got[0]?.headers.connection === 'close') {
        t.equal(got.length, 1, 'it said Connection: close, so nothing behind it is served');
        t.ok(r.closed, 'and the connection closes');
      } else {
        t.same(
          got.map((a) => a.status),
          [404, 200],
          'the connection stays open (no Connection: close), so the GET behind it is answered',
        );
      }
    });

    t.test('a 405 to a PUT with a body, a GET pipelined behind it', async (t) => {
      const r = await exchange(fast.router.port, [
        `PUT ${CHAT} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n`,
      ], { enough: atLeast(2) });
      const got = answers(r.data);
      t.equal(got[0]?.status, 405, 'the PUT gets its 405');
      if (got[0]?.headers.connection === 'close') {
        t.equal(got.length, 1, 'it said Connection: close, so nothing behind it is served');
        t.ok(r.closed, 'and the connection closes');
      } else {
        t.same(
          got.map((a) => a.status),
          [405, 200],
          'the connection stays open, so the GET behind it is answered',
        );
      }
    });
  });
  });
}
