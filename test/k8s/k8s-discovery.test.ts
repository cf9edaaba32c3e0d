// Kubernetes discovery against a local list+watch server (test/k8s-api-server.ts;
// no cluster runs here) with real simulated engines as the pods' targets: every
// pod has IP 127.0.0.1 and its engine's port in the switchyard.io/port annotation.
// Pods added → routed to; unready → drained with an in-flight request finishing;
// 410 Gone → relist without losing endpoints; a stream cut mid-event → reconnect
// and the event replayed; bookmarks move the resume point; an InferencePool's
// selector change re-selects; bad config gets field paths.
import t from 'tap';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startFleet } from '../../src/sim/index.js';
import { validateConfig, API_VERSION } from '../../src/config/schema.js';
import { ConfigError } from '../../src/errors.js';
import { startRouter, type RunningRouter } from '../../src/server/router.js';
import { get, metric, parseProm, post, until } from '../support/sim-util.js';
import { validatePlugin } from '../support/router-util.js';
import { KubeApiServer, inferencePool, pod } from '../support/k8s-api-server.js';

const NS = 'llm';
// generous: a shared 2-core machine under other engineers' load (these are conditions, not timings)
const waitFor = (cond: () => boolean | Promise<boolean>, ms = 15_000) => until(cond, ms);

const chat = (content = 'hello there', extra: Record<string, unknown> = {}) => ({ model: 'open-model', messages: [{ role: 'user', content }], max_tokens: 4, ...extra });

function cfg(kubeconfig: string, discovery: Record<string, unknown>) {
  return {
    apiVersion: API_VERSION,
    kind: 'Router',
    pools: [{ name: 'p', models: ['open-model'], discovery: { kubernetes: { kubeconfig, namespace: NS, backoffInitialMs: 50, backoffMaxMs: 200, initialSyncTimeoutMs: 3000, ...discovery } } }],
    logging: { level: 'silent' },
    dataLayer: { healthIntervalMs: 100, scrapeIntervalMs: 50 },
    admin: { token: 'x', drainGraceMs: 5000 },
  };
}

async function setup(t: Tap.Test, n: number, discovery: Record<string, unknown>, before?: (api: KubeApiServer, ports: number[]) => void, fleetOpts: Parameters<typeof startFleet>[1] = { timeScale: 0 }) {
  const api = await new KubeApiServer().listen();
  const dir = await mkdtemp(join(tmpdir(), 'swy-k8s-'));
  const kubeconfig = await api.kubeconfig(dir, NS);
  const fleet = await startFleet(n, fleetOpts);
  const ports = fleet.urls.map((u) => Number(new URL(u).port));
  before?.(api, ports);
  const router = await startRouter(validateConfig(cfg(kubeconfig, discovery), validatePlugin), { port: 0, host: '127.0.0.1', adminPort: 0 });
  t.teardown(async () => {
    await router.close(200);
    await fleet.close();
    await api.close();
  });
  return { api, fleet, ports, router };
}

/** Names of the endpoints requests reach, over n requests. */
async function servedBy(router: RunningRouter, n: number): Promise<Set<string>> {
  const seen = new Set<string>();
  for (let i = 0; i < n; i++) {
    const r = await post(router.url, '/v1/chat/completions', chat(`q${i} ${Math.random()}`));
    if (r.status === 200) seen.add(String(r.headers['x-switchyard-endpoint']));
  }
  return seen;
}

const active = (router: RunningRouter) =>
  router.core.live
    .list()
    .filter((e) => e.state === 'active')
    .map((e) => e.name)
    .sort();

const routable = (router: RunningRouter, names: string[]) => () => {
  const l = router.core.live.list();
  return names.every((n) => l.some((e) => e.name === n && e.ready)) && l.filter((e) => e.state === 'active').length === names.length;
};

t.test('label selector: ready pods become endpoints and take requests; role and revision from labels', async (t) => {
  const { api, ports, router } = await setup(t, 3, { labelSelector: { app: 'vllm' }, targetPort: 8000, revisionLabel: 'app.kubernetes.io/version' }, (api, ports) => {
    api.apply('pods', NS, pod('vllm-0', ports[0]!, { labels: { app: 'vllm', 'app.kubernetes.io/version': 'v1' } }));
    api.apply('pods', NS, pod('vllm-1', ports[1]!, { labels: { app: 'vllm', 'llm-d.ai/role': 'both', 'app.kubernetes.io/version': 'v1' } }));
    api.apply('pods', NS, pod('other', ports[2]!, { labels: { app: 'sglang' } })); // not selected
  });
  t.same(active(router), ['vllm-0', 'vllm-1'], 'the first list is in before the router serves');
  const view = router.core.live.list().find((e) => e.name === 'vllm-0')!;
  t.match(view, { origin: 'kubernetes:p', pool: 'p', url: `http://127.0.0.1:${ports[0]}`, role: 'both', revision: 'v1' });
  t.ok(await waitFor(routable(router, ['vllm-0', 'vllm-1'])), 'health-checked and routable');
  t.same([...(await servedBy(router, 12))].sort(), ['vllm-0', 'vllm-1'], 'requests reach both pods');

  // a pod added later, a pod with a role label that is not a role (skipped, logged), a not-ready one
  api.apply('pods', NS, pod('vllm-2', ports[2]!, { labels: { app: 'vllm', 'app.kubernetes.io/version': 'v1' } }));
  api.apply('pods', NS, pod('vllm-bad', ports[2]!, { labels: { app: 'vllm', 'llm-d.ai/role': 'router' } }));
  api.apply('pods', NS, pod('vllm-starting', ports[2]!, { ready: false }));
  t.ok(await waitFor(routable(router, ['vllm-0', 'vllm-1', 'vllm-2'])), 'the added pod is routable');
  t.same(active(router), ['vllm-0', 'vllm-1', 'vllm-2'], 'the bad-role and not-ready pods are not endpoints');
  t.match(router.discovery[0]!.snapshot(), { endpoints: 3, notReady: 1, skipped: 1 });
  t.ok((await servedBy(router, 20)).has('vllm-2'), 'the added pod takes requests');

  // the pod goes away: it leaves
  api.delete('pods', NS, 'vllm-0');
  t.ok(await waitFor(() => !router.core.live.list().some((e) => e.name === 'vllm-0')), 'a deleted pod leaves the set');
  t.notOk((await servedBy(router, 10)).has('vllm-0'));
  t.ok(api.requests.some((r) => r.includes('labelSelector=app%3Dvllm') && r.includes('watch=1') && r.includes('allowWatchBookmarks=true')), 'the watch asks for bookmarks with the selector');
  const m = parseProm((await get(router.url, '/metrics')).body);
  t.equal(metric(m, 'switchyard_discovery_endpoints', { source: 'kubernetes:p' }), 2, '/metrics: endpoints of the source');
  t.equal(metric(m, 'switchyard_discovery_pods_skipped', { source: 'kubernetes:p' }), 1, '/metrics: the bad-role pod');
  t.equal(metric(m, 'switchyard_discovery_lists_total', { source: 'kubernetes:p' }), 1, '/metrics: one list');
});

t.test('an unready pod is drained: its in-flight request finishes, new requests go elsewhere', async (t) => {
  // slow decode (~40 × 20 ms) so a request is in flight while the pod turns unready
  const { api, ports, router } = await setup(
    t,
    2,
    { labelSelector: 'app=vllm', targetPort: 8000 },
    (api, ports) => {
      api.apply('pods', NS, pod('a', ports[0]!));
      api.apply('pods', NS, pod('b', ports[1]!));
    },
    { timeScale: 1, itlMs: 20, prefillOverheadMs: 1 },
  );
  t.ok(await waitFor(routable(router, ['a', 'b'])));
  const a = router.core.endpoints.byName('a')!;
  const inflight = [];
  for (let i = 0; i < 6; i++) inflight.push(post(router.url, '/v1/chat/completions', chat(`long ${i} `.repeat(10), { max_tokens: 40, stream: true })));
  t.ok(await waitFor(() => a.inFlight > 0), 'a has requests in flight');
  api.apply('pods', NS, pod('a', ports[0]!, { ready: false }));
  t.ok(await waitFor(() => a.state === 'draining'), 'a is draining once its pod is unready');
  for (let i = 0; i < 3; i++) {
    const r = await post(router.url, '/v1/chat/completions', chat(`x${i}`, { max_tokens: 1 }));
    t.equal(r.headers['x-switchyard-endpoint'], 'b', 'a draining endpoint takes no new request');
  }
  for (const r of await Promise.all(inflight)) {
    t.equal(r.status, 200);
    t.ok(r.body.endsWith('data: [DONE]\n\n'), 'every in-flight stream finished');
  }
  t.ok(await waitFor(() => a.removed), 'removed once its requests ended');
  // a terminating pod (deletionTimestamp, still Ready) drains too
  api.apply('pods', NS, pod('a', ports[0]!));
  t.ok(await waitFor(routable(router, ['a', 'b'])), 'ready again: back');
  api.apply('pods', NS, pod('a', ports[0]!, { terminating: true }));
  t.ok(await waitFor(() => router.core.endpoints.byName('a') === undefined), 'a terminating pod is drained');
});

t.test('410 Gone: a relist that keeps the endpoints (no drain); bookmarks move the resume point', async (t) => {
  const { api, ports, router } = await setup(t, 2, { labelSelector: 'app=vllm', targetPort: 8000 }, (api, ports) => {
    api.apply('pods', NS, pod('a', ports[0]!));
    api.apply('pods', NS, pod('b', ports[1]!));
  });
  t.ok(await waitFor(routable(router, ['a', 'b'])));
  const before = { a: router.core.endpoints.byName('a'), b: router.core.endpoints.byName('b') };
  const drained = router.core.live.counters.drained;
  t.ok(await waitFor(() => api.openWatches === 1), 'one watch open');

  // bookmark: the client resumes from it after a clean end
  api.apply('pods', NS, pod('unrelated', ports[0]!, { labels: { app: 'other' } })); // moves the server's version, unseen by the selector
  api.bookmark();
  const rvAtBookmark = api.resourceVersion;
  await waitFor(() => router.discovery[0]!.snapshot().bookmarks === 1);
  t.equal(router.discovery[0]!.snapshot().bookmarks, 1, 'bookmark received');
  api.endWatches();
  t.ok(await waitFor(() => api.requests.some((r) => r.includes(`resourceVersion=${rvAtBookmark}`))), 'the watch resumed from the bookmark');

  // compaction: the open watch gets ERROR 410 and the client relists
  const lists = api.counts.lists;
  api.compact();
  t.ok(await waitFor(() => api.counts.lists > lists), 'relisted after 410 Gone');
  t.ok(await waitFor(() => api.openWatches === 1), 'watching again');
  t.equal(router.discovery[0]!.snapshot().gone, 1);
  t.equal(router.core.endpoints.byName('a'), before.a, 'the same endpoint a (not replaced)');
  t.equal(router.core.endpoints.byName('b'), before.b, 'the same endpoint b');
  t.equal(router.core.live.counters.drained, drained, 'nothing drained by the relist');

  // a change made while the client was away from the stream is in the relist
  api.compact();
  api.delete('pods', NS, 'b');
  t.ok(await waitFor(() => router.core.endpoints.byName('b') === undefined), 'a change around the relist is seen');
  t.equal((await servedBy(router, 4)).size, 1);
});

t.test('a watch stream cut mid-event: reconnect with backoff, the event replayed from the last whole one', async (t) => {
  const { api, ports, router } = await setup(t, 3, { labelSelector: 'app=vllm', targetPort: 8000 }, (api, ports) => {
    api.apply('pods', NS, pod('a', ports[0]!));
  });
  t.ok(await waitFor(routable(router, ['a'])));
  t.ok(await waitFor(() => api.openWatches === 1));
  const watches = api.counts.watches;
  api.cutNextEvent();
  api.apply('pods', NS, pod('b', ports[1]!)); // half of this event is written, then the connection dies
  t.ok(await waitFor(() => api.counts.watches > watches), 'reconnected');
  t.ok(await waitFor(routable(router, ['a', 'b'])), 'the cut event was replayed on the new watch: b is an endpoint');
  t.ok(router.discovery[0]!.snapshot().failures >= 1, 'counted as a failure');
  // an API server refusing lists: backoff and retry, then the state is right
  api.failLists = 2;
  api.compact();
  api.apply('pods', NS, pod('c', ports[2]!));
  t.ok(await waitFor(routable(router, ['a', 'b', 'c'])), 'after two refused lists the third brought c');
  t.ok(await waitFor(async () => (await servedBy(router, 12)).size === 3), 'all three take requests');
});

t.test('a watch that goes silent past its timeoutSeconds is abandoned and reopened', async (t) => {
  const { api, ports, router } = await setup(t, 2, { labelSelector: 'app=vllm', targetPort: 8000, watchTimeoutSeconds: 1 }, (api, ports) => {
    api.ignoreWatchTimeout = true;
    api.apply('pods', NS, pod('a', ports[0]!));
  });
  t.ok(await waitFor(() => api.openWatches === 1));
  const watches = api.counts.watches;
  // the server keeps the stream open and says nothing: after 1 s × 1.1 + 2 s the client gives up on it
  t.ok(await waitFor(() => api.counts.watches > watches, 15_000), 'a new watch was opened');
  t.ok(router.discovery[0]!.snapshot().failures >= 1, 'the silent one counted as a failure');
  api.apply('pods', NS, pod('b', ports[1]!));
  t.ok(await waitFor(routable(router, ['a', 'b'])), 'the new watch delivers');
});

t.test('InferencePool: its selector and targetPorts pick the pods; a selector change re-selects; deletion drains', async (t) => {
  const { api, ports, router } = await setup(t, 3, { inferencePool: 'chat' }, (api, ports) => {
    api.apply('inferencepools', NS, inferencePool('chat', { app: 'blue' }));
    api.apply('inferencepools', NS, inferencePool('another', { app: 'green' }));
    api.apply('pods', NS, pod('blue-0', ports[0]!, { labels: { app: 'blue' } }));
    api.apply('pods', NS, pod('blue-1', ports[1]!, { labels: { app: 'blue' } }));
    api.apply('pods', NS, pod('green-0', ports[2]!, { labels: { app: 'green' } }));
  });
  t.same(active(router), ['blue-0', 'blue-1'], 'the pool selector picked the blue pods');
  t.ok(await waitFor(routable(router, ['blue-0', 'blue-1'])));
  t.ok(api.requests.some((r) => r.includes('/inferencepools') && r.includes('fieldSelector=metadata.name%3Dchat')), 'the pool object is watched by name');

  // the selector moves to green: blue drains, green joins
  api.apply('inferencepools', NS, inferencePool('chat', { app: 'green' }));
  t.ok(await waitFor(routable(router, ['green-0'])), 're-selected');
  t.same(active(router), ['green-0']);
  t.equal(router.discovery[0]!.snapshot().reselects, 1);
  t.same([...(await servedBy(router, 5))], ['green-0']);

  // targetPorts: without the port annotation, the pool's port is used (one endpoint per pod and port)
  const bare = pod('green-1', 0, { labels: { app: 'green' } });
  delete (bare.metadata as { annotations?: unknown }).annotations;
  api.apply('inferencepools', NS, inferencePool('chat', { app: 'green' }, [ports[0]!, ports[1]!]));
  api.apply('pods', NS, bare);
  t.ok(await waitFor(() => router.core.live.list().some((e) => e.name === `green-1:${ports[0]}`) && router.core.live.list().some((e) => e.name === `green-1:${ports[1]}`)), 'one endpoint per target port');

  // the pool is deleted: its endpoints drain
  api.delete('inferencepools', NS, 'chat');
  t.ok(await waitFor(() => active(router).length === 0), 'no pool, no endpoints');
  const r = await post(router.url, '/v1/chat/completions', chat());
  t.equal(r.status, 503, 'a pool with no pods answers 503');
  t.match(JSON.parse(r.body), { error: { message: String } });
  api.apply('inferencepools', NS, inferencePool('chat', { app: 'blue' }));
  t.ok(await waitFor(routable(router, ['blue-0', 'blue-1'])), 'recreated: back');
});

t.test('discovery config: field paths for bad blocks', async (t) => {
  const bad = (discovery: unknown, extra: Record<string, unknown> = {}) => {
    try {
      validateConfig({ apiVersion: API_VERSION, kind: 'Router', pools: [{ name: 'p', models: ['m'], discovery, ...extra }] }, validatePlugin);
      return '';
    } catch (err) {
      t.type(err, ConfigError);
      return (err as Error).message;
    }
  };
  t.match(bad({ kubernetes: {} }), /pools\[0\]\.discovery\.kubernetes: needs exactly one of inferencePool or labelSelector/);
  t.match(bad({ kubernetes: { inferencePool: 'a', labelSelector: 'x=y' } }), /needs exactly one of inferencePool or labelSelector/);
  t.match(bad({ kubernetes: { labelSelector: 'app=x' } }), /pools\[0\]\.discovery\.kubernetes\.targetPort: is required with labelSelector/);
  t.match(bad({ kubernetes: { inferencePool: 'Not_A_Name' } }), /inferencePool: must be a Kubernetes object name/);
  t.match(bad({ kubernetes: { inferencePool: 'a', namespace: 'UPPER' } }), /namespace: must be a Kubernetes namespace name/);
  t.match(bad({ kubernetes: { labelSelector: {}, targetPort: 1 } }), /labelSelector: must list at least one label/);
  t.match(bad({ kubernetes: { inferencePool: 'a', roleLabel: 'bad key!' } }), /roleLabel: must be a Kubernetes label key/);
  t.match(bad({ kubernetes: { inferencePool: 'a', nope: 1 } }), /unknown field/);
  t.match(bad({ kubernetes: { inferencePool: 'a' } }, { prefix: { mode: 'precise' } }), /prefix\.mode: precise mode needs/);
  t.match(bad(undefined), /pools\[0\]\.endpoints: is required: at least one endpoint \(or give the pool discovery\)/);
  const ok = validateConfig({ apiVersion: API_VERSION, kind: 'Router', pools: [{ name: 'p', models: ['m'], discovery: { kubernetes: { labelSelector: { app: 'vllm', tier: 'gpu' }, targetPort: 8000 } } }] }, validatePlugin);
  t.match(ok.pools[0]!.discovery!.kubernetes, { labelSelector: 'app=vllm,tier=gpu', roleLabel: 'llm-d.ai/role', portAnnotation: 'switchyard.io/port', watchTimeoutSeconds: 300 });
  t.same(ok.pools[0]!.endpoints, []);
});

t.test('a kubeconfig that does not exist stops the start with the reason', async (t) => {
  const c = validateConfig(cfg('/nonexistent/kubeconfig', { inferencePool: 'x' }), validatePlugin);
  await t.rejects(startRouter(c, { port: 0, host: '127.0.0.1', adminPort: 0 }), /cannot load the Kubernetes config \/nonexistent\/kubeconfig/);
});

t.test('a config reload keeps the discovered endpoints; a changed discovery block is reported as needing a restart', async (t) => {
  const api = await new KubeApiServer().listen();
  const dir = await mkdtemp(join(tmpdir(), 'swy-k8s-'));
  const kubeconfig = await api.kubeconfig(dir, NS);
  const fleet = await startFleet(3, { timeScale: 0 });
  const ports = fleet.urls.map((u) => Number(new URL(u).port));
  api.apply('pods', NS, pod('a', ports[0]!));
  api.apply('pods', NS, pod('b', ports[1]!));
  const file = join(dir, 'router.yaml');
  const doc = (selector: string) => {
    const c = cfg(kubeconfig, { labelSelector: selector, targetPort: 8000 });
    // a static endpoint beside the discovered ones
    (c.pools[0] as Record<string, unknown>).endpoints = [{ name: 'static', url: fleet.urls[2] }];
    return JSON.stringify(c);
  };
  await writeFile(file, doc('app=vllm'));
  const router = await startRouter(validateConfig(JSON.parse(doc('app=vllm')), validatePlugin), { port: 0, host: '127.0.0.1', adminPort: 0, configFile: file, validatePlugin });
  t.teardown(async () => {
    await router.close(200);
    await fleet.close();
    await api.close();
  });
  t.same(active(router), ['a', 'b', 'static']);
  const a = router.core.endpoints.byName('a');
  const same = await router.reload!();
  t.ok(same.ok);
  t.same(same.ok && same.changes, { added: [], removed: [], replaced: [] }, 'an unchanged file changes nothing');
  t.equal(router.core.endpoints.byName('a'), a, 'the discovered endpoint is the same one');
  await writeFile(file, doc('app=other'));
  const changed = await router.reload!();
  t.ok(changed.ok && changed.restartNeeded.includes('pools.p.discovery'), 'a changed discovery block needs a restart');
  t.same(active(router), ['a', 'b', 'static'], 'the running watch and its endpoints stay');
  api.apply('pods', NS, pod('c', ports[2]!));
  t.ok(await waitFor(() => active(router).includes('c')), 'and it keeps following the pods');
});
