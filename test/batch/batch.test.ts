// The async processor over a real redis-server and real simulated engines:
// results stored once and acknowledged, malformed entries dead-lettered, the
// utilisation ceiling, per-tenant quotas, a consumer crash (SIGKILL of a
// `switchyard serve`) with its pending entries reclaimed, and Redis lost
// mid-batch.
import t from 'tap';
import { writeFileSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { API_VERSION, validateConfig } from '../../src/config/schema.js';
import { startFleet, type FleetOptions } from '../../src/sim/index.js';
import { startRouter } from '../../src/server/router.js';
import { startRedis } from '../support/redis-util.js';
import { spawnServe, validatePlugin } from '../support/router-util.js';

async function until(cond: () => Promise<boolean> | boolean, ms = 20000, what = 'condition'): Promise<void> {
  const end = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

function batchConfig(urls: string[], redisUrl: string, batch: Record<string, unknown> = {}, pool: Record<string, unknown> = {}) {
  return {
    apiVersion: API_VERSION,
    kind: 'Router',
    pools: [{ name: 'p', models: ['open-model'], endpoints: urls.map((url, i) => ({ name: `e${i}`, url })), ...pool }],
    logging: { level: 'silent' },
    batch: { redis: redisUrl, stream: 'jobs', group: 'g', deadLetterStream: 'jobs:dead', keyPrefix: 'swy', ...batch },
  };
}

async function setup(t: Tap.Test, fleet: FleetOptions, batch: Record<string, unknown> = {}, pool: Record<string, unknown> = {}, n = 2) {
  const redis = await startRedis(t);
  const engines = await startFleet(n, fleet);
  const cfg = validateConfig(batchConfig(engines.urls, redis.url, batch, pool), validatePlugin);
  const client = new Redis(redis.url, { maxRetriesPerRequest: 1, retryStrategy: (k: number) => Math.min(50 * k, 500) });
  client.on('error', () => {});
  t.teardown(async () => {
    client.disconnect();
    await engines.close();
  });
  return { redis, engines, cfg, client };
}

const job = (id: string, result: string, extra: string[] = [], prompt = `job ${id}`) => [
  'id', id, 'result', result, 'body', JSON.stringify({ model: 'open-model', prompt, max_tokens: 4 }), ...extra,
];

/** Result stream entries as id → count. */
async function results(client: Redis, stream: string): Promise<Map<string, number>> {
  const all = (await client.xrange(stream, '-', '+')) as [string, string[]][];
  const m = new Map<string, number>();
  for (const [, f] of all) {
    const id = f[f.indexOf('id') + 1];
    m.set(id, (m.get(id) ?? 0) + 1);
  }
  return m;
}

t.test('results are stored once and acknowledged; malformed entries go to the dead-letter stream with the reason', async (t) => {
  const { cfg, client } = await setup(t, { timeScale: 0 });
  t.throws(() => validateConfig(batchConfig(['http://127.0.0.1:1'], 'http://nope', {}), validatePlugin), /batch\.redis: must be a redis:\/\//);
  t.throws(() => validateConfig(batchConfig(['http://127.0.0.1:1'], 'redis://x', { utilisationCeiling: 2 }), validatePlugin), /batch\.utilisationCeiling/);
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => router.close(200));
  for (let i = 0; i < 20; i++) await client.xadd('jobs', '*', ...job(`r${i}`, i % 2 === 0 ? 'stream:out' : `key:res:r${i}`));
  await client.xadd('jobs', '*', 'id', 'bad1', 'result', 'stream:out', 'body', '{not json');
  await client.xadd('jobs', '*', 'result', 'stream:out', 'body', '{}');
  await client.xadd('jobs', '*', ...job('bad3', 'somewhere'));
  await client.xadd('jobs', '*', 'id', 'bad4', 'result', 'stream:out', 'body', '{"prompt":"x"}');
  // the same request id enqueued again: one result
  await client.xadd('jobs', '*', ...job('r0', 'stream:out'));
  await until(async () => (await client.xlen('jobs:dead')) === 4 && router.batch!.stats.completed === 20 && router.batch!.stats.duplicates >= 1, 20000, 'all processed');
  const out = await results(client, 'out');
  t.equal(out.size, 10);
  t.ok([...out.values()].every((n) => n === 1), 'each id once in the result stream');
  const h = await client.hgetall('res:r1');
  t.equal(h.status, '200');
  t.match(JSON.parse(h.body), { object: 'text_completion', usage: { completion_tokens: 4 } });
  const dead = (await client.xrange('jobs:dead', '-', '+')) as [string, string[]][];
  const reasons = dead.map(([, f]) => f[f.indexOf('reason') + 1]);
  t.match(reasons[0], /body" is not JSON/);
  t.match(reasons[1], /field "id" must match/);
  t.match(reasons[2], /field "result" must be/);
  t.match(reasons[3], /body\.model must be/);
  const pending = (await client.xpending('jobs', 'g')) as [number, ...unknown[]];
  t.equal(pending[0], 0, 'nothing left pending');
  // an answer that is an error (unknown model) is a result too, stored with its status
  await client.xadd('jobs', '*', 'id', 'nomodel', 'result', 'key:res:nomodel', 'body', JSON.stringify({ model: 'other', prompt: 'x' }));
  await until(async () => (await client.exists('res:nomodel')) === 1, 10000, 'error result');
  t.equal(await client.hget('res:nomodel', 'status'), '404');
});

t.test('dispatch pauses while the pool is above the utilisation ceiling and resumes when interactive load falls', async (t) => {
  // slow engines: each interactive request holds a slot ~1 s
  const { cfg, client } = await setup(t, { timeScale: 1, itlMs: 50 }, { utilisationCeiling: 0.5, maxInFlight: 4 }, { batchLimit: 2 }, 1);
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => router.close(200));
  const interactive = [0, 1].map(() =>
    fetch(`${router.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'open-model', prompt: 'hi', max_tokens: 20 }) }),
  );
  await until(() => router.core.endpoints.all[0].inFlight === 2, 5000, 'interactive in flight');
  for (let i = 0; i < 3; i++) await client.xadd('jobs', '*', ...job(`b${i}`, 'stream:out'));
  await new Promise((r) => setTimeout(r, 400));
  t.equal(router.batch!.stats.inFlight, 0, 'no batch request dispatched while the pool is full');
  t.ok(router.batch!.stats.paused > 0, 'paused');
  t.equal(router.core.endpoints.all[0].inFlight, 2);
  await Promise.all(interactive);
  await until(async () => (await client.xlen('out')) === 3, 15000, 'batch done after the interactive load');
  t.pass('the batch ran once the pool had room');
});

t.test('per-tenant quotas: requests beyond the window stay pending', async (t) => {
  const { cfg, client } = await setup(t, { timeScale: 0 }, { quotas: { windowMs: 60000, tenants: { small: { requests: 2 } } }, reclaimIdleMs: 100000 });
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => router.close(200));
  for (let i = 0; i < 5; i++) await client.xadd('jobs', '*', ...job(`q${i}`, 'stream:out', ['tenant', 'small']));
  for (let i = 0; i < 3; i++) await client.xadd('jobs', '*', ...job(`u${i}`, 'stream:out', ['tenant', 'big']));
  await until(() => router.batch!.stats.completed === 5 && router.batch!.stats.deferredByQuota === 3, 10000, 'quota applied');
  const out = await results(client, 'out');
  t.equal([...out.keys()].filter((k) => k.startsWith('q')).length, 2, 'two of the small tenant');
  t.equal([...out.keys()].filter((k) => k.startsWith('u')).length, 3, 'the other tenant unlimited');
  const pending = (await client.xpending('jobs', 'g')) as [number, ...unknown[]];
  t.equal(pending[0], 3, 'the three over quota stay pending for a later window');
});

t.test('a consumer killed mid-batch: its pending entries are reclaimed by another, every result stored exactly once', async (t) => {
  const { redis, engines, client } = await setup(t, { timeScale: 1, itlMs: 20 });
  const dir = mkdtempSync(join(tmpdir(), 'swy-batch-'));
  const file = join(dir, 'a.yaml');
  const a = batchConfig(engines.urls, redis.url, { consumer: 'a', maxInFlight: 6, reclaimIdleMs: 400 });
  writeFileSync(file, JSON.stringify({ ...a, listen: { host: '127.0.0.1', port: 0 }, logging: { level: 'info' } }));
  const serve = await spawnServe(t, ['--config', file]);
  const N = 40;
  for (let i = 0; i < N; i++) await client.xadd('jobs', '*', ...job(`c${i}`, 'stream:out'));
  // killed while it holds delivered, unacknowledged entries (results stored, others in flight)
  await until(
    async () => (await client.xlen('out')) >= 5 && ((await client.xpending('jobs', 'g')) as [number])[0] > 0,
    20000,
    'some results from consumer a, and entries in flight there',
  );
  serve.child.kill('SIGKILL');
  await serve.exited;
  const before = await client.xlen('out');
  t.ok(before < N, `killed with ${before} of ${N} stored`);
  const pendingA = (await client.xpending('jobs', 'g')) as [number, ...unknown[]];
  t.ok(pendingA[0] > 0, `${pendingA[0]} entries left pending by the dead consumer`);
  const cfgB = validateConfig(batchConfig(engines.urls, redis.url, { consumer: 'b', maxInFlight: 6, reclaimIdleMs: 400 }), validatePlugin);
  const b = await startRouter(cfgB, { port: 0, host: '127.0.0.1' });
  t.teardown(() => b.close(200));
  await until(async () => (await results(client, 'out')).size === N, 30000, 'all results');
  await until(async () => ((await client.xpending('jobs', 'g')) as [number])[0] === 0, 10000, 'nothing pending');
  const out = await results(client, 'out');
  t.ok([...out.values()].every((n) => n === 1), 'each of the 40 results exactly once');
  t.ok(b.batch!.stats.reclaimed > 0, `consumer b reclaimed ${b.batch!.stats.reclaimed} entries`);
});

t.test('Redis lost mid-batch: results computed meanwhile are stored once it is back, nothing twice, and consuming resumes', async (t) => {
  // 4 tokens at 400 ms each: the answers come well after Redis is gone (with 40 ms a loaded machine let one be
  // stored on the old server between the eight being in flight and the kill, and lost with its data)
  const { redis, cfg, client } = await setup(t, { timeScale: 1, itlMs: 400 }, { maxInFlight: 8, reclaimIdleMs: 60000 });
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => router.close(200));
  for (let i = 0; i < 8; i++) await client.xadd('jobs', '*', ...job(`l${i}`, 'stream:out', [], `lost ${i}`));
  await until(() => router.batch!.stats.inFlight === 8, 10000, 'eight in flight');
  await redis.kill();
  t.equal(router.batch!.stats.completed, 0, 'nothing stored before Redis went away');
  // the answers arrive while Redis is away: each request ends with its result kept in memory, unstored
  await until(() => router.batch!.stats.inFlight === 0, 20000, 'the eight answered while Redis is away');
  await redis.restart(); // back, empty
  await until(async () => {
    try {
      return (await client.xlen('out')) === 8;
    } catch {
      return false;
    }
  }, 20000, 'the eight results written after the restart');
  const out = await results(client, 'out');
  t.same([...out.keys()].sort(), Array.from({ length: 8 }, (_, i) => `l${i}`).sort());
  t.ok([...out.values()].every((n) => n === 1), 'each once');
  // consuming resumes on the fresh server (the group is created again)
  for (let i = 0; i < 3; i++) await client.xadd('jobs', '*', ...job(`n${i}`, 'stream:out'));
  await until(async () => (await client.xlen('out')) === 11, 20000, 'new entries after the restart');
  t.pass('resumed');
});
