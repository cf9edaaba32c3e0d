// LoRA adapters through the router, over real simulated engines: adapters
// learned from the engines' /v1/models (no config), placement on the replicas
// that hold them, adapter affinity (fewer GPU slot loads than adapter-blind
// routing, same requests), /v1/models with parent, per-adapter metrics, and
// on-demand loading (POST /v1/load_lora_adapter) with its fallback and 503.
import t from 'tap';
import { performance } from 'node:perf_hooks';
import { startEngine, type SimEngine } from '../../src/sim/index.js';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { startRouter, type RunningRouter } from '../../src/server/router.js';
import { spawnServe, validatePlugin } from '../support/router-util.js';
import { get, metric, post, scrape, until } from '../support/sim-util.js';

async function route(t: Tap.Test, engines: SimEngine[], extra: Record<string, unknown> = {}, pool: Record<string, unknown> = {}): Promise<RunningRouter> {
  const cfg = validateConfig(
    {
      apiVersion: API_VERSION,
      kind: 'Router',
      pools: [{ name: 'p', models: ['open-model'], endpoints: engines.map((e, i) => ({ name: `e${i}`, url: e.url })), ...pool }],
      logging: { level: 'silent' },
      dataLayer: { modelCheckIntervalMs: 500 }, // a first read timed out on a loaded machine is read again soon
      ...extra,
    },
    validatePlugin,
  );
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => router.close(200));
  // the engines' adapters are learned at their first good health check (a loaded machine may time the first out)
  const want = [...new Set(engines.flatMap((e) => e.options.loras))];
  const listed = async () => {
    const ids = (JSON.parse((await get(router.url, '/v1/models')).body).data as { id: string }[]).map((m) => m.id);
    return want.every((a) => ids.includes(a));
  };
  t.ok(await until(listed, 20_000), 'the engines\' adapters are known');
  return router;
}

const ask = (url: string, model: string, prompt = 'hello') => post(url, '/v1/completions', { model, prompt, max_tokens: 2 });

t.test('adapters learned from /v1/models: routed only to the engines that hold them; /v1/models lists them with parent; unknown is 404', async (t) => {
  const e0 = await startEngine({ timeScale: 0, loras: ['sql'] });
  const e1 = await startEngine({ timeScale: 0, loras: ['chat-fr'] });
  const e2 = await startEngine({ timeScale: 0 });
  t.teardown(() => Promise.all([e0, e1, e2].map((e) => e.close())));
  const router = await route(t, [e0, e1, e2]);
  for (let i = 0; i < 6; i++) {
    const a = await ask(router.url, 'sql');
    t.equal(a.status, 200);
    t.equal(a.headers['x-switchyard-endpoint'], 'e0', 'sql: only e0 holds it');
    t.equal(JSON.parse(a.body).model, 'sql', 'the answer names the adapter');
    t.equal((await ask(router.url, 'chat-fr')).headers['x-switchyard-endpoint'], 'e1');
  }
  const list = JSON.parse((await get(router.url, '/v1/models')).body).data as { id: string; parent?: string }[];
  t.same(list.map((m) => [m.id, m.parent ?? null]).sort(), [['chat-fr', 'open-model'], ['open-model', null], ['sql', 'open-model']]);
  const miss = await ask(router.url, 'nope');
  t.equal(miss.status, 404);
  t.equal(JSON.parse(miss.body).error.code, 'model_not_found');
  const ex = await scrape(router.url);
  t.equal(metric(ex, 'switchyard_adapter_requests_total', { adapter: 'sql' }), 6);
  t.equal(metric(ex, 'switchyard_adapter_requests_total', { adapter: 'chat-fr' }), 6);
});

// Four engines, each holding every adapter, one GPU adapter slot each, a load
// cost; eight adapters requested round robin in bursts. With adapter affinity
// each adapter sticks to the engines it is on; adapter-blind routing spreads
// them and every engine keeps swapping.
async function loadsWith(t: Tap.Test, scorers: unknown[]): Promise<{ loads: number; misses: number; requests: number }> {
  const adapters = ['a0', 'a1', 'a2', 'a3', 'a4', 'a5', 'a6', 'a7'];
  const engines = await Promise.all([0, 1, 2, 3].map(() => startEngine({ timeScale: 0.01, loras: adapters, maxLoras: 2, loraLoadMs: 200, itlMs: 5, prefillOverheadMs: 1 })));
  t.teardown(() => Promise.all(engines.map((e) => e.close())));
  const router = await route(t, engines, { scheduling: { scorers, picker: 'max-score' } });
  for (let round = 0; round < 6; round++) {
    // a burst: every adapter at once, twice
    await Promise.all([...adapters, ...adapters].map((a, i) => ask(router.url, a, `round ${round} request ${i}`)));
  }
  const ex = await scrape(router.url);
  let misses = 0;
  let requests = 0;
  for (const a of adapters) {
    misses += metric(ex, 'switchyard_adapter_misses_total', { adapter: a });
    requests += metric(ex, 'switchyard_adapter_requests_total', { adapter: a });
  }
  return { loads: engines.reduce((s, e) => s + e.stats().loraLoads, 0), misses, requests };
}

t.test('lora-affinity: far fewer adapter loads than adapter-blind routing over the same requests', async (t) => {
  const blind = await loadsWith(t, [{ type: 'queue', weight: 1 }]);
  const aware = await loadsWith(t, [{ type: 'lora-affinity', weight: 4 }, { type: 'queue', weight: 1 }]);
  t.equal(blind.requests, 96);
  t.equal(aware.requests, 96);
  t.ok(aware.loads * 2 <= blind.loads, `loads: aware ${aware.loads}, blind ${blind.loads}`);
  t.ok(aware.misses < blind.misses, `misses: aware ${aware.misses}, blind ${blind.misses}`);
});

t.test('a free adapter slot wins over a busy engine; with every slot held the request waits for one and is served', async (t) => {
  const opts = { timeScale: 0.05, loras: ['a0', 'a1', 'a2'], maxLoras: 1, itlMs: 40, prefillOverheadMs: 0, prefillUsPerToken: 0 };
  const e0 = await startEngine(opts);
  const e1 = await startEngine(opts);
  t.teardown(() => Promise.all([e0.close(), e1.close()]));
  const router = await route(t, [e0, e1], { scheduling: { scorers: [{ type: 'lora-affinity', weight: 10 }, { type: 'queue', weight: 1 }] } });
  const long = (model: string) => post(router.url, '/v1/completions', { model, prompt: 'x', max_tokens: 100 }); // 200 ms wall
  const first = long('a0');
  await new Promise((r) => setTimeout(r, 30));
  const second = long('a1');
  await new Promise((r) => setTimeout(r, 30));
  const t0 = performance.now();
  const third = await ask(router.url, 'a2');
  const waited = performance.now() - t0;
  const [r0, r1] = await Promise.all([first, second]);
  t.not(r0.headers['x-switchyard-endpoint'], r1.headers['x-switchyard-endpoint'], 'a1 went to the engine with a free slot');
  t.equal(third.status, 200, 'a2: no slot free anywhere, it waited (in the router: adapter-hold.test.ts) and was served');
  t.ok(waited > 80, `a2 waited for a slot (${waited.toFixed(0)} ms)`);
  t.equal(e0.stats().loraLoads + e1.stats().loraLoads, 3);
});

t.test('on-demand loading: a declared adapter no engine holds is loaded on one, then served there; a refused load falls back, then 503', async (t) => {
  const e0 = await startEngine({ timeScale: 0, enableLora: true });
  const bad = await startEngine({ timeScale: 0, enableLora: true, loraLoadFail: true });
  t.teardown(() => Promise.all([e0.close(), bad.close()]));
  const router = await route(t, [bad, e0], { scheduling: { scorers: [{ type: 'lora-affinity', weight: 1 }], picker: 'round-robin' } }, {
    adapters: [{ name: 'sql', path: '/adapters/sql' }, 'other'],
    adapterLoading: { enabled: true },
  });
  const list = JSON.parse((await get(router.url, '/v1/models')).body).data as { id: string }[];
  t.ok(list.some((m) => m.id === 'sql'), 'a declared adapter is listed before any engine holds it');
  const r = await ask(router.url, 'sql');
  t.equal(r.status, 200, r.body);
  t.equal(r.headers['x-switchyard-endpoint'], 'e1', 'the load e0 refused fell back to the engine that loaded it');
  const models = JSON.parse((await get(e0.url, '/v1/models')).body).data as { id: string; root: string }[];
  t.same(models.find((m) => m.id === 'sql')?.root, '/adapters/sql', 'loaded with the declared path');
  for (let i = 0; i < 4; i++) t.equal((await ask(router.url, 'sql')).headers['x-switchyard-endpoint'], 'e1', 'then routed where it is');
  const ex = await scrape(router.url);
  t.equal(metric(ex, 'switchyard_adapter_loads_total', { adapter: 'sql' }), 1);
  t.equal(metric(ex, 'switchyard_adapter_load_failures_total', { adapter: 'sql' }), 1);
  // both engines refuse: e0 is stopped from loading by closing it, bad refuses
  await e0.close();
  const gone = await ask(router.url, 'other');
  t.equal(gone.status, 503, gone.body);
  t.match(JSON.parse(gone.body).error.message, /no endpoint could serve adapter `other`/);
});

t.test('config errors name the field: an adapter for a model its pool does not serve, an adapter named like a model', async (t) => {
  const bad = (pool: Record<string, unknown>) => {
    try {
      validateConfig({ apiVersion: API_VERSION, kind: 'Router', pools: [{ name: 'p', models: ['m1'], endpoints: [{ name: 'e', url: 'http://127.0.0.1:1' }], ...pool }] }, validatePlugin);
      return '';
    } catch (err) {
      return (err as Error).message;
    }
  };
  t.match(bad({ adapters: [{ name: 'x', base: 'm2' }] }), /pools\[0\]\.adapters\[0\]\.base: "m2" is not a model of this pool/);
  t.match(bad({ adapters: ['m1'] }), /pools\[0\]\.adapters\[0\]: "m1" is a model name/);
  t.match(bad({ adapterLoading: { enabled: 'yes' } }), /pools\[0\]\.adapterLoading\.enabled/);
});

t.test('quick mode (serve --upstream): the engine\'s adapters are learned and served with no config', async (t) => {
  const e = await startEngine({ timeScale: 0, loras: ['sql'] });
  t.teardown(() => e.close());
  const s = await spawnServe(t, ['--upstream', e.url, '--port', '0']);
  t.teardown(() => void s.child.kill('SIGTERM'));
  const r = await ask(s.url, 'sql');
  t.equal(r.status, 200, r.body);
  t.equal(JSON.parse(r.body).model, 'sql');
  const list = JSON.parse((await get(s.url, '/v1/models')).body).data as { id: string; parent?: string }[];
  t.ok(list.some((m) => m.id === 'sql' && m.parent === 'open-model'), 'listed with its parent');
});

t.test('the adapter label is capped at metrics.maxLabelValues: later adapters count under (overflow)', async (t) => {
  const e = await startEngine({ timeScale: 0, loras: ['sql', 'chat-fr', 'legal'] });
  t.teardown(() => e.close());
  const router = await route(t, [e], { metrics: { maxLabelValues: 1 } });
  for (const a of ['sql', 'chat-fr', 'legal', 'sql']) t.equal((await ask(router.url, a)).status, 200);
  const ex = await scrape(router.url);
  t.equal(metric(ex, 'switchyard_adapter_requests_total', { adapter: 'sql' }), 2, 'the first adapter keeps its series');
  t.equal(metric(ex, 'switchyard_adapter_requests_total', { adapter: '(overflow)' }), 2, 'the others share (overflow)');
  t.equal(ex.samples.filter((s) => s.name === 'switchyard_adapter_requests_total').length, 2, 'no series of their own');
});
