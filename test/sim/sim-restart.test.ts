// The simulator's engine restart (POST /sim/restart, engine.restart()): the
// cache is gone, including the blocks of requests still running (freed when
// they end, never cached again), and capacity is accounted while they run.
import t from 'tap';
import { KvCache } from '../../src/sim/kv-cache.js';
import { startEngine } from '../../src/sim/index.js';

t.test('forgetAll: idle and pinned blocks are forgotten; pinned ones keep their room until released', async (t) => {
  const c = new KvCache(8, 16);
  const idle = c.acquire([1, 2], 2, 0, 2);
  c.release(idle);
  const running = c.acquire([3, 4, 5], 3, 1, 3);
  t.equal(c.cachedBlocks, 5);
  c.forgetAll();
  t.equal(c.cachedBlocks, 0, 'nothing cached after the restart');
  t.equal(c.matchPrefix([3, 4, 5], 3), 0, "the running request's blocks are no hit");
  t.equal(c.usedBlocks, 4, 'but they are still allocated to it');
  // 8 blocks: 3 doomed + 1 private are in use, so 4 new ones fit and a fifth does not
  t.ok(c.canAdmit([10, 11, 12, 13], 4, 0));
  t.notOk(c.canAdmit([10, 11, 12, 13, 14], 5, 0));
  // the same prompt again gets fresh blocks (a miss), and the old ones are freed, not cached, on release
  const again = c.acquire([3, 4], 2, 0, 2);
  t.equal(again.cachedTokens, 0);
  c.release(running);
  t.equal(c.usedBlocks, 2);
  t.equal(c.cachedBlocks, 2, 'only the new copies are cached');
  c.release(again);
  t.equal(c.idleBlocks, 2);
  t.equal(c.matchPrefix([3, 4, 5], 3), 2);
});

t.test('POST /sim/restart empties the cache and restarts the publisher at seq 0', async (t) => {
  const e = await startEngine({
    timeScale: 0,
    kvCacheBlocks: 64,
    cpuOffloadBlocks: 64,
    kvEventsConfig: { enable_kv_cache_events: true, publisher: 'zmq', endpoint: 'tcp://127.0.0.1:*', replay_endpoint: 'tcp://127.0.0.1:*' },
  });
  t.teardown(() => e.close());
  const ask = async () => {
    const r = await fetch(e.url + '/v1/completions', { method: 'POST', body: JSON.stringify({ model: 'open-model', prompt: 'y'.repeat(64 * 6), max_tokens: 2 }) });
    return ((await r.json()) as { usage: { prompt_tokens_details: { cached_tokens: number } } }).usage.prompt_tokens_details.cached_tokens;
  };
  t.equal(await ask(), 0);
  t.ok((await ask()) > 0, 'a hit before the restart');
  await new Promise((r) => setTimeout(r, 20));
  t.ok(e.kvEvents!.buffered().length > 0);
  const r = await fetch(e.url + '/sim/restart', { method: 'POST' });
  t.equal(r.status, 200);
  t.same(await r.json(), { restarted: true });
  t.equal(e.stats().kvCachedBlocks, 0);
  t.equal(e.stats().hostCachedBlocks, 0);
  await new Promise((r) => setTimeout(r, 50));
  t.equal(e.kvEvents!.buffered().length, 0, 'the replay buffer starts empty (the removals are not published)');
  t.equal(await ask(), 0, 'a miss after the restart');
  const get = await fetch(e.url + '/sim/restart');
  t.equal(get.status, 405);
  await get.text();
});
