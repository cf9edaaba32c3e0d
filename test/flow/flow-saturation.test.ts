// Saturation between scrapes: the batch-limit learner, the Endpoint's own
// freshness, queue estimate and occupancy, and the detector over real
// Endpoints (no stand-ins), on a virtual clock.
import t from 'tap';
import { BatchLimit, DEFAULT_BATCH_LIMIT } from '../../src/endpoints/batch-limit.js';
import { EndpointSet, type Endpoint } from '../../src/endpoints/endpoint.js';
import { DEFAULTS } from '../../src/config/schema.js';
import { SaturationDetector } from '../../src/flow/saturation.js';
import { FlowControlGate } from '../../src/flow/gate.js';
import { validateFlowControl } from '../../src/flow/config.js';
import { seededRng } from '../../src/flow/admission.js';
import { flush, Signal } from '../support/flow-util.js';

function endpoints(n: number, staleAfterMs = 100): Endpoint[] {
  const set = new EndpointSet(
    [{ name: 'p', engine: 'vllm', accelerator: 'nvidia', models: ['m'], endpoints: Array.from({ length: n }, (_, i) => ({ name: `e${i}`, url: `http://127.0.0.1:${9000 + i}`, role: 'both' as const })) }],
    { ...DEFAULTS.dataLayer, staleAfterMs },
  );
  return set.all;
}

/** What the data layer does on a successful scrape at `now` that left when `sentSince` of the current in-flight requests had not been sent yet. */
function scrape(ep: Endpoint, now: number, running: number, waiting: number, sentSince = 0, kvUsage = NaN): void {
  ep.metrics.running = running;
  ep.metrics.waiting = waiting;
  ep.metrics.kvUsage = kvUsage;
  ep.metricsAt = now;
  ep.sinceScrape = sentSince;
  ep.onScrape();
}

function send(ep: Endpoint, n: number, now = 0): void {
  for (let i = 0; i < n; i++) ep.onDispatch(now);
}

t.test('batch limit: a default until the engine queues; the running count at a plateau with requests waiting', (t) => {
  const b = new BatchLimit();
  t.equal(b.value, DEFAULT_BATCH_LIMIT);
  b.observe(2, 0);
  b.observe(3, 0);
  t.equal(b.value, DEFAULT_BATCH_LIMIT, 'a small load teaches nothing');
  b.observe(4, 3);
  t.equal(b.learned, 0, 'one scrape with requests waiting is not enough (a request may wait for the next step)');
  b.observe(4, 5);
  t.equal(b.learned, 4, 'running stopped at 4 while requests wait: the batch limit');
  t.equal(b.value, 4);
  b.observe(2, 0);
  b.observe(1, 1);
  b.observe(1, 1);
  t.equal(b.value, 4, 'requests waiting below the largest running count seen do not lower it');
  b.observe(6, 0);
  t.equal(b.value, 6, 'an engine seen running more than the limit raises it');
  t.end();
});

t.test('batch limit: a transient wait does not pin the limit low', (t) => {
  const b = new BatchLimit();
  b.observe(1, 1); // a request arrived just before the scrape
  b.observe(2, 0);
  b.observe(2, 1);
  b.observe(3, 0);
  t.equal(b.learned, 0);
  b.observe(1, 1);
  b.observe(1, 1);
  t.equal(b.learned, 0, 'below the largest running count seen (3): not a full batch');
  t.end();
});

t.test('batch limit: the default doubles while the engine runs near it with nothing waiting', (t) => {
  const b = new BatchLimit();
  b.observe(DEFAULT_BATCH_LIMIT, 0);
  t.equal(b.value, 2 * DEFAULT_BATCH_LIMIT);
  b.observe(100, 0);
  t.equal(b.value, 256, 'as far as the running count shows at once');
  b.observe(256, 40);
  b.observe(256, 80);
  t.equal(b.value, 256, 'then learned where it queues');
  b.observe(NaN, 3);
  b.observe(-1, 0);
  t.equal(b.value, 256, 'bad figures are ignored');
  t.end();
});

t.test('batch limit: pools[].batchLimit is taken as known from the start (the cold first burst is held), and still corrected by the engine', async (t) => {
  const { parseConfig } = await import('../../src/config/load.js');
  const yaml = (extra: string) => `apiVersion: switchyard/v1
kind: Router
pools:
  - name: p
    models: [m]
    endpoints: [{ name: e0, url: "http://127.0.0.1:9" }]
${extra}`;
  const cfg = parseConfig(yaml('    batchLimit: 4'), () => [], 't');
  t.equal(cfg.pools[0]!.batchLimit, 4);
  const ep = new EndpointSet(cfg.pools, cfg.dataLayer).all[0]!;
  t.equal(ep.batchLimit, 4, 'known before any scrape');
  ep.batch.observe(6, 0);
  t.equal(ep.batchLimit, 6, 'the engine ran more: raised');
  const plain = new EndpointSet(parseConfig(yaml(''), () => [], 't').pools, cfg.dataLayer).all[0]!;
  t.equal(plain.batchLimit, DEFAULT_BATCH_LIMIT, 'without it: the probe default');
  t.throws(() => parseConfig(yaml('    batchLimit: 0'), () => [], 't'), /pools\[0\]\.batchLimit/, 'a bad value names its path');
  t.equal(new BatchLimit(4).value, 4);
});

t.test('endpoint: staleness is its own (the data layer setting); queueEstimate and occupancy', (t) => {
  const [ep] = endpoints(1, 100);
  t.equal(ep.staleAfterMs, 100);
  t.notOk(ep.fresh(0), 'never scraped');
  t.equal(endpoints(1, 2500)[0].staleAfterMs, 2500);
  t.equal(new EndpointSet([]).dataLayer.staleAfterMs, DEFAULTS.dataLayer.staleAfterMs);

  send(ep, 3);
  scrape(ep, 1000, 2, 1); // the engine holds the router's 3
  t.ok(ep.fresh(1100));
  t.notOk(ep.fresh(1101));
  t.equal(ep.foreign, 0, 'all of the engine load is the router\'s own');
  t.equal(ep.queueEstimate(1050), 1, 'waiting 1, nothing sent since');
  t.equal(ep.occupancy(1050), 3);
  send(ep, 4, 1010);
  ep.sinceScrape = 4;
  t.equal(ep.queueEstimate(1050), 5, 'waiting + min(sent since the scrape, in flight)');
  t.equal(ep.occupancy(1050), 7, 'every request the router has out there');
  for (let i = 0; i < 5; i++) ep.onOutcome(1060, false, DEFAULTS.dataLayer);
  t.equal(ep.queueEstimate(1070), 3, 'sent-since counts at most what is still out');
  t.equal(ep.occupancy(1070), 2, 'completions count at once, without waiting for a scrape');
  t.equal(ep.queueEstimate(2000), 2, 'stale: the in-flight count');
  t.end();
});

t.test('endpoint: other clients\' requests seen by the scrape count while fresh', (t) => {
  const [ep] = endpoints(1, 100);
  send(ep, 2);
  scrape(ep, 1000, 4, 3, 1); // one of the router's two left after the scrape did (it may be in the figures or not)
  t.equal(ep.foreign, 5, '7 at the engine, 2 of them taken as the router\'s');
  t.equal(ep.occupancy(1050), 7, 'a request sent during the scrape is not counted twice');
  t.equal(ep.occupancy(1150), 2, 'stale: only the router\'s own');
  scrape(ep, 1200, 1, 0, 0);
  t.equal(ep.foreign, 0, 'the engine holds fewer than the router has out (some in transit): none foreign');
  t.end();
});

t.test('detector: a burst right after a scrape saturates by the router\'s own count over the learned limit', (t) => {
  const d = new SaturationDetector({ queueDepthThreshold: 5, kvThreshold: 0.9, maxConcurrency: 64 });
  const [a, b] = endpoints(2, 10_000);
  // the engines queued once: both learn a batch of 4
  for (const ep of [a, b]) {
    send(ep, 6);
    scrape(ep, 1, 4, 2);
    scrape(ep, 50, 4, 2);
    for (let i = 0; i < 6; i++) ep.onOutcome(60, false, DEFAULTS.dataLayer);
    scrape(ep, 100, 0, 0);
    t.equal(ep.batchLimit, 4);
  }
  t.equal(d.poolLoad([a, b], 101), 0, 'idle at the scrape');
  send(a, 4, 101);
  t.equal(d.load(a, 101), 1, 'four sent since the scrape fill its batch: saturated, no scrape needed');
  t.equal(d.poolLoad([a, b], 101), 0, 'the other still has room');
  send(b, 3, 101);
  t.equal(d.poolLoad([a, b], 101), 0.75);
  send(b, 1, 101);
  t.ok(d.poolLoad([a, b], 101) >= 1, 'both full');
  b.onOutcome(150, false, DEFAULTS.dataLayer);
  t.equal(d.poolLoad([a, b], 150), 0.75, 'a completion frees a slot at once');
  t.end();
});

t.test('detector: the configured thresholds still apply; stale metrics fall back to the router\'s counts', (t) => {
  const d = new SaturationDetector({ queueDepthThreshold: 4, kvThreshold: 0.8, maxConcurrency: 10 });
  const [ep] = endpoints(1, 100);
  for (let i = 0; i < 20; i++) ep.batch.observe(64, 0); // a large engine: the batch term stays small
  send(ep, 2);
  scrape(ep, 1000, 2, 0, 0, 0.4);
  t.equal(d.load(ep, 1050), 0.5, 'kv 0.4/0.8');
  scrape(ep, 1000, 1, 1, 0, 0.4);
  t.equal(d.load(ep, 1050), 0.5);
  scrape(ep, 1000, 0, 4, 0, 0.1);
  t.ok(d.saturated(ep, 1050), 'queue depth threshold');
  scrape(ep, 1000, 2, 0, 0, 0.85);
  t.ok(d.saturated(ep, 1050), 'kv threshold');
  scrape(ep, 1000, 2, 100, 0, 0.99);
  t.notOk(d.saturated(ep, 1500), 'stale metrics ignored...');
  send(ep, 8);
  t.ok(d.saturated(ep, 1500), '...except the in-flight cap (maxConcurrency)');
  t.equal(d.poolLoad([], 0), Infinity);
  t.end();
});

t.test('gate: lower bands leave the last slot of a small batch to the top band (4 slots at 0.85: 3, not 4)', async (t) => {
  const { value: cfg, errors } = validateFlowControl({
    flows: [
      { id: 'tenant:payments', priority: 'premium', minShare: 0.3 },
      { id: 'tenant:internal-tools', priority: 'best-effort' },
    ],
    admission: { mode: 'probabilistic', maxUtilisation: 0.85 },
  });
  if (!cfg) throw new Error(errors.join('\n'));
  const [ep] = endpoints(1, 10_000);
  send(ep, 6);
  scrape(ep, performance.now(), 4, 2);
  scrape(ep, performance.now(), 4, 2);
  for (let i = 0; i < 6; i++) ep.onOutcome(0, false, DEFAULTS.dataLayer);
  t.equal(ep.batchLimit, 4, 'learnt');
  const gate = FlowControlGate.fromEndpoints({ config: cfg, endpointsFor: () => [ep], rng: seededRng(3) });
  t.teardown(() => gate.close());
  const info = (tenant: string) => ({
    model: 'm',
    headers: { authorization: '', 'x-tenant-id': tenant, 'x-workload-id': '', 'x-llm-d-inference-fairness-id': '', 'x-priority': '' },
    bodyBytes: 10,
  });
  // what the server does with a grant: dispatch to the endpoint
  const tickets: unknown[] = [];
  const admitted = (r: unknown) => {
    const g = r as { admitted: boolean; ticket: unknown };
    if (g.admitted) {
      ep.onDispatch(0);
      tickets.push(g.ticket);
    }
    return g.admitted;
  };
  for (let i = 0; i < 3; i++) t.ok(admitted(gate.admit(info('internal-tools'), new Signal())), `best-effort ${i} goes at once`);
  const held = gate.admit(info('internal-tools'), new Signal());
  t.ok(held instanceof Promise, 'the fourth best-effort request waits in the router');
  t.ok(admitted(gate.admit(info('payments'), new Signal())), 'premium takes the last slot at once');
  t.equal(ep.inFlight, 4);
  ep.onOutcome(0, false, DEFAULTS.dataLayer);
  gate.release(tickets.shift());
  await flush();
  await flush();
  t.equal(ep.inFlight, 3, 'a freed slot does not go to best-effort while premium holds the fourth');
  for (const tk of tickets) {
    ep.onOutcome(0, false, DEFAULTS.dataLayer);
    gate.release(tk);
  }
  t.ok(admitted(await held), 'the held request goes once there is room below 0.85');
});

t.test("endpoint: a replica's request in the scrape before its report is not counted twice (foreign, then peerInFlight)", (t) => {
  const [ep] = endpoints(1, 100);
  send(ep, 2);
  ep.peerInFlight = 1;
  // the engine runs 5: the router's 2, the replica's 1 reported, and 2 the replica sent but has not reported yet
  scrape(ep, 1000, 5, 0);
  t.equal(ep.foreign, 2, 'the unreported two look foreign at the scrape');
  t.equal(ep.occupancy(1010), 5, 'five at the engine');
  // the replica's report arrives: its two are in peerInFlight now
  ep.peerInFlight = 3;
  t.equal(ep.occupancy(1020), 5, 'still five, not seven (before: 2 + 3 + 2 foreign)');
  // it sends two more after the scrape: those are new
  ep.peerInFlight = 5;
  t.equal(ep.occupancy(1030), 7, 'what it adds beyond the foreign load counts');
  // its requests finish, the two the scrape saw among them: what looked foreign is gone with them
  ep.peerInFlight = 0;
  t.equal(ep.occupancy(1040), 2, 'the router\'s 2 alone (not 2 + the 2 "foreign" again)');
  // the next scrape sees the engine as it is
  ep.peerInFlight = 3;
  scrape(ep, 1100, 5, 0);
  t.equal(ep.foreign, 0);
  t.equal(ep.occupancy(1110), 5);
  t.end();
});
