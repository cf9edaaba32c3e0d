// A continuation is kept as what its turn added, linked to its parent's part,
// in every Responses store (memory, SQLite, Redis on a real redis-server),
// over real sockets against simulated engines:
// - forty branches of one 60 KB conversation all fit a 300 KB budget (each
//   charged for its own input and output, not for a copy of the history);
// - deleting the conversation's first response leaves every branch whole
//   (its part stays while they need it) and deleting them all frees every
//   byte (nothing lingers);
// - a chain longer than MAX_LINKS reads back every message in order (the
//   checkpoints keep reads bounded without losing a message);
// - records of the earlier layouts (SQLite's responses_t, Redis's one
//   string per record) are still read and continued.
import t from 'tap';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { Redis } from 'ioredis';
import { call, KEY_A, KEY_B, tenantRouter as router, until } from '../support/tenant-calls.js';
import { startRedis } from '../support/redis-util.js';
import { MAX_LINKS } from '../../src/responses/store.js';
import { encode, keyOf } from '../../src/responses/redis-store.js';
import type { MemoryStore } from '../../src/responses/memory-store.js';
import type { SqliteStore } from '../../src/responses/sqlite-store.js';

const BIG = 60_000;

const create = (url: string, auth: string | null, extra: Record<string, unknown>) =>
  call(url, 'POST', '/v1/responses', auth, { model: 'open-model', max_output_tokens: 2, ...extra });

/** The user inputs of a response's input_items, oldest first (every page). */
async function userInputs(url: string, auth: string, id: string): Promise<string[]> {
  const out: string[] = [];
  let after: string | null = null;
  for (;;) {
    const q: string = `/v1/responses/${id}/input_items?order=asc&limit=100${after === null ? '' : `&after=${after}`}`;
    const page = await call(url, 'GET', q, auth);
    if (page.status !== 200) throw new Error(`input_items ${page.status}: ${JSON.stringify(page.json)}`);
    for (const it of page.json.data) if (it.role === 'user') out.push(it.content[0].text);
    if (!page.json.has_more) return out;
    after = page.json.last_id;
  }
}

/**
 * Forty branches of a 60 KB conversation under a 300 KB budget: all kept,
 * each continuable with its whole history; the root deleted, they stay
 * whole; all deleted, `bytes()` (when the store can say) is back to `before`.
 */
async function branches(t: Tap.Test, url: string, bytes: (() => number) | null): Promise<void> {
  const before = bytes?.() ?? 0;
  const root = await create(url, KEY_A, { input: 'x'.repeat(BIG) });
  t.equal(root.status, 200, 'the 60 KB first turn is stored');
  const ids: string[] = [];
  for (let i = 0; i < 40; i++) {
    const br = await create(url, KEY_A, { input: `branch ${i}`, previous_response_id: root.json.id });
    t.equal(br.status, 200, `branch ${i}`);
    t.equal(br.json.store, true, `branch ${i} is kept`);
    ids.push(br.json.id);
  }
  for (let i = 0; i < 40; i++) t.equal((await call(url, 'GET', `/v1/responses/${ids[i]}`, KEY_A)).status, 200, `branch ${i} is still there`);
  t.equal((await call(url, 'GET', `/v1/responses/${root.json.id}`, KEY_A)).status, 200, 'and so is the first turn');
  if (bytes !== null) {
    const held = bytes() - before;
    t.ok(held < 3 * BIG, `the conversation and its 40 branches hold ${held} bytes: what each added (about 1.6 KB: its Response object, its input and output), not 40 copies of 60 KB`);
  }
  t.same(await userInputs(url, KEY_A, ids[7]!), ['x'.repeat(BIG), 'branch 7'], "a branch's history is its own: the first turn's input, then its own");
  // the other tenant reaches none of it
  t.equal((await create(url, KEY_B, { input: 'mine?', previous_response_id: ids[3] })).status, 404, "b cannot continue a's branch");
  // the first turn deleted: its part stays for the branches
  t.equal((await call(url, 'DELETE', `/v1/responses/${root.json.id}`, KEY_A)).status, 200, 'a deletes the first turn');
  t.equal((await call(url, 'GET', `/v1/responses/${root.json.id}`, KEY_A)).status, 404, 'it is gone');
  t.equal((await call(url, 'DELETE', `/v1/responses/${root.json.id}`, KEY_A)).status, 404, 'a second delete finds nothing');
  const cont = await create(url, KEY_A, { input: 'and then?', previous_response_id: ids[5] });
  t.equal(cont.status, 200, 'a branch of the deleted first turn continues');
  t.ok(cont.json.usage.input_tokens > BIG / 8, `with the whole history (${cont.json.usage.input_tokens} input tokens)`);
  t.same(await userInputs(url, KEY_A, cont.json.id), ['x'.repeat(BIG), 'branch 5', 'and then?'], 'in order');
  for (const id of [...ids, cont.json.id]) t.equal((await call(url, 'DELETE', `/v1/responses/${id}`, KEY_A)).status, 200);
  if (bytes !== null) t.equal(bytes(), before, 'every byte is freed once no response needs it');
}

/** One conversation of MAX_LINKS + 12 turns: every input comes back, in order. */
async function longChain(t: Tap.Test, url: string): Promise<void> {
  const n = MAX_LINKS + 12;
  let prev: string | null = null;
  const want: string[] = [];
  for (let i = 0; i < n; i++) {
    const r = await create(url, KEY_A, { input: `turn ${i}`, ...(prev === null ? {} : { previous_response_id: prev }) });
    if (r.status !== 200) {
      t.fail(`turn ${i}: ${r.status} ${JSON.stringify(r.json)}`);
      return;
    }
    want.push(`turn ${i}`);
    prev = r.json.id;
  }
  t.same(await userInputs(url, KEY_A, prev!), want, `${n} turns read back whole and in order`);
}

t.test('memory store: a branch costs what it adds', async (t) => {
  const { url, router: r } = await router(t, { maxBytes: 300_000, maxResponses: 1000 });
  const store = r.core.responses!.store as MemoryStore;
  await branches(t, url, () => store.bytesOf('a'));
  await longChain(t, url);
});

t.test('SQLite store: a branch costs what it adds', async (t) => {
  const dir = t.testdir({});
  const { url, router: r } = await router(t, { maxBytes: 300_000, maxResponses: 1000, store: { type: 'sqlite', path: join(dir, 'r.db') } });
  const store = r.core.responses!.store as SqliteStore;
  await branches(t, url, () => store.bytes);
  await longChain(t, url);
});

t.test('Redis store: a branch costs what it adds', async (t) => {
  const redis = await startRedis(t);
  const { url, router: r } = await router(t, { store: { type: 'redis', url: redis.url } });
  t.ok(await until(() => r.core.responses!.store!.available, 10_000), 'connected');
  const probe = new Redis(redis.url);
  t.teardown(() => probe.disconnect());
  let mem = 0;
  // what Redis holds for the tenant, read before each check (bytes() is called synchronously: kept fresh by measure())
  const measure = async () => {
    const keys = await probe.keys('switchyard:resp:*1:a:*');
    let n = 0;
    for (const k of keys) n += (await probe.memory('USAGE', k)) ?? 0;
    mem = n;
  };
  await measure();
  t.equal(mem, 0);
  const root = await create(url, KEY_A, { input: 'x'.repeat(BIG) });
  const ids: string[] = [];
  t.equal(root.status, 200);
  for (let i = 0; i < 40; i++) {
    const br = await create(url, KEY_A, { input: `branch ${i}`, previous_response_id: root.json.id });
    t.equal(br.status, 200, `branch ${i}`);
    ids.push(br.json.id);
  }
  await measure();
  t.ok(mem < 3 * BIG, `Redis holds ${mem} bytes for the conversation and its 40 branches, not 40 copies of 60 KB`);
  t.same(await userInputs(url, KEY_A, ids[9]!), ['x'.repeat(BIG), 'branch 9']);
  t.equal((await call(url, 'DELETE', `/v1/responses/${root.json.id}`, KEY_A)).status, 200);
  const cont = await create(url, KEY_A, { input: 'and then?', previous_response_id: ids[2] });
  t.equal(cont.status, 200, 'a branch of the deleted first turn continues');
  t.same(await userInputs(url, KEY_A, cont.json.id), ['x'.repeat(BIG), 'branch 2', 'and then?']);
  // every part above a record stretched to the record's TTL
  const ttlRoot = await probe.pttl(`switchyard:resp:p:1:a:${root.json.id}`);
  const ttlLeaf = await probe.pttl(`switchyard:resp:p:1:a:${cont.json.id}`);
  t.ok(ttlRoot >= ttlLeaf - 1000, `the first turn's part lives as long as the newest record below it (${ttlRoot} / ${ttlLeaf} ms)`);
  for (const id of [...ids, cont.json.id]) t.equal((await call(url, 'DELETE', `/v1/responses/${id}`, KEY_A)).status, 200);
  t.same(await probe.keys('switchyard:resp:*1:a:*'), [], 'nothing is left once no response needs it');
  await longChain(t, url);
  // a part above a record evicted by Redis: its continuation is a clean 404, never half a conversation
  const c1 = await create(url, KEY_A, { input: 'one' });
  const c2 = await create(url, KEY_A, { input: 'two', previous_response_id: c1.json.id });
  const c3 = await create(url, KEY_A, { input: 'three', previous_response_id: c2.json.id });
  // no id a client sends reaches a part's hash (DELETE, GET and previous_response_id of a part-like id)
  for (const fake of [`p:${c1.json.id}`, `p:1:a:${c1.json.id}`, `:p:${c1.json.id}`]) {
    const path = `/v1/responses/${encodeURIComponent(fake)}`;
    t.equal((await call(url, 'DELETE', path, KEY_A)).status, 404, `DELETE ${fake} finds nothing`);
    t.equal((await call(url, 'GET', path, KEY_A)).status, 404, `GET ${fake} finds nothing`);
    t.equal((await create(url, KEY_A, { input: 'x', previous_response_id: fake })).status, 404, `continuing ${fake} finds nothing`);
  }
  t.same(await userInputs(url, KEY_A, c3.json.id), ['one', 'two', 'three'], 'the chain is whole');
  await probe.del(`switchyard:resp:p:1:a:${c1.json.id}`);
  t.equal((await call(url, 'GET', `/v1/responses/${c3.json.id}`, KEY_A)).status, 404, 'a broken chain is absent');
  const cont3 = await create(url, KEY_A, { input: 'four', previous_response_id: c3.json.id });
  t.equal(cont3.status, 404);
  t.equal(cont3.json.error.code, 'previous_response_not_found');
});

t.test('Redis store: a record of the earlier layout (one string) is read, continued and deleted', async (t) => {
  const redis = await startRedis(t);
  const { url, router: r } = await router(t, { store: { type: 'redis', url: redis.url } });
  t.ok(await until(() => r.core.responses!.store!.available, 10_000), 'connected');
  const first = await create(url, KEY_A, { input: 'from before the upgrade', store: false });
  const id = 'resp_' + 'ab12'.repeat(12);
  const probe = new Redis(redis.url);
  t.teardown(() => probe.disconnect());
  const response = JSON.stringify({ ...first.json, id, store: true });
  const conv = '{"role":"user","content":"from before the upgrade"},{"role":"assistant","content":"an old answer"}';
  const ids = `msg_${'1'.repeat(48)},msg_${'2'.repeat(48)}`;
  await probe.set('switchyard:resp:' + keyOf('a', id), encode({ tenant: 'a', id, root: id, parent: '', createdAt: 1, conv, ids, response }), 'PX', 60_000);
  t.equal((await call(url, 'GET', `/v1/responses/${id}`, KEY_A)).status, 200, 'read');
  t.equal((await call(url, 'GET', `/v1/responses/${id}`, KEY_B)).status, 404, 'not by another tenant');
  const cont = await create(url, KEY_A, { input: 'after it', previous_response_id: id });
  t.equal(cont.status, 200, 'continued');
  t.same(await userInputs(url, KEY_A, cont.json.id), ['from before the upgrade', 'after it']);
  t.equal((await call(url, 'DELETE', `/v1/responses/${id}`, KEY_A)).status, 200, 'deleted');
  t.equal(await probe.exists('switchyard:resp:' + keyOf('a', id)), 0);
  t.equal((await create(url, KEY_A, { input: 'again', previous_response_id: cont.json.id })).status, 200, 'its continuation holds its whole conversation');
});

t.test('SQLite store: a file of the earlier layout (responses_t) is read and continued after the upgrade', async (t) => {
  const dir = t.testdir({});
  const path = join(dir, 'r.db');
  const id = 'resp_' + 'cd34'.repeat(12);
  const db = new Database(path);
  db.exec(`CREATE TABLE responses_t (seq INTEGER PRIMARY KEY AUTOINCREMENT, tenant TEXT NOT NULL, id TEXT NOT NULL, root TEXT NOT NULL,
    parent TEXT NOT NULL, created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL, bytes INTEGER NOT NULL, conv TEXT NOT NULL,
    ids TEXT NOT NULL, response TEXT NOT NULL, UNIQUE (tenant, id))`);
  const response = JSON.stringify({ id, object: 'response', created_at: 1, status: 'completed', model: 'open-model', output: [], store: true });
  db.prepare('INSERT INTO responses_t (tenant, id, root, parent, created_at, expires_at, bytes, conv, ids, response) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)').run(
    'a',
    id,
    id,
    '',
    1,
    Date.now() + 3_600_000,
    1000,
    '{"role":"user","content":"kept in the old table"},{"role":"assistant","content":"an old answer"}',
    `msg_${'3'.repeat(48)},msg_${'4'.repeat(48)}`,
    response,
  );
  db.close();
  const { url } = await router(t, { store: { type: 'sqlite', path } });
  t.equal((await call(url, 'GET', `/v1/responses/${id}`, KEY_A)).status, 200, 'read');
  t.equal((await call(url, 'GET', `/v1/responses/${id}`, KEY_B)).status, 404, 'not by another tenant');
  const cont = await create(url, KEY_A, { input: 'after it', previous_response_id: id });
  t.equal(cont.status, 200, 'continued');
  t.same(await userInputs(url, KEY_A, cont.json.id), ['kept in the old table', 'after it']);
  const check = new Database(path, { readonly: true });
  t.equal((check.prepare('SELECT count(*) AS n FROM responses_t').get() as { n: number }).n, 0, 'the old table is emptied (nothing deleted later comes back under an older router)');
  check.close();
});
