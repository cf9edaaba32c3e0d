// Rate limits and token quotas over real sockets (docs/security.md, "Rate
// limits"): a router with `auth` keys and a `rateLimits` block in front of
// `switchyard sim` engines, on both front ends. OpenAI's x-ratelimit-* headers
// on every answer (whole, streamed, refused), 429 rate_limit_exceeded with
// Retry-After and OpenAI's body (type requests / tokens), the token count
// corrected by the engine's usage, the UTC-day budget, per-tenant limits
// shared by a tenant's keys, a reload changing and removing keys.
import t from 'tap';
import { createHash } from 'node:crypto';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startFleet } from '../../src/sim/index.js';
import { validateConfig, API_VERSION, type RouterConfig } from '../../src/config/schema.js';
import { startRouter } from '../../src/server/router.js';
import { ConfigError } from '../../src/errors.js';
import { parseConfig } from '../../src/config/load.js';
import { validatePlugin } from '../support/router-util.js';
import { send } from '../support/sim-util.js';

const sha = (k: string) => createHash('sha256').update(k).digest('hex');
const KEY_A = 'sk-limits-alpha-0001';
const KEY_B = 'sk-limits-bravo-0001';
const KEY_C = 'sk-limits-charlie-001';
const chat = { model: 'open-model', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 };

function config(urls: string[], extra: Record<string, unknown>): Record<string, unknown> {
  return {
    apiVersion: API_VERSION,
    kind: 'Router',
    pools: [{ name: 'p', models: ['open-model'], endpoints: urls.map((url, i) => ({ name: `e${i}`, url })) }],
    logging: { level: 'silent' },
    ...extra,
  };
}

async function router(t: Tap.Test, cfg: Record<string, unknown>, opts: { configFile?: string } = {}) {
  const r = await startRouter(validateConfig(cfg, validatePlugin) as RouterConfig, { port: 0, host: '127.0.0.1', ...opts, validatePlugin });
  t.teardown(() => r.close(200));
  return r;
}

const post = (base: string, key: string, body: unknown = chat) => send(base, 'POST', '/v1/chat/completions', body, { authorization: `Bearer ${key}` }).done;
const num = (h: Record<string, unknown>, name: string) => Number(h[name]);

for (const frontEnd of ['uws', 'native'] as const) {
  t.test(`${frontEnd}: x-ratelimit-* on every answer; 429 requests with Retry-After and OpenAI's body`, async (t) => {
    const fleet = await startFleet(1, { timeScale: 0 });
    t.teardown(() => fleet.close());
    const r = await router(
      t,
      config(fleet.urls, {
        server: { frontEnd },
        auth: { keys: [{ digest: sha(KEY_A), tenant: 'a', requestsPerMinute: 3, tokensPerMinute: 1000 }, { digest: sha(KEY_B), tenant: 'b' }] },
      }),
    );
    const first = await post(r.url, KEY_A);
    t.equal(first.status, 200);
    t.equal(first.headers['x-ratelimit-limit-requests'], '3');
    t.equal(first.headers['x-ratelimit-remaining-requests'], '2', 'one of three used');
    t.match(first.headers['x-ratelimit-reset-requests'], /^(1[0-9]|20)(\.\d+)?s$/, 'one request refills in 20 s');
    t.equal(first.headers['x-ratelimit-limit-tokens'], '1000');
    t.ok(num(first.headers, 'x-ratelimit-remaining-tokens') < 1000 && num(first.headers, 'x-ratelimit-remaining-tokens') > 980, 'the prompt estimate is charged');
    t.match(first.headers['x-ratelimit-reset-tokens'], /^\d+(\.\d+)?m?s$/);
    // a streamed answer carries them in its head too
    const streamed = await post(r.url, KEY_A, { ...chat, stream: true });
    t.equal(streamed.status, 200);
    t.match(streamed.body, /data: \[DONE\]/);
    t.equal(streamed.headers['x-ratelimit-remaining-requests'], '1', 'streamed: two used');
    t.equal((await post(r.url, KEY_A)).headers['x-ratelimit-remaining-requests'], '0');
    const refused = await post(r.url, KEY_A);
    t.equal(refused.status, 429, 'the fourth request in a minute is refused');
    t.same(JSON.parse(refused.body).error.type, 'requests');
    t.same(JSON.parse(refused.body).error.code, 'rate_limit_exceeded');
    t.same(JSON.parse(refused.body).error.param, null);
    t.match(JSON.parse(refused.body).error.message, /^Rate limit reached for key [0-9a-f]{16} on requests per min \(RPM\): Limit 3, Used 3, Requested 1\. Please try again in \d+(\.\d+)?s\.$/);
    const ra = Number(refused.headers['retry-after']);
    t.ok(ra >= 19 && ra <= 20, `Retry-After is when one request refilled (${ra})`);
    t.equal(refused.headers['x-ratelimit-remaining-requests'], '0', 'the refusal carries the headers');
    t.equal(refused.headers['x-switchyard-dropped-reason'], 'rate-limited-requests');
    // another key (no limits of its own, no tenant limits) is not limited and gets no headers
    const other = await post(r.url, KEY_B);
    t.equal(other.status, 200);
    t.equal(other.headers['x-ratelimit-limit-requests'], undefined, 'no limits, no headers');
    const m = await send(r.url, 'GET', '/metrics').done;
    t.match(m.body, /switchyard_rate_limited_total\{limit="requests"\} 1/);
  });
}

t.test('tokens: the estimate at admission is corrected by the usage when the answer ends; 429 tokens', async (t) => {
  const fleet = await startFleet(1, { timeScale: 0 });
  t.teardown(() => fleet.close());
  const r = await router(t, config(fleet.urls, { auth: { keys: [{ digest: sha(KEY_A), tenant: 'a', tokensPerMinute: 1000 }] } }));
  const t0 = Date.now();
  const one = await post(r.url, KEY_A, { ...chat, max_tokens: 300, ignore_eos: true });
  t.equal(one.status, 200);
  const usage = JSON.parse(one.body).usage;
  t.ok(usage.completion_tokens > 100, `the answer used tokens (${usage.completion_tokens})`);
  const left1 = num(one.headers, 'x-ratelimit-remaining-tokens');
  t.ok(left1 > 980, `at admission only the prompt's estimate is charged (${left1} left)`);
  const two = await post(r.url, KEY_A);
  const refilled = ((Date.now() - t0) * 1000) / 60_000; // 1000 a minute refill meanwhile (a loaded machine is slow)
  const left2 = num(two.headers, 'x-ratelimit-remaining-tokens');
  const spent = usage.prompt_tokens + usage.completion_tokens;
  // the first answer's real count replaced its estimate
  t.ok(left2 <= 1000 - spent + refilled + 1 && left2 >= 1000 - spent - 30, `corrected by the usage: ${left2} left after ${spent} used`);
  // streamed with include_usage: the usage chunk corrects it as well
  const three = await post(r.url, KEY_A, { ...chat, max_tokens: 300, ignore_eos: true, stream: true, stream_options: { include_usage: true } });
  t.equal(three.status, 200);
  const four = await post(r.url, KEY_A);
  t.ok(num(four.headers, 'x-ratelimit-remaining-tokens') < left2 - 250, 'the streamed answer was charged its usage');
  // the minute's budget is spent: the next big answer's debt refuses what follows
  await post(r.url, KEY_A, { ...chat, max_tokens: 600, ignore_eos: true });
  const refused = await post(r.url, KEY_A);
  t.equal(refused.status, 429);
  const e = JSON.parse(refused.body).error;
  t.equal(e.type, 'tokens', 'a token limit: type tokens');
  t.equal(e.code, 'rate_limit_exceeded');
  t.match(e.message, /on tokens per min \(TPM\): Limit 1000/);
  t.ok(Number(refused.headers['retry-after']) >= 1, 'Retry-After');
  t.equal(refused.headers['x-ratelimit-remaining-tokens'], '0');
  // a request that can never fit: 429 without Retry-After (OpenAI's "Request too large")
  const huge = await post(r.url, KEY_A, { ...chat, messages: [{ role: 'user', content: 'x'.repeat(8000) }] });
  t.equal(huge.status, 429);
  t.match(JSON.parse(huge.body).error.message, /^Request too large for key [0-9a-f]{16} on tokens per min \(TPM\): Limit 1000, Requested \d+/);
  t.equal(huge.headers['retry-after'], undefined, 'never fits: no Retry-After');
});

t.test('tokens per UTC day, per tenant: shared by the keys of the tenant; Retry-After is the next UTC midnight', async (t) => {
  const fleet = await startFleet(1, { timeScale: 0 });
  t.teardown(() => fleet.close());
  const r = await router(
    t,
    config(fleet.urls, {
      auth: { keys: [{ digest: sha(KEY_A), tenant: 'a' }, { digest: sha(KEY_B), tenant: 'a' }, { digest: sha(KEY_C), tenant: 'c' }] },
      rateLimits: { tenants: { a: { tokensPerDay: 60 } } },
    }),
  );
  let status = 200;
  let n = 0;
  let last = await post(r.url, KEY_A);
  t.equal(last.headers['x-ratelimit-limit-tokens'], '60', 'the day budget is the token limit reported');
  t.match(last.headers['x-ratelimit-reset-tokens'], /^(\d+h)?(\d+m)?\d+(\.\d+)?s$/, 'reset: the time to the next UTC midnight');
  while (status === 200 && n < 20) {
    last = await post(r.url, n % 2 === 0 ? KEY_B : KEY_A);
    status = last.status;
    n++;
  }
  t.equal(status, 429, `the tenant's two keys spent its day (${n + 1} requests)`);
  t.ok(n >= 3, 'after a few answers (each about ten tokens)');
  const e = JSON.parse(last.body).error;
  t.equal(e.type, 'tokens');
  t.match(e.message, /Rate limit reached for tenant a on tokens per day \(TPD\): Limit 60/);
  const toMidnight = Math.ceil((Math.floor(Date.now() / 86_400_000 + 1) * 86_400_000 - Date.now()) / 1000);
  t.ok(Math.abs(Number(last.headers['retry-after']) - toMidnight) <= 2, 'Retry-After: the next UTC midnight');
  t.equal((await post(r.url, KEY_C)).status, 200, 'another tenant is not limited');
});

t.test('defaultTenant and anonymous limits without auth (flowControl tenants); key options from a keys file; a reload changes limits and removes a key', async (t) => {
  const fleet = await startFleet(1, { timeScale: 0 });
  t.teardown(() => fleet.close());
  const dir = await mkdtemp(join(tmpdir(), 'swy-limits-'));
  const keys = join(dir, 'keys.txt');
  const cfgFile = join(dir, 'router.yaml');
  await writeFile(keys, `${sha(KEY_A)} a rpm=2\n${sha(KEY_B)} b rpm=5 tpm=5000 tpd=100000\n`);
  const cfg = config(fleet.urls, { auth: { keysFile: keys, required: false }, rateLimits: { anonymous: { requestsPerMinute: 1 }, defaultTenant: { requestsPerMinute: 100 } } });
  await writeFile(cfgFile, JSON.stringify(cfg));
  const r = await router(t, cfg, { configFile: cfgFile });
  const a = await post(r.url, KEY_A);
  t.equal(a.headers['x-ratelimit-limit-requests'], '2', "the key's own limit (tighter than its tenant's default)");
  t.equal(a.headers['x-ratelimit-remaining-requests'], '1');
  const b = await post(r.url, KEY_B);
  t.equal(b.headers['x-ratelimit-limit-requests'], '5');
  t.equal(b.headers['x-ratelimit-limit-tokens'], '5000', 'of the minute and the day, the tighter one is reported');
  const anon = await send(r.url, 'POST', '/v1/chat/completions', chat).done;
  t.equal(anon.status, 200);
  t.equal(anon.headers['x-ratelimit-limit-requests'], '1', 'the anonymous scope');
  t.equal((await send(r.url, 'POST', '/v1/chat/completions', chat).done).status, 429, 'the anonymous scope is limited as a whole');
  // reload: key a removed (refused at once), key b's limit changed, what b used stays counted
  await writeFile(keys, `${sha(KEY_B)} b rpm=3\n`);
  const rr = await r.reload!();
  t.ok(rr.ok, 'reloaded');
  const removed = await post(r.url, KEY_A);
  t.equal(removed.headers['x-ratelimit-limit-requests'], '1', 'a removed key is served as the anonymous scope (required: false)...');
  t.equal(removed.status, 429, '...whose one request a minute is spent');
  const b2 = await post(r.url, KEY_B);
  t.equal(b2.headers['x-ratelimit-limit-requests'], '3', 'the new limit applies from the next request');
  t.equal(b2.headers['x-ratelimit-remaining-requests'], '1', 'what the key used before the reload stays counted');
  t.equal(b2.headers['x-ratelimit-limit-tokens'], undefined, 'its token limits are gone');
});

t.test('with auth required, a key removed on reload is refused at once (its cached caller is dropped)', async (t) => {
  const fleet = await startFleet(1, { timeScale: 0 });
  t.teardown(() => fleet.close());
  const dir = await mkdtemp(join(tmpdir(), 'swy-limits-'));
  const keys = join(dir, 'keys.txt');
  const cfgFile = join(dir, 'router.yaml');
  await writeFile(keys, `${sha(KEY_A)} a rpm=100\n${sha(KEY_B)} b rpm=100\n`);
  const cfg = config(fleet.urls, { auth: { keysFile: keys }, rateLimits: {} });
  await writeFile(cfgFile, JSON.stringify(cfg));
  const r = await router(t, cfg, { configFile: cfgFile });
  for (let i = 0; i < 3; i++) t.equal((await post(r.url, KEY_A)).headers['x-ratelimit-remaining-requests'], String(99 - i));
  await writeFile(keys, `${sha(KEY_B)} b rpm=100\n`);
  t.ok((await r.reload!()).ok);
  const gone = await post(r.url, KEY_A);
  t.equal(gone.status, 401, 'the removed key is refused');
  t.equal(gone.headers['x-ratelimit-limit-requests'], undefined);
  t.equal((await post(r.url, KEY_B)).status, 200);
});

t.test('bad rateLimits config and key options are config errors naming the field or the line', async (t) => {
  const urls = ['http://127.0.0.1:1'];
  const issues = (extra: Record<string, unknown>) => {
    try {
      validateConfig(config(urls, extra), validatePlugin);
    } catch (err) {
      if (err instanceof ConfigError) return err.issues.map((i) => `${i.path}: ${i.message}`);
      throw err;
    }
    return [];
  };
  t.match(issues({ rateLimits: { tenants: { a: { requestsPerMinute: 0 } } } }), [/^rateLimits\.tenants\.a\.requestsPerMinute: must be an integer in \[1,/]);
  t.match(issues({ rateLimits: { tenants: { 'bad tenant': { requestsPerMinute: 1 } } } }), [/^rateLimits\.tenants\.bad tenant: the key must be a tenant id/]);
  t.match(issues({ rateLimits: { defaultTenant: { rpm: 3 } } }), [/^rateLimits\.defaultTenant\.rpm: unknown field/]);
  t.match(issues({ rateLimits: { redis: { url: 'http://x' } } }), [/^rateLimits\.redis\.url: must be a redis:\/\/ or rediss:\/\/ URL/]);
  t.match(issues({ rateLimits: { redis: { url: 'redis://x', failMode: 'maybe' } } }), [/^rateLimits\.redis\.failMode: must be one of: open, closed/]);
  t.match(issues({ auth: { keys: [{ digest: sha('x'), tenant: 'a', tokensPerDay: -1 }] } }), [/^auth\.keys\[0\]\.tokensPerDay: must be an integer/]);
  const dir = await mkdtemp(join(tmpdir(), 'swy-limits-'));
  const keys = join(dir, 'keys.txt');
  await writeFile(keys, `${sha('k1')} a rpm=ten\n${sha('k2')} b tpm=0\n${sha('k3')} c rpm=1 rpm=2\n`);
  try {
    const r = await startRouter(validateConfig(config(urls, { auth: { keysFile: keys } }), validatePlugin), { port: 0, host: '127.0.0.1', waitForFirstScrape: false });
    await r.close(0);
    t.fail('started');
  } catch (err) {
    t.ok(err instanceof ConfigError);
    t.match((err as ConfigError).issues, [
      { path: 'auth.keysFile line 1', message: /rpm= must be a whole number/ },
      { path: 'auth.keysFile line 2', message: /tpm= must be a whole number/ },
      { path: 'auth.keysFile line 3', message: /unknown or repeated option "rpm=2"/ },
    ]);
  }
});

t.test('a tenant with two budgets is a config error naming both lines (the file check and serve read)', async (t) => {
  const issues = (yaml: string) => {
    try {
      parseConfig(yaml, validatePlugin, 'router.yaml');
    } catch (err) {
      if (err instanceof ConfigError) return err.issues.map((i) => `${i.path}: ${i.message}`);
      throw err;
    }
    return [];
  };
  const head = 'apiVersion: switchyard/v1\nkind: Router\npools:\n  - { name: p, models: [m], endpoints: [{ url: "http://127.0.0.1:1" }] }\n';
  t.same(
    issues(`${head}rateLimits:\n  tenants:\n    acme: { requestsPerMinute: 10 }\n    team-b: { tokensPerDay: 5 }\n    acme: { requestsPerMinute: 1000 }\n`),
    ['rateLimits.tenants.acme: tenant "acme" has two budgets: line 7 and line 9 (give each tenant one entry)'],
  );
  // JSON is read by the same parser: the same answer, with its lines
  t.same(
    issues(JSON.stringify({ apiVersion: API_VERSION, kind: 'Router', pools: [{ name: 'p', models: ['m'], endpoints: [{ url: 'http://127.0.0.1:1' }] }] }).slice(0, -1) + ',\n"rateLimits": {"tenants": {\n"team-b": {"tokensPerDay": 5},\n"team-b": {"tokensPerDay": 50}}}}'),
    ['rateLimits.tenants.team-b: tenant "team-b" has two budgets: line 3 and line 4 (give each tenant one entry)'],
  );
  t.same(
    issues(`${head}batch:\n  redis: redis://127.0.0.1:1\n  quotas:\n    tenants:\n      acme: { requests: 5 }\n      acme: { requests: 6 }\n`),
    ['batch.quotas.tenants.acme: tenant "acme" has two budgets: line 9 and line 10 (give each tenant one entry)'],
  );
  // any other key given twice names its field and both lines too
  t.same(issues(`${head}logging:\n  level: info\n  level: debug\n`), ['logging.level: "level" is given twice in this mapping: line 6 and line 7 (keys must be unique)']);
  t.same(issues(`${head}rateLimits:\n  tenants:\n    acme: { requestsPerMinute: 10 }\n    beta: { requestsPerMinute: 10 }\n`), [], 'distinct tenants are fine');
});

t.test('rateLimits.maxSubjects bounds the counters: past it new tenants share the (overflow) counter; a reload raises it', async (t) => {
  const fleet = await startFleet(1, { timeScale: 0 });
  t.teardown(() => fleet.close());
  const dir = await mkdtemp(join(tmpdir(), 'swy-limits-'));
  const cfgFile = join(dir, 'router.json');
  const k = ['sk-subjects-0001', 'sk-subjects-0002', 'sk-subjects-0003', 'sk-subjects-0004', 'sk-subjects-0005'];
  const cfg = (maxSubjects: number) =>
    config(fleet.urls, {
      auth: { keys: k.map((key, i) => ({ digest: sha(key), tenant: `t${i}` })) },
      rateLimits: { maxSubjects, defaultTenant: { requestsPerMinute: 2 } },
    });
  await writeFile(cfgFile, JSON.stringify(cfg(2)));
  const r = await router(t, cfg(2), { configFile: cfgFile });
  // t0 and t1 take the two subjects (each has used a request: not idle, never dropped)
  t.equal((await post(r.url, k[0]!)).headers['x-ratelimit-remaining-requests'], '1');
  t.equal((await post(r.url, k[1]!)).headers['x-ratelimit-remaining-requests'], '1');
  // t2 and t3 share the (overflow) counter: two requests between them
  t.equal((await post(r.url, k[2]!)).headers['x-ratelimit-remaining-requests'], '1', 't2: the overflow counter');
  const t3 = await post(r.url, k[3]!);
  t.equal(t3.headers['x-ratelimit-remaining-requests'], '0', 't3 shares it');
  t.equal((await post(r.url, k[3]!)).status, 429, "t3's second request: the shared counter is spent");
  t.equal((await post(r.url, k[0]!)).status, 200, 't0 keeps its own counter');
  const m = await send(r.url, 'GET', '/metrics').done;
  t.match(m.body, /switchyard_rate_limit_subjects_overflowed_total \d+/);
  t.ok(Number(/switchyard_rate_limit_subjects_overflowed_total (\d+)/.exec(m.body)?.[1]) >= 2, 'counted');
  // raised by a reload: the next new tenant gets a counter of its own
  await writeFile(cfgFile, JSON.stringify(cfg(10)));
  t.ok((await r.reload!()).ok);
  const t4 = await post(r.url, k[4]!);
  t.equal(t4.status, 200);
  t.equal(t4.headers['x-ratelimit-remaining-requests'], '1', 't4: its own counter after the reload');
  // config errors name the field
  t.throws(() => validateConfig(config(fleet.urls, { rateLimits: { maxSubjects: 0 } }), validatePlugin), /rateLimits\.maxSubjects: must be an integer in \[1, 10000000\]/);
});
