// A burst that arrives right after a metrics scrape, with scrapes far apart,
// is held by flow control: the router counts what it dispatched since the
// engine's last report against the engine's batch limit, which it learnt from
// the engine's running/waiting counts (no saturation settings: the documented
// flowControl block as it stands). Real loopback sockets, two real simulated
// engines of 4 slots, the real router.
// Before this, only `maxConcurrency: 64` applied between scrapes, so the whole
// burst went straight to the engines (each then queued ~26 requests).
//
// Placement is the `least-request` picker's (the router's exact in-flight
// counts), so the engines' peaks measure the gate alone and the bound is
// exact: the gate admits only while some engine has a free slot and the pick
// takes the one with the most room, so no engine ever holds more than its
// batch. With the default scorers the bound was "batch + 1" and flaked under
// CPU load (#30: a peak of 6): the queue scorer's estimate between scrapes
// (last scrape's waiting + dispatches since it) can rank a full engine above
// one with a free slot, so the pick may put a request, or two, on the full
// one while the gate admitted it on the other's room; nothing bounds that to
// one, so that bound was not a property of the gate.
import t from 'tap';
import { startEngine, type SimEngine } from '../../src/sim/index.js';
import { parseConfig } from '../../src/config/load.js';
import { startRouter } from '../../src/server/router.js';
import { validateFlowControl } from '../../src/flow/config.js';
import { FlowControlGate } from '../../src/flow/gate.js';
import type { EndpointSet } from '../../src/endpoints/endpoint.js';
import { OPERATOR_FLOW_BLOCK } from '../support/flow-util.js';
import { validatePlugin } from '../support/router-util.js';
import { post, sleep, until } from '../support/sim-util.js';

const SLOTS = 4;
const SCRAPE_MS = 400;

t.test('a burst right after a scrape is held by flow control; the premium tenant is not delayed', async (t) => {
  const engines: SimEngine[] = [];
  for (let i = 0; i < 2; i++) engines.push(await startEngine({ maxNumSeqs: SLOTS, itlMs: 20, prefillOverheadMs: 2, prefillUsPerToken: 0, seed: 7 + i }));
  t.teardown(async () => {
    for (const e of engines) await e.close();
  });
  const cfg = parseConfig(
    `apiVersion: switchyard/v1
kind: Router
pools:
  - name: p
    engine: vllm
    models: [open-model]
    endpoints:
${engines.map((e, i) => `      - { name: e${i}, url: "${e.url}" }`).join('\n')}
dataLayer: { scrapeIntervalMs: ${SCRAPE_MS}, staleAfterMs: 10000 }
scheduling: { picker: least-request }
logging: { level: silent }
${OPERATOR_FLOW_BLOCK}`,
    validatePlugin,
    'flow-between-scrapes',
  );
  const { value: fc, errors } = validateFlowControl(cfg.flowControl);
  if (!fc) throw new Error(errors.join('\n'));
  let set!: EndpointSet;
  const router = await startRouter(cfg, {
    port: 0,
    host: '127.0.0.1',
    gate: (s) => {
      set = s;
      return FlowControlGate.fromEndpoints({ config: fc, endpointsFor: (m) => s.forModel(m) });
    },
  });
  t.teardown(() => router.close(200));
  const call = (tenant: string, tag: string, maxTokens: number) =>
    post(router.url, '/v1/completions', { model: 'open-model', prompt: `${tenant} ${tag}`, max_tokens: maxTokens }, { 'x-tenant-id': tenant });

  // The engines' highest running + waiting, sampled every 2 ms.
  const peak = engines.map(() => 0);
  const sampler = setInterval(() => {
    engines.forEach((e, i) => {
      const s = e.stats();
      if (s.running + s.waiting > peak[i]!) peak[i] = s.running + s.waiting;
    });
  }, 2);
  t.teardown(() => clearInterval(sampler));

  // 1. The router learns the batch limit: long requests, more than the engines run at once,
  //    so two scrapes in a row see requests waiting behind a full batch.
  //    Rounds until both are learnt (at most five): on a loaded machine a round's scrapes can land
  //    where no two in a row see a full batch (#30: one round learnt nothing at a load average of 30).
  const statuses: number[] = [];
  for (let round = 0; round < 5 && !set.all.every((ep) => ep.batchLimit === SLOTS); round++) {
    const learn = await Promise.all(Array.from({ length: 16 }, (_, i) => call('internal-tools', `learn ${round}.${i}`, 60)));
    statuses.push(...learn.map((r) => r.status));
  }
  t.ok(statuses.every((s) => s === 200 || s === 429), `the learning requests end (${[...new Set(statuses)].join(', ')})`);
  t.same(set.all.map((ep) => ep.batchLimit), [SLOTS, SLOTS], 'the router learnt both engines\' batch limit');

  // 2. Just after a scrape (the next is SCRAPE_MS away), a best-effort burst of 60 and premium requests.
  const at = set.all[0]!.metricsAt;
  t.ok(await until(() => set.all[0]!.metricsAt !== at, 2 * SCRAPE_MS), 'a scrape landed');
  peak.fill(0);
  const t0 = performance.now();
  const burst = Array.from({ length: 60 }, (_, i) => call('internal-tools', `burst ${i}`, 5));
  await sleep(30);
  const premium: Promise<{ status: number; totalMs: number }>[] = [];
  for (let i = 0; i < 4; i++) {
    premium.push(call('payments', `premium ${i}`, 5));
    await sleep(60);
  }
  const done = await Promise.all(burst);
  const prem = await Promise.all(premium);
  t.comment(`engine peaks (running + waiting): ${peak.join(', ')}; premium ${prem.map((r) => r.totalMs.toFixed(0)).join(', ')} ms; burst done in ${(performance.now() - t0).toFixed(0)} ms`);
  for (let i = 0; i < engines.length; i++) {
    t.ok(peak[i]! <= SLOTS, `engine ${i} never held more than its batch (${peak[i]})`);
  }
  t.ok(prem.every((r) => r.status === 200), 'premium served');
  t.ok(done.every((r) => r.status === 200 || r.status === 429), 'the burst is served or shed, never failed');
  // relative to the burst, so a slow shared machine does not decide: premium requests that
  // queued behind the burst at the engines take longer than half of the burst does
  const sorted = done.filter((r) => r.status === 200).map((r) => r.totalMs).sort((a, b) => a - b);
  const burstP50 = sorted[Math.floor(sorted.length / 2)]!;
  const worst = Math.max(...prem.map((r) => r.totalMs));
  t.ok(worst < burstP50, `premium (worst ${worst.toFixed(0)} ms) overtook the burst (p50 ${burstP50.toFixed(0)} ms)`);
});
