// What a key may do, over real sockets with `switchyard sim` engines: its
// models (others answer 404 model_not_found exactly as an unknown model;
// /v1/models lists only its own), its band ceiling, identity headers ignored
// unless trustHeaders, and what reaches the engines: never the client's
// Authorization, the pool's upstreamAuth key instead (chat, embeddings, the
// Responses API, both P/D legs).
import t from 'tap';
import { createHash } from 'node:crypto';
import { startEngine, type SimEngine } from '../../src/sim/index.js';
import type { SimOptions } from '../../src/sim/options.js';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { startRouter, type RunningRouter } from '../../src/server/router.js';
import { validatePlugin } from '../support/router-util.js';
import { metric, parseProm, send } from '../support/sim-util.js';

const sha = (k: string) => createHash('sha256').update(k).digest('hex');
const KEY_A = 'sk-a-only-m1-and-standard';
const KEY_B = 'sk-b-everything';
const KEY_C = 'sk-c-premium';
const ENGINE_KEY = 'engine-secret-42';

async function engines(t: Tap.Test, ...opts: SimOptions[]): Promise<SimEngine[]> {
  const es = await Promise.all(opts.map((o) => startEngine({ timeScale: 0, ...o })));
  t.teardown(() => Promise.all(es.map((e) => e.close())));
  return es;
}

async function router(t: Tap.Test, doc: Record<string, unknown>): Promise<RunningRouter> {
  const r = await startRouter(validateConfig({ apiVersion: API_VERSION, kind: 'Router', logging: { level: 'silent' }, ...doc }, validatePlugin), { port: 0, host: '127.0.0.1' });
  t.teardown(() => r.close(200));
  return r;
}

const call = (base: string, method: string, path: string, body: unknown, headers: Record<string, string> = {}) => send(base, method, path, body, headers).done;
const bearer = (k: string) => ({ authorization: `Bearer ${k}` });
const chat = (model: string) => ({ model, messages: [{ role: 'user', content: 'hello' }], max_tokens: 3 });

t.test('a key sees only its models: others answer 404 model_not_found exactly as an unknown model', async (t) => {
  const [e0, e1] = await engines(t, { models: ['m1'] }, { models: ['m2'] });
  const r = await router(t, {
    pools: [
      { name: 'p1', models: ['m1'], endpoints: [{ name: 'e0', url: e0!.url }] },
      { name: 'p2', models: ['m2'], endpoints: [{ name: 'e1', url: e1!.url }] },
    ],
    responses: { enabled: true },
    auth: { keys: [{ digest: sha(KEY_A), tenant: 'a', models: ['m1'] }, { digest: sha(KEY_B), tenant: 'b' }] },
  });
  const ok = await call(r.url, 'POST', '/v1/chat/completions', chat('m1'), bearer(KEY_A));
  t.equal(ok.status, 200, 'its own model');
  const hidden = await call(r.url, 'POST', '/v1/chat/completions', chat('m2'), bearer(KEY_A));
  const unknown = await call(r.url, 'POST', '/v1/chat/completions', chat('m3'), bearer(KEY_A));
  t.equal(hidden.status, 404);
  t.same(JSON.parse(hidden.body), JSON.parse(unknown.body.replaceAll('m3', 'm2')), 'the same answer as a model that does not exist');
  t.match(JSON.parse(hidden.body).error, { type: 'invalid_request_error', code: 'model_not_found', param: 'model' });
  t.equal((await call(r.url, 'POST', '/v1/chat/completions', chat('m2'), bearer(KEY_B))).status, 200, 'a key without a list uses every model');
  for (const [path, body] of [
    ['/v1/completions', { model: 'm2', prompt: 'x', max_tokens: 2 }],
    ['/v1/embeddings', { model: 'm2', input: 'x' }],
    ['/v1/responses', { model: 'm2', input: 'x' }],
  ] as const) {
    const res = await call(r.url, 'POST', path, body, bearer(KEY_A));
    t.equal(res.status, 404, `${path}: 404`);
    t.equal(JSON.parse(res.body).error.code, 'model_not_found', `${path}: model_not_found`);
  }
  const ids = async (key: string) => JSON.parse((await call(r.url, 'GET', '/v1/models', undefined, bearer(key))).body).data.map((m: { id: string }) => m.id);
  t.same(await ids(KEY_A), ['m1'], '/v1/models: only its models');
  t.same((await ids(KEY_B)).sort(), ['m1', 'm2'], '/v1/models: every model for a key without a list');
});

t.test('band ceiling: a key above its maxBand is clamped; identity headers are ignored unless trustHeaders', async (t) => {
  const [e0] = await engines(t, {});
  const pools = [{ name: 'p', models: ['open-model'], endpoints: [{ name: 'e0', url: e0!.url }] }];
  const flowControl = { flows: [{ id: 'tenant:a', priority: 'premium' }, { id: 'tenant:c', priority: 'premium' }] };
  const keys = [{ digest: sha(KEY_A), tenant: 'a', maxBand: 'standard' }, { digest: sha(KEY_C), tenant: 'c' }];
  const dispatched = async (r: RunningRouter, band: string, flow: string) =>
    metric(parseProm((await call(r.url, 'GET', '/metrics', undefined)).body), 'switchyard_flow_dispatched_total', { band, flow });

  const r = await router(t, { pools, flowControl, responses: { enabled: true }, auth: { keys } });
  t.equal((await call(r.url, 'POST', '/v1/chat/completions', chat('open-model'), bearer(KEY_A))).status, 200);
  t.equal((await call(r.url, 'POST', '/v1/chat/completions', chat('open-model'), bearer(KEY_C))).status, 200);
  t.equal(await dispatched(r, 'standard', 'tenant:a'), 1, 'tenant a, declared premium, is held at its key\'s maxBand (standard)');
  t.equal(await dispatched(r, 'premium', 'tenant:a'), 0);
  t.equal(await dispatched(r, 'premium', 'tenant:c'), 1, 'tenant c keeps its declared band');
  // the client lies: a's key claims tenant c and another flow through headers
  const lie = { ...bearer(KEY_A), 'x-tenant-id': 'c', 'x-llm-d-inference-fairness-id': 'tenant:c', 'x-workload-id': 'w' };
  t.equal((await call(r.url, 'POST', '/v1/chat/completions', chat('open-model'), lie)).status, 200);
  t.equal(await dispatched(r, 'standard', 'tenant:a'), 2, 'identity headers are ignored: still tenant a, standard');
  t.equal(await dispatched(r, 'premium', 'tenant:c'), 1, 'tenant c did not get the request');
  const made = await call(r.url, 'POST', '/v1/responses', { model: 'open-model', input: 'mine' }, lie);
  t.equal(made.status, 200);
  const id = JSON.parse(made.body).id as string;
  t.equal((await call(r.url, 'GET', `/v1/responses/${id}`, undefined, bearer(KEY_C))).status, 404, 'the response is not stored under the claimed tenant');
  t.equal((await call(r.url, 'GET', `/v1/responses/${id}`, undefined, bearer(KEY_A))).status, 200, 'it is the key\'s tenant\'s');

  // trustHeaders: a gateway in front names the tenant; the key's ceiling still applies
  const g = await router(t, { pools, flowControl, responses: { enabled: true }, auth: { keys, trustHeaders: true } });
  t.equal((await call(g.url, 'POST', '/v1/chat/completions', chat('open-model'), { ...bearer(KEY_A), 'x-tenant-id': 'c' })).status, 200);
  t.equal(await dispatched(g, 'standard', 'tenant:c'), 1, 'trusted: the header names the tenant, clamped to the key\'s maxBand');
  const made2 = await call(g.url, 'POST', '/v1/responses', { model: 'open-model', input: 'for c' }, { ...bearer(KEY_A), 'x-tenant-id': 'c' });
  const id2 = JSON.parse(made2.body).id as string;
  t.equal((await call(g.url, 'GET', `/v1/responses/${id2}`, undefined, bearer(KEY_C))).status, 200, 'stored under the trusted tenant');
  t.equal((await call(g.url, 'GET', `/v1/responses/${id2}`, undefined, bearer(KEY_A))).status, 404, 'not under the key\'s own');
});

t.test("the client's Authorization never reaches an engine; the pool's upstreamAuth key does", async (t) => {
  process.env.SWY_TEST_ENGINE_KEY = ENGINE_KEY;
  t.teardown(() => delete process.env.SWY_TEST_ENGINE_KEY);
  const [e0, e1] = await engines(t, { models: ['m1'] }, { models: ['m2'] });
  for (const e of [e0!, e1!]) e.recordHeaders(['authorization']);
  const pools = [
    { name: 'p1', models: ['m1'], upstreamAuth: 'SWY_TEST_ENGINE_KEY', endpoints: [{ name: 'e0', url: e0!.url }] },
    { name: 'p2', models: ['m2'], endpoints: [{ name: 'e1', url: e1!.url }] },
  ];
  // without auth too: the client's header is not the engine's business
  const plain = await router(t, { pools, responses: { enabled: true } });
  const authed = await router(t, { pools, responses: { enabled: true }, auth: { keys: [{ digest: sha(KEY_B), tenant: 'b' }] } });
  for (const r of [plain, authed]) {
    for (const [path, body] of [
      ['/v1/chat/completions', chat('m1')],
      ['/v1/chat/completions', chat('m2')],
      ['/v1/embeddings', { model: 'm1', input: 'x' }],
      ['/v1/embeddings', { model: 'm2', input: 'x' }],
      ['/v1/responses', { model: 'm1', input: 'x' }],
      ['/v1/responses', { model: 'm2', input: 'x' }],
    ] as const) {
      const res = await call(r.url, 'POST', path, body, bearer(KEY_B));
      t.equal(res.status, 200, `${path} ${body.model}`);
    }
  }
  const seen = (e: SimEngine) => e.recorded().map((x) => x.headers.authorization);
  // per engine and router: its chat, its embeddings, the chat turn of its Responses call
  const paths = ['/v1/chat/completions', '/v1/embeddings', '/v1/chat/completions'];
  t.same(e0!.recorded().map((x) => x.path), [...paths, ...paths]);
  t.same(e1!.recorded().map((x) => x.path), [...paths, ...paths]);
  t.same(new Set(seen(e0!)), new Set([`Bearer ${ENGINE_KEY}`]), 'the upstreamAuth pool: the engine key on every request');
  t.same(new Set(seen(e1!)), new Set(['']), 'a pool without upstreamAuth: no Authorization at all');
});

t.test('P/D: both legs carry the pool key, never the client key', async (t) => {
  process.env.SWY_TEST_ENGINE_KEY = ENGINE_KEY;
  t.teardown(() => delete process.env.SWY_TEST_ENGINE_KEY);
  const [p0, d0] = await engines(t, { role: 'prefill' }, { role: 'decode' });
  for (const e of [p0!, d0!]) e.recordHeaders(['authorization']);
  const r = await router(t, {
    pools: [{ name: 'p', models: ['open-model'], upstreamAuth: 'SWY_TEST_ENGINE_KEY', endpoints: [{ name: 'p0', url: p0!.url, role: 'prefill' }, { name: 'd0', url: d0!.url, role: 'decode' }] }],
    dataLayer: { healthIntervalMs: 200 },
    disaggregation: { thresholdTokens: 256, prefillTimeoutMs: 2000 },
    auth: { keys: [{ digest: sha(KEY_B), tenant: 'b' }] },
  });
  const long = 'please summarise this long document. '.repeat(120);
  const res = await call(r.url, 'POST', '/v1/chat/completions', { model: 'open-model', messages: [{ role: 'user', content: long }], max_tokens: 4 }, bearer(KEY_B));
  t.equal(res.status, 200);
  t.ok(res.headers['x-switchyard-prefill-endpoint'], 'went through P/D');
  t.same(p0!.recorded().map((x) => x.headers.authorization), [`Bearer ${ENGINE_KEY}`], 'prefill leg');
  t.same(d0!.recorded().map((x) => x.headers.authorization), [`Bearer ${ENGINE_KEY}`], 'decode leg');
});
