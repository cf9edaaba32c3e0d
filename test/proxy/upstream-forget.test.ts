// A removed endpoint keeps no connection open: after the admin API removes it
// (its drain over), the native upstream client closes its idle keep-alive
// connections at once and a connection still busy with a request once that
// request ends. Counted on the engine's side: the established TCP connections
// whose local port is the engine's (/proc/net/tcp). Real loopback sockets,
// real simulated engines, the router with `proxy.client: native`.
import t from 'tap';
import { readFileSync } from 'node:fs';
import { startEngine, type SimEngine } from '../../src/sim/index.js';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { startRouter, type RunningRouter } from '../../src/server/router.js';
import { post, send, until } from '../support/sim-util.js';
import { validatePlugin } from '../support/router-util.js';

const TOKEN = 'forget-test-token';

/** Established connections accepted by the listener on `port` (IPv4 loopback). */
function established(port: number): number {
  const hex = port.toString(16).toUpperCase().padStart(4, '0');
  let n = 0;
  for (const line of readFileSync('/proc/net/tcp', 'utf8').split('\n').slice(1)) {
    const f = line.trim().split(/\s+/);
    if (f.length > 3 && f[1]!.endsWith(`:${hex}`) && f[3] === '01') n++;
  }
  return n;
}

async function setup(t: Tap.Test, graceMs: number): Promise<{ keep: SimEngine; gone: SimEngine; router: RunningRouter }> {
  const keep = await startEngine({ timeScale: 1, itlMs: 20, prefillOverheadMs: 1, prefillUsPerToken: 0, models: ['m-keep'] });
  const gone = await startEngine({ timeScale: 1, itlMs: 20, prefillOverheadMs: 1, prefillUsPerToken: 0, models: ['m-gone'] });
  t.teardown(() => Promise.all([keep.close(), gone.close()]));
  const cfg = validateConfig(
    {
      apiVersion: API_VERSION,
      kind: 'Router',
      pools: [
        { name: 'a', models: ['m-keep'], endpoints: [{ name: 'keep', url: keep.url }] },
        { name: 'b', models: ['m-gone'], endpoints: [{ name: 'gone', url: gone.url }] },
      ],
      logging: { level: 'silent' },
      proxy: { client: 'native' },
      // no scrapes or health checks: the only connections to the engines are the proxy's
      dataLayer: { healthIntervalMs: 0, scrapeIntervalMs: 0 },
      admin: { token: TOKEN, drainGraceMs: graceMs },
    },
    validatePlugin,
  );
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1', adminPort: 0 });
  t.teardown(() => router.close(200));
  return { keep, gone, router };
}

const remove = (router: RunningRouter, name: string) =>
  send(router.admin!.url, 'DELETE', `/admin/endpoints/${name}?force=1&wait=1`, undefined, { authorization: `Bearer ${TOKEN}` }).done;
const ask = (router: RunningRouter, model: string, maxTokens: number) =>
  post(router.url, '/v1/completions', { model, prompt: `hello ${Math.random()}`, max_tokens: maxTokens, stream: true });

t.test('removing an endpoint closes its connections once its drain is over', async (t) => {
  const { keep, gone, router } = await setup(t, 5000);
  // keep-alive connections to both engines: four at once to each, then idle
  const warm = await Promise.all([...Array.from({ length: 4 }, () => ask(router, 'm-gone', 2)), ...Array.from({ length: 4 }, () => ask(router, 'm-keep', 2))]);
  t.ok(warm.every((r) => r.status === 200));
  t.ok(established(gone.port) >= 1, `idle connections to the endpoint to remove (${established(gone.port)})`);
  const keptBefore = established(keep.port);
  t.ok(keptBefore >= 1);
  // one request in flight while it is removed: the drain waits for it
  const long = ask(router, 'm-gone', 25); // ~0.5 s
  t.ok(await until(() => gone.stats().running === 1, 2000), 'a request runs there');
  const del = await remove(router, 'gone');
  t.equal(del.status, 200);
  const r = await long;
  t.equal(r.status, 200, 'the request in flight finished');
  t.ok(r.body.endsWith('data: [DONE]\n\n'));
  // the idle keep-alive timeout is 4 s: well before that, nothing is left open
  t.ok(await until(() => established(gone.port) === 0, 1000), `no connection left to the removed endpoint (${established(gone.port)})`);
  t.equal(established(keep.port), keptBefore, 'the other endpoint keeps its connections');
  t.equal((await ask(router, 'm-keep', 2)).status, 200);
});

t.test('a connection busy when the grace period ran out closes when its request ends', async (t) => {
  const { gone, router } = await setup(t, 200);
  await Promise.all(Array.from({ length: 3 }, () => ask(router, 'm-gone', 2)));
  t.ok(established(gone.port) >= 1);
  const long = ask(router, 'm-gone', 40); // ~0.8 s, past the 200 ms grace
  t.ok(await until(() => gone.stats().running === 1, 2000));
  const del = await remove(router, 'gone');
  t.equal(del.status, 200);
  t.ok(await until(() => established(gone.port) === 1, 1000), 'the idle ones closed at once; the busy one stays while its request runs');
  const r = await long;
  t.equal(r.status, 200, 'the request outlived the grace period and finished');
  t.ok(await until(() => established(gone.port) === 0, 1000), 'then its connection closed too');
});
