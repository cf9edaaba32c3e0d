// Batch quotas (batch.quotas) on the rate-limit counters, over real
// redis-servers and real simulated engines: a tenant's quota is its batch
// subject `b:<tenant>` with the window as its period (a burst of the window's
// budget, refilled evenly), charged at dispatch by the counters' Lua script
// and corrected by the answer's usage; a line over its quota stays pending
// and runs once the quota has room again; another tenant is not held; two
// routers on one Redis share each quota (on the batch Redis, or on
// rateLimits.redis when the router has it); refusals are counted in
// switchyard_rate_limited_total{limit="batch-quota"}.
import t from 'tap';
import { Redis } from 'ioredis';
import { API_VERSION, validateConfig, type RouterConfig } from '../../src/config/schema.js';
import { startFleet, type FleetOptions } from '../../src/sim/index.js';
import { startRouter } from '../../src/server/router.js';
import { startRedis } from '../support/redis-util.js';
import { validatePlugin } from '../support/router-util.js';
import { send } from '../support/sim-util.js';

async function until(cond: () => Promise<boolean> | boolean, ms: number, what: string): Promise<void> {
  const end = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

function config(urls: string[], redisUrl: string, batch: Record<string, unknown>, extra: Record<string, unknown> = {}): RouterConfig {
  return validateConfig(
    {
      apiVersion: API_VERSION,
      kind: 'Router',
      pools: [{ name: 'p', models: ['open-model'], endpoints: urls.map((url, i) => ({ name: `e${i}`, url })) }],
      logging: { level: 'silent' },
      batch: { redis: redisUrl, stream: 'jobs', group: 'g', deadLetterStream: 'jobs:dead', keyPrefix: 'swy', reclaimIdleMs: 500, ...batch },
      ...extra,
    },
    validatePlugin,
  ) as RouterConfig;
}

async function setup(t: Tap.Test, fleet: FleetOptions = { timeScale: 0 }) {
  const redis = await startRedis(t);
  const engines = await startFleet(1, fleet);
  const client = new Redis(redis.url, { maxRetriesPerRequest: 1 });
  client.on('error', () => {});
  t.teardown(async () => {
    client.disconnect();
    await engines.close();
  });
  return { redis, engines, client };
}

const line = (id: string, tenant: string, body: Record<string, unknown> = { max_tokens: 4 }) => [
  'id', id, 'result', 'stream:out', 'tenant', tenant, 'body', JSON.stringify({ model: 'open-model', prompt: `job ${id}`, ...body }),
];

/** Enqueues the lines in one MULTI: the processor reads them together. */
async function enqueue(client: Redis, lines: string[][]): Promise<void> {
  const m = client.multi();
  for (const l of lines) m.xadd('jobs', '*', ...l);
  await m.exec();
}

interface Result {
  id: string;
  /** When it was stored (the result entry's id: Redis's clock, ms). */
  at: number;
  status: string;
  usage: number;
}

async function results(client: Redis): Promise<Result[]> {
  const all = (await client.xrange('out', '-', '+')) as [string, string[]][];
  return all.map(([eid, f]) => {
    const body = JSON.parse(f[f.indexOf('body') + 1]!) as { usage?: { total_tokens: number } };
    return { id: f[f.indexOf('id') + 1]!, at: Number(eid.split('-')[0]), status: f[f.indexOf('status') + 1]!, usage: body.usage?.total_tokens ?? -1 };
  });
}

/** Redis's clock, ms. */
async function redisNow(client: Redis): Promise<number> {
  const [s, us] = await client.time();
  return Number(s) * 1000 + Number(us) / 1000;
}

/** Tokens a subject's hash holds charged now: (token TAT − now) × limit ÷ period. */
async function charged(client: Redis, key: string, limit: number, periodMs: number): Promise<number> {
  const k = Number(await client.hget(key, 'k'));
  return (Math.max(0, k - (await redisNow(client))) * limit) / periodMs;
}

const metric = async (url: string) => {
  const body = (await send(url, 'GET', '/metrics').done).body;
  const m = /switchyard_rate_limited_total\{limit="batch-quota"\} (\d+)/.exec(body);
  return m === null ? -1 : Number(m[1]);
};

t.test('a tenant over its request quota: lines wait and run as the window refills; another tenant is not held; refusals on /metrics', async (t) => {
  const { client, engines, redis } = await setup(t);
  // 2 requests a 4 s window: a burst of 2, then one every 2 s
  const cfg = config(engines.urls, redis.url, { quotas: { windowMs: 4000, tenants: { small: { requests: 2 }, big: { requests: 100 } } } });
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => router.close(200));
  await enqueue(client, [...[0, 1, 2, 3].map((i) => line(`s${i}`, 'small')), ...[0, 1, 2, 3].map((i) => line(`b${i}`, 'big'))]);
  await until(async () => (await client.xlen('out')) === 8, 30000, 'every line stored');
  const out = await results(client);
  t.ok(out.every((r) => r.status === '200'), 'every line answered 200');
  const small = out.filter((r) => r.id.startsWith('s')).map((r) => r.at).sort((a, b) => a - b);
  const big = out.filter((r) => r.id.startsWith('b')).map((r) => r.at);
  t.equal(small.length, 4);
  // the third can be admitted 2 s after the burst, the fourth 4 s after (bounds from below: a busy machine only adds to them)
  t.ok(small[2]! - small[0]! >= 1000, `the third small line waited for the window to refill (${small[2]! - small[0]!} ms after the first)`);
  t.ok(small[3]! - small[0]! >= 3000, `the fourth waited longer (${small[3]! - small[0]!} ms)`);
  t.ok(Math.max(...big) < small[2]!, "the other tenant's lines did not wait behind the small tenant's quota");
  const stats = router.batch!.stats;
  t.ok(stats.deferredByQuota >= 2, `the lines over quota were deferred (${stats.deferredByQuota} times)`);
  t.equal(stats.completed, 8);
  t.equal(await metric(router.url), stats.deferredByQuota, 'switchyard_rate_limited_total{limit="batch-quota"} counts every deferral');
  // the counters are the rate limits': one hash per tenant subject, no per-window keys
  t.equal(await client.type('swy:rl:b:small'), 'hash', "the small tenant's batch subject");
  t.same(await client.keys('swy:quota:*'), [], 'no per-window quota keys');
  const pending = (await client.xpending('jobs', 'g')) as [number, ...unknown[]];
  t.equal(pending[0], 0, 'nothing left pending');
});

t.test('token quota: the estimate charged at dispatch is replaced by the usage (a refund lets the next lines run)', async (t) => {
  const { client, engines, redis } = await setup(t);
  // 1,000 tokens an hour: each line's estimate (prompt bytes ÷ 4 + max_tokens 900) is 917, its usage 3 (the stop string ends the text at once)
  const W = 3_600_000;
  const cfg = config(engines.urls, redis.url, { quotas: { windowMs: W, tenants: { tk: { tokens: 1000 } } } });
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => router.close(200));
  const body = { max_tokens: 900, stop: ' ' };
  await enqueue(client, [0, 1, 2].map((i) => line(`r${i}`, 'tk', body)));
  // without the correction the second line would wait for 834 tokens to refill: 50 minutes
  await until(async () => (await client.xlen('out')) === 3, 20000, 'all three lines stored');
  const out = await results(client);
  t.ok(out.every((r) => r.status === '200' && r.usage > 0 && r.usage < 20), `small answers (usage ${out.map((r) => r.usage).join(', ')})`);
  t.ok(router.batch!.stats.deferredByQuota >= 1, 'a line read with the first waited for its correction');
  const used = out.reduce((n, r) => n + r.usage, 0);
  // what the tenant's subject holds is the three answers' usage, not 3 × 917 (an hour's refill in these seconds: under 3 tokens)
  await until(async () => Math.abs((await charged(client, 'swy:rl:b:tk', 1000, W)) - used) <= 3, 5000, 'the charge equal to the usage');
  t.pass(`the subject holds ${Math.round(await charged(client, 'swy:rl:b:tk', 1000, W))} tokens charged, the usage was ${used}`);
});

t.test('token quota: an answer larger than its estimate leaves a debt that holds the next line', async (t) => {
  // no max_tokens: the estimate counts 16 output tokens, the engine writes 2,500
  const { client, engines, redis } = await setup(t, { timeScale: 0, defaultMaxTokens: 2500 });
  const W = 2000;
  const Q = 500;
  const cfg = config(engines.urls, redis.url, { quotas: { windowMs: W, tenants: { debt: { tokens: Q } } } });
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => router.close(200));
  await enqueue(client, [line('d0', 'debt', {})]);
  await until(async () => (await client.xlen('out')) === 1, 20000, 'the first line stored');
  const [first] = await results(client);
  t.ok(first!.usage > 2400, `the answer used ${first!.usage} tokens`);
  // the correction: 2,502 tokens at 4 ms each put the token TAT ~10 s ahead, 8 s past the window
  await until(async () => (await charged(client, 'swy:rl:b:debt', Q, W)) > Q, 5000, 'the debt in the shared counter');
  await enqueue(client, [line('d1', 'debt', {})]);
  await until(async () => (await client.xlen('out')) === 2, 30000, 'the second line stored');
  const second = (await results(client))[1]!;
  t.equal(second.id, 'd1');
  t.ok(second.at - first!.at >= 4000, `the second line waited for the debt to be paid (${second.at - first!.at} ms after the first; ~8 s)`);
  t.ok(router.batch!.stats.deferredByQuota >= 1, 'it was deferred by the quota');
});

t.test('a line the interactive rate limits defer gets its quota request back: the quota is not spent by lines that did not run', async (t) => {
  const { client, engines, redis } = await setup(t);
  // the tenant may run one request a minute (rateLimits) and three lines an hour (its batch quota)
  const cfg = config(engines.urls, redis.url, { quotas: { windowMs: 3_600_000, tenants: { both: { requests: 3 } } } }, { rateLimits: { tenants: { both: { requestsPerMinute: 1 } } } });
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => router.close(200));
  await enqueue(client, [0, 1, 2].map((i) => line(`g${i}`, 'both')));
  // the two the minute refuses come back every reclaimIdleMs; each time the quota admits them again
  await until(() => router.batch!.stats.completed === 1 && router.batch!.stats.deferredByRateLimit >= 6, 30000, 'three rounds of rate-limit deferrals');
  t.equal(router.batch!.stats.deferredByQuota, 0, 'never refused by the quota: the deferred lines gave their requests back');
  // one request charged an hour (20 minutes of TAT for a limit of 3); the flush of the last give-back within 20 ms
  const held = async () => ((Number(await client.hget('swy:rl:b:both', 'r')) - (await redisNow(client))) * 3) / 3_600_000;
  await until(async () => Math.abs((await held()) - 1) < 0.1, 5000, 'one request held by the quota');
  t.equal((await results(client)).length, 1);
});

for (const store of ['batch.redis', 'rateLimits.redis'] as const) {
  t.test(`two routers share each tenant's quota (counters on ${store})`, async (t) => {
    const { client, engines, redis } = await setup(t);
    const rl = store === 'rateLimits.redis' ? await startRedis(t) : null;
    const rlClient = rl === null ? null : new Redis(rl.url, { maxRetriesPerRequest: 1 });
    rlClient?.on('error', () => {});
    t.teardown(() => rlClient?.disconnect());
    // 3 requests an hour: nothing refills during the test
    const batch = { quotas: { windowMs: 3_600_000, tenants: { shared: { requests: 3 } } } };
    // a generous timeout: a loaded machine must not turn into a fail-open (local) count
    const extra = rl === null ? {} : { rateLimits: { redis: { url: rl.url, timeoutMs: 2000 } } };
    const one = await startRouter(config(engines.urls, redis.url, { ...batch, consumer: 'one' }, extra), { port: 0, host: '127.0.0.1' });
    t.teardown(() => one.close(200));
    await enqueue(client, [...[0, 1, 2].map((i) => line(`a${i}`, 'shared')), line('x0', 'other')]);
    await until(() => one.batch!.stats.completed === 4, 20000, 'router one ran the quota and the other tenant');
    await one.close(200);
    // router two: the quota router one used is spent for it too
    const two = await startRouter(config(engines.urls, redis.url, { ...batch, consumer: 'two' }, extra), { port: 0, host: '127.0.0.1' });
    t.teardown(() => two.close(200));
    await enqueue(client, [...[0, 1, 2].map((i) => line(`c${i}`, 'shared')), line('x1', 'other')]);
    await until(() => two.batch!.stats.completed === 1 && two.batch!.stats.deferredByQuota >= 3, 20000, "router two deferred the tenant's lines");
    const ids = (await results(client)).map((r) => r.id).sort();
    t.same(ids, ['a0', 'a1', 'a2', 'x0', 'x1'], "no line of the tenant ran on router two; the other tenant's did");
    const pending = (await client.xpending('jobs', 'g')) as [number, ...unknown[]];
    t.equal(pending[0], 3, 'the three over quota stay pending');
    t.ok((await metric(two.url)) >= 3, 'router two counts its refusals');
    if (rlClient === null) t.equal(await client.type('swy:rl:b:shared'), 'hash', 'the subject on the batch Redis');
    else {
      t.equal(await rlClient.type('switchyard:rl:b:shared'), 'hash', "the subject on rateLimits.redis, under its keyPrefix");
      t.equal(await client.exists('swy:rl:b:shared'), 0, 'not on the batch Redis');
      const body = (await send(two.url, 'GET', '/metrics').done).body;
      t.match(body, /switchyard_rate_limited_total\{limit="requests"\} 0/, 'beside the interactive limits in one metric');
    }
  });
}
