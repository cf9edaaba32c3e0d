// Precise mode's speculative entries: between the pick and the engine's
// BlockStored events (queue + prefill + publish) the event-fed index does not
// know where a prompt went. A follower of the same prefix sent in that gap must
// still go where the prefix is being computed (speculativeMs, default 2 s);
// with the window off it is spread by the load scorers, which is what the
// window fixes. Real sim engines, real ZMQ event streams, a real router.
import t from 'tap';
import { API_VERSION, validateConfig } from '../../src/config/schema.js';
import { startRouter } from '../../src/server/router.js';
import { startFleet } from '../../src/sim/index.js';
import { validatePlugin } from '../support/router-util.js';
import { waitFor } from '../support/precise-util.js';


const SYSTEM = 'You are a careful assistant who answers in full sentences. '.repeat(60);

// eslint-disable-next-line @typescript-eslint/no-explicit-any
async function scenario(t: any, speculativeMs: number | undefined) {
  // one running request per engine (the others wait unscheduled: an engine stores a prompt's blocks, and
  // publishes them, only when it schedules it) and a slow prefill (1 ms per token)
  const fleet = await startFleet(2, {
    maxNumSeqs: 1,
    prefillUsPerToken: 1000,
    kvCacheBlocks: 512,
    kvEventsConfig: { enable_kv_cache_events: true, publisher: 'zmq', endpoint: 'tcp://127.0.0.1:*', replay_endpoint: 'tcp://127.0.0.1:*' },
  });
  const prefix: Record<string, unknown> = { mode: 'precise', blockTokens: 16, tokenizer: { type: 'sim' } };
  if (speculativeMs !== undefined) prefix.speculativeMs = speculativeMs;
  const cfg = validateConfig(
    {
      apiVersion: API_VERSION,
      kind: 'Router',
      pools: [
        {
          name: 'p',
          models: ['open-model'],
          prefix,
          endpoints: fleet.engines.map((e, i) => ({
            name: `e${i}`,
            url: e.url,
            kvEvents: { endpoint: e.kvEvents!.endpoint, replayEndpoint: e.kvEvents!.replayEndpoint! },
          })),
        },
      ],
      // prefix first, then the router's own in-flight count (always fresh): without a prefix match the
      // second request goes to the endpoint with nothing in flight
      scheduling: { scorers: [{ type: 'prefix-cache', weight: 3 }, { type: 'load', weight: 1 }] },
      logging: { level: 'silent' },
    },
    validatePlugin,
  );
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(async () => {
    await router.close(200);
    await fleet.close();
  });
  const precise = router.core.precise!;
  await waitFor('streams connected', () => precise.feed.streams.every((s) => s.stream.healthy));
  await new Promise((r) => setTimeout(r, 150));
  const ask = (q: string) =>
    fetch(router.url + '/v1/chat/completions', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        model: 'open-model',
        messages: q.startsWith('blocker') ? [{ role: 'user', content: q }] : [{ role: 'system', content: SYSTEM }, { role: 'user', content: q }],
        max_tokens: 2,
      }),
    }).then(async (r) => {
      await r.text();
      return { status: r.status, endpoint: r.headers.get('x-switchyard-endpoint') };
    });
  // a long unique prompt on each engine keeps its one slot busy for ~1 s, so the prompts below wait in the
  // engines' queues, unscheduled, and no event tells the router where they went
  const blockers = [ask('blocker zero ' + 'lorem ipsum dolor '.repeat(300)), ask('blocker one ' + 'sit amet consectetur '.repeat(300))];
  await new Promise((r) => setTimeout(r, 50));
  const first = ask('first question');
  await new Promise((r) => setTimeout(r, 50));
  const second = await ask('second question');
  const a = await first;
  const b = await Promise.all(blockers);
  t.not(b[0]!.endpoint, b[1]!.endpoint, 'one blocker per engine');
  t.equal(a.status, 200);
  t.equal(second.status, 200);
  return { first: a.endpoint, second: second.endpoint, speculative: router.core.scheduler.prefix!.preciseCounters.speculative };
}

t.test('a follower sent before the events arrive goes where its prefix is being computed', async (t) => {
  const r = await scenario(t, undefined);
  t.equal(r.second, r.first, `both on ${r.first}`);
  t.ok(r.speculative > 0, `the speculative entries raised a match (${r.speculative})`);
});

t.test('with speculativeMs: 0 the same follower is spread by the load scorers (the gap the window closes)', async (t) => {
  const r = await scenario(t, 0);
  t.not(r.second, r.first, `first on ${r.first}, second on ${r.second}`);
  t.equal(r.speculative, 0);
});

t.test('config: precise pools must agree on speculativeMs; a bad value names its path', async (t) => {
  const base = (p: Record<string, unknown>) => ({
    apiVersion: API_VERSION,
    kind: 'Router',
    pools: [{ name: 'p', models: ['m'], prefix: p, endpoints: [{ name: 'e', url: 'http://127.0.0.1:9', kvEvents: { endpoint: 'tcp://127.0.0.1:5557' } }] }],
  });
  t.throws(() => validateConfig(base({ mode: 'precise', speculativeMs: -1 }), validatePlugin), /pools\[0\]\.prefix\.speculativeMs/);
  t.throws(() => validateConfig(base({ mode: 'precise', speculativeMs: 'soon' }), validatePlugin), /pools\[0\]\.prefix\.speculativeMs/);
  t.equal(validateConfig(base({ mode: 'precise' }), validatePlugin).pools[0]!.prefix!.speculativeMs, 2000, 'default 2 s');
});
