// When the KV-event feed drains: a received batch is applied right after its
// receive (a microtask), before the loop turn's later callbacks, instead of
// waiting for the check phase behind them; with inlineDrainsPerTurn 0 it
// waits (the previous behaviour). A simulated engine publishes over a real
// ZMQ socket into a real native index. The flood case (more than a turn's
// inline drains, bounded queue, oldest dropped) is in test/kv-events.test.ts.
import t from 'tap';
import { PAYLOAD_TOTALS, PrefixIndex } from '../../bindings/index.js';
import { KvEventFeed } from '../../src/kv-events/feed.js';
import { startEngine } from '../../src/sim/index.js';

async function until(what: string, cond: () => boolean, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

async function run(t: Tap.Test, inlineDrainsPerTurn: number | undefined): Promise<{ received: number; late: number; inline: number }> {
  const e = await startEngine({
    timeScale: 0,
    kvCacheBlocks: 512,
    kvEventsConfig: { enable_kv_cache_events: true, publisher: 'zmq', endpoint: 'tcp://127.0.0.1:*', replay_endpoint: 'tcp://127.0.0.1:*' },
  });
  t.teardown(() => e.close());
  const index = new PrefixIndex({ blockSize: 64, maxEndpoints: 4, defaultCapacity: [1 << 20, 0, 0] });
  const feed = new KvEventFeed(index, { blockTokens: 16, ...(inlineDrainsPerTurn === undefined ? {} : { inlineDrainsPerTurn }) });
  t.teardown(() => feed.close());
  const stream = feed.add({ id: 0, name: 'e0', endpoint: e.kvEvents!.endpoint, replayEndpoint: e.kvEvents!.replayEndpoint, model: 'open-model' });
  await until('connect', () => stream.healthy);
  await new Promise((r) => setTimeout(r, 100));
  // a check-phase probe: queued before any drain the turn's receives schedule with setImmediate, it sees
  // every batch that was received in the turn and not yet applied
  let late = 0;
  let probing = true;
  const probe = () => {
    if (stream.counters.batches > feed.totals[PAYLOAD_TOTALS.batches]!) late++;
    if (probing) setImmediate(probe);
  };
  setImmediate(probe);
  for (let i = 0; i < 20; i++) {
    const r = await fetch(e.url + '/v1/completions', { method: 'POST', body: JSON.stringify({ model: 'open-model', prompt: `prompt ${i} ` + 'x'.repeat(64 * 4), max_tokens: 2 }) });
    await r.text();
  }
  await until('all applied', () => stream.counters.batches > 0 && stream.counters.batches === feed.totals[PAYLOAD_TOTALS.batches]);
  probing = false;
  return { received: stream.counters.batches, late, inline: feed.inlineDrains };
}

t.test('a received batch is in the index before the turn goes on (default)', async (t) => {
  const r = await run(t, undefined);
  t.ok(r.received >= 10, `received ${r.received} batches`);
  t.equal(r.late, 0, 'no batch waited for the check phase');
  t.ok(r.inline > 0, `${r.inline} drains ran right after their receive`);
});

t.test('with inlineDrainsPerTurn 0 batches wait for the check phase (what the inline drain removes)', async (t) => {
  const r = await run(t, 0);
  t.ok(r.received >= 10);
  t.ok(r.late > 0, `${r.late} probes saw a received batch not yet applied`);
  t.equal(r.inline, 0);
});
