// SGLang P/D through the router, against simulated SGLang servers that refuse
// a request without a bootstrap room in prefill and decode mode, as real
// SGLang does (HTTP 400). The router never sends such a server a request
// alone: a short prompt is disaggregated anyway or goes to a `both` endpoint;
// a failed pair becomes a new pair (fresh room, another prefill endpoint, the
// same decode endpoint) or a clean OpenAI-shaped error before any byte.
import t from 'tap';
import { startEngine, type SimEngine } from '../../src/sim/index.js';
import type { SimOptions } from '../../src/sim/options.js';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { startRouter, type RunningRouter } from '../../src/server/router.js';
import { get, metric, parseProm, post, until } from '../support/sim-util.js';
import { validatePlugin } from '../support/router-util.js';
import { revisionStatus } from '../../src/endpoints/revisions.js';

const FAST: SimOptions = { timeScale: 0, engine: 'sglang' };
const LONG = 'please summarise this long document. '.repeat(120); // ~4.4 KB ≈ 1,100 tokens
const chat = (content: string, extra: Record<string, unknown> = {}) => ({ model: 'open-model', messages: [{ role: 'user', content }], max_tokens: 5, ...extra });

interface Ep {
  name: string;
  url: string;
  role: string;
  revision?: string;
  bootstrapPort?: number;
}

async function router(t: Tap.Test, endpoints: Ep[], extra: Record<string, unknown> = {}, pd: Record<string, unknown> = {}): Promise<RunningRouter> {
  const cfg = validateConfig(
    {
      apiVersion: API_VERSION,
      kind: 'Router',
      pools: [{ name: 'p', engine: 'sglang', models: ['open-model'], endpoints }],
      logging: { level: 'silent' },
      dataLayer: { healthIntervalMs: 0, scrapeIntervalMs: 0, breakerFailures: 1000 },
      disaggregation: { thresholdTokens: 256, prefillTimeoutMs: 2000, ...pd },
      ...extra,
    },
    validatePlugin,
  );
  const r = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => r.close(200));
  return r;
}

async function engines(t: Tap.Test, ...opts: SimOptions[]): Promise<SimEngine[]> {
  const es = await Promise.all(opts.map((o) => startEngine({ ...FAST, bootstrapTimeoutMs: 500, ...o })));
  t.teardown(() => Promise.all(es.map((e) => e.close())));
  return es;
}

const m = async (r: RunningRouter) => parseProm((await get(r.url, '/metrics')).body);
/** The simulator's bootstrap server is its HTTP port. */
const pre = (name: string, e: SimEngine, extra: Partial<Ep> = {}): Ep => ({ name, url: e.url, role: 'prefill', bootstrapPort: e.port, ...extra });
const served = (e: SimEngine) => e.stats().finished;
/** Round-robin prefill picks (the default profile's scores may keep picking one engine). */
const RR = { prefill: { picker: 'round-robin' } };

t.test('the simulator refuses a request without a bootstrap room in prefill and decode mode, as SGLang does', async (t) => {
  const [p, d, b] = await engines(t, { role: 'prefill' }, { role: 'decode' }, { role: 'both' });
  for (const [name, e] of [['prefill', p!], ['decode', d!]] as const) {
    const x = await post(e.url, '/v1/chat/completions', chat('hello'), { 'x-request-id': 'r-1' });
    t.equal(x.status, 400, `${name}: 400`);
    t.match(JSON.parse(x.body).error, { code: 400, message: "Invalid request: Disaggregated request received without bootstrap room id. req.rid='r-1'" });
    t.equal(e.stats().finished, 0, `${name}: nothing computed`);
  }
  t.equal((await post(b!.url, '/v1/chat/completions', chat('hello'))).status, 200, 'a both (non-disaggregated) server serves it');
});

t.test('a short prompt in a prefill + decode pool is disaggregated anyway (forced) and answered', async (t) => {
  const [p0, d0] = await engines(t, { role: 'prefill' }, { role: 'decode' });
  const r = await router(t, [pre('p0', p0!), { name: 'd0', url: d0!.url, role: 'decode' }]);
  t.match(revisionStatus(r.core.endpoints), [{ servesAggregated: false, servesDisaggregated: true }], 'the admin API: no aggregated traffic without a both endpoint');
  const x = await post(r.url, '/v1/chat/completions', chat('short', { stream: true }));
  t.equal(x.status, 200);
  t.ok(x.body.endsWith('data: [DONE]\n\n'));
  t.equal(x.headers['x-switchyard-endpoint'], 'd0');
  t.equal(x.headers['x-switchyard-prefill-endpoint'], 'p0', 'a prefill leg ran below the threshold');
  t.equal(served(p0!) + p0!.stats().aborted, 1);
  const e = await m(r);
  t.equal(metric(e, 'switchyard_pd_forced_total'), 1, 'counted as forced');
  t.equal(metric(e, 'switchyard_pd_decisions_total', { decision: 'disaggregated' }), 1);
  t.equal(metric(e, 'switchyard_pd_decisions_total', { decision: 'direct' }), 0);
  // a cached prompt (decode already holds it) is also below the threshold: paired as well
  const y = await post(r.url, '/v1/chat/completions', chat(LONG));
  const z = await post(r.url, '/v1/chat/completions', chat(LONG));
  t.equal(y.status, 200);
  t.equal(z.status, 200);
  t.equal(z.headers['x-switchyard-prefill-endpoint'], 'p0');
  t.equal(metric(await m(r), 'switchyard_pd_forced_total'), 2, 'the cached one was forced too');
});

t.test('with a both endpoint in the revision, direct requests go to it (never paired: it cannot take KV), long ones pair on the decode endpoint', async (t) => {
  const [p0, d0, b0] = await engines(t, { role: 'prefill' }, { role: 'decode' }, { role: 'both' });
  // preferBoth false and round-robin: the decode pick alternates between d0 and b0
  const r = await router(t, [pre('p0', p0!), { name: 'd0', url: d0!.url, role: 'decode' }, { name: 'b0', url: b0!.url, role: 'both' }], {
    scheduling: { filters: ['model', 'healthy', { type: 'role', params: { preferBoth: false } }], picker: 'round-robin' },
  });
  t.match(revisionStatus(r.core.endpoints), [{ servesAggregated: true, servesDisaggregated: true }]);
  for (let i = 0; i < 6; i++) {
    const x = await post(r.url, '/v1/chat/completions', chat(`short ${i}`));
    t.equal(x.status, 200);
    t.equal(x.headers['x-switchyard-endpoint'], 'b0', 'short: the both endpoint');
    t.notOk('x-switchyard-prefill-endpoint' in x.headers);
  }
  t.equal(served(d0!), 0, 'the decode endpoint never got a request alone');
  t.equal(served(p0!), 0);
  let e = await m(r);
  t.ok(metric(e, 'switchyard_pd_direct_to_both_total') >= 3, 'moved from d0 to b0');
  t.equal(metric(e, 'switchyard_pd_forced_total'), 0);
  const ends = new Set<string>();
  for (let i = 0; i < 4; i++) {
    const x = await post(r.url, '/v1/chat/completions', chat(`${i} ${LONG}`));
    t.equal(x.status, 200);
    ends.add(`${x.headers['x-switchyard-endpoint']}<-${x.headers['x-switchyard-prefill-endpoint']}`);
  }
  t.ok(ends.has('d0<-p0'), 'a long prompt pairs p0 → d0');
  // the only prefill endpoint gone (connection refused, health checks off): a failed pair goes to b0 alone
  await p0!.close();
  const b0Before = served(b0!);
  for (let i = 0; i < 4; i++) {
    const x = await post(r.url, '/v1/chat/completions', chat(`${i} gone ${LONG}`));
    t.equal(x.status, 200, 'served without a prefill endpoint');
    t.equal(x.headers['x-switchyard-endpoint'], 'b0');
    t.notOk('x-switchyard-prefill-endpoint' in x.headers);
  }
  t.equal(served(b0!) - b0Before, 4, 'b0 served each once');
  t.equal(served(d0!), 2, 'd0 served only its two pairs');
  e = await m(r);
  t.ok(metric(e, 'switchyard_pd_new_pairs_total', { reason: 'prefill-error' }) >= 1, 'the failed pairs were counted');
});

t.test('a failed pair is retried as a new pair: another prefill endpoint, a fresh room, the same decode endpoint', async (t) => {
  const [p0, p1, d0] = await engines(t, { role: 'prefill' }, { role: 'prefill' }, { role: 'decode' });
  d0!.recordHeaders(['x-request-id']);
  // round-robin prefill picks: some pairs surely start on p0
  const r = await router(t, [pre('p0', p0!), pre('p1', p1!), { name: 'd0', url: d0!.url, role: 'decode' }], {}, RR);
  // p0 always answers 500: every request whose pair starts on p0 is re-paired on p1
  p0!.setFailures(1, ['500']);
  for (let i = 0; i < 4; i++) {
    const x = await post(r.url, '/v1/chat/completions', chat(`${i} ${LONG}`, { stream: true }), { 'x-request-id': `np-${i}` });
    t.equal(x.status, 200, 'answered');
    t.ok(x.body.endsWith('data: [DONE]\n\n'));
    t.equal(x.headers['x-switchyard-endpoint'], 'd0');
    t.equal(x.headers['x-switchyard-prefill-endpoint'], 'p1');
  }
  t.equal(served(d0!), 4, 'd0 decoded each request once');
  t.equal(served(p1!), 4);
  let e = await m(r);
  const repaired = metric(e, 'switchyard_pd_new_pairs_total', { reason: 'prefill-5xx' }) + metric(e, 'switchyard_pd_new_pairs_total', { reason: 'decode-transfer' });
  t.ok(repaired >= 1, `new pairs counted (${repaired})`);
  t.equal(metric(e, 'switchyard_upstream_retries_total'), repaired, 'each new pair is one attempt of the retry budget');
  t.equal(metric(e, 'switchyard_pd_fallbacks_total', { reason: 'prefill-5xx' }), 0, 'never decode alone');
  p0!.setFailures(0);

  // p0's decode side cannot reach its bootstrap server (wrong port): decode-transfer → new pair on p1
  const r2 = await router(t, [pre('p0', p0!, { bootstrapPort: 1 }), pre('p1', p1!), { name: 'd0', url: d0!.url, role: 'decode' }], {}, RR);
  for (let i = 0; i < 4; i++) {
    const x = await post(r2.url, '/v1/chat/completions', chat(`b${i} ${LONG}`));
    t.equal(x.status, 200);
    t.equal(x.headers['x-switchyard-prefill-endpoint'], 'p1');
  }
  e = await m(r2);
  t.ok(metric(e, 'switchyard_pd_new_pairs_total', { reason: 'decode-transfer' }) >= 1);

  // p0 gone (connection refused): prefill-error → new pair on p1
  await p0!.close();
  for (let i = 0; i < 4; i++) {
    const x = await post(r.url, '/v1/chat/completions', chat(`c${i} ${LONG}`));
    t.equal(x.status, 200);
    t.equal(x.headers['x-switchyard-prefill-endpoint'], 'p1');
  }
  e = await m(r);
  t.ok(metric(e, 'switchyard_pd_new_pairs_total', { reason: 'prefill-error' }) >= 1);
});

t.test('a prefill leg slower than prefillTimeoutMs: a new pair', async (t) => {
  const [p0, p1, d0] = await engines(t, { role: 'prefill', slowFirstByteMs: 5000 }, { role: 'prefill' }, { role: 'decode', bootstrapTimeoutMs: 10_000 });
  const r = await router(t, [pre('p0', p0!), pre('p1', p1!), { name: 'd0', url: d0!.url, role: 'decode' }], {}, { ...RR, prefillTimeoutMs: 200 });
  p0!.setFailures(1, ['slow-first-byte']);
  for (let i = 0; i < 2; i++) {
    const x = await post(r.url, '/v1/chat/completions', chat(`${i} ${LONG}`));
    t.equal(x.status, 200);
    t.equal(x.headers['x-switchyard-prefill-endpoint'], 'p1');
  }
  t.ok(metric(await m(r), 'switchyard_pd_new_pairs_total', { reason: 'prefill-timeout' }) >= 1, 'each pair on p0 timed out and was re-paired');
});

t.test('no prefill endpoint left: a clean OpenAI-shaped error before any byte, nothing sent to decode alone', async (t) => {
  const [p0, d0] = await engines(t, { role: 'prefill' }, { role: 'decode' });
  const r = await router(t, [pre('p0', p0!), { name: 'd0', url: d0!.url, role: 'decode' }], { proxy: { maxRetries: 2 } });
  // the only prefill engine fails every pair: new pairs (the same prefill endpoint, a fresh room) until the budget is spent
  p0!.setFailures(1, ['500']);
  for (const stream of [false, true]) {
    const x = await post(r.url, '/v1/chat/completions', chat(`${stream} ${LONG}`, { stream }));
    t.equal(x.status, 502, `stream ${stream}: 502`);
    t.match(x.headers['content-type'], /application\/json/);
    const err = JSON.parse(x.body).error;
    t.match(err, { message: /P\/D pair .* failed/, type: 'server_error', code: null });
    t.ok('param' in err);
    t.notOk(x.body.includes('KVTransferError'), 'no raw connector error');
  }
  t.equal(served(d0!), 0, 'decode never served a request alone');
  let e = await m(r);
  t.equal(metric(e, 'switchyard_pd_new_pairs_total', { reason: 'prefill-5xx' }) + metric(e, 'switchyard_pd_new_pairs_total', { reason: 'decode-transfer' }), 4, 'two new pairs per request (maxRetries 2)');

  // the prefill endpoint unhealthy (health checks see it gone): 503 at once
  const r2 = await router(t, [pre('p0', p0!), { name: 'd0', url: d0!.url, role: 'decode' }], { dataLayer: { healthIntervalMs: 50, scrapeIntervalMs: 0 } });
  await p0!.close();
  await until(async () => (await post(r2.url, '/v1/chat/completions', chat('probe'))).status === 503, 3000);
  const y = await post(r2.url, '/v1/chat/completions', chat(LONG));
  t.equal(y.status, 503);
  t.match(JSON.parse(y.body).error, { code: null, type: 'server_error', message: /no ready endpoint for model `open-model`: no revision has a ready prefill endpoint/ });
  t.equal(served(d0!), 0);
  e = await m(r2);
  t.equal(metric(e, 'switchyard_pd_decisions_total', { decision: 'direct' }), 0, 'nothing went direct to the decode endpoint');
});

t.test('a decode endpoint failing before its first byte: a new pair on another decode endpoint', async (t) => {
  const [p0, d0, d1] = await engines(t, { role: 'prefill' }, { role: 'decode' }, { role: 'decode' });
  const r = await router(t, [pre('p0', p0!), { name: 'd0', url: d0!.url, role: 'decode' }, { name: 'd1', url: d1!.url, role: 'decode' }], {
    scheduling: { picker: 'round-robin' },
  });
  await d0!.close();
  for (let i = 0; i < 4; i++) {
    const x = await post(r.url, '/v1/chat/completions', chat(`${i} ${LONG}`, { stream: true }));
    t.equal(x.status, 200);
    t.equal(x.headers['x-switchyard-endpoint'], 'd1');
    t.equal(x.headers['x-switchyard-prefill-endpoint'], 'p0');
  }
  t.equal(served(d1!), 4);
  t.ok(metric(await m(r), 'switchyard_upstream_retries_total') >= 1);
});
