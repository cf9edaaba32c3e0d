// The test Redis helper starts a real server that answers, and kill() stops it.
import t from 'tap';
import { Redis } from 'ioredis';
import { startRedis } from './redis-util.js';

t.test('startRedis gives a live server, kill() stops it, restart() brings it back', async (t) => {
  const r = await startRedis(t);
  const c = new Redis(r.url, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
  await c.connect();
  t.equal(await c.ping(), 'PONG');
  await c.set('k', 'v');
  t.equal(await c.get('k'), 'v');
  c.disconnect();
  await r.kill();
  const c2 = new Redis(r.url, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
  await t.rejects(c2.connect());
  c2.disconnect();
  await r.restart();
  const c3 = new Redis(r.url, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
  await c3.connect();
  t.equal(await c3.get('k'), null, 'restart starts empty');
  c3.disconnect();
});
