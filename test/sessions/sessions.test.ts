// Session-aware routing over real sockets: a simulated fleet, the router in
// front, conversations identified by x-session-id / prompt_cache_key / user.
// Pins followed, moved under saturation, dropped when their endpoint fails,
// bounded and expiring; the continuation flag the turn tracker sets before
// admission; two routers sharing pins through a real redis-server.
import t from 'tap';
import { Redis } from 'ioredis';
import { startTestRouter, validatePlugin } from '../support/router-util.js';
import { startFleet, type SimFleet } from '../../src/sim/index.js';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { startRouter, type RunningRouter } from '../../src/server/router.js';
import type { Admission, RequestInfo } from '../../src/admission.js';
import { SessionTable } from '../../src/sessions/table.js';
import { EndpointSet } from '../../src/endpoints/endpoint.js';
import { metric, parseProm, until } from '../support/sim-util.js';
import { startRedis } from '../support/redis-util.js';

async function chat(url: string, content: string, headers: Record<string, string> = {}, extra: Record<string, unknown> = {}) {
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: 'open-model', messages: [{ role: 'user', content }], max_tokens: 2, ...extra }),
  });
  const text = await res.text();
  return { status: res.status, endpoint: res.headers.get('x-switchyard-endpoint') ?? '', text };
}

async function metrics(url: string) {
  return parseProm(await (await fetch(`${url}/metrics`)).text());
}

/** A gate that records what admission saw of each request and admits it. */
function recordingGate() {
  const seen: { id: string; sessionKey: string; continuation: boolean }[] = [];
  return {
    seen,
    headerNames: [] as string[],
    admit(info: RequestInfo): Admission {
      seen.push({ id: info.requestId, sessionKey: info.sessionKey, continuation: info.continuation });
      return { admitted: true, ticket: null };
    },
    release() {},
  };
}

function routerConfig(fleet: SimFleet, extra: Record<string, unknown> = {}, pool: Record<string, unknown> = {}) {
  return validateConfig(
    {
      apiVersion: API_VERSION,
      kind: 'Router',
      pools: [{ name: 'p', models: ['open-model'], endpoints: fleet.urls.map((url, i) => ({ name: `e${i}`, url })), ...pool }],
      logging: { level: 'silent' },
      ...extra,
    },
    validatePlugin,
  );
}

async function start(t: Tap.Test, fleet: SimFleet, extra: Record<string, unknown> = {}, opts: Parameters<typeof startRouter>[1] = {}, pool = {}): Promise<RunningRouter> {
  const router = await startRouter(routerConfig(fleet, extra, pool), { port: 0, host: '127.0.0.1', ...opts });
  t.teardown(() => router.close(200));
  return router;
}

t.test('a conversation follows its pin; conversations spread; metrics count it', async (t) => {
  // a generous health-check limit: a CPU-starved machine must not mark an engine down mid-test
  const { url } = await startTestRouter(t, { n: 3, extra: { dataLayer: { healthTimeoutMs: 10_000 } } });
  const where = new Map<string, Set<string>>();
  const record = (s: number, r: { status: number; endpoint: string }) => {
    t.equal(r.status, 200);
    let set = where.get(`conv-${s}`);
    if (!set) where.set(`conv-${s}`, (set = new Set()));
    set.add(r.endpoint);
  };
  const say = (s: number, turn: number) =>
    // a different text every turn: no shared prefix keeps the turn there, only the pin
    chat(url, `session ${s} turn ${turn} ${'x'.repeat(50 * turn + s)}`, { 'x-session-id': `conv-${s}` });
  // the first turns at once: the load-aware pick spreads them (sent one by one on an idle fleet, a shared
  // template prefix can draw them all to one engine on a slow machine), then each conversation's pin holds
  const firsts = await Promise.all([0, 1, 2, 3, 4, 5].map((s) => say(s, 0)));
  firsts.forEach((r, s) => record(s, r));
  for (let turn = 1; turn < 5; turn++) for (let s = 0; s < 6; s++) record(s, await say(s, turn));
  for (const [s, eps] of where) t.equal(eps.size, 1, `${s} stayed on one endpoint (${[...eps].join(',')})`);
  const first = new Set([...where.values()].map((s) => [...s][0]));
  t.ok(first.size > 1, 'the first turns were not all sent to one endpoint');
  const m = await metrics(url);
  t.equal(metric(m, 'switchyard_sessions_pinned'), 6, 'six sessions pinned');
  t.equal(metric(m, 'switchyard_session_pins_created_total'), 6);
  t.equal(metric(m, 'switchyard_session_turns_followed_total'), 24, 'every later turn followed its pin');
  t.equal(metric(m, 'switchyard_session_moves_total', { reason: 'saturated' }), 0);
  // a request without a session key is not pinned
  await chat(url, 'no session');
  t.equal(metric(await metrics(url), 'switchyard_sessions_pinned'), 6);
});

t.test('balanceSlack: first turns spread evenly over the endpoints by pinned sessions; later turns follow their pins', async (t) => {
  const { url, router } = await startTestRouter(t, {
    n: 4,
    extra: {
      dataLayer: { healthTimeoutMs: 10_000 },
      scheduling: { filters: ['model', 'healthy', 'role', { type: 'session-affinity', params: { balanceSlack: 0 } }] },
    },
  });
  const where = new Map<string, string>();
  for (let s = 0; s < 8; s++) {
    // the same long prompt every time: the prefix scorer alone would send them all to the first engine
    const r = await chat(url, `shared agent prompt ${'y'.repeat(2000)}`, { 'x-session-id': `bal-${s}` });
    t.equal(r.status, 200);
    where.set(`bal-${s}`, r.endpoint);
  }
  const table = router.core.sessions;
  t.same(router.core.endpoints.all.map((ep) => table.pinsOn(ep)), [2, 2, 2, 2], 'two conversations pinned to each of the four endpoints');
  for (const [s, ep] of where) {
    const r = await chat(url, `shared agent prompt ${'y'.repeat(2000)} next turn of ${s}`, { 'x-session-id': s });
    t.equal(r.endpoint, ep, `${s} follows its pin`);
  }
});

t.test('session key sources: header, prompt_cache_key, user, in the configured order', async (t) => {
  const fleet = await startFleet(2, { timeScale: 0 });
  t.teardown(() => fleet.close());
  const gate = recordingGate();
  const { url } = await start(t, fleet, {}, { gate });
  await chat(url, 'a', { 'x-session-id': 'h1' }, { prompt_cache_key: 'k1', user: 'u1' });
  await chat(url, 'b', {}, { prompt_cache_key: 'k1', user: 'u1' });
  await chat(url, 'c', {}, { user: 'u1' });
  await chat(url, 'd');
  await chat(url, 'e', {}, { user: 42 });
  t.same(gate.seen.map((s) => s.sessionKey), ['s:h1', 'c:k1', 'u:u1', '', ''], 'header, then prompt_cache_key, then user; none: no key');

  const gate2 = recordingGate();
  const r2 = await start(t, fleet, { sessions: { sources: ['user', 'header'], header: 'X-Conversation' } }, { gate: gate2 });
  await chat(r2.url, 'a', { 'x-conversation': 'h1', 'x-session-id': 'ignored' }, { prompt_cache_key: 'k1', user: 'u1' });
  await chat(r2.url, 'b', { 'x-conversation': 'h1' }, { prompt_cache_key: 'k1' });
  t.same(gate2.seen.map((s) => s.sessionKey), ['u:u1', 's:h1'], 'the configured order and header name');

  const gate3 = recordingGate();
  const r3 = await start(t, fleet, { sessions: { sources: [] } }, { gate: gate3 });
  await chat(r3.url, 'a', { 'x-session-id': 'h1' }, { user: 'u1' });
  t.same(gate3.seen.map((s) => s.sessionKey), [''], 'sources: [] derives nothing');
});

t.test('continuation: set before admission when the previous turn ended within the window', async (t) => {
  const fleet = await startFleet(2, { timeScale: 0 });
  t.teardown(() => fleet.close());
  const gate = recordingGate();
  const { url } = await start(t, fleet, { sessions: { continuationWindowMs: 300 } }, { gate });
  await chat(url, 'turn 1', { 'x-session-id': 'agent' });
  await chat(url, 'turn 2', { 'x-session-id': 'agent' });
  await chat(url, 'other', { 'x-session-id': 'someone-else' });
  await chat(url, 'cold', {});
  await new Promise((r) => setTimeout(r, 450));
  await chat(url, 'turn 3 after a pause', { 'x-session-id': 'agent' });
  await chat(url, 'turn 4', { 'x-session-id': 'agent' });
  t.same(
    gate.seen.map((s) => s.continuation),
    [false, true, false, false, false, true],
    'first turn cold, next turn a continuation, a new session cold, no session cold, after the window cold again',
  );
  t.equal(metric(await metrics(url), 'switchyard_session_continuations_total'), 2);
  // a turn that failed before reaching an engine (unknown model) is no turn
  const gate2 = recordingGate();
  const r2 = await start(t, fleet, {}, { gate: gate2 });
  await fetch(`${r2.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-session-id': 's' },
    body: JSON.stringify({ model: 'nope', messages: [{ role: 'user', content: 'x' }] }),
  });
  await chat(r2.url, 'first real turn', { 'x-session-id': 's' });
  t.same(gate2.seen.map((s) => s.continuation), [false], 'the 404 was not admitted and ended no turn');
});

t.test('continuationWindowMs: 0 never marks a continuation', async (t) => {
  const fleet = await startFleet(1, { timeScale: 0 });
  t.teardown(() => fleet.close());
  const gate = recordingGate();
  const { url } = await start(t, fleet, { sessions: { continuationWindowMs: 0 } }, { gate });
  await chat(url, 'a', { 'x-session-id': 's' });
  await chat(url, 'b', { 'x-session-id': 's' });
  t.same(gate.seen.map((s) => s.continuation), [false, false]);
});

t.test('a saturated pinned endpoint: the next turn moves to a less loaded one and the pin follows', async (t) => {
  // one request at a time per engine (batch limit 1), slow enough to pile up
  const fleet = await startFleet(3, { maxNumSeqs: 1, timeScale: 1, prefillOverheadMs: 1, itlMs: 20 });
  t.teardown(() => fleet.close());
  const router = await start(t, fleet, { sessions: { moveQueueDepth: 1 } }, {}, { batchLimit: 1 });
  const url = router.url;
  const first = await chat(url, 'turn 1', { 'x-session-id': 'busy' });
  const home = first.endpoint;
  // two long turns at once on the pinned endpoint: one runs, one waits (still under the threshold when sent)
  const long = { max_tokens: 40 };
  const a = chat(url, 'turn 2a', { 'x-session-id': 'busy' }, long);
  await until(() => router.core.endpoints.byName(home)!.inFlight === 1);
  const b = chat(url, 'turn 2b', { 'x-session-id': 'busy' }, long);
  await until(() => router.core.endpoints.byName(home)!.inFlight === 2);
  // now one waits at home: saturated at moveQueueDepth 1
  const c = await chat(url, 'turn 3', { 'x-session-id': 'busy' });
  const [ra, rb] = await Promise.all([a, b]);
  t.equal(ra.endpoint, home, 'turn 2a followed the pin');
  t.equal(rb.endpoint, home, 'turn 2b followed the pin (one running is not saturated)');
  t.not(c.endpoint, home, `turn 3 moved off the saturated ${home} (to ${c.endpoint})`);
  const d = await chat(url, 'turn 4', { 'x-session-id': 'busy' });
  t.equal(d.endpoint, c.endpoint, 'the pin followed the move');
  const m = await metrics(url);
  t.equal(metric(m, 'switchyard_session_moves_total', { reason: 'saturated' }), 1);
  t.equal(metric(m, 'switchyard_session_turns_followed_total'), 3);
});

t.test('a pile-up: a pinned endpoint with moveLoadGap more requests than the least occupied one counts as saturated', async (t) => {
  // plenty of batch room (nothing waits at the engine): only the gap can move the conversation
  const fleet = await startFleet(2, { timeScale: 1, prefillOverheadMs: 1, itlMs: 20 });
  t.teardown(() => fleet.close());
  const router = await start(t, fleet, { sessions: { moveQueueDepth: 1000, moveLoadGap: 2 } });
  const url = router.url;
  const home = (await chat(url, 'turn 1', { 'x-session-id': 'pile' })).endpoint;
  const long = { max_tokens: 40 };
  const a = chat(url, 'turn 2a', { 'x-session-id': 'pile' }, long);
  await until(() => router.core.endpoints.byName(home)!.inFlight === 1);
  const b = chat(url, 'turn 2b', { 'x-session-id': 'pile' }, long);
  await until(() => router.core.endpoints.byName(home)!.inFlight === 2);
  const c = await chat(url, 'turn 3', { 'x-session-id': 'pile' });
  const [ra, rb] = await Promise.all([a, b]);
  t.equal(ra.endpoint, home);
  t.equal(rb.endpoint, home, 'a gap of 1 is under moveLoadGap 2');
  t.not(c.endpoint, home, 'a gap of 2 moves the next turn');
  t.equal(metric(await metrics(url), 'switchyard_session_moves_total', { reason: 'saturated' }), 1);
});

t.test('a pin to an endpoint that fails is dropped: unhealthy, or failing the turn itself', async (t) => {
  const fleet = await startFleet(3, { timeScale: 0 });
  t.teardown(() => fleet.close());
  const router = await start(t, fleet, { dataLayer: { healthIntervalMs: 30, healthTimeoutMs: 5000 } });
  const url = router.url;
  const home = (await chat(url, 'turn 1', { 'x-session-id': 'p' })).endpoint;
  const idx = Number(home.slice(1));
  fleet.engines[idx]!.setHealthy(false);
  t.ok(await until(() => router.core.endpoints.byName(home)!.health === 'down'), 'the router saw it down');
  const second = await chat(url, 'turn 2', { 'x-session-id': 'p' });
  t.equal(second.status, 200);
  t.not(second.endpoint, home, 'turn 2 left the unhealthy endpoint');
  fleet.engines[idx]!.setHealthy(true);
  t.ok(await until(() => router.core.endpoints.byName(home)!.health === 'up'), 'healthy again');
  const third = await chat(url, 'turn 3', { 'x-session-id': 'p' });
  t.equal(third.endpoint, second.endpoint, 'the pin moved with turn 2 and stays there');
  let m = await metrics(url);
  t.equal(metric(m, 'switchyard_session_moves_total', { reason: 'failed' }), 1);

  // the pinned endpoint answers 500: the retry goes elsewhere and the pin follows it
  const now = third.endpoint;
  const nowIdx = Number(now.slice(1));
  fleet.engines[nowIdx]!.setFailures(1, ['500']);
  const fourth = await chat(url, 'turn 4', { 'x-session-id': 'p' });
  t.equal(fourth.status, 200, 'served by the retry');
  t.not(fourth.endpoint, now, 'on another endpoint');
  fleet.engines[nowIdx]!.setFailures(0);
  const fifth = await chat(url, 'turn 5', { 'x-session-id': 'p' });
  t.equal(fifth.endpoint, fourth.endpoint, 'the pin followed the retry');
  m = await metrics(url);
  t.equal(metric(m, 'switchyard_session_moves_total', { reason: 'failed' }), 2);
});

t.test('session table: TTL and LRU bounds (and over the wire: tracked sessions bounded)', async (t) => {
  const set = new EndpointSet([{ name: 'p', engine: 'vllm', accelerator: 'nvidia', models: ['m'], endpoints: [{ name: 'a', url: 'http://127.0.0.1:1', role: 'both' }] }]);
  const ep = set.all[0]!;
  const cfg = { sources: [], header: 'x-session-id', ttlMs: 1000, maxSessions: 2, moveQueueDepth: 4, moveLoadGap: 8, continuationWindowMs: 1000, store: 'memory' as const };
  const table = new SessionTable(set, cfg);
  table.picked('a', ep, 0);
  table.picked('b', ep, 0);
  t.equal(table.pinned, 2);
  const now = Date.now();
  table.use('a', now); // a is now the most recent
  table.picked('c', ep, 0); // evicts b, the least recently used
  t.ok(table.peek('a', now), 'a kept (used recently)');
  t.notOk(table.peek('b', now), 'b evicted');
  t.ok(table.peek('c', now), 'c kept');
  t.equal(table.evicted, 1);
  t.equal(table.pinned, 2, 'the pinned count follows evictions');
  t.notOk(table.peek('a', now + 1001), 'expired after ttlMs');
  t.equal(table.expired, 1);
  table.sweep(now + 5000);
  t.equal(table.size, 0, 'the sweep drops the rest');
  t.equal(table.pinned, 0);
  t.notOk(table.continues('c', now), 'an expired session continues nothing');
  table.turnEnded('d', now);
  t.ok(table.continues('d', now + 999), 'within the window');
  t.notOk(table.continues('d', now + 1001), 'past the window (and the TTL)');

  const { url } = await startTestRouter(t, { n: 2, extra: { sessions: { maxSessions: 3 } } });
  for (let s = 0; s < 5; s++) await chat(url, `s${s}`, { 'x-session-id': `s${s}` });
  const m = await metrics(url);
  t.equal(metric(m, 'switchyard_sessions_tracked'), 3, 'bounded by maxSessions');
  t.equal(metric(m, 'switchyard_sessions_pinned'), 3);
  t.equal(metric(m, 'switchyard_sessions_dropped_total', { reason: 'evicted' }), 2);
});

t.test('two routers share pins and turn times through Redis', async (t) => {
  const redis = await startRedis(t);
  const fleet = await startFleet(3, { timeScale: 0 });
  t.teardown(() => fleet.close());
  const gateB = recordingGate();
  const sessions = { store: { redis: redis.url, keyPrefix: 'test:' } };
  const a = await start(t, fleet, { sessions });
  const b = await start(t, fleet, { sessions }, { gate: gateB });
  const homes: string[] = [];
  for (let s = 0; s < 8; s++) homes.push((await chat(a.url, `first turn of ${s}`, { 'x-session-id': `c${s}` })).endpoint);
  const client = new Redis(redis.url);
  t.teardown(() => client.disconnect());
  // writes go out after the answer: wait until Redis has all of them
  t.ok(await until(async () => (await client.keys('test:*')).length === 8), 'eight sessions in Redis');
  const stored = await client.get('test:s:c0');
  t.match(stored, new RegExp(`^\\d+\\t${homes[0]}$`), 'value: last turn end, tab, endpoint name');
  for (let s = 0; s < 8; s++) {
    const r = await chat(b.url, `second turn of ${s}, a different text ${'y'.repeat(40 * s)}`, { 'x-session-id': `c${s}` });
    t.equal(r.endpoint, homes[s], `c${s}: router B sent turn 2 where router A pinned it`);
  }
  t.ok(gateB.seen.every((s) => s.continuation), 'router B saw each previous turn end (through Redis): continuations');
  const mb = await metrics(b.url);
  t.equal(metric(mb, 'switchyard_session_turns_followed_total'), 8, 'B counts them as followed pins');
  t.equal(metric(mb, 'switchyard_session_pins_created_total'), 0, 'B created no pin of its own');

  // Redis gone: requests go on with the local view; failures are counted
  await redis.kill();
  const r = await chat(b.url, 'while Redis is down', { 'x-session-id': 'c1' });
  t.equal(r.status, 200, 'served');
  t.equal(r.endpoint, homes[1], 'the local copy still knows the pin');
  const fresh = await chat(b.url, 'a new session while Redis is down', { 'x-session-id': 'new' });
  t.equal(fresh.status, 200, 'a new session is served too');
  t.ok(metric(await metrics(b.url), 'switchyard_session_store_errors_total') >= 1, 'store errors counted');
});

t.test('sessions config: field paths and reasons', async (t) => {
  const bad = (sessions: unknown) => {
    try {
      validateConfig({ apiVersion: API_VERSION, kind: 'Router', pools: [{ name: 'p', models: ['m'], endpoints: [{ url: 'http://127.0.0.1:1' }] }], sessions }, validatePlugin);
      return '';
    } catch (err) {
      return (err as Error).message;
    }
  };
  t.match(bad({ sources: ['header', 'cookie'] }), /sessions\.sources\[1\]: must be one of: header, prompt_cache_key, user/);
  t.match(bad({ sources: ['user', 'user'] }), /sessions\.sources: lists a source twice/);
  t.match(bad({ ttlMs: 5 }), /sessions\.ttlMs: must be an integer in \[1000/);
  t.match(bad({ store: 'disk' }), /sessions\.store: must be "memory" or a mapping/);
  t.match(bad({ store: { redis: 'http://x' } }), /sessions\.store\.redis: must be a redis:\/\/ or rediss:\/\/ URL/);
  t.match(bad({ header: 'bad header' }), /sessions\.header: must be a header name/);
  t.match(bad({ pins: 3 }), /sessions\.pins: unknown field/);
  t.equal(bad({}), '', 'an empty block is the defaults');
});

t.test('a pin to an endpoint that is gone for the session: another model, or a name this router does not know (Redis)', async (t) => {
  const redis = await startRedis(t);
  const fleet = await startFleet(3, { timeScale: 0, models: ['open-model', 'other-model'] });
  t.teardown(() => fleet.close());
  const cfg = validateConfig(
    {
      apiVersion: API_VERSION,
      kind: 'Router',
      pools: [
        { name: 'a', models: ['open-model'], endpoints: [{ name: 'e0', url: fleet.urls[0] }] },
        { name: 'b', models: ['other-model'], endpoints: [{ name: 'e1', url: fleet.urls[1] }, { name: 'e2', url: fleet.urls[2] }] },
      ],
      logging: { level: 'silent' },
      sessions: { store: { redis: redis.url, keyPrefix: 'gone:' } },
    },
    validatePlugin,
  );
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => router.close(200));
  const url = router.url;
  t.equal((await chat(url, 'on model A', { 'x-session-id': 'm' })).endpoint, 'e0');
  const other = await chat(url, 'now on model B', { 'x-session-id': 'm' }, { model: 'other-model' });
  t.match(other.endpoint, /^e[12]$/, 'served by the pool of the new model');
  t.equal(metric(await metrics(url), 'switchyard_session_moves_total', { reason: 'left' }), 1, 'the pin to e0 was dropped (e0 does not serve it)');
  t.equal((await chat(url, 'again on B', { 'x-session-id': 'm' }, { model: 'other-model' })).endpoint, other.endpoint, 'the new pin holds');

  // another router (another config) wrote a pin to an endpoint this router does not have
  const client = new Redis(redis.url);
  t.teardown(() => client.disconnect());
  await client.set('gone:s:elsewhere', `${Date.now()}\tnot-here`, 'PX', 60_000);
  const r = await chat(url, 'pinned elsewhere', { 'x-session-id': 'elsewhere' });
  t.equal(r.status, 200);
  t.equal(r.endpoint, 'e0');
  t.ok(await until(async () => (await client.get('gone:s:elsewhere'))?.endsWith('\te0') === true), 'the session is pinned anew here, and written back');
});
