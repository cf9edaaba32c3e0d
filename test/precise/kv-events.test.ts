// KV events end to end over real ZMQ sockets: the simulator publishes, the
// feed subscribes, decodes and applies into a real native index; the router's
// request-time keys (token bytes of the simulator's tokenizer = the prompt's
// bytes) then match what the engine holds. Plus hand-built msgpack fixtures
// of both layouts from the documented schema, published by a raw PUB socket.
import t from 'tap';
import { Publisher, Router } from 'zeromq';
import { MatchResult, PrefixIndex } from '../../bindings/index.js';
import { KvEventFeed } from '../../src/kv-events/feed.js';
import { API_VERSION, validateConfig } from '../../src/config/schema.js';
import { EndpointSet } from '../../src/endpoints/endpoint.js';
import { ConfigError } from '../../src/errors.js';
import { buildPrecise, kvFeedEndpoints } from '../../src/server/precise.js';
import { startEngine, type SimEngine } from '../../src/sim/index.js';

const BLOCK = 16; // tokens per engine block
const MODEL = 'open-model';

async function until(what: string, cond: () => boolean, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

function newFeed(t: Tap.Test, o: { maxQueuedBatches?: number; replayTimeoutMs?: number } = {}): KvEventFeed {
  const index = new PrefixIndex({ blockSize: BLOCK * 4, maxEndpoints: 8, defaultCapacity: [1 << 20, 1 << 20, 1 << 20] });
  const feed = new KvEventFeed(index, { blockTokens: BLOCK, ...o });
  t.teardown(() => feed.close());
  return feed;
}

/** Leading blocks of `prompt` endpoint `id` holds per the precise index, and per tier. */
function match(feed: KvEventFeed, prompt: string, id = 0, model = MODEL): { blocks: number; tiers: number[] } {
  const r = feed.index.matchPrompt(Buffer.from(prompt), PrefixIndex.seedFor(model), Int32Array.of(id), new MatchResult());
  return { blocks: r.matched[0]!, tiers: [r.tiers[0]!, r.tiers[1]!, r.tiers[2]!] };
}

async function complete(e: SimEngine, prompt: string, model = MODEL): Promise<void> {
  const r = await fetch(e.url + '/v1/completions', { method: 'POST', body: JSON.stringify({ model, prompt, max_tokens: 2 }) });
  t.equal(r.status, 200);
  await r.text();
}

function eventsConfig(extra: Record<string, unknown> = {}) {
  return { enable_kv_cache_events: true, publisher: 'zmq' as const, endpoint: 'tcp://127.0.0.1:*', replay_endpoint: 'tcp://127.0.0.1:*', ...extra };
}

const A = 'a'.repeat(64 * 5); // 5 blocks of 16 tokens
const B = 'b'.repeat(64 * 3) + 'tail';

for (const layout of ['array', 'map'] as const) {
  for (const format of ['int', 'bytes'] as const) {
    t.test(`simulator events (${layout} layout, ${format} hashes) feed the index; eviction and offload move tiers`, async (t) => {
      const e = await startEngine({ timeScale: 0, kvCacheBlocks: 12, cpuOffloadBlocks: 64, kvEventsConfig: eventsConfig({ layout, block_hash_format: format, topic: 'kv@sim@open-model' }) });
      t.teardown(() => e.close());
      const feed = newFeed(t);
      const stream = feed.add({ id: 0, name: 'e0', endpoint: e.kvEvents!.endpoint, replayEndpoint: e.kvEvents!.replayEndpoint, topic: 'kv@', model: MODEL });
      await until('connect', () => stream.healthy);
      await new Promise((r) => setTimeout(r, 100)); // the subscription reaches the publisher
      await complete(e, A);
      await until('A stored', () => match(feed, A).blocks === 5);
      t.same(match(feed, A).tiers, [5, 0, 0], 'all on GPU');
      t.equal(match(feed, B).blocks, 0);
      // B needs 4 blocks + its tail; the cache (12) then evicts A's idle blocks to the host tier
      await complete(e, B);
      await complete(e, 'c'.repeat(64 * 6));
      await until('A offloaded', () => match(feed, A).tiers[1]! > 0);
      const m = match(feed, A);
      t.equal(m.blocks, 5, 'A is still matched, partly from host memory');
      t.ok(e.stats().hostCachedBlocks > 0);
      t.equal(feed.badEvents + feed.unknownEvents + feed.blockSizeMismatch, 0, 'nothing rejected');
      t.equal(feed.totals[2], 0, 'no orphans');
      // a request for A reloads it from the host: the engine reports host hits, the index sees GPU again
      await complete(e, A + 'more');
      t.ok(e.stats().hostHitTokens > 0, 'host hits measured');
      await until('A back on GPU', () => match(feed, A).tiers[0] === 5);
      // a cleared cache is reported block by block
      e.clearCache();
      await until('cleared', () => match(feed, A).blocks === 0 && match(feed, B).blocks === 0);
    });
  }
}

t.test('LoRA blocks chain from the adapter seed, apart from the base model', async (t) => {
  const e = await startEngine({ timeScale: 0, loras: ['sql'], kvEventsConfig: eventsConfig() });
  t.teardown(() => e.close());
  const feed = newFeed(t);
  const stream = feed.add({ id: 0, name: 'e0', endpoint: e.kvEvents!.endpoint, model: MODEL });
  await until('connect', () => stream.healthy);
  await new Promise((r) => setTimeout(r, 100));
  await complete(e, A, 'sql');
  await until('stored', () => match(feed, A, 0, 'sql').blocks === 5);
  t.equal(match(feed, A).blocks, 0, 'the base model does not hold the adapter blocks');
});

t.test('a publisher restart at seq 0 clears the endpoint; a gap is replayed', async (t) => {
  const e = await startEngine({ timeScale: 0, kvEventsConfig: eventsConfig() });
  t.teardown(() => e.close());
  const feed = newFeed(t);
  const stream = feed.add({ id: 0, name: 'e0', endpoint: e.kvEvents!.endpoint, replayEndpoint: e.kvEvents!.replayEndpoint, model: MODEL });
  await until('connect', () => stream.healthy);
  await new Promise((r) => setTimeout(r, 100));
  await complete(e, A);
  await complete(e, B);
  await until('stored', () => match(feed, A).blocks === 5 && match(feed, B).blocks === 3);
  // restart: new sockets, seq from 0, an empty cache (what it held before is gone)
  e.clearCache();
  await e.kvEvents!.restart();
  await until('reconnected', () => stream.healthy);
  await new Promise((r) => setTimeout(r, 200));
  await complete(e, 'z'.repeat(64 * 2));
  // seen as a disconnect (entries cleared, then a fresh join) or, if the reconnect beat the socket monitor, as seq 0
  await until('restart seen', () => stream.counters.restarts === 1 || stream.counters.clears >= 1);
  await until('cleared', () => match(feed, A).blocks === 0 && match(feed, 'z'.repeat(64 * 2)).blocks === 2);
});

// ---- hand-built fixtures (bytes written from the documented schema, not by our encoder)

const hex = (s: string) => Buffer.from(s.replace(/\s+/g, ''), 'hex');
const seq8 = (n: number) => {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(BigInt(n));
  return b;
};
// 16 token ids of 4 bytes each: "aaaa" × 16 → 0x61616161 little-endian = 1633771873 = ce 61 61 61 61
const TOKENS_A = 'dc 0010' + ' ce61616161'.repeat(16);
// array layout, batch [ts 1.5, [["BlockStored", [7], nil, tokens, 16, nil, "GPU"]], nil]
const ARRAY_STORED = hex(`93 cb3ff8000000000000 91 97 ab426c6f636b53746f726564 91 07 c0 ${TOKENS_A} 10 c0 a3475055 c0`);
// array layout: ["BlockRemoved", [7], "GPU"]
const ARRAY_REMOVED = hex('93 cb3ff8000000000000 91 93 ac426c6f636b52656d6f766564 91 07 a3475055 c0');
// map layout, hash as 8 raw bytes (bin 8) = 7, medium omitted (GPU), data_parallel_rank 0
const MAP_STORED = hex(
  `93 cb3ff8000000000000 91 84 a474797065 ab426c6f636b53746f726564 ac626c6f636b5f686173686573 91 c408 0000000000000007 a9746f6b656e5f696473 ${TOKENS_A} aa626c6f636b5f73697a65 10 00`,
);
// map layout: {"type": "AllBlocksCleared"}
const MAP_CLEARED = hex('93 cb3ff8000000000000 91 81 a474797065 b0416c6c426c6f636b73436c6561726564 c0');

async function rawPublisher(t: Tap.Test): Promise<{ pub: Publisher; endpoint: string; send(seq: number, payload: Buffer): Promise<void> }> {
  const pub = new Publisher({ linger: 0 });
  await pub.bind('tcp://127.0.0.1:*');
  t.teardown(() => pub.close());
  return { pub, endpoint: pub.lastEndpoint!, send: (seq, payload) => pub.send([Buffer.from('kv'), seq8(seq), payload]) };
}

t.test('hand-built fixtures of both layouts; bad input is counted, never applied', async (t) => {
  const p = await rawPublisher(t);
  const feed = newFeed(t);
  const stream = feed.add({ id: 0, name: 'raw', endpoint: p.endpoint, model: MODEL });
  await until('connect', () => stream.healthy);
  await new Promise((r) => setTimeout(r, 100));
  const A1 = 'a'.repeat(64);
  await p.send(0, ARRAY_STORED);
  await until('array stored', () => match(feed, A1).blocks === 1);
  await p.send(1, ARRAY_REMOVED);
  await until('array removed', () => match(feed, A1).blocks === 0);
  await p.send(2, MAP_STORED);
  await until('map stored (bytes hash, rank 0)', () => match(feed, A1).blocks === 1);
  await p.send(3, MAP_CLEARED);
  await until('map cleared', () => match(feed, A1).blocks === 0);
  // malformed msgpack, an unknown event type, a hash of the wrong width, a repeated seq
  await p.send(4, hex('c1 ff 00'));
  await until('decode error counted', () => stream.counters.decodeErrors === 1);
  await p.send(5, hex('93 cb3ff8000000000000 91 91 a3466f6f c0'));
  await until('unknown event counted', () => feed.unknownEvents === 1);
  await p.send(6, hex(`93 cb3ff8000000000000 91 97 ab426c6f636b53746f726564 91 c403 010203 c0 ${TOKENS_A} 10 c0 a3475055 c0`));
  await until('short hash counted', () => feed.badEvents === 1);
  t.equal(match(feed, A1).blocks, 0, 'the event with a bad hash stored nothing');
  await p.send(6, ARRAY_STORED);
  await until('duplicate counted', () => stream.counters.duplicates === 1);
  t.equal(match(feed, A1).blocks, 0, 'a repeated seq is not applied');
  // a gap with no replay socket clears the endpoint before applying what follows
  await p.send(7, ARRAY_STORED);
  await until('stored again', () => match(feed, A1).blocks === 1);
  await p.send(9, ARRAY_REMOVED);
  await until('gap counted', () => stream.counters.gaps === 1 && stream.counters.clears >= 2);
  t.equal(match(feed, A1).blocks, 0);
  t.ok(stream.healthy, 'one gap does not make the stream unhealthy');
});

t.test('a gap is filled from the replay socket', async (t) => {
  const p = await rawPublisher(t);
  const router = new Router({ linger: 0 });
  await router.bind('tcp://127.0.0.1:*');
  t.teardown(() => router.close());
  const asked: number[] = [];
  void (async () => {
    try {
      for await (const frames of router) {
        const start = Number(frames[frames.length - 1]!.readBigUInt64BE());
        asked.push(start);
        // the replay buffer holds seq 1 (the stored event the subscriber missed)
        await router.send([frames[0]!, Buffer.alloc(0), seq8(1), ARRAY_STORED]);
        await router.send([frames[0]!, Buffer.alloc(0), hex('ffffffffffffffff'), Buffer.alloc(0)]);
      }
    } catch {
      // closed
    }
  })();
  const feed = newFeed(t);
  const stream = feed.add({ id: 0, name: 'raw', endpoint: p.endpoint, replayEndpoint: router.lastEndpoint!, model: MODEL });
  await until('connect', () => stream.healthy);
  await new Promise((r) => setTimeout(r, 100));
  await p.send(0, MAP_CLEARED);
  await until('seq 0', () => stream.counters.batches === 1);
  await p.send(2, MAP_CLEARED.subarray(0, MAP_CLEARED.length)); // seq 1 missed
  await until('replayed', () => stream.counters.replays === 1 && feed.totals[0]! >= 1);
  t.same(asked, [1]);
  // replayed seq 1 stored block 7, then live seq 2 cleared everything
  await until('cleared after replay', () => match(feed, 'a'.repeat(64)).blocks === 0);
  t.equal(stream.counters.replayFailures, 0);
});

t.test('a flood beyond the queue drops the oldest, clears, and marks the stream unhealthy', async (t) => {
  const p = await rawPublisher(t);
  const feed = newFeed(t, { maxQueuedBatches: 4 });
  const stream = feed.add({ id: 0, name: 'raw', endpoint: p.endpoint, model: MODEL });
  await until('connect', () => stream.healthy);
  await new Promise((r) => setTimeout(r, 100));
  // block the loop so everything arrives before a drain: the queue overflows
  const sends: Promise<void>[] = [];
  for (let i = 0; i < 50; i++) sends.push(p.send(i, ARRAY_STORED));
  await Promise.all(sends);
  const end = Date.now() + 200;
  while (Date.now() < end) {
    /* hold the loop while zmq's I/O thread buffers the batches */
  }
  await until('overflow', () => stream.counters.dropped > 0);
  t.ok(stream.counters.dropped > 0, `dropped ${stream.counters.dropped}`);
  await until('healthy again once drained', () => stream.healthy && stream.queued === 0);
});

t.test('data-parallel ranks from config: endpoints sharing a publisher each hold their rank', async (t) => {
  const p = await rawPublisher(t);
  const cfgOf = (eps: Record<string, unknown>[]) =>
    validateConfig(
      {
        apiVersion: API_VERSION,
        kind: 'Router',
        pools: [{ name: 'p', models: [MODEL], prefix: { mode: 'precise', blockTokens: BLOCK }, endpoints: eps }],
      },
      undefined,
    );
  const cfg = cfgOf([
    { name: 'r1', url: 'http://127.0.0.1:1', kvEvents: { endpoint: p.endpoint, dataParallelRank: 1 } },
    { name: 'r0', url: 'http://127.0.0.1:1', kvEvents: { endpoint: p.endpoint, dataParallelRank: 0 } },
  ]);
  const set = new EndpointSet(cfg.pools, cfg.dataLayer);
  const fe = kvFeedEndpoints(cfg, set);
  t.equal(fe.length, 1, 'one subscription for the shared publisher');
  t.equal(fe[0]!.name, 'r0', "batches without a rank go to rank 0's endpoint");
  t.same(fe[0]!.ranks, { 0: set.byName('r0')!.id, 1: set.byName('r1')!.id });
  const feedsOf = (eps: Record<string, unknown>[]) => {
    const c = cfgOf(eps);
    return kvFeedEndpoints(c, new EndpointSet(c.pools, c.dataLayer));
  };
  t.throws(() => feedsOf([{ name: 'a', url: 'http://127.0.0.1:1', kvEvents: { endpoint: p.endpoint } }, { name: 'b', url: 'http://127.0.0.1:2', kvEvents: { endpoint: p.endpoint } }]), ConfigError);
  t.throws(
    () =>
      feedsOf([
        { name: 'a', url: 'http://127.0.0.1:1', kvEvents: { endpoint: p.endpoint, dataParallelRank: 2 } },
        { name: 'b', url: 'http://127.0.0.1:2', kvEvents: { endpoint: p.endpoint, dataParallelRank: 2 } },
      ]),
    /rank 2 of .* is already a's/,
  );
  const precise = buildPrecise(cfg, set)!;
  t.teardown(() => precise.close());
  const stream = precise.feed.streams[0]!.stream;
  await until('connect', () => stream.healthy);
  await new Promise((r) => setTimeout(r, 100));
  const A1 = 'a'.repeat(64);
  const rank1 = Buffer.from(ARRAY_STORED);
  rank1[rank1.length - 1] = 0x01; // data_parallel_rank 1
  const r0 = set.byName('r0')!.id;
  const r1 = set.byName('r1')!.id;
  await p.send(0, rank1);
  await until('rank 1 stored', () => match(precise.feed, A1, r1).blocks === 1);
  t.equal(match(precise.feed, A1, r0).blocks, 0, 'rank 0 does not hold it');
  await p.send(1, ARRAY_STORED);
  await until('rank 0 stored (no rank in the batch)', () => match(precise.feed, A1, r0).blocks === 1);
  const rank3 = Buffer.from(ARRAY_STORED);
  rank3[rank3.length - 1] = 0x03;
  await p.send(2, rank3);
  await until('an unmapped rank is dropped', () => precise.feed.droppedRanks === 1);
});
