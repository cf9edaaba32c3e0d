// Several router replicas in front of one fleet (active-active routers behind
// an L4 balancer: each request reaches one of them). Precise routers all read
// the same engines' KV events, so a prefix one replica placed is known to the
// others; approximate replicas only know their own picks. Real simulated
// engines, real ZMQ sockets, two real routers. The quality benchmark's
// `--routers N` scenario (bench/quality.ts) measures what this costs and buys.
import t from 'tap';
import { MatchResult, PrefixIndex } from '../../bindings/index.js';
import { startRouter } from '../../src/server/router.js';
import { startFleet, type SimFleet } from '../../src/sim/index.js';
import { renderChat } from '../../src/sim/tokenizer.js';
import { fleetConfig, waitFor } from '../support/precise-util.js';


// distinct system prompts, so each one is a prefix nobody has placed yet
const SYSTEMS = Array.from({ length: 6 }, (_, k) => `[tenant ${k}] ` + 'You are a careful assistant who answers in short sentences. '.repeat(30));

async function replica(fleet: SimFleet, mode: 'precise' | 'approximate') {
  const cfg = fleetConfig(fleet, mode, { scheduling: { scorers: [{ type: 'prefix-cache', weight: 3 }, { type: 'load', weight: 1 }] } });
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  if (mode === 'precise') {
    const p = router.core.precise!;
    await waitFor('streams connected', () => p.feed.streams.every((s) => s.stream.healthy));
  }
  const ask = async (k: number, q: string) => {
    const r = await fetch(router.url + '/v1/chat/completions', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'open-model', messages: [{ role: 'system', content: SYSTEMS[k]! }, { role: 'user', content: q }], max_tokens: 2 }),
    });
    await r.text();
    return { status: r.status, endpoint: r.headers.get('x-switchyard-endpoint') };
  };
  return { router, ask };
}

async function fleetWithEvents(t: Tap.Test): Promise<SimFleet> {
  const fleet = await startFleet(2, {
    timeScale: 0,
    kvCacheBlocks: 256,
    kvEventsConfig: { enable_kv_cache_events: true, publisher: 'zmq', endpoint: 'tcp://127.0.0.1:*', replay_endpoint: 'tcp://127.0.0.1:*' },
  });
  t.teardown(() => fleet.close());
  return fleet;
}

t.test('precise replicas share one view: a prefix placed by one router is followed by the other', async (t) => {
  const fleet = await fleetWithEvents(t);
  const a = await replica(fleet, 'precise');
  const b = await replica(fleet, 'precise');
  t.teardown(async () => {
    await a.router.close(200);
    await b.router.close(200);
  });
  await new Promise((r) => setTimeout(r, 150));
  const bFeed = b.router.core.precise!.feed;
  // each prefix is placed by A; B never routed it and learns where it is from the engine's BlockStored
  // events. Ties between the idle engines are broken at random, so six prefixes make a lucky pass unlikely;
  // B's matched blocks on its first pick of each prefix are the deterministic check.
  for (let k = 0; k < SYSTEMS.length; k++) {
    const first = await a.ask(k, 'first question, through replica A');
    t.equal(first.status, 200);
    // what the engine stored for A's prompt is in B's event-fed index (not only some earlier batch)
    const tokens = Buffer.from(renderChat([{ role: 'system', content: SYSTEMS[k]! }, { role: 'user', content: 'first question, through replica A' }]));
    const on = Int32Array.of(Number(first.endpoint!.slice(1)));
    await waitFor(`B applied prefix ${k}'s events`, () => bFeed.index.matchPrompt(tokens, PrefixIndex.seedFor('open-model'), on, new MatchResult()).matched[0]! > 0);
    const matched = b.router.core.metrics.matchedBlocks;
    const r = await b.ask(k, 'follower, through replica B');
    t.equal(r.status, 200);
    t.equal(r.endpoint, first.endpoint, `prefix ${k}: B's follower goes where A placed it`);
    t.ok(b.router.core.metrics.matchedBlocks > matched, `prefix ${k}: B's first pick matched the blocks A placed`);
  }
  t.equal(b.router.core.scheduler.prefix!.preciseCounters.fallbackUnhealthy, 0, 'no approximate fallback');
});

t.test('approximate replicas: the other router does not know what the first placed (the gap precise closes)', async (t) => {
  const fleet = await fleetWithEvents(t);
  const a = await replica(fleet, 'approximate');
  const b = await replica(fleet, 'approximate');
  t.teardown(async () => {
    await a.router.close(200);
    await b.router.close(200);
  });
  for (let k = 0; k < 3; k++) {
    const first = await a.ask(k, 'first question, through replica A');
    t.equal(first.status, 200);
    const matched = b.router.core.metrics.matchedBlocks;
    const r = await b.ask(k, 'follower, through replica B');
    t.equal(r.status, 200);
    t.equal(b.router.core.metrics.matchedBlocks, matched, `prefix ${k}: B's first pick matched nothing (it only knows its own picks)`);
    const aMatched = a.router.core.metrics.matchedBlocks;
    const again = await a.ask(k, 'second question, through replica A');
    t.equal(again.endpoint, first.endpoint, `prefix ${k}: A follows its own record`);
    t.ok(a.router.core.metrics.matchedBlocks > aMatched);
  }
});
