// W3C trace context and baggage reach the engine on every upstream leg; a
// malformed traceparent is replaced, never forwarded. Real router, real
// simulated engines recording the headers they receive.
import t from 'tap';
import { appendTraceHeaders, freshTraceparent, validTraceparent } from '../../src/proxy/trace-context.js';
import { startTestRouter } from '../support/router-util.js';

const TP = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
const NAMES = ['traceparent', 'tracestate', 'baggage', 'x-request-id'];

t.test('validTraceparent follows the W3C rules', async (t) => {
  t.ok(validTraceparent(TP));
  t.ok(validTraceparent('00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00'), 'unsampled');
  t.ok(validTraceparent(`01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra`), 'a later version may append fields');
  const bad = [
    '',
    'garbage',
    TP.toUpperCase(),
    TP + '-x', // version 00 is exactly 55 characters
    '00-00000000000000000000000000000000-00f067aa0ba902b7-01', // zero trace id
    '00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01', // zero parent id
    'ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01', // version ff
    '00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01', // not hex
    '00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01',
    `${TP},${TP}`, // two traceparent lines
  ];
  for (const s of bad) t.notOk(validTraceparent(s), `invalid: ${JSON.stringify(s)}`);
  for (let i = 0; i < 50; i++) t.ok(validTraceparent(freshTraceparent()), 'fresh ones are valid');
});

t.test('appendTraceHeaders: pass, replace, drop', async (t) => {
  t.same(appendTraceHeaders([], {}), [], 'nothing for a request without trace headers');
  t.same(appendTraceHeaders([], { traceparent: TP, tracestate: 'a=1', baggage: 'k=v' }), ['traceparent', TP, 'tracestate', 'a=1', 'baggage', 'k=v']);
  const r = appendTraceHeaders([], { traceparent: 'nope', tracestate: 'a=1', baggage: 'k=v' });
  t.equal(r[0], 'traceparent');
  t.ok(validTraceparent(r[1]!) && r[1] !== 'nope', 'a malformed traceparent is replaced by a valid one');
  t.notOk(r.includes('tracestate'), 'tracestate goes with the broken traceparent');
  t.same(r.slice(2), ['baggage', 'k=v'], 'baggage stays');
  t.same(appendTraceHeaders([], { tracestate: 'a=1' }), [], 'tracestate without traceparent is dropped');
  t.same(appendTraceHeaders([], { baggage: 'k=\u00e9' }), [], 'non-ASCII baggage is dropped, not forwarded garbled');
  t.same(appendTraceHeaders([], { baggage: 'k=' + 'v'.repeat(9000) }), [], 'oversized baggage is dropped');
  t.same(appendTraceHeaders([], { traceparent: TP }, 'OWN'), ['traceparent', 'OWN'], "the router's own leg context wins");
});

for (const client of ['native', 'undici'] as const) {
  t.test(`${client}: traceparent, tracestate and baggage reach the engine; a malformed traceparent is replaced`, async (t) => {
    const { fleet, url } = await startTestRouter(t, { n: 1, extra: { proxy: { client } } });
    fleet.engines[0]!.recordHeaders(NAMES);
    const post = (headers: Record<string, string>) =>
      fetch(`${url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...headers },
        body: JSON.stringify({ model: 'open-model', prompt: 'hi', max_tokens: 2 }),
      }).then(async (r) => (await r.text(), r.status));
    t.equal(await post({ traceparent: TP, tracestate: 'vendor=abc,other=1', baggage: 'tenant=acme,region=eu' }), 200);
    t.equal(await post({ traceparent: '00-not-a-trace-01', tracestate: 'vendor=abc', baggage: 'tenant=acme' }), 200);
    t.equal(await post({}), 200);
    const rec = fleet.engines[0]!.recorded();
    t.equal(rec.length, 3);
    t.same(rec[0]!.headers, { ...rec[0]!.headers, traceparent: TP, tracestate: 'vendor=abc,other=1', baggage: 'tenant=acme,region=eu' }, 'passed through unchanged');
    const replaced = rec[1]!.headers.traceparent!;
    t.ok(validTraceparent(replaced), `the malformed traceparent arrives replaced by a valid one (${replaced})`);
    t.equal(rec[1]!.headers.tracestate, '', "the broken trace's tracestate is not forwarded");
    t.equal(rec[1]!.headers.baggage, 'tenant=acme', 'baggage still passes');
    t.same([rec[2]!.headers.traceparent, rec[2]!.headers.tracestate, rec[2]!.headers.baggage], ['', '', ''], 'none invented for a request without them');
  });
}

t.test('a retry is a second leg with the same trace context', async (t) => {
  const { fleet, url } = await startTestRouter(t, {
    n: 2,
    extra: { scheduling: { scorers: [], picker: 'round-robin' }, proxy: { maxRetries: 1 } },
  });
  fleet.engines[0]!.setFailures(1, ['500']);
  for (const e of fleet.engines) e.recordHeaders(NAMES);
  for (let i = 0; i < 2; i++) {
    const res = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', traceparent: TP, tracestate: 'v=1', baggage: 'k=v', 'x-request-id': `req-${i}` },
      body: JSON.stringify({ model: 'open-model', prompt: 'hi', max_tokens: 2 }),
    });
    await res.text();
    t.equal(res.status, 200, `request ${i} answered by the healthy engine`);
  }
  const failed = fleet.engines[0]!.recorded();
  const served = fleet.engines[1]!.recorded();
  t.ok(failed.length >= 1, 'a first leg went to the failing engine');
  for (const f of failed) {
    const second = served.find((s) => s.headers['x-request-id'] === f.headers['x-request-id']);
    t.ok(second, `the retry of ${f.headers['x-request-id']} reached the other engine`);
    t.same(
      [f.headers.traceparent, f.headers.tracestate, f.headers.baggage],
      [TP, 'v=1', 'k=v'],
      'first leg carries the trace context',
    );
    t.same([second!.headers.traceparent, second!.headers.tracestate, second!.headers.baggage], [TP, 'v=1', 'k=v'], 'second leg too');
  }
});
