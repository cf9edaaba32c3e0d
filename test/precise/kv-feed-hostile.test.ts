// A hostile or broken KV-event publisher against the feed (#30 F3), over real
// ZMQ sockets. The first test runs a real router process (`switchyard serve`,
// default bounds) subscribed to a publisher this test drives: frames over the
// 64 MiB default, a valid-looking batch that would decode to hundreds of MB,
// garbage msgpack and nesting 100 000 deep. The router must stay up, its RSS
// bounded, its counters moving, and a good batch afterwards must still reach
// the index. The others drive a feed in this process: a flood over the byte
// bound while the loop is held, and a reset hook that throws.
import { readFileSync, writeFileSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { Publisher } from 'zeromq';
import { MatchResult, PrefixIndex } from '../../bindings/index.js';
import { KvEventFeed } from '../../src/kv-events/feed.js';
import { startEngine } from '../../src/sim/index.js';
import { waitFor } from '../support/precise-util.js';
import { spawnServe } from '../support/router-util.js';

const BLOCK = 16;
const MODEL = 'open-model';

const hex = (s: string) => Buffer.from(s.replace(/\s+/g, ''), 'hex');
const seq8 = (n: number) => {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(BigInt(n));
  return b;
};
// batch [1.5, [["BlockStored", [7], nil, 16 × "aaaa", 16, nil, "GPU"]], nil] (as in kv-events.test.ts)
const TOKENS_A = 'dc 0010' + ' ce61616161'.repeat(16);
const STORED_7 = hex(`93 cb3ff8000000000000 91 97 ab426c6f636b53746f726564 91 07 c0 ${TOKENS_A} 10 c0 a3475055 c0`);

/** One BlockStored of `blocks` 16-token blocks, every token id and hash a 1-byte int: ~17 bytes per block on the wire, 72 decoded. */
function hugeStored(blocks: number): Buffer {
  const tokens = blocks * BLOCK;
  const head = hex('93 cb3ff8000000000000 91 97 ab426c6f636b53746f726564');
  const arr32 = (n: number) => {
    const b = Buffer.alloc(5);
    b[0] = 0xdd;
    b.writeUInt32BE(n, 1);
    return b;
  };
  const hashes = Buffer.alloc(blocks, 0x05);
  const toks = Buffer.alloc(tokens, 0x01);
  return Buffer.concat([head, arr32(blocks), hashes, hex('c0'), arr32(tokens), toks, hex('10 c0 a3475055 c0')]);
}

/** [1.5, [[[[…]]]] nested `depth` deep, nil]: well-formed, but deeper than the decoder's 4096. */
function deep(depth: number): Buffer {
  return Buffer.concat([hex('93 cb3ff8000000000000'), Buffer.alloc(depth, 0x91), hex('c0 c0')]);
}

function rssMiB(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m![1]) / 1024;
}

function metric(text: string, name: string): number {
  let sum = 0;
  for (const line of text.split('\n')) if (line.startsWith(name + '{') || line.startsWith(name + ' ')) sum += Number(line.slice(line.lastIndexOf(' ') + 1));
  return sum;
}

async function publisher(t: Tap.Test, at = 'tcp://127.0.0.1:*'): Promise<{ pub: Publisher; endpoint: string; send(seq: number, payload: Buffer): Promise<void> }> {
  const pub = new Publisher({ linger: 0, sendHighWaterMark: 0 });
  await pub.bind(at);
  t.teardown(() => {
    if (!pub.closed) pub.close();
  });
  return { pub, endpoint: pub.lastEndpoint!, send: (seq, payload) => pub.send([Buffer.from('kv'), seq8(seq), payload]) };
}

t.test('a router survives oversize frames, a decode bomb, garbage and deep nesting with RSS bounded, and still applies good batches', async (t) => {
  const engine = await startEngine({ timeScale: 0 });
  t.teardown(() => engine.close());
  const p = await publisher(t);
  const dir = mkdtempSync(join(tmpdir(), 'swy-kv-hostile-'));
  const file = join(dir, 'router.json');
  writeFileSync(
    file,
    JSON.stringify({
      apiVersion: 'switchyard/v1',
      kind: 'Router',
      pools: [
        {
          name: 'p',
          models: [MODEL],
          prefix: { mode: 'precise', blockTokens: BLOCK, tokenizer: { type: 'sim' } },
          endpoints: [{ name: 'e0', url: engine.url, kvEvents: { endpoint: p.endpoint } }],
        },
      ],
    }),
  );
  const r = await spawnServe(t, ['--config', file, '--port', '0'], 60_000);
  const pid = r.child.pid!;
  const scrape = async () => (await fetch(r.url + '/metrics')).text();
  const chat = async () => {
    const res = await fetch(r.url + '/v1/completions', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL, prompt: 'hello', max_tokens: 2 }) });
    await res.text();
    return res.status;
  };
  const healthy = async () => metric(await scrape(), 'switchyard_kv_events_stream_healthy') === 1;
  const until = async (what: string, cond: () => Promise<boolean>, ms = 20_000) => {
    const end = Date.now() + ms;
    while (!(await cond())) {
      if (Date.now() > end) throw new Error(`timed out waiting for ${what}: ${(await scrape()).split('\n').filter((l) => l.startsWith('switchyard_kv_events')).join('\n')}`);
      await new Promise((res) => setTimeout(res, 50));
    }
  };
  let seq = 0;
  await until('subscribed', async () => {
    await p.send(seq++, STORED_7);
    return metric(await scrape(), 'switchyard_kv_events_blocks_stored_total') >= 1;
  });
  t.equal(await chat(), 200);
  const base = rssMiB(pid);
  let peak = base;
  const sampler = setInterval(() => {
    try {
      peak = Math.max(peak, rssMiB(pid));
    } catch {
      // exited: the checks below say so
    }
  }, 20);
  t.teardown(() => clearInterval(sampler));
  const peakNow = () => Math.max(peak, rssMiB(pid));

  // 1. frames over the 64 MiB default maxMessageBytes: libzmq drops the connection, the router never holds them
  const big = Buffer.alloc(80 << 20, 0x5a);
  const batches0 = metric(await scrape(), 'switchyard_kv_events_batches_total');
  for (let i = 0; i < 3; i++) await p.send(seq++, big);
  // (a router without the bound takes them in: wait for that too, so the RSS checks below say what it cost)
  await until('oversize frames dropped (or taken in)', async () => {
    const m = await scrape();
    return metric(m, 'switchyard_kv_events_disconnects_total') >= 1 || metric(m, 'switchyard_kv_events_batches_total') >= batches0 + 3;
  });
  t.ok(peakNow() - base < 64, `RSS growth after the oversize frames ${(peakNow() - base).toFixed(0)} MiB < 64`);
  t.ok(metric(await scrape(), 'switchyard_kv_events_disconnects_total') >= 1, 'the oversize publisher was disconnected (counted)');
  // 2. a batch under the frame bound that would decode to ~170 MB of records: malformed, cleared, counted
  const bomb = hugeStored(2_500_000);
  t.ok(bomb.length < 64 << 20 && bomb.length > 40 << 20, `decode bomb ${(bomb.length / 2 ** 20).toFixed(0)} MiB`);
  await until('reconnected', async () => {
    await p.send(seq++, STORED_7);
    return healthy();
  });
  const errs0 = metric(await scrape(), 'switchyard_kv_events_decode_errors_total');
  await p.send(seq++, bomb);
  await until('decode bomb counted', async () => metric(await scrape(), 'switchyard_kv_events_decode_errors_total') > errs0);
  // 3. garbage msgpack, wrong frame counts, bad seq, nesting 100 000 deep
  for (let i = 0; i < 200; i++) {
    const junk = Buffer.alloc(1 + ((i * 7919) % 4096));
    for (let k = 0; k < junk.length; k++) junk[k] = (i * 31 + k * 17) & 0xff;
    await p.send(seq++, junk);
  }
  await p.send(seq++, deep(100_000));
  await until('garbage counted', async () => metric(await scrape(), 'switchyard_kv_events_decode_errors_total') >= errs0 + 150);
  clearInterval(sampler);
  // 4. still routing, and a good batch after all that reaches the index (the endpoint was cleared first)
  t.equal(r.child.exitCode, null, 'the router is still running');
  t.equal(await chat(), 200, 'requests still route');
  const stored0 = metric(await scrape(), 'switchyard_kv_events_blocks_stored_total');
  await until('good batch applied', async () => {
    await p.send(seq++, STORED_7);
    return metric(await scrape(), 'switchyard_kv_events_blocks_stored_total') > stored0;
  });
  await until('stream healthy again', healthy);
  const after = rssMiB(pid);
  t.comment(`router RSS MiB: before ${base.toFixed(0)}, peak ${peak.toFixed(0)}, after ${after.toFixed(0)}`);
  // the bomb's own frame (~45 MiB) is held until the GC frees it; nothing may be kept or multiplied beyond that
  t.ok(peak - base < 128, `peak RSS growth ${(peak - base).toFixed(0)} MiB < 128`);
  t.ok(after - base < 96, `RSS growth after ${(after - base).toFixed(0)} MiB < 96`);
});

function newFeed(t: Tap.Test, o: ConstructorParameters<typeof KvEventFeed>[1] extends infer O ? Partial<O> : never): KvEventFeed {
  const index = new PrefixIndex({ blockSize: BLOCK * 4, maxEndpoints: 8, defaultCapacity: [1 << 20, 1 << 20, 1 << 20] });
  const feed = new KvEventFeed(index, { blockTokens: BLOCK, ...o });
  t.teardown(() => feed.close());
  return feed;
}

function held(feed: KvEventFeed): number {
  return feed.index.matchPrompt(Buffer.from('a'.repeat(64)), PrefixIndex.seedFor(MODEL), Int32Array.of(0), new MatchResult()).matched[0]!;
}

t.test('a flood over the queue byte bound drops the oldest by bytes, clears, and recovers', async (t) => {
  const p = await publisher(t);
  const feed = newFeed(t, { maxQueuedBytes: 1 << 20 });
  const stream = feed.add({ id: 0, name: 'raw', endpoint: p.endpoint, model: MODEL });
  await waitFor('connect', () => stream.healthy);
  await new Promise((r) => setTimeout(r, 100));
  // 64 batches of 256 KiB (16 MiB) arrive while the loop is held: far under the 4096-batch count bound
  const frame = Buffer.alloc(256 << 10, 0xc1); // 0xc1: malformed at its first byte, cheap to reject
  const sends: Promise<void>[] = [];
  for (let i = 0; i < 64; i++) sends.push(p.send(i, frame));
  await Promise.all(sends);
  const end = Date.now() + 300;
  while (Date.now() < end) {
    /* hold the loop while zmq's I/O thread buffers the batches */
  }
  await waitFor('flood received', () => stream.counters.batches === 64);
  t.ok(stream.counters.droppedBytes > 0, `dropped by bytes: ${stream.counters.droppedBytes}`);
  const decoded = stream.counters.decodeErrors;
  t.ok(decoded + stream.counters.dropped === 64, `${decoded} decoded + ${stream.counters.dropped} dropped = 64`);
  t.ok(decoded <= 64 - stream.counters.dropped && stream.counters.dropped >= 32, 'at most ~1 MiB of the 16 MiB reached the decoder');
  // a good batch afterwards is applied
  await p.send(64, STORED_7);
  await waitFor('applied after the flood', () => held(feed) === 1);
  await waitFor('healthy again', () => stream.healthy || stream.problem === 'decode-errors');
});

t.test('a reset hook that throws does not end the process; the stream goes on', async (t) => {
  const p = await publisher(t);
  const feed = newFeed(t, {});
  let calls = 0;
  feed.onEngineReset = () => {
    calls++;
    throw new Error('hook failed');
  };
  const stream = feed.add({ id: 0, name: 'raw', endpoint: p.endpoint, model: MODEL });
  await waitFor('connect', () => stream.healthy);
  await new Promise((r) => setTimeout(r, 100));
  await p.send(0, STORED_7);
  await waitFor('stored', () => held(feed) === 1);
  // the publisher goes away (a disconnect: the hook runs and throws) and comes back on the same address
  p.pub.close();
  await waitFor('reset hook ran', () => calls >= 1, 10_000);
  t.ok(feed.resetHookErrors >= 1, `hook errors counted: ${feed.resetHookErrors}`);
  t.equal(held(feed), 0, 'the endpoint was cleared');
  const again = await publisher(t, p.endpoint);
  await waitFor(
    'applied after the reset',
    () => {
      void again.send(0, STORED_7);
      return held(feed) === 1;
    },
    10_000,
  );
  t.pass('still receiving');
});
