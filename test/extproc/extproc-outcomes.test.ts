// ext_proc requests in the router's outcome metrics, as HTTP requests are
// (switchyard_request_outcomes_total{model,outcome,reason}, the end-to-end
// duration and router-side TTFT histograms): a real router, simulated engines,
// a grpc-js client playing Envoy's part. Each case drives one ending (served
// 200, the engine's 5xx reported on the response path, the proxy gone before
// the response, a body over the limit, an unknown model, a gate's 429) and
// reads /metrics.
import t from 'tap';
import { decide, EnvoyStream, extProcClient, headerMap, respond } from '../../testkit/envoy-client.js';
import { startTestRouter } from '../support/router-util.js';
import { scrape, type Exposition } from '../support/sim-util.js';

const EXT = { extProc: { host: '127.0.0.1', port: 0 } };
const chat = (content: string, model = 'open-model') => JSON.stringify({ model, max_tokens: 2, messages: [{ role: 'user', content }] });

async function setup(t: Tap.Test, extra: Record<string, unknown> = {}, n = 2) {
  const r = await startTestRouter(t, { n, fleet: { timeScale: 0 }, extra: { ...EXT, limits: { maxBodyBytes: 4096 }, ...extra } });
  const client = extProcClient(`127.0.0.1:${r.router.extProc!.port}`);
  t.teardown(() => client.close());
  return { ...r, client };
}

/** The sample's value, 0 when the series is not there. */
function value(e: Exposition, name: string, match: Record<string, string>): number {
  const hits = e.samples.filter((s) => s.name === name && Object.entries(match).every(([k, v]) => s.labels[k] === v));
  return hits.reduce((n, s) => n + s.value, 0);
}

/** Polls /metrics until `cond` holds (the end is counted when the stream's last message is handled). */
async function until(url: string, cond: (e: Exposition) => boolean, ms = 5000): Promise<Exposition> {
  const end = Date.now() + ms;
  for (;;) {
    const e = await scrape(url);
    if (cond(e) || Date.now() > end) return e;
    await new Promise((r) => setTimeout(r, 20));
  }
}

const outcomes = (e: Exposition, model: string, outcome: string) => value(e, 'switchyard_request_outcomes_total', { model, outcome });

t.test('served, the engine 5xx, the proxy gone: ok, upstream_error, cancelled; with durations and TTFT', async (t) => {
  const { url, client } = await setup(t);
  const before = await scrape(url);
  t.equal(value(before, 'switchyard_request_duration_seconds_count', { model: 'open-model' }), 0, 'nothing counted before');

  // served: the response path streams a body chunk (the first byte), then ends
  const ok = await decide(client, chat('served'));
  if (!ok.picked) throw new Error(`not picked: ${ok.status}`);
  const s = ok.stream;
  s.send({ response_headers: { headers: headerMap({ ':status': '200' }), end_of_stream: false } });
  t.equal((await s.next()).response, 'response_headers');
  s.send({ response_body: { body: Buffer.from('data: {}\n\n'), end_of_stream: false } });
  t.equal((await s.next()).response, 'response_body');
  await new Promise((r) => setTimeout(r, 30));
  s.send({ response_body: { body: Buffer.from('data: [DONE]\n\n'), end_of_stream: true } });
  t.equal((await s.next()).response, 'response_body');
  s.end();

  const failed = await decide(client, chat('the engine failed'));
  if (!failed.picked) throw new Error('not picked');
  await respond(failed.stream, 503, failed.endpoint);

  const gone = await decide(client, chat('abandoned'));
  if (!gone.picked) throw new Error('not picked');
  gone.stream.call.cancel();

  const e = await until(url, (x) => outcomes(x, 'open-model', 'cancelled') === 1 && outcomes(x, 'open-model', 'upstream_error') === 1);
  t.equal(outcomes(e, 'open-model', 'ok'), 1, 'served: ok');
  t.equal(outcomes(e, 'open-model', 'upstream_error'), 1, "the engine's 503 reported on the response path: upstream_error");
  t.equal(outcomes(e, 'open-model', 'cancelled'), 1, 'the proxy went away before the response: cancelled');
  t.equal(value(e, 'switchyard_request_duration_seconds_count', { model: 'open-model' }), 3, 'three durations observed');
  const dur = value(e, 'switchyard_request_duration_seconds_sum', { model: 'open-model' });
  t.ok(dur > 0.02 && dur < 10, `the durations are times (sum ${dur} s, the served one held ≥ 30 ms)`);
  t.equal(value(e, 'switchyard_request_ttft_seconds_count', { model: 'open-model' }), 1, 'TTFT only where a response body passed');
  t.equal(value(e, 'switchyard_requests_total', { model: 'open-model' }), 3, 'and switchyard_requests_total as before');
});

t.test("ImmediateResponses: a body over the limit, an unknown model, bad JSON are client errors, the gate's 429 is rejected with its reason", async (t) => {
  const { url, client } = await setup(
    t,
    { flowControl: { ttl: '200ms', sweepInterval: '50ms', retryAfterSeconds: 1, admission: { mode: 'off' }, saturation: { maxConcurrency: 1 } } },
    1,
  );
  const big = await decide(client, chat('x'.repeat(8192)));
  t.equal(big.picked ? 0 : big.status, 413);
  const unknown = await decide(client, chat('x', 'no-such-model'));
  t.equal(unknown.picked ? 0 : unknown.status, 404);
  const bad = await decide(client, '{"model": "open-model", "messages": [');
  t.equal(bad.picked ? 0 : bad.status, 400);
  // the first holds the only slot; the second waits past the ttl: 429
  const first = await decide(client, chat('first'));
  if (!first.picked) throw new Error('not picked');
  const late = await decide(client, chat('second'));
  t.equal(late.picked ? 0 : late.status, 429);
  await respond(first.stream, 200, first.endpoint);

  const e = await until(url, (x) => outcomes(x, 'open-model', 'ok') === 1);
  t.equal(outcomes(e, '', 'client_error'), 3, 'the 413 and bad JSON (no model read), the unknown model (the bounded label): client errors under ""');
  t.equal(outcomes(e, 'open-model', 'client_error'), 0);
  t.equal(value(e, 'switchyard_request_outcomes_total', { model: 'open-model', outcome: 'rejected' }), 1, "the gate's 429: rejected");
  const reasons = e.samples.filter((s) => s.name === 'switchyard_request_outcomes_total' && s.labels.outcome === 'rejected' && s.value > 0).map((s) => s.labels.reason);
  t.ok(reasons.every((r) => r !== undefined && r !== ''), `rejected with a reason (${reasons.join(', ')})`);
  t.equal(outcomes(e, 'open-model', 'ok'), 1);
});

t.test('a stream that is not an inference request is not counted', async (t) => {
  const { url, client } = await setup(t);
  const s = new EnvoyStream(client);
  s.send({ request_headers: { headers: headerMap({ ':method': 'GET', ':path': '/v1/models' }), end_of_stream: true }, protocol_config: { request_body_mode: 2 } });
  t.equal((await s.next()).response, 'request_headers');
  s.end();
  await new Promise((r) => setTimeout(r, 100));
  const e = await scrape(url);
  t.equal(value(e, 'switchyard_request_duration_seconds_count', {}), 0, 'no duration observed');
});
