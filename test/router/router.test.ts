// The router's HTTP surface over loopback against simulated engines: every bad
// input gets OpenAI error JSON with the right status, headers, and the
// non-inference endpoints.
import t from 'tap';
import { spawnServe, startTestRouter, validatePlugin } from '../support/router-util.js';
import { connect } from 'node:net';
import { startFleet } from '../../src/sim/index.js';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { startRouter } from '../../src/server/router.js';
import type { AbortLike, Admission, RequestInfo } from '../../src/admission.js';

const validate = validatePlugin;

function setup(t: Tap.Test, extra: Record<string, unknown> = {}, pools?: (urls: string[]) => unknown) {
  return startTestRouter(t, { n: 2, fleet: { timeScale: 0 }, extra, pools });
}

async function post(url: string, body: string, headers: Record<string, string> = {}) {
  const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });
  const text = await res.text();
  return { status: res.status, headers: res.headers, text, json: safeJson(text) };
}
function safeJson(s: string): any {
  try {
    return JSON.parse(s);
  } catch {
    return undefined;
  }
}

function isOpenAIError(t: Tap.Test, r: { status: number; json: any }, status: number, param?: string) {
  t.equal(r.status, status, `HTTP ${status}`);
  t.type(r.json?.error?.message, 'string', 'error.message');
  t.type(r.json?.error?.type, 'string', 'error.type');
  const code = r.json?.error?.code;
  t.ok(code === null || typeof code === 'string', `error.code a string or null (got ${JSON.stringify(code)})`);
  t.equal(r.json?.error?.type, status >= 500 ? 'server_error' : status === 429 ? 'requests' : 'invalid_request_error', "error.type in OpenAI's vocabulary");
  if (param !== undefined) t.equal(r.json?.error?.param, param, `error.param = ${param}`);
}

t.test('bad input: each answered with OpenAI error JSON, and the router keeps serving', async (t) => {
  const { url } = await setup(t, { limits: { maxBodyBytes: 4096, requestBodyTimeoutMs: 300 } });
  const chat = `${url}/v1/chat/completions`;
  const comp = `${url}/v1/completions`;

  isOpenAIError(t, await post(chat, '{"model": "open-model", "messages": ['), 400);
  isOpenAIError(t, await post(chat, '[1,2,3]'), 400);
  isOpenAIError(t, await post(chat, '{"messages":[{"role":"user","content":"hi"}]}'), 400, 'model');
  isOpenAIError(t, await post(chat, '{"model":"open-model"}'), 400, 'messages');
  isOpenAIError(t, await post(chat, '{"model":"open-model","messages":[]}'), 400, 'messages');
  isOpenAIError(t, await post(comp, '{"model":"open-model"}'), 400, 'prompt');
  isOpenAIError(t, await post(comp, '{"model":"open-model","prompt":{"a":1}}'), 400, 'prompt');
  isOpenAIError(t, await post(comp, ''), 400);
  const nf = await post(comp, '{"model":"no-such-model","prompt":"hi"}');
  isOpenAIError(t, nf, 404, 'model');
  t.match(nf.json.error.message, /no-such-model/);
  isOpenAIError(t, await post(comp, JSON.stringify({ model: 'open-model', prompt: 'x'.repeat(5000) })), 413);

  const wrongMethod = await fetch(comp);
  const wm = { status: wrongMethod.status, json: await wrongMethod.json() };
  isOpenAIError(t, wm, 405);
  t.equal(wrongMethod.headers.get('allow'), 'POST');
  const del = await fetch(`${url}/v1/models`, { method: 'DELETE' });
  t.equal(del.status, 405, 'DELETE /v1/models: 405');
  await del.text();
  isOpenAIError(t, await post(`${url}/v1/nothing-here`, '{}'), 404);
  const nope = await fetch(`${url}/nope`);
  t.equal(nope.status, 404);
  await nope.text();

  // HEAD: headers only (a body would desynchronise the keep-alive connection)
  const headRaw = await new Promise<string>((resolve, reject) => {
    const u = new URL(url);
    const s = connect(Number(u.port), u.hostname, () => {
      s.write('HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\nHEAD /v1/completions HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n');
    });
    let got = '';
    s.on('data', (b) => {
      got += b.toString();
      if (got.includes('{"status":"ok"}')) {
        s.destroy();
        resolve(got);
      }
    });
    s.on('error', reject);
    setTimeout(() => {
      s.destroy();
      resolve(got);
    }, 3000);
  });
  const heads = headRaw.split(/(?=HTTP\/1\.1 )/);
  t.equal(heads.length, 3, 'three answers on one connection');
  t.match(heads[0], /^HTTP\/1\.1 200 /, 'HEAD /healthz: 200');
  t.match(heads[1], /^HTTP\/1\.1 405 /, 'HEAD on an inference path: 405');
  t.notOk(heads[0].includes('{') || heads[1].includes('{'), 'HEAD answers have no body');
  t.match(heads[2], /\{"status":"ok"\}$/, 'the following GET is answered in sync');

  // a stalled body: headers promise 100 bytes, 10 arrive, then nothing
  const reply = await new Promise<string>((resolve, reject) => {
    const u = new URL(url);
    const s = connect(Number(u.port), u.hostname, () => {
      s.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"model":');
    });
    let got = '';
    s.on('data', (b) => (got += b.toString()));
    s.on('close', () => resolve(got));
    s.on('error', reject);
    setTimeout(() => {
      s.destroy();
      resolve(got);
    }, 3000);
  });
  t.match(reply, /^HTTP\/1\.1 408 /, 'stalled body: 408');
  t.match(reply, /"type":"invalid_request_error","param":null,"code":null/);

  // after all that, a good request still works
  const ok = await post(comp, '{"model":"open-model","prompt":"still alive?","max_tokens":2}');
  t.equal(ok.status, 200, 'router still serves');
  t.equal(ok.json.object, 'text_completion');
});

t.test('no ready endpoint: 503', async (t) => {
  // the only endpoint of the pool is a closed port; health checks mark it down
  const { url } = await setup(t, { dataLayer: { healthIntervalMs: 100, healthTimeoutMs: 200 } }, (urls) => [
    { name: 'live', models: ['open-model'], endpoints: [{ name: 'a', url: urls[0] }] },
    { name: 'dead', models: ['dead-model'], endpoints: [{ name: 'gone', url: 'http://127.0.0.1:1' }] },
  ]);
  const r = await post(`${url}/v1/completions`, '{"model":"dead-model","prompt":"hi"}');
  isOpenAIError(t, r, 503);
  const ready = await fetch(`${url}/readyz`);
  t.equal(ready.status, 503, '/readyz: not ready while a model has no ready endpoint');
  t.match(await ready.json(), { models_without_ready_endpoint: ['dead-model'] });
});

t.test('headers, /v1/models, /healthz, /readyz, /metrics', async (t) => {
  // the engines serve the pools' models (the router reads each one's /v1/models: a model an engine does not list is not routed there)
  const { url } = await startTestRouter(t, {
    n: 2,
    fleet: { timeScale: 0, models: ['model-a', 'model-b', 'shared'] },
    pools: (urls) => [
      { name: 'a', models: ['model-a', 'shared'], endpoints: [{ name: 'ea', url: urls[0] }] },
      { name: 'b', engine: 'sglang', models: ['model-b', 'shared'], endpoints: [{ name: 'eb', url: urls[1] }] },
    ],
  });
  const r = await post(`${url}/v1/completions`, '{"model":"model-a","prompt":"hello","max_tokens":2}', { 'x-request-id': 'my-id-123' });
  t.equal(r.headers.get('x-request-id'), 'my-id-123', 'x-request-id passed through');
  t.equal(r.headers.get('x-switchyard-endpoint'), 'ea', 'x-switchyard-endpoint names the endpoint');
  const r2 = await post(`${url}/v1/completions`, '{"model":"model-b","prompt":"hello","max_tokens":2}');
  t.match(r2.headers.get('x-request-id'), /^[0-9a-f]{8}-[0-9a-z]+$/, 'x-request-id generated');
  t.equal(r2.headers.get('x-switchyard-endpoint'), 'eb');

  const models = await (await fetch(`${url}/v1/models`)).json();
  t.same(models.data.map((m: { id: string }) => m.id).sort(), ['model-a', 'model-b', 'shared'], '/v1/models: union of the pools');
  t.equal((await fetch(`${url}/healthz`)).status, 200);
  t.equal((await fetch(`${url}/readyz`)).status, 200);
  const m = await (await fetch(`${url}/metrics`)).text();
  for (const name of [
    'switchyard_requests_total{model="model-a",endpoint="ea",status="',
    'switchyard_routing_decision_seconds_bucket',
    'switchyard_upstream_ttft_seconds_bucket{endpoint="ea"',
    'switchyard_endpoint_in_flight{endpoint="eb"} 0',
    'switchyard_prefix_match_ratio',
  ]) {
    t.ok(m.includes(name), `/metrics has ${name}`);
  }
});

t.test('admission gate seam: reject, hold, release exactly once, abort while held', async (t) => {
  const fleet = await startFleet(1, { timeScale: 0 });
  t.teardown(() => fleet.close());
  const cfg = validateConfig(
    { apiVersion: API_VERSION, kind: 'Router', pools: [{ name: 'p', models: ['open-model'], endpoints: [{ name: 'e0', url: fleet.urls[0] }] }], logging: { level: 'silent' } },
    validate,
  );
  const released: string[] = [];
  const abortedWhileHeld: string[] = [];
  let admitted = 0;
  const gate = {
    headerNames: ['x-llm-d-inference-fairness-id'],
    admit(info: RequestInfo, signal: AbortLike): Admission | Promise<Admission> {
      const tenant = info.headers['x-llm-d-inference-fairness-id'];
      if (tenant === 'blocked') return { admitted: false, status: 429, message: 'tenant over its share', reason: 'saturated' };
      const hold = tenant === 'slow' ? 400 : 20;
      return new Promise((resolve) => {
        signal.onabort = () => abortedWhileHeld.push(info.requestId);
        setTimeout(() => {
          admitted++;
          resolve({ admitted: true, ticket: info.requestId });
        }, hold);
      });
    },
    release(ticket: unknown, outcome: string) {
      released.push(`${ticket}:${outcome}`);
    },
  };
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1', gate });
  t.teardown(() => router.close(200));
  const url = `${router.url}/v1/completions`;
  const rej = await post(url, '{"model":"open-model","prompt":"hi"}', { 'x-llm-d-inference-fairness-id': 'blocked' });
  isOpenAIError(t, rej, 429);
  t.equal(rej.headers.get('x-switchyard-dropped-reason'), 'saturated');
  const oks = await Promise.all(
    [1, 2, 3].map((i) => post(url, `{"model":"open-model","prompt":"held ${i}","max_tokens":2}`, { 'x-llm-d-inference-fairness-id': 'a', 'x-request-id': `ok-${i}` })),
  );
  t.same(oks.map((r) => r.status), [200, 200, 200], 'held requests are then served');
  t.same(released.sort(), ['ok-1:ok', 'ok-2:ok', 'ok-3:ok'], 'released once each with the outcome');
  // the client gives up while the gate holds the request
  const ac = new AbortController();
  const p = fetch(url, {
    method: 'POST',
    headers: { 'x-llm-d-inference-fairness-id': 'slow', 'x-request-id': 'gone-1' },
    body: '{"model":"open-model","prompt":"never mind"}',
    signal: ac.signal,
  }).catch(() => 'aborted');
  await new Promise((r) => setTimeout(r, 100));
  ac.abort();
  t.equal(await p, 'aborted');
  await new Promise((r) => setTimeout(r, 500));
  t.same(abortedWhileHeld, ['gone-1'], 'the gate saw the abort signal');
  t.ok(released.includes('gone-1:aborted'), 'a ticket admitted after the client left is released as aborted');
  t.equal(fleet.engines[0].stats().finished, 3, 'the abandoned request never reached the engine');
  t.equal(admitted, 4);
});

t.test('switchyard serve: embedded default and quick mode, graceful exit on SIGTERM', async (t) => {
  const fleet = await startFleet(1, { timeScale: 0 });
  t.teardown(() => fleet.close());
  for (const args of [['--port', '0'], ['--port', '0', '--upstream', fleet.urls[0], '--model', 'open-model']]) {
    const { child, url, exited } = await spawnServe(t, args);
    const r = await post(`${url}/v1/chat/completions`, JSON.stringify({ model: 'open-model', messages: [{ role: 'user', content: 'Hello!' }], max_tokens: 4 }));
    t.equal(r.status, 200, `serve ${args.join(' ')}: chat completion answered`);
    t.equal(r.json.object, 'chat.completion');
    child.kill('SIGTERM');
    t.same(await exited, [0, null], `serve ${args.join(' ')}: exit code 0 after SIGTERM`);
  }
});

t.test('a flowControl block puts the flow-control gate in front of scheduling', async (t) => {
  const { flowGateFactory } = await import('../../src/server/flow-gate.js');
  const fleet = await startFleet(1, { timeScale: 0 });
  t.teardown(() => fleet.close());
  const cfg = validateConfig(
    {
      apiVersion: API_VERSION,
      kind: 'Router',
      pools: [{ name: 'p', models: ['open-model'], endpoints: [{ name: 'e0', url: fleet.urls[0] }] }],
      logging: { level: 'silent' },
      flowControl: { enabled: true, flows: [{ id: 'tenant:x', priority: 'premium' }] },
    },
    validate,
  );
  const gate = await flowGateFactory(cfg);
  t.type(gate, 'function');
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1', gate });
  t.teardown(() => router.close(200));
  const r = await post(`${router.url}/v1/completions`, '{"model":"open-model","prompt":"hi","max_tokens":2}', { 'x-llm-d-inference-fairness-id': 'tenant:x' });
  t.equal(r.status, 200);
  const m = await (await fetch(`${router.url}/metrics`)).text();
  t.match(m, /switchyard_flow_queue_length\{pool="open-model",band="premium",flow="tenant:x"\} 0/, 'flow-control metrics in /metrics');
  t.equal(await flowGateFactory({ ...cfg, flowControl: undefined }), undefined, 'no block: no gate');
  await t.rejects(flowGateFactory({ ...cfg, flowControl: { flows: [{ id: 'tenant:y', minShare: 7 }] } }), { code: 'SWY_ERR_CONFIG' });
});
