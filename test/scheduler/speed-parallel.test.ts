// The speed model on an engine that prefills in parallel (issue 34, "mixed
// fleet"): bench/lib/parallel-engine.ts, an independent fake engine whose
// prefill runs in a batch up to its slots (a queued request slows this one by
// its share of the batch, not by its whole prefill), next to the simulator's
// serial prefill. With the router told nothing of their speeds, what it learns
// must order engines by their real cost on both models: a 3× slower engine's
// per-token cost about 3× a fast one's, equal engines close. A guard, not a
// fix's proof: the one-feature model (own + queued tokens) passes it at this
// load (bench/RESULTS.md, "2026-12-04 (#34 mixed fleet)": a two-feature model
// that learned the queued tokens' weight separately was tried and not kept).
// Real engines over loopback, the router in-process; the bounds are wide.
import t from 'tap';
import { ParallelEngine } from '../../bench/lib/parallel-engine.js';
import { startEngine } from '../../src/sim/index.js';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { startRouter } from '../../src/server/router.js';
import { validatePlugin } from '../support/router-util.js';
import { send } from '../support/sim-util.js';

type Router = Awaited<ReturnType<typeof startRouter>>;

/** Per prompt size (500, 3000 tokens), requests answered by each endpoint. */
type Placed = Map<number, Map<string, number>>;

async function learn(t: Tap.Test, urls: string[], requests: number, rate: number, placed: Placed = new Map()): Promise<Router> {
  const cfg = validateConfig(
    {
      apiVersion: API_VERSION,
      kind: 'Router',
      logging: { level: 'silent' },
      pools: [{ name: 'p', models: ['open-model'], endpoints: urls.map((url, i) => ({ name: `e${i}`, url })) }],
    },
    validatePlugin,
  );
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => router.close(200));
  // open loop, seeded: unique prompts, half 500 and half 3000 tokens (4 bytes a token), streamed
  let seed = 4242;
  const rand = () => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32);
  const pending: Promise<void>[] = [];
  for (let i = 0; i < requests; i++) {
    const tokens = rand() < 0.5 ? 500 : 3000;
    const prompt = `q${i} ${rand().toString(36)} `.padEnd(16, '.') + 'lorem ipsum '.repeat(Math.ceil((tokens * 4 - 16) / 12)).slice(0, tokens * 4 - 16);
    pending.push(
      send(router.url, 'POST', '/v1/completions', { model: 'open-model', prompt, max_tokens: 2, stream: true }).done.then((r) => {
        if (r.status !== 200) throw new Error(`status ${r.status}: ${r.body.slice(0, 200)}`);
        const by = placed.get(tokens) ?? placed.set(tokens, new Map()).get(tokens)!;
        const ep = String(r.headers['x-switchyard-endpoint']);
        by.set(ep, (by.get(ep) ?? 0) + 1);
      }),
    );
    await new Promise((r) => setTimeout(r, (-Math.log(1 - rand()) / rate) * 1000));
  }
  await Promise.all(pending);
  return router;
}

function learned(router: Router): number[] {
  return ['e0', 'e1', 'e2', 'e3'].map((n) => router.core.endpoints.byName(n)!.speed.msPerKTok());
}

t.test('parallel-prefill engines: a 3× slower engine is learned about 3× slower, equal engines close', async (t) => {
  // two fast, two 3× slower; 100 µs a prompt token on a fast one: 55 / 305 ms alone for 500 / 3000 tokens
  const engines = [1, 1, 3, 3].map((f) => new ParallelEngine({ port: 0, costFactor: f, slots: 64, usPerToken: 100, prefillMs: 5, itlMs: 5 }));
  const urls = await Promise.all(engines.map((e) => e.listen()));
  t.teardown(() => Promise.all(engines.map((e) => e.close())));
  // about 40 % of the fleet's serial capacity: several prefills share each engine's batch
  const placed: Placed = new Map();
  const router = await learn(t, urls, 150, 7, placed);
  const cost = learned(router);
  const onFast = (tokens: number) => {
    const by = placed.get(tokens)!;
    const all = [...by.values()].reduce((a, b) => a + b, 0);
    return ((by.get('e0') ?? 0) + (by.get('e1') ?? 0)) / all;
  };
  t.comment(`share on the fast engines: 500-token prompts ${onFast(500).toFixed(2)}, 3000-token ${onFast(3000).toFixed(2)}`);
  t.comment(`learned ms per 1000 prompt tokens: ${cost.map((x) => x.toFixed(0)).join(', ')}`);
  const fast = Math.sqrt(cost[0]! * cost[1]!);
  const slow = Math.sqrt(cost[2]! * cost[3]!);
  t.ok(slow / fast > 2 && slow / fast < 4.5, `slow / fast ${(slow / fast).toFixed(2)} within [2, 4.5] (true 3)`);
  t.ok(Math.max(cost[0]!, cost[1]!) / Math.min(cost[0]!, cost[1]!) < 1.6, 'the two fast engines within 1.6× of each other');
  t.ok(Math.max(cost[2]!, cost[3]!) / Math.min(cost[2]!, cost[3]!) < 1.6, 'the two slow engines within 1.6× of each other');
});

t.test('serial-prefill engines (the simulator): the same', async (t) => {
  const engines = await Promise.all([1, 1, 3, 3].map((f) => startEngine({ prefillCostFactor: f, decodeCostFactor: f, prefillUsPerToken: 100, prefillOverheadMs: 5, maxNumSeqs: 64, kvCacheBlocks: 65536 })));
  t.teardown(() => Promise.all(engines.map((e) => e.close())));
  // the same costs and load as above
  const router = await learn(
    t,
    engines.map((e) => e.url),
    150,
    7,
  );
  const cost = learned(router);
  t.comment(`learned ms per 1000 prompt tokens: ${cost.map((x) => x.toFixed(0)).join(', ')}`);
  const fast = Math.sqrt(cost[0]! * cost[1]!);
  const slow = Math.sqrt(cost[2]! * cost[3]!);
  t.ok(slow / fast > 2 && slow / fast < 4.5, `slow / fast ${(slow / fast).toFixed(2)} within [2, 4.5] (true 3)`);
});
