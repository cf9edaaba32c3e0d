// Active-active replicas over a real redis-server (src/ha/fleet.ts): every
// router is Ready and serves; a prefix placed through one replica is found by
// another; in-flight counts are fleet-wide; a killed replica's share expires;
// Redis killed: every replica keeps serving (and shares again once it returns).
import t from 'tap';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startRedis } from '../support/redis-util.js';
import { spawnServe, validatePlugin } from '../support/router-util.js';
import { startFleet } from '../../src/sim/index.js';
import { API_VERSION, validateConfig } from '../../src/config/schema.js';
import { startRouter } from '../../src/server/router.js';
import { Redis } from 'ioredis';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function until(cond: () => boolean | Promise<boolean>, ms: number, step = 20): Promise<number> {
  const t0 = performance.now();
  while (performance.now() - t0 < ms) {
    if (await cond()) return performance.now() - t0;
    await sleep(step);
  }
  return -1;
}

function systemPrompt(g: number): string {
  let s = `You are assistant number ${g}. `;
  for (let i = 0; s.length < 1500; i++) s += `Rule ${i} of group ${g}: answer politely and precisely. `;
  return s;
}

function body(g: number, q: number, maxTokens = 2, stream = false): string {
  return JSON.stringify({ model: 'open-model', max_tokens: maxTokens, stream, messages: [{ role: 'system', content: systemPrompt(g) }, { role: 'user', content: `q${q}` }] });
}

async function ask(url: string, g: number, q: number): Promise<string> {
  const res = await fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: body(g, q) });
  await res.arrayBuffer();
  if (res.status !== 200) throw new Error(`status ${res.status}`);
  return res.headers.get('x-switchyard-endpoint')!;
}

function config(redisUrl: string, urls: string[], ha: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    apiVersion: API_VERSION,
    kind: 'Router',
    pools: [{ name: 'p', models: ['open-model'], endpoints: urls.map((url, i) => ({ name: `e${i}`, url })) }],
    logging: { level: 'silent' },
    ha: { redis: redisUrl, key: 'swy-aa', deltaFlushMs: 30, peerTtlMs: 600, ...ha },
  };
}

/** A redis-server and `n` simulated engines (`opts` as startFleet takes them), all stopped at teardown. */
async function redisAndFleet(t: Tap.Test, n: number, opts: Parameters<typeof startFleet>[1]) {
  const redis = await startRedis(t);
  const fleet = await startFleet(n, opts);
  t.teardown(() => fleet.close());
  return { redis, fleet };
}

/** A replica in this process (startRouter on a free loopback port), closed at teardown. */
async function replica(t: Tap.Test, cfg: ReturnType<typeof validateConfig>) {
  const r = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => r.close(100));
  return r;
}

/** Replica A as `switchyard serve` in its own process (info logs; it can be killed), replica B in this one, both on `raw`. */
async function spawnedAndLocal(t: Tap.Test, raw: Record<string, unknown>) {
  const dir = mkdtempSync(join(tmpdir(), 'swy-aa-'));
  const file = join(dir, 'router.yaml');
  writeFileSync(file, JSON.stringify({ ...raw, logging: { level: 'info' } }));
  const a = await spawnServe(t, ['--config', file, '--port', '0'], 60_000);
  const b = await replica(t, validateConfig(raw, validatePlugin));
  return { a, b };
}

t.test('config: ha.redis alone is active-active; mode standby keeps the pair; kubernetes implies standby', async (t) => {
  const base = { apiVersion: API_VERSION, kind: 'Router', pools: [{ name: 'p', models: ['m'], endpoints: [{ url: 'http://127.0.0.1:1' }] }] };
  t.match(validateConfig({ ...base, ha: { redis: 'redis://127.0.0.1:6379' } }).ha, { mode: 'active-active', peerTtlMs: 2000, deltaFlushMs: 100 });
  t.match(validateConfig({ ...base, ha: { redis: 'redis://127.0.0.1:6379', mode: 'standby' } }).ha, { mode: 'standby', leaseTtlMs: 3000 });
  t.match(validateConfig({ ...base, ha: { kubernetes: { name: 'x' } } }).ha, { mode: 'standby' });
  t.throws(() => validateConfig({ ...base, ha: { mode: 'active-active', kubernetes: { name: 'x' } } }), /ha\.redis: is required: active-active/);
  t.throws(() => validateConfig({ ...base, ha: { mode: 'active-active', redis: 'redis://x:1', kubernetes: { name: 'x' } } }), /ha\.kubernetes: is the standby pair's lease/);
  t.throws(() => validateConfig({ ...base, ha: { mode: 'both', redis: 'redis://x:1' } }), /ha\.mode: must be one of: active-active, standby/);
  t.throws(() => validateConfig({ ...base, ha: { redis: 'redis://x:1', deltaFlushMs: 500, peerTtlMs: 1000 } }), /ha\.peerTtlMs: must be at least 3 × deltaFlushMs \(1500\)/);
});

t.test('two replicas: both Ready; a prefix placed through A is routed to the same engine from B', async (t) => {
  const { redis, fleet } = await redisAndFleet(t, 4, { timeScale: 0 });
  const cfg = validateConfig(config(redis.url, fleet.urls), validatePlugin);
  const a = await replica(t, cfg);
  const b = await replica(t, cfg);
  t.equal(a.ha, null, 'no lease');
  t.ok(a.fleet!.shared && b.fleet!.shared, 'both share through Redis');
  t.not(a.fleet!.replica, b.fleet!.replica);
  for (const r of [a, b]) t.ok((await until(async () => (await fetch(`${r.url}/readyz`)).status === 200, 5000)) >= 0, `${r.url}: /readyz 200`);
  const GROUPS = 8;
  const home: string[] = [];
  for (let g = 0; g < GROUPS; g++) home.push(await ask(a.url, g, 0));
  t.ok(new Set(home).size > 1, `the groups spread over the fleet: ${home.join(' ')}`);
  t.ok((await until(() => b.fleet!.ops >= GROUPS, 3000)) >= 0, `B applied A's records in bulk (${b.fleet!.ops} ops in ${b.fleet!.applied} messages)`);
  const matchedBefore = b.core.metrics.matchedBlocks;
  const next: string[] = [];
  for (let g = 0; g < GROUPS; g++) next.push(await ask(b.url, g, 1));
  t.same(next, home, "every group's next turn, sent to B, went to the engine A placed it on");
  t.ok(b.core.metrics.matchedBlocks - matchedBefore > GROUPS * 10, 'and matched the cached blocks');
  // and the other way round: B's records reach A
  t.ok((await until(() => a.fleet!.ops >= GROUPS, 3000)) >= 0, "A applied B's records");
  t.equal(a.fleet!.peers, 1, 'A sees one peer');
  const metrics = await (await fetch(`${b.url}/metrics`)).text();
  t.match(metrics, /switchyard_ha_shared 1/);
  t.match(metrics, /switchyard_ha_peers 1/);
  t.match(metrics, /switchyard_ha_ops_applied_total [1-9]/);
  // a graceful stop says goodbye: B drops A's share at once, without waiting for peerTtlMs
  await a.close(100);
  t.ok((await until(() => b.fleet!.peers === 0 && b.fleet!.left === 1, 2000)) >= 0, 'A stopped: B dropped its share on its goodbye');
  t.equal(b.fleet!.left, 1, 'counted as left, not expired');
  t.equal(b.fleet!.expired, 0);
});

t.test('in flight across replicas: B counts what A has out; A SIGKILLed: its share expires; Redis killed: B keeps serving', async (t) => {
  // slow engines: a 400-token stream lasts ~2 s
  const { redis, fleet } = await redisAndFleet(t, 2, { timeScale: 1, itlMs: 5 });
  const raw = config(redis.url, fleet.urls, { peerTtlMs: 500 });
  const { a, b } = await spawnedAndLocal(t, raw);
  t.ok((await until(() => b.fleet!.peers === 1, 5000)) >= 0, 'B sees A');
  // 6 long streams through A, read slowly
  const N = 6;
  const ctl = new AbortController();
  const streams = Array.from({ length: N }, (_, i) =>
    fetch(`${a.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: body(100 + i, 0, 400, true), signal: ctl.signal })
      .then((r) => r.arrayBuffer())
      .catch(() => null),
  );
  const peer = () => b.core.endpoints.all.reduce((s, ep) => s + ep.peerInFlight, 0);
  t.ok((await until(() => peer() === N, 5000)) >= 0, `B counts A's ${N} in-flight requests as its peers' (${peer()})`);
  t.equal(b.core.endpoints.all.reduce((s, ep) => s + ep.inFlight, 0), 0, 'none of them is its own');
  // a scrape of B's that reached the engines before A's share reached B counts them as foreign load until B's
  // next scrape (the documented lag of the share): wait for that one
  const counted = () => b.core.endpoints.all.every((ep) => ep.occupancy(performance.now()) === ep.peerInFlight);
  t.ok((await until(counted, 5000)) >= 0 && counted(), "occupancy (flow control's saturation, session spill) counts them");
  a.child.kill('SIGKILL');
  const gone = await until(() => peer() === 0, 5000);
  t.ok(gone >= 0, `A killed: its share expired after ${gone.toFixed(0)} ms (peerTtlMs 500)`);
  t.equal(b.fleet!.expired, 1, 'counted as expired');
  ctl.abort();
  await Promise.all(streams);
  // Redis killed: B keeps serving on its own view
  await redis.kill();
  const fast = (q: number) =>
    fetch(`${b.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: body(7, q, 2) }).then(async (r) => {
      await r.arrayBuffer();
      return r.status;
    });
  t.ok((await until(() => !b.fleet!.shared, 3000)) >= 0, 'B noticed Redis is gone');
  const statuses: number[] = [];
  for (let q = 0; q < 5; q++) statuses.push(await fast(q));
  t.same(statuses, [200, 200, 200, 200, 200], 'and serves every request');
  t.equal((await fetch(`${b.url}/readyz`)).status, 200, 'still Ready');
  t.match(await (await fetch(`${b.url}/metrics`)).text(), /switchyard_ha_shared 0/);
  t.equal(b.fleet!.outages, 1, 'one outage, logged once');
  await redis.restart();
  t.ok((await until(() => b.fleet!.shared && b.fleet!.published > 0, 5000)) >= 0, 'Redis back: B shares again');
});

t.test('Redis killed under two replicas: both keep serving', async (t) => {
  const { redis, fleet } = await redisAndFleet(t, 2, { timeScale: 0 });
  const cfg = validateConfig(config(redis.url, fleet.urls), validatePlugin);
  const a = await replica(t, cfg);
  const b = await replica(t, cfg);
  t.ok((await until(() => a.fleet!.peers === 1 && b.fleet!.peers === 1, 5000)) >= 0, 'they see each other');
  await redis.kill();
  t.ok((await until(() => !a.fleet!.shared && !b.fleet!.shared, 3000)) >= 0, 'both noticed');
  t.ok((await until(() => a.fleet!.peers === 0 && b.fleet!.peers === 0, 3000)) >= 0, "each other's shares expired: each routes on its own view");
  for (let q = 0; q < 4; q++) {
    t.ok(await ask(a.url, q, 0), `A serves ${q}`);
    t.ok(await ask(b.url, q, 0), `B serves ${q}`);
  }
  for (const r of [a, b]) t.equal((await fetch(`${r.url}/readyz`)).status, 200);
});

t.test('a replica started while Redis is down serves, and shares once Redis is up', async (t) => {
  const redis = await startRedis(t);
  await redis.kill();
  const fleet = await startFleet(1, { timeScale: 0 });
  t.teardown(() => fleet.close());
  const a = await replica(t, validateConfig(config(redis.url, fleet.urls), validatePlugin));
  t.equal(a.fleet!.shared, false);
  t.ok(await ask(a.url, 1, 0), 'serves');
  await redis.restart();
  t.ok((await until(() => a.fleet!.shared && a.fleet!.published > 0, 6000)) >= 0, 'shares once Redis is up');
});

t.test('SIGTERM a replica mid-stream: /readyz 503 at once, its streams finish, the others count them until it says goodbye', async (t) => {
  const { redis, fleet } = await redisAndFleet(t, 2, { timeScale: 1, itlMs: 5 });
  const raw = { ...config(redis.url, fleet.urls), shutdown: { drainDelayMs: 300, graceMs: 20_000 } };
  const { a, b } = await spawnedAndLocal(t, raw);
  t.ok((await until(() => b.fleet!.peers === 1, 5000)) >= 0, 'B sees A');
  const N = 3;
  const streams = Array.from({ length: N }, (_, i) =>
    fetch(`${a.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: body(200 + i, 0, 300, true) }).then(async (r) => [r.status, await r.text()] as const),
  );
  const peer = () => b.core.endpoints.all.reduce((s, ep) => s + ep.peerInFlight, 0);
  t.ok((await until(() => peer() === N, 5000)) >= 0, `B counts A's ${N} streams`);
  a.child.kill('SIGTERM');
  t.ok((await until(async () => (await fetch(`${a.url}/readyz`).then((r) => r.status, () => 0)) === 503, 2000)) >= 0, "A's /readyz answers 503 during its drain delay");
  await sleep(400);
  t.equal(peer(), N, 'A still reports its draining streams');
  const done = await Promise.all(streams);
  for (const [status, text] of done) {
    t.equal(status, 200);
    t.ok(text.includes('data: [DONE]') && !text.includes('"error"'), 'a whole stream, no error event');
  }
  t.same(await a.exited, [0, null], 'A exits cleanly');
  t.ok((await until(() => b.fleet!.left === 1 && peer() === 0, 2000)) >= 0, 'and its goodbye dropped its share at once');
  t.equal(b.fleet!.expired, 0, 'not by expiry');
});

t.test('sessions: with active-active and no sessions.store, pins and turn state go through ha.redis; a turn through A, the next through B, stays on the pinned engine', async (t) => {
  const redis = await startRedis(t);
  const fleet = await startFleet(3, { timeScale: 0 });
  t.teardown(() => fleet.close());
  const cfg = validateConfig(config(redis.url, fleet.urls), validatePlugin);
  t.same(cfg.sessions.store, { url: redis.url, keyPrefix: 'switchyard:session:', timeoutMs: 250 }, 'the store follows ha.redis');
  t.equal(validateConfig(config(redis.url, fleet.urls, {}), validatePlugin).ha!.mode, 'active-active');
  const standby = validateConfig({ ...config(redis.url, fleet.urls, { mode: 'standby' }) }, validatePlugin);
  t.equal(standby.sessions.store, 'memory', 'the standby pair keeps its pins in memory (one active router)');
  const explicit = validateConfig({ ...config(redis.url, fleet.urls), sessions: { store: 'memory' } }, validatePlugin);
  t.equal(explicit.sessions.store, 'memory', 'an explicit sessions.store wins');
  const a = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => a.close(100));
  const b = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => b.close(100));
  const turn = async (url: string, content: string, session: string) => {
    const res = await fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-session-id': session },
      body: JSON.stringify({ model: 'open-model', max_tokens: 2, messages: [{ role: 'user', content }] }),
    });
    await res.arrayBuffer();
    t.equal(res.status, 200);
    return res.headers.get('x-switchyard-endpoint')!;
  };
  const N = 8;
  // the first turns at once: the load-aware pick spreads them over the engines
  const homes = await Promise.all(Array.from({ length: N }, (_, s) => turn(a.url, `first turn of conversation ${s}`, `conv${s}`)));
  t.ok(new Set(homes).size > 1, `the conversations spread: ${homes.join(' ')}`);
  const client = new Redis(redis.url);
  t.teardown(() => client.disconnect());
  t.ok((await until(async () => (await client.keys('switchyard:session:*')).length === N, 3000)) >= 0, 'A wrote every pin to the shared Redis');
  // the next turn of each, through B, with a text that shares no prefix with the first: only the pin says where
  for (let s = 0; s < N; s++) t.equal(await turn(b.url, `${'z'.repeat(60 + 13 * s)} second turn of ${s}`, `conv${s}`), homes[s], `conv${s}: B sent turn 2 to the engine A pinned it to`);
  const m = await (await fetch(`${b.url}/metrics`)).text();
  t.match(m, new RegExp(`switchyard_session_turns_followed_total ${N}\\b`), 'B counts them as followed pins');
  t.match(m, /switchyard_session_pins_created_total 0\b/, 'and made none of its own');
});

t.test('after a pick: its record and load reach the other replica within pickFlushMs, not at the next deltaFlushMs; a peer\'s unseen requests stop counting at our next scrape', async (t) => {
  const redis = await startRedis(t);
  // slow engines: the streams stay in flight
  const fleet = await startFleet(2, { timeScale: 1, itlMs: 5 });
  t.teardown(() => fleet.close());
  // a heartbeat every 5 s: within this test, only the pick flush can carry A's pick to B
  const raw = config(redis.url, fleet.urls, { deltaFlushMs: 5000, peerTtlMs: 15_000, pickFlushMs: 5 });
  // A scrapes once at its start, then not for 10 s: every request it sends is one its engines' figures cannot show yet
  const a = await startRouter(validateConfig({ ...raw, dataLayer: { scrapeIntervalMs: 10_000 } }, validatePlugin), { port: 0, host: '127.0.0.1' });
  t.teardown(() => a.close(100));
  // B scrapes every 400 ms: A's report is seen (polled every 2 ms) before B's next scrape with near certainty
  const b = await startRouter(validateConfig({ ...raw, dataLayer: { scrapeIntervalMs: 400 } }, validatePlugin), { port: 0, host: '127.0.0.1' });
  t.teardown(() => b.close(100));
  const ctl = new AbortController();
  t.teardown(() => ctl.abort());
  const t0 = performance.now();
  const N = 3;
  const streams = Array.from({ length: N }, (_, i) =>
    fetch(`${a.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: body(300 + i, 0, 2000, true), signal: ctl.signal })
      .then((r) => r.arrayBuffer())
      .catch(() => null),
  );
  const peer = () => b.core.endpoints.all.reduce((s, ep) => s + ep.peerInFlight, 0);
  const unseen = () => b.core.endpoints.all.reduce((s, ep) => s + ep.peerUnseen, 0);
  let sawUnseen = 0;
  t.ok(
    (await until(() => {
      sawUnseen = Math.max(sawUnseen, unseen());
      return b.fleet!.ops >= N && peer() === N;
    }, 3000, 2)) >= 0,
    `B applied A's ${N} records and counts its ${N} requests`,
  );
  t.equal(Math.max(sawUnseen, unseen()), N, 'A reported them as sent since its scrape (unseen)');
  const took = performance.now() - t0;
  t.ok(took < 2500, `within ${Math.round(took)} ms of the requests, well before A's first heartbeat (5 s)`);
  // A's report counted them as unseen (sent since A's scrape); B's next scrape shows them at the engines
  t.ok((await until(() => unseen() === 0, 2000, 5)) >= 0, "B's own scrape took A's unseen requests out of its queue estimate");
  t.equal(peer(), N, 'while they still count as in flight');
  ctl.abort();
  await Promise.all(streams);
});
