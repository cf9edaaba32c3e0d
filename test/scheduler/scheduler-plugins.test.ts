// Edge cases of the scheduler's plugins found in review: round-robin across
// models, max-score ties with a configured epsilon, a `role` filter that
// validates but keeps nothing, complete() called twice, and the prefix-cache
// capacity of a scorer with its own block size. Real schedulers, no engines.
import t from 'tap';
import { createScheduler } from '../../src/scheduler/scheduler.js';
import { registry } from '../../src/scheduler/plugins/index.js';
import { EndpointSet } from '../../src/endpoints/endpoint.js';
import { ConfigError } from '../../src/errors.js';
import type { CycleContext } from '../../src/scheduler/types.js';

function lcg(seed: number) {
  let s = seed >>> 0;
  return () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32);
}
const ep = (name: string, port: number) => ({ name, url: `http://127.0.0.1:${port}` });

t.test('round-robin: each model cycles through its own endpoints when requests for two models alternate', async (t) => {
  const s = createScheduler(
    {
      pools: [
        { name: 'a', models: ['ma'], endpoints: [ep('a0', 10000), ep('a1', 10001)] },
        { name: 'b', models: ['mb'], endpoints: [ep('b0', 10002), ep('b1', 10003)] },
      ],
      scheduling: { picker: 'round-robin', scorers: [] },
    },
    { watch: false },
  );
  t.teardown(() => s.close());
  const seen: Record<string, string[]> = { ma: [], mb: [] };
  for (let i = 0; i < 8; i++) {
    for (const model of ['ma', 'mb']) {
      const d = s.pick({ model })!;
      seen[model].push(d.endpoint.name);
      s.complete(d, 'ok');
    }
  }
  t.same(seen.ma, ['a0', 'a1', 'a0', 'a1', 'a0', 'a1', 'a0', 'a1'], 'model ma alternates over a0, a1');
  t.same(seen.mb, ['b0', 'b1', 'b0', 'b1', 'b0', 'b1', 'b0', 'b1'], 'model mb alternates over b0, b1');
});

t.test('max-score with epsilon: picks only within epsilon of the highest total, and every such candidate', async (t) => {
  const set = new EndpointSet([{ name: 'p', engine: 'vllm', accelerator: 'nvidia', models: ['m'], endpoints: [0, 1, 2].map((i) => ({ ...ep(`e${i}`, 10000 + i), role: 'both' as const })) }]);
  const picker = registry.create('picker', 'max-score', { epsilon: 0.1 }, { endpoints: set, prefixBlockSize: 64, random: lcg(11) });
  const ctx: CycleContext = { request: { model: 'm' }, now: 0, promptBlocks: 0, prefixMatched: new Uint32Array(0), matchedBlocks: 0 };
  const cases: [number[], number[]][] = [
    [[0.55, 0.5, 0.62], [0, 2]], // 0.5 is 0.12 below the max
    [[0.5, 0.59, 0.68], [1, 2]], // 0.59 is within 0.1 of 0.68
    [[0.68, 0.59, 0.5], [0, 1]],
    [[0.3, 0.3, 0.3], [0, 1, 2]],
  ];
  for (const [scores, allowed] of cases) {
    const counts = [0, 0, 0];
    const sc = Float64Array.from(scores);
    for (let i = 0; i < 600; i++) counts[picker.pick(ctx, set.all, sc)]++;
    for (let i = 0; i < 3; i++) {
      if (allowed.includes(i)) t.ok(counts[i] > 600 / allowed.length / 2, `${scores}: index ${i} (within epsilon) picked ${counts[i]}/600`);
      else t.equal(counts[i], 0, `${scores}: index ${i} (more than epsilon below the max) never picked`);
    }
  }
});

t.test('role filter: an empty roles list is a config error, not a filter that keeps nothing', async (t) => {
  t.throws(
    () => createScheduler({ pools: [{ name: 'p', models: ['m'], endpoints: [ep('e0', 10000)] }], scheduling: { filters: ['model', { type: 'role', params: { roles: [] } }] } }, { watch: false }),
    ConfigError,
  );
});

t.test('two prefix-cache scorers are a config error (a decision carries one scorer\'s block counts)', async (t) => {
  const pools = [{ name: 'p', models: ['m'], endpoints: [ep('e0', 10000)] }];
  t.throws(
    () => createScheduler({ pools, scheduling: { scorers: [{ type: 'prefix-cache', weight: 2 }, 'queue', { type: 'prefix-cache', weight: 1, params: { blockSize: 128 } }] } }, { watch: false }),
    { name: 'ConfigError', message: /scheduling\.scorers\[2\]: at most one prefix-cache scorer/ },
  );
  t.doesNotThrow(() => createScheduler({ pools, scheduling: { scorers: [{ type: 'prefix-cache', weight: 3 }, 'queue'] } }, { watch: false }).close());
});

t.test('complete() called twice for one decision counts once', async (t) => {
  const s = createScheduler({ pools: [{ name: 'p', models: ['m'], endpoints: [ep('e0', 10000)] }], dataLayer: { breakerFailures: 2 } }, { watch: false });
  t.teardown(() => s.close());
  const e0 = s.endpoints.all[0];
  const a = s.pick({ model: 'm' })!;
  const b = s.pick({ model: 'm' })!;
  t.equal(e0.inFlight, 2);
  s.complete(a, 'failed');
  s.complete(a, 'failed');
  t.equal(e0.inFlight, 1, 'the other request is still in flight');
  t.equal(e0.consecutiveFailures, 1, 'one failure, not two');
  t.equal(e0.breakerOpenUntil, 0, 'the breaker (2 failures) stays closed');
  s.complete(b, 'aborted');
  s.complete(b, 'ok');
  t.equal(e0.inFlight, 0);
  t.equal(e0.consecutiveFailures, 1, 'the second complete of an aborted request does not count as a success either');
  // a Decision passed back to pick() as `out` is live again
  const c = s.pick({ model: 'm' }, null, a)!;
  t.equal(c, a);
  t.equal(e0.inFlight, 1);
  s.complete(c, 'ok');
  t.equal(e0.inFlight, 0);
  t.equal(e0.consecutiveFailures, 0);
});

t.test('prefix-cache with its own blockSize: a configured capacity (in prefixBlockSize blocks) is converted', async (t) => {
  // 64 blocks of 64 bytes = 4 KiB; with 256-byte blocks that is 16 blocks
  const s = createScheduler(
    {
      pools: [{ name: 'p', models: ['m'], endpoints: [{ ...ep('e0', 10000), capacity: { gpuBlocks: 64 } }] }],
      scheduling: { prefixBlockSize: 64, filters: ['model'], scorers: [{ type: 'prefix-cache', weight: 1, params: { blockSize: 256 } }] },
    },
    { watch: false },
  );
  t.teardown(() => s.close());
  const enc = new TextEncoder();
  // 4 KiB (16 blocks of 256 bytes) fits: a repeat matches it all
  const fits = enc.encode('f'.repeat(256 * 16));
  s.complete(s.pick({ model: 'm', prompt: fits })!, 'ok');
  const again = s.pick({ model: 'm', prompt: fits })!;
  t.equal(again.promptBlocks, 16);
  t.equal(again.matchedBlocks, 16, 'a 4 KiB prompt is held whole');
  s.complete(again, 'ok');
  // 8 KiB (32 blocks of 256 bytes) does not: the index cannot believe the endpoint holds it all
  const big = enc.encode('b'.repeat(256 * 32));
  s.complete(s.pick({ model: 'm', prompt: big })!, 'ok');
  const big2 = s.pick({ model: 'm', prompt: big })!;
  t.equal(big2.promptBlocks, 32);
  t.ok(big2.matchedBlocks < 32, `an 8 KiB prompt is not held whole (matched ${big2.matchedBlocks} of 32 blocks)`);
  s.complete(big2, 'ok');
});

t.test('prefix-cache: an engine-reported cache beyond the index limit is clamped, not a thrown RangeError', async (t) => {
  const s = createScheduler({ pools: [{ name: 'p', models: ['m'], endpoints: [ep('e0', 10000)] }], scheduling: { scorers: [{ type: 'prefix-cache', weight: 1 }] } }, { watch: false });
  t.teardown(() => s.close());
  const e0 = s.endpoints.all[0];
  e0.metrics.cacheBlocks = 1e12; // an exporter bug; thrown inside the data layer it lost the scrape's listeners
  e0.metrics.cacheBlockTokens = 16;
  t.doesNotThrow(() => s.onCapacity(e0));
});

t.test('running-requests scorer: fewest running requests (fresh metrics plus dispatches since the scrape) scores 1; stale metrics: in-flight', async (t) => {
  const set = new EndpointSet([{ name: 'p', engine: 'vllm', accelerator: 'nvidia', models: ['m'], endpoints: [0, 1, 2].map((i) => ({ ...ep(`e${i}`, 10000 + i), role: 'both' as const })) }]);
  const sc = registry.create('scorer', 'running-requests', {}, { endpoints: set, prefixBlockSize: 64, random: lcg(3) });
  const [a, b, c] = set.all;
  const now = 1000;
  for (const [e, running] of [[a!, 8], [b!, 2], [c!, 4]] as const) {
    e.metrics.running = running;
    e.metricsAt = now;
  }
  const ctx: CycleContext = { request: { model: 'm' }, now, promptBlocks: 0, prefixMatched: new Uint32Array(0), matchedBlocks: 0 };
  const score = (x: CycleContext) => [...sc.score(x, set.all).subarray(0, 3)];
  t.same(score(ctx), [0, 1, 2 / 3], 'fresh: min-max over running');
  // two dispatches to b since its scrape count as running there
  b!.onDispatch(now);
  b!.onDispatch(now);
  t.same(score(ctx), [0, 1, 1], 'dispatches since the scrape count (b: 2 + 2, c: 4, a: 8)');
  const stale = { ...ctx, now: now + 60_000 };
  t.same(score(stale), [1, 0, 1], 'stale: the router\'s in-flight count');
});
