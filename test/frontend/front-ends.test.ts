// One conformance suite for the router's HTTP front ends (server.frontEnd), the
// same cases over each one that loads on this Node, raw loopback sockets against
// a real router over real simulated engines: keep-alive, HTTP/1.0 (close and
// keep-alive), a chunked body, Expect: 100-continue, a body over the limit (413
// with the OpenAI error JSON), no server-naming header, HEAD, OPTIONS. The
// native front end only: server.maxConnections. The framing cases (pipelining,
// smuggling, 400/431/505) are test/router/http-framing.test.ts, over both too.
// uWS's known failures stay TODO with their reason (docs/uws-framing.md).
import t from 'tap';
import { connect, type Socket } from 'node:net';
import { startTestRouter } from '../support/router-util.js';
import { uwsProblem } from '../../src/uws.js';

const UWS = 'uWS 20.30 behaviour the router cannot reach (docs/uws-framing.md)';
const FRONT_ENDS = uwsProblem() === null ? ['uws', 'native'] : ['native'];
const CHAT = '/v1/chat/completions';
const BODY = JSON.stringify({ model: 'open-model', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });

interface Answer {
  status: number;
  headers: Record<string, string>;
  body: string;
}

/** Parses whole answers (content-length or chunked; close-delimited for the last one when `closed`). */
function answers(data: string, closed: boolean): Answer[] {
  const out: Answer[] = [];
  let at = 0;
  while (at < data.length) {
    const end = data.indexOf('\r\n\r\n', at);
    if (end < 0) break;
    const lines = data.slice(at, end).split('\r\n');
    const m = /^HTTP\/1\.[01] (\d{3})/.exec(lines[0]!);
    if (!m) break;
    const headers: Record<string, string> = {};
    for (const l of lines.slice(1)) {
      const c = l.indexOf(':');
      headers[l.slice(0, c).toLowerCase()] = l.slice(c + 1).trim();
    }
    let p = end + 4;
    let body = '';
    const status = Number(m[1]);
    if (status === 100) {
      out.push({ status, headers, body });
      at = p;
      continue;
    }
    if (headers['content-length'] !== undefined) {
      const n = Number(headers['content-length']);
      if (data.length < p + n) break;
      body = data.slice(p, p + n);
      p += n;
    } else if (headers['transfer-encoding'] === 'chunked') {
      let ok = false;
      for (;;) {
        const le = data.indexOf('\r\n', p);
        if (le < 0) break;
        const n = parseInt(data.slice(p, le), 16);
        if (n === 0) {
          p = le + 4;
          ok = true;
          break;
        }
        body += data.slice(le + 2, le + 2 + n);
        p = le + 2 + n + 2;
      }
      if (!ok) break;
    } else if (closed) {
      body = data.slice(p);
      p = data.length;
    } else break;
    out.push({ status, headers, body });
    at = p;
  }
  return out;
}

/** Writes parts (`gapMs` apart, or each after `waitFor` shows in the data), reads until `enough`, close or `ms`. */
function talk(port: number, parts: string[], o: { enough?: (a: Answer[]) => boolean; ms?: number; waitFor?: RegExp } = {}): Promise<{ got: Answer[]; closed: boolean; raw: string }> {
  return new Promise((resolve) => {
    const s: Socket = connect(port, '127.0.0.1');
    let data = '';
    let over = false;
    const done = (closed: boolean) => {
      if (over) return;
      over = true;
      clearTimeout(timer);
      s.destroy();
      resolve({ got: answers(data, closed), closed, raw: data });
    };
    const timer = setTimeout(() => done(false), o.ms ?? 3000);
    let i = 0;
    s.on('connect', () => {
      s.write(parts[i++]!);
      if (o.waitFor === undefined) while (i < parts.length) s.write(parts[i++]!);
    });
    s.on('data', (b: Buffer) => {
      data += b.toString('latin1');
      if (o.waitFor !== undefined && i < parts.length && o.waitFor.test(data)) s.write(parts[i++]!);
      if (o.enough?.(answers(data, false))) done(false);
    });
    s.on('error', () => {});
    s.on('close', () => done(true));
  });
}

const post = (body: string, extra = '') => `POST ${CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n${extra}\r\n${body}`;

for (const fe of FRONT_ENDS) {
  const todo = fe === 'uws' ? { todo: UWS } : {};
  t.test(`front end: ${fe}`, async (t) => {
    const { router } = await startTestRouter(t, { n: 1, extra: { server: { frontEnd: fe }, limits: { maxBodyBytes: 4096 } } });
    const port = router.port;
    t.equal(router.core.frontEnd.name, fe, `serving on ${fe}`);

    t.test('keep-alive: two requests on one connection, it stays open', async (t) => {
      const r = await talk(port, ['GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n', post(BODY)], { enough: (a) => a.length >= 2, ms: 3000 });
      t.same(r.got.map((a) => a.status), [200, 200]);
      t.equal(r.closed, false, 'still open');
      t.match(JSON.parse(r.got[1]!.body), { object: 'chat.completion' });
    });

    t.test('HTTP/1.0 GET /readyz is answered and closed', todo, async (t) => {
      const r = await talk(port, ['GET /readyz HTTP/1.0\r\n\r\n'], { ms: 1500 });
      t.equal(r.got[0]?.status, 200);
      t.ok(r.closed, 'closed after it (HTTP/1.0 without keep-alive)');
    });

    t.test('HTTP/1.0 with Connection: keep-alive stays open', todo, async (t) => {
      const r = await talk(port, ['GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n', 'GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n'], { enough: (a) => a.length >= 2, ms: 1500 });
      t.same(r.got.map((a) => a.status), [200, 200]);
      t.equal(r.got[0]?.headers.connection, 'keep-alive');
      t.equal(r.closed, false);
    });

    t.test('a chunked request body is served', async (t) => {
      const half = BODY.length >> 1;
      const chunked = `${half.toString(16)}\r\n${BODY.slice(0, half)}\r\n${(BODY.length - half).toString(16)}\r\n${BODY.slice(half)}\r\n0\r\n\r\n`;
      const r = await talk(port, [`POST ${CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n${chunked}`], { enough: (a) => a.length >= 1 });
      t.equal(r.got[0]?.status, 200);
    });

    t.test('Expect: 100-continue: 100 before the body, then the answer', async (t) => {
      const head = `POST ${CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(BODY)}\r\nExpect: 100-continue\r\n\r\n`;
      const r = await talk(port, [head, BODY], { waitFor: /^HTTP\/1\.1 100/, enough: (a) => a.some((x) => x.status === 200) });
      t.same(r.got.map((a) => a.status), [100, 200]);
    });

    t.test('a body over limits.maxBodyBytes: 413 with the OpenAI error JSON', async (t) => {
      const big = JSON.stringify({ model: 'open-model', messages: [{ role: 'user', content: 'x'.repeat(10_000) }] });
      const r = await talk(port, [post(big)], { enough: (a) => a.length >= 1 });
      t.equal(r.got[0]?.status, 413);
      const e = JSON.parse(r.got[0]!.body).error;
      t.match(e.message, /exceeds the limit of 4096 bytes/);
      t.equal(e.type, 'invalid_request_error');
      t.ok('param' in e && 'code' in e, 'param and code present');
    });

    t.test('no header names the server or its version', todo, async (t) => {
      const r = await talk(port, ['GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n'], { enough: (a) => a.length >= 1 });
      t.equal(r.got[0]?.status, 200);
      t.notOk(/uwebsockets|^server:/im.test(r.raw), `no server header (${JSON.stringify(r.raw.slice(0, r.raw.indexOf('\r\n\r\n')))})`);
    });

    t.test('HEAD /healthz: headers only, the connection stays in step', async (t) => {
      const r = await talk(port, ['HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n'], { enough: (a) => a.length >= 2, ms: 1500 });
      // a HEAD answer's content-length (if any) describes a body that is not sent: parse by hand
      t.match(r.raw, /^HTTP\/1\.1 200/);
      t.equal((r.raw.match(/HTTP\/1\.1 200/g) ?? []).length, 2, 'two answers');
      t.match(r.raw, /\{"status":"ok"\}$/, 'the GET body last, nothing between');
    });

    t.test('OPTIONS / (HAProxy\'s bare option httpchk) is answered 2xx with Allow', todo, async (t) => {
      const r = await talk(port, ['OPTIONS / HTTP/1.0\r\n\r\n'], { ms: 1500 });
      t.ok(r.got[0] !== undefined && r.got[0].status >= 200 && r.got[0].status < 300, `2xx (got ${r.got[0]?.status})`);
      t.match(r.got[0]?.headers.allow ?? '', /GET/);
    });
  });
}

t.test('native: server.maxConnections closes the connection over the limit at once', async (t) => {
  const { router } = await startTestRouter(t, { n: 1, extra: { server: { frontEnd: 'native', maxConnections: 3 } } });
  const port = router.port;
  const open: Socket[] = [];
  for (let i = 0; i < 3; i++) {
    const s = connect(port, '127.0.0.1');
    s.on('error', () => {});
    await new Promise((r) => s.on('connect', r));
    open.push(s);
  }
  t.teardown(() => open.forEach((s) => s.destroy()));
  await new Promise((r) => setTimeout(r, 100));
  const over = await talk(port, ['GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n'], { ms: 1500 });
  t.equal(over.got.length, 0, 'the fourth connection gets no answer');
  t.ok(over.closed, 'and is closed at once');
  // the three open ones are served
  open[0]!.write('GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n');
  const first = await new Promise<string>((r) => open[0]!.once('data', (b) => r(b.toString('latin1'))));
  t.match(first, /^HTTP\/1\.1 200/, 'an open connection is served');
  const metrics = await (await fetch(`${router.url}/metrics`).catch(() => null))?.text();
  // the scrape itself needs a connection: closed ones free their slot first
  t.equal(metrics, undefined, 'the scrape is refused too while three are open');
  open.forEach((s) => s.destroy());
  await new Promise((r) => setTimeout(r, 100));
  const text = await (await fetch(`${router.url}/metrics`)).text();
  t.match(text, /switchyard_client_connections_refused_total [1-9]/, 'refusals counted');
  // after the limit frees, connections are taken again
  const again = await talk(port, ['GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n'], { enough: (a) => a.length >= 1 });
  t.equal(again.got[0]?.status, 200, 'accepted again below the limit');
});
