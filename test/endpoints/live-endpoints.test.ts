// Live endpoints over real sockets: the admin API (auth, list, add, drain,
// remove, 404/409), drains with requests in flight, config reload with a good
// and a bad file, SIGHUP on a real `switchyard serve` process.
import t from 'tap';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startEngine, startFleet } from '../../src/sim/index.js';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { ConfigError } from '../../src/errors.js';
import { startRouter } from '../../src/server/router.js';
import { get, metric, parseProm, post, send, sleep, until } from '../support/sim-util.js';
import { spawnServe, validatePlugin } from '../support/router-util.js';

const TOKEN = 'test-admin-token';

function cfg(urls: string[], extra: Record<string, unknown> = {}) {
  return {
    apiVersion: API_VERSION,
    kind: 'Router',
    pools: [{ name: 'p', models: ['open-model'], endpoints: urls.map((url, i) => ({ name: `e${i}`, url, revision: 'a' })) }],
    logging: { level: 'silent' },
    dataLayer: { healthIntervalMs: 100, scrapeIntervalMs: 50 },
    admin: { token: TOKEN, drainGraceMs: 5000 },
    ...extra,
  };
}

function admin(base: string, method: string, path: string, body?: unknown, token: string | null = TOKEN) {
  return send(base, method, path, body, token === null ? {} : { authorization: `Bearer ${token}` }).done;
}

const chat = (content = 'hello there', extra: Record<string, unknown> = {}) => ({ model: 'open-model', messages: [{ role: 'user', content }], max_tokens: 4, ...extra });

t.test('admin API: token, list, add, remove (404 unknown, 409 last endpoint)', async (t) => {
  const fleet = await startFleet(2, { timeScale: 0 });
  const extra = await startEngine({ timeScale: 0 });
  const router = await startRouter(validateConfig(cfg(fleet.urls), validatePlugin), { port: 0, host: '127.0.0.1', adminPort: 0 });
  t.teardown(async () => {
    await router.close(200);
    await fleet.close();
    await extra.close();
  });
  const a = router.admin!.url;
  t.match(a, /^http:\/\/127\.0\.0\.1:\d+$/, 'loopback by default');

  const noToken = await admin(a, 'GET', '/admin/endpoints', undefined, null);
  t.equal(noToken.status, 401, 'no token: 401');
  t.equal(noToken.headers['www-authenticate'], 'Bearer');
  t.match(JSON.parse(noToken.body), { error: { code: 'invalid_api_key', type: 'invalid_request_error' } });
  t.equal((await admin(a, 'GET', '/admin/endpoints', undefined, 'wrong')).status, 401, 'wrong token: 401');

  const list = JSON.parse((await admin(a, 'GET', '/admin/endpoints')).body);
  t.equal(list.endpoints.length, 2);
  t.match(list.endpoints[0], { name: 'e0', pool: 'p', role: 'both', revision: 'a', state: 'active', health: 'up', ready: true, inFlight: 0 });
  t.match(list.revisions, [{ pool: 'p', revision: 'a', servesAggregated: true, servesDisaggregated: false }]);

  // add: validated like a config endpoint
  const bad = await admin(a, 'POST', '/admin/endpoints', { pool: 'p', name: 'x', url: 'ftp://nope' });
  t.equal(bad.status, 400);
  t.match(JSON.parse(bad.body).error.message, /url: must be an http\(s\) URL/);
  t.equal((await admin(a, 'POST', '/admin/endpoints', { pool: 'nope', name: 'x', url: extra.url })).status, 404, 'unknown pool: 404');
  t.equal((await admin(a, 'POST', '/admin/endpoints', { pool: 'p', name: 'e0', url: extra.url })).status, 409, 'name taken: 409');
  const added = await admin(a, 'POST', '/admin/endpoints', { pool: 'p', name: 'e2', url: extra.url, revision: 'b' });
  t.equal(added.status, 201);
  t.match(JSON.parse(added.body).endpoint, { name: 'e2', revision: 'b', origin: 'admin' });
  // the new endpoint takes requests: remove the other two, so every request must reach it
  t.ok(await until(() => router.core.endpoints.byName('e2')!.health === 'up'), 'health-checked at once');

  const unknown = await admin(a, 'DELETE', '/admin/endpoints/nope');
  t.equal(unknown.status, 404, 'removing an unknown endpoint: 404');
  t.match(JSON.parse(unknown.body).error, { code: 'SWY_ERR_ENDPOINT_UNKNOWN' });

  t.equal((await admin(a, 'DELETE', '/admin/endpoints/e0?wait=1')).status, 200);
  t.equal((await admin(a, 'DELETE', '/admin/endpoints/e1?wait=1')).status, 200);
  for (let i = 0; i < 4; i++) {
    const r = await post(router.url, '/v1/chat/completions', chat());
    t.equal(r.status, 200);
    t.equal(r.headers['x-switchyard-endpoint'], 'e2', 'served by the added endpoint');
  }
  const last = await admin(a, 'DELETE', '/admin/endpoints/e2');
  t.equal(last.status, 409, 'the last endpoint of a model needs force');
  t.match(JSON.parse(last.body).error, { code: 'SWY_ERR_ENDPOINT_LAST', message: /needs force/ });
  t.equal((await admin(a, 'DELETE', '/admin/endpoints/e2?force=1&wait=1')).status, 200);
  const none = await post(router.url, '/v1/chat/completions', chat());
  t.equal(none.status, 503, 'a model without endpoints: 503, not 404');
  t.equal(JSON.parse((await admin(a, 'GET', '/admin/endpoints')).body).endpoints.length, 0);

  const m = parseProm((await get(router.url, '/metrics')).body);
  t.equal(metric(m, 'switchyard_endpoint_changes_total', { change: 'added' }), 1);
  t.equal(metric(m, 'switchyard_endpoint_changes_total', { change: 'removed' }), 3);
  t.notOk(m.samples.some((s) => s.name === 'switchyard_endpoint_in_flight' && s.labels.endpoint === 'e0'), 'a removed endpoint leaves the gauges');
  t.notOk(m.samples.some((s) => s.labels.endpoint === 'e2'), "a removed endpoint's request series leave too (#29: bounded series)");
  t.ok(metric(m, 'inference_objective_request_total', { model_name: 'open-model' }) >= 4, 'its requests stay in the per-model total');
});

t.test('admin API input: names bounded to 253 bytes of DNS-label characters, no control characters, a bad %-escape is 400, port 0 refused', async (t) => {
  const fleet = await startFleet(1, { timeScale: 0 });
  const extra = await startEngine({ timeScale: 0 });
  const router = await startRouter(validateConfig(cfg(fleet.urls), validatePlugin), { port: 0, host: '127.0.0.1', adminPort: 0 });
  t.teardown(async () => {
    await router.close(200);
    await fleet.close();
    await extra.close();
  });
  const a = router.admin!.url;
  const refused = async (body: Record<string, unknown>, param: string, message: RegExp, label: string) => {
    const r = await admin(a, 'POST', '/admin/endpoints', { pool: 'p', url: extra.url, ...body });
    t.equal(r.status, 400, `${label}: 400`);
    const err = JSON.parse(r.body).error;
    t.match(err, { type: 'invalid_request_error', param, message }, `${label}: the error names ${param}`);
  };
  await refused({ name: 'n'.repeat(254) }, 'name', /^name: must be at most 253 bytes \(got 254\)/, '254-byte name');
  await refused({ name: 'é'.repeat(127) }, 'name', /^name: must be at most 253 bytes \(got 254\)/, 'name of 127 two-byte characters');
  await refused({ name: 'n'.repeat(60_000) }, 'name', /^name: must be at most 253 bytes/, '60 KB name');
  for (const [label, name] of [['slash', 'a/b'], ['space', 'a b'], ['quote', 'e"x'], ['U+2028', 'a\u2028b'], ['unicode', 'é☃'], ['colon', 'a:b']] as const) {
    await refused({ name }, 'name', /^name: may contain only letters, digits/, `name with ${label}`);
  }
  for (const [label, c] of [['NUL', '\u0000'], ['LF', '\n'], ['DEL', '\u007f'], ['NEL U+0085', '\u0085'], ['U+009F', '\u009f']] as const) {
    await refused({ name: `a${c}b` }, 'name', /^name: must not contain control characters/, `name with ${label}`);
    await refused({ name: 'ok', revision: `r${c}` }, 'revision', /^revision: must not contain control characters/, `revision with ${label}`);
  }
  await refused({ name: 'ok', url: `${extra.url}\n` }, 'url', /^url: must not contain control characters/, 'url with LF');
  await refused({ name: 'zero', url: 'http://127.0.0.1:0' }, 'url', /^url: port 0/, 'port 0');
  await refused({ name: 'zero', url: 'http://127.0.0.1:00' }, 'url', /^url: port 0/, 'port 00');

  const badEscape = await admin(a, 'GET', '/admin/endpoints/%E0%A4%A');
  t.equal(badEscape.status, 400, 'a malformed %-escape in the path: 400, not 500');
  t.match(JSON.parse(badEscape.body).error, { type: 'invalid_request_error', param: 'path', message: /^path: malformed %-escape/ });
  t.equal((await admin(a, 'DELETE', '/admin/endpoints/%zz')).status, 400, 'DELETE with a bad escape: 400');

  // what the tests and docs use stays valid: 253 bytes exactly, letters, digits, '-', '.', '_'
  for (const name of ['gpu-3', 'b-p0', 'e.2_x', 'N'.repeat(253)]) {
    const r = await admin(a, 'POST', '/admin/endpoints', { pool: 'p', name, url: extra.url });
    t.equal(r.status, 201, `"${name.slice(0, 20)}" (${name.length} bytes) is added`);
    t.equal((await admin(a, 'DELETE', `/admin/endpoints/${name}?wait=1&graceMs=0`)).status, 200, 'and removed');
  }
  const dflt = await admin(a, 'POST', '/admin/endpoints', { pool: 'p', url: extra.url });
  t.equal(dflt.status, 201, 'no name: the derived host:port name is still allowed');
  t.equal(JSON.parse(dflt.body).endpoint.name, new URL(extra.url).host);
  t.same((JSON.parse((await admin(a, 'GET', '/admin/endpoints')).body).endpoints as { name: string }[]).map((e) => e.name).sort(), ['e0', new URL(extra.url).host].sort(), 'nothing refused was added');
});

t.test('config: a non-loopback admin listener needs a token; prefill without decode is refused', async (t) => {
  const e = t.throws(() => validateConfig(cfg(['http://127.0.0.1:1'], { admin: { host: '0.0.0.0' } }))) as ConfigError;
  t.ok(e instanceof ConfigError);
  t.match(e.issues, [{ path: 'admin.token', message: /required when admin.host is not a loopback/ }]);
  t.doesNotThrow(() => validateConfig(cfg(['http://127.0.0.1:1'], { admin: { host: '0.0.0.0', tokenEnv: 'X' } })));
  const pd = t.throws(() =>
    validateConfig({
      apiVersion: API_VERSION,
      kind: 'Router',
      pools: [
        {
          name: 'pd',
          models: ['m'],
          endpoints: [
            { name: 'p0', url: 'http://127.0.0.1:1', role: 'prefill', revision: 'a' },
            { name: 'd0', url: 'http://127.0.0.1:2', role: 'decode', revision: 'b' },
          ],
        },
      ],
    }),
  ) as ConfigError;
  t.match(pd.issues, [{ path: 'pools[0].endpoints[0].role', message: /prefill endpoints of revision "a" but no endpoint of role decode/ }]);
});

t.test('drain with requests in flight: they finish, new ones go elsewhere, then the endpoint leaves', async (t) => {
  // slow decode: 40 tokens at 20 ms each = ~800 ms per request
  const fleet = await startFleet(2, { timeScale: 1, itlMs: 20, prefillOverheadMs: 1 });
  const router = await startRouter(validateConfig(cfg(fleet.urls), validatePlugin), { port: 0, host: '127.0.0.1', adminPort: 0 });
  t.teardown(async () => {
    await router.close(200);
    await fleet.close();
  });
  const a = router.admin!.url;
  const e0 = router.core.endpoints.byName('e0')!;
  const prefix = router.core.scheduler.prefix!;
  // long requests until e0 has some in flight
  const inflight: Promise<import('../support/sim-util.js').Resp>[] = [];
  for (let i = 0; i < 6; i++) inflight.push(post(router.url, '/v1/chat/completions', chat(`long prompt ${i} `.repeat(20), { max_tokens: 40, stream: true })));
  t.ok(await until(() => e0.inFlight > 0), 'e0 has requests in flight');
  const before = e0.inFlight;
  const drained = admin(a, 'POST', '/admin/endpoints/e0/drain?wait=1');
  t.ok(await until(() => e0.state === 'draining'), 'draining');
  // new requests all go to e1 while e0 drains
  for (let i = 0; i < 3; i++) {
    const r = await post(router.url, '/v1/chat/completions', chat(`x${i}`, { max_tokens: 1 }));
    t.equal(r.headers['x-switchyard-endpoint'], 'e1', 'a draining endpoint takes no new request');
  }
  const d = await drained;
  t.equal(d.status, 200);
  t.match(JSON.parse(d.body).drained, { endpoint: 'e0', inFlightLeft: 0 });
  for (const r of await Promise.all(inflight)) {
    t.equal(r.status, 200);
    t.ok(r.body.endsWith('data: [DONE]\n\n'), 'every in-flight stream finished');
  }
  t.ok(before > 0);
  // drained, still listed (drain is not remove); removed, the prefix index forgets it
  t.equal(JSON.parse((await admin(a, 'GET', '/admin/endpoints/e0')).body).endpoint.state, 'draining');
  const sched = router.core.scheduler;
  const prompt = new TextEncoder().encode('a shared system prompt '.repeat(20));
  const held = (ep: typeof e0) => {
    const ctx = { request: { model: 'open-model', prompt }, now: 0, promptBlocks: 0, prefixMatched: new Uint32Array(0), matchedBlocks: 0 };
    prefix.produce(ctx, [ep]);
    return ctx.prefixMatched[0] ?? 0;
  };
  // record the prompt on e0 as a pick would (e0 takes no picks now: the index is written directly)
  prefix.produce({ request: { model: 'open-model', prompt }, now: 0, promptBlocks: 0, prefixMatched: new Uint32Array(0), matchedBlocks: 0 }, [e0]);
  prefix.store.recordLast(e0.id);
  t.ok(held(e0) > 0, 'e0 is believed to hold the prompt');
  t.ok(sched.prefix === prefix);
  t.equal((await admin(a, 'DELETE', '/admin/endpoints/e0?wait=1')).status, 200);
  t.equal(held(e0), 0, "a removed endpoint's prefix entries are dropped");
  t.equal(e0.removed, true);
  t.equal(router.core.endpoints.byName('e0'), undefined);
});

t.test('drain grace period: a request outliving it is not cut; the endpoint is removed', async (t) => {
  const fleet = await startFleet(2, { timeScale: 1, itlMs: 20, prefillOverheadMs: 1 });
  const router = await startRouter(validateConfig(cfg(fleet.urls), validatePlugin), { port: 0, host: '127.0.0.1', adminPort: 0 });
  t.teardown(async () => {
    await router.close(200);
    await fleet.close();
  });
  const e0 = router.core.endpoints.byName('e0')!;
  const reqs: Promise<import('../support/sim-util.js').Resp>[] = [];
  for (let i = 0; i < 4; i++) reqs.push(post(router.url, '/v1/chat/completions', chat(`q${i}`, { max_tokens: 30, stream: true })));
  t.ok(await until(() => e0.inFlight > 0));
  const r = await admin(router.admin!.url, 'DELETE', '/admin/endpoints/e0?wait=1&graceMs=50');
  t.equal(r.status, 200);
  const removed = JSON.parse(r.body).removed;
  t.ok(removed.inFlightLeft > 0, 'the grace period ended with requests in flight');
  t.ok(e0.removed);
  for (const x of await Promise.all(reqs)) {
    t.equal(x.status, 200);
    t.ok(x.body.endsWith('data: [DONE]\n\n'), 'not cut');
  }
  const m = parseProm((await get(router.url, '/metrics')).body);
  t.equal(metric(m, 'switchyard_endpoint_changes_total', { change: 'grace_expired' }), 1);
});

t.test('reload: a good file adds, replaces and removes endpoints; a bad one is refused and the old config serves', async (t) => {
  const fleet = await startFleet(3, { timeScale: 0 });
  const dir = await mkdtemp(join(tmpdir(), 'swy-reload-'));
  const file = join(dir, 'router.json');
  const write = (v: unknown) => writeFile(file, typeof v === 'string' ? v : JSON.stringify(v));
  await write(cfg(fleet.urls.slice(0, 2)));
  const { loadConfigFile } = await import('../../src/config/load.js');
  const router = await startRouter(await loadConfigFile(file, validatePlugin), { port: 0, host: '127.0.0.1', adminPort: 0, configFile: file, validatePlugin });
  t.teardown(async () => {
    await router.close(200);
    await fleet.close();
  });
  // e1 moves to revision b, e0 goes, e2 comes
  const next = cfg(fleet.urls);
  next.pools[0]!.endpoints = [
    { name: 'e1', url: fleet.urls[1]!, revision: 'b' },
    { name: 'e2', url: fleet.urls[2]!, revision: 'b' },
  ];
  await write(next);
  const ok = await router.reload!();
  t.match(ok, { ok: true, changes: { added: ['e2'], removed: ['e0'], replaced: ['e1'] }, restartNeeded: [] });
  t.ok(await until(() => router.core.endpoints.all.length === 2 && router.core.endpoints.all.every((e) => e.health === 'up')), 'the drained ones left; the new ones are up');
  t.same(
    router.core.endpoints.all.map((e) => `${e.name}@${e.revision}`).sort(),
    ['e1@b', 'e2@b'],
  );
  const served = new Set<string>();
  for (let i = 0; i < 8; i++) served.add((await post(router.url, '/v1/chat/completions', chat(`r${i}`))).headers['x-switchyard-endpoint'] as string);
  t.notOk(served.has('e0'));

  // a bad file: field paths in the result, a metric, nothing changes
  const broken = cfg(fleet.urls);
  (broken.pools[0]!.endpoints[0] as Record<string, unknown>).url = 'not a url';
  (broken as Record<string, unknown>).dataLayer = { scrapeIntervalMs: -1 };
  await write(broken);
  const bad = await router.reload!();
  t.equal(bad.ok, false);
  if (!bad.ok) {
    t.match(bad.issues.map((i) => i.path).sort(), ['dataLayer.scrapeIntervalMs', 'pools[0].endpoints[0].url']);
  }
  // through the admin API too
  const viaAdmin = await admin(router.admin!.url, 'POST', '/admin/reload');
  t.equal(viaAdmin.status, 422);
  await write('{ not json or yaml: [');
  t.equal((await router.reload!()).ok, false, 'a syntax error is refused too');
  t.same(router.core.endpoints.all.map((e) => e.name).sort(), ['e1', 'e2'], 'the old endpoints keep serving');
  t.equal((await post(router.url, '/v1/chat/completions', chat())).status, 200);
  const m = parseProm((await get(router.url, '/metrics')).body);
  t.equal(metric(m, 'switchyard_config_reloads_total', { result: 'invalid' }), 3);
  t.equal(metric(m, 'switchyard_config_reloads_total', { result: 'ok' }), 1);
});

t.test('reload: a changed logging.level applies (the per-request debug line appears after info -> debug)', async (t) => {
  const fleet = await startFleet(1, { timeScale: 0 });
  const dir = await mkdtemp(join(tmpdir(), 'swy-reload-level-'));
  const file = join(dir, 'router.json');
  await writeFile(file, JSON.stringify(cfg(fleet.urls, { logging: { level: 'info' } })));
  const { loadConfigFile } = await import('../../src/config/load.js');
  const { default: pino } = await import('pino');
  const lines: { level: number; msg: string }[] = [];
  const logger = pino({ level: 'info' }, { write: (s: string) => void lines.push(JSON.parse(s)) });
  const router = await startRouter(await loadConfigFile(file, validatePlugin), { port: 0, host: '127.0.0.1', configFile: file, validatePlugin, logger });
  t.teardown(async () => {
    await router.close(200);
    await fleet.close();
  });
  const requestLines = () => lines.filter((l) => l.msg === 'request').length;
  t.equal((await post(router.url, '/v1/chat/completions', chat())).status, 200);
  t.equal(requestLines(), 0, 'at info: no per-request line');

  await writeFile(file, JSON.stringify(cfg(fleet.urls, { logging: { level: 'debug' } })));
  t.match(await router.reload!(), { ok: true, restartNeeded: [] });
  t.equal(router.core.log.level, 'debug');
  t.equal((await post(router.url, '/v1/chat/completions', chat())).status, 200);
  t.ok(await until(() => requestLines() === 1, 2000), 'at debug after the reload: the per-request line is logged');

  await writeFile(file, JSON.stringify(cfg(fleet.urls, { logging: { level: 'warn' } })));
  t.match(await router.reload!(), { ok: true });
  t.equal((await post(router.url, '/v1/chat/completions', chat())).status, 200);
  await sleep(50);
  t.equal(requestLines(), 1, 'back above debug: no more per-request lines');
});

t.test('SIGHUP reloads a running `switchyard serve`', async (t) => {
  const fleet = await startFleet(2, { timeScale: 0 });
  t.teardown(() => fleet.close());
  const dir = await mkdtemp(join(tmpdir(), 'swy-hup-'));
  const file = join(dir, 'router.yaml');
  const base = { ...cfg(fleet.urls.slice(0, 1)), listen: { port: 0 }, logging: { level: 'info' }, admin: { port: 0, token: TOKEN } };
  await writeFile(file, JSON.stringify(base));
  const p = await spawnServe(t, ['--config', file]);
  const adminUrl = await (async () => {
    await until(() => /admin API listening on (http:\/\/[0-9.:]+)/.test(p.out()), 5000);
    return /admin API listening on (http:\/\/[0-9.:]+)/.exec(p.out())![1]!;
  })();
  const names = async () => (JSON.parse((await admin(adminUrl, 'GET', '/admin/endpoints')).body).endpoints as { name: string }[]).map((e) => e.name).sort();
  t.same(await names(), ['e0']);
  await writeFile(file, JSON.stringify({ ...base, pools: cfg(fleet.urls).pools }));
  p.child.kill('SIGHUP');
  t.ok(await until(async () => (await names()).length === 2, 5000), 'the endpoint from the file joined');
  await writeFile(file, 'apiVersion: switchyard/v1\nkind: Router\npools: 7\n');
  p.child.kill('SIGHUP');
  t.ok(await until(() => /config reload refused/.test(p.out()), 5000), 'a bad file is refused in the log');
  t.match(p.out(), /"path":"pools"/, 'with its field path');
  t.same(await names(), ['e0', 'e1'], 'the old config keeps serving');
  t.equal((await post(p.url, '/v1/chat/completions', chat())).status, 200);
  p.child.kill('SIGTERM');
  t.same(await p.exited, [0, null]);
});

t.test('--watch-config: a changed file is reloaded without a signal; a bad one is refused; saving it unchanged does nothing', async (t) => {
  const fleet = await startFleet(2, { timeScale: 0 });
  const dir = await mkdtemp(join(tmpdir(), 'swy-watch-'));
  const file = join(dir, 'router.json');
  const { rename } = await import('node:fs/promises');
  await writeFile(file, JSON.stringify(cfg(fleet.urls.slice(0, 1))));
  const { loadConfigFile } = await import('../../src/config/load.js');
  const router = await startRouter(await loadConfigFile(file, validatePlugin), { port: 0, host: '127.0.0.1', adminPort: 0, configFile: file, validatePlugin, watchConfig: 50 });
  t.teardown(async () => {
    await router.close(200);
    await fleet.close();
  });
  const reloads = async (result: string) => {
    try {
      return metric(parseProm((await get(router.url, '/metrics')).body), 'switchyard_config_reloads_total', { result });
    } catch {
      return 0; // no sample of that result yet
    }
  };
  const names = () => router.core.endpoints.all.map((e) => e.name).sort().join(',');
  // written in place
  await writeFile(file, JSON.stringify(cfg(fleet.urls)));
  t.ok(await until(() => names() === 'e0,e1', 3000), 'the new endpoint joined');
  t.equal(await reloads('ok'), 1, 'one save, one reload (debounced)');
  // replaced by a rename, as editors and config-map mounts do: a bad file is refused
  const broken = cfg(fleet.urls);
  (broken.pools[0]!.endpoints[1] as Record<string, unknown>).url = 'not a url';
  await writeFile(join(dir, 'router.json.tmp'), JSON.stringify(broken));
  await rename(join(dir, 'router.json.tmp'), file);
  t.ok(await until(async () => (await reloads('invalid')) === 1, 3000), 'the bad file was refused');
  t.equal(names(), 'e0,e1', 'the old endpoints keep serving');
  t.equal((await post(router.url, '/v1/chat/completions', chat())).status, 200);
  // the same text again: no reload
  await writeFile(file, JSON.stringify(broken));
  await sleep(300);
  t.equal(await reloads('invalid'), 1, 'an unchanged file is not reloaded');
  // another file in the directory does not count
  await writeFile(join(dir, 'other.json'), '{}');
  await sleep(300);
  t.equal((await reloads('ok')) + (await reloads('invalid')), 2);
});

t.test('--watch-config at its default settle time: a writer pausing 600 ms mid-file (the adversarial kit\'s t15) is not caught half-written', async (t) => {
  const { stringify } = await import('yaml');
  const { open } = await import('node:fs/promises');
  const fleet = await startFleet(2, { timeScale: 0 });
  const dir = await mkdtemp(join(tmpdir(), 'swy-watch-pause-'));
  const file = join(dir, 'router.yaml');
  const full = stringify(cfg(fleet.urls));
  await writeFile(file, full);
  const { loadConfigFile } = await import('../../src/config/load.js');
  // the CLI's debounce (300 ms) and settle time (1 s): only the debounce is given, as --watch-config does
  const router = await startRouter(await loadConfigFile(file, validatePlugin), { port: 0, host: '127.0.0.1', adminPort: 0, configFile: file, validatePlugin, watchConfig: 300 });
  t.teardown(async () => {
    await router.close(200);
    await fleet.close();
  });
  const names = () => router.core.endpoints.all.map((e) => e.name).sort().join(',');
  t.equal(names(), 'e0,e1');
  // rewritten in place with a changed comment: truncated, written up to e1's entry (a valid config
  // with e0 only), 600 ms of nothing, then the rest
  const next = `${full}# v2\n`;
  const cut = next.indexOf('\n', next.indexOf(fleet.urls[0]!)) + 1;
  const seen = new Set<string>();
  const watch = setInterval(() => seen.add(names()), 2);
  t.teardown(() => clearInterval(watch));
  const fh = await open(file, 'r+');
  await fh.truncate(0);
  await fh.write(next.slice(0, cut), 0);
  await fh.sync();
  await sleep(600);
  await fh.write(next.slice(cut), cut);
  await fh.close();
  // a counter with no sample yet (no reload so far) reads 0
  const count = (body: string, name: string, labels: Record<string, string>) =>
    parseProm(body).samples.filter((x) => x.name === name && Object.entries(labels).every(([k, v]) => x.labels[k] === v)).reduce((a, x) => a + x.value, 0);
  const reloads = async () => count((await get(router.url, '/metrics')).body, 'switchyard_config_reloads_total', { result: 'ok' });
  t.ok(await until(async () => (await reloads()) === 1, 5000), 'the whole file is reloaded once');
  clearInterval(watch);
  seen.add(names());
  t.same([...seen], ['e0,e1'], 'e1 was never drained: the prefix (e0 only) was not applied');
  const body = (await get(router.url, '/metrics')).body;
  t.equal(count(body, 'switchyard_endpoint_changes_total', { change: 'drained' }), 0, 'no endpoint drained');
  t.equal(count(body, 'switchyard_endpoint_changes_total', { change: 'removed' }), 0, 'no endpoint removed');
});

t.test('--watch-config: a file caught half-written in place is not applied; the router keeps the old config until the file is whole', async (t) => {
  const { stringify } = await import('yaml');
  const { open } = await import('node:fs/promises');
  const fleet = await startFleet(3, { timeScale: 0 });
  const dir = await mkdtemp(join(tmpdir(), 'swy-watch-partial-'));
  const file = join(dir, 'router.yaml');
  await writeFile(file, stringify(cfg(fleet.urls.slice(0, 2))));
  const { loadConfigFile } = await import('../../src/config/load.js');
  const router = await startRouter(await loadConfigFile(file, validatePlugin), { port: 0, host: '127.0.0.1', adminPort: 0, configFile: file, validatePlugin, watchConfig: 50 });
  t.teardown(async () => {
    await router.close(200);
    await fleet.close();
  });
  const names = () => router.core.endpoints.all.map((e) => e.name).sort().join(',');
  t.equal(names(), 'e0,e1');
  // the new file (e0, e1, e2) cut where its prefix is still a valid config: the pool with e0 only
  const full = stringify(cfg(fleet.urls));
  const cut = full.indexOf('\n', full.indexOf(fleet.urls[0]!)) + 1;
  const partial = full.slice(0, cut);
  await writeFile(join(dir, 'prefix.yaml'), partial);
  t.match((await loadConfigFile(join(dir, 'prefix.yaml'), validatePlugin)).pools[0]!.endpoints.map((e) => e.name), ['e0'], 'the prefix alone is a valid config with e0 only');

  const seen = new Set<string>();
  const watch = setInterval(() => seen.add(names()), 2);
  t.teardown(() => clearInterval(watch));
  // written in place in two writes, a pause longer than the debounce between them
  const fh = await open(file, 'w');
  await fh.write(partial);
  await sleep(80);
  await fh.write(full.slice(cut));
  await fh.close();
  t.ok(await until(() => names() === 'e0,e1,e2', 3000), 'the whole file is applied');
  await sleep(200);
  clearInterval(watch);
  seen.add(names());
  t.same([...seen].sort(), ['e0,e1', 'e0,e1,e2'], 'the partial config (e0 only) was never applied');
  const prom = parseProm((await get(router.url, '/metrics')).body);
  t.equal(metric(prom, 'switchyard_config_reloads_total', { result: 'ok' }), 1, 'one reload: the whole file');
});
