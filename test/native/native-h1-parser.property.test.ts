// Property tests of the HTTP/1.1 response parser (native/h1_parser.h, through
// the addon's test-only h1ParseForTest; the TypeScript client's parser that was
// tested here alongside it is gone) against the plain reference model in
// testkit/reference/h1-response-model.ts: generated responses (1xx heads,
// content-length, chunked framing with extensions and trailers, until-close
// bodies, Connection and Transfer-Encoding lists, bounds at their limits,
// byte-level mutations, extra bytes after the response) fed in random read
// splits must give the model's head, body bytes, outcome, error, keep-alive
// and consumed byte count. Also run by scripts/asan.js against the sanitizer
// build (H1_PROPERTY_RUNS scales it).
import fc from 'fast-check';
import t from 'tap';
import { h1ParseForTest, type H1ParseProbe } from '../../bindings/upstream-client.js';
import { MAX_CHUNK_EXT, MAX_HEAD, MAX_TRAILERS, readResponse, type ModelResult } from '../../testkit/reference/h1-response-model.js';

const RUNS = Number(process.env.H1_PROPERTY_RUNS ?? 1000);

// ---- generators ---------------------------------------------------------------------------------

/** Bytes that matter to framing, plus a little of everything. */
const byteChars = fc.constantFrom('a', 'b', '0', '1', 'f', 'F', '\r', '\n', ';', ' ', '\t', ':', ',', 'x', 'Z', '\x00', '\xff');
const text = (max: number) => fc.array(byteChars, { maxLength: max }).map((a) => a.join(''));
const caseOf = (s: string) => fc.constantFrom(s, s.toUpperCase(), s[0]!.toUpperCase() + s.slice(1));

const statusLine = fc.oneof(
  { weight: 10, arbitrary: fc.constantFrom('HTTP/1.1 200 OK', 'HTTP/1.1 200', 'HTTP/1.1 201 Created', 'HTTP/1.1 500 Oops', 'HTTP/1.0 200 OK', 'HTTP/1.1 404 ') },
  { weight: 2, arbitrary: fc.constantFrom('HTTP/1.1 204 No Content', 'HTTP/1.1 304 Not Modified') },
  { weight: 2, arbitrary: fc.constantFrom('HTTP/1.1 101 Switching', 'HTTP/1.1 099 Low', 'HTTP/1.1 600 High', 'HTTP/1.1 20 OK', 'http/1.1 200 OK', 'HTTP/2.0 200 OK', 'HTTP/1.x 200 OK', 'HTTP/1.1  200 OK', 'HTTP/1.1 200OK', 'HTP/1.1 200 OK') },
);
const interim = fc.constantFrom('HTTP/1.1 100 Continue\r\n\r\n', 'HTTP/1.1 102 Processing\r\n\r\n', 'HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n');

const field = fc.oneof(
  { weight: 3, arbitrary: fc.tuple(caseOf('content-type'), fc.constantFrom('application/json', 'text/event-stream', ' text/plain \t', '')).map(([n, v]) => `${n}: ${v}`) },
  { weight: 4, arbitrary: fc.tuple(caseOf('content-length'), fc.oneof(fc.integer({ min: 0, max: 40 }).map(String), fc.constantFrom('', ' 5 ', '5, 5', '-1', '+3', '0x10', '9007199254740991', '9007199254740992', '99999999999999999999'))).map(([n, v]) => `${n}:${v}`) },
  { weight: 4, arbitrary: fc.tuple(caseOf('transfer-encoding'), fc.constantFrom('chunked', 'Chunked', 'gzip, chunked', 'chunked, gzip', 'gzip', 'xchunked', ' chunked ', '', ',chunked,')).map(([n, v]) => `${n}: ${v}`) },
  { weight: 4, arbitrary: fc.tuple(caseOf('connection'), fc.constantFrom('close', 'Close', 'keep-alive', 'Keep-Alive', 'keep-alive, close', 'upgrade,close', 'closed', 'x-close', 'keep-alive-ish', '', ' close ')).map(([n, v]) => `${n}: ${v}`) },
  { weight: 2, arbitrary: fc.constantFrom('x-request-id: 1', 'server: sim', 'no colon here', ' content-length: 7', 'content-length : 7', 'x: a:b') },
);

/** A chunked body: chunks with optional extensions and odd line ends, a last chunk, trailers. */
const chunkedBody = fc
  .tuple(
    fc.array(
      fc.tuple(
        text(30).filter((s) => s.length > 0),
        fc.constantFrom('', ';ext=1', ' ', '\t;a', ';' + 'e'.repeat(MAX_CHUNK_EXT - 2), ';' + 'e'.repeat(MAX_CHUNK_EXT + 1)),
        fc.constantFrom('\r\n', '\r\n', '\n', '\r', 'x'),
        fc.constantFrom('\r\n', '\r\n', '\r\n', '\n', '', 'x', '\r'),
        fc.constantFrom('lower', 'upper', 'zeros', 'bad'),
      ),
      { maxLength: 5 },
    ),
    fc.constantFrom('0\r\n', '0\n', '000\r\n', '0;last\r\n'),
    fc.array(fc.constantFrom('x-t: 1\r\n', 'trailer-without-cr: 2\n', '\r\r\n'), { maxLength: 3 }),
    fc.constantFrom('\r\n', '\n', '', 'x'),
  )
  .map(([chunks, last, trailers, blank]) => {
    let s = '';
    for (const [data, ext, sizeEnd, dataEnd, form] of chunks) {
      const hex = data.length.toString(16);
      const size = form === 'upper' ? hex.toUpperCase() : form === 'zeros' ? '000' + hex : form === 'bad' ? 'g' + hex : hex;
      s += size + ext + sizeEnd + data + dataEnd;
    }
    return s + last + trailers.join('') + blank;
  });

/** Responses at the head, trailer and chunk-size bounds. */
const atBounds = fc.oneof(
  fc.integer({ min: -2, max: 2 }).map((d) => {
    const pre = 'HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-pad: ';
    return pre + 'p'.repeat(MAX_HEAD - pre.length - 4 + d) + '\r\n\r\nok';
  }),
  fc.integer({ min: -2, max: 2 }).map((d) => {
    const pre = 'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n';
    const line = 'x-t: ';
    return pre + line + 't'.repeat(MAX_TRAILERS - line.length - 4 + d) + '\r\n\r\n';
  }),
  fc.integer({ min: 10, max: 14 }).map((digits) => 'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n' + '0'.repeat(digits - 1) + '1\r\nz\r\n0\r\n\r\n'),
  fc.integer({ min: -2, max: 2 }).map((d) => 'HTTP/1.1 200 OK\r\n' + 'x'.repeat(MAX_HEAD + d)),
);

/** Mostly coherent responses (framing fields that match the body), some with random fields over any body. */
const response = fc
  .tuple(
    fc.array(interim, { maxLength: 3 }),
    statusLine,
    fc.oneof(
      chunkedBody.chain((b) => fc.tuple(fc.constantFrom('transfer-encoding: chunked', 'Transfer-Encoding: gzip, chunked', 'transfer-encoding: chunked\r\ncontent-length: 3'), fc.constant(b))),
      text(60).chain((b) => fc.tuple(fc.constantFrom(`content-length: ${b.length}`, `Content-Length: ${b.length}\r\ncontent-length: ${b.length}`, `content-length: ${b.length + 1}`, `content-length: ${Math.max(0, b.length - 2)}`), fc.constant(b))),
      text(60).map((b) => ['', b] as [string, string]),
      fc.tuple(fc.array(field, { minLength: 1, maxLength: 4 }).map((f) => f.join('\r\n')), fc.oneof(text(60), chunkedBody)),
    ),
    fc.array(field, { maxLength: 2 }),
    fc.constantFrom('', '', 'HTTP/1.1 200 OK\r\n\r\n', 'junk'),
  )
  .map(([pre, status, [framing, body], fields, extra]) => {
    const lines = [...(framing === '' ? [] : [framing]), ...fields];
    return pre.join('') + status + '\r\n' + lines.map((f) => f + '\r\n').join('') + '\r\n' + body + extra;
  });

/** A byte-level mutation: none (most often), replace, insert or delete one byte, or truncate. */
const mutated = fc
  .tuple(
    fc.oneof({ weight: 4, arbitrary: response }, { weight: 1, arbitrary: atBounds }),
    fc.constantFrom('none', 'none', 'none', 'replace', 'insert', 'delete', 'truncate'),
    fc.nat(),
    byteChars,
  )
  .map(([s, how, at, ch]) => {
    if (how === 'none' || s.length === 0) return s;
    const k = at % s.length;
    if (how === 'replace') return s.slice(0, k) + ch + s.slice(k + 1);
    if (how === 'insert') return s.slice(0, k) + ch + s.slice(k);
    if (how === 'delete') return s.slice(0, k) + s.slice(k + 1);
    return s.slice(0, k);
  });

/** Read splits: end offsets, strictly inside the input, increasing. */
const withSplits = mutated.chain((s) =>
  fc.tuple(
    fc.constant(s),
    s.length < 2
      ? fc.constant([] as number[])
      : fc.oneof(
          fc.uniqueArray(fc.integer({ min: 1, max: s.length - 1 }), { maxLength: 12 }).map((a) => a.sort((x, y) => x - y)),
          fc.constant(s.length <= 400 ? Array.from({ length: s.length - 1 }, (_, i) => i + 1) : []), // one byte at a time
        ),
    fc.boolean(),
  ),
);

// ---- the parser, fed -----------------------------------------------------------------

function runNative(input: string, splits: number[], eof: boolean): H1ParseProbe {
  return h1ParseForTest(Buffer.from(input, 'latin1'), Uint32Array.from(splits), eof);
}

/** The comparable view of a result: head fields only with a head, keep-alive and consumed only when complete. */
function view(r: ModelResult | H1ParseProbe): Record<string, unknown> {
  const complete = r.outcome === 'done' || r.outcome === 'eof';
  return {
    outcome: r.outcome,
    error: r.error,
    heads: r.heads,
    ...(r.heads > 0 ? { status: r.status, type: r.type, length: r.length } : {}),
    ...(complete ? { keepAlive: r.keepAlive, consumed: r.consumed } : {}),
    body: typeof r.body === 'string' ? r.body : r.body.toString('latin1'),
  };
}

for (const [name, run] of [['native', runNative]] as const) {
  t.test(`${name} parser = reference model over generated responses and read splits`, (t) => {
    const outcomes: Record<string, number> = {};
    fc.assert(
      fc.property(withSplits, ([input, splits, eof]) => {
        const want = view(readResponse(input, eof));
        const got = view(run(input, splits, eof));
        outcomes[String(want.outcome) + (want.error ? `:${want.error}` : '')] = (outcomes[String(want.outcome) + (want.error ? `:${want.error}` : '')] ?? 0) + 1;
        if (JSON.stringify(got) !== JSON.stringify(want)) {
          throw new Error(`${name} parser differs from the model\n input ${JSON.stringify(input.length > 300 ? input.slice(0, 300) + '…' : input)} splits ${JSON.stringify(splits.slice(0, 20))} eof ${eof}\n want ${JSON.stringify(want).slice(0, 400)}\n got  ${JSON.stringify(got).slice(0, 400)}`);
        }
      }),
      { numRuns: RUNS },
    );
    t.comment(JSON.stringify(outcomes));
    // the generators must reach every kind of outcome, or the comparison proves little
    for (const k of ['done', 'eof', 'more', 'fail:6', 'fail:7', 'fail:8', 'fail:9']) t.ok((outcomes[k] ?? 0) > 0, `generated cases include ${k} (${outcomes[k] ?? 0})`);
    t.end();
  });
}

t.test('fixed cases: the drifts between the old TS and native parsers, both now as the model', (t) => {
  const cases: [string, string, boolean][] = [
    ['chunk data not followed by CRLF', 'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabcXY4\r\nabcd\r\n0\r\n\r\n', false],
    ['Connection: keep-alive, close', 'HTTP/1.1 200 OK\r\nconnection: keep-alive, close\r\ncontent-length: 1\r\n\r\nx', false],
    ['Connection: Close', 'HTTP/1.1 200 OK\r\nConnection: Close\r\ncontent-length: 1\r\n\r\nx', false],
    ['Connection: closed (not a close token)', 'HTTP/1.1 200 OK\r\nconnection: closed\r\ncontent-length: 1\r\n\r\nx', false],
    ['close then keep-alive in a second field', 'HTTP/1.1 200 OK\r\nconnection: close\r\nconnection: keep-alive\r\ncontent-length: 1\r\n\r\nx', false],
    ['HTTP/1.0 with an unrelated Connection token', 'HTTP/1.0 200 OK\r\nconnection: upgrade\r\ncontent-length: 1\r\n\r\nx', false],
    ['a chunk size with garbage after the digits', 'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3zz\r\nabc\r\n0\r\n\r\n', false],
    ['a chunk size with a 0x prefix', 'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0x3\r\nabc\r\n0\r\n\r\n', false],
    ['Transfer-Encoding: xchunked', 'HTTP/1.1 200 OK\r\ntransfer-encoding: xchunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n', true],
    ['chunked, gzip (chunked not last)', 'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, gzip\r\n\r\n3\r\nabc', true],
    ['trailers past 64 KiB', 'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n' + 'x-t: ' + 't'.repeat(MAX_TRAILERS) + '\r\n\r\n', false],
    ['a bad status line prefix', 'HXXX/1.1 200 OK\r\ncontent-length: 0\r\n\r\n', false],
  ];
  // the bounds, exactly at and one past them
  const trailers = (bytes: number) => 'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\nz\r\n0\r\nx-t: ' + 't'.repeat(bytes - 9) + '\r\n\r\n';
  const head = (bytes: number) => 'HTTP/1.1 200 OK\r\ncontent-length: 1\r\nx-pad: ' + 'p'.repeat(bytes - 47) + '\r\n\r\nz';
  const ext = (bytes: number) => 'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1;' + 'e'.repeat(bytes - 1) + '\r\nz\r\n0\r\n\r\n';
  for (const [what, make, limit] of [['trailer section', trailers, MAX_TRAILERS], ['head', head, MAX_HEAD], ['chunk extension', ext, MAX_CHUNK_EXT]] as const) {
    cases.push([`a ${what} of exactly the limit`, make(limit), false], [`a ${what} one byte over the limit`, make(limit + 1), false]);
  }
  for (const [what, input, eof] of cases) {
    const want = view(readResponse(input, eof));
    if (/exactly/.test(what)) t.equal(want.outcome, 'done', `model: ${what} is accepted`);
    if (/over the limit/.test(what)) t.equal(want.outcome, 'fail', `model: ${what} is refused`);
    t.same(view(runNative(input, [], eof)), want, `native: ${what}`);
  }
  t.end();
});

t.test('h1ParseForTest validates its arguments', (t) => {
  t.throws(() => (h1ParseForTest as (...a: unknown[]) => unknown)('x', new Uint32Array(0), false), TypeError);
  t.throws(() => (h1ParseForTest as (...a: unknown[]) => unknown)(Buffer.from('x'), [1], false), TypeError);
  t.throws(() => h1ParseForTest(Buffer.from('abc'), Uint32Array.from([2, 1]), false), RangeError);
  t.throws(() => h1ParseForTest(Buffer.from('abc'), Uint32Array.from([3]), false), RangeError);
  t.end();
});
