// Identity with API-key tenants, over real sockets: the router started the way
// `switchyard serve` starts it (parseConfig → flowGateFactory → startRouter) in
// front of a simulated engine. With `tenants` configured and `trustHeaders`
// unset, a request without a key (or with a wrong one) that says
// `x-tenant-id: payments` must not land in the payments tenant's premium band;
// headers may still lower a band. /metrics' dispatched counters show where
// each request went.
import t from 'tap';
import { startEngine } from '../../src/sim/index.js';
import { parseConfig } from '../../src/config/load.js';
import { registry } from '../../src/scheduler/plugins/index.js';
import { startRouter } from '../../src/server/router.js';
import { flowGateFactory } from '../../src/server/flow-gate.js';

const validate = (kind: 'filter' | 'scorer' | 'picker', s: { type: string; params: Record<string, unknown> }) =>
  registry.validate(kind, s.type, s.params);

async function routerWith(t: Tap.Test, flowYaml: string) {
  const engine = await startEngine({ timeScale: 0 });
  const cfg = parseConfig(
    `apiVersion: switchyard/v1
kind: Router
pools:
  - { name: p, models: [open-model], endpoints: [{ name: e0, url: "${engine.url}" }] }
logging: { level: silent }
flowControl:
  flows:
    - { id: "tenant:payments", priority: premium }
    - { id: "tenant:free", priority: batch }
    - { id: "workload:vip", priority: premium }
  tenants: { "key-pay": payments, "key-free": free }
${flowYaml}`,
    validate,
    'flow-trust-headers',
  );
  const router = await startRouter(cfg, { port: 0, host: '127.0.0.1', gate: await flowGateFactory(cfg) });
  t.teardown(async () => {
    await router.close(200);
    await engine.close();
  });
  /** Sends one request; returns the (band, flow) whose dispatched counter moved. */
  const where = async (headers: Record<string, string>): Promise<string[]> => {
    const before = await counters(router.url);
    const r = await fetch(`${router.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...headers },
      body: '{"model":"open-model","prompt":"hi","max_tokens":1}',
    });
    t.equal(r.status, 200, JSON.stringify(headers));
    await r.text();
    const after = await counters(router.url);
    return [...after].filter(([k, v]) => v !== (before.get(k) ?? 0)).map(([k]) => k);
  };
  return where;
}

async function counters(url: string): Promise<Map<string, number>> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const out = new Map<string, number>();
  for (const m of text.matchAll(/^switchyard_flow_dispatched_total\{pool="[^"]*",band="([^"]*)",flow="([^"]*)"\} (\S+)$/gm)) {
    out.set(`${m[1]} ${m[2]}`, Number(m[3]));
  }
  return out;
}

t.test('tenants configured, trustHeaders unset: identity from the API key only', async (t) => {
  const where = await routerWith(t, '');
  t.same(await where({ 'x-tenant-id': 'payments' }), ['standard default'], 'no key + x-tenant-id: the default flow and band, not premium');
  t.same(await where({ authorization: 'Bearer nope', 'x-tenant-id': 'payments' }), ['standard default'], 'a wrong key + x-tenant-id: the same');
  t.same(await where({ 'x-llm-d-inference-fairness-id': 'tenant:payments' }), ['standard default'], 'a tenant id in the llm-d header: the same');
  t.same(await where({ 'x-workload-id': 'vip' }), ['standard workload:vip'], 'a header-claimed premium workload stays at the default band');
  t.same(await where({ authorization: 'Bearer key-pay' }), ['premium tenant:payments'], 'the key maps to its tenant and band');
  t.same(await where({ authorization: 'Bearer key-pay', 'x-priority': 'batch' }), ['batch tenant:payments'], 'a header may lower the band');
  t.same(await where({ authorization: 'Bearer key-free', 'x-priority': 'premium', 'x-tenant-id': 'payments' }), ['batch tenant:free'], 'never raise it');
});

t.test('trustHeaders: true (a fronting gateway authenticates): x-tenant-id is believed', async (t) => {
  const where = await routerWith(t, '  trustHeaders: true\n');
  t.same(await where({ 'x-tenant-id': 'payments' }), ['premium tenant:payments']);
  t.same(await where({ 'x-workload-id': 'vip' }), ['premium workload:vip']);
});
