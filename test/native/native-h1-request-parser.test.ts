// The native front end's strict HTTP/1.1 request parser (native/h1_request_parser.h), through the
// addon's test-only h1RequestParseForTest: a table of RFC 9112 cases (each also fed one byte at a
// time, the answer must not depend on the read splits), then properties over generated requests:
// valid heads round-trip their fields byte for byte (>= 0x80 kept, only SP/HTAB trimmed) and every
// strict prefix of them is incomplete, never invalid; any input (mutated at random) gets the same
// outcome whatever its splits, and a prefix of an invalid input is incomplete or fails alike;
// chunked bodies in any chunking, extensions and trailers decode to their bytes, and the bytes
// after them (a pipelined request) are not consumed.
import fc from 'fast-check';
import t from 'tap';
import { h1RequestParseForTest, type H1RequestProbe } from '../../bindings/front-end.js';

const RUNS = Number(process.env.H1_PROPERTY_RUNS ?? 500);
const bytes = (s: string) => Buffer.from(s, 'latin1');
const parse = (s: string, splits: number[] = [], maxHead?: number, maxLines?: number) =>
  h1RequestParseForTest(bytes(s), Uint32Array.from(splits), maxHead, maxLines);
const everyByte = (s: string) => Array.from({ length: Math.max(0, s.length - 1) }, (_, i) => i + 1);

const H = 'Host: x\r\n';
const lines = (n: number) => Array.from({ length: n }, (_, i) => `X-H${i}: v\r\n`).join('');

// ---- the table -----------------------------------------------------------------------------------

const cases: { name: string; req: string; status?: number; more?: boolean; check?: (t: Tap.Test, r: H1RequestProbe) => void }[] = [
  { name: 'a GET', req: `GET /healthz HTTP/1.1\r\n${H}\r\n`, check: (t, r) => t.match(r, { method: 'GET', target: '/healthz', minor: 1, keepAlive: true, length: -1, chunked: false, form: 'origin' }) },
  { name: 'leading empty lines are skipped', req: `\r\n\r\nGET / HTTP/1.1\r\n${H}\r\n`, check: (t, r) => t.equal(r.target, '/') },
  { name: 'HTTP/1.0 without Host, close-delimited', req: 'GET /healthz HTTP/1.0\r\n\r\n', check: (t, r) => t.match(r, { minor: 0, keepAlive: false }) },
  { name: 'HTTP/1.0 keep-alive when asked', req: 'GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n', check: (t, r) => t.match(r, { minor: 0, keepAlive: true }) },
  { name: 'HTTP/1.1 Connection: close (in a list, over two lines)', req: `GET / HTTP/1.1\r\n${H}Connection: upgrade\r\nConnection: foo, CLOSE\r\n\r\n`, check: (t, r) => t.equal(r.keepAlive, false) },
  { name: 'HTTP/1.2 is served as 1.1', req: `GET / HTTP/1.2\r\n${H}\r\n`, check: (t, r) => t.equal(r.minor, 1) },
  { name: 'HTTP/2.0 is 505', req: `GET / HTTP/2.0\r\n${H}\r\n`, status: 505 },
  { name: 'the HTTP/2 preface is 505', req: 'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n', status: 505 },
  { name: 'HTTP/0.9 is 505', req: 'GET / HTTP/0.9\r\n\r\n', status: 505 },
  { name: 'a lower-case version is 400', req: `GET / http/1.1\r\n${H}\r\n`, status: 400 },
  { name: 'HTTP/1.x is 400', req: `GET / HTTP/1.x\r\n${H}\r\n`, status: 400 },
  { name: 'no version (HTTP/0.9 style) is 400', req: 'GET /\r\n\r\n', status: 400 },
  { name: 'two spaces after the method are 400', req: `GET  / HTTP/1.1\r\n${H}\r\n`, status: 400 },
  { name: 'a space in the target is 400', req: `GET /a b HTTP/1.1\r\n${H}\r\n`, status: 400 },
  { name: 'a tab in the target is 400', req: `GET /a\tb HTTP/1.1\r\n${H}\r\n`, status: 400 },
  { name: 'a method with a non-token byte is 400', req: `G(T / HTTP/1.1\r\n${H}\r\n`, status: 400 },
  { name: 'garbage is 400 at its first byte', req: '\x16\x03\x01\x02\x00', status: 400 },
  { name: 'bytes >= 0x80 in the target are kept', req: `GET /caf\xc3\xa9 HTTP/1.1\r\n${H}\r\n`, check: (t, r) => t.equal(r.target, '/caf\xc3\xa9') },
  { name: 'absolute-form', req: `GET http://x/healthz HTTP/1.1\r\n${H}\r\n`, check: (t, r) => t.match(r, { form: 'absolute', target: 'http://x/healthz' }) },
  { name: 'OPTIONS *', req: `OPTIONS * HTTP/1.1\r\n${H}\r\n`, check: (t, r) => t.equal(r.form, 'asterisk') },
  { name: 'GET * is 400', req: `GET * HTTP/1.1\r\n${H}\r\n`, status: 400 },
  { name: 'CONNECT authority-form', req: `CONNECT x:443 HTTP/1.1\r\n${H}\r\n`, check: (t, r) => t.equal(r.form, 'authority') },
  { name: 'a relative target is 400', req: `GET healthz HTTP/1.1\r\n${H}\r\n`, status: 400 },
  { name: 'a bare LF after the request line is 400', req: 'GET /healthz HTTP/1.1\nHost: x\n\n', status: 400 },
  { name: 'a bare LF after a field is 400', req: 'GET /healthz HTTP/1.1\r\nHost: x\n\r\n', status: 400 },
  { name: 'a bare CR in a value is 400', req: `GET / HTTP/1.1\r\n${H}X-A: a\rb\r\n\r\n`, status: 400 },
  { name: 'NUL in a value is 400', req: `GET / HTTP/1.1\r\n${H}X-A: a\x00b\r\n\r\n`, status: 400 },
  { name: 'a vertical tab in a value is 400', req: `GET / HTTP/1.1\r\n${H}X-A: a\x0bb\r\n\r\n`, status: 400 },
  { name: 'DEL in a value is 400', req: `GET / HTTP/1.1\r\n${H}X-A: a\x7fb\r\n\r\n`, status: 400 },
  { name: 'obs-fold is 400', req: `GET / HTTP/1.1\r\n${H}X-A: 1\r\n folded\r\n\r\n`, status: 400 },
  { name: 'whitespace before the first field is 400', req: `GET / HTTP/1.1\r\n ${H}\r\n`, status: 400 },
  { name: 'a space before the colon is 400', req: `GET / HTTP/1.1\r\n${H}X-A : 1\r\n\r\n`, status: 400 },
  { name: 'a field with no colon is 400', req: `GET / HTTP/1.1\r\n${H}no colon here\r\n\r\n`, status: 400 },
  { name: 'a field with no name is 400', req: `GET / HTTP/1.1\r\n${H}: v\r\n\r\n`, status: 400 },
  { name: 'no Host in HTTP/1.1 is 400', req: 'GET /healthz HTTP/1.1\r\nX-A: 1\r\n\r\n', status: 400 },
  { name: 'no fields at all in HTTP/1.1 is 400', req: 'GET /healthz HTTP/1.1\r\n\r\n', status: 400 },
  { name: 'two Host lines are 400', req: `GET / HTTP/1.1\r\n${H}${H}\r\n`, status: 400 },
  {
    name: 'value bytes >= 0x80 at both ends are kept, SP and HTAB trimmed',
    req: `GET / HTTP/1.1\r\n${H}x-request-id: \t\xffabc\xa0\xff \t\r\n\r\n`,
    check: (t, r) => t.same(r.fields![1], ['x-request-id', '\xffabc\xa0\xff']),
  },
  { name: 'an empty value', req: `GET / HTTP/1.1\r\n${H}X-E:\r\n\r\n`, check: (t, r) => t.same(r.fields![1], ['X-E', '']) },
  { name: '100 field lines are served', req: `GET / HTTP/1.1\r\n${H}${lines(99)}\r\n`, check: (t, r) => t.equal(r.fields!.length, 100) },
  { name: '101 field lines are 431', req: `GET / HTTP/1.1\r\n${H}${lines(100)}\r\n`, status: 431 },
  { name: 'a 64 KiB head is 431', req: `GET / HTTP/1.1\r\n${H}X-Big: ${'a'.repeat(64 * 1024)}\r\n\r\n`, status: 431 },
  { name: 'a 64 KiB head still incomplete is 431, not more', req: `GET / HTTP/1.1\r\n${H}X-Big: ${'a'.repeat(64 * 1024)}`, status: 431 },
  { name: 'a head of exactly 64 KiB is served', req: exactHead(64 * 1024), check: (t, r) => t.equal(r.headLen, 64 * 1024) },
  { name: 'an incomplete head is more', req: `GET / HTTP/1.1\r\n${H}X-A: 1\r`, more: true },
  { name: 'Content-Length', req: `POST / HTTP/1.1\r\n${H}Content-Length: 5\r\n\r\nhelloGET`, check: (t, r) => t.match(r, { length: 5, bodyOutcome: 'done', consumed: r.headLen! + 5 }) },
  { name: 'identical Content-Length lines are served', req: `POST / HTTP/1.1\r\n${H}Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello`, check: (t, r) => t.equal(r.length, 5) },
  { name: 'differing Content-Length lines are 400', req: `POST / HTTP/1.1\r\n${H}Content-Length: 0\r\nContent-Length: 5\r\n\r\nhello`, status: 400 },
  { name: 'a Content-Length list is 400', req: `POST / HTTP/1.1\r\n${H}Content-Length: 5, 5\r\n\r\nhello`, status: 400 },
  { name: 'a signed Content-Length is 400', req: `POST / HTTP/1.1\r\n${H}Content-Length: +5\r\n\r\nhello`, status: 400 },
  { name: 'an empty Content-Length is 400', req: `POST / HTTP/1.1\r\n${H}Content-Length:\r\n\r\n`, status: 400 },
  { name: 'Content-Length 2^53-1 is accepted', req: `POST / HTTP/1.1\r\n${H}Content-Length: 9007199254740991\r\n\r\n`, check: (t, r) => t.equal(r.length, 9007199254740991) },
  { name: 'Content-Length 2^53 is 400', req: `POST / HTTP/1.1\r\n${H}Content-Length: 9007199254740992\r\n\r\n`, status: 400 },
  { name: 'Content-Length of 20 digits is 400', req: `POST / HTTP/1.1\r\n${H}Content-Length: 99999999999999999999\r\n\r\n`, status: 400 },
  { name: 'chunked', req: `POST / HTTP/1.1\r\n${H}Transfer-Encoding: Chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET`, check: (t, r) => t.match(r, { chunked: true, bodyOutcome: 'done', body: bytes('hello'), consumed: r.headLen! + 15 }) },
  { name: 'chunked with Content-Length is 400', req: `POST / HTTP/1.1\r\n${H}Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n`, status: 400 },
  { name: 'Content-Length after chunked is 400', req: `POST / HTTP/1.1\r\n${H}Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n`, status: 400 },
  { name: 'chunked in HTTP/1.0 is 400', req: 'POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n', status: 400 },
  ...['gzip', 'xchunked', 'chunked, identity', 'identity', 'chunked, chunked', ',,'].map((te) => ({ name: `Transfer-Encoding: ${te} is 400`, req: `POST / HTTP/1.1\r\n${H}Transfer-Encoding: ${te}\r\n\r\n0\r\n\r\n`, status: 400 })),
  { name: 'Transfer-Encoding: chunked\\x0b is 400', req: `POST / HTTP/1.1\r\n${H}Transfer-Encoding: chunked\x0b\r\n\r\n0\r\n\r\n`, status: 400 },
  { name: 'two Transfer-Encoding lines are 400', req: `POST / HTTP/1.1\r\n${H}Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n`, status: 400 },
  { name: 'an unknown coding before chunked is 501', req: `POST / HTTP/1.1\r\n${H}Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n`, status: 501 },
  { name: 'Expect: 100-continue', req: `POST / HTTP/1.1\r\n${H}Expect: 100-Continue\r\nContent-Length: 2\r\n\r\n`, check: (t, r) => t.match(r, { expectContinue: true, bodyOutcome: 'more' }) },
  { name: 'another expectation is 417', req: `POST / HTTP/1.1\r\n${H}Expect: teapot\r\n\r\n`, status: 417 },
  { name: 'a chunk size with no digits is 400 (body)', req: `POST / HTTP/1.1\r\n${H}Transfer-Encoding: chunked\r\n\r\n;x\r\n`, check: (t, r) => t.equal(r.bodyOutcome, 'fail') },
  { name: 'chunk data without its CRLF is 400 (body)', req: `POST / HTTP/1.1\r\n${H}Transfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n`, check: (t, r) => t.equal(r.bodyOutcome, 'fail') },
  { name: 'a bare LF in chunk framing is 400 (body)', req: `POST / HTTP/1.1\r\n${H}Transfer-Encoding: chunked\r\n\r\n2\nab\r\n0\r\n\r\n`, check: (t, r) => t.equal(r.bodyOutcome, 'fail') },
  { name: 'a 13-digit chunk size is 400 (body)', req: `POST / HTTP/1.1\r\n${H}Transfer-Encoding: chunked\r\n\r\n0000000000001\r\na\r\n0\r\n\r\n`, check: (t, r) => t.equal(r.bodyOutcome, 'fail') },
  { name: 'a chunk extension and trailers are dropped', req: `POST / HTTP/1.1\r\n${H}Transfer-Encoding: chunked\r\n\r\n3 ;a=b\r\nabc\r\n0;last\r\nx-t: 1\r\n\r\n`, check: (t, r) => t.match(r, { bodyOutcome: 'done', body: bytes('abc') }) },
  { name: 'a NUL in a trailer is 400 (body)', req: `POST / HTTP/1.1\r\n${H}Transfer-Encoding: chunked\r\n\r\n0\r\nx-t: \x00\r\n\r\n`, check: (t, r) => t.equal(r.bodyOutcome, 'fail') },
];

function exactHead(total: number): string {
  const pre = `GET / HTTP/1.1\r\n${H}X-Big: `;
  return pre + 'a'.repeat(total - pre.length - 4) + '\r\n\r\n';
}

/** The fields of a probe that must not depend on read splits. */
const essence = (r: H1RequestProbe) => ({ ...r, body: r.body?.toString('latin1') });

t.test('the table, whole and one byte at a time', async (t) => {
  for (const c of cases) {
    t.test(c.name, async (t) => {
      const whole = parse(c.req);
      if (c.status !== undefined) t.match(whole, { outcome: 'fail', status: c.status }, `answered ${c.status}`);
      else if (c.more) t.match(whole, { outcome: 'more', status: 0 });
      else t.match(whole, { outcome: 'done', status: 0 });
      c.check?.(t, whole);
      if (c.req.length < 4096) t.same(essence(parse(c.req, everyByte(c.req))), essence(whole), 'the same one byte at a time');
    });
  }
});

t.test('limits are configurable', async (t) => {
  const req = `GET / HTTP/1.1\r\n${H}${lines(9)}\r\n`;
  t.match(parse(req, [], 64 * 1024, 10), { outcome: 'done' });
  t.match(parse(req, [], 64 * 1024, 9), { outcome: 'fail', status: 431 });
  t.match(parse(req, [], req.length, 100), { outcome: 'done' });
  t.match(parse(req, [], req.length - 1, 100), { outcome: 'fail', status: 431 });
});

t.test('begun: a timeout answers 408 only once a request line has begun', async (t) => {
  t.equal(parse('\r\n').begun, false);
  t.equal(parse('G').begun, true);
});

// ---- properties ----------------------------------------------------------------------------------

const tchars = '!#$%&\'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ';
const token = fc.array(fc.constantFrom(...tchars), { minLength: 1, maxLength: 12 }).map((a) => a.join(''));
const valueByte = fc.oneof(
  { weight: 6, arbitrary: fc.integer({ min: 0x21, max: 0x7e }) },
  { weight: 2, arbitrary: fc.integer({ min: 0x80, max: 0xff }) },
  { weight: 1, arbitrary: fc.constantFrom(0x20, 0x09) },
);
const value = fc.array(valueByte, { maxLength: 24 }).map((a) => String.fromCharCode(...a));
const ows = fc.constantFrom('', ' ', '\t', '  ', ' \t');
const trimOws = (s: string) => s.replace(/^[ \t]+|[ \t]+$/g, '');
const reserved = /^(host|content-length|transfer-encoding|expect|connection)$/i;
const extraField = fc.tuple(token.filter((n) => !reserved.test(n)), ows, value, ows);
const target = fc.oneof(
  fc.array(fc.oneof(fc.integer({ min: 0x21, max: 0x7e }), fc.integer({ min: 0x80, max: 0xff })), { maxLength: 30 }).map((a) => '/' + String.fromCharCode(...a)),
  fc.constant('http://x/a?b=c'),
);

/** A valid request head and the fields it must report. */
const validHead = fc.tuple(token, target, fc.constantFrom('1.1', '1.0'), fc.array(extraField, { maxLength: 12 }), fc.nat(3)).map(([method, tgt, version, extra, hostAt]) => {
  const fields: [string, string, string, string][] = extra.map(([n, a, v, b]) => [n, a, v, b]);
  if (version === '1.1') fields.splice(hostAt % (fields.length + 1), 0, ['Host', ' ', 'x', '']);
  const head = `${method} ${tgt} HTTP/${version}\r\n` + fields.map(([n, a, v, b]) => `${n}:${a}${v}${b}\r\n`).join('') + '\r\n';
  return { head, method, target: tgt, fields: fields.map(([n, , v]) => [n, trimOws(v)] as [string, string]) };
});

const splitsOf = (len: number) =>
  len < 2 ? fc.constant([] as number[]) : fc.uniqueArray(fc.integer({ min: 1, max: len - 1 }), { maxLength: 10 }).map((a) => a.sort((x, y) => x - y));

t.test('valid heads round-trip their bytes in any read splits, and their prefixes are incomplete', async (t) => {
  fc.assert(
    fc.property(validHead.chain((v) => fc.tuple(fc.constant(v), splitsOf(v.head.length), fc.nat())), ([v, splits, cut]) => {
      const r = parse(v.head, splits);
      if (r.outcome !== 'done') return false;
      if (r.method !== v.method || r.target !== v.target || r.headLen !== v.head.length) return false;
      if (JSON.stringify(r.fields) !== JSON.stringify(v.fields)) return false;
      const prefix = parse(v.head.slice(0, cut % v.head.length));
      return prefix.outcome === 'more' && prefix.status === 0;
    }),
    { numRuns: RUNS },
  );
  t.pass(`${RUNS} generated heads`);
});

/** Any input: a valid head, mutated by one byte (often a framing byte). */
const mutant = fc
  .tuple(validHead, fc.constantFrom('replace', 'insert', 'delete', 'truncate'), fc.nat(), fc.constantFrom('\r', '\n', ' ', '\t', ':', '\x00', '\x0b', '\x7f', '\xff', 'a', '/', ','))
  .map(([v, how, at, ch]) => {
    const s = v.head;
    const k = at % s.length;
    if (how === 'replace') return s.slice(0, k) + ch + s.slice(k + 1);
    if (how === 'insert') return s.slice(0, k) + ch + s.slice(k);
    if (how === 'delete') return s.slice(0, k) + s.slice(k + 1);
    return s.slice(0, k);
  });

t.test('any input: the same answer whatever the splits; an invalid input\'s prefixes are incomplete or fail alike', async (t) => {
  let fails = 0;
  fc.assert(
    fc.property(mutant.chain((s) => fc.tuple(fc.constant(s), splitsOf(s.length), fc.nat())), ([s, splits, cut]) => {
      const whole = parse(s);
      const split = parse(s, splits);
      if (JSON.stringify(essence(split)) !== JSON.stringify(essence(whole))) return false;
      if (whole.outcome === 'fail') {
        fails++;
        if (![400, 417, 431, 501, 505].includes(whole.status)) return false;
        const p = parse(s.slice(0, s.length === 0 ? 0 : cut % s.length));
        return p.outcome === 'more' || (p.outcome === 'fail' && p.status === whole.status);
      }
      return whole.status === 0;
    }),
    { numRuns: RUNS * 2 },
  );
  t.ok(fails > RUNS / 10, `invalid inputs were generated (${fails})`);
});

/** A body, cut into chunks with extensions, trailers after the last chunk. */
const chunked = fc
  .tuple(
    fc.uint8Array({ maxLength: 300 }),
    fc.array(fc.nat(), { maxLength: 8 }),
    fc.array(fc.tuple(fc.constantFrom('', ';a', ';a=b', ' ;x="y"', '\t;e'), fc.constantFrom('lower', 'upper', 'zeros')), { minLength: 9, maxLength: 9 }),
    fc.array(fc.constantFrom('x-t: 1', 'Trailer-B:\xff', 'e:'), { maxLength: 3 }),
  )
  .map(([body, cuts, styles, trailers]) => {
    const b = Buffer.from(body);
    const ends = [...new Set(cuts.map((c) => (b.length === 0 ? 0 : c % b.length)).filter((c) => c > 0))].sort((x, y) => x - y);
    ends.push(b.length);
    let wire = '';
    let at = 0;
    for (const [i, e] of ends.entries()) {
      if (e === at) continue;
      const [ext, form] = styles[i]!;
      const size = (e - at).toString(16);
      wire += (form === 'upper' ? size.toUpperCase() : form === 'zeros' ? '00' + size : size) + ext + '\r\n' + b.subarray(at, e).toString('latin1') + '\r\n';
      at = e;
    }
    wire += '0\r\n' + trailers.map((x) => x + '\r\n').join('') + '\r\n';
    return { body: b, wire };
  });

t.test('chunked bodies decode to their bytes in any read splits, the next request left alone', async (t) => {
  const head = `POST /v1/chat/completions HTTP/1.1\r\n${H}Transfer-Encoding: chunked\r\n\r\n`;
  const next = 'GET /healthz HTTP/1.1\r\n';
  fc.assert(
    fc.property(chunked.chain((c) => fc.tuple(fc.constant(c), splitsOf((head + c.wire + next).length))), ([c, splits]) => {
      const r = parse(head + c.wire + next, splits);
      return r.outcome === 'done' && r.bodyOutcome === 'done' && r.body!.equals(c.body) && r.consumed === head.length + c.wire.length;
    }),
    { numRuns: RUNS },
  );
  t.pass(`${RUNS} generated bodies`);
});
