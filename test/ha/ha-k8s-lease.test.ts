// The standby pair's lease as a Kubernetes coordination.k8s.io/v1 Lease,
// against the local API server of test/k8s-api-server.ts (resourceVersion
// conflicts honoured; no cluster runs here): creation, renewal, takeover
// after the holder stops renewing (fence = leaseTransitions + 1), a 409
// Conflict on renewal means lost, a paused old active steps down when it sees
// another holder, graceful release, the API server unreachable at start, and
// two routers (with Redis for the warm standby's fenced delta stream).
import t from 'tap';
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import { KubeApi } from '../../src/k8s/api.js';
import { KubernetesLease } from '../../src/ha/k8s-lease.js';
import { HighAvailability } from '../../src/ha/standby.js';
import { HaStartError } from '../../src/errors.js';
import { EndpointSet } from '../../src/endpoints/endpoint.js';
import { API_VERSION, validateConfig } from '../../src/config/schema.js';
import { startRouter } from '../../src/server/router.js';
import { startFleet } from '../../src/sim/index.js';
import { validatePlugin } from '../support/router-util.js';
import { startRedis } from '../support/redis-util.js';
import { KubeApiServer } from '../support/k8s-api-server.js';

const log = pino({ level: 'silent' });
const NS = 'llm';
const TTL = 2000; // leaseDurationSeconds 2 (a shared, loaded machine: renewals must not miss it)
const RENEW = 200;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
async function until(cond: () => boolean | Promise<boolean>, ms: number, step = 20): Promise<number> {
  const t0 = performance.now();
  while (performance.now() - t0 < ms) {
    if (await cond()) return performance.now() - t0;
    await sleep(step);
  }
  return -1;
}

async function server(t: Tap.Test): Promise<{ api: KubeApiServer; kubeconfig: string }> {
  const api = await new KubeApiServer().listen();
  t.teardown(() => api.close());
  const kubeconfig = await api.kubeconfig(await mkdtemp(join(tmpdir(), 'swy-lease-')), NS);
  return { api, kubeconfig };
}

async function lease(t: Tap.Test, kubeconfig: string, id: string): Promise<KubernetesLease> {
  const api = await KubeApi.load(kubeconfig);
  const l = new KubernetesLease({ api, namespace: NS, name: 'switchyard', ttlMs: TTL, renewIntervalMs: RENEW, log, id });
  t.teardown(() => l.stop(false));
  return l;
}

t.test('create, renew, take over when the holder stops renewing; 409 on renewal means lost', async (t) => {
  const { api, kubeconfig } = await server(t);
  const a = await lease(t, kubeconfig, 'router-a');
  const b = await lease(t, kubeconfig, 'router-b');
  t.equal(await a.start(), 'active', 'the first router creates the Lease and holds it');
  t.equal(a.fence, 1, 'fence = leaseTransitions (0) + 1');
  t.equal(await b.start(), 'standby');
  const rec = api.get('leases', NS, 'switchyard')!;
  t.match(rec.spec, { holderIdentity: 'router-a', leaseDurationSeconds: 2, leaseTransitions: 0 });
  t.match((rec.spec as { renewTime: string }).renewTime, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/, 'renewTime is a MicroTime');
  const rv0 = Number(rec.metadata.resourceVersion);
  t.ok((await until(() => Number(api.get('leases', NS, 'switchyard')!.metadata.resourceVersion) > rv0 + 2, 2000)) >= 0, 'the active renews');
  await sleep(TTL + 2 * RENEW);
  t.equal(b.state, 'standby', 'a renewed lease is not taken over');

  // A freezes: no renewals. B takes over after leaseDurationSeconds without a change
  a.pause();
  const took = await until(() => b.state === 'active', TTL * 5);
  t.ok(took >= 0, `the standby took over after ${Math.round(took)} ms (the bound is benchmarked, not asserted here)`);
  t.equal(b.fence, 2, 'a new term, a larger fence (leaseTransitions 1 + 1)');
  t.match(api.get('leases', NS, 'switchyard')!.spec, { holderIdentity: 'router-b', leaseTransitions: 1 });
  // A wakes up believing it leads: its next round sees another holder and steps down
  t.equal(a.state, 'active', 'the frozen process still believes it leads');
  a.resume();
  t.ok((await until(() => a.state === 'standby', 2000)) >= 0, 'the old active stepped down');
  t.equal(a.fence, 0);

  // a write between B's read and its renewal: the PUT carries a stale resourceVersion → 409 → lost
  api.beforeLeasePut = () => {
    const cur = api.get('leases', NS, 'switchyard')!;
    api.apply('leases', NS, { ...cur, spec: { ...(cur.spec as object), holderIdentity: 'intruder', renewTime: new Date().toISOString() } });
  };
  t.ok((await until(() => b.state === 'standby', 2000)) >= 0, '409 Conflict on renewal: B lost the lease');
  t.ok(b.conflicts >= 1, 'counted as a conflict');
  t.ok(api.counts.conflicts >= 1, 'the server refused a stale resourceVersion');
  t.ok(a.state === 'standby' && b.state === 'standby', 'nobody leads while the intruder holds it');
});

t.test('two routers racing for a free lease: one wins, the other gets 409 (never two actives)', async (t) => {
  const { api, kubeconfig } = await server(t);
  // a released lease (holderIdentity empty): both may try at once
  api.apply('leases', NS, { metadata: { name: 'switchyard' }, spec: { holderIdentity: null, leaseDurationSeconds: 1, leaseTransitions: 4 } });
  let wins = 0;
  for (let i = 0; i < 5; i++) {
    const a = await lease(t, kubeconfig, `a${i}`);
    const b = await lease(t, kubeconfig, `b${i}`);
    // the same record read by both, then both write: the server accepts the first PUT only
    const cur = api.get('leases', NS, 'switchyard')!;
    api.apply('leases', NS, { ...cur, spec: { ...(cur.spec as object), holderIdentity: null } });
    await Promise.all([a.round(false), b.round(false)]);
    const actives = [a, b].filter((l) => l.state === 'active');
    t.equal(actives.length, 1, `round ${i}: exactly one active`);
    wins += actives.length;
    await a.stop(false);
    await b.stop(false);
  }
  t.equal(wins, 5);
  t.ok(api.counts.conflicts >= 1, `the API server refused the loser's write at least once (${api.counts.conflicts})`);
  t.equal((api.get('leases', NS, 'switchyard')!.spec as { leaseTransitions: number }).leaseTransitions, 9, 'every acquisition is a new term');
});

t.test('graceful release hands over at the next round; API server down at start: refuse or serve alone', async (t) => {
  const { api, kubeconfig } = await server(t);
  const a = await lease(t, kubeconfig, 'a');
  const b = await lease(t, kubeconfig, 'b');
  t.equal(await a.start(), 'active');
  t.equal(await b.start(), 'standby');
  await a.stop(true);
  t.match(api.get('leases', NS, 'switchyard')!.spec, { holderIdentity: null });
  const took = await until(() => b.state === 'active', TTL * 5);
  t.ok(took >= 0, `released: taken over at a next round (${Math.round(took)} ms)`);
  t.match(api.get('leases', NS, 'switchyard')!.spec, { holderIdentity: 'b', leaseTransitions: 1 });

  // the API server unreachable at start
  const dead = await new KubeApiServer().listen();
  const deadConfig = await dead.kubeconfig(await mkdtemp(join(tmpdir(), 'swy-lease-')), NS);
  await dead.close();
  const endpoints = new EndpointSet([{ name: 'p', models: ['m'], endpoints: [{ name: 'e', url: 'http://127.0.0.1:9', role: 'both' }] }] as never);
  const base = { key: 'k', leaseTtlMs: TTL, renewIntervalMs: RENEW, deltaFlushMs: 50, streamMaxLen: 1000, warmStandby: true, kubernetes: { name: 'switchyard', namespace: NS, kubeconfig: deadConfig } };
  await t.rejects(HighAvailability.start({ ...base, onRedisDown: 'refuse' }, { endpoints, store: null, log }), HaStartError);
  const alone = await HighAvailability.start({ ...base, onRedisDown: 'serve-alone' }, { endpoints, store: null, log });
  t.teardown(() => alone.close());
  t.equal(alone.state, 'alone', 'serves alone while it retries');
  t.equal(alone.follower, null, 'no Redis: a cold standby, no follower');
  await t.rejects(
    HighAvailability.start({ ...base, onRedisDown: 'refuse', kubernetes: { name: 'x', kubeconfig: '/nonexistent' } }, { endpoints, store: null, log }),
    /cannot load the Kubernetes config/,
  );
});

t.test('two routers over a Kubernetes Lease and Redis: /readyz follows the lease, the delta stream is fenced by leaseTransitions', async (t) => {
  const { api, kubeconfig } = await server(t);
  const redis = await startRedis(t);
  const fleet = await startFleet(2, { timeScale: 0 });
  t.teardown(() => fleet.close());
  const cfg = validateConfig(
    {
      apiVersion: API_VERSION,
      kind: 'Router',
      pools: [{ name: 'p', models: ['open-model'], endpoints: fleet.urls.map((url, i) => ({ name: `e${i}`, url })) }],
      logging: { level: 'silent' },
      ha: { redis: redis.url, key: 'swy-k8s', leaseTtlMs: TTL, renewIntervalMs: RENEW, deltaFlushMs: 30, kubernetes: { name: 'pair', kubeconfig } },
    },
    validatePlugin,
  );
  const a = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  const b = await startRouter(cfg, { port: 0, host: '127.0.0.1' });
  t.teardown(() => b.close(100));
  t.equal(a.ha!.state, 'active');
  t.equal(b.ha!.state, 'standby');
  t.match(api.get('leases', NS, 'pair')!.spec, { holderIdentity: a.ha!.lease.id }, 'the Lease is in the kubeconfig context namespace');
  t.equal((await fetch(`${a.url}/readyz`)).status, 200, '/readyz 200 on the active');
  t.equal((await fetch(`${b.url}/readyz`)).status, 503, '/readyz 503 on the standby');
  for (let i = 0; i < 4; i++) {
    const r = await fetch(`${a.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'open-model', max_tokens: 2, messages: [{ role: 'user', content: `hello ${i} `.repeat(40) }] }) });
    await r.arrayBuffer();
    t.equal(r.status, 200);
  }
  t.ok((await until(() => b.ha!.follower!.messages > 0, 3000)) >= 0, 'the standby follows the deltas the active published under its fence');
  // a stale fence (an old term) is refused by Redis
  t.equal(await a.ha!.lease.fencedAppend('swy-k8s:deltas', 0, 1000, Buffer.from('old')), null, 'an append with an older fence is refused');
  const before = a.ha!.lease.fence;
  await a.close(100);
  t.ok((await until(() => b.ha!.state === 'active', TTL * 5)) >= 0, 'the standby took over');
  t.ok(b.ha!.lease.fence > before, `a new term, a larger fence: ${b.ha!.lease.fence} after ${before}`);
  t.ok((await until(async () => (await fetch(`${b.url}/readyz`)).status === 200, 5000)) >= 0, '/readyz 200 on the new active');
});
