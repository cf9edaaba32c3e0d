// The hot-standby pair over a real redis-server: the lease and its fencing
// token (split brain refused by Redis), Redis lost while active, Redis down at
// start (serve alone or refuse), the warm standby following the active's
// deltas, and real `switchyard serve` processes failing over on SIGKILL.
import t from 'tap';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { pino } from 'pino';
import { startRedis } from '../support/redis-util.js';
import { spawnServe, startTestRouter, validatePlugin } from '../support/router-util.js';
import { RedisLease } from '../../src/ha/lease.js';
import { HighAvailability } from '../../src/ha/standby.js';
import { HaStartError } from '../../src/errors.js';
import { startFleet } from '../../src/sim/index.js';
import { API_VERSION, validateConfig } from '../../src/config/schema.js';
import { startRouter } from '../../src/server/router.js';
import { EndpointSet } from '../../src/endpoints/endpoint.js';

const log = pino({ level: 'silent' });
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const TTL = 600;
const RENEW = 150;

async function until(cond: () => boolean | Promise<boolean>, ms: number, step = 20): Promise<number> {
  const t0 = performance.now();
  while (performance.now() - t0 < ms) {
    if (await cond()) return performance.now() - t0;
    await sleep(step);
  }
  return -1;
}

function conn(t: Tap.Test, url: string): Redis {
  const r = new Redis(url, { lazyConnect: false, enableOfflineQueue: false, maxRetriesPerRequest: 0, retryStrategy: () => 100 });
  r.on('error', () => {});
  t.teardown(() => r.disconnect());
  return r;
}

async function lease(t: Tap.Test, url: string, key = 'swy-test'): Promise<RedisLease> {
  const r = conn(t, url);
  await new Promise<void>((res) => (r.status === 'ready' ? res() : r.once('ready', () => res())));
  const l = new RedisLease({ redis: r, key, ttlMs: TTL, renewIntervalMs: RENEW, log });
  t.teardown(() => l.stop(false));
  return l;
}

t.test('one active at a time; a paused old active is refused by the fencing check (split brain)', async (t) => {
  const redis = await startRedis(t);
  const a = await lease(t, redis.url);
  const b = await lease(t, redis.url);
  t.equal(await a.start(), 'active');
  t.equal(await b.start(), 'standby');
  t.equal(a.fence, 1);
  t.ok(await a.fencedAppend('swy-test:deltas', a.fence, 1000, Buffer.from('a1')), 'the active writes');
  // A freezes (GC pause, SIGSTOP): no renewals, and it keeps believing it leads
  a.pause();
  const took = await until(() => b.state === 'active', TTL * 10);
  t.ok(took >= 0, `the standby took over after ${took.toFixed(0)} ms (lease ${TTL} ms + renewal ${RENEW} ms)`);
  t.equal(b.fence, 2, 'with a newer fence');
  t.equal(a.state, 'active', 'the frozen one still believes it is active');
  a.resume();
  // both try to write: only the newest fence passes
  const [wa, wb] = await Promise.all([a.fencedAppend('swy-test:deltas', 1, 1000, Buffer.from('a2')), b.fencedAppend('swy-test:deltas', b.fence, 1000, Buffer.from('b1'))]);
  t.equal(wa, null, 'the old active is refused by Redis');
  t.ok(wb, 'the new active writes');
  t.equal(a.state, 'standby', 'and the refusal made the old one step down');
  const reader = conn(t, redis.url);
  await new Promise<void>((res) => (reader.status === 'ready' ? res() : reader.once('ready', () => res())));
  const entries = (await reader.xrange('swy-test:deltas', '-', '+')) as [string, string[]][];
  t.same(entries.map(([, f]) => f[3]), ['a1', 'b1'], 'the stream holds no write of the deposed active');
  // a renewal by the old active also fails (compare-and-extend)
  await a.round(false);
  t.equal(a.state, 'standby');
  t.equal(b.state, 'active');
});

t.test('Redis lost while active: keeps serving until the lease would have expired, then steps down', async (t) => {
  const redis = await startRedis(t);
  const a = await lease(t, redis.url);
  t.equal(await a.start(), 'active');
  await sleep(RENEW * 2);
  await redis.kill();
  const lostAt = performance.now();
  await sleep(TTL / 3);
  // (on a loaded machine the sleep may overshoot the lease: then there is nothing to check here)
  if (performance.now() - lostAt < TTL - RENEW) t.equal(a.state, 'active', 'still active a while after Redis went away');
  const stepped = await until(() => a.state === 'standby', TTL * 10);
  t.ok(stepped >= 0, 'stepped down');
  t.comment(`stepped down ${(performance.now() - lostAt).toFixed(0)} ms after Redis went away (lease ${TTL} ms, renewal ${RENEW} ms)`);
  // Redis back: it acquires again (nobody else holds the lease)
  await redis.restart();
  t.ok((await until(() => a.state === 'active', 5000)) >= 0, 'active again once Redis is back');
});

t.test('Redis down at start: serve-alone serves and says so; refuse refuses', async (t) => {
  const redis = await startRedis(t);
  await redis.kill();
  const endpoints = new EndpointSet([{ name: 'p', models: ['m'], endpoints: [{ name: 'e', url: 'http://127.0.0.1:9', role: 'both' }] }] as never);
  const cfg = { redis: redis.url, key: 'swy-start', leaseTtlMs: TTL, renewIntervalMs: RENEW, deltaFlushMs: 50, streamMaxLen: 1000, warmStandby: true };
  await t.rejects(HighAvailability.start({ ...cfg, onRedisDown: 'refuse' }, { endpoints, store: null, log }), HaStartError);
  const lines: string[] = [];
  const capture = pino({ level: 'info' }, { write: (s: string) => void lines.push(s) });
  const ha = await HighAvailability.start({ ...cfg, onRedisDown: 'serve-alone' }, { endpoints, store: null, log: capture });
  t.teardown(() => ha.close());
  t.equal(ha.state, 'alone');
  t.equal(ha.leading, true, 'it takes traffic');
  t.match(lines.join(''), /SERVING ALONE/, 'and says so in its log');
  await redis.restart();
  t.ok((await until(() => ha.state === 'active', 5000)) >= 0, 'it takes the lease once Redis is reachable');
});

t.test('serving alone, then Redis returns with another active holding the lease: it steps down', async (t) => {
  const redis = await startRedis(t);
  await redis.kill();
  const endpoints = new EndpointSet([{ name: 'p', models: ['m'], endpoints: [{ name: 'e', url: 'http://127.0.0.1:9', role: 'both' }] }] as never);
  const ha = await HighAvailability.start(
    { redis: redis.url, key: 'swy-alone', leaseTtlMs: TTL, renewIntervalMs: 2000, onRedisDown: 'serve-alone', deltaFlushMs: 50, streamMaxLen: 1000, warmStandby: true },
    { endpoints, store: null, log },
  );
  t.teardown(() => ha.close());
  t.equal(ha.state, 'alone');
  await redis.restart();
  const other = await lease(t, redis.url, 'swy-alone');
  t.equal(await other.start(), 'active');
  t.ok((await until(() => ha.state === 'standby', 6000)) >= 0, 'the one serving alone becomes standby');
});

function systemPrompt(g: number): string {
  let s = `You are assistant number ${g}. `;
  for (let i = 0; s.length < 1500; i++) s += `Rule ${i} of group ${g}: answer politely and precisely. `;
  return s;
}

async function ask(url: string, g: number, q: number): Promise<string> {
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'open-model', max_tokens: 2, messages: [{ role: 'system', content: systemPrompt(g) }, { role: 'user', content: `q${q}` }] }),
  });
  await res.arrayBuffer();
  if (res.status !== 200) throw new Error(`status ${res.status}`);
  return res.headers.get('x-switchyard-endpoint')!;
}

t.test('warm standby: the standby follows the deltas and routes the same prefixes to the same endpoints after takeover', async (t) => {
  const redis = await startRedis(t);
  const fleet = await startFleet(4, { timeScale: 0 });
  t.teardown(() => fleet.close());
  const cfg = validateConfig(
    {
      apiVersion: API_VERSION,
      kind: 'Router',
      pools: [{ name: 'p', models: ['open-model'], endpoints: fleet.urls.map((url, i) => ({ name: `e${i}`, url })) }],
      logging: { level: 'silent' },
      ha: { mode: 'standby', redis: redis.url, key: 'swy-warm', leaseTtlMs: TTL, renewIntervalMs: RENEW, deltaFlushMs: 30 },
    },
    validatePlugin,
  );
  const a = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  const b = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => b.close(100));
  t.equal(a.ha!.state, 'active');
  t.equal(b.ha!.state, 'standby');
  t.equal((await fetch(`${a.url}/readyz`)).status, 200, '/readyz 200 on the active');
  t.equal((await fetch(`${b.url}/readyz`)).status, 503, '/readyz 503 on the standby');
  t.equal((await fetch(`${b.url}/healthz`)).status, 200, '/healthz 200 on both');
  const GROUPS = 8;
  const home: string[] = [];
  for (let g = 0; g < GROUPS; g++) home.push(await ask(a.url, g, 0));
  t.ok(new Set(home).size > 1, `the groups spread over the fleet: ${home.join(' ')}`);
  t.ok((await until(() => b.ha!.follower!.messages > 0 && b.ha!.follower!.ops >= GROUPS, 3000)) >= 0, `the standby applied the deltas (${b.ha!.follower!.ops} ops)`);
  await a.close(100); // graceful: the lease is released, the standby takes over at its next round
  t.ok((await until(() => b.ha!.state === 'active', TTL * 10)) >= 0, 'the standby took over');
  // (readiness also needs a healthy endpoint: on a loaded machine a health check may lag)
  t.ok((await until(async () => (await fetch(`${b.url}/readyz`)).status === 200, 5000)) >= 0, '/readyz 200 on the new active');
  const matchedBefore = b.core.metrics.matchedBlocks;
  const after: string[] = [];
  for (let g = 0; g < GROUPS; g++) after.push(await ask(b.url, g, 1));
  t.same(after, home, 'every group went back to the endpoint holding its prefix');
  t.ok(b.core.metrics.matchedBlocks - matchedBefore > GROUPS * 10, 'and its first requests matched cached blocks (warm, not cold)');
});

t.test('real processes: SIGKILL the active, the standby takes over; the old one comes back as standby', async (t) => {
  const redis = await startRedis(t);
  const fleet = await startFleet(2, { timeScale: 0 });
  t.teardown(() => fleet.close());
  const dir = mkdtempSync(join(tmpdir(), 'swy-ha-'));
  const file = join(dir, 'router.yaml');
  writeFileSync(
    file,
    JSON.stringify({
      apiVersion: API_VERSION,
      kind: 'Router',
      pools: [{ name: 'p', models: ['open-model'], endpoints: fleet.urls.map((url, i) => ({ name: `e${i}`, url })) }],
      ha: { mode: 'standby', redis: redis.url, key: 'swy-proc', leaseTtlMs: TTL, renewIntervalMs: RENEW },
    }),
  );
  const ready = async (url: string) => (await fetch(`${url}/readyz`).catch(() => null))?.status ?? 0;
  const p1 = await spawnServe(t, ['--config', file, '--port', '0'], 60_000);
  t.ok((await until(async () => (await ready(p1.url)) === 200, 5000)) >= 0, 'the first process is active');
  const p2 = await spawnServe(t, ['--config', file, '--port', '0'], 60_000);
  t.equal(await ready(p2.url), 503, 'the second one is standby');
  t.equal((await fetch(`${p2.url}/healthz`)).status, 200);
  // requests on the active succeed
  t.ok(await ask(p1.url, 1, 0));
  p1.child.kill('SIGKILL');
  const killedAt = performance.now();
  await p1.exited;
  const took = await until(async () => (await ready(p2.url)) === 200, 10_000, 10);
  t.ok(took >= 0, 'the standby became ready');
  const elapsed = performance.now() - killedAt;
  t.comment(`failover took ${elapsed.toFixed(0)} ms (lease ${TTL} ms + renewal ${RENEW} ms)`);
  t.ok(await ask(p2.url, 1, 1), 'and serves');
  const p3 = await spawnServe(t, ['--config', file, '--port', '0'], 60_000);
  await sleep(RENEW * 3);
  t.equal(await ready(p3.url), 503, 'the restarted one is the standby now');
  t.equal(await ready(p2.url), 200);
  t.match(p3.out(), /started as standby/);
});

t.test('config: ha needs a redis URL, renewal at most half the TTL', async (t) => {
  const base = { apiVersion: API_VERSION, kind: 'Router', pools: [{ name: 'p', models: ['m'], endpoints: [{ url: 'http://127.0.0.1:1' }] }] };
  t.throws(() => validateConfig({ ...base, ha: {} }), /ha\.redis: is required/);
  t.throws(() => validateConfig({ ...base, ha: { redis: 'http://x:1' } }), /ha\.redis: must be a redis:\/\//);
  t.throws(() => validateConfig({ ...base, ha: { redis: 'redis://x:1', leaseTtlMs: 1000, renewIntervalMs: 800 } }), /ha\.renewIntervalMs: must be at most half/);
  t.throws(() => validateConfig({ ...base, ha: { redis: 'redis://x:1', onRedisDown: 'panic' } }), /ha\.onRedisDown/);
  const ok = validateConfig({ ...base, ha: { redis: 'redis://127.0.0.1:6379' } });
  t.match(ok.ha, { redis: 'redis://127.0.0.1:6379', leaseTtlMs: 3000, renewIntervalMs: 1000, onRedisDown: 'serve-alone' });
  t.notOk(startTestRouter === undefined);
});
