// Review of the router process around the request path: config values that
// validated but broke at runtime, YAML that threw a non-config error, repeated
// shutdown signals, and /readyz while draining. Real sockets, real sim engines.
import t from 'tap';
import { connect } from 'node:net';
import { parseConfig } from '../../src/config/load.js';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { ConfigError } from '../../src/errors.js';
import { startFleet } from '../../src/sim/index.js';
import { startRouter } from '../../src/server/router.js';
import { spawnServe, validatePlugin } from '../support/router-util.js';

const doc = (pools: string, extra = '') => `apiVersion: switchyard/v1\nkind: Router\npools:\n${pools}${extra}`;

function issues(text: string): string[] {
  try {
    parseConfig(text, validatePlugin);
  } catch (err) {
    if (err instanceof ConfigError) return err.issues.map((i) => `${i.path}: ${i.message}`);
    return [`not a ConfigError: ${(err as Error).name}: ${(err as Error).message}`];
  }
  return [];
}

t.test('an endpoint name with control characters is a config error (it went into a response header as is)', async (t) => {
  const got = issues(doc('  - { name: p, models: [m], endpoints: [{ name: "a\\r\\nx-evil: 1", url: "http://10.0.0.5:8000" }] }\n'));
  t.equal(got.length, 1, got.join('\n'));
  t.match(got[0], /^pools\[0\]\.endpoints\[0\]\.name: must not contain control characters/);
  t.same(issues(doc('  - { name: p, models: [m], endpoints: [{ name: "amd-ö-東京", url: "http://10.0.0.5:8000" }] }\n')), [], 'unicode names are fine');
});

t.test('endpoint URLs: fragments and credentials are config errors, the scheme is lower-cased', async (t) => {
  for (const url of ['http://10.0.0.5:8000/#x', 'http://10.0.0.5:8000#', 'http://u:p@10.0.0.5:8000']) {
    const got = issues(doc(`  - { name: p, models: [m], endpoints: [{ name: a, url: "${url}" }] }\n`));
    t.equal(got.length, 1, `${url}: ${got.join('\n')}`);
    t.match(got[0], /^pools\[0\]\.endpoints\[0\]\.url: must be an http\(s\) URL/, url);
  }
  const c = parseConfig(doc('  - { name: p, models: [m], endpoints: [{ url: "HTTPS://Example.com:8443/" }, { url: "HTTP://10.0.0.5:8000" }] }\n'));
  t.same(c.pools[0].endpoints.map((e) => e.url), ['https://example.com:8443', 'http://10.0.0.5:8000']);
  t.match(issues(doc('  - { name: p, models: [m], endpoints: [{ url: "HTTPS://10.0.0.5:8443" }] }\n', 'proxy: { client: h1 }\n')), [/endpoints\[0\]\.url: https endpoints need/]);
});

t.test('an upper-case scheme routes (the h1 client refused "HTTP://" at runtime: every request was a 502)', async (t) => {
  const fleet = await startFleet(1, { timeScale: 0 });
  t.teardown(() => fleet.close());
  const url = fleet.urls[0].replace('http://127.0.0.1', 'HTTP://localhost');
  const cfg = validateConfig(
    { apiVersion: API_VERSION, kind: 'Router', logging: { level: 'silent' }, pools: [{ name: 'p', models: ['open-model'], endpoints: [{ name: 'e0', url }] }] },
    validatePlugin,
  );
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => router.close(100));
  const r = await fetch(`${router.url}/v1/completions`, { method: 'POST', body: '{"model":"open-model","prompt":"hi","max_tokens":2}' });
  t.equal(r.status, 200, await r.text());
});

t.test('a model listed twice in a pool is a config error (each endpoint was a candidate twice)', async (t) => {
  const got = issues(doc('  - { name: p, models: [m, n, m], endpoints: [{ url: "http://10.0.0.5:8000" }] }\n'));
  t.same(got, ['pools[0].models[2]: duplicate model "m" in this pool']);
  t.same(issues(doc('  - { name: p, models: [m], endpoints: [{ url: "http://10.0.0.5:8000" }] }\n  - { name: q, models: [m], endpoints: [{ url: "http://10.0.0.6:8000" }] }\n')), [], 'a model in several pools is fine');
});

t.test('YAML aliases expanding past the limit are a config error, not a ReferenceError', async (t) => {
  const bomb =
    'a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n';
  const got = issues(bomb);
  t.equal(got.length, 1, got.join('\n'));
  t.match(got[0], /^: YAML error: .*alias/i);
});

t.test('once close() began, /readyz answers 503 (a keep-alive health check saw "ready" while draining) and every answer closes its connection', async (t) => {
  const fleet = await startFleet(1, { timeScale: 1, itlMs: 10 });
  t.teardown(() => fleet.close());
  const cfg = validateConfig(
    { apiVersion: API_VERSION, kind: 'Router', logging: { level: 'silent' }, pools: [{ name: 'p', models: ['open-model'], endpoints: [{ name: 'e0', url: fleet.urls[0] }] }] },
    validatePlugin,
  );
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  const sock = connect(router.port, '127.0.0.1');
  t.teardown(() => sock.destroy());
  let got = '';
  sock.on('data', (b) => (got += b.toString('latin1')));
  await new Promise((r) => sock.once('connect', r));
  const readyz = async (): Promise<string> => {
    got = '';
    sock.write('GET /readyz HTTP/1.1\r\nhost: x\r\n\r\n');
    const end = Date.now() + 3000;
    while (!/\r\n\r\n[^]*\}/.test(got) && Date.now() < end) await new Promise((r) => setTimeout(r, 10));
    return got;
  };
  t.match(await readyz(), /^HTTP\/1\.1 200 /, 'ready before close');
  // a second kept-alive client connection, opened before the drain
  const keep = connect(router.port, '127.0.0.1');
  t.teardown(() => keep.destroy());
  let keepGot = '';
  keep.on('data', (b) => (keepGot += b.toString('latin1')));
  const keepClosed = new Promise((r) => keep.once('close', r));
  await new Promise((r) => keep.once('connect', r));
  // and a third for a streamed answer
  const keepS = connect(router.port, '127.0.0.1');
  t.teardown(() => keepS.destroy());
  let keepSGot = '';
  keepS.on('data', (b) => (keepSGot += b.toString('latin1')));
  await new Promise((r) => keepS.once('connect', r));
  // an in-flight request holds the drain open
  const inflight = fetch(`${router.url}/v1/completions`, { method: 'POST', body: '{"model":"open-model","prompt":"hi","max_tokens":60,"stream":true}' }).then((r) => r.text());
  const t0 = Date.now();
  while (router.core.activeRequests === 0 && Date.now() - t0 < 3000) await new Promise((r) => setTimeout(r, 5));
  const closed = router.close(5000);
  const during = await readyz();
  t.match(during, /^HTTP\/1\.1 503 /, 'not ready while draining');
  t.match(during, /shutting down/);
  t.match(during, /\r\nconnection: close\r\n/i, 'and the answer closes its connection');
  // a request on a kept-alive connection during the drain is served, and its connection closed after it
  const body = '{"model":"open-model","prompt":"hi","max_tokens":2}';
  keep.write(`POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`);
  const sbody = '{"model":"open-model","prompt":"hi","max_tokens":2,"stream":true}';
  keepS.write(`POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${sbody.length}\r\n\r\n${sbody}`);
  await keepClosed;
  t.match(keepGot, /^HTTP\/1\.1 200 /, 'served while draining');
  t.equal(keepGot.match(/\r\nconnection: close\r\n/gi)?.length, 1, 'with one connection: close header');
  const sEnd = Date.now() + 3000;
  while (!keepSGot.includes('\r\n0\r\n\r\n') && Date.now() < sEnd) await new Promise((r) => setTimeout(r, 10));
  t.match(keepSGot, /data: \[DONE\]/, 'a streamed answer while draining runs to its end');
  t.equal(keepSGot.match(/\r\nconnection: close\r\n/gi)?.length, 1, 'and says connection: close once');
  t.ok(keepSGot.includes('\r\n0\r\n\r\n'), 'with the last chunk');
  t.match(keepGot, /"object":"text_completion"/);
  t.match(await inflight, /\[DONE\]/, 'the in-flight stream finished');
  await closed;
});

t.test('switchyard serve: a second SIGTERM while draining does not cut in-flight requests (needs dist/)', async (t) => {
  // the embedded fleet at real speed: 80 tokens at 10 ms, about a second
  const { child, url, out, exited } = await spawnServe(t, ['--port', '0']);
  const inflight = fetch(`${url}/v1/completions`, {
    method: 'POST',
    body: JSON.stringify({ model: 'open-model', prompt: 'hello', max_tokens: 80, stream: true }),
  }).then(
    async (r) => [r.status, await r.text()] as const,
    (e: Error) => [0, `${e.message}: ${(e.cause as Error | undefined)?.message}`] as const,
  );
  await new Promise((r) => setTimeout(r, 150));
  child.kill('SIGTERM');
  await new Promise((r) => setTimeout(r, 100));
  child.kill('SIGTERM');
  const [status, body] = await inflight;
  t.equal(status, 200, body.slice(0, 200));
  t.match(body, /data: \[DONE\]\s*$/, 'the stream ran to its end');
  t.same(await exited, [0, null], 'exit code 0 after the drain');
  t.match(out(), /already shutting down/);
});

t.test('switchyard serve: a second signal more than a second after the first stops at once (needs dist/)', async (t) => {
  const { child, url, out, exited } = await spawnServe(t, ['--port', '0']);
  // about 8 s of tokens: longer than the test waits
  const inflight = fetch(`${url}/v1/completions`, {
    method: 'POST',
    body: JSON.stringify({ model: 'open-model', prompt: 'hello', max_tokens: 800, stream: true }),
  })
    .then((r) => r.text())
    .catch((e: Error) => `failed: ${e.message}`); // cut mid-stream: the body read fails
  await new Promise((r) => setTimeout(r, 150));
  child.kill('SIGINT');
  await new Promise((r) => setTimeout(r, 1300));
  const t0 = Date.now();
  child.kill('SIGINT');
  t.same(await exited, [130, null], 'exit 130: stopped by the second Ctrl-C');
  t.ok(Date.now() - t0 < 2000, `at once (${Date.now() - t0} ms), not after the drain`);
  t.match(await inflight, /"code":"router_shutting_down"[^\n]*\n\ndata: \[DONE\]\s*$/, 'the stream ended with the shutdown error event (test/cli/drain.test.ts has the details)');
  t.match(out(), /second signal: stopping now/);
});
