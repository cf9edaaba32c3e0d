// The Responses stores beyond memory, over real sockets: two router replicas
// sharing one real redis-server continue one conversation; Redis going away
// gives 503 on /v1/responses while chat completions keep working, and the
// API recovers when it is back; a SQLite file survives a router restart and
// is bounded; config errors name their field.
import t from 'tap';
import { join } from 'node:path';
import OpenAI from 'openai';
import { startTestRouter } from '../support/router-util.js';
import { startRedis } from '../support/redis-util.js';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { ConfigError } from '../../src/errors.js';
import { startRouter } from '../../src/server/router.js';
import Database from 'better-sqlite3';
import type { SqliteStore } from '../../src/responses/sqlite-store.js';

async function router(t: Tap.Test, responses: Record<string, unknown>, fleet: Record<string, unknown> = { timeScale: 0 }) {
  const r = await startTestRouter(t, { n: 1, fleet, extra: { responses } });
  return { ...r, client: new OpenAI({ baseURL: `${r.url}/v1`, apiKey: 'sk-test', maxRetries: 0 }) };
}

async function post(url: string, path: string, body: unknown): Promise<{ status: number; json: any }> {
  const res = await fetch(url + path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return { status: res.status, json: await res.json() };
}

const until = async (cond: () => Promise<boolean>, ms: number): Promise<boolean> => {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await cond()) return true;
    await new Promise((r) => setTimeout(r, 50));
  }
  return false;
};

t.test('two router replicas sharing one Redis continue one conversation', async (t) => {
  const redis = await startRedis(t);
  const store = { type: 'redis', url: redis.url };
  const a = await router(t, { store });
  const b = await router(t, { store });
  // the router serves (503 on /v1/responses) before its Redis connection is ready: wait for it
  t.ok(await until(async () => a.router.core.responses!.store!.available && b.router.core.responses!.store!.available, 10_000), 'both connected');
  const r1 = await a.client.responses.create({ model: 'open-model', input: 'Started on replica A.', max_output_tokens: 4 });
  const r2 = await b.client.responses.create({ model: 'open-model', input: 'Continued on replica B.', previous_response_id: r1.id, max_output_tokens: 4 });
  t.equal(r2.previous_response_id, r1.id);
  t.ok(r2.usage!.input_tokens > r1.usage!.input_tokens, 'B rebuilt the conversation A stored');
  // streamed on A, continuing B's turn (the async store path with a stream)
  const s = await a.client.responses.create({ model: 'open-model', input: 'Back on A, streamed.', previous_response_id: r2.id, max_output_tokens: 4, stream: true });
  let last: any = null;
  for await (const e of s) last = e;
  t.equal(last.type, 'response.incomplete');
  const r3id = last.response.id as string;
  const items = (await b.client.responses.inputItems.list(r3id, { order: 'asc' })).data as any[];
  t.same(
    items.filter((i) => i.role === 'user').map((i) => i.content[0].text),
    ['Started on replica A.', 'Continued on replica B.', 'Back on A, streamed.'],
  );
  t.equal((await b.client.responses.retrieve(r1.id)).id, r1.id, 'B reads what A stored');
  await b.client.responses.delete(r1.id);
  await t.rejects(a.client.responses.retrieve(r1.id), { status: 404 }, 'A sees B delete it');
  const cont = await post(a.url, '/v1/responses', { model: 'open-model', input: 'x', previous_response_id: r1.id });
  t.equal(cont.json.error.code, 'previous_response_not_found');
  // branches from both replicas at once off the same response
  const [x, y] = await Promise.all([
    a.client.responses.create({ model: 'open-model', input: 'branch A', previous_response_id: r2.id, max_output_tokens: 2 }),
    b.client.responses.create({ model: 'open-model', input: 'branch B', previous_response_id: r2.id, max_output_tokens: 2 }),
  ]);
  t.not(x.id, y.id);
});

t.test('Redis down: 503 on /v1/responses with a clear message, chat completions keep working, recovery when it is back', async (t) => {
  const redis = await startRedis(t);
  const a = await router(t, { store: { type: 'redis', url: redis.url, commandTimeoutMs: 500 } });
  t.ok(await until(async () => a.router.core.responses!.store!.available, 10_000), 'connected');
  const r1 = await a.client.responses.create({ model: 'open-model', input: 'before the outage', max_output_tokens: 2 });
  await redis.kill();
  await until(async () => !a.router.core.responses!.store!.available, 3000);
  for (const body of [
    { model: 'open-model', input: 'new conversation' },
    { model: 'open-model', input: 'continue', previous_response_id: r1.id },
    { model: 'open-model', input: 'streamed', stream: true },
  ]) {
    const r = await post(a.url, '/v1/responses', body);
    t.equal(r.status, 503, `503 for ${JSON.stringify(body)}`);
    t.equal(r.json.error.code, 'store_unavailable');
    t.match(r.json.error.message, /unavailable/);
  }
  const g = await fetch(`${a.url}/v1/responses/${r1.id}`);
  t.equal(g.status, 503, 'GET: 503');
  // store: false needs no store
  const eph = await post(a.url, '/v1/responses', { model: 'open-model', input: 'no store', store: false, max_output_tokens: 2 });
  t.equal(eph.status, 200, 'store: false is served without the store');
  const chat = await post(a.url, '/v1/chat/completions', { model: 'open-model', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });
  t.equal(chat.status, 200, 'chat completions are not affected');
  await redis.restart();
  t.ok(await until(async () => a.router.core.responses!.store!.available, 5000), 'reconnected');
  const after = await post(a.url, '/v1/responses', { model: 'open-model', input: 'after the outage', max_output_tokens: 2 });
  t.equal(after.status, 200);
  const cont = await post(a.url, '/v1/responses', { model: 'open-model', input: 'next', previous_response_id: after.json.id, max_output_tokens: 2 });
  t.equal(cont.status, 200, 'chains work again');
});

t.test('SQLite: a durable file survives a router restart; bounded oldest-first', async (t) => {
  const dir = t.testdir({});
  const path = join(dir, 'responses.db');
  const first = await router(t, { store: { type: 'sqlite', path } });
  const r1 = await first.client.responses.create({ model: 'open-model', input: 'remember me', max_output_tokens: 3 });
  const r2 = await first.client.responses.create({ model: 'open-model', input: 'and me', previous_response_id: r1.id, max_output_tokens: 3 });
  await first.router.close(100);
  const second = await router(t, { store: { type: 'sqlite', path } });
  t.same(await second.client.responses.retrieve(r2.id), r2, 'read back after a restart');
  const r3 = await second.client.responses.create({ model: 'open-model', input: 'third', previous_response_id: r2.id, max_output_tokens: 3 });
  const items = (await second.client.responses.inputItems.list(r3.id, { order: 'asc' })).data as any[];
  t.same(
    items.filter((i) => i.role === 'user').map((i) => i.content[0].text),
    ['remember me', 'and me', 'third'],
  );
  await second.client.responses.delete(r1.id);
  await t.rejects(second.client.responses.retrieve(r1.id), { status: 404 });
  // bounded: maxResponses 2 keeps the newest two
  const small = await router(t, { store: { type: 'sqlite', path: join(dir, 'small.db') }, maxResponses: 2 });
  const ids: string[] = [];
  for (let i = 0; i < 4; i++) ids.push((await small.client.responses.create({ model: 'open-model', input: `n${i}`, max_output_tokens: 2 })).id);
  t.equal(small.router.core.responses!.store!.size(), 2);
  await t.rejects(small.client.responses.retrieve(ids[0]!), { status: 404 });
  const cont = await post(small.url, '/v1/responses', { model: 'open-model', input: 'x', previous_response_id: ids[1] });
  t.equal(cont.json.error.code, 'previous_response_not_found', 'continuing an evicted row: 404');
  t.equal((await small.client.responses.retrieve(ids[3]!)).id, ids[3]);
});

t.test('SQLite: a file that cannot be opened stops the router with the field named', async (t) => {
  const cfg = validateConfig({
    apiVersion: API_VERSION,
    kind: 'Router',
    pools: [{ name: 'p', models: ['m'], endpoints: [{ url: 'http://127.0.0.1:1' }] }],
    logging: { level: 'silent' },
    responses: { store: { type: 'sqlite', path: '/nonexistent-dir/x/responses.db' } },
  });
  await t.rejects(startRouter(cfg, { port: 0, host: '127.0.0.1' }), /responses\.store\.path/);
});

t.test('config: the responses block is validated with field paths', async (t) => {
  const base = { apiVersion: API_VERSION, kind: 'Router', pools: [{ name: 'p', models: ['m'], endpoints: [{ url: 'http://127.0.0.1:1' }] }] };
  const cfg = validateConfig(base);
  t.equal(cfg.responses.enabled, true);
  t.equal(cfg.responses.store.type, 'memory', 'the embedded default');
  const check = (responses: unknown, path: string, msg: RegExp) => {
    try {
      validateConfig({ ...base, responses });
      t.fail(`accepted ${JSON.stringify(responses)}`);
    } catch (err) {
      t.type(err, ConfigError);
      const issue = (err as ConfigError).issues.find((i) => i.path === path);
      t.ok(issue, `${path} reported (${(err as Error).message})`);
      t.match(issue?.message, msg);
    }
  };
  check({ store: { type: 'redis' } }, 'responses.store.url', /required with type: redis/);
  check({ store: { type: 'sqlite' } }, 'responses.store.path', /required with type: sqlite/);
  check({ store: { type: 'mongo' } }, 'responses.store.type', /one of: memory, sqlite, redis/);
  check({ store: { type: 'redis', url: 'http://x' } }, 'responses.store.url', /redis:\/\//);
  check({ ttlSeconds: 0 }, 'responses.ttlSeconds', /integer/);
  check({ maxBytes: 10 }, 'responses.maxBytes', /integer/);
  check({ bogus: 1 }, 'responses.bogus', /unknown field/);
});

t.test('SQLite: a store error is a 503 with a clear message; reads, chat completions and later turns keep working', async (t) => {
  const dir = t.testdir({});
  const path = join(dir, 'responses.db');
  const a = await router(t, { store: { type: 'sqlite', path } });
  const r1 = await a.client.responses.create({ model: 'open-model', input: 'before the lock', max_output_tokens: 2 });
  // another process holds the database's write lock (a real fault: a backup tool, a second writer)
  const other = new Database(path);
  other.exec('BEGIN EXCLUSIVE');
  const blocked = await post(a.url, '/v1/responses', { model: 'open-model', input: 'while locked', previous_response_id: r1.id, max_output_tokens: 2 });
  t.equal(blocked.status, 503, 'a turn that cannot be stored: 503');
  t.equal(blocked.json.error.code, 'store_unavailable');
  t.match(blocked.json.error.message, /could not be stored.*SQLite.*locked/);
  const streamed = await fetch(`${a.url}/v1/responses`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'open-model', input: 'streamed while locked', max_output_tokens: 2, stream: true }),
  });
  const events = await streamed.text();
  t.match(events, /event: response\.failed\ndata: \{[^\n]*"code":"store_unavailable"/, 'a streamed turn ends with response.failed');
  t.equal((await a.client.responses.retrieve(r1.id)).id, r1.id, 'reads do not wait for the writer (WAL)');
  const chat = await post(a.url, '/v1/chat/completions', { model: 'open-model', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });
  t.equal(chat.status, 200, 'chat completions are not affected');
  other.exec('ROLLBACK');
  other.close();
  const r2 = await a.client.responses.create({ model: 'open-model', input: 'after the lock', previous_response_id: r1.id, max_output_tokens: 2 });
  t.equal(r2.previous_response_id, r1.id, 'the chain continues once the lock is gone');
});

t.test('SQLite: its worker thread dies: 503 while it restarts, then every committed chain is there', async (t) => {
  const dir = t.testdir({});
  const a = await router(t, { store: { type: 'sqlite', path: join(dir, 'responses.db') } });
  const store = a.router.core.responses!.store as SqliteStore;
  const r1 = await a.client.responses.create({ model: 'open-model', input: 'kept', max_output_tokens: 2 });
  await store.crashForTest();
  t.notOk(store.available, 'unavailable at once');
  const down = await post(a.url, '/v1/responses', { model: 'open-model', input: 'x', previous_response_id: r1.id, max_output_tokens: 2 });
  t.equal(down.status, 503);
  t.match(down.json.error.message, /SQLite|sqlite/);
  t.ok(await until(async () => store.available, 30_000), 'the worker is started again');
  const r2 = await a.client.responses.create({ model: 'open-model', input: 'continued', previous_response_id: r1.id, max_output_tokens: 2 });
  t.equal(r2.previous_response_id, r1.id);
  t.equal(store.size(), 2);
});
