// OpenTelemetry tracing end to end: a real router with tracing on, real
// simulated engines, and an OTLP receiver (HTTP/protobuf or gRPC) started by
// the test that decodes what the router exports.
import t from 'tap';
import { createServer } from 'node:net';
import { startHttpReceiver, startGrpcReceiver, type ReceivedSpan } from '../support/otlp-receiver.js';
import { startTestRouter } from '../support/router-util.js';
import { validTraceparent } from '../../src/proxy/trace-context.js';

const TRACE_ID = '4bf92f3577b34da6a3ce929d0e0e4736';
const CLIENT_SPAN = '00f067aa0ba902b7';
const TP = `00-${TRACE_ID}-${CLIENT_SPAN}-01`;
const SERVER = 2;
const CLIENT = 3;

async function post(url: string, headers: Record<string, string> = {}, id?: string): Promise<number> {
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(id ? { 'x-request-id': id } : {}), ...headers },
    body: JSON.stringify({ model: 'open-model', messages: [{ role: 'user', content: 'hi' }], max_tokens: 3, temperature: 0.5 }),
  });
  await res.text();
  return res.status;
}

const tracing = (endpoint: string, more: Record<string, unknown> = {}) => ({
  tracing: { enabled: true, endpoint, sampleRatio: 1, exportIntervalMs: 50, ...more },
});

for (const protocol of ['http/protobuf', 'grpc'] as const) {
  t.test(`${protocol}: a request with a retry exports its spans, and both legs carry the leg span as parent`, async (t) => {
    const rx = protocol === 'grpc' ? await startGrpcReceiver(t) : await startHttpReceiver(t);
    const { fleet, url, router } = await startTestRouter(t, {
      n: 2,
      extra: {
        scheduling: { scorers: [], picker: 'round-robin' },
        proxy: { maxRetries: 1 },
        ...tracing(rx.url, { protocol, headers: { 'x-collector-key': 'k1' }, serviceName: 'router-under-test' }),
      },
    });
    fleet.engines[0]!.setFailures(1, ['500']);
    for (const e of fleet.engines) e.recordHeaders(['traceparent', 'x-request-id']);
    // round robin: one of two requests goes first to the failing engine and is retried
    t.equal(await post(url, { traceparent: TP }, 'a'), 200);
    t.equal(await post(url, { traceparent: TP }, 'b'), 200);
    await router.core.director.tracer!.flush();
    const spans = await rx.waitFor(1);
    const first = fleet.engines[0]!.recorded()[0]!;
    const retried = first.headers['x-request-id']!;
    const second = fleet.engines[1]!.recorded().find((r) => r.headers['x-request-id'] === retried)!;
    t.ok(second, `request ${retried} was retried on the second engine`);

    const root = spans.find((s) => s.kind === SERVER && s.attributes['switchyard.request_id'] === retried);
    t.ok(root, 'a SERVER span for the retried request');
    if (!root) return;
    t.equal(root.traceId, TRACE_ID, "the client's trace continues");
    t.equal(root.parentSpanId, CLIENT_SPAN, "the client's span is its parent");
    t.equal(root.name, 'chat open-model', 'GenAI span name: operation and model');
    t.equal(root.service, 'router-under-test');
    t.match(root.attributes, {
      'gen_ai.operation.name': 'chat',
      'gen_ai.request.model': 'open-model',
      'gen_ai.request.max_tokens': 3,
      'gen_ai.request.temperature': 0.5,
      'http.response.status_code': 200,
    });
    const children = spans.filter((s) => s.parentSpanId === root.spanId);
    const legs = children.filter((s) => s.kind === CLIENT).sort((a, b) => Number(a.startNs - b.startNs));
    t.equal(legs.length, 2, 'two upstream legs');
    t.equal(legs[0]!.attributes['switchyard.endpoint'], 'e0');
    t.equal(legs[0]!.attributes['http.response.status_code'], 500, 'the first leg got 500');
    t.equal(legs[0]!.statusCode, 2, 'and is an error');
    t.equal(legs[1]!.attributes['switchyard.endpoint'], 'e1');
    t.equal(legs[1]!.attributes['gen_ai.provider.name'], 'vllm');
    t.equal(legs[1]!.attributes['server.address'], '127.0.0.1');
    t.ok((legs[1]!.attributes['switchyard.upstream.ttfb_seconds'] as number) >= 0, 'time to first byte recorded');
    t.ok(legs[1]!.events.includes('first_byte'));
    t.equal(first.headers.traceparent, `00-${TRACE_ID}-${legs[0]!.spanId}-01`, 'the engine of leg 1 got leg 1 as parent');
    t.equal(second.headers.traceparent, `00-${TRACE_ID}-${legs[1]!.spanId}-01`, 'the engine of leg 2 got leg 2 as parent');
    const sched = children.filter((s) => s.name === 'switchyard.schedule');
    t.equal(sched.length, 2, 'one scheduling span per pick');
    t.equal(sched[0]!.attributes['switchyard.scheduler.candidates'], 2);
    t.ok(children.some((s) => s.name === 'switchyard.admission' && s.attributes['switchyard.admission.admitted'] === true), 'admission span');
    for (const s of [root, ...children]) t.ok(s.endNs >= s.startNs && s.startNs > 0n, `${s.name}: timed`);
    if (protocol === 'grpc') t.equal((rx as { metadata: { get(k: string): unknown[] }[] }).metadata[0]!.get('x-collector-key')[0], 'k1', 'headers go as gRPC metadata');
  });
}

t.test('head sampling: ratio for new traces, the parent flag for continued ones; nothing unsampled is exported', async (t) => {
  const rx = await startHttpReceiver(t);
  const { fleet, url, router } = await startTestRouter(t, { n: 1, extra: tracing(rx.url, { sampleRatio: 0 }) });
  fleet.engines[0]!.recordHeaders(['traceparent']);
  for (let i = 0; i < 5; i++) t.equal(await post(url, {}, `new-${i}`), 200);
  t.equal(await post(url, { traceparent: TP.replace(/-01$/, '-00') }, 'unsampled-parent'), 200);
  t.equal(await post(url, { traceparent: TP }, 'sampled-parent'), 200);
  await router.core.director.tracer!.flush();
  const spans = await rx.waitFor(1);
  const ids = new Set(spans.filter((s) => s.kind === SERVER).map((s) => s.attributes['switchyard.request_id']));
  t.same([...ids], ['sampled-parent'], 'only the request whose parent was sampled is recorded');
  const rec = fleet.engines[0]!.recorded();
  t.equal(rec[0]!.headers.traceparent, '', 'an unsampled new request gets no traceparent invented');
  t.equal(rec[5]!.headers.traceparent, TP.replace(/-01$/, '-00'), "an unsampled parent's traceparent passes unchanged");
});

t.test('a malformed traceparent starts a new trace when sampled', async (t) => {
  const rx = await startHttpReceiver(t);
  const { fleet, url, router } = await startTestRouter(t, { n: 1, extra: tracing(rx.url) });
  fleet.engines[0]!.recordHeaders(['traceparent', 'tracestate']);
  t.equal(await post(url, { traceparent: 'zz-broken', tracestate: 'a=b' }, 'm'), 200);
  await router.core.director.tracer!.flush();
  const spans: ReceivedSpan[] = await rx.waitFor(1);
  const root = spans.find((s) => s.kind === SERVER)!;
  t.equal(root.parentSpanId, '', 'a root span: the broken parent is ignored');
  const sent = fleet.engines[0]!.recorded()[0]!.headers;
  t.ok(validTraceparent(sent.traceparent!), 'the engine gets a valid traceparent');
  t.equal(sent.traceparent!.slice(3, 35), root.traceId, 'of the new trace');
  t.equal(sent.tracestate, '', 'not the broken trace state');
});

/** 40 concurrent traced requests to a router whose collector is at `endpoint`; the router, to look at after. */
async function burst(t: Tap.Test, endpoint: string) {
  const { url, router } = await startTestRouter(t, {
    n: 1,
    extra: tracing(endpoint, { maxQueueSize: 8, maxExportBatchSize: 4, exportIntervalMs: 20, exportTimeoutMs: 200 }),
  });
  const statuses = await Promise.all(Array.from({ length: 40 }, (_, i) => post(url, {}, `d${i}`)));
  t.same([...new Set(statuses)], [200], 'every request answered');
  const metrics = async () => await (await fetch(`${url}/metrics`)).text();
  const counted = (text: string, name: string) => Number(new RegExp(`^${name} (\\d+)`, 'm').exec(text)?.[1] ?? -1);
  return { router, metrics, counted };
}

t.test('a collector that is down: requests are unaffected, every span is lost and counted', async (t) => {
  // a port that refuses connections: each export fails at once (its spans counted as failed), or the queue
  // fills while one is under way (dropped); which of the two depends on how the requests fall in loop turns
  const dead = createServer();
  await new Promise<void>((r) => dead.listen(0, '127.0.0.1', r));
  const port = (dead.address() as { port: number }).port;
  await new Promise<void>((r) => dead.close(() => r()));
  const { router, metrics, counted } = await burst(t, `http://127.0.0.1:${port}/v1/traces`);
  const stats = router.core.director.tracer!.stats;
  t.ok(stats.queued <= 8, `the queue stays within its bound (${stats.queued})`);
  await router.core.director.tracer!.flush();
  t.equal(stats.exported, 0, 'nothing exported');
  t.ok(stats.dropped + stats.failed >= 40, `at least one span per request lost and counted (dropped ${stats.dropped}, failed ${stats.failed})`);
  const m = await metrics();
  t.equal(counted(m, 'switchyard_tracing_spans_dropped_total') + counted(m, 'switchyard_tracing_spans_failed_total'), stats.dropped + stats.failed, 'the same counts on /metrics');
  t.match(m, /^switchyard_tracing_spans_queued \d+/m);
  // closing the router does not hang on the dead collector
  const t0 = Date.now();
  await router.close(100);
  t.ok(Date.now() - t0 < 15_000, 'close is bounded');
});

t.test('a collector that hangs: requests are unaffected, memory is bounded, drops are counted', async (t) => {
  // accepts and never answers: each export waits its exportTimeoutMs (200 ms) while 40 requests end their
  // spans, so the queue of 8 fills and the rest are dropped
  const held: import('node:net').Socket[] = [];
  const hung = createServer((s) => held.push(s));
  await new Promise<void>((r) => hung.listen(0, '127.0.0.1', r));
  t.teardown(() => {
    for (const s of held) s.destroy();
    hung.close();
  });
  const { router, metrics, counted } = await burst(t, `http://127.0.0.1:${(hung.address() as { port: number }).port}/v1/traces`);
  const stats = router.core.director.tracer!.stats;
  t.ok(stats.queued <= 8, `the queue stays within its bound (${stats.queued})`);
  t.ok(stats.dropped > 0, `spans dropped and counted (${stats.dropped})`);
  t.ok(counted(await metrics(), 'switchyard_tracing_spans_dropped_total') > 0, 'the drop counter is on /metrics');
  const t0 = Date.now();
  await router.close(100);
  t.ok(Date.now() - t0 < 15_000, 'close is bounded');
});
