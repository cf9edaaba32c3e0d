// Precise prefix mode through the router: simulated engines publish KV events
// over real ZMQ sockets, the router subscribes, tokenizes with the simulator's
// tokenizer before the pick, and routes on what the engines report. Checks
// that it follows the engine (a cleared cache is not claimed, where the
// approximate index still claims it), falls back to approximate scoring for
// an endpoint whose stream is down (counted), and exposes the tier-weighted
// cached-token count.
import t from 'tap';
import { MatchResult, PrefixIndex } from '../../bindings/index.js';
import { API_VERSION, validateConfig } from '../../src/config/schema.js';
import { startRouter } from '../../src/server/router.js';
import { startFleet } from '../../src/sim/index.js';
import { renderChat } from '../../src/sim/tokenizer.js';
import { validatePlugin } from '../support/router-util.js';
import { waitFor } from '../support/precise-util.js';


const SYSTEM = 'You are a careful assistant. '.repeat(40);
const messages = (q: string) => [
  { role: 'system', content: SYSTEM },
  { role: 'user', content: q },
];

t.test('precise mode routes on the engines\' KV events and falls back when a stream is down', async (t) => {
  const fleet = await startFleet(2, {
    timeScale: 0,
    kvCacheBlocks: 256,
    kvEventsConfig: { enable_kv_cache_events: true, publisher: 'zmq', endpoint: 'tcp://127.0.0.1:*', replay_endpoint: 'tcp://127.0.0.1:*' },
  });
  const cfg = validateConfig(
    {
      apiVersion: API_VERSION,
      kind: 'Router',
      pools: [
        {
          name: 'p',
          models: ['open-model'],
          prefix: { mode: 'precise', blockTokens: 16, tokenizer: { type: 'sim' } },
          endpoints: fleet.engines.map((e, i) => ({
            name: `e${i}`,
            url: e.url,
            kvEvents: { endpoint: e.kvEvents!.endpoint, replayEndpoint: e.kvEvents!.replayEndpoint! },
          })),
        },
      ],
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
  t.ok(precise, 'precise mode is built');
  await waitFor('streams connected', () => precise.feed.streams.every((s) => s.stream.healthy));
  await new Promise((r) => setTimeout(r, 150));

  const ask = async (q: string) => {
    const r = await fetch(router.url + '/v1/chat/completions', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'open-model', messages: messages(q), max_tokens: 2 }),
    });
    t.equal(r.status, 200);
    await r.text();
    return r.headers.get('x-switchyard-endpoint');
  };

  const first = await ask('first question');
  t.ok(first === 'e0' || first === 'e1', `served by ${first}`);
  const idx = first === 'e0' ? 0 : 1;
  const other = 1 - idx;
  await waitFor('events applied', () => precise.feed.totals[0]! > 0);
  // the rendered system prompt is cached on `first`: the next questions follow it
  for (let i = 0; i < 4; i++) t.equal(await ask(`question ${i}`), first, 'affinity from events');
  const m = router.core.metrics;
  t.ok(m.matchedBlocks > 0, 'matched blocks reported');

  // the precise index holds the prompt on `first` only; the tier-weighted count is exposed
  const tokens = Buffer.from(renderChat(messages('question 0')));
  const match = (id: number) => precise.feed.index.matchPrompt(tokens, PrefixIndex.seedFor('open-model'), Int32Array.of(id), new MatchResult()).matched[0]!;
  t.ok(match(idx) > 0);
  t.equal(match(other), 0);
  const producer = router.core.scheduler.prefix!;
  t.ok(producer.precise !== null);

  // the engine drops its cache: the precise index follows, the router stops claiming the blocks
  fleet.engines[idx]!.clearCache();
  await waitFor('removal applied', () => match(idx) === 0);
  t.ok(precise.feed.totals[1]! > 0, 'BlockRemoved applied');

  // a stream that goes down: that endpoint is scored approximately, counted
  const before = producer.preciseCounters.fallbackUnhealthy;
  fleet.engines[other]!.kvEvents!.close();
  await waitFor('stream unhealthy', () => !precise.feed.healthy(other));
  await ask('after the stream went down');
  t.ok(producer.preciseCounters.fallbackUnhealthy > before, 'fallback counted');
  const text = await (await fetch(router.url + '/metrics')).text();
  t.match(text, /switchyard_kv_events_stream_healthy\{endpoint="e\d",problem="disconnected"\} 0/);
  t.match(text, /switchyard_prefix_fallback_unhealthy_total [1-9]/);
  t.match(text, /switchyard_kv_events_blocks_stored_total [1-9]/);
});

t.test('config: precise pools need one block size; kvEvents addresses are checked', async (t) => {
  const base = (extra: Record<string, unknown>) => ({
    apiVersion: API_VERSION,
    kind: 'Router',
    pools: [{ name: 'p', models: ['m'], endpoints: [{ url: 'http://127.0.0.1:1', ...extra }], prefix: { mode: 'precise' } }],
  });
  t.throws(() => validateConfig(base({ kvEvents: { endpoint: 'http://x' } }), validatePlugin), /kvEvents\.endpoint: must be a ZMQ address/);
  t.throws(
    () => validateConfig({ ...base({}), pools: [{ name: 'p', models: ['m'], endpoints: [{ url: 'http://127.0.0.1:1' }], prefix: { mode: 'exact' } }] }, validatePlugin),
    /prefix\.mode: must be one of: approximate, precise/,
  );
  t.throws(
    () => validateConfig({ ...base({}), pools: [{ name: 'p', models: ['m'], endpoints: [{ url: 'http://127.0.0.1:1' }], prefix: { mode: 'precise', tokenizer: { type: 'huggingface' } } }] }, validatePlugin),
    /tokenizer\.path: is required/,
  );
  t.throws(() => validateConfig({ ...base({}), scheduling: { tierWeights: { cpu: 2 } } }, validatePlugin), /tierWeights\.cpu: must be a number in \[0, 1\]/);
  const ok = validateConfig(base({ kvEvents: { endpoint: 'tcp://127.0.0.1:5557' } }), validatePlugin);
  t.same(ok.pools[0]!.prefix, { mode: 'precise', blockTokens: 16, tokenizer: { type: 'sim', timeoutMs: 50, cacheEntries: 4096 }, speculativeMs: 2000 });
  t.same(ok.scheduling.tierWeights, { gpu: 1, cpu: 0.875, disk: 0.5 });
});
