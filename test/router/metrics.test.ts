// Metrics through prom-client: the shared Histogram against a reference model,
// a live router's /metrics over loopback (default process/Node.js metrics, the
// switchyard_* families and their counts, one registry per router, a client
// that leaves while the text renders), and the simulator's /metrics read by the
// router's own scrape parser.
import t from 'tap';
import fc from 'fast-check';
import { connect } from 'node:net';
import { Gauge } from 'prom-client';
import { Histogram } from '../../src/metrics/histogram.js';
import { HistogramMetric, newRegistry, Registry } from '../../src/metrics/prom.js';
import { readEngineMetrics, type EngineMetrics } from '../../src/endpoints/engine-metrics.js';
import { parsePrometheus } from '../../src/endpoints/prom-parse.js';
import { startEngine } from '../../src/sim/index.js';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { startRouter } from '../../src/server/router.js';
import { startFleet } from '../../src/sim/index.js';
import type { AdmissionGate } from '../../src/server/gate.js';
import { startTestRouter, validatePlugin } from '../support/router-util.js';
import { metric, parseProm, sleep, until, type Exposition } from '../support/sim-util.js';

const post = (url: string, body: unknown) =>
  fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });

const sum = (e: Exposition, name: string, match: Record<string, string> = {}) =>
  e.samples.filter((s) => s.name === name && Object.entries(match).every(([k, v]) => s.labels[k] === v)).reduce((a, s) => a + s.value, 0);

/** Every series of histogram `name` has cumulative buckets ending (+Inf) at its _count. */
function checkHistogram(t: Tap.Test, e: Exposition, name: string): void {
  const series = new Map<string, number[]>();
  for (const s of e.samples) {
    if (s.name !== `${name}_bucket`) continue;
    const { le, ...rest } = s.labels;
    const key = JSON.stringify(rest);
    if (!series.has(key)) series.set(key, []);
    series.get(key)!.push(s.value);
    if (le === '+Inf') t.equal(s.value, metric(e, `${name}_count`, rest), `${name} ${key}: +Inf bucket = count`);
  }
  t.ok(series.size > 0, `${name} has series`);
  for (const [key, v] of series) t.ok(v.every((x, i) => i === 0 || x >= v[i - 1]!), `${name} ${key}: cumulative`);
}

t.test('Histogram: bucket counts, sum and count match a plain reference model; rendered through prom-client', async (t) => {
  await fc.assert(
    fc.asyncProperty(
      fc.uniqueArray(fc.double({ min: -1e3, max: 1e3, noNaN: true, noDefaultInfinity: true }), { minLength: 1, maxLength: 12, comparator: 'SameValueZero' }),
      fc.array(fc.double({ min: -2e3, max: 2e3, noNaN: true, noDefaultInfinity: true }), { maxLength: 200 }),
      async (rawBounds, values) => {
        const bounds = [...rawBounds].sort((a, b) => a - b);
        const h = new Histogram(bounds);
        for (const v of values) h.observe(v);
        const registry = new Registry();
        new HistogramMetric({ name: 'x_seconds', help: 'x', labelNames: ['k'], buckets: bounds, registers: [registry], series: (emit) => emit({ k: 'v' }, h) });
        const e = parseProm(await registry.metrics());
        for (let i = 0; i < bounds.length; i++) {
          const want = values.filter((v) => v <= bounds[i]!).length;
          if (h.cumulative(i) !== want) return false;
          const rendered = e.samples.find((s) => s.name === 'x_seconds_bucket' && s.labels.le === String(bounds[i]));
          if (rendered === undefined || rendered.value !== want || rendered.labels.k !== 'v') return false;
        }
        const ref = values.reduce((a, v) => a + v, 0);
        return (
          h.count === values.length &&
          Math.abs(h.sum - ref) <= 1e-9 * Math.max(1, Math.abs(ref)) &&
          metric(e, 'x_seconds_bucket', { le: '+Inf' }) === values.length &&
          metric(e, 'x_seconds_count') === values.length &&
          e.types.get('x_seconds') === 'histogram'
        );
      },
    ),
    { numRuns: 200 },
  );
  const h = new Histogram([0.5, 1]);
  h.observe(0.7);
  const json = new Registry();
  new HistogramMetric({ name: 'j', help: 'j', labelNames: ['k'], buckets: [0.5, 1], registers: [json], series: (emit) => emit({ k: 'v' }, h) });
  const [j] = await json.getMetricsAsJSON();
  t.same(
    j!.values.map((v) => [(v as { metricName?: string }).metricName, v.labels, v.value]),
    [
      ['j_bucket', { k: 'v', le: '0.5' }, 0],
      ['j_bucket', { k: 'v', le: '1' }, 1],
      ['j_bucket', { k: 'v', le: '+Inf' }, 1],
      ['j_sum', { k: 'v' }, 0.7],
      ['j_count', { k: 'v' }, 1],
    ],
    'the JSON shape has le among the labels',
  );
  t.equal(await json.metrics(), await json.metrics(), 'rendering twice gives the same text');
  t.match(await json.metrics(), 'j_bucket{k="v",le="0.5"} 0\nj_bucket{k="v",le="1"} 1\nj_bucket{k="v",le="+Inf"} 1\nj_sum{k="v"} 0.7\nj_count{k="v"} 1');
  t.throws(() => new Histogram([1, 1]), RangeError, 'bounds must ascend strictly');
  t.throws(() => new Histogram([0, Infinity]), RangeError, 'bounds must be finite');
  const registry = new Registry();
  const wrong = new Histogram([1, 2, 3]);
  new HistogramMetric({ name: 'y', help: 'y', buckets: [1, 2], registers: [registry], series: (emit) => emit({}, wrong) });
  await t.rejects(registry.metrics(), RangeError, 'a series with other bounds than the metric is refused at scrape time');
});

t.test("a live router's /metrics: default process and Node.js metrics, switchyard_* families with the right counts", async (t) => {
  const { router, url, fleet } = await startTestRouter(t, { n: 2 });
  const n = 7;
  for (let i = 0; i < n; i++) {
    const r = await post(`${url}/v1/completions`, { model: 'open-model', prompt: `prompt number ${i} `.repeat(40), max_tokens: 2 });
    t.equal(r.status, 200);
    await r.arrayBuffer();
  }
  const unknown = await post(`${url}/v1/completions`, { model: 'no-such-model', prompt: 'hi' });
  await unknown.arrayBuffer();
  t.equal(unknown.status, 404);
  t.equal((await fetch(`${url}/nowhere`)).status, 404);

  const res = await fetch(`${url}/metrics`);
  t.equal(res.status, 200);
  t.equal(res.headers.get('content-type'), router.core.metrics.registry.contentType, "prom-client's content type");
  t.match(res.headers.get('content-type'), /^text\/plain; version=0\.0\.4/);
  const text = await res.text();
  const e = parseProm(text); // throws on a malformed line or a duplicate TYPE

  // the default metrics, standard names, no prefix
  for (const [name, type] of [
    ['process_cpu_user_seconds_total', 'counter'],
    ['process_cpu_seconds_total', 'counter'],
    ['process_start_time_seconds', 'gauge'],
    ['process_resident_memory_bytes', 'gauge'],
    ['nodejs_eventloop_lag_seconds', 'gauge'],
    ['nodejs_heap_size_used_bytes', 'gauge'],
    ['nodejs_version_info', 'gauge'],
    ['nodejs_gc_duration_seconds', 'histogram'],
  ] as const) {
    t.equal(e.types.get(name), type, `${name} is a ${type}`);
  }
  t.ok(metric(e, 'process_cpu_user_seconds_total') > 0, 'process CPU is counted');
  t.ok(metric(e, 'nodejs_heap_size_used_bytes') > 0);

  // the router's families, types and help texts as before prom-client
  const families: [string, string, string][] = [
    ['switchyard_requests_total', 'counter', 'Requests answered, by model, endpoint and HTTP status.'],
    ['switchyard_routing_decision_seconds', 'histogram', 'Time to pick an endpoint (filters, scorers, picker).'],
    ['switchyard_upstream_ttft_seconds', 'histogram', 'Time from dispatch to the first response byte from the endpoint.'],
    ['switchyard_endpoint_in_flight', 'gauge', 'Requests in flight from this router per endpoint.'],
    ['switchyard_endpoint_ready', 'gauge', '1 when the endpoint is healthy and its circuit breaker closed.'],
    ['switchyard_prefix_blocks_total', 'counter', 'Prompt blocks hashed for prefix matching.'],
    ['switchyard_prefix_matched_blocks_total', 'counter', 'Prompt blocks the picked endpoint was believed to hold.'],
    ['switchyard_prefix_match_ratio', 'gauge', 'Matched / hashed prompt blocks since start.'],
    ['switchyard_upstream_retries_total', 'counter', 'Requests retried on another endpoint before the first byte.'],
    ['switchyard_relay_pauses_total', 'counter', 'Times a slow client made the relay pause reading from the engine (backpressure).'],
    ['switchyard_rejected_total', 'counter', 'Requests rejected by the admission gate, by reason.'],
  ];
  for (const [name, type, help] of families) {
    t.equal(e.types.get(name), type, `${name}: TYPE ${type}`);
    t.equal(e.helps.get(name), help, `${name}: HELP`);
  }
  t.equal(sum(e, 'switchyard_requests_total', { model: 'open-model', status: '200' }), n, 'every served request counted once');
  t.ok(
    e.samples.filter((s) => s.name === 'switchyard_requests_total' && s.labels.status === '200').every((s) => ['e0', 'e1'].includes(s.labels.endpoint!)),
    'served requests carry their endpoint',
  );
  t.equal(metric(e, 'switchyard_requests_total', { model: '', endpoint: '', status: '404' }), 2, 'the unknown model and the unknown path, under model=""');
  t.equal(metric(e, 'switchyard_routing_decision_seconds_count'), n, 'one routing decision per served request');
  t.equal(sum(e, 'switchyard_upstream_ttft_seconds_count'), n, 'one TTFT per served request');
  checkHistogram(t, e, 'switchyard_routing_decision_seconds');
  checkHistogram(t, e, 'switchyard_upstream_ttft_seconds');
  t.equal(
    e.samples.filter((s) => s.name === 'switchyard_routing_decision_seconds_bucket').map((s) => s.labels.le).join(' '),
    '0.000005 0.00001 0.000025 0.00005 0.0001 0.00025 0.0005 0.001 0.005 0.01 +Inf',
    'decision buckets unchanged',
  );
  t.ok(/^switchyard_upstream_ttft_seconds_bucket\{endpoint="e0",le="0.001"\} \d+$/m.test(text), 'labels in the order they had (le last)');
  for (const ep of ['e0', 'e1']) {
    t.equal(metric(e, 'switchyard_endpoint_in_flight', { endpoint: ep }), 0);
    t.equal(metric(e, 'switchyard_endpoint_ready', { endpoint: ep }), 1);
  }
  const blocks = metric(e, 'switchyard_prefix_blocks_total');
  const matched = metric(e, 'switchyard_prefix_matched_blocks_total');
  t.ok(blocks > 0, 'prompt blocks hashed');
  t.equal(metric(e, 'switchyard_prefix_match_ratio'), matched / blocks);
  t.equal(metric(e, 'switchyard_upstream_retries_total'), 0);
  t.equal(metric(e, 'switchyard_relay_pauses_total'), 0);
  t.notOk(e.samples.some((s) => s.name === 'switchyard_rejected_total'), 'no rejection yet, no series');

  // a second router in the same process has a registry of its own
  const cfg = validateConfig(
    { apiVersion: API_VERSION, kind: 'Router', pools: [{ name: 'p', models: ['open-model'], endpoints: [{ name: 'solo', url: fleet.urls[0] }] }], logging: { level: 'silent' } },
    validatePlugin,
  );
  const other = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => other.close(200));
  t.not(other.core.metrics.registry, router.core.metrics.registry);
  const e2 = parseProm(await (await fetch(`${other.url}/metrics`)).text());
  t.equal(sum(e2, 'switchyard_requests_total'), 0, "the other router's counts are its own");
  t.equal(metric(e2, 'switchyard_endpoint_in_flight', { endpoint: 'solo' }), 0);
  t.ok(e2.types.has('process_cpu_user_seconds_total'), 'and it has the default metrics too');
  const again = parseProm(await (await fetch(`${url}/metrics`)).text());
  t.equal(sum(again, 'switchyard_requests_total', { model: 'open-model', status: '200' }), n, 'the first router still counts its own');
});

t.test("/metrics: a gate's families join the registry; a client gone while it renders; a failing collector is a 500", async (t) => {
  const fleet = await startFleet(1, { timeScale: 0 });
  t.teardown(() => fleet.close());
  const cfg = validateConfig(
    { apiVersion: API_VERSION, kind: 'Router', pools: [{ name: 'p', models: ['open-model'], endpoints: [{ name: 'e0', url: fleet.urls[0] }] }], logging: { level: 'silent' } },
    validatePlugin,
  );
  let hold: Promise<void> | null = null;
  let entered = 0;
  let fail = false;
  // a gate of this test (admits everything) whose one metric renders asynchronously
  const gate: AdmissionGate = {
    headerNames: [],
    admit: () => ({ admitted: true, ticket: null }),
    release: () => {},
    registerMetrics(registry: Registry) {
      new Gauge({
        name: 'test_gate_slow',
        help: 'A gauge whose collect waits.',
        registers: [registry],
        async collect() {
          entered++;
          if (hold !== null) await hold;
          if (fail) throw new Error('collector broke');
          this.set(42);
        },
      });
    },
  };
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1', gate });
  t.teardown(() => router.close(200));
  const e = parseProm(await (await fetch(`${router.url}/metrics`)).text());
  t.equal(metric(e, 'test_gate_slow'), 42, "the gate's metric is on the router's /metrics");

  // a client that sends GET /metrics and leaves before the text is ready
  let release!: () => void;
  hold = new Promise<void>((r) => (release = r));
  const before = entered;
  const sock = connect(router.port, '127.0.0.1');
  sock.on('error', () => {});
  await new Promise<void>((r) => sock.once('connect', () => r()));
  sock.write('GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n');
  t.ok(await until(() => entered > before), 'rendering began');
  sock.destroy();
  await sleep(50); // let the router see the close
  release();
  await sleep(20);
  hold = null;
  t.equal((await fetch(`${router.url}/healthz`)).status, 200, 'the router lives on (nothing was written to the gone response)');
  t.equal(metric(parseProm(await (await fetch(`${router.url}/metrics`)).text()), 'test_gate_slow'), 42);

  fail = true;
  const r = await fetch(`${router.url}/metrics`);
  t.equal(r.status, 500, 'a collector that throws: 500');
  t.match(await r.json(), { error: { message: 'metrics rendering failed' } });
});

t.test("the simulator's /metrics goes through prom-client and still parses into the router's EngineMetrics", async (t) => {
  const cases = [
    { engine: 'vllm' as const, legacy: false, usage: 'vllm:kv_cache_usage_perc' },
    { engine: 'vllm' as const, legacy: true, usage: 'vllm:gpu_cache_usage_perc' },
    { engine: 'sglang' as const, legacy: false, usage: 'sglang:token_usage' },
  ];
  for (const c of cases) {
    // one request at a time, slow decode: one running, two waiting while we scrape
    const e = await startEngine({ engine: c.engine, legacy: c.legacy, models: ['m'], maxNumSeqs: 1, itlMs: 200, kvCacheBlocks: 321, blockSize: 8 });
    t.teardown(() => e.close());
    const held = [0, 1, 2].map((i) => post(`${e.url}/v1/completions`, { prompt: `held ${i} `.repeat(20), max_tokens: 50 }).then((r) => r.arrayBuffer()));
    t.ok(await until(() => e.stats().running === 1 && e.stats().waiting === 2), `${c.engine}${c.legacy ? ' legacy' : ''}: load built`);
    const res = await fetch(`${e.url}/metrics`);
    t.equal(res.headers.get('content-type'), 'text/plain; version=0.0.4; charset=utf-8');
    const text = await res.text();
    const out: EngineMetrics = { waiting: -1, running: -1, kvUsage: -1, cacheBlocks: 0, cacheBlockTokens: 0, loraMax: 0, loraRunning: [], loraWaiting: [], loraBadSeries: 0 };
    t.ok(readEngineMetrics(text, out), 'load signals found');
    t.equal(out.running, 1);
    t.equal(out.waiting, 2);
    const ex = parseProm(text);
    t.equal(out.kvUsage, metric(ex, c.usage, { model_name: 'm' }));
    t.ok(out.kvUsage > 0 && out.kvUsage <= 1, 'KV usage in (0, 1]');
    t.equal(out.cacheBlocks, 321);
    t.equal(out.cacheBlockTokens, 8);
    // the router's parser and the tests' independent one read the same samples
    const mine = parsePrometheus(text);
    t.equal(mine.length, ex.samples.length, 'both parsers see every sample');
    t.ok(ex.samples.every((s) => s.labels.model_name === 'm'), 'every series carries model_name (no process metrics here)');
    if (c.engine === 'vllm') {
      t.equal(metric(ex, 'vllm:time_to_first_token_seconds_bucket', { le: '2560.0' }), metric(ex, 'vllm:time_to_first_token_seconds_count'), 'le as the Python client writes it');
      t.equal('engine' in ex.samples[0]!.labels, !c.legacy);
    }
    await e.close();
    await Promise.allSettled(held);
  }
});

t.test('a router scraping simulated engines reads their prom-client /metrics', async (t) => {
  const { router } = await startTestRouter(t, { n: 2, fleet: { timeScale: 0, kvCacheBlocks: 777, blockSize: 32 } });
  const eps = router.core.scheduler.endpoints.all;
  t.ok(await until(() => eps.every((ep) => ep.metricsAt > 0)), 'every endpoint scraped');
  for (const ep of eps) {
    t.equal(ep.metrics.cacheBlocks, 777);
    t.equal(ep.metrics.cacheBlockTokens, 32);
    t.equal(ep.metrics.waiting, 0);
    t.equal(ep.metrics.kvUsage, 0);
  }
});

t.test('newRegistry: default metrics shared, never the global registry', async (t) => {
  const a = newRegistry();
  const b = newRegistry();
  const c = newRegistry({ defaultMetrics: false });
  t.ok(a.getSingleMetric('process_cpu_user_seconds_total'));
  t.equal(a.getSingleMetric('process_cpu_user_seconds_total'), b.getSingleMetric('process_cpu_user_seconds_total'), 'one set of default metric objects per process');
  t.equal(c.getMetricsAsArray().length, 0);
  const { register } = await import('prom-client');
  t.equal(register.getSingleMetric('process_cpu_user_seconds_total'), undefined, "prom-client's global registry stays empty");
});
