// The admin API's tenants and keys, over real sockets with `switchyard sim`
// engines: GET /admin/tenants (per-tenant requests and in-flight, keys by id,
// never the key nor its digest), POST /admin/keys/reload (a removed key
// refused at once, a bad file refused with its line, the running keys kept).
import t from 'tap';
import { createHash } from 'node:crypto';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startFleet } from '../../src/sim/index.js';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { startRouter } from '../../src/server/router.js';
import { validatePlugin } from '../support/router-util.js';
import { send, until } from '../support/sim-util.js';

const sha = (k: string) => createHash('sha256').update(k).digest('hex');
const KEY_A = 'sk-admin-test-a';
const KEY_A2 = 'sk-admin-test-a-second';
const KEY_B = 'sk-admin-test-b';
const KEY_C = 'sk-admin-test-c';
const TOKEN = 'admin-token';

const call = (base: string, method: string, path: string, body: unknown, headers: Record<string, string> = {}) => send(base, method, path, body, headers).done;
const chat = (n: number, extra: Record<string, unknown> = {}) => ({ model: 'open-model', messages: [{ role: 'user', content: `q ${n}` }], max_tokens: 2, ...extra });

t.test('GET /admin/tenants and POST /admin/keys/reload', async (t) => {
  const fleet = await startFleet(1, { timeScale: 1 });
  t.teardown(() => fleet.close());
  const dir = await mkdtemp(join(tmpdir(), 'swy-auth-admin-'));
  const keys = join(dir, 'keys.txt');
  await writeFile(keys, `${sha(KEY_A)} a models=open-model maxBand=standard\n${sha(KEY_A2)} a\n${sha(KEY_B)} b\n`);
  const cfg = validateConfig(
    {
      apiVersion: API_VERSION,
      kind: 'Router',
      logging: { level: 'silent' },
      pools: [{ name: 'p', models: ['open-model'], endpoints: fleet.urls.map((url, i) => ({ name: `e${i}`, url })) }],
      admin: { token: TOKEN },
      auth: { keysFile: keys, required: false },
    },
    validatePlugin,
  );
  const r = await startRouter(cfg, { port: 0, host: '127.0.0.1', adminPort: 0 });
  t.teardown(() => r.close(200));
  const admin = (method: string, path: string, token = TOKEN) => call(r.admin!.url, method, path, undefined, { authorization: `Bearer ${token}` });
  const as = (key: string | null, n: number, extra: Record<string, unknown> = {}) =>
    send(r.url, 'POST', '/v1/chat/completions', chat(n, extra), key === null ? {} : { authorization: `Bearer ${key}` });

  t.equal((await admin('GET', '/admin/tenants', 'wrong')).status, 401, 'the admin token is required');
  for (let i = 0; i < 3; i++) t.equal((await as(KEY_A, i).done).status, 200);
  t.equal((await as(KEY_A2, 9).done).status, 200);
  t.equal((await as(null, 10).done).status, 200, 'anonymous (required: false)');
  const slow = as(KEY_B, 11, { max_tokens: 80, stream: true });
  await slow.first;
  const res = await admin('GET', '/admin/tenants');
  t.equal(res.status, 200);
  const view = JSON.parse(res.body);
  t.same(view.auth, { required: false, trustHeaders: false, keys: 3 });
  t.same(view.anonymous, { requests: 1, inFlight: 0 });
  t.same(view.tenants.map((x: { tenant: string }) => x.tenant), ['a', 'b']);
  const [a, b] = view.tenants;
  t.match(a, { tenant: 'a', requests: 4, inFlight: 0 });
  t.same(a.keys, [
    { id: sha(KEY_A).slice(0, 16), models: ['open-model'], maxBand: 'standard', requests: 3, inFlight: 0 },
    { id: sha(KEY_A2).slice(0, 16), models: null, maxBand: null, requests: 1, inFlight: 0 },
  ]);
  t.match(b, { tenant: 'b', requests: 1, inFlight: 1 }, 'the streaming request is in flight');
  for (const k of [KEY_A, KEY_A2, KEY_B]) t.notOk(res.body.includes(k) || res.body.includes(sha(k)), 'neither a key nor its whole digest');
  t.equal((await slow.done).status, 200);
  t.ok(await until(async () => JSON.parse((await admin('GET', '/admin/tenants')).body).tenants[1].inFlight === 0), 'in flight back to 0');

  // rotate: b's key goes, c's comes; the file is re-read by the admin API alone
  await writeFile(keys, `${sha(KEY_A)} a\n${sha(KEY_C)} c\n`);
  const rr = await admin('POST', '/admin/keys/reload');
  t.equal(rr.status, 200);
  t.same(JSON.parse(rr.body), { ok: true, keys: 2 });
  t.equal((await as(KEY_C, 12).done).status, 200, 'the new key works');
  // required: false, so the removed key is now served as the anonymous caller, not as b
  t.equal((await as(KEY_B, 13).done).status, 200);
  const after = JSON.parse((await admin('GET', '/admin/tenants')).body);
  t.match(after.tenants.find((x: { tenant: string }) => x.tenant === 'b'), { requests: 1, keys: [] }, 'b keeps its counts, no key');
  t.match(after.tenants.find((x: { tenant: string }) => x.tenant === 'c'), { requests: 1, keys: [{ id: sha(KEY_C).slice(0, 16), requests: 1 }] });
  t.same(after.anonymous, { requests: 2, inFlight: 0 }, 'the removed key counted as anonymous');

  await writeFile(keys, `${sha(KEY_A)} a\nnot a line\n`);
  const bad = await admin('POST', '/admin/keys/reload');
  t.equal(bad.status, 422);
  t.match(JSON.parse(bad.body), { ok: false, issues: [{ path: 'auth.keysFile line 2' }] });
  t.equal((await as(KEY_C, 14).done).status, 200, 'the running keys keep serving');
  t.equal((await admin('GET', '/admin/keys/reload')).status, 405);
});

t.test('required keys: a removed key answers 401 right after POST /admin/keys/reload; no auth block: 409', async (t) => {
  const fleet = await startFleet(1, { timeScale: 0 });
  t.teardown(() => fleet.close());
  const dir = await mkdtemp(join(tmpdir(), 'swy-auth-admin-'));
  const keys = join(dir, 'keys.txt');
  await writeFile(keys, `${sha(KEY_A)} a\n`);
  const base = { apiVersion: API_VERSION, kind: 'Router', logging: { level: 'silent' }, pools: [{ name: 'p', models: ['open-model'], endpoints: fleet.urls.map((url, i) => ({ name: `e${i}`, url })) }], admin: { token: TOKEN } };
  const r = await startRouter(validateConfig({ ...base, auth: { keysFile: keys } }, validatePlugin), { port: 0, host: '127.0.0.1', adminPort: 0 });
  t.teardown(() => r.close(200));
  const post = (key: string) => call(r.url, 'POST', '/v1/chat/completions', chat(1), { authorization: `Bearer ${key}` });
  t.equal((await post(KEY_A)).status, 200);
  await writeFile(keys, `${sha(KEY_B)} b\n`);
  t.equal((await call(r.admin!.url, 'POST', '/admin/keys/reload', undefined, { authorization: `Bearer ${TOKEN}` })).status, 200);
  t.equal((await post(KEY_A)).status, 401, 'removed: refused');
  t.equal((await post(KEY_B)).status, 200);
  const plain = await startRouter(validateConfig(base, validatePlugin), { port: 0, host: '127.0.0.1', adminPort: 0 });
  t.teardown(() => plain.close(200));
  t.equal((await call(plain.admin!.url, 'POST', '/admin/keys/reload', undefined, { authorization: `Bearer ${TOKEN}` })).status, 409);
  const v = JSON.parse((await call(plain.admin!.url, 'GET', '/admin/tenants', undefined, { authorization: `Bearer ${TOKEN}` })).body);
  t.same(v, { auth: null, tenants: [], anonymous: { requests: 0, inFlight: 0 } });
});
