// The default scheduler learns each endpoint's speed (issue 34, item 2): with
// no configuration (one pool, no accelerator, no speed block), a simulated
// engine three times slower at prefill and decode gets about a third of a fast
// one's requests under load, because the load scorers count work in expected
// milliseconds; a pool of equal engines is shared evenly as before. Real
// simulated engines over loopback, the router in-process.
import t from 'tap';
import { startEngine, type SimEngine } from '../../src/sim/index.js';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { startRouter } from '../../src/server/router.js';
import { validatePlugin } from '../support/router-util.js';
import { send } from '../support/sim-util.js';

async function fleetShare(t: Tap.Test, factors: number[], rate: number, requests: number): Promise<{ counts: Map<string, number>; router: Awaited<ReturnType<typeof startRouter>> }> {
  const engines: SimEngine[] = [];
  for (const f of factors) engines.push(await startEngine({ prefillCostFactor: f, decodeCostFactor: f, maxNumSeqs: 64, kvCacheBlocks: 65536 }));
  const cfg = validateConfig(
    {
      apiVersion: API_VERSION,
      kind: 'Router',
      logging: { level: 'silent' },
      pools: [{ name: 'p', models: ['open-model'], endpoints: engines.map((e, i) => ({ name: `e${i}`, url: e.url })) }],
    },
    validatePlugin,
  );
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(async () => {
    await router.close(200);
    await Promise.all(engines.map((e) => e.close()));
  });
  const counts = new Map<string, number>();
  // open loop: Poisson arrivals at `rate` per second (a seeded draw), unique 2000-token prompts, streamed
  let seed = 12345;
  const rand = () => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32);
  const pending: Promise<void>[] = [];
  for (let i = 0; i < requests; i++) {
    const prompt = `q${i} ${rand().toString(36)} ` + 'lorem ipsum '.repeat(660);
    pending.push(
      send(router.url, 'POST', '/v1/completions', { model: 'open-model', prompt, max_tokens: 4, stream: true }).done.then((r) => {
        if (r.status !== 200) throw new Error(`status ${r.status}: ${r.body.slice(0, 200)}`);
        const ep = String(r.headers['x-switchyard-endpoint']);
        counts.set(ep, (counts.get(ep) ?? 0) + 1);
      }),
    );
    await new Promise((r) => setTimeout(r, (-Math.log(1 - rand()) / rate) * 1000));
  }
  await Promise.all(pending);
  return { counts, router };
}

t.test('a 3× slower engine gets about a third of a fast one\'s requests with the default config', async (t) => {
  // two fast, one slow: 100 ms of prefill per request on a fast engine, 300 ms on the slow one
  // about half the fleet's capacity (fast: 10 requests/s each, slow 3.3)
  const { counts, router } = await fleetShare(t, [1, 1, 3], 12, 150);
  const fast = ((counts.get('e0') ?? 0) + (counts.get('e1') ?? 0)) / 2;
  const slow = counts.get('e2') ?? 0;
  const ratio = slow / fast;
  t.comment(`requests: e0 ${counts.get('e0')}, e1 ${counts.get('e1')}, slow e2 ${slow}: slow / fast ${ratio.toFixed(2)} (speed ratio 0.33)`);
  // counting requests (the queue scorer before issue 34) gave it 0.5–0.6 here, on the same seed
  t.ok(ratio > 0.1 && ratio < 0.45, `slow / fast share ${ratio.toFixed(2)} within [0.1, 0.45]`);
  // what it learned: the slow engine's prefill cost per token against the fast ones'
  const b = ['e0', 'e1', 'e2'].map((n) => router.core.endpoints.byName(n)!.speed.ttft.predict(2));
  const learned = b[2]! / ((b[0]! + b[1]!) / 2);
  t.comment(`learned TTFT of a lone 2000-token prompt, ms: ${b.map((x) => x.toFixed(1)).join(', ')}`);
  t.ok(learned > 2 && learned < 4.5, `learned slow / fast TTFT ${learned.toFixed(2)} within [2, 4.5] (true 3)`);
});

t.test('equal engines share evenly', async (t) => {
  const { counts } = await fleetShare(t, [1, 1, 1], 12, 120);
  const v = [0, 1, 2].map((i) => counts.get(`e${i}`) ?? 0);
  t.comment(`requests: ${v.join(', ')}`);
  t.ok(Math.min(...v) / Math.max(...v) > 0.6, `min / max ${(Math.min(...v) / Math.max(...v)).toFixed(2)} > 0.6`);
});
