// The scheduler as a library (no HTTP server of ours): createScheduler, the
// built-in filters, scorers and pickers, stale-metrics fallback, the circuit
// breaker, and the data layer against real simulated engines.
import t from 'tap';
import { createScheduler, type Scheduler } from '../../src/scheduler/scheduler.js';
import { startFleet } from '../../src/sim/index.js';
import { ConfigError } from '../../src/errors.js';
import { readEngineMetrics, indexBlocksFor, type EngineMetrics } from '../../src/endpoints/engine-metrics.js';
import { parseLabels, parsePrometheus } from '../../src/endpoints/prom-parse.js';

const enc = new TextEncoder();
function pools(n: number, extra: Record<string, unknown> = {}) {
  return [
    {
      name: 'p',
      models: ['m'],
      endpoints: Array.from({ length: n }, (_, i) => ({ name: `e${i}`, url: `http://127.0.0.1:${10000 + i}`, ...extra })),
    },
  ];
}
function lcg(seed: number) {
  let s = seed >>> 0;
  return () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32);
}
const longPrompt = (tag: string) => enc.encode(`${tag} `.repeat(200));

function pickName(s: Scheduler, model: string, prompt?: Uint8Array): string | null {
  const d = s.pick({ model, prompt });
  if (!d) return null;
  s.complete(d, 'ok');
  return d.endpoint.name;
}

t.test('prefix-cache scorer: the same prompt returns to its endpoint, a new one goes elsewhere under load', async (t) => {
  const s = createScheduler({ pools: pools(4) }, { watch: false, random: lcg(1) });
  t.teardown(() => s.close());
  const d1 = s.pick({ model: 'm', prompt: longPrompt('alpha') })!;
  t.ok(d1, 'picked');
  t.equal(d1.matchedBlocks, 0, 'nothing cached yet');
  t.ok(d1.promptBlocks > 10, `prompt hashed into ${d1.promptBlocks} blocks`);
  s.complete(d1, 'ok');
  for (let i = 0; i < 10; i++) {
    const d = s.pick({ model: 'm', prompt: longPrompt('alpha') })!;
    t.equal(d.endpoint, d1.endpoint, `repeat ${i} lands on ${d1.endpoint.name}`);
    t.equal(d.matchedBlocks, d.promptBlocks, 'fully matched');
    s.complete(d, 'ok');
  }
  // a different model does not share the prefix (per-model seed)
  const s2 = createScheduler({ pools: [{ name: 'p', models: ['m', 'n'], endpoints: pools(4)[0].endpoints }] }, { watch: false });
  t.teardown(() => s2.close());
  const a = s2.pick({ model: 'm', prompt: longPrompt('beta') })!;
  const b = s2.pick({ model: 'n', prompt: longPrompt('beta') })!;
  t.equal(b.matchedBlocks, 0, 'other model: no match');
  s2.complete(a, 'ok');
  s2.complete(b, 'ok');
});

t.test('prefix-cache scorer: a saturated holder loses its affinity', async (t) => {
  const s = createScheduler({ pools: pools(2), scheduling: { scorers: [{ type: 'prefix-cache', weight: 3, params: { saturatedQueue: 4 } }, { type: 'queue', weight: 2 }] } }, { watch: false, random: lcg(9) });
  t.teardown(() => s.close());
  const first = s.pick({ model: 'm', prompt: longPrompt('hot') })!;
  s.complete(first, 'ok');
  const holder = first.endpoint;
  const other = s.endpoints.all.find((e) => e !== holder)!;
  // hold 3 requests on the holder: queue 3 < 4, affinity kept
  const held = [];
  for (let i = 0; i < 3; i++) {
    const d = s.pick({ model: 'm', prompt: longPrompt('hot') })!;
    t.equal(d.endpoint, holder, `request ${i} stays on the holder`);
    held.push(d);
  }
  const d4 = s.pick({ model: 'm', prompt: longPrompt('hot') })!;
  t.equal(d4.endpoint, holder, 'queue 3: still the holder');
  held.push(d4);
  const d5 = s.pick({ model: 'm', prompt: longPrompt('hot') })!;
  t.equal(d5.endpoint, other, 'queue 4 = saturated: spills to the other replica');
  held.push(d5);
  for (const d of held) s.complete(d, 'ok');
});

t.test('prefix-cache scorer: when every replica is backed up, affinity holds', async (t) => {
  const s = createScheduler({ pools: pools(2), scheduling: { scorers: [{ type: 'prefix-cache', weight: 3, params: { saturatedQueue: 4 } }, { type: 'queue', weight: 2 }] } }, { watch: false, random: lcg(5) });
  t.teardown(() => s.close());
  const first = s.pick({ model: 'm', prompt: longPrompt('hot') })!;
  s.complete(first, 'ok');
  const holder = first.endpoint;
  const other = s.endpoints.all.find((e) => e !== holder)!;
  const held: NonNullable<ReturnType<typeof s.pick>>[] = [];
  const count = (ep: typeof holder) => held.filter((d) => d.endpoint === ep).length;
  // back both replicas up with unrelated requests: 6 or more in flight each
  // (stop when the holder has exactly one more than the other: the plain queue scorer would then prefer the other)
  for (let i = 0; !(count(other) >= 6 && count(holder) === count(other) + 1) && i < 200; i++) held.push(s.pick({ model: 'm', prompt: longPrompt('cold' + i) })!);
  t.ok(count(other) >= 6 && count(holder) === count(other) + 1, `in flight: holder ${count(holder)}, other ${count(other)}`);
  // the holder's queue is over saturatedQueue in absolute terms, but not 4 longer than the other's: it keeps the prefix
  const d = s.pick({ model: 'm', prompt: longPrompt('hot') })!;
  t.equal(d.endpoint, holder, 'no spill while the other replica is as busy');
  held.push(d);
  for (const x of held) s.complete(x, 'ok');
});

t.test('stale metrics: the queue scorer falls back to the router in-flight count', async (t) => {
  const s = createScheduler({ pools: pools(3), scheduling: { scorers: [{ type: 'queue', weight: 1 }] } }, { watch: false, random: lcg(2) });
  t.teardown(() => s.close());
  // no metrics ever scraped: in-flight decides; hold requests to build load
  const held = [];
  for (let i = 0; i < 9; i++) held.push(s.pick({ model: 'm' })!);
  const counts = s.endpoints.all.map((e) => e.inFlight);
  t.same(counts, [3, 3, 3], `balanced by in-flight: ${counts}`);
  for (const d of held) s.complete(d, 'ok');
  t.same(s.endpoints.all.map((e) => e.inFlight), [0, 0, 0], 'released');
  // fresh metrics: the engine's waiting queue decides
  const now = performance.now();
  s.endpoints.all.forEach((e, i) => {
    e.metricsAt = now;
    e.metrics.waiting = [5, 0, 7][i];
  });
  for (let i = 0; i < 5; i++) t.equal(pickName(s, 'm'), 'e1', 'shortest engine queue');
});

t.test('kv-cache-utilization scorer prefers free cache', async (t) => {
  const s = createScheduler({ pools: pools(3), scheduling: { scorers: [{ type: 'kv-cache-utilization', weight: 1 }] } }, { watch: false });
  t.teardown(() => s.close());
  const now = performance.now();
  s.endpoints.all.forEach((e, i) => {
    e.metricsAt = now;
    e.metrics.kvUsage = [0.9, 0.5, 0.2][i];
  });
  t.equal(pickName(s, 'm'), 'e2');
});

t.test('pickers: round-robin cycles, least-request balances, weighted-random follows scores', async (t) => {
  const rr = createScheduler({ pools: pools(3), scheduling: { picker: 'round-robin', scorers: [] } }, { watch: false });
  t.teardown(() => rr.close());
  t.same([0, 1, 2, 3, 4, 5].map(() => pickName(rr, 'm')), ['e0', 'e1', 'e2', 'e0', 'e1', 'e2']);
  const lr = createScheduler({ pools: pools(3), scheduling: { picker: 'least-request', scorers: [] } }, { watch: false, random: lcg(3) });
  t.teardown(() => lr.close());
  for (let i = 0; i < 6; i++) lr.pick({ model: 'm' });
  t.same(lr.endpoints.all.map((e) => e.inFlight), [2, 2, 2]);
  const wr = createScheduler(
    { pools: pools(2), scheduling: { picker: 'weighted-random', scorers: [{ type: 'kv-cache-utilization', weight: 1 }] } },
    { watch: false, random: lcg(4) },
  );
  t.teardown(() => wr.close());
  const now = performance.now();
  wr.endpoints.all.forEach((e, i) => {
    e.metricsAt = now;
    e.metrics.kvUsage = [0.25, 0.75][i]; // scores 0.75 vs 0.25
  });
  let e0 = 0;
  for (let i = 0; i < 2000; i++) if (pickName(wr, 'm') === 'e0') e0++;
  t.ok(e0 > 1350 && e0 < 1650, `e0 picked ${e0}/2000 (expected ~1500)`);
  const ms = createScheduler({ pools: pools(4), scheduling: { scorers: [] } }, { watch: false, random: lcg(5) });
  t.teardown(() => ms.close());
  const seen = new Set<string>();
  for (let i = 0; i < 100; i++) seen.add(pickName(ms, 'm')!);
  t.equal(seen.size, 4, 'max-score breaks ties at random');
});

t.test('filters: model, role, health and the circuit breaker', async (t) => {
  const s = createScheduler(
    {
      pools: [
        { name: 'a', models: ['m'], endpoints: [{ name: 'pf', url: 'http://127.0.0.1:1', role: 'prefill' }, { name: 'dc', url: 'http://127.0.0.1:2', role: 'decode' }] },
        { name: 'b', models: ['m', 'x'], endpoints: [{ name: 'both', url: 'http://127.0.0.1:3' }] },
      ],
      dataLayer: { breakerFailures: 2, breakerCooldownMs: 50 },
    },
    { watch: false },
  );
  t.teardown(() => s.close());
  t.equal(pickName(s, 'unknown'), null, 'unknown model: null');
  t.throws(() => s.pickOrThrow({ model: 'unknown' }), { code: 'SWY_ERR_UNKNOWN_MODEL' });
  t.notOk(s.hasModel('unknown'));
  t.equal(pickName(s, 'x'), 'both');
  for (let i = 0; i < 5; i++) t.equal(pickName(s, 'm'), 'both', 'role both preferred; prefill never');
  const both = s.endpoints.byName('both')!;
  both.health = 'down';
  t.equal(pickName(s, 'm'), 'dc', 'unhealthy filtered; decode endpoint serves plain requests');
  t.throws(() => s.pickOrThrow({ model: 'x' }), { code: 'SWY_ERR_NO_ENDPOINT' }, 'every candidate filtered');
  both.health = 'up';
  // breaker: two failures open it
  for (let i = 0; i < 2; i++) {
    const d = s.pick({ model: 'm' })!;
    t.equal(d.endpoint.name, 'both');
    s.complete(d, 'failed');
  }
  t.equal(pickName(s, 'm'), 'dc', 'breaker open: skipped');
  await new Promise((r) => setTimeout(r, 70));
  const trial = s.pick({ model: 'm' })!;
  t.equal(trial.endpoint.name, 'both', 'half-open after the cooldown: one trial');
  t.equal(pickName(s, 'm'), 'dc', 'only one trial at a time');
  s.complete(trial, 'ok');
  t.equal(pickName(s, 'm'), 'both', 'closed again after a success');
  // exclusion (retries)
  const d = s.pick({ model: 'm' }, [both])!;
  t.equal(d.endpoint.name, 'dc');
  s.complete(d, 'aborted');
  t.equal(s.endpoints.byName('dc')!.inFlight, 0, 'aborted releases in-flight');
});

t.test('circuit breaker: only the half-open trial closes or reopens it; older requests ending meanwhile do not', async (t) => {
  const s = createScheduler({ pools: pools(1), dataLayer: { breakerFailures: 2, breakerCooldownMs: 50 } }, { watch: false });
  t.teardown(() => s.close());
  const ep = s.endpoints.all[0]!;
  const older = [s.pick({ model: 'm' })!, s.pick({ model: 'm' })!]; // still in flight when the breaker opens
  for (let i = 0; i < 2; i++) s.complete(s.pick({ model: 'm' })!, 'failed');
  t.equal(pickName(s, 'm'), null, 'two failures: open');
  s.complete(older[0]!, 'ok');
  t.equal(pickName(s, 'm'), null, 'an older request answering does not close it before the cooldown');
  await new Promise((r) => setTimeout(r, 70));
  const trial = s.pick({ model: 'm' })!;
  t.equal(trial.endpoint, ep, 'half-open after the cooldown: the trial');
  t.equal(pickName(s, 'm'), null, 'one trial at a time');
  s.complete(older[1]!, 'aborted');
  t.equal(pickName(s, 'm'), null, 'an older request aborted meanwhile does not let a second trial through');
  s.complete(trial, 'failed');
  t.equal(pickName(s, 'm'), null, 'the trial failed: open for another cooldown');
  await new Promise((r) => setTimeout(r, 70));
  const trial2 = s.pick({ model: 'm' })!;
  t.equal(trial2.endpoint, ep, 'the next trial after that cooldown');
  s.complete(trial2, 'aborted');
  const trial3 = s.pick({ model: 'm' })!;
  t.equal(trial3.endpoint, ep, 'an aborted trial lets the next request be the trial');
  t.equal(pickName(s, 'm'), null, 'and only that one');
  s.complete(trial3, 'ok');
  const after = s.pick({ model: 'm' })!;
  t.equal(after.endpoint, ep, 'the trial succeeded: closed');
  s.complete(after, 'ok');
  t.equal(ep.inFlight, 0, 'every pick released');
});

t.test('createScheduler validates like a config file', async (t) => {
  t.throws(() => createScheduler({ pools: pools(1), scheduling: { scorers: [{ type: 'nope' }] } }, { watch: false }), ConfigError);
  t.throws(() => createScheduler({ pools: [] }, { watch: false }), { message: /pools: must list at least one pool/ });
});

t.test('data layer against real engines: metrics, capacity from cache_config_info, health', async (t) => {
  for (const engine of ['vllm', 'sglang'] as const) {
    const fleet = await startFleet(2, { engine, timeScale: 1, itlMs: 50, kvCacheBlocks: 1000, blockSize: 16, maxNumSeqs: 1 });
    const s = createScheduler({
      pools: [{ name: 'p', engine, models: ['open-model'], endpoints: fleet.urls.map((url, i) => ({ name: `e${i}`, url })) }],
      dataLayer: { scrapeIntervalMs: 20, healthIntervalMs: 50 },
    });
    await s.ready;
    const e0 = s.endpoints.all[0];
    t.equal(e0.health, 'up', `${engine}: health up`);
    t.ok(e0.fresh(performance.now()), `${engine}: metrics fresh`);
    t.equal(e0.metrics.cacheBlocks, 1000, `${engine}: cache blocks from cache_config_info`);
    t.equal(e0.metrics.cacheBlockTokens, 16);
    // load the engine: 3 requests at maxNumSeqs 1 → 2 waiting
    const reqs = Array.from({ length: 3 }, () =>
      fetch(`${fleet.urls[0]}/v1/completions`, { method: 'POST', body: JSON.stringify({ model: 'open-model', prompt: 'hi', max_tokens: 8 }) }).then((r) => r.text()),
    );
    const end = Date.now() + 2000;
    while (e0.metrics.waiting < 2 && Date.now() < end) await new Promise((r) => setTimeout(r, 10));
    t.equal(e0.metrics.waiting, 2, `${engine}: waiting queue scraped`);
    t.equal(e0.metrics.running, 1, `${engine}: running scraped`);
    fleet.engines[1].setHealthy(false);
    const end2 = Date.now() + 2000;
    while (s.endpoints.all[1].health !== 'down' && Date.now() < end2) await new Promise((r) => setTimeout(r, 10));
    t.equal(s.endpoints.all[1].health, 'down', `${engine}: /health 503 marks the endpoint down`);
    await Promise.all(reqs);
    await s.close();
    await fleet.close();
  }
});

t.test('Prometheus text parser and engine metrics (vLLM current and old names, SGLang)', async (t) => {
  const text = [
    '# HELP vllm:num_requests_waiting Number of requests waiting.',
    '# TYPE vllm:num_requests_waiting gauge',
    'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0',
    'vllm:num_requests_waiting{engine="1",model_name="m"} 2',
    'vllm:num_requests_running{model_name="m"} 4',
    'vllm:gpu_cache_usage_perc{model_name="m"} 0.5',
    'vllm:cache_config_info{block_size="16",num_gpu_blocks="2048",weird="a\\"b,c}"} 1.0',
    'vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 10',
    'garbage line without value',
    '',
  ].join('\n');
  const m: EngineMetrics = { waiting: 0, running: 0, kvUsage: NaN, cacheBlocks: 0, cacheBlockTokens: 0, loraMax: 0, loraRunning: [], loraWaiting: [], loraBadSeries: 0 };
  t.ok(readEngineMetrics(text, m));
  t.same(m, { waiting: 5, running: 4, kvUsage: 0.5, cacheBlocks: 2048, cacheBlockTokens: 16, loraMax: 0, loraRunning: [], loraWaiting: [], loraBadSeries: 0 }, 'summed over engine ranks; old KV name');
  const sg = 'sglang:num_queue_reqs{model_name="m"} 7\nsglang:num_running_reqs{model_name="m"} 2\nsglang:token_usage{model_name="m"} 0.25\nsglang:cache_config_info{num_pages="100",page_size="1"} 1\n';
  t.ok(readEngineMetrics(sg, m));
  t.same(m, { waiting: 7, running: 2, kvUsage: 0.25, cacheBlocks: 100, cacheBlockTokens: 1, loraMax: 0, loraRunning: [], loraWaiting: [], loraBadSeries: 0 });
  // vllm:lora_requests_info: the newest series (its value is a timestamp) is the state; a series with a bad label is counted and ignored
  const lora = [
    'vllm:num_requests_running{model_name="m"} 1',
    'vllm:lora_requests_info{max_lora="4",model_name="m",running_lora_adapters="a,b",waiting_lora_adapters=""} 1700000000.5',
    'vllm:lora_requests_info{max_lora="4",model_name="m",running_lora_adapters="c",waiting_lora_adapters="d"} 1700000009',
    'vllm:lora_requests_info{max_lora="many",model_name="m",running_lora_adapters="x",waiting_lora_adapters=""} 1700000099',
    'vllm:lora_requests_info{model_name="m",running="y"} 1700000099',
    '',
  ].join('\n');
  t.ok(readEngineMetrics(lora, m));
  t.match(m, { loraMax: 4, loraRunning: ['c'], loraWaiting: ['d'], loraBadSeries: 2 });
  t.notOk(readEngineMetrics('# nothing here\nfoo 1\n', m), 'no load signal found');
  t.same(parseLabels('a="x",b="y\\"z",c="1\\n2"'), { a: 'x', b: 'y"z', c: '1\n2' });
  const all = parsePrometheus('a 1\nb{x="1"} NaN\nc +Inf\nd -1e3 1700000000\n');
  t.same(all.map((s) => [s.name, s.value]), [['a', 1], ['b', NaN], ['c', Infinity], ['d', -1000]]);
  t.equal(indexBlocksFor(2048, 16, 64), 2048, '2048 blocks × 16 tokens × 4 bytes / 64-byte index blocks');
});

t.test('prefix-cache scorer: a failed dispatch forgets only the blocks it recorded', async (t) => {
  const s = createScheduler({ pools: pools(2), scheduling: { filters: ['model'], scorers: [{ type: 'prefix-cache', weight: 1 }] } }, { watch: false, random: lcg(4) });
  t.teardown(() => s.close());
  const base = longPrompt('shared');
  const longer = enc.encode(`${'shared '.repeat(200)}${'question '.repeat(100)}`);
  const d1 = s.pick({ model: 'm', prompt: base })!;
  const holder = d1.endpoint;
  s.complete(d1, 'ok', { model: 'm', prompt: base }); // an ok outcome never forgets, with or without the request
  const other = s.endpoints.all.find((e) => e !== holder)!;
  const d2 = s.pick({ model: 'm', prompt: longer }, [other])!;
  t.equal(d2.endpoint, holder);
  t.equal(d2.matchedBlocks, d1.promptBlocks, 'the longer prompt starts with the held blocks');
  t.ok(d2.promptBlocks > d2.matchedBlocks, 'and adds blocks of its own');
  s.complete(d2, 'failed', { model: 'm', prompt: longer });
  const d3 = s.pick({ model: 'm', prompt: longer }, [other])!;
  t.equal(d3.matchedBlocks, d1.promptBlocks, 'after the failure: the blocks held before remain, the new ones are gone');
  s.complete(d3, 'ok');
  const d4 = s.pick({ model: 'm', prompt: longer }, [other])!;
  t.equal(d4.matchedBlocks, d4.promptBlocks, 'a success records them all');
  s.complete(d4, 'ok');
});

t.test('fallbacks(): the other candidates of the last pick, best weighted score first, active only', async (t) => {
  const s = createScheduler({ pools: pools(4), scheduling: { scorers: [{ type: 'kv-cache-utilization', weight: 1 }] } }, { watch: false });
  t.teardown(() => s.close());
  const now = performance.now();
  s.endpoints.all.forEach((e, i) => {
    e.metricsAt = now;
    e.metrics.kvUsage = [0.5, 0.1, 0.9, 0.3][i];
  });
  const d = s.pick({ model: 'm' })!;
  t.equal(d.endpoint.name, 'e1', 'the freest cache');
  const out: import('../../src/endpoints/endpoint.js').Endpoint[] = [];
  t.same(s.fallbacks(d.endpoint, 2, out).map((e) => e.name), ['e3', 'e0'], 'then the next best two');
  t.same(s.fallbacks(d.endpoint, 7, out).map((e) => e.name), ['e3', 'e0', 'e2'], 'at most the candidates there are');
  t.same(s.fallbacks(d.endpoint, 0, out), [], 'none asked: none');
  s.complete(d, 'ok');
  // a draining endpoint is no fallback
  s.endpoints.startDrain(s.endpoints.byName('e3')!);
  const d2 = s.pick({ model: 'm' })!;
  t.same(s.fallbacks(d2.endpoint, 3, out).map((e) => e.name), ['e0', 'e2']);
  s.complete(d2, 'ok');
});
