// Prefill/decode disaggregation through the router, over real sockets and
// simulated engines: the decider, vLLM NIXL (sequential) and SGLang
// (bootstrap) modes, each failure rule, revision pairing, headers, metrics.
import t from 'tap';
import { createServer, type IncomingMessage } from 'node:http';
import { startEngine, type SimEngine } from '../../src/sim/index.js';
import type { SimOptions } from '../../src/sim/options.js';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { startRouter, type RunningRouter } from '../../src/server/router.js';
import { uncachedTokens, withFields } from '../../src/director/pd.js';
import { get, metric, parseProm, post, scrape, until } from '../support/sim-util.js';
import { validatePlugin } from '../support/router-util.js';

const FAST: SimOptions = { timeScale: 0 };
const LONG = 'please summarise this long document. '.repeat(120); // ~4.4 KB ≈ 1,100 tokens
const chat = (content: string, extra: Record<string, unknown> = {}) => ({ model: 'open-model', messages: [{ role: 'user', content }], max_tokens: 5, ...extra });

interface Ep {
  name: string;
  url: string;
  role: string;
  revision?: string;
  bootstrapPort?: number;
}

async function pdRouter(t: Tap.Test, endpoints: Ep[], opts: { engine?: string; extra?: Record<string, unknown>; pd?: Record<string, unknown> } = {}): Promise<RunningRouter> {
  const cfg = validateConfig(
    {
      apiVersion: API_VERSION,
      kind: 'Router',
      pools: [{ name: 'p', engine: opts.engine ?? 'vllm', models: ['open-model'], endpoints }],
      logging: { level: 'silent' },
      dataLayer: { healthIntervalMs: 200 },
      disaggregation: { thresholdTokens: 256, prefillTimeoutMs: 2000, ...opts.pd },
      ...opts.extra,
    },
    validatePlugin,
  );
  const r = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => r.close(200));
  return r;
}

async function engines(t: Tap.Test, ...opts: SimOptions[]): Promise<SimEngine[]> {
  const es = await Promise.all(opts.map((o) => startEngine({ ...FAST, ...o })));
  t.teardown(() => Promise.all(es.map((e) => e.close())));
  return es;
}

async function pdMetrics(r: RunningRouter) {
  return parseProm((await get(r.url, '/metrics')).body);
}

t.test('decider and body helpers', async (t) => {
  t.equal(uncachedTokens(4000, 0, 0, 64), 1000, 'no prefix matching: the whole prompt');
  t.equal(uncachedTokens(4000, 62, 50, 64), (4000 - 3200) / 4, 'less the matched blocks');
  t.equal(uncachedTokens(4000, 62, 62, 64), 8, 'the tail past the last full block stays uncached');
  t.equal(withFields(Buffer.from('{"a":1} \n'), '"b":2').toString(), '{"a":1,"b":2}');
  t.same(JSON.parse(withFields(Buffer.from('{ }'), '"b":2').toString()), { b: 2 });
  t.same(JSON.parse(withFields(Buffer.from('{"stream":true,"max_tokens":9}'), '"stream":false,"max_tokens":1').toString()), { stream: false, max_tokens: 1 }, 'later members win');
});

t.test('vLLM NIXL: long prompts go prefill → decode with one request id; short ones straight to decode', async (t) => {
  const [p0, d0] = await engines(t, { role: 'prefill' }, { role: 'decode' });
  const r = await pdRouter(t, [
    { name: 'p0', url: p0!.url, role: 'prefill' },
    { name: 'd0', url: d0!.url, role: 'decode' },
  ]);
  const long = await post(r.url, '/v1/chat/completions', chat(LONG, { stream: true, stream_options: { include_usage: true }, min_tokens: 2 }), { 'x-request-id': 'pd-req-1' });
  t.equal(long.status, 200);
  t.equal(long.headers['x-switchyard-endpoint'], 'd0');
  t.equal(long.headers['x-switchyard-prefill-endpoint'], 'p0');
  t.equal(long.headers['x-request-id'], 'pd-req-1');
  t.ok(long.body.endsWith('data: [DONE]\n\n'));
  t.equal(p0!.stats().finished, 1, 'the prefill engine ran one (one-token) request');
  t.equal(p0!.stats().generationTokens, 1, 'max_tokens 1 on the prefill leg');
  t.equal(d0!.stats().finished, 1);

  const short = await post(r.url, '/v1/chat/completions', chat('hi'));
  t.equal(short.status, 200);
  t.equal(short.headers['x-switchyard-endpoint'], 'd0');
  t.notOk('x-switchyard-prefill-endpoint' in short.headers, 'a short prompt goes straight to decode');
  t.equal(p0!.stats().finished, 1);

  const m = await pdMetrics(r);
  t.equal(metric(m, 'switchyard_pd_decisions_total', { decision: 'disaggregated' }), 1);
  t.equal(metric(m, 'switchyard_pd_decisions_total', { decision: 'direct' }), 1);
  t.equal(metric(m, 'switchyard_pd_decisions_total', { decision: 'fallback' }), 0);
  t.equal(metric(m, 'switchyard_pd_prefill_leg_seconds_count'), 1);
});

t.test('the decider counts uncached tokens on the chosen decode endpoint (a cached prompt goes direct)', async (t) => {
  const [p0, d0] = await engines(t, { role: 'prefill' }, { role: 'decode' });
  const r = await pdRouter(t, [
    { name: 'p0', url: p0!.url, role: 'prefill' },
    { name: 'd0', url: d0!.url, role: 'decode' },
  ]);
  const first = await post(r.url, '/v1/chat/completions', chat(LONG));
  t.equal(first.headers['x-switchyard-prefill-endpoint'], 'p0');
  // the same prompt again: d0 now holds it (the prefix index recorded the pick)
  const again = await post(r.url, '/v1/chat/completions', chat(LONG));
  t.equal(again.status, 200);
  t.notOk('x-switchyard-prefill-endpoint' in again.headers, 'already cached on decode: direct');
});

t.test('prefill failures: 4xx to the client; 5xx, reset, timeout, missing or malformed params → decode alone, counted', async (t) => {
  const [p0, d0] = await engines(t, { role: 'prefill' }, { role: 'decode' });
  // a scripted prefill engine for the answers a simulator does not give
  let script: 'no-kv' | 'bad-kv' | 'not-json' | 'hang' = 'no-kv';
  const seen: IncomingMessage[] = [];
  const raw = createServer((req, res) => {
    seen.push(req);
    req.resume();
    req.on('end', () => {
      if (req.url !== '/v1/chat/completions') return res.writeHead(req.url === '/health' ? 200 : 404).end();
      if (script === 'hang') return; // never answers
      res.writeHead(200, { 'content-type': 'application/json' });
      if (script === 'not-json') return res.end('{"choices": [');
      const kv = script === 'bad-kv' ? { kv_transfer_params: { do_remote_prefill: 'yes' } } : {};
      res.end(JSON.stringify({ id: 'x', object: 'chat.completion', choices: [], ...kv }));
    });
  });
  await new Promise<void>((res) => raw.listen(0, '127.0.0.1', res));
  t.teardown(() => {
    raw.closeAllConnections();
    raw.close();
  });
  const rawUrl = `http://127.0.0.1:${(raw.address() as { port: number }).port}`;

  // sim prefill answering 429 (a 4xx): the client gets it
  p0!.setFailures(1, ['429']);
  const r = await pdRouter(t, [
    { name: 'p0', url: p0!.url, role: 'prefill' },
    { name: 'd0', url: d0!.url, role: 'decode' },
  ], { pd: { prefillTimeoutMs: 300 }, extra: { dataLayer: { healthIntervalMs: 0, scrapeIntervalMs: 0 } } });
  const rej = await post(r.url, '/v1/chat/completions', chat(LONG));
  t.equal(rej.status, 429, 'prefill 4xx → client');
  t.match(JSON.parse(rej.body), { error: { code: 'rate_limit_exceeded', type: 'requests' } });
  t.equal(rej.headers['x-switchyard-prefill-endpoint'], 'p0');
  t.equal(d0!.stats().finished, 0, 'decode never ran');
  // the decode endpoint never saw that prompt: the same prompt is disaggregated again (its recorded blocks were forgotten)
  p0!.setFailures(0);
  const again = await post(r.url, '/v1/chat/completions', chat(LONG));
  t.equal(again.headers['x-switchyard-prefill-endpoint'], 'p0');

  // sim prefill answering 500: decode alone
  p0!.setFailures(1, ['500']);
  const f500 = await post(r.url, '/v1/chat/completions', chat('a ' + LONG));
  t.equal(f500.status, 200, 'prefill 5xx → decode alone');
  t.equal(f500.headers['x-switchyard-endpoint'], 'd0');
  t.notOk('x-switchyard-prefill-endpoint' in f500.headers);
  p0!.setFailures(0);

  // the prefill engine goes away: connection refused → decode alone
  await p0!.close();
  const gone = await post(r.url, '/v1/chat/completions', chat('b ' + LONG));
  t.equal(gone.status, 200, 'prefill unreachable → decode alone');

  let m = await pdMetrics(r);
  t.equal(metric(m, 'switchyard_pd_fallbacks_total', { reason: 'prefill-5xx' }), 1);
  t.equal(metric(m, 'switchyard_pd_fallbacks_total', { reason: 'prefill-error' }), 1);
  t.equal(metric(m, 'switchyard_pd_prefill_rejected_total'), 1);

  // scripted: missing, malformed, not JSON, and a prefill that never answers (timeout)
  const r2 = await pdRouter(t, [
    { name: 'praw', url: rawUrl, role: 'prefill' },
    { name: 'd0', url: d0!.url, role: 'decode' },
  ], { pd: { prefillTimeoutMs: 300 }, extra: { dataLayer: { healthIntervalMs: 0, scrapeIntervalMs: 0 } } });
  for (const s of ['no-kv', 'bad-kv', 'not-json', 'hang'] as const) {
    script = s;
    const x = await post(r2.url, '/v1/chat/completions', chat(`${s} ${LONG}`, { stream: true }));
    t.equal(x.status, 200, `${s}: decode alone answers`);
    t.ok(x.body.endsWith('data: [DONE]\n\n'));
    t.notOk(x.body.includes('kv_transfer'), 'no raw connector error reaches the client');
  }
  m = await pdMetrics(r2);
  t.equal(metric(m, 'switchyard_pd_kv_transfer_params_total', { problem: 'missing' }), 1);
  t.equal(metric(m, 'switchyard_pd_kv_transfer_params_total', { problem: 'malformed' }), 2);
  t.equal(metric(m, 'switchyard_pd_fallbacks_total', { reason: 'prefill-timeout' }), 1);
  t.equal(metric(m, 'switchyard_pd_decisions_total', { decision: 'fallback' }), 4);
  // the prefill leg carried NIXL's fields and the request id
  const prefillReq = seen.find((q) => q.url === '/v1/chat/completions')!;
  t.ok(prefillReq.headers['x-request-id'], 'the prefill leg has the request id');
});

t.test('revisions: prefill and decode always pair within one revision; a decode failure retries in the same revision', async (t) => {
  const [pa, da0, da1, pb, db] = await engines(
    t,
    { role: 'prefill', revision: 'a' },
    { role: 'decode', revision: 'a' },
    { role: 'decode', revision: 'a' },
    { role: 'prefill', revision: 'b' },
    { role: 'decode', revision: 'b' },
  );
  const r = await pdRouter(t, [
    { name: 'pa', url: pa!.url, role: 'prefill', revision: 'a' },
    { name: 'da0', url: da0!.url, role: 'decode', revision: 'a' },
    { name: 'da1', url: da1!.url, role: 'decode', revision: 'a' },
    { name: 'pb', url: pb!.url, role: 'prefill', revision: 'b' },
    { name: 'db', url: db!.url, role: 'decode', revision: 'b' },
  ], { extra: { dataLayer: { healthIntervalMs: 0, breakerFailures: 1000 }, scheduling: { picker: 'round-robin' } } }); // round-robin: da0 surely gets picks
  const rev = (n: string) => (n.startsWith('pa') || n.startsWith('da') ? 'a' : 'b');
  const seen = new Set<string>();
  for (let i = 0; i < 12; i++) {
    const x = await post(r.url, '/v1/chat/completions', chat(`${i} ${LONG}`));
    t.equal(x.status, 200);
    const d = x.headers['x-switchyard-endpoint'] as string;
    const p = x.headers['x-switchyard-prefill-endpoint'] as string;
    t.equal(rev(p), rev(d), `pair ${p} → ${d} within one revision`);
    seen.add(d);
  }
  t.ok(seen.size >= 2, 'both revisions serve');
  // da0 fails every request before its first byte: retried on da1 (same revision), never on db
  da0!.setFailures(1, ['500']);
  for (let i = 0; i < 10; i++) {
    const x = await post(r.url, '/v1/chat/completions', chat(`retry ${i} ${LONG}`));
    t.equal(x.status, 200);
    const d = x.headers['x-switchyard-endpoint'] as string;
    const p = x.headers['x-switchyard-prefill-endpoint'] as string;
    t.not(d, 'da0');
    t.equal(rev(p), rev(d), `after a decode failure: ${p} → ${d}`);
  }
  const m = await pdMetrics(r);
  t.ok(metric(m, 'switchyard_upstream_retries_total') >= 1, 'decode failures were retried');
});

t.test('SGLang bootstrap: both legs at once with the same room; decode answers', async (t) => {
  const [p0, p1, d0] = await engines(t, { role: 'prefill', engine: 'sglang' }, { role: 'prefill', engine: 'sglang' }, { role: 'decode', engine: 'sglang', bootstrapTimeoutMs: 500 });
  d0!.recordHeaders(['x-request-id']);
  const r = await pdRouter(t, [
    // the simulator's bootstrap server is its HTTP port
    { name: 'p0', url: p0!.url, role: 'prefill', bootstrapPort: p0!.port },
    { name: 'd0', url: d0!.url, role: 'decode' },
  ], { engine: 'sglang' });
  const x = await post(r.url, '/v1/chat/completions', chat(LONG, { stream: true }), { 'x-request-id': 'sg-1' });
  t.equal(x.status, 200);
  t.equal(x.headers['x-switchyard-endpoint'], 'd0');
  t.equal(x.headers['x-switchyard-prefill-endpoint'], 'p0');
  t.ok(x.body.endsWith('data: [DONE]\n\n'));
  t.equal(p0!.stats().finished + p0!.stats().aborted, 1, 'the prefill engine got the request');
  t.equal(d0!.stats().promptTokens, p0!.stats().promptTokens, 'decode paired with that prefill');
  t.equal(metric(await scrape(d0!.url), 'sglang:time_to_first_token_seconds_count'), 1);
  t.equal(d0!.recorded().length, 1, 'one decode leg: it got its room\'s KV');
  t.equal(metric(await pdMetrics(r), 'switchyard_pd_decisions_total', { decision: 'disaggregated' }), 1);
  // the only prefill failing with 500 every time: SGLang's decode server refuses a request without a
  // room, so the pair is formed again (fresh rooms) until the retry budget is spent, then a clean 502
  p0!.setFailures(1, ['500']);
  const y = await post(r.url, '/v1/chat/completions', chat('another document: ' + LONG, { stream: true }));
  t.equal(y.status, 502, 'no pair could be formed');
  t.match(JSON.parse(y.body), { error: { code: null, type: 'server_error', message: /P\/D pair/ } });
  t.equal(d0!.recorded().length, 4, 'decode got one leg per pair (3), each with a room, none alone');
  // with a second prefill endpoint the failed pair is formed again on it: the client gets decode's answer
  const r2 = await pdRouter(t, [
    { name: 'p0', url: p0!.url, role: 'prefill', bootstrapPort: p0!.port },
    { name: 'p1', url: p1!.url, role: 'prefill', bootstrapPort: p1!.port },
    { name: 'd0', url: d0!.url, role: 'decode' },
  ], { engine: 'sglang', pd: { prefill: { picker: 'round-robin' } } }); // some pairs surely start on p0
  for (let i = 0; i < 3; i++) {
    const z = await post(r2.url, '/v1/chat/completions', chat(`${i} more: ${LONG}`, { stream: true }));
    t.equal(z.status, 200);
    t.ok(z.body.endsWith('data: [DONE]\n\n'));
    t.equal(z.headers['x-switchyard-prefill-endpoint'], 'p1', 'served by the new pair');
  }
  p0!.setFailures(0);
  const m = await pdMetrics(r2);
  t.ok(metric(m, 'switchyard_pd_new_pairs_total', { reason: 'prefill-5xx' }) + metric(m, 'switchyard_pd_new_pairs_total', { reason: 'decode-transfer' }) >= 1, 'new pairs counted');
  t.equal(metric(m, 'switchyard_pd_fallbacks_total', { reason: 'prefill-5xx' }) + metric(m, 'switchyard_pd_fallbacks_total', { reason: 'decode-transfer' }), 0, 'never decode alone');
});

t.test('SGLang bootstrap: a decode leg that cannot reach its prefill engine: a new pair, or a clean error', async (t) => {
  const [p0, p1, d0] = await engines(t, { role: 'prefill', engine: 'sglang' }, { role: 'prefill', engine: 'sglang' }, { role: 'decode', engine: 'sglang', bootstrapTimeoutMs: 300 });
  const r = await pdRouter(t, [
    // no bootstrapPort: the default (1 here), where no bootstrap server of the simulator listens
    { name: 'p0', url: p0!.url, role: 'prefill' },
    { name: 'd0', url: d0!.url, role: 'decode' },
  ], { engine: 'sglang', pd: { bootstrapPort: 1 } });
  const x = await post(r.url, '/v1/chat/completions', chat(LONG, { stream: true }), { 'x-request-id': 'sg-2' });
  t.equal(x.status, 502, 'no pair can work: a clean error');
  t.match(JSON.parse(x.body), { error: { code: null, type: 'server_error', message: /decode-transfer/ } });
  t.notOk(x.body.includes('KVTransferError'), 'no client sees the connector error');
  t.equal(d0!.stats().finished, 0);
  let m = await pdMetrics(r);
  t.equal(metric(m, 'switchyard_pd_new_pairs_total', { reason: 'decode-transfer' }), 2, 'two new pairs (maxRetries 2)');
  t.equal(metric(m, 'switchyard_pd_fallbacks_total', { reason: 'decode-transfer' }), 0, 'never decode alone');
  // with a reachable prefill endpoint beside it: a new pair there
  const r2 = await pdRouter(t, [
    { name: 'p0', url: p0!.url, role: 'prefill' },
    { name: 'p1', url: p1!.url, role: 'prefill', bootstrapPort: p1!.port },
    { name: 'd0', url: d0!.url, role: 'decode' },
  ], { engine: 'sglang', pd: { bootstrapPort: 1, prefill: { picker: 'round-robin' } } });
  for (let i = 0; i < 3; i++) {
    const y = await post(r2.url, '/v1/chat/completions', chat(`${i} ${LONG}`, { stream: true }));
    t.equal(y.status, 200);
    t.ok(y.body.endsWith('data: [DONE]\n\n'));
    t.equal(y.headers['x-switchyard-endpoint'], 'd0', 'the same decode endpoint: it was not at fault');
    t.equal(y.headers['x-switchyard-prefill-endpoint'], 'p1');
  }
  m = await pdMetrics(r2);
  t.ok(metric(m, 'switchyard_pd_new_pairs_total', { reason: 'decode-transfer' }) >= 1, 'pairs on p0 were formed again');
  t.equal(metric(m, 'switchyard_pd_new_pairs_total', { reason: 'decode-transfer' }), metric(m, 'switchyard_upstream_retries_total'), 'each new pair one retry');
});

t.test('the decode profile (disaggregation.decode) picks decode endpoints by its own scorers', async (t) => {
  const opts = { timeScale: 1, itlMs: 20, prefillOverheadMs: 1, prefillUsPerToken: 0 };
  const [p0, d0, d1] = await engines(t, { ...opts, role: 'prefill' }, { ...opts, role: 'decode' }, { ...opts, role: 'decode' });
  const eps = [
    { name: 'p0', url: p0!.url, role: 'prefill' },
    { name: 'd0', url: d0!.url, role: 'decode' },
    { name: 'd1', url: d1!.url, role: 'decode' },
  ];
  const fast = { dataLayer: { healthIntervalMs: 0, scrapeIntervalMs: 20 } };
  // every prompt here goes direct (the threshold is out of reach): only the decode pick is under test
  const profiled = await pdRouter(t, eps, { pd: { thresholdTokens: 1_000_000, decode: { scorers: [{ type: 'running-requests', weight: 1 }] } }, extra: fast });
  const plain = await pdRouter(t, eps, { pd: { thresholdTokens: 1_000_000 }, extra: fast });
  const PROMPT = 'a conversation the decode endpoints may have cached. '.repeat(20);
  /** Three streams straight to an engine (not through the routers): its running count, seen by their scrapes. */
  const load = async (e: SimEngine) => {
    const streams = Array.from({ length: 3 }, (_, i) => post(e.url, '/v1/completions', { prompt: `load ${i}`, max_tokens: 60, stream: true }));
    await until(() => e.stats().running === 3, 2000);
    await new Promise((r) => setTimeout(r, 150)); // a few scrapes
    return streams;
  };
  const ask = async (r: RunningRouter) => (await post(r.url, '/v1/chat/completions', chat(PROMPT))).headers['x-switchyard-endpoint'];

  // the scheduling profile (prefix-cache first) sends a prompt back where it went before ...
  const first = await ask(plain);
  const busyEngine = first === 'd0' ? d0! : d1!;
  const other = first === 'd0' ? 'd1' : 'd0';
  const busy = await load(busyEngine);
  t.equal(await ask(plain), first, 'the scheduling profile follows the cached prompt to the busy decode endpoint');
  // ... the decode profile (running requests only) sends it to the decode endpoint with fewer running requests
  t.equal(await ask(profiled), other, 'the decode profile picks by running requests');
  t.equal(await ask(profiled), other, 'again');
  await Promise.all(busy);
  // a pool without prefill endpoints keeps the scheduling profile: covered by every other router test
});
