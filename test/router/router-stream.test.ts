// Streaming relay, client aborts and failover over loopback against simulated
// engines.
import t from 'tap';
import { startTestRouter, validatePlugin } from '../support/router-util.js';
import { startFleet, type SimFleet, type FleetOptions } from '../../src/sim/index.js';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { startRouter, type RunningRouter } from '../../src/server/router.js';

const validate = validatePlugin;

function setup(
  t: Tap.Test,
  n: number,
  fleetOpts: FleetOptions,
  extra: Record<string, unknown> = {},
  extraEndpoints: { name: string; url: string }[] = [],
): Promise<{ fleet: SimFleet; router: RunningRouter; url: string }> {
  return startTestRouter(t, { n, fleet: fleetOpts, extra: { proxy: { client: currentClient }, ...extra }, extraEndpoints });
}

let currentClient: 'native' | 'undici' = 'native';

const until = async (cond: () => boolean, ms: number) => {
  const end = Date.now() + ms;
  while (!cond() && Date.now() < end) await new Promise((r) => setTimeout(r, 10));
  return cond();
};

for (const client of ['native', 'undici'] as const) {
  t.test(`upstream client ${client}`, async (tt) => {
    currentClient = client;
tt.test('streaming through the router is byte-identical to a direct request to the same engine', async (t) => {
  const { fleet, url } = await setup(t, 2, { timeScale: 0.02 });
  for (const path of ['/v1/chat/completions', '/v1/completions']) {
    const body =
      path === '/v1/completions'
        ? { model: 'open-model', prompt: 'Tell me a story about routers.', max_tokens: 24, stream: true }
        : { model: 'open-model', messages: [{ role: 'user', content: 'Tell me a story about routers.' }], max_tokens: 24, stream: true, stream_options: { include_usage: false } };
    const headers = { 'content-type': 'application/json', 'x-request-id': `same-id-${path.length}` };
    const viaRouter = await fetch(url + path, { method: 'POST', headers, body: JSON.stringify(body) });
    t.equal(viaRouter.status, 200);
    t.match(viaRouter.headers.get('content-type'), /^text\/event-stream/);
    const ep = viaRouter.headers.get('x-switchyard-endpoint')!;
    const routed = await viaRouter.text();
    const engineUrl = fleet.urls[Number(ep.slice(1))];
    const direct = await (await fetch(engineUrl + path, { method: 'POST', headers, body: JSON.stringify(body) })).text();
    const norm = (s: string) => s.replace(/"created":\d+/g, '"created":0');
    t.ok(routed.endsWith('data: [DONE]\n\n'), `${path}: stream ends with [DONE]`);
    t.ok(routed.split('data: ').length > 20, `${path}: many SSE events`);
    t.equal(norm(routed), norm(direct), `${path}: identical bytes (created timestamps aside)`);
  }
});

  tt.test('client abort reaches the engine: its slot frees and the router releases accounting', async (t) => {
  const { fleet, router, url } = await setup(t, 1, { timeScale: 1, itlMs: 20, maxNumSeqs: 4 });
  const engine = fleet.engines[0];
  const ac = new AbortController();
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'open-model', prompt: 'a long answer please', max_tokens: 2000, stream: true }),
    signal: ac.signal,
  });
  t.equal(res.status, 200);
  const reader = res.body!.getReader();
  const first = await reader.read();
  t.ok(first.value && first.value.length > 0, 'received the first chunk');
  t.equal(engine.stats().running, 1, 'the engine is decoding the request');
  t.equal(router.core.scheduler.endpoints.all[0].inFlight, 1, 'router counts it in flight');
  const abortedBefore = engine.stats().aborted;
  ac.abort();
  await reader.cancel().catch(() => {});
  t.ok(await until(() => engine.stats().running === 0 && engine.stats().open === 0, 3000), 'the engine slot is freed');
  t.ok(engine.stats().aborted > abortedBefore, 'the engine saw the abort');
  t.ok(await until(() => router.core.scheduler.endpoints.all[0].inFlight === 0 && router.core.activeRequests === 0, 1000), 'router accounting released');
  const m = await (await fetch(`${url}/metrics`)).text();
  t.match(m, /switchyard_requests_total\{model="open-model",endpoint="e0",status="499"\} 1/);
});

  tt.test('failover before the first byte: a dead endpoint and a 500-ing endpoint are retried elsewhere', async (t) => {
  // health checks off so the dead endpoint stays routable; round-robin so each one is picked
  const { fleet, router, url } = await setup(
    t,
    2,
    { timeScale: 0 },
    { dataLayer: { healthIntervalMs: 0, breakerFailures: 1000 }, scheduling: { picker: 'round-robin', scorers: [] } },
    [{ name: 'dead', url: 'http://127.0.0.1:1' }],
  );
  fleet.engines[1].setFailures(1, ['500']);
  const seen = new Set<string>();
  for (let i = 0; i < 12; i++) {
    const r = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'open-model', prompt: `request ${i}`, max_tokens: 2, stream: i % 2 === 0 }),
    });
    await r.text();
    t.equal(r.status, 200, `request ${i}: 200`);
    seen.add(r.headers.get('x-switchyard-endpoint')!);
  }
  t.same([...seen], ['e0'], 'every answer came from the healthy engine');
  const m = await (await fetch(`${url}/metrics`)).text();
  const retries = Number(/^switchyard_upstream_retries_total (\d+)/m.exec(m)![1]);
  t.ok(retries >= 8, `retries counted (${retries})`);
  t.equal(router.core.scheduler.endpoints.all.reduce((a, e) => a + e.inFlight, 0), 0, 'no in-flight leak');
});

  tt.test('every endpoint failing: 502 after the retries; the circuit breaker then skips them', async (t) => {
  const { fleet, router, url } = await setup(t, 2, { timeScale: 0 }, { dataLayer: { breakerFailures: 2, breakerCooldownMs: 60_000 } });
  for (const e of fleet.engines) e.setFailures(1, ['500']);
  const r = await fetch(`${url}/v1/completions`, { method: 'POST', body: JSON.stringify({ model: 'open-model', prompt: 'x' }) });
  t.equal(r.status, 502);
  const j = await r.json();
  t.equal(j.error.code, null);
  t.equal(j.error.type, 'server_error');
  const r2 = await fetch(`${url}/v1/completions`, { method: 'POST', body: JSON.stringify({ model: 'open-model', prompt: 'x' }) });
  await r2.text();
  t.equal(r2.status, 502);
  const now = performance.now();
  t.ok(router.core.scheduler.endpoints.all.every((e) => e.breakerOpen(now)), 'both breakers open');
  const r3 = await fetch(`${url}/v1/completions`, { method: 'POST', body: JSON.stringify({ model: 'open-model', prompt: 'x' }) });
  await r3.text();
  t.equal(r3.status, 503, 'with every breaker open: 503 without touching the engines');
});

  tt.test('an upstream failure after the first byte ends the stream with an error event', async (t) => {
  const { fleet, url } = await setup(t, 1, { timeScale: 0.02 });
  fleet.engines[0].setFailures(1, ['reset-mid-stream']);
  const r = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    body: JSON.stringify({ model: 'open-model', prompt: 'stream then break', max_tokens: 200, stream: true }),
  });
  t.equal(r.status, 200, 'status already sent');
  const text = await r.text();
  t.ok(text.startsWith('data: {'), 'some data was relayed');
  t.match(text, /data: \{"error":\{"message":"upstream endpoint e0 failed mid-response/, 'an error event');
  t.ok(text.endsWith('data: [DONE]\n\n'), 'then [DONE]');
});

  tt.test('backpressure: a client that stops reading pauses the engine stream; nothing is lost', async (t) => {
  const { fleet, router, url } = await setup(t, 1, { timeScale: 0, maxModelLen: 200_000 });
  const body = JSON.stringify({ model: 'open-model', prompt: 'flood', max_tokens: 60_000, stream: true });
  const { connect } = await import('node:net');
  const u = new URL(url);
  const raw = await new Promise<Buffer>((resolve, reject) => {
    const s = connect(Number(u.port), u.hostname, () => {
      s.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nx-request-id: bp-1\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
      s.pause(); // stop reading: the kernel buffers fill, uWS reports backpressure
      // resume once the router reports a relay pause (or after 10 s: then the assertion below fails)
      const until = Date.now() + 10_000;
      const poll = async () => {
        const m = await (await fetch(`${url}/metrics`)).text();
        if (/^switchyard_relay_pauses_total [1-9]/m.test(m) || Date.now() > until) s.resume();
        else setTimeout(poll, 50);
      };
      setTimeout(poll, 50);
    });
    const parts: Buffer[] = [];
    s.on('data', (b) => parts.push(b));
    s.on('end', () => resolve(Buffer.concat(parts)));
    s.on('error', reject);
  });
  const m = await (await fetch(`${url}/metrics`)).text();
  const pauses = Number(/^switchyard_relay_pauses_total (\d+)/m.exec(m)![1]);
  t.ok(pauses > 0, `the relay paused ${pauses} time(s)`);
  // de-chunk the HTTP/1.1 body
  const text = raw.toString('latin1');
  const head = text.indexOf('\r\n\r\n');
  t.match(text.slice(0, head), /^HTTP\/1\.1 200/);
  let i = head + 4;
  let out = '';
  for (;;) {
    const eol = text.indexOf('\r\n', i);
    const n = parseInt(text.slice(i, eol), 16);
    if (!(n > 0)) break;
    out += text.slice(eol + 2, eol + 2 + n);
    i = eol + 2 + n + 2;
  }
  const direct = await (await fetch(fleet.urls[0] + '/v1/completions', { method: 'POST', headers: { 'x-request-id': 'bp-1' }, body })).arrayBuffer();
  const norm = (s: string) => s.replace(/"created":\d+/g, '"created":0');
  t.ok(out.length > 2_000_000, `a large stream (${out.length} bytes)`);
  t.ok(norm(out) === norm(Buffer.from(direct).toString('latin1')), 'byte-identical to the direct stream');
  t.equal(router.core.activeRequests, 0);
});

  });
}

t.test('graceful close: in-flight streams finish, then the router stops', async (t) => {
  const fleet = await startFleet(1, { timeScale: 1, itlMs: 10 });
  t.teardown(() => fleet.close());
  const cfg = validateConfig(
    { apiVersion: API_VERSION, kind: 'Router', pools: [{ name: 'p', models: ['open-model'], endpoints: [{ name: 'e0', url: fleet.urls[0] }] }], logging: { level: 'silent' } },
    validate,
  );
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  const res = await fetch(`${router.url}/v1/completions`, {
    method: 'POST',
    body: JSON.stringify({ model: 'open-model', prompt: 'hi', max_tokens: 30, stream: true }),
  });
  const textP = res.text();
  const closing = router.close(5000);
  const text = await textP;
  await closing;
  t.ok(text.endsWith('data: [DONE]\n\n'), 'the stream completed during shutdown');
  await t.rejects(fetch(`${router.url}/healthz`), 'no longer listening');
});
