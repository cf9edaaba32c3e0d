// The Envoy ext_proc endpoint picker against a real router and simulated
// engines, with a grpc-js client playing Envoy's part (bench/lib/envoy-client.ts):
// the decision in the header and the envoy.lb metadata, the data plane's own
// request to the picked engine, completion from the response path, flow
// control's 429 and the 503 of no endpoint as ImmediateResponses, health,
// and malformed input that never takes the router down.
import t from 'tap';
import * as grpc from '@grpc/grpc-js';
import { startTestRouter } from '../support/router-util.js';
import { decide, extProcClient, healthCheck, healthWatch, respond, EnvoyStream, headerMap, metadataDestination } from '../../testkit/envoy-client.js';
import { startRedis } from '../support/redis-util.js';
import { startEngine } from '../../src/sim/index.js';
import { hostPort } from '../../src/extproc/server.js';

const EXT = { extProc: { host: '127.0.0.1', port: 0 } };

function chat(content: string, model = 'open-model'): string {
  return JSON.stringify({ model, max_tokens: 2, messages: [{ role: 'user', content }] });
}

async function setup(t: Tap.Test, extra: Record<string, unknown> = {}, o: Parameters<typeof startTestRouter>[1] = {}) {
  const r = await startTestRouter(t, { n: 3, fleet: { timeScale: 0 }, ...o, extra: { ...EXT, ...extra } });
  const addr = `127.0.0.1:${r.router.extProc!.port}`;
  const client = extProcClient(addr);
  t.teardown(() => client.close());
  return { ...r, addr, client };
}

const inFlight = (router: Awaited<ReturnType<typeof startTestRouter>>['router']) => router.core.endpoints.all.reduce((n, ep) => n + ep.inFlight, 0);

t.test('a decision over ext_proc: header and envoy.lb metadata agree, Envoy dispatches, the response completes it', async (t) => {
  const { router, fleet, client } = await setup(t);
  const addrs = fleet.urls.map(hostPort);
  const d = await decide(client, chat('hello there'), { headers: { 'x-request-id': 'req-1' } });
  if (!d.picked) throw new Error(`not picked: ${d.status} ${d.body}`);
  t.ok(addrs.includes(d.endpoint), `the destination ${d.endpoint} is an engine of the pool`);
  t.equal(d.metadata, d.endpoint, 'envoy.lb x-gateway-destination-endpoint equals the header');
  t.equal(inFlight(router), 1, 'the pick counts as in flight until the response');
  // the data plane sends the request to the picked engine itself
  const res = await fetch(`http://${d.endpoint}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: chat('hello there') });
  t.equal(res.status, 200);
  await res.arrayBuffer();
  await respond(d.stream, 200, d.endpoint);
  for (let i = 0; i < 50 && inFlight(router) !== 0; i++) await new Promise((r) => setTimeout(r, 10));
  t.equal(inFlight(router), 0, 'released when the response path reported the status');
});

t.test('the same long prompt goes back to the endpoint that holds its prefix (the pick was recorded)', async (t) => {
  const { client } = await setup(t);
  let prompt = '';
  for (let i = 0; prompt.length < 3000; i++) prompt += `Shared system rule ${i}: be precise and brief. `;
  const where: string[] = [];
  for (let i = 0; i < 4; i++) {
    const d = await decide(client, chat(prompt + ` question ${i}`));
    if (!d.picked) throw new Error('not picked');
    where.push(d.endpoint);
    await respond(d.stream, 200, d.endpoint);
  }
  t.same(new Set(where).size, 1, `all on one endpoint: ${where.join(' ')}`);
});

t.test('FULL_DUPLEX_STREAMED: the headers answer carries the decision, the body comes back whole', async (t) => {
  const { client, fleet } = await setup(t);
  const body = chat('duplex mode');
  const s = new EnvoyStream(client);
  s.send({ request_headers: { headers: headerMap({ ':method': 'POST', ':path': '/v1/chat/completions' }) }, protocol_config: { request_body_mode: 4, response_body_mode: 4 } });
  s.send({ request_body: { body: Buffer.from(body.slice(0, 10)), end_of_stream: false } });
  s.send({ request_body: { body: Buffer.from(body.slice(10)), end_of_stream: true } });
  const h = await s.next();
  t.equal(h.response, 'request_headers');
  const b = await s.next();
  t.equal(b.response, 'request_body');
  const echoed = (b.request_body as { response: { body_mutation: { streamed_response: { body: Buffer; end_of_stream: boolean } } } }).response.body_mutation.streamed_response;
  t.equal(echoed.body.toString(), body, 'the request body goes on unchanged');
  t.equal(echoed.end_of_stream, true);
  // response body in duplex mode is passed back chunk by chunk; its end completes the decision
  s.send({ response_headers: { headers: headerMap({ ':status': '200' }) } });
  t.equal((await s.next()).response, 'response_headers');
  s.send({ response_body: { body: Buffer.from('data: x\n\n'), end_of_stream: true } });
  const rb = await s.next();
  t.equal(rb.response, 'response_body');
  s.end();
  t.ok(fleet.urls.length > 0);
});

t.test('flow control over ext_proc: a held request expires into ImmediateResponse 429 with its reason', async (t) => {
  const { router, client } = await setup(t, { flowControl: { ttl: '200ms', sweepInterval: '50ms', retryAfterSeconds: 2, admission: { mode: 'off' }, saturation: { maxConcurrency: 1 } } }, { n: 1 });
  const first = await decide(client, chat('first'));
  if (!first.picked) throw new Error('first not picked');
  const late = await decide(client, chat('second'));
  if (late.picked) throw new Error('second should have been held and expired');
  t.equal(late.status, 429);
  t.equal(late.headers['x-switchyard-dropped-reason'], 'rejected-ttl-expired');
  t.equal(late.headers['retry-after'], '2');
  t.match(JSON.parse(late.body), { error: { code: 'rate_limit_exceeded' } }, 'the OpenAI error body');
  await respond(first.stream, 200, first.endpoint);
  const third = await decide(client, chat('third'));
  t.ok(third.picked, 'the released slot admits the next request');
  if (third.picked) await respond(third.stream, 200, third.endpoint);
  t.ok(router.url);
});

t.test('no ready endpoint → 503, unknown model → 404, bad JSON → 400 (ImmediateResponse each)', async (t) => {
  const { client } = await setup(t, {}, { n: 1, pools: () => [{ name: 'p', models: ['open-model'], endpoints: [{ name: 'dead', url: 'http://127.0.0.1:9' }] }] });
  const none = await decide(client, chat('x'));
  t.equal(none.picked ? 0 : none.status, 503);
  const unknown = await decide(client, chat('x', 'no-such-model'));
  t.equal(unknown.picked ? 0 : unknown.status, 404);
  const bad = await decide(client, '{"model": "open-model", "messages": [');
  t.equal(bad.picked ? 0 : bad.status, 400);
});

t.test('a fallback served the request: the pick is released as failed and nothing leaks', async (t) => {
  const { router, client, fleet } = await setup(t);
  const d = await decide(client, chat('fallback'));
  if (!d.picked) throw new Error('not picked');
  const other = fleet.urls.map(hostPort).find((a) => a !== d.endpoint)!;
  await respond(d.stream, 200, other);
  for (let i = 0; i < 50 && inFlight(router) !== 0; i++) await new Promise((r) => setTimeout(r, 10));
  t.equal(inFlight(router), 0);
});

t.test('Envoy goes away between decision and response: the decision is released', async (t) => {
  const { router, client } = await setup(t);
  const d = await decide(client, chat('abandoned'));
  if (!d.picked) throw new Error('not picked');
  t.equal(inFlight(router), 1);
  d.stream.call.cancel();
  for (let i = 0; i < 100 && inFlight(router) !== 0; i++) await new Promise((r) => setTimeout(r, 10));
  t.equal(inFlight(router), 0);
});

t.test('a body ended by request trailers: the trailers answer carries the envoy.lb metadata', async (t) => {
  const { client, fleet } = await setup(t);
  const s = new EnvoyStream(client);
  s.send({ request_headers: { headers: headerMap({ ':method': 'POST', ':path': '/v1/chat/completions' }) }, protocol_config: { request_body_mode: 2 } });
  t.equal((await s.next()).response, 'request_headers');
  s.send({ request_body: { body: Buffer.from(chat('with trailers')), end_of_stream: false } });
  t.equal((await s.next()).response, 'request_body', 'the body is answered CONTINUE (trailers follow)');
  s.send({ request_trailers: { trailers: headerMap({ 'x-checksum': 'abc' }) } });
  const a = await s.next();
  t.equal(a.response, 'request_trailers');
  t.ok(fleet.urls.map(hostPort).includes(metadataDestination(a)!), 'the decision is in the metadata');
  await respond(s, 200, metadataDestination(a)!);
});

t.test('non-inference requests pass through untouched', async (t) => {
  const { client } = await setup(t);
  const s = new EnvoyStream(client);
  s.send({ request_headers: { headers: headerMap({ ':method': 'GET', ':path': '/v1/models' }), end_of_stream: true } });
  const a = await s.next();
  t.equal(a.response, 'request_headers');
  t.same((a.request_headers as { response: unknown }).response, {}, 'CONTINUE with no mutation');
  s.end();
});

t.test('health: liveness and readiness SERVING, an unknown service NOT_FOUND', async (t) => {
  const { addr } = await setup(t);
  t.equal(await healthCheck(addr, 'liveness'), 1);
  t.equal(await healthCheck(addr, 'readiness'), 1);
  t.equal(await healthCheck(addr, 'envoy.service.ext_proc.v3.ExternalProcessor'), 1);
  const err = await healthCheck(addr, 'nope').catch((e: grpc.ServiceError) => e);
  t.equal((err as grpc.ServiceError).code, grpc.status.NOT_FOUND);
  t.match((err as grpc.ServiceError).details, /^unknown health service "nope" /);
  // a 1 MB name (the adversarial kit's t17b): answered NOT_FOUND with its name cut, not left unanswered
  // (the whole name in the grpc-message trailer made trailers the client refused)
  const timeout = new Promise<string>((r) => setTimeout(() => r('no answer in 5 s'), 5000).unref());
  const answer = await Promise.race([healthCheck(addr, 'a'.repeat(1 << 20)).catch((e: grpc.ServiceError) => e), timeout]);
  t.not(answer, 'no answer in 5 s', 'a 1 MB service name is answered');
  const big = typeof answer === 'object' ? (answer as grpc.ServiceError) : null;
  t.equal(big?.code, grpc.status.NOT_FOUND, 'a 1 MB service name: NOT_FOUND');
  t.ok((big?.details.length ?? Infinity) < 400, 'its details are bounded');
  t.match(big?.details, /\(1048576 characters\)/);
  const ctl = await healthCheck(addr, 'x\r\ny\u0000').catch((e: grpc.ServiceError) => e);
  t.match((ctl as grpc.ServiceError).details, /^unknown health service "x\\r\\ny\\u0000" /, 'control characters escaped');
  t.equal(await healthCheck(addr, 'liveness'), 1, 'the health service answers after them');
});

t.test('malformed ext_proc input never takes the router down', async (t) => {
  const { router, client, addr } = await setup(t);
  // 1. a message with no request set
  const empty = new EnvoyStream(client);
  empty.send({});
  await t.rejects(empty.next(), 'the stream is ended with an error');
  t.equal((empty.error as grpc.ServiceError).code, grpc.status.INVALID_ARGUMENT);
  // 2. headers twice
  const twice = new EnvoyStream(client);
  const h = { request_headers: { headers: headerMap({ ':method': 'POST', ':path': '/v1/completions' }) } };
  twice.send(h);
  await twice.next();
  twice.send(h);
  await t.rejects(twice.next());
  // 3. bytes that are not a ProcessingRequest at all
  const raw = new grpc.Client(addr, grpc.credentials.createInsecure());
  const call = raw.makeBidiStreamRequest(
    '/envoy.service.ext_proc.v3.ExternalProcessor/Process',
    (b: Buffer) => b,
    (b: Buffer) => b,
  );
  const failed = new Promise<grpc.ServiceError>((resolve) => call.on('error', resolve));
  call.on('data', () => {});
  call.write(Buffer.from([0xff, 0xff, 0xff, 0xff, 0x0f, 0x01, 0x02]));
  const e = await failed;
  t.not(e.code, grpc.status.OK, `garbage is refused (${grpc.status[e.code]})`);
  raw.close();
  // 4. a response before any request, a body with no headers
  const odd = new EnvoyStream(client);
  odd.send({ response_headers: { headers: headerMap({ ':status': '200' }) } });
  t.equal((await odd.next()).response, 'response_headers');
  odd.send({ request_body: { body: Buffer.from('zzz'), end_of_stream: true } });
  t.equal((await odd.next()).response, 'request_body');
  odd.end();
  // still serving, nothing in flight
  const d = await decide(client, chat('after the garbage'));
  t.ok(d.picked, 'decisions still work');
  if (d.picked) await respond(d.stream, 200, d.endpoint);
  t.equal(await healthCheck(addr, 'liveness'), 1);
  for (let i = 0; i < 50 && inFlight(router) !== 0; i++) await new Promise((r) => setTimeout(r, 10));
  t.equal(inFlight(router), 0);
});

t.test('fallbacks: the pick then other candidates, best first, in the header and the metadata alike; only the pick is in flight', async (t) => {
  const { router, fleet, client } = await setup(t, { extProc: { host: '127.0.0.1', port: 0, fallbacks: 2 } });
  const addrs = fleet.urls.map(hostPort);
  const d = await decide(client, chat('fallback please'));
  if (!d.picked) throw new Error('not picked');
  const list = d.endpoint.split(',');
  t.equal(list.length, 3, `the pick and two fallbacks: ${d.endpoint}`);
  t.equal(new Set(list).size, 3, 'all different');
  t.ok(list.every((a) => addrs.includes(a)), 'all engines of the pool');
  t.equal(d.metadata, d.endpoint, 'envoy.lb carries the same list as the header');
  const primary = router.core.endpoints.all.find((e) => hostPort(e.url) === list[0])!;
  t.equal(primary.inFlight, 1, 'the pick (first) is in flight');
  t.equal(inFlight(router), 1, 'the fallbacks are not');
  // Envoy retried on the second: the pick is released as failed
  await respond(d.stream, 200, list[1]);
  for (let i = 0; i < 50 && inFlight(router) !== 0; i++) await new Promise((r) => setTimeout(r, 10));
  t.equal(inFlight(router), 0);
  // one candidate only (the others draining): no fallback to send
  await router.core.live.drain('e1', { graceMs: 0 });
  await router.core.live.drain('e2', { graceMs: 0 });
  const one = await decide(client, chat('alone'));
  if (!one.picked) throw new Error('not picked');
  t.equal(one.endpoint, addrs[0], 'a single candidate: the pick alone');
  await respond(one.stream, 200, one.endpoint);
});

t.test('an endpoint added at runtime (admin API, Kubernetes discovery) can be picked over ext_proc', async (t) => {
  const { router, client } = await setup(t);
  const extra = await startEngine({ timeScale: 0 });
  t.teardown(() => extra.close());
  router.core.live.add({ pool: 'p', name: 'late', url: extra.url, role: 'both' }, 'admin');
  for (const n of ['e0', 'e1', 'e2']) void router.core.live.remove(n, { graceMs: 0, force: true });
  const late = router.core.endpoints.byName('late')!;
  for (let i = 0; i < 100 && late.health !== 'up'; i++) await new Promise((r) => setTimeout(r, 20));
  const d = await decide(client, chat('to the new one'));
  if (!d.picked) throw new Error(`not picked: ${d.status} ${d.body}`);
  t.equal(d.endpoint, hostPort(extra.url), 'the added endpoint is the destination');
  await respond(d.stream, 200, d.endpoint);
  for (let i = 0; i < 50 && late.inFlight !== 0; i++) await new Promise((r) => setTimeout(r, 10));
  t.equal(late.inFlight, 0, 'its served report completed the decision');
});

t.test('Health/Watch streams readiness as the lease moves between a standby pair', async (t) => {
  const redis = await startRedis(t);
  const ha = { mode: 'standby' as const, redis: redis.url, key: 'swy-watch', leaseTtlMs: 3000, renewIntervalMs: 300 }; // long enough not to flap on a loaded machine
  const a = await setup(t, { ha });
  const b = await setup(t, { ha });
  t.equal(a.router.ha!.state, 'active');
  t.equal(b.router.ha!.state, 'standby');
  const seenA: number[] = [];
  const seenB: number[] = [];
  const wa = healthWatch(a.addr, 'readiness', (s) => seenA.push(s));
  const wb = healthWatch(b.addr, 'readiness', (s) => seenB.push(s));
  const unknown: number[] = [];
  const wu = healthWatch(b.addr, 'nope', (s) => unknown.push(s));
  const live: number[] = [];
  const wl = healthWatch(b.addr, 'liveness', (s) => live.push(s));
  const wait = async (c: () => boolean) => {
    for (let i = 0; i < 300 && !c(); i++) await new Promise((r) => setTimeout(r, 20));
    return c();
  };
  t.ok(await wait(() => seenA.length >= 1 && seenB.length >= 1 && unknown.length >= 1 && live.length >= 1), 'each watch got its first status at once');
  t.same(seenA, [1], 'the active: SERVING');
  t.same(seenB, [2], 'the standby: NOT_SERVING');
  t.same(unknown, [3], 'an unknown service: SERVICE_UNKNOWN, not an error');
  // the lease moves: a's lease is given up (its listener stays open), b takes over
  await a.router.ha!.close();
  t.ok(await wait(() => seenB.at(-1) === 1), `the new active's watch turned SERVING: ${seenB.join(',')}`);
  t.ok(await wait(() => seenA.at(-1) === 2), `the old active's watch turned NOT_SERVING: ${seenA.join(',')}`);
  t.same(live, [1], 'liveness never changed');
  wa.cancel();
  wb.cancel();
  wu.cancel();
  wl.cancel();
  await Promise.all([wa.ended, wb.ended, wu.ended, wl.ended]);
});
