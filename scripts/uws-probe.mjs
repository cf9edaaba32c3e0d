// Probes of uWebSockets.js 20.30 (the binary Switchyard loads) on its own, no
// router: the HTTP/1.1 facts behind docs/uws-framing.md. Each line is one
// observation, as JSON. Run from the repository root: node scripts/uws-probe.mjs
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import net from 'node:net';

const require = createRequire(import.meta.url);
const dir = dirname(require.resolve('uWebSockets.js/package.json'));
const uws = require(join(dir, 'binaries', `uws_${process.platform}_${process.arch}_${process.versions.modules}.node`));
const WAIT = 1200;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Writes parts (gapMs apart) on a fresh connection; resolves with what came back, whether the server closed, and when. */
function exchange(port, parts, gapMs = 0, waitMs = WAIT) {
  const t0 = Date.now();
  return new Promise((resolve) => {
    const got = [];
    let over = false;
    const s = net.connect(port, '127.0.0.1');
    const done = (closed) => {
      if (over) return;
      over = true;
      clearTimeout(timer);
      s.destroy();
      const text = Buffer.concat(got).toString('latin1').replace(/Date: [^\r]*\r\n|uWebSockets: 20\r\n/g, '');
      resolve({ closed, ms: Date.now() - t0, reply: text });
    };
    const timer = setTimeout(() => done(false), waitMs);
    s.on('connect', async () => {
      for (const p of parts) {
        if (over) return;
        s.write(p);
        if (gapMs) await sleep(gapMs);
      }
    });
    s.on('data', (b) => got.push(b));
    s.on('error', () => {});
    s.on('close', () => done(true));
  });
}

const seen = [];
const codes = (v) => [...v].map((c) => c.codePointAt(0).toString(16)).join(' ');
const app = uws.App();
app.any('/*', (res, req) => {
  const url = req.getUrl();
  const all = [];
  req.forEach((k, v) => all.push(`${k}=${codes(v)}`));
  seen.push({ url, getHeaderCL: req.getHeader('content-length'), getHeaderTE: req.getHeader('transfer-encoding'), getHeaderXA: codes(req.getHeader('x-a')), forEach: all });
  let gone = false;
  res.onAborted(() => {
    gone = true;
    seen.push({ aborted: url });
  });
  if (url === '/close') return res.cork(() => res.end('closing', true)); // answer with Connection: close, synchronously
  if (url === '/kill') return res.close(); // close inside the handler
  if (url === '/defer-close') return void setImmediate(() => !gone && res.close());
  res.onData((ab, last) => {
    if (!last) return;
    const answer = () => !gone && res.cork(() => res.end(`ok ${url}`));
    if (url.startsWith('/async')) setTimeout(answer, 300); // answered later, like a proxied request
    else if (url.startsWith('/pause')) {
      res.pause(); // no reads (and no writable events) until resume()
      setTimeout(() => {
        if (!gone) res.resume();
        answer();
      }, 300);
    } else answer();
  });
});
const port = await new Promise((r) => app.listen('127.0.0.1', 0, (s) => r(uws.us_socket_local_port(s))));
const line = (n) => Array.from({ length: n }, (_, i) => `X-H${i}: v\r\n`).join('');
const P = (u, body = '1') => `POST ${u} HTTP/1.1\r\nHost: x\r\nContent-Length: ${body.length}\r\n\r\n${body}`;

async function probe(name, parts, gapMs = 0) {
  seen.length = 0;
  const r = await exchange(port, parts, gapMs);
  console.log(JSON.stringify({ probe: name, ...r, handlers: seen.splice(0) }));
}

// 1. requests uWS cannot parse: no handler runs, no answer, no close before its idle timeout (10 s)
const unparsed = {
  'HTTP/1.0': 'GET /x HTTP/1.0\r\nHost: x\r\n\r\n',
  'absolute-form': 'GET http://x/x HTTP/1.1\r\nHost: x\r\n\r\n',
  'HTTP/2 preface': 'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n',
  'obs-fold': 'GET /x HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n folded\r\n\r\n',
  'NUL in value': 'GET /x HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n',
  'VT in Transfer-Encoding': 'GET /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\x0b\r\n\r\n',
  'bare LF': 'GET /x HTTP/1.1\nHost: x\n\n',
  'space before colon': 'GET /x HTTP/1.1\r\nHost: x\r\nX-A : 1\r\n\r\n',
  'no header lines': 'GET /x HTTP/1.1\r\n\r\n',
  '48 header lines': `GET /x HTTP/1.1\r\nHost: x\r\n${line(47)}\r\n`,
  '49 header lines': `GET /x HTTP/1.1\r\nHost: x\r\n${line(48)}\r\n`,
  '49 header lines, 5 KB': `GET /x HTTP/1.1\r\nHost: x\r\n${line(48)}X-Pad: ${'a'.repeat(5000)}\r\n\r\n`,
  'no Host (other headers)': 'GET /x HTTP/1.1\r\nX-A: 1\r\n\r\n',
  'Content-Length and Transfer-Encoding': 'POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n1\r\n0\r\n\r\n',
};
await Promise.all(
  Object.entries(unparsed).map(async ([name, req]) => {
    const r = await exchange(port, [req]);
    console.log(JSON.stringify({ probe: `unparsed: ${name}`, ...r }));
  }),
);
console.log(JSON.stringify({ note: 'handler calls during the unparsed probes', handlers: seen.splice(0) }));

// 2. framing uWS accepts: duplicate Content-Length (first wins), any Transfer-Encoding decoded as chunked
await probe('dup Content-Length 0 then 5', ['GET /x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 5\r\n\r\nhello']);
await probe('Transfer-Encoding: gzip, chunked body', ['POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n1\r\nZ\r\n0\r\n\r\n']);
await probe('two Transfer-Encoding lines', ['POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nZ\r\n0\r\n\r\n']);

// 3. header values: getHeader is latin1 (one char per byte), forEach decodes UTF-8 (0xff -> U+FFFD); bytes >= 0x80 at either end are trimmed
await probe('high bytes in a value', [Buffer.from('GET /x HTTP/1.1\r\nHost: x\r\nX-A: \xffq\xc3\xa9\xffz\xff\r\n\r\n', 'latin1')]);

// 4. pipelining: synchronous answers work; an unanswered request when the next one is parsed closes the connection
await probe('two POSTs, answered synchronously', [P('/a') + P('/b')]);
await probe('two POSTs in one write, first answered later', [P('/async1') + P('/b')]);
await probe('second POST 100 ms later, first answered later', [P('/async1'), P('/b')], 100);
await probe('same, with pause() after the body and resume() before the answer', [P('/pause1'), P('/b')], 100);
await probe('same with pause(), both in one write', [P('/pause1') + P('/b')]);

// 5. Connection: close from a handler does not stop the next pipelined request of the same read
await probe('end(body, true), then a pipelined GET', ['GET /close HTTP/1.1\r\nHost: x\r\n\r\nGET /after HTTP/1.1\r\nHost: x\r\n\r\n']);
// 6. closing inside the handler drops the answers already written in this read (still in the cork buffer); closing later does not
await probe('GET answered, then a request whose handler calls close()', ['GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /kill HTTP/1.1\r\nHost: x\r\n\r\n']);
await probe('GET answered, then a request closed from setImmediate', ['GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /defer-close HTTP/1.1\r\nHost: x\r\n\r\n']);
await probe('Content-Length: abc: the handler runs first, then uWS closes (no error answer)', ['GET /a HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n']);

// 7. while paused, a client that goes away is not noticed
for (const u of ['/async9', '/pause9']) {
  seen.length = 0;
  const s = net.connect(port, '127.0.0.1');
  s.on('error', () => {});
  s.write(P(u));
  await sleep(50);
  s.end();
  await sleep(150);
  console.log(JSON.stringify({ probe: `client sends FIN 50 ms into ${u}; events within 150 ms`, handlers: seen.splice(0).filter((x) => x.aborted) }));
  await sleep(300);
}
app.close();
