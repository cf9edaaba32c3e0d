// Stored responses are walls between tenants, over real sockets, for the
// memory, SQLite and Redis (a real redis-server) stores, with
// `flowControl.tenants: { key-a: a, key-b: b }`: another tenant (or an
// anonymous caller) gets 404 exactly like a missing id on GET, DELETE,
// input_items and previous_response_id; the owner's paths all work; one
// tenant branching a conversation 80 times does not evict another's
// responses; ids are random (no shared prefix, no counter); a turn too
// large to keep says `store: false`.
import t from 'tap';
import { join } from 'node:path';
import { call, KEY_A, KEY_B, tenantRouter as router, until } from '../support/tenant-calls.js';
import { startRedis } from '../support/redis-util.js';


const create = (url: string, auth: string | null, extra: Record<string, unknown> = {}) =>
  call(url, 'POST', '/v1/responses', auth, { model: 'open-model', input: 'a secret of mine', max_output_tokens: 3, ...extra });

/** Every cross-tenant path is a 404 shaped like a missing id's; every owner path works. */
async function walls(t: Tap.Test, url: string): Promise<void> {
  const r1 = await create(url, KEY_A);
  t.equal(r1.status, 200, 'a stores a response');
  const id = r1.json.id as string;
  const missing = `resp_${'0'.repeat(48)}`;
  const miss = await call(url, 'GET', `/v1/responses/${missing}`, KEY_A);
  t.equal(miss.status, 404);
  for (const [who, auth] of [
    ['b', KEY_B],
    ['anonymous', null],
    ['an unknown key', 'Bearer key-zzz'],
  ] as const) {
    const get = await call(url, 'GET', `/v1/responses/${id}`, auth);
    t.equal(get.status, 404, `${who}: GET is 404`);
    t.same({ ...get.json.error, message: '' }, { ...miss.json.error, message: '' }, `${who}: the same error as a missing id`);
    t.equal(get.json.error.message, miss.json.error.message.replace(missing, id), `${who}: the same message as a missing id`);
    t.equal((await call(url, 'GET', `/v1/responses/${id}/input_items`, auth)).status, 404, `${who}: input_items is 404`);
    const cont = await create(url, auth, { input: 'what did a say?', previous_response_id: id });
    t.equal(cont.status, 404, `${who}: continuing a's conversation is 404`);
    t.equal(cont.json.error.code, 'previous_response_not_found');
    t.equal((await call(url, 'DELETE', `/v1/responses/${id}`, auth)).status, 404, `${who}: DELETE is 404`);
  }
  // the owner: everything works, and the others' DELETE did nothing
  const get = await call(url, 'GET', `/v1/responses/${id}`, KEY_A);
  t.equal(get.status, 200, 'a reads its response');
  t.equal(get.json.id, id);
  const items = await call(url, 'GET', `/v1/responses/${id}/input_items`, KEY_A);
  t.equal(items.status, 200);
  t.equal(items.json.data[0].content[0].text, 'a secret of mine', "a lists its input items");
  const cont = await create(url, KEY_A, { input: 'and then?', previous_response_id: id });
  t.equal(cont.status, 200, 'a continues its conversation');
  t.ok(cont.json.usage.input_tokens > r1.json.usage.input_tokens, 'with its history');
  // b's own chain works beside it, and b cannot reach a's continuation either
  const b1 = await create(url, KEY_B, { input: 'b here' });
  t.equal(b1.status, 200);
  t.equal((await create(url, KEY_B, { input: 'b again', previous_response_id: b1.json.id })).status, 200, 'b continues its own');
  t.equal((await call(url, 'GET', `/v1/responses/${b1.json.id}`, KEY_A)).status, 404, "a cannot read b's");
  t.equal((await call(url, 'GET', `/v1/responses/${cont.json.id}`, KEY_B)).status, 404, "b cannot read a's continuation");
  // the anonymous scope is one scope: anonymous callers share it, a keyed tenant does not see it
  const anon = await create(url, null, { input: 'anonymous' });
  t.equal((await call(url, 'GET', `/v1/responses/${anon.json.id}`, null)).status, 200, 'anonymous reads the anonymous scope');
  t.equal((await call(url, 'GET', `/v1/responses/${anon.json.id}`, KEY_A)).status, 404, 'a does not see the anonymous scope');
  const del = await call(url, 'DELETE', `/v1/responses/${id}`, KEY_A);
  t.equal(del.status, 200, 'a deletes its response');
  t.equal((await call(url, 'GET', `/v1/responses/${id}`, KEY_A)).status, 404, 'gone');
}

t.test('memory store: tenant walls', async (t) => {
  const { url } = await router(t, {});
  await walls(t, url);
});

t.test('SQLite store: tenant walls', async (t) => {
  const dir = t.testdir({});
  const { url } = await router(t, { store: { type: 'sqlite', path: join(dir, 'r.db') } });
  await walls(t, url);
});

t.test('Redis store: tenant walls', async (t) => {
  const redis = await startRedis(t);
  const { url, router: r } = await router(t, { store: { type: 'redis', url: redis.url } });
  t.ok(await until(() => r.core.responses!.store!.available, 10_000), 'connected');
  await walls(t, url);
});

/** One tenant branching one conversation 80 times does not evict another tenant's responses. */
async function noCrossEviction(t: Tap.Test, url: string): Promise<void> {
  const mine: string[] = [];
  for (let i = 0; i < 5; i++) mine.push((await create(url, KEY_B, { input: `b keeps ${i}` })).json.id);
  let root = await create(url, KEY_A, { input: 'x'.repeat(2000) });
  t.equal(root.status, 200);
  const branches: string[] = [];
  for (let i = 0; i < 80; i++) {
    let br = await create(url, KEY_A, { input: `branch ${i}`, previous_response_id: root.json.id });
    if (br.status === 404) {
      // oldest-first (SQLite) evicts a's root in time: a starts again, still only within its own budget
      root = await create(url, KEY_A, { input: 'x'.repeat(2000) });
      br = await create(url, KEY_A, { input: `branch ${i}`, previous_response_id: root.json.id });
    }
    t.equal(br.status, 200, `branch ${i}`);
    branches.push(br.json.id);
  }
  for (const id of mine) t.equal((await call(url, 'GET', `/v1/responses/${id}`, KEY_B)).status, 200, `b's ${id.slice(0, 12)}… is still there`);
  t.equal((await call(url, 'GET', `/v1/responses/${branches[0]}`, KEY_A)).status, 404, "a's own oldest branch went (a is bounded too)");
  t.equal((await call(url, 'GET', `/v1/responses/${branches[79]}`, KEY_A)).status, 200, "a's newest branch is kept");
}

t.test('memory store: limits are per tenant (a branched conversation evicts only its own tenant)', async (t) => {
  const { url } = await router(t, { maxResponses: 20 });
  await noCrossEviction(t, url);
});

t.test('SQLite store: limits are per tenant', async (t) => {
  const dir = t.testdir({});
  const { url } = await router(t, { maxResponses: 20, store: { type: 'sqlite', path: join(dir, 'r.db') } });
  await noCrossEviction(t, url);
});

t.test('ids are random: no shared prefix, no counter', async (t) => {
  const { url } = await router(t, {});
  const ids: string[] = [];
  for (let i = 0; i < 16; i++) {
    const r = await create(url, KEY_A);
    ids.push(r.json.id.slice(5));
    ids.push(r.json.output[0].id.slice(4));
  }
  for (const id of ids) t.match(id, /^[0-9a-f]{48}$/);
  // two independent random ids share a prefix of more than 6 hex digits with probability ~2^-24
  let longest = 0;
  for (let i = 0; i < ids.length; i++) {
    for (let j = i + 1; j < ids.length; j++) {
      let k = 0;
      while (k < 48 && ids[i]![k] === ids[j]![k]) k++;
      longest = Math.max(longest, k);
    }
  }
  t.ok(longest <= 6, `no two ids share a long prefix (longest common: ${longest} hex digits)`);
  // and consecutive ids differ in about half their bits (a counter would change a few)
  const bits = (a: string, b: string) => {
    let n = 0;
    for (let i = 0; i < 48; i += 8) {
      let x = Number.parseInt(a.slice(i, i + 8), 16) ^ Number.parseInt(b.slice(i, i + 8), 16);
      while (x !== 0) {
        n += x & 1;
        x >>>= 1;
      }
    }
    return n;
  };
  for (let i = 1; i < ids.length; i++) t.ok(bits(ids[i - 1]!, ids[i]!) > 48, 'consecutive ids differ in many bits');
});

t.test('store: true over the byte budget answers store: false (not an id that 404s)', async (t) => {
  const { url } = await router(t, { maxBytes: 4096 });
  const small = await create(url, KEY_A);
  t.equal(small.json.store, true, 'a small turn is stored');
  const big = await create(url, KEY_A, { input: 'y'.repeat(8000) });
  t.equal(big.status, 200);
  t.equal(big.json.store, false, 'too large to keep: the object says store: false');
  t.equal((await call(url, 'GET', `/v1/responses/${big.json.id}`, KEY_A)).status, 404, 'and it is indeed not stored');
  // streamed: the final response object says it too
  const res = await fetch(url + '/v1/responses', {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: KEY_A },
    body: JSON.stringify({ model: 'open-model', input: 'z'.repeat(8000), max_output_tokens: 3, stream: true }),
  });
  const text = await res.text();
  const last = text.trim().split('\n\n').pop()!;
  const data = JSON.parse(last.split('\n').find((l) => l.startsWith('data:'))!.slice(5));
  t.equal(data.response.store, false, 'streamed: the final event says store: false');
});
