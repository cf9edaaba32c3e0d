// Precise mode and an engine with no GPU room. A group's prefix that survives
// only in a busy engine's host-memory tier must not pull the group onto that
// engine while another engine can admit the request now: the busy engine's GPU
// is full of a running request's blocks, so the request would wait there for
// that whole decode before the host blocks could even be loaded. Once the busy
// engine has room again, the host-tier copy wins as before.
// Real simulated engines (GPU + host tier, KV events over ZMQ), a real router.
import t from 'tap';
import { MatchResult, PrefixIndex } from '../../bindings/index.js';
import { startRouter } from '../../src/server/router.js';
import { startFleet } from '../../src/sim/index.js';
import { fleetConfig, waitFor } from '../support/precise-util.js';


// the simulator's tokenizer: 4 bytes a token; blocks of 16 tokens = 64 bytes
const block = (tag: string, n: number) => tag.padEnd(64, '.').repeat(n);
const GROUP = block('group prefix', 32); // 32 blocks
const BUSY = block('another tenant, long running', 57); // 57 blocks + 112 output tokens = the whole 64-block GPU

t.test('precise: a host-tier prefix on an engine without GPU room does not win over an engine with room', async (t) => {
  const fleet = await startFleet(2, {
    kvCacheBlocks: 64,
    cpuOffloadBlocks: 256,
    itlMs: 20,
    kvEventsConfig: { enable_kv_cache_events: true, publisher: 'zmq', endpoint: 'tcp://127.0.0.1:*', replay_endpoint: 'tcp://127.0.0.1:*' },
  });
  t.teardown(() => fleet.close());
  const cfg = fleetConfig(fleet, 'precise');
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => router.close(200));
  const feed = router.core.precise!.feed;
  const producer = router.core.scheduler.prefix!;
  await waitFor('streams connected', () => feed.streams.every((s) => s.stream.healthy));
  const e0 = router.core.endpoints.byName('e0')!;
  await waitFor('e0 scraped with its cache geometry', () => e0.metrics.cacheBlocks === 64);

  const complete = async (url: string, prompt: string, maxTokens: number) => {
    const res = await fetch(url + '/v1/completions', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'open-model', prompt, max_tokens: maxTokens }),
    });
    t.equal(res.status, 200);
    const body = (await res.json()) as { usage: { prompt_tokens_details?: { cached_tokens?: number } | null } };
    return { endpoint: res.headers.get('x-switchyard-endpoint'), cached: body.usage.prompt_tokens_details?.cached_tokens ?? 0 };
  };
  // the precise index's view of e0's copy of the group prefix: [GPU, host] blocks
  const tokens = Buffer.from(GROUP + 'question');
  const r = new MatchResult();
  const tiersOnE0 = () => {
    const m = feed.index.matchPrompt(tokens, PrefixIndex.seedFor('open-model'), Int32Array.of(e0.id), r);
    return [m.tiers[0]!, m.tiers[1]!];
  };

  // the group's prefix is computed on e0 (sent to the engine directly: the router learns it from the events)
  await complete(fleet.engines[0]!.url, GROUP + 'first question', 1);
  await waitFor('the prefix on e0 in GPU memory', () => tiersOnE0()[0] === 32);
  // a long request of another tenant takes all of e0's GPU: the idle prefix moves to the host tier
  const busy = complete(fleet.engines[0]!.url, BUSY, 112);
  await waitFor('the prefix on e0 in host memory only', () => tiersOnE0()[0] === 0 && tiersOnE0()[1] === 32);
  await waitFor('e0 scraped as full', () => e0.metrics.kvUsage === 1 && e0.metrics.running === 1);

  const noRoom = producer.preciseCounters.noRoom;
  const during = await complete(router.url, GROUP + 'second question', 1);
  t.equal(during.endpoint, 'e1', 'the group goes to the engine with room, not behind the running decode on e0');
  t.ok(producer.preciseCounters.noRoom > noRoom, 'counted as a candidate without room');
  t.equal(during.cached, 0, 'e1 computes the prefix');

  await busy;
  // e0 has room again: its host-tier copy counts as before (0.875 a block) and e1's GPU copy beats it
  await waitFor('e0 scraped with room', () => e0.metrics.kvUsage === 0 && e0.metrics.running === 0);
  const after = await complete(router.url, GROUP + 'third question', 1);
  t.equal(after.endpoint, 'e1', "e1's GPU copy is worth more than e0's host copy");
  t.ok(after.cached > 0, 'a real hit');
});

t.test('precise: with room on the engine, a host-tier prefix still wins over an idle engine without it', async (t) => {
  const fleet = await startFleet(2, {
    kvCacheBlocks: 64,
    cpuOffloadBlocks: 256,
    itlMs: 2,
    kvEventsConfig: { enable_kv_cache_events: true, publisher: 'zmq', endpoint: 'tcp://127.0.0.1:*', replay_endpoint: 'tcp://127.0.0.1:*' },
  });
  t.teardown(() => fleet.close());
  const cfg = fleetConfig(fleet, 'precise');
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => router.close(200));
  const feed = router.core.precise!.feed;
  await waitFor('streams connected', () => feed.streams.every((s) => s.stream.healthy));
  const e0 = router.core.endpoints.byName('e0')!;
  await waitFor('e0 scraped with its cache geometry', () => e0.metrics.cacheBlocks === 64);
  const send = async (url: string, prompt: string, maxTokens: number) => {
    const res = await fetch(url + '/v1/completions', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'open-model', prompt, max_tokens: maxTokens }) });
    const body = (await res.json()) as { usage: { prompt_tokens_details?: { cached_tokens?: number } | null } };
    return { endpoint: res.headers.get('x-switchyard-endpoint'), cached: body.usage.prompt_tokens_details?.cached_tokens ?? 0 };
  };
  const tokens = Buffer.from(GROUP + 'question');
  const r = new MatchResult();
  const hostOnE0 = () => feed.index.matchPrompt(tokens, PrefixIndex.seedFor('open-model'), Int32Array.of(e0.id), r).tiers[1]!;
  await send(fleet.engines[0]!.url, GROUP + 'first question', 1);
  await send(fleet.engines[0]!.url, BUSY, 112); // runs to the end: the prefix is pushed to the host tier, then the GPU is free
  await waitFor('the prefix on e0 in host memory', () => hostOnE0() === 32);
  await waitFor('e0 scraped with room', () => e0.metrics.kvUsage === 0 && e0.metrics.running === 0);
  const got = await send(router.url, GROUP + 'second question', 1);
  t.equal(got.endpoint, 'e0', 'the host-tier copy draws the group to e0');
  t.ok(got.cached > 0, 'a real (host-tier) hit');
});
