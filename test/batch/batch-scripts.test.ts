// The Batches API's Lua scripts on a real redis-server, through the store
// that defines them: the finalisation lease (taken only while the batch is
// finalizing, never from another holder, released only by its holder), the
// fenced push (no piece from a router whose lease went to another), and the
// index pass's byte budget (Redis holds about the budget's worth of answer
// bodies inside one call, whatever their sizes and order).
import t from 'tap';
import pino from 'pino';
import { Redis } from 'ioredis';
import { batchSchema } from '../../src/config/batch.js';
import { BatchStore } from '../../src/batch/store.js';
import { startRedis } from '../support/redis-util.js';

async function setup(t: Tap.Test) {
  const redis = await startRedis(t);
  const s = new BatchStore(batchSchema.parse({ redis: redis.url, keyPrefix: 'swy' }), pino({ level: 'silent' }));
  await s.redis.connect();
  t.teardown(() => s.redis.disconnect());
  const r = new Redis(redis.url);
  t.teardown(() => r.disconnect());
  return { s, r };
}

t.test('the finalisation lease: only while finalizing, never from another holder, dropped only by its holder', async (t) => {
  const { s, r } = await setup(t);
  const batch = s.batchKey('batch_x');
  const lease = s.finalizer('batch_x');
  await r.hset(batch, 'status', 'in_progress');
  t.equal(await s.redis.holdLease(lease, batch, 'a', 60_000), 0, 'not while in progress');
  await r.hset(batch, 'status', 'finalizing');
  t.equal(await s.redis.holdLease(lease, batch, 'a', 60_000), 1, 'taken while finalizing');
  t.equal(await s.redis.holdLease(lease, batch, 'a', 60_000), 1, 'renewed by its holder');
  t.equal(await s.redis.holdLease(lease, batch, 'b', 60_000), 0, 'not by another');
  t.equal(await s.redis.dropLease(lease, 'b'), 0, 'another cannot drop it');
  t.equal(await r.get(lease), 'a');
  await r.hset(batch, 'status', 'expired');
  t.equal(await s.redis.holdLease(lease, batch, 'a', 60_000), 0, 'an ended batch: not even its holder renews it (no second finalisation)');
  t.equal(await s.redis.dropLease(lease, 'a'), 1, 'its holder drops it');
  await r.hset(batch, 'status', 'finalizing');
  await r.set(lease, 'b', 'PX', 30);
  await new Promise((res) => setTimeout(res, 60));
  t.equal(await s.redis.holdLease(lease, batch, 'a', 60_000), 1, "an expired holder's lease is taken over");
});

t.test('a fenced push adds nothing once the lease is another router\'s', async (t) => {
  const { s, r } = await setup(t);
  const batch = s.batchKey('batch_y');
  const lease = s.finalizer('batch_y');
  await r.hset(batch, 'status', 'finalizing');
  t.equal(await s.redis.holdLease(lease, batch, 'a', 60_000), 1);
  const f = s.chunkedFile('file-y-output', 'y.jsonl', '', 0, { lease, token: 'a' });
  await f.add('x'.repeat(5 * 1024 * 1024)); // over fileChunkBytes: pushed now
  t.equal(await r.llen(s.fileData('file-y-output')), 2, 'pushed while held (two pieces of at most 4 MiB)');
  await r.set(lease, 'b');
  await f.add('y'.repeat(5 * 1024 * 1024)).then(
    () => t.fail('a push after the lease moved must throw'),
    (err: Error) => t.equal(err.constructor.name, 'LeaseLost'),
  );
  t.equal(await r.llen(s.fileData('file-y-output')), 2, 'nothing added to the new holder\'s file');
});

t.test("the index pass's byte budget: 16 small answers, then 200 of 256 KB: every entry once, Redis's peak memory about the budget, not the answers", async (t) => {
  const { s, r } = await setup(t);
  const stream = s.outStream('batch_z');
  for (let i = 0; i < 16; i++) await r.xadd(stream, '*', 'id', `batch_z.${i}`, 'status', '200', 'body', '{}');
  const big = 'b'.repeat(256 * 1024);
  for (let i = 16; i < 216; i++) await r.xadd(stream, '*', 'id', `batch_z.${i}`, 'status', '200', 'body', big);
  const peak = async () => Number(/used_memory_peak:(\d+)/.exec(await r.info('memory'))![1]);
  const before = await peak();
  const seen: string[] = [];
  let cur = '-';
  let calls = 0;
  for (;;) {
    const flat = await s.redis.indexResults(stream, cur, 1000, 1024 * 1024);
    calls++;
    for (let k = 1; k + 2 < flat.length; k += 3) {
      seen.push(String(flat[k + 1]));
      t.equal(Number(flat[k + 2]), Number(String(flat[k + 1]).split('.')[1]) < 16 ? 2 : big.length);
      cur = String(flat[k]);
    }
    if (Number(flat[0]) === 1 || flat.length === 1) break;
    if (calls > 500) break;
  }
  t.same(seen, Array.from({ length: 216 }, (_, i) => `batch_z.${i}`), 'every entry once, in order');
  t.ok(calls > 10, `the large answers went in many calls (${calls})`);
  const grew = (await peak()) - before;
  // 8 entries a read inside the script: ~2 MB of bodies; one call of 1,000 would have held all 51 MB
  t.ok(grew < 16 * 1024 * 1024, `Redis's peak memory grew ${(grew / 1048576).toFixed(1)} MB (the answers are 51 MB)`);
});
