// An engine restart that no router is told about (the simulator's
// POST /sim/restart: the cache is gone, the KV-event publisher starts again
// at seq 0). The precise router sees the publisher go and come back and stops
// claiming the blocks (in its event-fed index, and in the approximate record
// it falls back to while the stream is down); the approximate router keeps
// claiming them, and its next pick there is a predicted hit that the engine's
// usage shows was a miss.
// Real simulated engines, real ZMQ sockets, real routers.
import t from 'tap';
import { MatchResult, PrefixIndex } from '../../bindings/index.js';
import { startRouter } from '../../src/server/router.js';
import { startFleet } from '../../src/sim/index.js';
import { renderChat } from '../../src/sim/tokenizer.js';
import { fleetConfig, waitFor } from '../support/precise-util.js';

const SYSTEM = 'You are a careful assistant who answers in short sentences. '.repeat(30);
const messages = (q: string) => [
  { role: 'system', content: SYSTEM },
  { role: 'user', content: q },
];

t.test('an engine restart: precise stops claiming its blocks, approximate keeps claiming them', async (t) => {
  const fleet = await startFleet(2, {
    timeScale: 0,
    kvCacheBlocks: 256,
    kvEventsConfig: { enable_kv_cache_events: true, publisher: 'zmq', endpoint: 'tcp://127.0.0.1:*', replay_endpoint: 'tcp://127.0.0.1:*' },
  });
  t.teardown(() => fleet.close());
  const router = async (mode: 'precise' | 'approximate') => {
    const cfg = fleetConfig(fleet, mode);
    const r = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
    t.teardown(() => r.close(200));
    return r;
  };
  const precise = await router('precise');
  const approx = await router('approximate');
  const feed = precise.core.precise!.feed;
  await waitFor('streams connected', () => feed.streams.every((s) => s.stream.healthy));
  await new Promise((r) => setTimeout(r, 150));
  const ask = async (r: typeof precise, q: string) => {
    const res = await fetch(r.url + '/v1/chat/completions', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'open-model', messages: messages(q), max_tokens: 2 }),
    });
    t.equal(res.status, 200);
    const body = (await res.json()) as { usage: { prompt_tokens_details?: { cached_tokens?: number } | null } };
    return { endpoint: res.headers.get('x-switchyard-endpoint')!, cached: body.usage.prompt_tokens_details?.cached_tokens ?? 0 };
  };

  // the approximate router places the prefix; the precise router sees it from the events
  const first = await ask(approx, 'first question');
  const id = Number(first.endpoint.slice(1));
  const tokens = Buffer.from(renderChat(messages('first question')));
  const held = () => feed.index.matchPrompt(tokens, PrefixIndex.seedFor('open-model'), Int32Array.of(id), new MatchResult()).matched[0]!;
  await waitFor('precise index holds the prefix', () => held() > 0);
  const second = await ask(approx, 'second question');
  t.equal(second.endpoint, first.endpoint, 'approximate follows its record');
  t.ok(second.cached > 0, `a real hit before the restart (${second.cached} cached tokens)`);
  // the precise router routes there too (from the events), so its approximate fallback records it as well
  t.equal((await ask(precise, 'a question through the precise router')).endpoint, first.endpoint);
  const fallbackCleared: number[] = [];
  precise.core.scheduler.prefix!.store.observe!({ recorded() {}, removed() {}, cleared: (ep) => fallbackCleared.push(ep) });

  // the engine restarts; nobody tells the routers
  const stream = feed.streams[id]!.stream;
  const restarts = await fetch(fleet.engines[id]!.url + '/sim/restart', { method: 'POST' });
  t.equal(restarts.status, 200);
  await restarts.text();
  await waitFor('precise index dropped the prefix', () => held() === 0);
  t.ok(stream.counters.clears > 0, `the stream cleared the endpoint (${stream.counters.clears} clears)`);
  t.ok(feed.engineResets > 0, 'the publisher going away is an engine reset');
  // while the stream is down the endpoint is scored approximately: that record is as stale, so it is cleared too
  t.ok(fallbackCleared.includes(id), "the precise router's approximate fallback forgot the endpoint");
  t.notOk(fallbackCleared.includes(1 - id), 'and only that endpoint');
  await waitFor('stream healthy again', () => stream.healthy);

  // approximate: still claims the prefix there, picks it, and the engine computes it again
  const before = approx.core.metrics.matchedBlocks;
  const third = await ask(approx, 'third question');
  t.equal(third.endpoint, first.endpoint, 'approximate still believes the engine holds the prefix');
  t.ok(approx.core.metrics.matchedBlocks > before, 'and predicts a hit');
  t.equal(third.cached, 0, 'the engine measured a miss');

  // precise: the follower's pick claims nothing it was told was gone (its match is what the events say now)
  await waitFor('precise index holds the recomputed prefix', () => held() > 0);
  const p = await ask(precise, 'fourth question');
  t.equal(p.endpoint, first.endpoint, 'precise follows the recomputed prefix');
  t.ok(p.cached > 0, 'a real hit');

  // a pick the precise router just made (a speculative entry, not yet old) does not outlive a restart either
  const other = [{ role: 'system', content: 'Another tenant entirely. '.repeat(60) }, { role: 'user', content: 'q' }];
  const viaPrecise = async () => {
    const res = await fetch(precise.url + '/v1/chat/completions', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'open-model', messages: other, max_tokens: 2 }) });
    await res.text();
    return res.headers.get('x-switchyard-endpoint')!;
  };
  const placed = Number((await viaPrecise()).slice(1));
  const s2 = feed.streams[placed]!.stream;
  const resets = feed.engineResets;
  await (await fetch(fleet.engines[placed]!.url + '/sim/restart', { method: 'POST' })).text();
  await waitFor('the reset seen', () => feed.engineResets > resets);
  await waitFor('stream healthy again', () => s2.healthy);
  const producer = precise.core.scheduler.prefix!;
  const spec = producer.preciseCounters.speculative;
  await viaPrecise();
  t.equal(producer.preciseCounters.speculative, spec, 'no speculative entry claimed the restarted engine');
});
