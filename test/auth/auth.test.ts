// API-key authentication over real sockets (docs/security.md): a router with
// an `auth` block in front of `switchyard sim` engines. 401 with OpenAI's
// body on every /v1 route for a missing, unknown or malformed key; keys from
// inline digests, a keys file and an environment variable; bad key sources
// are config errors with line numbers; a reload drops a removed key at once
// while its request in flight finishes.
import t from 'tap';
import { createHash } from 'node:crypto';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startFleet } from '../../src/sim/index.js';
import { validateConfig, API_VERSION, type RouterConfig } from '../../src/config/schema.js';
import { startRouter } from '../../src/server/router.js';
import { ConfigError } from '../../src/errors.js';
import { validatePlugin } from '../support/router-util.js';
import { send } from '../support/sim-util.js';
import { Client } from 'undici';

const sha = (k: string) => createHash('sha256').update(k).digest('hex');
const KEY_A = 'sk-alpha-0123456789';
const KEY_B = 'sk-bravo-0123456789';
const KEY_F = 'sk-file-key-0001';
const KEY_E = 'sk-env-key-0001';

const chat = { model: 'open-model', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 };

function config(urls: string[], auth: unknown, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    apiVersion: API_VERSION,
    kind: 'Router',
    pools: [{ name: 'p', models: ['open-model'], endpoints: urls.map((url, i) => ({ name: `e${i}`, url })) }],
    logging: { level: 'silent' },
    auth,
    ...extra,
  };
}

async function router(t: Tap.Test, cfg: Record<string, unknown>, opts: { configFile?: string } = {}) {
  const r = await startRouter(validateConfig(cfg, validatePlugin) as RouterConfig, { port: 0, host: '127.0.0.1', ...opts, validatePlugin });
  t.teardown(() => r.close(200));
  return r;
}

function call(base: string, method: string, path: string, body: unknown, auth?: string) {
  return send(base, method, path, body, auth === undefined ? {} : { authorization: auth }).done;
}

t.test('required: every /v1 route answers 401 invalid_api_key without a known key; a known key is served', async (t) => {
  const fleet = await startFleet(1, { timeScale: 0 });
  t.teardown(() => fleet.close());
  const r = await router(t, config(fleet.urls, { keys: [{ digest: sha(KEY_A), tenant: 'a' }] }, { responses: { enabled: true } }));
  const routes: [string, string, unknown][] = [
    ['POST', '/v1/chat/completions', chat],
    ['POST', '/v1/completions', { model: 'open-model', prompt: 'hi', max_tokens: 4 }],
    ['POST', '/v1/embeddings', { model: 'open-model', input: 'hi' }],
    ['POST', '/v1/responses', { model: 'open-model', input: 'hi' }],
    ['GET', '/v1/responses/resp_x', undefined],
    ['DELETE', '/v1/responses/resp_x', undefined],
    ['GET', '/v1/responses/resp_x/input_items', undefined],
    ['GET', '/v1/files', undefined],
    ['GET', '/v1/files/file-x/content', undefined],
    ['GET', '/v1/batches', undefined],
    ['POST', '/v1/batches', { input_file_id: 'file-x', endpoint: '/v1/chat/completions', completion_window: '24h' }],
    ['GET', '/v1/models', undefined],
  ];
  const bad: [string, string | undefined][] = [
    ['no Authorization', undefined],
    ['an unknown key', 'Bearer sk-not-a-key'],
    ['a Basic credential', `Basic ${Buffer.from('u:p').toString('base64')}`],
    ['Bearer without a token', 'Bearer'],
    ['Bearer and spaces only', 'Bearer    '],
    ['a token with a space inside', `Bearer ${KEY_A} x`],
    ['the digest instead of the key', `Bearer ${sha(KEY_A)}`],
  ];
  for (const [what, auth] of bad) {
    for (const [method, path, body] of routes) {
      const res = await call(r.url, method, path, body, auth);
      t.equal(res.status, 401, `${what}: ${method} ${path} → 401`);
      const e = JSON.parse(res.body).error;
      t.match(e, { type: 'invalid_request_error', code: 'invalid_api_key', param: null }, `${what}: ${method} ${path} body`);
      t.notOk(res.body.includes(KEY_A), 'the key is never echoed');
    }
  }
  const ok = await call(r.url, 'POST', '/v1/chat/completions', chat, `Bearer ${KEY_A}`);
  t.equal(ok.status, 200, 'a known key is served');
  t.equal((await call(r.url, 'POST', '/v1/chat/completions', chat, `bearer   ${KEY_A}  `)).status, 200, 'the scheme in any case, spaces around the token');
  const models = await call(r.url, 'GET', '/v1/models', undefined, `Bearer ${KEY_A}`);
  t.equal(models.status, 200);
  t.same(JSON.parse(models.body).data.map((m: { id: string }) => m.id), ['open-model']);
  // no batch block: past authentication the Files API says so
  t.equal((await call(r.url, 'GET', '/v1/files', undefined, `Bearer ${KEY_A}`)).status, 404);
  // the health routes stay open (load balancers and probes carry no key)
  t.equal((await call(r.url, 'GET', '/healthz', undefined)).status, 200);
  t.equal((await call(r.url, 'GET', '/readyz', undefined)).status, 200);
  const metrics = await call(r.url, 'GET', '/metrics', undefined);
  t.notOk(metrics.body.includes(KEY_A) || metrics.body.includes(sha(KEY_A)), 'neither key nor digest in the metrics');
});

t.test('required: false serves a request without a known key as the anonymous caller', async (t) => {
  const fleet = await startFleet(1, { timeScale: 0 });
  t.teardown(() => fleet.close());
  const r = await router(t, config(fleet.urls, { required: false, keys: [{ digest: sha(KEY_A), tenant: 'a' }] }));
  t.equal((await call(r.url, 'POST', '/v1/chat/completions', chat)).status, 200, 'no key');
  t.equal((await call(r.url, 'POST', '/v1/chat/completions', chat, 'Bearer EMPTY')).status, 200, 'an SDK placeholder key');
  t.equal((await call(r.url, 'POST', '/v1/chat/completions', chat, `Bearer ${KEY_A}`)).status, 200, 'a known key');
});

// One keep-alive connection carrying two tenants' keys (a proxy's shared upstream connection): keys a
// byte apart and keys alternating on one socket must each reach the router as themselves (nothing a
// connection or its previous request carried decides the next request's caller).
t.test('two tenants on one keep-alive connection: each request is its own caller', async (t) => {
  const fleet = await startFleet(1, { timeScale: 0 });
  t.teardown(() => fleet.close());
  const r = await router(t, config(fleet.urls, { keys: [{ digest: sha(KEY_A), tenant: 'a' }, { digest: sha(KEY_B), tenant: 'b' }] }, { responses: { enabled: true } }));
  const one = new Client(r.url, { pipelining: 1 });
  t.teardown(() => one.close());
  const req = async (method: 'GET' | 'POST', path: string, key: string, body?: unknown) => {
    const res = await one.request({ method, path, headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: body === undefined ? undefined : JSON.stringify(body) });
    const text = await res.body.text();
    return { status: res.statusCode, text };
  };
  const made = await req('POST', '/v1/responses', KEY_A, { model: 'open-model', input: 'hi', max_output_tokens: 4 });
  t.equal(made.status, 200);
  const id = JSON.parse(made.text).id as string;
  const nearA = KEY_A.slice(0, -1) + (KEY_A.endsWith('9') ? '8' : '9');
  const seq: [string, number][] = [];
  for (let i = 0; i < 6; i++) seq.push([KEY_A, 200], [KEY_A, 200], [nearA, 401], [KEY_A, 200], [KEY_B, 404], [nearA, 401], [KEY_B, 404], [KEY_A, 200]);
  const got: [string, number][] = [];
  for (const [key] of seq) got.push([key, (await req('GET', `/v1/responses/${id}`, key)).status]);
  t.same(got, seq, "the owner reads it, the other tenant gets 404, a key a byte off 401, in any order on one connection");
});

t.test('keys from a file and an environment variable, beside inline ones', async (t) => {
  const fleet = await startFleet(1, { timeScale: 0 });
  t.teardown(() => fleet.close());
  const dir = await mkdtemp(join(tmpdir(), 'swy-auth-'));
  const file = join(dir, 'keys.txt');
  await writeFile(file, `# tenant keys\n\n${sha(KEY_F)} f   # a comment\n`);
  process.env.SWY_TEST_KEYS = `${sha(KEY_E)} e;${sha(KEY_B)} b`;
  t.teardown(() => delete process.env.SWY_TEST_KEYS);
  const r = await router(t, config(fleet.urls, { keys: [{ digest: sha(KEY_A).toUpperCase(), tenant: 'a' }], keysFile: file, keysEnv: 'SWY_TEST_KEYS' }));
  for (const k of [KEY_A, KEY_F, KEY_E, KEY_B]) t.equal((await call(r.url, 'POST', '/v1/chat/completions', chat, `Bearer ${k}`)).status, 200, `key ${k.slice(0, 8)}`);
  t.equal((await call(r.url, 'POST', '/v1/chat/completions', chat, 'Bearer sk-other')).status, 401);
});

t.test('bad key sources are config errors naming the place (line numbers; both lines of a duplicate)', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'swy-auth-'));
  const urls = ['http://127.0.0.1:1'];
  const start = async (auth: unknown, extra: Record<string, unknown> = {}): Promise<ConfigError> => {
    try {
      const r = await startRouter(validateConfig(config(urls, auth, extra), validatePlugin), { port: 0, host: '127.0.0.1', waitForFirstScrape: false });
      await r.close(0);
    } catch (err) {
      if (err instanceof ConfigError) return err;
      throw err;
    }
    throw new Error('started');
  };
  const file = join(dir, 'keys.txt');
  await writeFile(file, `${sha('k1')} a\n${sha('k2')}\nnot-a-digest b\n${sha('k3')} c colour=red\n${sha('k4')} d models=\n${sha('k1')} again\n`);
  const e = await start({ keysFile: file });
  const paths = e.issues.map((i) => `${i.path}: ${i.message}`);
  t.match(paths, [/^auth\.keysFile line 2: the tenant is missing/, /^auth\.keysFile line 3: the first field must be the SHA-256/, /^auth\.keysFile line 4: unknown or repeated option "colour=red"/, /^auth\.keysFile line 5: unknown or repeated option "models="/, /^auth\.keysFile line 6: duplicate digest .*the same key as auth\.keysFile line 1/]);
  t.equal(e.issues.length, 5);
  t.notOk(e.message.includes(sha('k1')), 'a digest is named by its first digits only');
  // across sources
  await writeFile(file, `${sha('k1')} a maxBand=gold\n`);
  const dup = await start({ keys: [{ digest: sha('k1'), tenant: 'x' }], keysFile: file });
  t.match(dup.issues, [{ path: 'auth.keysFile line 1', message: /the same key as auth\.keys\[0\]/ }, { path: 'auth.keysFile line 1', message: /maxBand "gold" is not a band/ }]);
  const missing = await start({ keysFile: join(dir, 'nope.txt'), keysEnv: 'SWY_TEST_NO_SUCH_VAR' });
  t.match(missing.issues, [{ path: 'auth.keysFile', message: /cannot read .*ENOENT/ }, { path: 'auth.keysEnv', message: /SWY_TEST_NO_SUCH_VAR is not set/ }]);
  // schema errors, with field paths
  const schema = (auth: unknown, extra: Record<string, unknown> = {}) => {
    try {
      validateConfig(config(urls, auth, extra), validatePlugin);
    } catch (err) {
      return (err as ConfigError).issues;
    }
    return [];
  };
  t.match(schema({ keys: [{ digest: 'abc', tenant: 'a b' }], required: 'yes' }), [
    { path: 'auth.required', message: 'must be true or false' },
    { path: 'auth.keys[0].digest', message: /64 hex digits/ },
    { path: 'auth.keys[0].tenant', message: /tenant id/ },
  ]);
  t.match(schema({}), [{ path: 'auth.keys', message: /keys, keysFile or keysEnv/ }]);
  t.match(schema({ keys: [{ digest: sha('k1'), tenant: 'a' }, { digest: sha('k1').toUpperCase(), tenant: 'b' }] }), [{ path: 'auth.keys[1].digest', message: /the same key as auth\.keys\[0\]/ }]);
  t.match(schema({ keys: [{ digest: sha('k1'), tenant: 'a' }] }, { flowControl: { tenants: { 'sk-plain': 'a' }, trustHeaders: true } }), [
    { path: 'flowControl.tenants', message: /plain-text keys/ },
    { path: 'flowControl.trustHeaders', message: /auth\.trustHeaders/ },
  ]);
});

t.test('a reload drops a removed key at once; its request in flight finishes', async (t) => {
  // a slow engine: 10 ms a token at time scale 1
  const fleet = await startFleet(1, { timeScale: 1 });
  t.teardown(() => fleet.close());
  const dir = await mkdtemp(join(tmpdir(), 'swy-auth-'));
  const keys = join(dir, 'keys.txt');
  const cfgFile = join(dir, 'router.yaml');
  await writeFile(keys, `${sha(KEY_A)} a\n${sha(KEY_B)} b\n`);
  const cfg = config(fleet.urls, { keysFile: keys });
  await writeFile(cfgFile, JSON.stringify(cfg));
  const r = await router(t, cfg, { configFile: cfgFile });
  const slow = send(r.url, 'POST', '/v1/chat/completions', { ...chat, max_tokens: 60, stream: true }, { authorization: `Bearer ${KEY_A}` });
  await slow.first; // under way
  await writeFile(keys, `${sha(KEY_B)} b\n`);
  const rr = await r.reload!();
  t.ok(rr.ok, 'reloaded');
  const after = await call(r.url, 'POST', '/v1/chat/completions', chat, `Bearer ${KEY_A}`);
  t.equal(after.status, 401, 'the removed key is refused at once');
  t.equal((await call(r.url, 'POST', '/v1/chat/completions', chat, `Bearer ${KEY_B}`)).status, 200, 'the kept key still works');
  const done = await slow.done;
  t.equal(done.status, 200);
  t.notOk(done.error, 'the request in flight finished');
  t.match(done.body, /data: \[DONE\]/, 'its stream ended whole');
  // a bad keys file on reload is refused: the running keys keep serving
  await writeFile(keys, 'garbage\n');
  const bad = await r.reload!();
  t.notOk(bad.ok, 'a malformed keys file is refused');
  if (!bad.ok) t.match(bad.issues, [{ path: 'auth.keysFile line 1' }]);
  t.equal((await call(r.url, 'POST', '/v1/chat/completions', chat, `Bearer ${KEY_B}`)).status, 200, 'the previous keys still serve');
});

t.test('switchyard check reports bad auth config with field paths and line numbers (exit 2)', async (t) => {
  const { spawnSync } = await import('node:child_process');
  const { fileURLToPath } = await import('node:url');
  const bin = fileURLToPath(new URL('../../bin/switchyard.js', import.meta.url));
  const dir = await mkdtemp(join(tmpdir(), 'swy-auth-'));
  const keys = join(dir, 'keys.txt');
  await writeFile(keys, `${sha('k1')} a\n${sha('k1')} b\n`);
  const file = join(dir, 'router.yaml');
  const pools = [{ name: 'p', models: ['m'], upstreamAuth: 'SWY_TEST_UNSET_ENGINE_KEY', endpoints: [{ name: 'e0', url: 'http://127.0.0.1:1' }] }];
  await writeFile(file, JSON.stringify({ ...config([], { keysFile: keys }), pools }));
  const env = { ...process.env };
  delete env.SWY_TEST_UNSET_ENGINE_KEY;
  const r = spawnSync(process.execPath, [bin, 'check', '-q', '--config', file], { encoding: 'utf8', timeout: 60_000, env });
  t.equal(r.status, 2, 'invalid');
  t.match(r.stderr, /^pools\[0\]\.upstreamAuth: the environment variable SWY_TEST_UNSET_ENGINE_KEY is not set/m);
  t.match(r.stderr, /^auth\.keysFile line 2: duplicate digest [0-9a-f]{8}…: the same key as auth\.keysFile line 1$/m);
  await writeFile(keys, `${sha('k1')} a\n`);
  const ok = spawnSync(process.execPath, [bin, 'check', '-q', '--config', file], { encoding: 'utf8', timeout: 60_000, env: { ...env, SWY_TEST_UNSET_ENGINE_KEY: 'engine-key' } });
  t.equal(ok.status, 0, `valid once fixed: ${ok.stderr}`);
});
