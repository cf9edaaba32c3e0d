// The queue scorer (expected-ms, the default) and a full batch: a candidate at
// its learned batch limit scores as the longest wait while another candidate
// has a free slot, whatever its prefill work reads. Before, the scorer counted
// only prefill tokens: a full engine with cheap, small prompts waiting behind
// its batch read as a shorter wait than a free one prefilling a long prompt,
// and on the fairness bench one engine took 100+ requests while the other had
// a free slot (bench/RESULTS.md, 2026-12-08). Real Endpoints and the real
// scorer from the registry; no engines.
import t from 'tap';
import { registry } from '../../src/scheduler/plugins/index.js';
import { EndpointSet, type Endpoint } from '../../src/endpoints/endpoint.js';
import { DEFAULTS } from '../../src/config/schema.js';
import type { CycleContext } from '../../src/scheduler/types.js';

function set(n: number): EndpointSet {
  return new EndpointSet(
    [{ name: 'p', engine: 'vllm', accelerator: 'nvidia', models: ['m'], endpoints: Array.from({ length: n }, (_, i) => ({ name: `e${i}`, url: `http://127.0.0.1:${10000 + i}`, role: 'both' as const })) }],
    { ...DEFAULTS.dataLayer, staleAfterMs: 1e9 },
  );
}

/** A scrape at `now` showing `running` running and `waiting` waiting, all of them the router's. */
function scrape(ep: Endpoint, now: number, running: number, waiting: number): void {
  ep.metrics.running = running;
  ep.metrics.waiting = waiting;
  ep.metrics.kvUsage = NaN;
  ep.metricsAt = now;
  ep.sinceScrape = 0;
  ep.onScrape();
}

/** `ep` learns a batch limit of 4 (two scrapes at 4 running with 2 waiting) and is left with `inFlight` requests, `pending` prefill tokens over `prefilling` of them. */
function load(ep: Endpoint, now: number, inFlight: number, pending: number, prefilling: number): void {
  for (let i = 0; i < 6; i++) ep.onDispatch(now);
  scrape(ep, now, 4, 2);
  scrape(ep, now, 4, 2);
  for (let i = 0; i < 6; i++) ep.onOutcome(now, false, DEFAULTS.dataLayer);
  for (let i = 0; i < inFlight; i++) ep.onDispatch(now);
  scrape(ep, now, Math.min(4, inFlight), Math.max(0, inFlight - 4));
  ep.prefillPending = pending;
  ep.prefillRequests = prefilling;
}

const ctx = (now: number): CycleContext => ({ request: { model: 'm', prompt: 'x'.repeat(40) }, now, promptBlocks: 0, prefixMatched: new Uint32Array(0), matchedBlocks: 0 });

t.test('a full batch of small prompts scores below a free slot with a long prompt prefilling', (t) => {
  const s = set(2);
  const [full, free] = s.all as [Endpoint, Endpoint];
  load(full, 0, 6, 20, 2); // 4 running, 2 waiting with 10 tokens each: little prefill work, no slot
  load(free, 0, 2, 4000, 1); // 2 running, one of them prefilling 4,000 tokens: much prefill work, 2 free slots
  t.equal(full.batch.learned, 4, 'batch limit learnt');
  const sc = registry.create('scorer', 'queue', {}, { endpoints: s, prefixBlockSize: 64, random: Math.random });
  const out = [...sc.score(ctx(1), s.all).subarray(0, 2)];
  t.equal(out[0], 0, 'the full engine scores 0');
  t.equal(out[1], 1, 'the engine with free slots scores 1');
  t.end();
});

t.test('an engine that has not queued yet has its pool\'s learnt limit (the prefix scorer\'s rule)', (t) => {
  const s = set(3);
  const [learnt, unlearnt, free] = s.all as [Endpoint, Endpoint, Endpoint];
  load(learnt, 0, 3, 4000, 1); // learnt 4, 3 in flight: a free slot, much prefill work
  for (let i = 0; i < 5; i++) unlearnt.onDispatch(0); // never queued: no limit of its own, 5 in flight
  unlearnt.prefillPending = 10;
  unlearnt.prefillRequests = 1;
  load(free, 0, 3, 4000, 1);
  t.equal(unlearnt.batch.learned, 0, 'no limit of its own');
  const sc = registry.create('scorer', 'queue', {}, { endpoints: s, prefixBlockSize: 64, random: Math.random });
  const out = [...sc.score(ctx(1), s.all).subarray(0, 3)];
  t.equal(out[1], 0, `5 in flight against the pool's 4: full, the longest wait (${out.join(', ')})`);
  t.end();
});

t.test('every batch full, or limits unknown: prefill work decides as before', (t) => {
  const s = set(2);
  const [a, b] = s.all as [Endpoint, Endpoint];
  load(a, 0, 6, 20, 2);
  load(b, 0, 5, 4000, 1);
  const sc = registry.create('scorer', 'queue', {}, { endpoints: s, prefixBlockSize: 64, random: Math.random });
  const both = [...sc.score(ctx(1), s.all).subarray(0, 2)];
  t.ok(both[0]! > both[1]!, `both full: the one with less queued work scores higher (${both.join(', ')})`);
  const u = set(2);
  const [c, d] = u.all as [Endpoint, Endpoint];
  for (let i = 0; i < 6; i++) c.onDispatch(0);
  for (let i = 0; i < 2; i++) d.onDispatch(0);
  c.prefillPending = 20;
  c.prefillRequests = 2;
  d.prefillPending = 4000;
  d.prefillRequests = 1;
  t.equal(c.batch.learned, 0, 'no limit learnt');
  const sc2 = registry.create('scorer', 'queue', {}, { endpoints: u, prefixBlockSize: 64, random: Math.random });
  const unknown = [...sc2.score(ctx(1), u.all).subarray(0, 2)];
  t.ok(unknown[0]! > unknown[1]!, `limits unknown: never counted full (${unknown.join(', ')})`);
  t.end();
});
