// Batch lines use the interactive rate-limit counters (rateLimits): a line is
// charged to its tenant's counters when it is dispatched, a line the limits
// refuse stays pending (not answered 429 into the output), and what the batch
// used is what an interactive request of the same tenant sees (over a real
// redis-server for the stream, local counters for the limits).
import t from 'tap';
import { createHash } from 'node:crypto';
import { Redis } from 'ioredis';
import { API_VERSION, validateConfig } from '../../src/config/schema.js';
import { startFleet } from '../../src/sim/index.js';
import { startRouter } from '../../src/server/router.js';
import { startRedis } from '../support/redis-util.js';
import { validatePlugin } from '../support/router-util.js';
import { send } from '../support/sim-util.js';

const sha = (k: string) => createHash('sha256').update(k).digest('hex');
const KEY = 'sk-batch-limits-0001';

async function until(cond: () => Promise<boolean> | boolean, ms = 10000, what = 'condition'): Promise<void> {
  const end = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

t.test("batch lines are charged to their tenant's rate limits when dispatched; refused lines stay pending", async (t) => {
  const redis = await startRedis(t);
  const engines = await startFleet(1, { timeScale: 0 });
  const client = new Redis(redis.url, { maxRetriesPerRequest: 1 });
  client.on('error', () => {});
  t.teardown(async () => {
    client.disconnect();
    await engines.close();
  });
  const cfg = validateConfig(
    {
      apiVersion: API_VERSION,
      kind: 'Router',
      pools: [{ name: 'p', models: ['open-model'], endpoints: engines.urls.map((url, i) => ({ name: `e${i}`, url })) }],
      logging: { level: 'silent' },
      auth: { keys: [{ digest: sha(KEY), tenant: 'small' }] },
      rateLimits: { tenants: { small: { requestsPerMinute: 3 } } },
      batch: { redis: redis.url, stream: 'jobs', group: 'g', deadLetterStream: 'jobs:dead', keyPrefix: 'swy', reclaimIdleMs: 100000 },
    },
    validatePlugin,
  );
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => router.close(200));
  const job = (id: string, tenant: string) => ['id', id, 'result', 'stream:out', 'tenant', tenant, 'body', JSON.stringify({ model: 'open-model', prompt: `job ${id}`, max_tokens: 4 })];
  for (let i = 0; i < 5; i++) await client.xadd('jobs', '*', ...job(`s${i}`, 'small'));
  for (let i = 0; i < 3; i++) await client.xadd('jobs', '*', ...job(`o${i}`, 'other'));
  await until(() => router.batch!.stats.completed === 6 && router.batch!.stats.deferredByRateLimit === 2, 10000, 'limits applied to the batch');
  const out = (await client.xrange('out', '-', '+')) as [string, string[]][];
  const ids = out.map(([, f]) => f[f.indexOf('id') + 1]!);
  t.equal(ids.filter((k) => k.startsWith('s')).length, 3, "three of the small tenant's lines (its requests a minute)");
  t.equal(ids.filter((k) => k.startsWith('o')).length, 3, 'the other tenant is not limited');
  t.ok(out.every(([, f]) => f[f.indexOf('status') + 1] === '200'), 'no line was answered 429 into the output');
  const pending = (await client.xpending('jobs', 'g')) as [number, ...unknown[]];
  t.equal(pending[0], 2, 'the refused lines stay pending for later');
  // the same counters: the tenant's interactive request is refused, the batch used its minute
  const res = await send(router.url, 'POST', '/v1/chat/completions', { model: 'open-model', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 }, { authorization: `Bearer ${KEY}` }).done;
  t.equal(res.status, 429, 'interactive: refused, the batch spent the minute');
  t.equal(res.headers['x-ratelimit-remaining-requests'], '0');
});
