// Rate-limit counters shared by two routers on one real redis-server
// (rateLimits.redis): what one router used, the other refuses; one round trip
// per request (a Lua script); with Redis killed, failMode open admits and
// closed answers 503, and both count the failures in a metric.
import t from 'tap';
import { createHash } from 'node:crypto';
import { startFleet } from '../../src/sim/index.js';
import { validateConfig, API_VERSION, type RouterConfig } from '../../src/config/schema.js';
import { startRouter } from '../../src/server/router.js';
import { validatePlugin } from '../support/router-util.js';
import { send } from '../support/sim-util.js';
import { startRedis } from '../support/redis-util.js';

const sha = (k: string) => createHash('sha256').update(k).digest('hex');
const KEY_A = 'sk-shared-alpha-0001';
const KEY_B = 'sk-shared-bravo-0001';
const chat = { model: 'open-model', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 };

function config(urls: string[], redis: Record<string, unknown>, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    apiVersion: API_VERSION,
    kind: 'Router',
    pools: [{ name: 'p', models: ['open-model'], endpoints: urls.map((url, i) => ({ name: `e${i}`, url })) }],
    logging: { level: 'silent' },
    auth: { keys: [{ digest: sha(KEY_A), tenant: 'a', requestsPerMinute: 4 }, { digest: sha(KEY_B), tenant: 'b' }] },
    rateLimits: { tenants: { b: { tokensPerMinute: 2000 } }, redis },
    ...extra,
  };
}

async function router(t: Tap.Test, cfg: Record<string, unknown>) {
  const r = await startRouter(validateConfig(cfg, validatePlugin) as RouterConfig, { port: 0, host: '127.0.0.1', validatePlugin });
  t.teardown(() => r.close(200));
  return r;
}

const post = (base: string, key: string, body: unknown = chat) => send(base, 'POST', '/v1/chat/completions', body, { authorization: `Bearer ${key}` }).done;

t.test('two routers on one Redis share a key limit and a tenant token budget', async (t) => {
  const redis = await startRedis(t);
  const fleet = await startFleet(1, { timeScale: 0 });
  t.teardown(() => fleet.close());
  const one = await router(t, config(fleet.urls, { url: redis.url }));
  const two = await router(t, config(fleet.urls, { url: redis.url }));
  for (let i = 0; i < 4; i++) {
    const res = await post(one.url, KEY_A);
    t.equal(res.status, 200, `router one: request ${i + 1} of 4`);
    t.equal(res.headers['x-ratelimit-remaining-requests'], String(3 - i));
  }
  const refused = await post(two.url, KEY_A);
  t.equal(refused.status, 429, "router two refuses: router one used the key's minute");
  t.equal(JSON.parse(refused.body).error.code, 'rate_limit_exceeded');
  t.equal(JSON.parse(refused.body).error.type, 'requests');
  const ra = Number(refused.headers['retry-after']);
  t.ok(ra >= 14 && ra <= 15, `Retry-After from the shared counters (${ra})`);
  t.equal(refused.headers['x-ratelimit-remaining-requests'], '0', "router two's headers show the shared state");
  // tokens: router one's answer (its usage) is charged where router two sees it
  const t0 = Date.now();
  const big = await post(one.url, KEY_B, { ...chat, max_tokens: 1500, ignore_eos: true });
  t.equal(big.status, 200);
  const used = JSON.parse(big.body).usage.total_tokens;
  t.ok(used > 1400, `the answer used ${used} tokens`);
  await new Promise((r) => setTimeout(r, 100)); // the correction's flush (every 20 ms)
  const seen = await post(two.url, KEY_B);
  t.equal(seen.status, 200);
  const left = Number(seen.headers['x-ratelimit-remaining-tokens']);
  const refilled = ((Date.now() - t0) * 2000) / 60_000;
  t.ok(left <= 2000 - used + refilled + 1 && left >= 2000 - used - 40, `router two sees router one's usage: ${left} left of 2000 after ${used}`);
  await post(two.url, KEY_B, { ...chat, max_tokens: 600, ignore_eos: true });
  await new Promise((r) => setTimeout(r, 100));
  const tokens = await post(one.url, KEY_B);
  t.equal(tokens.status, 429, "router one refuses: the tenant's minute of tokens is spent across both");
  t.equal(JSON.parse(tokens.body).error.type, 'tokens');
});

for (const failMode of ['open', 'closed'] as const) {
  t.test(`Redis killed: failMode ${failMode}`, async (t) => {
    const redis = await startRedis(t);
    const fleet = await startFleet(1, { timeScale: 0 });
    t.teardown(() => fleet.close());
    const r = await router(t, config(fleet.urls, { url: redis.url, failMode, timeoutMs: 100 }));
    t.equal((await post(r.url, KEY_A)).status, 200, 'Redis up: served');
    await redis.kill();
    const down = await post(r.url, KEY_A);
    if (failMode === 'open') {
      t.equal(down.status, 200, 'fail open: admitted without the shared counters');
      t.equal(down.headers['x-ratelimit-remaining-requests'], '2', 'counted on the local copy meanwhile');
    } else {
      t.equal(down.status, 503, 'fail closed: refused');
      t.equal(JSON.parse(down.body).error.type, 'server_error');
      t.equal(down.headers['x-switchyard-dropped-reason'], 'rate-limit-store-down');
      t.equal(down.headers['retry-after'], '1');
    }
    t.equal((await post(r.url, KEY_B)).status, failMode === 'open' ? 200 : 503, 'the tenant-limited key too');
    const m = (await send(r.url, 'GET', '/metrics').done).body;
    const errors = Number(/switchyard_rate_limit_store_errors_total (\d+)/.exec(m)?.[1]);
    t.ok(errors >= 2, `the failures are counted (${errors})`);
    t.match(m, new RegExp(`switchyard_rate_limit_store_fallbacks_total\\{mode="${failMode}"\\} 2`));
    // Redis back: the shared counters serve again (ioredis reconnects)
    await redis.restart();
    const errorsNow = async () => Number(/switchyard_rate_limit_store_errors_total (\d+)/.exec((await send(r.url, 'GET', '/metrics').done).body)?.[1]);
    let ok = 0;
    for (let i = 0; i < 50 && ok === 0; i++) {
      await new Promise((res) => setTimeout(res, 50));
      const before = await errorsNow();
      const res = await post(r.url, KEY_B);
      if (res.status === 200 && (await errorsNow()) === before) ok = 1;
    }
    t.equal(ok, 1, 'served through Redis again after its restart');
  });
}
