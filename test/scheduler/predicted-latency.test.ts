// Predicted-latency scheduling: the pool's accelerator config, the online
// latency model (RLS), and the predicted-latency scorer over a real router in
// front of a fast and a slow simulated engine (SLO headers, metrics).
import t from 'tap';
import { API_VERSION, validateConfig } from '../../src/config/schema.js';
import { ConfigError } from '../../src/errors.js';
import { LatencyModel, Rls2, DEFAULT_LATENCY_PRIORS } from '../../src/endpoints/latency-model.js';
import { EndpointSet } from '../../src/endpoints/endpoint.js';
import { startEngine } from '../../src/sim/index.js';
import { startRouter } from '../../src/server/router.js';
import type { PredictedLatencyScorer } from '../../src/scheduler/plugins/predicted-latency-scorer.js';
import { validatePlugin } from '../support/router-util.js';
import { post } from '../support/sim-util.js';

const pool = (extra: Record<string, unknown>) => ({ name: 'p', models: ['m'], endpoints: [{ url: 'http://127.0.0.1:9001' }], ...extra });
const cfg = (pools: unknown[], scorers: unknown[] = []) =>
  validateConfig({ apiVersion: API_VERSION, kind: 'Router', pools, scheduling: { scorers }, logging: { level: 'silent' } }, validatePlugin);

t.test('pools: an unknown accelerator is a config error with its path; speed and cost override the profile', async (t) => {
  const err = (() => {
    try {
      cfg([pool({ accelerator: 'nvidia' }), { ...pool({ accelerator: 'quantum-9000' }), name: 'q', endpoints: [{ url: 'http://127.0.0.1:9002' }] }]);
    } catch (e) {
      return e;
    }
  })();
  t.ok(err instanceof ConfigError);
  t.match((err as ConfigError).issues, [{ path: 'pools[1].accelerator', message: /must be one of: .*nvidia-h100.*quantum-9000/ }]);
  t.throws(() => cfg([pool({ speed: { prefillCostFactor: 0 } })]), /pools\[0\]\.speed\.prefillCostFactor/);
  t.throws(() => cfg([pool({ speed: { fast: true } })]), /pools\[0\]\.speed/);
  t.throws(() => cfg([pool({ cost: -1 })]), /pools\[0\]\.cost/);
  const c = cfg([pool({ accelerator: 'nvidia-l4' }), { ...pool({ accelerator: 'nvidia-l4', speed: { decodeCostFactor: 2 }, cost: 0.5 }), name: 'q', endpoints: [{ url: 'http://127.0.0.1:9002' }] }]);
  const set = new EndpointSet(c.pools);
  t.match(set.all[0], { accelerator: 'nvidia-l4', prefillCostFactor: 3, decodeCostFactor: 3, cost: 0.25 }, 'the profile');
  t.match(set.all[1], { prefillCostFactor: 3, decodeCostFactor: 2, cost: 0.5 }, 'speed and cost win');
  t.throws(
    () => cfg([pool({})], [{ type: 'predicted-latency', params: { ttftMs: -5 } }]),
    /params\.ttftMs must be a number/,
  );
});

/** A seeded uniform random source. */
function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let x = Math.imul(s ^ (s >>> 15), 1 | s);
    x ^= x + Math.imul(x ^ (x >>> 7), 61 | x);
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296;
  };
}

t.test('RLS: learns intercept and slope from noisy data, shrugs off outliers, follows drift', async (t) => {
  const rand = rng(7);
  // a prior 3× off in both coefficients
  const m = new Rls2(15, 40, 225, 1600, 0.98);
  const truth = (x: number) => 5 + 12.5 * x;
  for (let i = 0; i < 400; i++) {
    const x = rand() * 20;
    let y = truth(x) * (1 + (rand() - 0.5) * 0.2); // ±10 % noise
    if (i % 25 === 0) y += 2000; // an outlier now and then (a GC pause)
    m.update(x, y);
  }
  t.ok(Math.abs(m.b - 12.5) / 12.5 < 0.1, `slope ${m.b.toFixed(2)} ≈ 12.5`);
  t.ok(Math.abs(m.predict(10) - truth(10)) / truth(10) < 0.1, `prediction at x=10: ${m.predict(10).toFixed(1)} ≈ ${truth(10)}`);
  // the engine becomes 3× slower (throttled): followed within ~100 observations
  for (let i = 0; i < 150; i++) {
    const x = rand() * 20;
    m.update(x, 3 * truth(x) * (1 + (rand() - 0.5) * 0.2));
  }
  t.ok(Math.abs(m.predict(10) - 3 * truth(10)) / (3 * truth(10)) < 0.1, `after drift: ${m.predict(10).toFixed(1)} ≈ ${3 * truth(10)}`);
  // an idle endpoint sees the same feature again and again: no windup, no swing at the next different one
  for (let i = 0; i < 2000; i++) m.update(1, 3 * truth(1));
  t.ok(Math.abs(m.predict(10) - 3 * truth(10)) / (3 * truth(10)) < 0.15, `no windup: ${m.predict(10).toFixed(1)}`);
  // garbage observations are ignored
  m.update(1, NaN);
  m.update(NaN, 1);
  m.update(1, -5);
  t.ok(Number.isFinite(m.a) && Number.isFinite(m.b));
});

t.test('the model is seeded from the cost factors and counts pending prefill work', async (t) => {
  const fast = new LatencyModel(DEFAULT_LATENCY_PRIORS, 1, 1);
  const slow = new LatencyModel(DEFAULT_LATENCY_PRIORS, 3, 3);
  t.equal(slow.ttft.predict(4) / fast.ttft.predict(4), 3);
  t.equal(slow.tpot.predict(1) / fast.tpot.predict(1), 3);
  fast.dispatched(4000);
  fast.dispatched(2000);
  t.equal(fast.ahead(0), 6, 'KB queued ahead');
  t.equal(fast.ahead(2), 6 + (2 * fast.meanBytes) / 1000, 'and other clients\' waiting requests at the mean size');
  fast.prefilled(4000);
  t.equal(fast.pendingReqs, 1);
  t.equal(fast.ahead(0), 2);
});

t.test('Rls3 tells a serial engine (queue costs as much as the own prompt) from a parallel one (it costs a share)', async (t) => {
  let seed = 7;
  const rand = () => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32);
  // serial: 5 + 50·own + 50·ahead; parallel: 5 + 50·own + 10·ahead (a request ahead costs a fifth)
  for (const [name, c] of [['serial', 50], ['parallel', 10]] as const) {
    const m = new LatencyModel(DEFAULT_LATENCY_PRIORS, 1, 1); // prior b = c = 12.5: both wrong
    for (let i = 0; i < 150; i++) {
      const own = 0.2 + rand() * 4;
      const ahead = rand() < 0.3 ? 0 : rand() * 8;
      m.ttft.update(own, ahead, (5 + 50 * own + c * ahead) * (0.95 + 0.1 * rand()));
    }
    t.ok(Math.abs(m.ttft.b - 50) < 10, `${name}: own ${m.ttft.b.toFixed(1)} ms/KB ≈ 50`);
    t.ok(Math.abs(m.ttft.c - c) < 0.3 * c + 3, `${name}: queue ${m.ttft.c.toFixed(1)} ms/KB ≈ ${c}`);
    const err = Math.abs(m.ttft.predict(2, 4) - (5 + 100 + 4 * c)) / (5 + 100 + 4 * c);
    t.ok(err < 0.12, `${name}: prediction at 2 KB own, 4 KB ahead within 12 % (${(err * 100).toFixed(1)} %)`);
  }
});

async function mixedRouter(t: Tap.Test, params: Record<string, unknown>, flowControl?: unknown) {
  const base = { timeScale: 1, prefillOverheadMs: 2, prefillUsPerToken: 200, itlMs: 4, decodeSlowdown: 0.01 };
  const fast = await startEngine({ ...base, accelerator: 'sim-fast' });
  const slow = await startEngine({ ...base, accelerator: 'sim-slow' });
  // priors that know the simulator's reference costs (200 µs per 4-byte token = 50 ms per KB)
  const config = validateConfig(
    {
      apiVersion: API_VERSION,
      kind: 'Router',
      pools: [
        { name: 'fast', accelerator: 'sim-fast', models: ['open-model'], endpoints: [{ name: 'fast', url: fast.url }] },
        { name: 'slow', accelerator: 'sim-slow', models: ['open-model'], endpoints: [{ name: 'slow', url: slow.url }] },
      ],
      scheduling: { scorers: [{ type: 'predicted-latency', params: { prefillMsPerKB: 50, itlMs: 4, ttftBaseMs: 2, ...params } }] },
      ...(flowControl ? { flowControl } : {}),
      logging: { level: 'silent' },
    },
    validatePlugin,
  );
  const router = await startRouter(config, { port: 0, host: '127.0.0.1' });
  t.teardown(async () => {
    await router.close(200);
    await Promise.all([fast.close(), slow.close()]);
  });
  const scorer = router.core.scheduler.scorers[0] as PredictedLatencyScorer;
  return { router, url: router.url, scorer, set: router.core.endpoints };
}

t.test('over a fast and a slow engine: learns both, meets a TTFT SLO on the cheap one when it can, rejects bad SLO headers', async (t) => {
  const { url, scorer, set, router } = await mixedRouter(t, {});
  const body = (i: number, kb: number) => ({ model: 'open-model', prompt: `${i} `.repeat(kb * 500), max_tokens: 6, stream: true });

  // bad objectives: 400 naming the header, before anything is dispatched
  for (const [h, v] of [['x-slo-ttft-ms', 'soon'], ['x-slo-tpot-ms', '-3'], ['x-slo-ttft-ms', '0']]) {
    const r = await post(url, '/v1/completions', body(0, 1), { [h]: v });
    t.equal(r.status, 400, `${h}: ${v}`);
    t.match(JSON.parse(r.body), { error: { param: h, message: new RegExp(`${h} must be a positive number`) } });
  }
  t.equal(set.all[0].dispatched + set.all[1].dispatched, 0, 'nothing dispatched');

  // no objective: the fastest predicted (the fast engine while idle)
  const r0 = await post(url, '/v1/completions', body(1, 2));
  t.equal(r0.status, 200);
  t.equal(r0.headers['x-switchyard-endpoint'], 'fast');

  // a loose TTFT objective the slow (cheap) engine meets: it goes there
  const loose = await post(url, '/v1/completions', body(2, 2), { 'x-slo-ttft-ms': '5000' });
  t.equal(loose.headers['x-switchyard-endpoint'], 'slow', 'the cheapest endpoint that meets it');
  // a tight one only the fast engine meets (4 KB: ~200 ms fast, ~600 ms slow)
  const tight = await post(url, '/v1/completions', body(3, 4), { 'x-slo-ttft-ms': '450' });
  t.equal(tight.headers['x-switchyard-endpoint'], 'fast', 'only the fast one meets it');
  // one nobody can meet: the fastest, counted as a predicted miss
  const impossible = await post(url, '/v1/completions', body(4, 8), { 'x-slo-ttft-ms': '1' });
  t.equal(impossible.headers['x-switchyard-endpoint'], 'fast');
  t.equal(scorer.sloCounts().predictedMiss, 1);
  t.ok(scorer.sloCounts().ttftMissed >= 1, 'and it did miss');
  t.equal(scorer.sloCounts().ttftMet + scorer.sloCounts().ttftMissed, 3, 'each streamed request with an objective counted once');

  // learning: streamed requests of several sizes at each endpoint, one at a time
  for (let i = 0; i < 12; i++) {
    const kb = 1 + (i % 4);
    await post(url, '/v1/completions', body(100 + i, kb), { 'x-slo-ttft-ms': '100000' }); // slow (cheap) meets it
    await post(url, '/v1/completions', body(200 + i, kb)); // fast (fastest)
  }
  const [f, s] = [set.all[0].latency!, set.all[1].latency!];
  t.ok(f.ttft.n >= 10 && s.ttft.n >= 10, `observed ${f.ttft.n} and ${s.ttft.n} first tokens`);
  const ratio = s.ttft.predict(3) / f.ttft.predict(3);
  t.ok(ratio > 2 && ratio < 4.5, `slow / fast predicted TTFT at 3 KB: ${ratio.toFixed(2)} ≈ 3`);
  t.ok(s.tpot.predict(1) / f.tpot.predict(1) > 2, `slow / fast TPOT ${(s.tpot.predict(1) / f.tpot.predict(1)).toFixed(2)} ≈ 3`);
  t.ok(f.ttftErr.medianApe() < 0.35, `fast TTFT median APE ${(f.ttftErr.medianApe() * 100).toFixed(1)} %`);
  t.equal(f.pendingBytes, 0, 'no pending work left behind');
  t.equal(s.pendingReqs, 0);

  const metrics = await (await fetch(`${url}/metrics`)).text();
  t.match(metrics, /switchyard_latency_ttft_error_ratio\{endpoint="fast"\} [0-9.]+/);
  t.match(metrics, /switchyard_latency_model\{endpoint="slow",coefficient="prefill_ms_per_kb"\} [0-9.]+/);
  t.match(metrics, /switchyard_slo_requests_total\{band="default",objective="ttft",outcome="met"\} \d+/);
  t.match(metrics, /switchyard_slo_predicted_miss_total\{band="default"\} 1/);
  t.ok(router.core.scheduler.latency);
});

t.test('non-streamed short answers train the TTFT model (total time less the predicted decode); long ones do not', async (t) => {
  const { url, set } = await mixedRouter(t, {});
  const fast = set.all[0].latency!;
  const body = (i: number, kb: number, tokens: number) => ({ model: 'open-model', prompt: `${i} `.repeat(kb * 500), max_tokens: tokens });
  const n0 = fast.ttft.n;
  for (let i = 0; i < 8; i++) t.equal((await post(url, '/v1/completions', body(i, 1 + (i % 4), 1))).status, 200);
  t.ok(fast.ttft.n - n0 >= 6, `${fast.ttft.n - n0} updates from 8 one-token answers`);
  t.ok(fast.ttftErr.count >= 6, 'and their prediction errors are counted (a one-token answer\'s whole time is its TTFT)');
  const metrics = await (await fetch(`${url}/metrics`)).text();
  t.match(metrics, /switchyard_latency_ttft_error_ratio\{endpoint="fast"\} [0-9.]+/, 'per-endpoint prediction error in /metrics without a streamed request');
  t.match(metrics, /switchyard_latency_margin_ratio [0-9.]+/);
  t.equal(fast.tpot.n, 0, 'the TPOT model learns nothing from them');
  t.equal(fast.pendingBytes, 0, 'no pending work left behind');
  const n1 = fast.ttft.n;
  for (let i = 0; i < 4; i++) await post(url, '/v1/completions', body(50 + i, 1, 200));
  t.equal(fast.ttft.n, n1, 'long answers (decode dominates the total) are not used');
});

t.test('band defaults: a flow-control band carries its objective; headers override it', async (t) => {
  const { url, scorer } = await mixedRouter(
    t,
    { bands: { premium: { ttftMs: 150 }, standard: { ttftMs: 60000 } } },
    { enabled: true, bands: ['premium', 'standard'], defaultBand: 'standard', trustHeaders: true, flows: [{ id: 'tenant:acme', priority: 'premium' }] },
  );
  const body = (i: number) => ({ model: 'open-model', prompt: `${i} `.repeat(1000), max_tokens: 3, stream: true });
  const std = await post(url, '/v1/completions', body(1));
  t.equal(std.headers['x-switchyard-endpoint'], 'slow', 'standard: a loose objective, the cheap engine');
  const prem = await post(url, '/v1/completions', body(2), { 'x-tenant-id': 'acme' });
  t.equal(prem.headers['x-switchyard-endpoint'], 'fast', 'premium: only the fast engine meets 150 ms');
  const over = await post(url, '/v1/completions', body(3), { 'x-tenant-id': 'acme', 'x-slo-ttft-ms': '100000' });
  t.equal(over.headers['x-switchyard-endpoint'], 'slow', 'the header overrides the band default');
  t.equal(scorer.sloCounts('premium').ttftMet + scorer.sloCounts('premium').ttftMissed, 2);
  t.equal(scorer.sloCounts('standard').ttftMet, 1);
});

t.test('the margin grows with the measured miss rate; past the cliff the default load score is blended in', async (t) => {
  // priors far too optimistic (a thousandth of the real cost): its first predictions meet 60 ms, the engines take ~100–600 ms
  const { url, scorer } = await mixedRouter(t, { prefillMsPerKB: 0.05, ttftBaseMs: 0.01 });
  t.equal(scorer.margin, 0.2, 'the configured margin to start with');
  const body = (i: number) => ({ model: 'open-model', prompt: `${i} `.repeat(1000), max_tokens: 2, stream: true });
  for (let i = 0; i < 10; i++) t.equal((await post(url, '/v1/completions', body(i), { 'x-slo-ttft-ms': '60' })).status, 200);
  t.ok(scorer.margin > 0.25, `margin ${scorer.margin.toFixed(3)} grew with the misses of requests predicted to meet`);
  t.ok(scorer.margin <= 0.6, 'bounded');
  t.ok(scorer.missRate > 0.15, `recent miss rate ${scorer.missRate.toFixed(3)}: the default load score is blended in`);
  const metrics = await (await fetch(`${url}/metrics`)).text();
  t.match(metrics, /switchyard_slo_recent_miss_ratio 0\.\d+/);
});
