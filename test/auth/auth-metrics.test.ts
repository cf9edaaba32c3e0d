// Bounded metrics, read from a real router's /metrics: unauthenticated
// requests create no series whatever labels they invent; flow label values
// are capped by metrics.maxLabelValues (later ones under "(overflow)"); a
// removed endpoint's series leave with it.
import t from 'tap';
import { createHash } from 'node:crypto';
import { startEngine, startFleet } from '../../src/sim/index.js';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { startRouter, type RunningRouter } from '../../src/server/router.js';
import { validatePlugin } from '../support/router-util.js';
import { parseProm, send, until } from '../support/sim-util.js';

const sha = (k: string) => createHash('sha256').update(k).digest('hex');
const KEY = 'sk-metrics-tenant-a';
const TOKEN = 'admin-token-for-metrics';

async function router(t: Tap.Test, urls: string[], extra: Record<string, unknown>): Promise<RunningRouter> {
  const cfg = validateConfig(
    { apiVersion: API_VERSION, kind: 'Router', logging: { level: 'silent' }, pools: [{ name: 'p', models: ['open-model'], endpoints: urls.map((url, i) => ({ name: `e${i}`, url })) }], ...extra },
    validatePlugin,
  );
  const r = await startRouter(cfg, { port: 0, host: '127.0.0.1', adminPort: 0 });
  t.teardown(() => r.close(200));
  return r;
}

const call = (base: string, method: string, path: string, body: unknown, headers: Record<string, string> = {}) => send(base, method, path, body, headers).done;
const metricsText = async (r: RunningRouter) => (await call(r.url, 'GET', '/metrics', undefined)).body;
/** Every value of `label` in the series of `family` (`counted`: only series above 0). */
function labelValues(text: string, family: string, label: string, counted = false): Set<string> {
  const out = new Set<string>();
  for (const s of parseProm(text).samples) if (s.name === family && s.labels[label] !== undefined && (!counted || s.value > 0)) out.add(s.labels[label]!);
  return out;
}

t.test('unauthenticated requests create no series, whatever they claim', async (t) => {
  const fleet = await startFleet(1, { timeScale: 0 });
  t.teardown(() => fleet.close());
  const r = await router(t, fleet.urls, { flowControl: { enabled: true }, responses: { enabled: true }, auth: { keys: [{ digest: sha(KEY), tenant: 'a' }] } });
  const before = await metricsText(r);
  const lies = (i: number) => ({ 'x-tenant-id': `lie-${i}`, 'x-llm-d-inference-fairness-id': `lie-fid-${i}`, 'x-workload-id': `lie-w-${i}`, 'x-priority': 'premium' });
  for (let i = 0; i < 60; i++) {
    const auth = i % 3 === 0 ? {} : i % 3 === 1 ? { authorization: `Bearer sk-lie-${i}` } : { authorization: `Token lie-${i}` };
    const body = { model: `lie-model-${i}`, messages: [{ role: 'user', content: 'x' }], max_tokens: 1 };
    const path = ['/v1/chat/completions', '/v1/completions', '/v1/embeddings', '/v1/responses'][i % 4]!;
    t.equal((await call(r.url, 'POST', path, body, { ...auth, ...lies(i) })).status, 401);
  }
  const after = await metricsText(r);
  t.notMatch(after, /lie-/, 'no label value from an unauthenticated request');
  const series = (text: string) => new Set(parseProm(text).samples.filter((s) => s.name.startsWith('switchyard_')).map((s) => `${s.name}${JSON.stringify(s.labels)}`));
  const added = [...series(after)].filter((s) => !series(before).has(s));
  t.same(added.filter((s) => !s.startsWith('switchyard_requests_total')), [], 'no new series but the request counter');
  t.same(labelValues(after, 'switchyard_requests_total', 'status'), new Set(['401']), 'counted once per status, with no model or endpoint');
  t.same(labelValues(after, 'switchyard_requests_total', 'model'), new Set(['']));
  // a known key inventing identity headers still makes only its tenant's flow
  for (let i = 0; i < 20; i++) {
    const body = { model: 'open-model', messages: [{ role: 'user', content: `y${i}` }], max_tokens: 1 };
    t.equal((await call(r.url, 'POST', '/v1/chat/completions', body, { authorization: `Bearer ${KEY}`, ...lies(i) })).status, 200);
  }
  const keyed = await metricsText(r);
  t.same(labelValues(keyed, 'switchyard_flow_dispatched_total', 'flow', true), new Set(['tenant:a']), 'the key\'s flow only (the overflow queues\' series stay at 0)');
  t.notMatch(keyed, /lie-/);
  t.notOk(keyed.includes(KEY) || keyed.includes(sha(KEY)), 'no key or digest in the metrics');
});

t.test('flow label values are capped by metrics.maxLabelValues; later flows count under (overflow)', async (t) => {
  const fleet = await startFleet(1, { timeScale: 0 });
  t.teardown(() => fleet.close());
  const r = await router(t, fleet.urls, { flowControl: { enabled: true }, metrics: { maxLabelValues: 5 } });
  for (let i = 0; i < 20; i++) {
    const body = { model: 'open-model', prompt: `p${i}`, max_tokens: 1 };
    t.equal((await call(r.url, 'POST', '/v1/completions', body, { 'x-llm-d-inference-fairness-id': `flow-${i}` })).status, 200);
  }
  const text = await metricsText(r);
  const flows = labelValues(text, 'switchyard_flow_dispatched_total', 'flow');
  t.equal(flows.size, 6, `5 flows and (overflow): ${[...flows].join(' ')}`);
  t.ok(flows.has('(overflow)'));
  const total = parseProm(text).samples.filter((s) => s.name === 'switchyard_flow_dispatched_total').reduce((n, s) => n + s.value, 0);
  t.equal(total, 20, 'every request is still counted');
  const bad = () => validateConfig({ apiVersion: API_VERSION, kind: 'Router', pools: [{ name: 'p', models: ['m'], endpoints: [{ url: 'http://127.0.0.1:1' }] }], metrics: { maxLabelValues: 0 } });
  t.throws(bad, /metrics\.maxLabelValues: must be an integer in \[1, 1000000\]/);
});

t.test("a removed endpoint's series leave with it", async (t) => {
  const fleet = await startFleet(1, { timeScale: 0 });
  const extra = await startEngine({ timeScale: 0 });
  t.teardown(async () => {
    await fleet.close();
    await extra.close();
  });
  const r = await router(t, fleet.urls, { admin: { token: TOKEN }, dataLayer: { healthIntervalMs: 100, scrapeIntervalMs: 50 } });
  const admin = (method: string, path: string, body?: unknown) => call(r.admin!.url, method, path, body, { authorization: `Bearer ${TOKEN}` });
  t.equal((await admin('POST', '/admin/endpoints', { pool: 'p', name: 'e9', url: extra.url })).status, 201);
  let i = 0;
  const served = async () => {
    await call(r.url, 'POST', '/v1/chat/completions', { model: 'open-model', messages: [{ role: 'user', content: `hello ${i++}` }], max_tokens: 1 });
    return (await metricsText(r)).includes('switchyard_requests_total{model="open-model",endpoint="e9"');
  };
  t.ok(await until(served, 10_000), 'e9 served requests');
  t.match(await metricsText(r), /endpoint="e9"/);
  t.equal((await admin('DELETE', '/admin/endpoints/e9?force=1&wait=1')).status, 200);
  const text = await metricsText(r);
  t.notMatch(text, /endpoint="e9"/, 'no series names the removed endpoint');
  t.match(text, /endpoint="e0"/, 'the remaining one keeps its series');
});
